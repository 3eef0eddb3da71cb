//! A scripted engine for testing the server end to end (`DS4_TEST_SERVE_SCRIPT`): the real model,
//! tokenizer, renderer and streaming decoder run as usual, but each turn's reply is a given list of
//! token ids, so a test can make a tiny random model "call a tool" through the real HTTP server,
//! call parser and renderer. The real session still evaluates every token (its cache and the
//! prompt cache behave as in production); only the logits are replaced, by a one-hot vector on the
//! scripted token (EOS once a turn's list is used up, and for turns beyond the script).
//!
//! A turn starts at the first evaluation that is not the expected next scripted token (the prompt),
//! or at a restore or reset (a prompt the prompt cache holds whole needs no evaluation); more of
//! them before the first scripted token belong to the same turn. Owns only this replacement. Must not be used unless the test
//! hook is set (cli/serve.rs).

use crate::backend::{BackendError, DeviceSession, MemoryReport, Progress, cache_rows::CacheRows};
use crate::model::tools::Json;

use super::events::{Event, LoadRequest};
use super::worker::{LoadedModel, ModelLoader};

/// The replies of a script file: `{"turns": [[id, ...], ...]}`.
pub fn read_script(path: &std::path::Path) -> Result<Vec<Vec<u32>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = || format!("{}: expected {{\"turns\": [[token ids], ...]}}", path.display());
    let root = Json::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(Json::Array(turns)) = root.get("turns") else {
        return Err(bad());
    };
    turns
        .iter()
        .map(|t| match t {
            Json::Array(ids) => ids
                .iter()
                .map(|id| match id {
                    Json::Int(i) => u32::try_from(*i).map_err(|_| bad()),
                    _ => Err(bad()),
                })
                .collect(),
            _ => Err(bad()),
        })
        .collect()
}

/// Where the script stands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    /// No turn yet.
    Idle,
    /// Evaluating turn `t`'s prompt.
    Prompt(usize),
    /// Turn `t`, `pos` scripted tokens evaluated.
    Decoding(usize, usize),
}

pub struct ScriptedSession {
    inner: Box<dyn DeviceSession>,
    script: Vec<Vec<u32>>,
    eos: u32,
    next_turn: usize,
    step: Step,
    logits: Vec<f32>,
}

impl ScriptedSession {
    pub fn new(inner: Box<dyn DeviceSession>, script: Vec<Vec<u32>>, eos: u32) -> ScriptedSession {
        let n_vocab = inner.logits().len();
        ScriptedSession {
            inner,
            script,
            eos,
            next_turn: 0,
            step: Step::Idle,
            logits: vec![0.0; n_vocab],
        }
    }

    fn expected(&self) -> Option<u32> {
        let (t, pos) = match self.step {
            Step::Idle => return None,
            Step::Prompt(t) => (t, 0),
            Step::Decoding(t, pos) => (t, pos),
        };
        Some(
            self.script
                .get(t)
                .and_then(|ids| ids.get(pos))
                .copied()
                .unwrap_or(self.eos),
        )
    }

    fn after_eval(&mut self, tokens: &[u32]) {
        let scripted = self.expected().is_some_and(|e| tokens == [e] && e != self.eos);
        match (self.step, scripted) {
            (Step::Prompt(t), true) => self.step = Step::Decoding(t, 1),
            (Step::Decoding(t, pos), true) => self.step = Step::Decoding(t, pos + 1),
            _ => return self.begin_prompt(),
        }
        self.set_logits();
    }

    /// A prompt is being set up: a new turn, unless one is already.
    fn begin_prompt(&mut self) {
        if !matches!(self.step, Step::Prompt(_)) {
            self.step = Step::Prompt(self.next_turn);
            self.next_turn += 1;
        }
        self.set_logits();
    }

    fn set_logits(&mut self) {
        let next = self.expected().unwrap_or(self.eos) as usize;
        self.logits.fill(f32::NEG_INFINITY);
        if let Some(l) = self.logits.get_mut(next) {
            *l = 0.0;
        }
    }
}

impl DeviceSession for ScriptedSession {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn device_name(&self) -> String {
        format!("{} (scripted replies)", self.inner.device_name())
    }
    fn ctx(&self) -> usize {
        self.inner.ctx()
    }
    fn n_past(&self) -> usize {
        self.inner.n_past()
    }
    fn eval(&mut self, tokens: &[u32], progress: Progress<'_>) -> Result<(), BackendError> {
        self.inner.eval(tokens, progress)?;
        self.after_eval(tokens);
        Ok(())
    }
    fn logits(&self) -> &[f32] {
        &self.logits
    }
    fn reset(&mut self) {
        self.inner.reset();
        self.begin_prompt();
    }
    fn save_state(&self) -> Vec<u8> {
        self.inner.save_state()
    }
    fn load_state(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        self.inner.load_state(bytes)?;
        self.begin_prompt();
        Ok(())
    }
    fn export_cache(&self) -> Result<CacheRows, BackendError> {
        self.inner.export_cache()
    }
    fn import_cache(&mut self, rows: &CacheRows, tokens: &[u32]) -> Result<(), BackendError> {
        self.inner.import_cache(rows, tokens)?;
        self.begin_prompt();
        Ok(())
    }
    fn memory(&self) -> MemoryReport {
        self.inner.memory()
    }
}

/// `inner`, or, when the test hook `DS4_TEST_SERVE_SCRIPT` names a script, a loader replying with it.
pub fn with_test_script(inner: Box<dyn ModelLoader>) -> Result<Box<dyn ModelLoader>, String> {
    match crate::backend::knobs::path(crate::backend::knobs::TEST_SERVE_SCRIPT) {
        None => Ok(inner),
        Some(path) => Ok(Box::new(ScriptedLoader {
            inner,
            script: read_script(&path)?,
        })),
    }
}

/// A loader whose sessions reply with the script.
pub struct ScriptedLoader {
    pub inner: Box<dyn ModelLoader>,
    pub script: Vec<Vec<u32>>,
}

impl ModelLoader for ScriptedLoader {
    fn load(&mut self, req: &LoadRequest, notice: &mut dyn FnMut(Event)) -> Result<LoadedModel, String> {
        let mut m = self.inner.load(req, notice)?;
        let eos = m.text.eos();
        m.session = Box::new(ScriptedSession::new(m.session, self.script.clone(), eos));
        // A later session would come from the engine unwrapped.
        m.device_model = None;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session that only counts: logits of 4 tokens.
    struct Counting(usize);
    impl DeviceSession for Counting {
        fn name(&self) -> &'static str {
            "count"
        }
        fn device_name(&self) -> String {
            "count".into()
        }
        fn ctx(&self) -> usize {
            100
        }
        fn n_past(&self) -> usize {
            self.0
        }
        fn eval(&mut self, tokens: &[u32], _: Progress<'_>) -> Result<(), BackendError> {
            self.0 += tokens.len();
            Ok(())
        }
        fn logits(&self) -> &[f32] {
            &[0.0; 4]
        }
        fn reset(&mut self) {
            self.0 = 0;
        }
        fn save_state(&self) -> Vec<u8> {
            Vec::new()
        }
        fn load_state(&mut self, _: &[u8]) -> Result<(), BackendError> {
            Ok(())
        }
        fn memory(&self) -> MemoryReport {
            MemoryReport::default()
        }
    }

    fn argmax(s: &ScriptedSession) -> usize {
        (0..4).max_by(|&a, &b| s.logits()[a].total_cmp(&s.logits()[b])).unwrap()
    }

    #[test]
    fn each_prompt_starts_the_next_scripted_turn() {
        let mut s = ScriptedSession::new(Box::new(Counting(0)), vec![vec![1, 2], vec![2]], 3);
        let mut go = |_: usize, _: usize| true;
        s.eval(&[0, 0, 0], &mut go).unwrap();
        assert_eq!(argmax(&s), 1);
        s.eval(&[1], &mut go).unwrap();
        assert_eq!(argmax(&s), 2);
        s.eval(&[2], &mut go).unwrap();
        assert_eq!(argmax(&s), 3, "EOS after the turn's ids");
        s.eval(&[3, 0, 0], &mut go).unwrap();
        assert_eq!(argmax(&s), 2, "second turn");
        s.eval(&[0], &mut go).unwrap();
        assert_eq!(argmax(&s), 2, "more prompt keeps the turn");
        s.eval(&[2], &mut go).unwrap();
        s.load_state(&[]).unwrap();
        assert_eq!(
            argmax(&s),
            3,
            "a restored prompt starts the third turn: beyond the script, EOS"
        );
        s.eval(&[0], &mut go).unwrap();
        assert_eq!(argmax(&s), 3, "and its suffix belongs to it");
        assert_eq!(s.next_turn, 3);
    }
}
