//! A small model generated in memory for the tests of the decode paths (block verify, speculative
//! decoding): the tiny architecture cut to 3 layers (compression ratios 0, 4 with the indexer, and
//! 128) and a 512-token vocabulary, so a test decodes hundreds of tokens in about a second, and
//! deterministic token ids inside a vocabulary.

use std::sync::Arc;

use ds4_chat::genmodel::{ExpertMix, GenSpec, model_bytes};
use ds4_chat::gguf::GgufFile;
use ds4_chat::model::Model;

/// The 3-layer, 512-token tiny model (seed 5, Q2 experts), without a tokenizer.
pub fn three_layer_model() -> Arc<Model> {
    let spec = GenSpec::tiny_each_cache_kind(5, ExpertMix::Q2);
    let file = GgufFile::from_bytes(model_bytes(&spec).unwrap()).unwrap();
    Arc::new(Model::bind(Arc::new(file)).unwrap())
}

/// `n` deterministic token ids (an LCG), all inside the vocabulary.
pub fn ids(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}
