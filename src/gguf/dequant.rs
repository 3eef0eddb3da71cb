//! Reference dequantization to f32 (spec §2.1). Filled in by the foundation work.
