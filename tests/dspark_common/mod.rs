//! DSpark test fixtures shared by tests/cpu/dspark_drafter.rs (the CPU drafter) and
//! tests/emu/dspark.rs (the HIP backend's capture on the kernel emulator): the tiny model's
//! synthetic support file, one whose Markov head knows the target's greedy successors
//! (`oracle_support`), the prompts, and greedy generation with the drafter attached.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use ds4_chat::backend::DeviceSession;
use ds4_chat::engine::generate::{Limits, Speculation, SpeculationFigures, generate_speculative};
use ds4_chat::engine::speculate::dspark::DsparkSettings;
use ds4_chat::genmodel::dspark::{meta_for, support_model};
use ds4_chat::gguf::GgufFile;
use ds4_chat::gguf::half::f32_to_f16;
use ds4_chat::model::Model;
use ds4_chat::model::dspark::DsparkModel;

use crate::speculative_common::{Open, Record, params};

/// The support file's bytes for the 3-layer model (seed 7).
pub fn support_bytes(model: &Model) -> Vec<u8> {
    support_model(&model.hp, &meta_for(&model.hp), 7).unwrap().to_bytes()
}

pub fn bind(model: &Model, bytes: Vec<u8>) -> Arc<DsparkModel> {
    Arc::new(DsparkModel::bind(Arc::new(GgufFile::from_bytes(bytes).unwrap()), &model.hp).unwrap())
}

/// Four prompts of deterministic ids.
pub fn prompts() -> Vec<Vec<u32>> {
    (0..4u64)
        .map(|i| crate::small_model::ids(12 + 5 * i as usize, 31 + i, 512))
        .collect()
}

/// Q8_0 block `b` (32 values) of the tensor at absolute `off`: scale `d` and the 32 quants.
fn set_q8_block(bytes: &mut [u8], off: usize, b: usize, d: f32, qs: &[i8; 32]) {
    let at = off + b * 34;
    bytes[at..at + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for (i, &q) in qs.iter().enumerate() {
        bytes[at + 2 + i] = q as u8;
    }
}

/// The support file with a Markov head that, after each of the (up to rank) most frequent tokens of
/// `outputs`, biases the token that most often follows it there by +`gain`: `markov_w1[t]` is the
/// one-hot k of its slot, `markov_w2[successor][k]` = gain.
pub fn oracle_support(model: &Model, outputs: &[Vec<u32>], gain: f32) -> Arc<DsparkModel> {
    let mut bytes = support_bytes(model);
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let w1 = f.tensor("mtp.2.markov_head.markov_w1.weight").unwrap().clone();
    let w2 = f.tensor("mtp.2.markov_head.markov_w2.weight").unwrap().clone();
    let rank = w1.dims[0] as usize;
    assert_eq!(rank, 32, "one Q8_0 block per row");
    let mut next: HashMap<u32, HashMap<u32, usize>> = HashMap::new();
    for out in outputs {
        for w in out.windows(2) {
            *next.entry(w[0]).or_default().entry(w[1]).or_default() += 1;
        }
    }
    let mut by_count: Vec<(usize, u32, u32)> = next
        .iter()
        .map(|(&t, succ)| {
            let (&s, &c) = succ.iter().max_by_key(|&(&s, &c)| (c, std::cmp::Reverse(s))).unwrap();
            (c, t, s)
        })
        .collect();
    by_count.sort_by(|a, b| b.cmp(a));
    let vocab = model.hp.n_vocab;
    // Clear every row of both tables, then write the slots.
    for t in 0..vocab {
        set_q8_block(&mut bytes, w1.offset as usize, t, 0.0, &[0; 32]);
        set_q8_block(&mut bytes, w2.offset as usize, t, 0.0, &[0; 32]);
    }
    let mut w2_rows: HashMap<u32, [i8; 32]> = HashMap::new();
    for (k, &(_, t, s)) in by_count.iter().take(rank).enumerate() {
        let mut one = [0i8; 32];
        one[k] = 127;
        set_q8_block(&mut bytes, w1.offset as usize, t as usize, 1.0 / 127.0, &one);
        w2_rows.entry(s).or_insert([0; 32])[k] = 127;
    }
    for (s, qs) in w2_rows {
        set_q8_block(&mut bytes, w2.offset as usize, s as usize, gain / 127.0, &qs);
    }
    bind(model, bytes)
}

/// Greedy generation from `prompt` with the DSpark drafter of `support` attached before the prompt,
/// drafting `fixed` tokens a cycle (the scheduler when `None`): the tokens, the figures and the
/// session's length afterwards.
pub fn with_dspark(
    open: Open,
    prompt: &[u32],
    support: &Arc<DsparkModel>,
    settings: &DsparkSettings,
    limits: Limits,
    fixed: Option<usize>,
) -> (Vec<u32>, SpeculationFigures, usize) {
    let mut s: Box<dyn DeviceSession> = open();
    let drafter = settings.attach(s.as_mut(), support.clone()).unwrap();
    s.eval(prompt, &mut |_, _| true).unwrap();
    let mut h = Record::new(&params(0.0, 1));
    let mut spec = Speculation::new(drafter, prompt);
    if let Some(k) = fixed {
        spec = spec.with_fixed_len(k);
    }
    generate_speculative(s.as_mut(), limits, &mut h, &mut spec).unwrap();
    (h.out, spec.figures, s.n_past())
}
