//! Shared by the session tests: a cache carried from one backend to another through the KV snapshot
//! file format, and the bitwise comparison of what the resumed backend computes next.
#![allow(dead_code)]

use std::sync::Arc;

use ds4_chat::backend::DeviceSession;
use ds4_chat::backend::arithmetic::Arithmetic;
use ds4_chat::engine::backend_open::{PlacementRequest, open_device_model};
use ds4_chat::engine::events::BackendChoice;
use ds4_chat::model::Model;
use ds4_chat::sessions::{ModelIdentity, snapshot};

/// A session of the CPU engine (the exact reference) on `model`, with a cache of `ctx` tokens.
pub fn cpu_session(model: &Arc<Model>, ctx: usize) -> Box<dyn DeviceSession> {
    let at = PlacementRequest {
        backend: BackendChoice::Cpu,
        arithmetic: Arithmetic::Exact,
        ..Default::default()
    };
    open_device_model(model.clone(), &at, ctx)
        .unwrap_or_else(|e| panic!("{e}"))
        .session
}

/// A fixed pseudo-random token sequence below `vocab`.
pub fn tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + seed * 97) % (vocab as u64 - 3)) as u32)
        .collect()
}

/// `from`'s cache (holding `held`) written as a snapshot file's bytes, read back and imported into
/// `to`.
pub fn carry(model: &Model, from: &dyn DeviceSession, held: &[u32], to: &mut dyn DeviceSession) {
    let id = ModelIdentity::of(&model.file);
    let rows = from.export_cache().expect("export");
    let bytes = snapshot::encode(id, &model.hp, held, &rows);
    let snap = snapshot::decode(&bytes, id, &model.hp).expect("decode what was encoded");
    assert_eq!(snap.tokens, held);
    assert_eq!(snap.rows, rows);
    to.import_cache(&snap.rows, &snap.tokens).expect("import");
    assert_eq!(to.n_past(), held.len());
    let back = to.export_cache().expect("export again");
    assert!(same_bits(&back.logits, &rows.logits), "restored logits differ");
    assert_eq!(back.layers.len(), rows.layers.len());
    for (l, (a, b)) in back.layers.iter().zip(&rows.layers).enumerate() {
        assert!(
            same_bits(&a.raw, &b.raw),
            "layer {l}: raw rows differ after the round trip"
        );
    }
}

pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Evaluates `then` on the resumed and on the uninterrupted backend, one token at a time, and
/// asserts their logits are equal to the bit after every token.
pub fn continue_both(resumed: &mut dyn DeviceSession, uninterrupted: &mut dyn DeviceSession, then: &[u32], what: &str) {
    for (i, &t) in then.iter().enumerate() {
        resumed.eval(&[t], &mut |_, _| true).unwrap();
        uninterrupted.eval(&[t], &mut |_, _| true).unwrap();
        assert!(
            same_bits(resumed.logits(), uninterrupted.logits()),
            "{what}: logits differ {i} tokens after the resume"
        );
    }
}
