//! The DSpark drafter (docs/dspark.md): DeepSeek's drafter for the 0731 weights, run by the
//! backend (`backend::dspark::DsparkForward`) over the target rows the session captures. This side
//! decides what is proposed: the block is anchored at the token just handed out, row i's token is
//! the Markov-biased greedy choice after row i − 1's, and the proposal is the longest prefix whose
//! every confidence reaches the threshold (`dspark_confidence`); the LM head of a row runs only once
//! its confidence passed.
//!
//! Also the settings (`--dspark`, `--dspark-confidence`, `--dspark-convention`) and the attaching of
//! the drafter to a session. Owns no model arithmetic.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::backend::DeviceSession;
use crate::backend::dspark::DsparkForward;
use crate::model::Model;
use crate::model::dspark::{DEFAULT_CONFIDENCE, DsparkConvention, DsparkModel, PassReads, SUPPORT_FILE_NAME};

use super::drafter::{Draft, Drafter, Verdict};

/// The DSpark settings of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct DsparkSettings {
    /// The support file (`--dspark`, key `dspark`); `None`: ds4's file name next to the model.
    pub path: Option<PathBuf>,
    /// The confidence every proposed row must reach, 0 ..= 1 (`--dspark-confidence`); 0 always
    /// proposes the whole block.
    pub confidence: f32,
    /// Where DeepSeek's reference and ds4 differ, which to follow (`--dspark-convention`).
    pub convention: DsparkConvention,
}

impl Default for DsparkSettings {
    fn default() -> Self {
        DsparkSettings {
            path: None,
            confidence: DEFAULT_CONFIDENCE,
            convention: DsparkConvention::Reference,
        }
    }
}

/// `dspark_confidence`: a probability, 0 ..= 1.
pub fn check_confidence(v: f64) -> Result<f32, String> {
    crate::engine::settings::check_probability(v)
}

impl DsparkSettings {
    /// The support file to load for the model at `model_path`: the one given, else ds4's name next to
    /// the model; the error is one line.
    pub fn support_path(&self, model_path: Option<&Path>) -> Result<PathBuf, String> {
        if let Some(p) = &self.path {
            return Ok(p.clone());
        }
        model_path
            .and_then(crate::model::dspark::beside)
            .ok_or_else(|| format!("speculate dspark needs a support file: give --dspark FILE (none named {SUPPORT_FILE_NAME} next to the model)"))
    }

    /// Load and check the support file for `model`; the error is one line naming the file.
    pub fn load(&self, model: &Model) -> Result<Arc<DsparkModel>, String> {
        let path = self.support_path(model.file.path.as_deref())?;
        DsparkModel::open(&path, &model.hp)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }

    /// The drafter of `support` attached to `session` (which from now on captures the target rows);
    /// the error is the backend's one line.
    pub fn attach(
        &self,
        session: &mut dyn DeviceSession,
        support: Arc<DsparkModel>,
    ) -> Result<Box<dyn Drafter>, String> {
        Ok(Box::new(self.attach_drafter(session, support)?))
    }

    /// `attach`, returning the drafter itself (to log its passes before boxing it).
    pub fn attach_drafter(
        &self,
        session: &mut dyn DeviceSession,
        support: Arc<DsparkModel>,
    ) -> Result<DsparkDrafter, String> {
        let forward = session.dspark(support, self.convention).map_err(|e| e.to_string())?;
        Ok(DsparkDrafter::new(forward, self.confidence))
    }
}

impl DsparkSettings {
    /// `--speculate dspark` on `session` (of `ctx` tokens, nothing evaluated yet, so every position
    /// is captured): the support file loaded and checked against `model`, the drafter attached, and
    /// the memory guard's warning if any. Every error is one line.
    pub fn open(
        &self,
        model: &Model,
        session: &mut dyn DeviceSession,
        ctx: usize,
    ) -> Result<(Box<dyn Drafter>, Option<String>), String> {
        let opened = self.open_drafter(model, session, ctx)?;
        Ok((Box::new(opened.drafter), opened.warning))
    }

    /// `open`, returning the drafter itself (to log its passes before boxing it) and the support
    /// file (to count what a pass reads).
    pub fn open_drafter(
        &self,
        model: &Model,
        session: &mut dyn DeviceSession,
        ctx: usize,
    ) -> Result<OpenedDspark, String> {
        let support = self.load(model)?;
        let drafter = self.attach_drafter(session, support.clone())?;
        let warning = crate::engine::loader::guard_dspark_memory(model, &support, session, ctx)?;
        Ok(OpenedDspark {
            drafter,
            support,
            warning,
        })
    }
}

/// A drafter attached by `DsparkSettings::open_drafter`.
pub struct OpenedDspark {
    pub drafter: DsparkDrafter,
    pub support: Arc<DsparkModel>,
    /// The memory guard's warning, if any.
    pub warning: Option<String>,
}

/// One draft pass: the wall time of the block's stages and of its confidence and token reads, and
/// what it read (docs/dspark.md#cost).
#[derive(Clone, Debug, PartialEq)]
pub struct DraftPass {
    pub secs: f64,
    pub reads: PassReads,
}

/// The draft passes of one drafter, shared with whoever measures them (`bench`).
#[derive(Clone, Debug, Default)]
pub struct PassLog(Arc<Mutex<Vec<DraftPass>>>);

impl PassLog {
    fn push(&self, pass: DraftPass) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(pass);
    }

    /// The passes logged since the last call.
    pub fn take(&self) -> Vec<DraftPass> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The drafter over a backend's DSpark forward.
pub struct DsparkDrafter {
    forward: Box<dyn DsparkForward>,
    threshold: f32,
    /// The anchor position of the last proposal: a later one at an earlier position means the
    /// history was rewound.
    last_pos: Option<usize>,
    /// The confidences of the last proposal's rows that were read, in order.
    pub confidences: Vec<f32>,
    /// Where each pass is logged, when something measures them.
    log: Option<PassLog>,
}

impl DsparkDrafter {
    pub fn new(forward: Box<dyn DsparkForward>, threshold: f32) -> DsparkDrafter {
        DsparkDrafter {
            forward,
            threshold,
            last_pos: None,
            confidences: Vec::new(),
            log: None,
        }
    }

    /// From now on, log every draft pass that ran (its time and reads) to the returned log.
    pub fn log_passes(&mut self) -> PassLog {
        self.log.get_or_insert_with(PassLog::default).clone()
    }
}

impl Drafter for DsparkDrafter {
    fn name(&self) -> &'static str {
        "dspark"
    }

    /// The anchor is the history's last token (handed out, not yet evaluated) at position
    /// `history.len() − 1`; the block is conditioned on the captured target row before it.
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Draft) {
        out.clear();
        self.confidences.clear();
        let Some(&anchor) = history.last() else {
            return;
        };
        let pos = history.len() - 1;
        if self.last_pos.is_some_and(|p| pos < p) {
            self.forward.reset();
        }
        self.last_pos = Some(pos);
        let max = max.min(self.forward.block_size());
        let t0 = Instant::now();
        if max == 0 || !matches!(self.forward.run_block(anchor, pos), Ok(true)) {
            return;
        }
        let mut prev = anchor;
        for row in 0..max {
            let c = self.forward.confidence(row, prev);
            self.confidences.push(c);
            if c < self.threshold {
                break;
            }
            let d = self.forward.token(row, prev);
            out.tokens.push(d);
            prev = d;
        }
        if let Some(log) = &self.log {
            log.push(DraftPass {
                secs: t0.elapsed().as_secs_f64(),
                reads: self.forward.reads(),
            });
        }
    }

    /// A rejected suffix needs nothing here: the session drops the captured rows past what it kept
    /// and the forward recomputes what it derived from them.
    fn observe(&mut self, _verdict: &Verdict<'_>) {}
}
