//! Fuzz target: arbitrary bytes through the whole loading path (fuzz/load_untrusted.rs). Any panic,
//! hang or huge allocation is a bug: bad input must be a clean error.
#![no_main]

include!("../load_untrusted.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    load_untrusted(data);
});
