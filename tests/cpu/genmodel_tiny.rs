//! Synthetic tiny models (docs/model.md#tiny-model) load through the real loader, are deterministic, and have
//! the weight magnitudes the generator promises.

use std::sync::Arc;
use std::time::Instant;

use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel, tiny_model};
use ds4_chat::gguf::dequant::dequantize_tensor;
use ds4_chat::gguf::{GgmlType, GgufFile};
use ds4_chat::model::{HParams, Model};

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ds4chat-genmodel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn std_of(v: &[f32]) -> f64 {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt()
}

#[test]
fn tiny_files_load_through_model_open_for_every_expert_mix() {
    for (mix, want) in [
        (ExpertMix::Q2, [GgmlType::Iq2Xxs, GgmlType::Q2K].repeat(6)),
        (ExpertMix::Q4, [GgmlType::Q4K, GgmlType::Q4K].repeat(6)),
        (
            ExpertMix::Mixed,
            [
                [GgmlType::Iq2Xxs, GgmlType::Q2K].repeat(4),
                [GgmlType::Q4K, GgmlType::Q4K].repeat(2),
            ]
            .concat(),
        ),
    ] {
        let path = temp_path(&format!("tiny-{}.gguf", mix.name()));
        let m = SyntheticModel::new(&GenSpec::new(Preset::Tiny, 7, mix)).unwrap();
        m.write_file(&path, 2, |_| {}).unwrap();
        let model = Model::open(&path).unwrap_or_else(|e| panic!("{}: {e}", mix.name()));
        std::fs::remove_file(&path).ok();
        assert_eq!(model.hp, HParams::tiny(), "{}: metadata round trip", mix.name());
        let got: Vec<GgmlType> = model
            .w
            .layers
            .iter()
            .flat_map(|l| [l.ffn_gate_exps.ty(), l.ffn_down_exps.ty()])
            .collect();
        assert_eq!(got, want, "{}: expert types per layer", mix.name());
        for (l, lw) in model.w.layers.iter().enumerate() {
            assert_eq!(lw.exp_probs_b.is_some(), l >= 3, "exp_probs_b only on non-hash layers");
            assert_eq!(lw.ffn_gate_tid2eid.is_some(), l < 3);
        }
        assert_eq!(
            model
                .file
                .get("tokenizer.ggml.tokens")
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            129280
        );
    }
}

#[test]
fn a_file_cut_to_its_first_layers_loads_with_their_schedules() {
    // gen-model --layers 4 on the tiny preset: the loader reads 4 layers back, the ratio and clamp
    // schedules cut to them, the hash layers and expert types of the full file's first 4.
    let spec = GenSpec::new(Preset::Tiny, 7, ExpertMix::Q2).with_layers(4).unwrap();
    let path = temp_path("tiny-4-layers.gguf");
    SyntheticModel::new(&spec)
        .unwrap()
        .write_file(&path, 2, |_| {})
        .unwrap();
    let model = Model::open(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let full = HParams::tiny();
    assert_eq!(model.hp.n_layer, 4);
    assert_eq!(model.hp.compress_ratios, full.compress_ratios[..4]);
    assert_eq!(model.hp.swiglu_clamp, full.swiglu_clamp[..4]);
    assert_eq!(model.hp.n_hash_layer, full.n_hash_layer);
    assert_eq!(model.w.layers.len(), 4);
    for (l, lw) in model.w.layers.iter().enumerate() {
        assert_eq!(lw.ffn_gate_tid2eid.is_some(), l < full.n_hash_layer, "layer {l}");
        assert_eq!(
            (lw.ffn_gate_exps.ty(), lw.ffn_down_exps.ty()),
            (GgmlType::Iq2Xxs, GgmlType::Q2K)
        );
    }
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let t = Instant::now();
    let a = tiny_model(11, ExpertMix::Q2).unwrap();
    eprintln!("in-memory tiny model: {:.2} s", t.elapsed().as_secs_f64());
    let b = tiny_model(11, ExpertMix::Q2).unwrap();
    let c = tiny_model(12, ExpertMix::Q2).unwrap();
    assert_eq!(a.bytes(), b.bytes());
    assert_eq!(a.bytes().len(), c.bytes().len());
    // Every tensor of another seed differs (a tensor equal across seeds would mean a seed leak).
    for t in &a.tensors {
        let tc = c.tensor(&t.name).unwrap();
        assert_ne!(a.tensor_data(t), c.tensor_data(tc), "{} ignores the seed", t.name);
    }
    // The streamed file equals the in-memory bytes.
    let path = temp_path("tiny-seed11.gguf");
    SyntheticModel::new(&GenSpec::new(Preset::Tiny, 11, ExpertMix::Q2))
        .unwrap()
        .write_file(&path, 3, |_| {})
        .unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(on_disk == a.bytes(), "file and in-memory bytes differ");
}

#[test]
fn weights_have_the_promised_magnitudes() {
    let f: Arc<GgufFile> = tiny_model(3, ExpertMix::Mixed).unwrap();
    let model = Model::bind(f.clone()).unwrap();
    let hp = &model.hp;
    let deq = |name: &str| dequantize_tensor(&f, f.tensor(name).unwrap()).unwrap();
    let e = hp.n_embd as f64;
    // (tensor, expected std). Tolerance 10%: Q8_0 rounding, per-block scale jitter (RMS +1%) and the
    // Irwin–Hall normals are all well inside it.
    let cases = [
        ("token_embd.weight", 1.0),
        ("blk.0.attn_q_a.weight", 1.0 / e.sqrt()),
        ("blk.0.attn_q_b.weight", 1.0 / (hp.q_lora_rank as f64).sqrt()),
        (
            "blk.1.attn_output_b.weight",
            0.25 / ((hp.n_out_group * hp.o_lora_rank) as f64).sqrt(),
        ),
        ("blk.2.ffn_gate_inp.weight", 1.0 / e.sqrt()),
        ("blk.0.attn_norm.weight", 0.3),
    ];
    for (name, want) in cases {
        let s = std_of(&deq(name));
        assert!((s / want - 1.0).abs() < 0.10, "{name}: std {s}, want {want}");
    }
    let norm = deq("blk.0.ffn_norm.weight");
    let mean = norm.iter().sum::<f32>() / norm.len() as f32;
    assert!((mean - 1.0).abs() < 0.05, "norm weights ≈ 1, mean {mean}");
    // Routed experts: cold rows std 1/√E, hot rows (the last F/16 channels) 4× that, in both an
    // IQ2_XXS (q2) and a Q4_K (q4) layer.
    let ff = hp.n_ff_exp;
    for l in [0, 5] {
        let w = deq(&format!("blk.{l}.ffn_up_exps.weight"));
        let rows: Vec<&[f32]> = w.chunks(hp.n_embd).collect();
        let cold: Vec<f32> = rows
            .iter()
            .enumerate()
            .filter(|(r, _)| r % ff < ff - ff / 16)
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        let hot: Vec<f32> = rows
            .iter()
            .enumerate()
            .filter(|(r, _)| r % ff >= ff - ff / 16)
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        let (sc, sh) = (std_of(&cold), std_of(&hot));
        assert!((sc * e.sqrt() - 1.0).abs() < 0.10, "layer {l} cold std {sc}");
        assert!((sh / sc - 4.0).abs() < 0.4, "layer {l} hot/cold {}", sh / sc);
    }
    // tid2eid: K_e distinct experts in [0, N_e) per token.
    let t = &model.w.layers[0].ffn_gate_tid2eid.as_ref().unwrap();
    let ids: Vec<i32> = f
        .tensor_data(t)
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for row in ids.chunks(hp.n_expert_used) {
        assert!(row.iter().all(|&x| x >= 0 && (x as usize) < hp.n_expert));
        let mut d = row.to_vec();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), hp.n_expert_used);
    }
}
