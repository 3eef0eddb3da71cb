// The loading path that the fuzz target and tests/fuzz_corpus.rs drive with untrusted bytes
// (included by both, so they check the same thing): GGUF parsing (borrowed and owned),
// hyperparameters, binding, and reference dequantization of the first row of every bound float
// tensor. Bad input must come back as an error; a panic here is a bug.

/// Returns whether the bytes bound as a model.
pub fn load_untrusted(data: &[u8]) -> bool {
    use ds4_chat::gguf::GgufFile;
    use ds4_chat::gguf::dequant::{dequantize_row, is_dequantizable};
    use ds4_chat::model::{HParams, Model};

    let borrowed = GgufFile::parse_only(data);
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        assert!(borrowed.is_err(), "parse_only accepts what from_bytes refuses");
        return false;
    };
    assert!(borrowed.is_ok(), "parse_only refuses what from_bytes accepts");
    let file = std::sync::Arc::new(file);
    if HParams::from_gguf(&file).is_err() {
        return false;
    }
    let Ok(model) = Model::bind(file) else { return false };
    for (_, t) in model.grouped_tensors() {
        if is_dequantizable(t.ty) && t.dims[0] <= 4096 {
            let row = dequantize_row(t.ty, model.data(t), t.dims[0] as usize, 0);
            assert!(row.is_ok(), "first row of bound tensor '{}' does not decode", t.name);
        }
    }
    true
}
