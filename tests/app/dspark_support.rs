//! The DSpark support file through the binary (docs/dspark.md#support-file): a synthetic one made
//! by `gen-model --preset dspark --like MODEL` passes `inspect`, and every malformed one (truncated,
//! a tensor missing, misshaped or of the wrong type, bad metadata, a target layer out of range, the
//! file of another model's shapes) ends `inspect --dspark` with exit status 1 and one stderr line
//! naming the defect.

use std::path::{Path, PathBuf};
use std::process::Command;

use ds4_chat::genmodel::dspark::{meta_for, support_entries, support_metadata};
use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel, micro_hparams};
use ds4_chat::gguf::reader::vt;
use ds4_chat::gguf::writer::{GgufLayout, TensorEntry};
use ds4_chat::gguf::{GgmlType, MetaValue};
use ds4_chat::model::HParams;

/// A scratch directory of this test, removed at the end.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ds4_chat(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
        .args(args)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("spawn ds4-chat")
}

/// `gen-model --preset dspark --like MODEL --out OUT`: the synthetic support file of `model`'s shapes.
fn gen_support(model: &str, out: &Path) {
    let out_s = out.to_str().unwrap();
    let run = ds4_chat(&["gen-model", "--preset", "dspark", "--like", model, "--out", out_s]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
}

/// The 3-layer tiny model (512-token vocabulary) written to `dir`.
fn main_model(dir: &Path) -> (PathBuf, HParams) {
    let spec = GenSpec::tiny_each_cache_kind(5, ExpertMix::Q2);
    let path = dir.join("model.gguf");
    SyntheticModel::new(&spec)
        .unwrap()
        .write_file(&path, 1, |_| {})
        .unwrap();
    (path, spec.hp)
}

/// A support file with zero weights from edited metadata and tensors (the loader checks names,
/// types, shapes and metadata, never values).
fn support_bytes(meta: &[(String, MetaValue)], entries: &[TensorEntry]) -> Vec<u8> {
    GgufLayout::new(meta, entries)
        .unwrap()
        .to_vec(1 << 20, |_, _, b| b.fill(0))
}

type Edit = Box<dyn Fn(&mut Vec<(String, MetaValue)>, &mut Vec<TensorEntry>)>;

fn set_key(m: &mut [(String, MetaValue)], key: &str, v: MetaValue) {
    m.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

fn tensor<'a>(t: &'a mut [TensorEntry], name: &str) -> &'a mut TensorEntry {
    t.iter_mut().find(|e| e.name == name).unwrap()
}

#[test]
fn synthetic_support_passes_inspect_and_malformed_ones_are_one_line_errors() {
    let dir = Dir(std::env::temp_dir().join(format!("ds4-chat-dspark-support-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (model, hp) = main_model(&dir.0);
    let model_s = model.to_str().unwrap();

    // The synthetic file from gen-model passes inspect, found next to the model under ds4's name.
    let good = dir.0.join(ds4_chat::model::dspark::SUPPORT_FILE_NAME);
    gen_support(model_s, &good);
    let out = ds4_chat(&["inspect", model_s]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(
            "DSpark support: 3 stages, block 5, Markov rank 32, noise token 511, target layers [0, 1, 2], 81 tensors"
        ),
        "{stdout}"
    );
    let good_bytes = std::fs::read(&good).unwrap();
    std::fs::remove_file(&good).unwrap();

    let meta = meta_for(&hp);
    let base_meta = support_metadata(&meta, 3, 1);
    let base_entries = support_entries(&hp, &meta);
    let e = hp.n_embd as u64;
    let cases: Vec<(&str, Edit, String)> = vec![
        (
            "missing tensor",
            Box::new(|_, t| t.retain(|e| e.name != "mtp.1.attn_kv.weight")),
            "missing tensor 'mtp.1.attn_kv.weight' (expected Q8_0, F16, F32 [256, 128])".into(),
        ),
        (
            "missing Markov head",
            Box::new(|_, t| t.retain(|e| e.name != "mtp.2.markov_head.markov_w2.weight")),
            "missing tensor 'mtp.2.markov_head.markov_w2.weight'".into(),
        ),
        (
            "wrong shape",
            Box::new(move |_, t| tensor(t, "mtp.0.attn_q_a.weight").dims = vec![e, 96]),
            "tensor 'mtp.0.attn_q_a.weight': shape [256, 96], expected [256, 64]".into(),
        ),
        (
            "main_proj for two targets",
            Box::new(move |_, t| tensor(t, "mtp.0.main_proj.weight").dims = vec![2 * e, e]),
            "tensor 'mtp.0.main_proj.weight': shape [512, 256], expected [768, 256]".into(),
        ),
        (
            "wrong type of a norm",
            Box::new(|_, t| tensor(t, "mtp.2.attn_norm.weight").ty = GgmlType::F16),
            "tensor 'mtp.2.attn_norm.weight': type F16, expected F32".into(),
        ),
        (
            "wrong type of the grouped output projection",
            Box::new(|_, t| tensor(t, "mtp.0.attn_output_a.weight").ty = GgmlType::F16),
            "tensor 'mtp.0.attn_output_a.weight': type F16, expected Q8_0".into(),
        ),
        (
            "gate and up of different types",
            Box::new(|_, t| tensor(t, "mtp.1.ffn_up_exps.weight").ty = GgmlType::Q4K),
            "tensor 'mtp.1.ffn_up_exps.weight': type Q4_K, expected IQ2_XXS (gate and up must share a type)".into(),
        ),
        (
            "block size 0",
            Box::new(|m, _| set_key(m, "dspark.block_size", MetaValue::U32(0))),
            "key 'dspark.block_size': block size 0, expected 1..=16".into(),
        ),
        (
            "block size 17",
            Box::new(|m, _| set_key(m, "dspark.block_size", MetaValue::U32(17))),
            "key 'dspark.block_size': block size 17, expected 1..=16".into(),
        ),
        (
            "Markov rank as a string",
            Box::new(|m, _| set_key(m, "dspark.markov_rank", MetaValue::String("32".into()))),
            "key 'dspark.markov_rank': string \"32\", expected a non-negative integer".into(),
        ),
        (
            "no noise token",
            Box::new(|m, _| m.retain(|(k, _)| k != "dspark.noise_token_id")),
            "missing metadata key 'dspark.noise_token_id' (nor its deepseek4. spellings)".into(),
        ),
        (
            "noise token outside the vocabulary",
            Box::new(|m, _| set_key(m, "dspark.noise_token_id", MetaValue::U32(512))),
            "key 'dspark.noise_token_id': noise token 512 is outside the main model's vocabulary (512)".into(),
        ),
        (
            "target layer out of range",
            Box::new(|m, _| {
                let a = (1..4).map(MetaValue::U32).collect();
                set_key(m, "dspark.target_layer_ids", MetaValue::Array(vt::U32, a))
            }),
            "key 'dspark.target_layer_ids': target layer 3 is out of range (the main model has 3 layers)".into(),
        ),
        (
            "target layers not increasing",
            Box::new(|m, _| {
                let a = [2, 1, 0].into_iter().map(MetaValue::U32).collect();
                set_key(m, "dspark.target_layer_ids", MetaValue::Array(vt::U32, a))
            }),
            "key 'dspark.target_layer_ids': target layers [2, 1, 0] are not strictly increasing".into(),
        ),
        (
            "two stages",
            Box::new(|_, t| t.retain(|e| !e.name.starts_with("mtp.2."))),
            "not a DSpark support file: 2 mtp.N stages, expected at least 3".into(),
        ),
    ];
    let mut n = 0;
    let mut check = |what: &str, bytes: &[u8], want: &str| {
        let path = dir.0.join(format!("bad-{n}.gguf"));
        n += 1;
        std::fs::write(&path, bytes).unwrap();
        let out = ds4_chat(&["inspect", model_s, "--dspark", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{what}: one line expected, got {stderr:?}");
        assert!(
            stderr.starts_with(&format!("ds4-chat: {}: ", path.display())),
            "{what}: {stderr}"
        );
        assert!(stderr.contains(want), "{what}: {stderr:?} lacks {want:?}");
    };
    for (what, edit, want) in &cases {
        let (mut m, mut t) = (base_meta.clone(), base_entries.clone());
        edit(&mut m, &mut t);
        check(what, &support_bytes(&m, &t), want);
    }
    // Truncated: the last tensor's data runs past the end of the file.
    check(
        "truncated",
        &good_bytes[..good_bytes.len() - 4096],
        "runs past end of file",
    );
    // Another model's shapes: the support file of a 2-stream, 1-layer model.
    let micro = micro_hparams();
    let mm = meta_for(&micro);
    check(
        "another model's support file",
        &support_bytes(&support_metadata(&mm, 3, 1), &support_entries(&micro, &mm)),
        "tensor 'mtp.0.hc_attn_base.weight': shape [8], expected [24] (from the main model's shapes: a support file for another model?)",
    );
    assert_eq!(n, cases.len() + 2);
    assert!(n >= 12);

    // ds4's alias spellings of the keys are read too.
    let aliased: Vec<(String, MetaValue)> = base_meta
        .iter()
        .map(|(k, v)| (k.replace("dspark.block_size", "deepseek4.dspark_block_size"), v.clone()))
        .collect();
    let path = dir.0.join("aliased.gguf");
    std::fs::write(&path, support_bytes(&aliased, &base_entries)).unwrap();
    let out = ds4_chat(&["inspect", model_s, "--dspark", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // `run --speculate dspark` with the support file found next to the model (the tiny preset's
    // first 3 layers, with its tokenizer, as `run` needs): the greedy --dump-logprobs file is plain
    // decoding's byte for byte, and the figures are printed.
    let run_dir = dir.0.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let model = run_dir.join("model.gguf");
    let spec = GenSpec::new(Preset::Tiny, 5, ExpertMix::Q2).with_layers(3).unwrap();
    SyntheticModel::new(&spec)
        .unwrap()
        .write_file(&model, 1, |_| {})
        .unwrap();
    let model_s = model.to_str().unwrap();
    let support = run_dir.join(ds4_chat::model::dspark::SUPPORT_FILE_NAME);
    gen_support(model_s, &support);
    let dump = |name: &str, extra: &[&str]| {
        let path = dir.0.join(name);
        let mut args = vec![
            "run",
            "-m",
            model_s,
            "--tokens",
            "1,20,300,4,50",
            "-n",
            "64",
            "--ctx",
            "256",
            "--backend",
            "cpu",
            "--dump-logprobs",
        ];
        args.push(path.to_str().unwrap());
        args.extend_from_slice(extra);
        let out = ds4_chat(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{extra:?}: {stderr}");
        (std::fs::read(&path).unwrap(), stderr)
    };
    let (plain, _) = dump("plain.jsonl", &[]);
    for conv in ["reference", "ds4"] {
        let (spec, stderr) = dump(
            "dspark.jsonl",
            &[
                "--speculate",
                "dspark",
                "--dspark-confidence",
                "0",
                "--dspark-convention",
                conv,
            ],
        );
        assert_eq!(spec, plain, "{conv}");
        assert!(stderr.contains("speculate dspark: "), "{stderr}");
        assert!(!stderr.contains("speculate dspark: 0 cycles"), "{stderr}");
    }
    // doctor shows the support file next to the model and counts it in the memory it needs.
    let out = ds4_chat(&["doctor", model_s]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("dspark"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("ok"), "{line}");
    assert!(
        line.contains(
            "DSpark support: 3 stages, block 5, Markov rank 32, noise token 128799, target layers [0, 1, 2], 81 tensors"
        ),
        "{line}"
    );
    // No support file: one line, exit 1.
    let out = ds4_chat(&[
        "run",
        "-m",
        model_s,
        "--tokens",
        "1,2",
        "-n",
        "4",
        "--backend",
        "cpu",
        "--speculate",
        "dspark",
        "--dspark",
        "/nonexistent/support.gguf",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("ds4-chat: /nonexistent/support.gguf: "), "{stderr}");
}
