//! Decode-time attribution without a profiler timeline: `DS4_HIP_REPEAT=kernel[,kernel...]` issues
//! each named (fast or exact) kernel twice wherever launches may overlap (token-wise batches: decode
//! steps). The second run recomputes or compounds its outputs, so **results are wrong**; what it
//! measures is the kernel's cost where it runs (on the main stream's chain, or hidden on a side
//! lane), as `ds4-chat bench`'s decode t/s with and without it (kernels/README.md "Attribution").
//! Owns only that choice; warns once on stderr when set.

use std::sync::OnceLock;

/// Environment variable naming the kernels to repeat.
pub const REPEAT_ENV: &str = "DS4_HIP_REPEAT";

/// The kernel names of `DS4_HIP_REPEAT` (empty when unset).
fn repeated() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let names = kernel_names(
            &crate::backend::knobs::value(REPEAT_ENV)
                .ok()
                .flatten()
                .unwrap_or_default(),
        );
        if !names.is_empty() {
            eprintln!(
                "{REPEAT_ENV}={}: these kernels run twice per decode step; outputs are wrong (timing attribution only)",
                names.join(",")
            );
        }
        names
    })
}

/// The comma-separated kernel names of a `DS4_HIP_REPEAT` value (blanks and empty items dropped).
fn kernel_names(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Whether `kernel` runs a second time (in a batch whose launches may overlap).
pub(super) fn repeats(kernel: &str, overlapping: bool) -> bool {
    overlapping && repeated().iter().any(|k| k == kernel)
}

#[cfg(test)]
mod tests {
    use super::kernel_names;

    #[test]
    fn names_are_split_and_trimmed() {
        assert_eq!(kernel_names(""), Vec::<String>::new());
        assert_eq!(
            kernel_names(" ds4_argmax_fast, ,ds4_hc_post_pre_fast "),
            ["ds4_argmax_fast", "ds4_hc_post_pre_fast"]
        );
    }
}
