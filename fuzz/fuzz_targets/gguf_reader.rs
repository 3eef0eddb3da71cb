//! Fuzz target: arbitrary bytes through the whole loading path — GGUF parsing (borrowed and owned),
//! hyperparameter validation, tensor binding, and reference dequantization of the first row of every
//! bound float tensor. Any panic, hang or huge allocation is a bug: bad input must be a clean error.
#![no_main]

use std::sync::Arc;

use ds4_chat::gguf::GgufFile;
use ds4_chat::gguf::dequant::{dequantize_row, is_dequantizable};
use ds4_chat::model::{HParams, Model};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let borrowed = GgufFile::parse_only(data);
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        assert!(borrowed.is_err(), "parse_only and from_bytes disagree");
        return;
    };
    assert!(borrowed.is_ok(), "parse_only and from_bytes disagree");
    let file = Arc::new(file);
    if HParams::from_gguf(&file).is_err() {
        return;
    }
    if let Ok(model) = Model::bind(file.clone()) {
        for (_, t) in model.grouped_tensors() {
            if is_dequantizable(t.ty) && t.dims[0] <= 4096 {
                let row = dequantize_row(t.ty, model.data(t), t.dims[0] as usize, 0);
                assert!(row.is_ok(), "first row of bound tensor '{}' does not decode", t.name);
            }
        }
    }
});
