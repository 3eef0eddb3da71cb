//! Q4_K and mixed-type routed experts run end to end on the CPU engine (ds4's CPU path cannot
//! run Q4_K experts, ours must). Uses synthetic tiny models (genmodel, real architecture) built in
//! memory: the logits are finite, batched prefill equals token-by-token decode bit for bit (both run
//! the same per-token quantization, so no tolerance is needed), and the expert type really changes
//! the result.

use std::sync::Arc;

use ds4_chat::backend::DeviceSession;
use ds4_chat::backend::cpu::CpuSession;
use ds4_chat::genmodel::{ExpertMix, tiny_model};
use ds4_chat::gguf::GgmlType;
use ds4_chat::model::Model;

fn ids(n: usize) -> Vec<u32> {
    // Ordinary text-range ids; 40 tokens cross the tiny window (16) and emit ratio-4 rows.
    (0..n as u32).map(|i| 1000 + (i * 7919) % 90_000).collect()
}

fn logits_prefill_and_decode(model: &Arc<Model>, toks: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let mut a = CpuSession::new(model.clone(), 64, 0).unwrap();
    a.eval(toks, &mut |_, _| true).unwrap();
    let mut b = CpuSession::new(model.clone(), 64, 0).unwrap();
    for &t in toks {
        b.eval(&[t], &mut |_, _| true).unwrap();
    }
    (a.logits().to_vec(), b.logits().to_vec())
}

#[test]
fn q4_and_mixed_experts_run_and_prefill_equals_decode() {
    let toks = ids(40);
    let mut last = Vec::new();
    for mix in [ExpertMix::Q2, ExpertMix::Q4, ExpertMix::Mixed] {
        let model = Arc::new(Model::bind(tiny_model(7, mix).unwrap()).unwrap());
        let types: Vec<GgmlType> = model.w.layers.iter().map(|l| l.ffn_down_exps.ty()).collect();
        match mix {
            ExpertMix::Q2 => assert!(types.iter().all(|&t| t == GgmlType::Q2K)),
            ExpertMix::Q4 => assert!(types.iter().all(|&t| t == GgmlType::Q4K)),
            ExpertMix::Mixed => {
                assert!(
                    types.contains(&GgmlType::Q2K) && types.contains(&GgmlType::Q4K),
                    "{types:?}"
                )
            }
        }
        let (prefill, decode) = logits_prefill_and_decode(&model, &toks);
        assert!(prefill.iter().all(|v| v.is_finite()), "{mix:?}: non-finite logits");
        assert_eq!(prefill, decode, "{mix:?}: prefill and decode logits differ");
        let spread =
            prefill.iter().cloned().fold(f32::MIN, f32::max) - prefill.iter().cloned().fold(f32::MAX, f32::min);
        assert!(spread > 1.0, "{mix:?}: logits are flat (spread {spread})");
        assert_ne!(prefill, last, "{mix:?}: expert type did not change the logits");
        last = prefill;
    }
}
