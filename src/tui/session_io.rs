//! Performs the app's `SessionOp`s on the sessions directory (the only place the TUI reads or
//! writes it) and reports each as a `SessionOutcome`.

use crate::sessions::budget;
use crate::sessions::store::Store;
use crate::tui::app::sessions::{OpenWhich, SessionOp, SessionOutcome};

pub fn perform(store: &Store, op: SessionOp) -> SessionOutcome {
    match op {
        SessionOp::Save { record, budget: bytes } => SessionOutcome::Saved(store.save(&record).map(|()| {
            let keep = store.snapshot_path(&record.id);
            budget::enforce(store.dir(), bytes, Some(&keep))
                .iter()
                .map(|p| p.display().to_string())
                .collect()
        })),
        SessionOp::List => {
            let (list, problems) = store.list();
            SessionOutcome::Listed(list, problems)
        }
        SessionOp::Open { which, identity } => {
            let id = match which {
                OpenWhich::Latest => store
                    .latest_for(&identity)
                    .ok_or_else(|| "--resume: no saved session for this model".to_string()),
                OpenWhich::Named(arg) => store.resolve(&arg),
            };
            SessionOutcome::Opened(id.and_then(|id| store.load(&id)).map(Box::new))
        }
        SessionOp::Delete { which } => {
            SessionOutcome::Deleted(store.resolve(&which).and_then(|id| store.delete(&id).map(|()| id)))
        }
    }
}
