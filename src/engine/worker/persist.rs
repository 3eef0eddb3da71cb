//! The worker's side of kept sessions (docs/sessions.md): writing the live session's KV snapshot,
//! and opening a saved conversation, from its snapshot when that holds a prefix of the saved
//! transcript, else by evaluating the transcript again (with a one-line notice saying why).

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::turn::PrefillProgress;
use super::{Interrupt, Loaded, WorkerState};
use crate::backend::BackendError;
use crate::engine::events::{Event, ResumeRequest};
use crate::model::hparams::HParams;
use crate::sessions::{ModelIdentity, snapshot};

/// The identity and shape a snapshot of this session is bound to.
pub(super) fn model_of(l: &Loaded) -> Result<(ModelIdentity, HParams), String> {
    let id = ModelIdentity::parse(&l.info.identity).ok_or("the model has no identity")?;
    let engine = l
        .device_model
        .as_ref()
        .ok_or("this loader keeps no model to snapshot")?;
    Ok((id, engine.model().hp.clone()))
}

/// Restore `path` into the session when it holds a prefix of `target`.
fn restore_snapshot(l: &mut Loaded, path: &Path, target: &[u32]) -> Result<(), String> {
    let (id, hp) = model_of(l)?;
    let snap = snapshot::load(path, id, &hp)?;
    if !target.starts_with(&snap.tokens) {
        return Err(format!(
            "it holds {} tokens that are not the start of the conversation's {}",
            snap.tokens.len(),
            target.len()
        ));
    }
    if snap.tokens.len() >= l.session.ctx() {
        return Err(format!(
            "it holds {} tokens, the context is {}",
            snap.tokens.len(),
            l.session.ctx()
        ));
    }
    l.session.restore(&snap.tokens, &snap.rows).map_err(|e| match e {
        BackendError::BadCheckpoint(m) => m,
        e => e.to_string(),
    })
}

impl WorkerState {
    pub(super) fn save_snapshot(&mut self, path: PathBuf) {
        let Some(l) = &self.loaded else {
            return self.emit(Event::SnapshotSaved {
                path,
                result: Err("no model loaded".into()),
                tokens: 0,
                transcript: None,
            });
        };
        let tokens = l.session.tokens();
        let result = if tokens.is_empty() {
            Err("the session is empty".into())
        } else {
            model_of(l).and_then(|(id, hp)| {
                let rows = l.session.export().map_err(|e| e.to_string())?;
                snapshot::save(&path, id, &hp, tokens, &rows)
            })
        };
        self.emit(Event::SnapshotSaved {
            path,
            result,
            tokens: tokens.len() as u32,
            transcript: l.text.transcript(),
        });
    }

    pub(super) fn resume(&mut self, req: ResumeRequest) {
        let start = Instant::now();
        let WorkerState { inbox, tx, loaded, .. } = self;
        let emit = |e: Event| {
            let _ = tx.send(e);
        };
        let Some(l) = loaded else {
            return emit(Event::Error {
                message: "no model loaded".into(),
                fatal: false,
            });
        };
        l.session.reset();
        l.text.forget();
        let resumed = |tokens: usize, from_snapshot: bool, note: Option<String>| Event::Resumed {
            tokens: tokens as u32,
            from_snapshot,
            elapsed: start.elapsed(),
            note,
        };
        let Some(t) = &req.transcript else {
            return emit(resumed(0, false, None));
        };
        let messages = &req.messages[..t.messages.min(req.messages.len())];
        if let Err(e) = l.text.resume(messages, &t.ids) {
            l.text.forget();
            return emit(resumed(
                0,
                false,
                Some(format!("{e}; the next message reads the conversation again")),
            ));
        }
        // The cache of a finished turn ends before the end-of-turn token its transcript closes
        // with (the stop token is sampled, not evaluated); the next prompt evaluates it.
        let eos = l.text.eos();
        let target = t.ids.strip_suffix(&[eos]).unwrap_or(&t.ids);
        let mut note = None;
        if let Some(path) = &req.snapshot {
            match restore_snapshot(l, path, target) {
                Ok(()) if l.session.tokens().len() == target.len() => {
                    return emit(resumed(target.len(), true, None));
                }
                Ok(()) => {}
                Err(e) => {
                    note = Some(format!(
                        "snapshot {} not used: {e}; reading the conversation again",
                        path.display()
                    ))
                }
            }
        }
        let mut progress = PrefillProgress::new(start);
        let r = l.session.sync(target, &mut |done, total| {
            progress.report(tx, done, total);
            inbox.poll_during_turn() == Interrupt::None
        });
        match r {
            Ok(_) | Err(BackendError::Cancelled { .. }) => {}
            Err(e) => {
                l.session.reset();
                note = Some(format!("cannot read the conversation again: {e}"));
            }
        }
        emit(resumed(l.session.tokens().len(), false, note));
    }
}
