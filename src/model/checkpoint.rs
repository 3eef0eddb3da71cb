//! Which DeepSeek V4 Flash checkpoint a file holds, and which of ds4's published files it is.
//!
//! ds4 publishes two generations of the same model: the preview weights and the "0731" weights.
//! The files have the same tensors and metadata except `quantize.imatrix.file`, which names the
//! calibration data of the 0731 weights (it contains "0731"); a file without that key is taken as
//! the preview. The generation matters beyond the label: the 0731 chat template puts a different
//! reasoning-effort text after BOS (`chat::ThinkMode::effort_prefix`).
//!
//! Owns the generation rule and the table of known file names; reads metadata only.

use crate::gguf::GgufFile;

/// The metadata key that tells the generations apart.
pub const IMATRIX_FILE_KEY: &str = "quantize.imatrix.file";

/// The checkpoint generation, which selects the chat template's reasoning-effort texts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Generation {
    /// The first published weights: high renders no effort text, max the "Absolute maximum" one.
    #[default]
    Preview,
    /// DeepSeek-V4-Flash-0731: high renders "Absolute maximum", max "Beyond maximum".
    V0731,
}

impl Generation {
    /// From the `quantize.imatrix.file` value, when present.
    pub fn from_imatrix_file(imatrix: Option<&str>) -> Generation {
        match imatrix {
            Some(f) if f.contains("0731") => Generation::V0731,
            _ => Generation::Preview,
        }
    }

    pub fn of(file: &GgufFile) -> Generation {
        Generation::from_imatrix_file(file.get(IMATRIX_FILE_KEY).and_then(|v| v.as_str()))
    }

    pub fn label(self) -> &'static str {
        match self {
            Generation::Preview => "preview",
            Generation::V0731 => "0731",
        }
    }
}

const Q2_STEM: &str = "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2";
const Q4_STEM: &str = "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2";

/// The label of the known file a name (without directories) is, if any: the q2 and q4 files,
/// each plain or imatrix-calibrated, each preview or 0731 (`-0731` suffix).
pub fn known_file(file_name: &str) -> Option<&'static str> {
    let rest = file_name.strip_suffix(".gguf")?;
    let (quant, rest) = if let Some(r) = rest.strip_prefix(Q2_STEM) {
        ("q2", r)
    } else if let Some(r) = rest.strip_prefix(Q4_STEM) {
        ("q4", r)
    } else {
        return None;
    };
    Some(match (quant, rest) {
        ("q2", "") => "ds4 q2 (preview)",
        ("q2", "-imatrix") => "ds4 q2 imatrix (preview)",
        ("q2", "-0731") => "ds4 q2 (0731)",
        ("q2", "-imatrix-0731") => "ds4 q2 imatrix (0731)",
        ("q4", "") => "ds4 q4 (preview)",
        ("q4", "-imatrix") => "ds4 q4 imatrix (preview)",
        ("q4", "-0731") => "ds4 q4 (0731)",
        ("q4", "-imatrix-0731") => "ds4 q4 imatrix (0731)",
        _ => return None,
    })
}

/// What the file is, for `inspect`, the panel and `doctor`: "ds4 q2 imatrix (0731)" for a known
/// name, else "DeepSeek V4 Flash (0731 weights)" from the metadata (`name` is `general.name`).
pub fn describe(file_name: &str, general_name: &str, generation: Generation) -> String {
    match known_file(file_name) {
        Some(label) => label.to_string(),
        None if general_name.is_empty() => format!("{} weights", generation.label()),
        None => format!("{general_name} ({} weights)", generation.label()),
    }
}

/// [`describe`] for an open file.
pub fn describe_file(file: &GgufFile) -> String {
    let name = file
        .path
        .as_deref()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let general = file.get("general.name").and_then(|v| v.as_str()).unwrap_or("");
    describe(name, general, Generation::of(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_imatrix_file_tells_the_generations_apart() {
        let preview = "gguf/DeepSeek-V4-Flash-chat-v2-routed-moe-ds4-1p5m-fixed.dat";
        let v0731 = "gguf/DeepSeek-V4-Flash-0731-chat-v2-routed-moe-ds4.dat";
        assert_eq!(Generation::from_imatrix_file(Some(preview)), Generation::Preview);
        assert_eq!(Generation::from_imatrix_file(Some(v0731)), Generation::V0731);
        assert_eq!(Generation::from_imatrix_file(None), Generation::Preview);
    }

    #[test]
    fn known_names_are_recognised_and_others_are_not() {
        assert_eq!(
            known_file("DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix-0731.gguf"),
            Some("ds4 q2 imatrix (0731)")
        );
        assert_eq!(
            known_file("DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf"),
            Some("ds4 q2 imatrix (preview)")
        );
        assert_eq!(
            known_file(
                "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2.gguf"
            ),
            Some("ds4 q4 (preview)")
        );
        assert_eq!(
            known_file("DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-other.gguf"),
            None
        );
        assert_eq!(known_file("flash.gguf"), None);
        assert_eq!(
            describe("flash.gguf", "DeepSeek V4 Flash", Generation::V0731),
            "DeepSeek V4 Flash (0731 weights)"
        );
        assert_eq!(describe("x.gguf", "", Generation::Preview), "preview weights");
    }
}
