//! The worker's side of the prompt store (docs/serve.md#prompt-cache): opening it for each new
//! session of a model that has an identity, writing a turn's states after the turn, and passing
//! the store's notices on as `Event::Notice`.

use super::WorkerState;
use super::persist::model_of;
use crate::engine::events::Event;
use crate::engine::prompt_store::{PromptStore, arithmetic_key};

impl WorkerState {
    /// Give the live session the store `SetPromptStore` asked for (or none).
    pub(super) fn open_prompt_store(&mut self) {
        let Some(l) = &mut self.loaded else { return };
        let Some(settings) = self.prompt_store.clone() else {
            l.session.set_store(None);
            return;
        };
        let opened =
            model_of(l).and_then(|(id, hp)| PromptStore::open(settings, id, hp, arithmetic_key(l.info.arithmetic)));
        let notice = match opened {
            Ok(store) => {
                let n = store.len();
                let dir = store.dir().display().to_string();
                l.session.set_store(Some(store));
                format!("prompt cache: {n} stored prefixes of this model in {dir}")
            }
            Err(e) => {
                l.session.set_store(None);
                format!("prompt cache off: {e}")
            }
        };
        self.emit_store_notices();
        self.emit(Event::Notice { message: notice });
    }

    /// After a turn: write its states to the store, then report what the store noticed.
    pub(super) fn persist_prompt(&mut self) {
        if let Some(l) = &mut self.loaded {
            l.session.persist();
        }
        self.emit_store_notices();
    }

    pub(super) fn emit_store_notices(&mut self) {
        let Some(l) = &mut self.loaded else { return };
        for message in l.session.take_store_notices() {
            let _ = self.tx.send(Event::Notice { message });
        }
    }
}
