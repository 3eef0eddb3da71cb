//! The ranges and parsers of every user setting, shared by the chat app (config file, flags, slash
//! commands) and the `run`, `score` and `bench` subcommands.
//!
//! Owns the limits (one constant per rule) and the one-line messages for values out of range. Each
//! check returns the reason without naming where the value came from; the caller prefixes the flag
//! (`--temp`), config key (`key \`temp\``) or slash command (`/temp`). Must not read config files
//! or touch the terminal; the one I/O here is reading /proc/meminfo to check a context against RAM.

use crate::model::HParams;
use crate::model::chat::ThinkMode;

use super::events::{BackendChoice, WeightsMode};
pub use super::logprobs::MAX_DUMP_TOP_K;
pub use super::sampler::MAX_TOP_K;
use crate::backend::memguard::{
    HostMemory, MemoryNeed, MemoryVerdict, WeightResidence, check_memory, cpu_kv_bytes, cpu_scratch_estimate,
    read_host_memory,
};

/// Smallest context the chat app accepts (a chat turn with a system prompt needs a few hundred).
pub const MIN_APP_CTX: u32 = 256;
/// Smallest context of the headless subcommands: one prompt token and one generated token.
pub const MIN_CLI_CTX: u32 = 2;
/// Largest context (DeepSeek V4 Flash is trained to 1M tokens).
pub const MAX_CTX: u32 = 1 << 20;
/// Most CPU threads (0 means all cores).
pub const MAX_THREADS: usize = 4096;
/// Largest temperature: beyond it every distribution is flat for practical purposes.
pub const MAX_TEMP: f64 = 10.0;

/// Prefixes a check's reason with where the value came from: `--temp: -1 is out of range …`.
pub fn named<T>(what: &str, r: Result<T, String>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// `v` as a `T` in `lo ..= hi`, else the one-line reason.
fn int_in<T: TryFrom<i64> + PartialOrd + std::fmt::Display>(v: i64, lo: T, hi: T) -> Result<T, String> {
    T::try_from(v)
        .ok()
        .filter(|x| (&lo..=&hi).contains(&x))
        .ok_or_else(|| format!("{v} is out of range ({lo} ..= {hi})"))
}

/// The one rule for a context size in tokens, wherever it is set (`--ctx`, key `ctx`, `/ctx`, bench's
/// `--ctx-max`) and again where a session opens: `min ..= MAX_CTX`, and no more than the context the
/// model states (`model_ctx`, once the model is known; 0 when the file does not state one).
pub fn check_ctx(v: i64, min: u32, model_ctx: Option<u64>) -> Result<u32, String> {
    match model_ctx.filter(|&m| m > 0 && m < u64::from(MAX_CTX)) {
        None => int_in(v, min, MAX_CTX),
        Some(m) => int_in(v, min, m as u32)
            .map_err(|_| format!("{v} is out of range ({min} ..= {m}, the model's context length)")),
    }
}

/// A session of `ctx` tokens on `hp`'s model, checked by the engine opener (`--ctx` for the
/// subcommands, the loaded setting for the app).
pub fn check_session_ctx(ctx: usize, hp: &HParams) -> Result<usize, String> {
    let v = i64::try_from(ctx).unwrap_or(i64::MAX);
    named("--ctx", check_ctx(v, MIN_CLI_CTX, Some(hp.context_length))).map(|c| c as usize)
}

/// Temperature: 0 (greedy) ..= 10, finite.
pub fn check_temp(v: f64) -> Result<f32, String> {
    if v.is_finite() && (0.0..=MAX_TEMP).contains(&v) {
        Ok(v as f32)
    } else {
        Err(format!("{v} is out of range (0 ..= {MAX_TEMP})"))
    }
}

/// Nucleus mass: (0, 1].
pub fn check_top_p(v: f64) -> Result<f32, String> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(v as f32)
    } else {
        Err(format!("{v} is out of range (0 < top_p <= 1)"))
    }
}

/// Min-p cut relative to the top token: [0, 1].
pub fn check_min_p(v: f64) -> Result<f32, String> {
    check_probability(v)
}

/// A probability, 0 ..= 1 (min-p, DSpark's confidence threshold).
pub fn check_probability(v: f64) -> Result<f32, String> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(v as f32)
    } else {
        Err(format!("{v} is out of range (0 ..= 1)"))
    }
}

/// Top-k candidates: 0 (off) ..= `MAX_TOP_K`, the most the sampler keeps.
pub fn check_top_k(v: i64) -> Result<u32, String> {
    int_in(v, 0, MAX_TOP_K)
}

/// Sampler seed: any non-negative integer.
pub fn check_seed(v: i64) -> Result<u64, String> {
    u64::try_from(v).map_err(|_| format!("{v} is negative"))
}

/// Most tokens per answer: at least 1.
pub fn check_max_tokens(v: i64) -> Result<u32, String> {
    int_in(v, 1, u32::MAX)
}

/// CPU threads: 0 (all cores) ..= `MAX_THREADS`.
pub fn check_threads(v: i64) -> Result<usize, String> {
    int_in(v, 0, MAX_THREADS)
}

/// Entries per step of a logprob dump: 1 ..= `MAX_DUMP_TOP_K`.
pub fn check_logprobs_top_k(v: i64) -> Result<usize, String> {
    int_in(v, 1, MAX_DUMP_TOP_K)
}

/// Backend name, the same for flags and the config file: auto, hip (alias gpu) or cpu.
pub fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    match s {
        "auto" => Ok(BackendChoice::Auto),
        "hip" | "gpu" => Ok(BackendChoice::Hip),
        "cpu" => Ok(BackendChoice::Cpu),
        _ => Err(format!("\"{s}\" is not one of auto, hip, cpu")),
    }
}

/// GPU weight placement: auto, copy or map.
pub fn parse_weights(s: &str) -> Result<WeightsMode, String> {
    match s {
        "auto" => Ok(WeightsMode::Auto),
        "copy" => Ok(WeightsMode::Copy),
        "map" => Ok(WeightsMode::Map),
        _ => Err(format!("\"{s}\" is not one of auto, copy, map")),
    }
}

/// Think mode name: off (none), high (on) or max.
pub fn parse_think(s: &str) -> Result<ThinkMode, String> {
    match s {
        "off" | "none" => Ok(ThinkMode::Off),
        "high" | "on" => Ok(ThinkMode::High),
        "max" => Ok(ThinkMode::Max),
        _ => Err(format!("\"{s}\" is not one of off, high, max")),
    }
}

pub fn think_name(t: ThinkMode) -> &'static str {
    match t {
        ThinkMode::Off => "off",
        ThinkMode::High => "high",
        ThinkMode::Max => "max",
    }
}

pub fn backend_name(b: BackendChoice) -> &'static str {
    match b {
        BackendChoice::Auto => "auto",
        BackendChoice::Hip => "hip",
        BackendChoice::Cpu => "cpu",
    }
}

fn parse_number(s: &str) -> Result<f64, String> {
    s.trim().parse::<f64>().map_err(|_| format!("\"{s}\" is not a number"))
}

fn parse_integer(s: &str) -> Result<i64, String> {
    s.trim()
        .parse::<i64>()
        .map_err(|_| format!("\"{s}\" is not an integer"))
}

/// Text forms for slash commands (`/temp 0.7`): parse, then the same range check as above.
pub fn parse_temp(s: &str) -> Result<f32, String> {
    check_temp(parse_number(s)?)
}

pub fn parse_top_p(s: &str) -> Result<f32, String> {
    check_top_p(parse_number(s)?)
}

pub fn parse_min_p(s: &str) -> Result<f32, String> {
    check_min_p(parse_number(s)?)
}

pub fn parse_seed(s: &str) -> Result<u64, String> {
    check_seed(parse_integer(s)?)
}

/// `/ctx N`, with the loaded model's context length when one is loaded.
pub fn parse_app_ctx(s: &str, model_ctx: Option<u64>) -> Result<u32, String> {
    check_ctx(parse_integer(s)?, MIN_APP_CTX, model_ctx)
}

/// The CPU backend's KV cache and scratch for `ctx` tokens must fit the RAM available now (the
/// memory guard's rule); else one line naming `what` (`--ctx 99999`) with the figures and a context
/// that fits. Checked before anything is allocated, so a huge context is refused instead of
/// aborting the process when the allocation fails. Unknown host memory (no /proc/meminfo) passes.
pub fn check_ctx_fits_ram(what: &str, hp: &HParams, ctx: u64, prefill_chunk: u64) -> Result<(), String> {
    match read_host_memory() {
        Ok(host) => ctx_fits(what, hp, ctx, prefill_chunk, &host),
        Err(_) => Ok(()),
    }
}

fn ctx_fits(what: &str, hp: &HParams, ctx: u64, prefill_chunk: u64, host: &HostMemory) -> Result<(), String> {
    // Only the cache is checked here: mapped weights are page cache, which the kernel reclaims.
    let need = MemoryNeed {
        weight_bytes: 0,
        residence: WeightResidence::MappedFile,
        kv_bytes: cpu_kv_bytes(hp, ctx),
        scratch_bytes: cpu_scratch_estimate(hp, prefill_chunk),
        kv_on_device: false,
        checkpoint_bytes: 0,
    };
    match check_memory(&need, host, None, hp, ctx) {
        MemoryVerdict::Refuse(why) => Err(format!("{what}: {why}")),
        MemoryVerdict::Fits | MemoryVerdict::Warn(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_accept_their_bounds_and_refuse_beyond() {
        assert_eq!(check_ctx(256, MIN_APP_CTX, None), Ok(256));
        assert_eq!(check_ctx(1 << 20, MIN_APP_CTX, None), Ok(1 << 20));
        assert_eq!(
            check_ctx(99_999_999_999, MIN_CLI_CTX, None),
            Err("99999999999 is out of range (2 ..= 1048576)".into())
        );
        assert!(check_ctx(255, MIN_APP_CTX, None).is_err());
        assert_eq!(check_temp(0.0), Ok(0.0));
        assert!(check_temp(-1.0).is_err() && check_temp(f64::NAN).is_err() && check_temp(10.5).is_err());
        assert_eq!(check_top_p(1.0), Ok(1.0));
        assert!(check_top_p(0.0).is_err() && check_top_p(5.0).is_err());
        assert_eq!(check_min_p(0.0), Ok(0.0));
        assert!(check_min_p(1.01).is_err());
        assert_eq!(check_top_k(1024), Ok(1024));
        assert_eq!(check_top_k(1025), Err("1025 is out of range (0 ..= 1024)".into()));
        assert!(check_top_k(-1).is_err());
        assert_eq!(check_seed(-3), Err("-3 is negative".into()));
        assert!(check_max_tokens(0).is_err());
        assert_eq!(check_threads(4096), Ok(4096));
        assert!(check_threads(4097).is_err());
    }

    #[test]
    fn context_rule_takes_the_models_length_once_known() {
        assert_eq!(check_ctx(4096, MIN_APP_CTX, Some(4096)), Ok(4096));
        assert_eq!(
            check_ctx(4097, MIN_APP_CTX, Some(4096)),
            Err("4097 is out of range (256 ..= 4096, the model's context length)".into())
        );
        // A model longer than the engine's limit, or one that states none, leaves MAX_CTX.
        assert_eq!(check_ctx(1 << 20, MIN_CLI_CTX, Some(1 << 30)), Ok(1 << 20));
        assert_eq!(check_ctx(1 << 20, MIN_CLI_CTX, Some(0)), Ok(1 << 20));
        assert!(check_ctx((1 << 20) + 1, MIN_CLI_CTX, Some(0)).is_err());
        let mut hp = HParams::flash();
        hp.context_length = 1000;
        assert_eq!(check_session_ctx(1000, &hp), Ok(1000));
        assert_eq!(
            check_session_ctx(1001, &hp),
            Err("--ctx: 1001 is out of range (2 ..= 1000, the model's context length)".into())
        );
        assert_eq!(
            check_session_ctx(1, &hp),
            Err("--ctx: 1 is out of range (2 ..= 1000, the model's context length)".into())
        );
        assert_eq!(
            parse_app_ctx("2048", Some(1024)),
            Err("2048 is out of range (256 ..= 1024, the model's context length)".into())
        );
    }

    #[test]
    fn names_are_one_vocabulary() {
        for b in [BackendChoice::Auto, BackendChoice::Hip, BackendChoice::Cpu] {
            assert_eq!(parse_backend(backend_name(b)), Ok(b));
        }
        assert_eq!(parse_backend("gpu"), Ok(BackendChoice::Hip));
        for (name, w) in [
            ("auto", WeightsMode::Auto),
            ("copy", WeightsMode::Copy),
            ("map", WeightsMode::Map),
        ] {
            assert_eq!(parse_weights(name), Ok(w));
        }
        for t in [ThinkMode::Off, ThinkMode::High, ThinkMode::Max] {
            assert_eq!(parse_think(think_name(t)), Ok(t));
        }
        assert_eq!(
            parse_backend("cuda"),
            Err("\"cuda\" is not one of auto, hip, cpu".into())
        );
    }

    #[test]
    fn slash_forms_parse_then_check() {
        assert_eq!(parse_temp(" 0.5"), Ok(0.5));
        assert_eq!(parse_temp("warm"), Err("\"warm\" is not a number".into()));
        assert!(parse_top_p("2").is_err());
        assert_eq!(parse_seed("7"), Ok(7));
        assert_eq!(parse_app_ctx("4096", None), Ok(4096));
        assert!(parse_app_ctx("4k", None).is_err());
    }

    #[test]
    fn context_that_does_not_fit_ram_names_the_flag_and_a_fitting_size() {
        let hp = HParams::flash();
        let gib = crate::units::GIB;
        let host = HostMemory {
            total: 24 * gib,
            available: 20 * gib,
        };
        assert_eq!(ctx_fits("--ctx 32768", &hp, 32768, 128, &host), Ok(()));
        let small = HostMemory {
            total: 8 * gib,
            available: 4 * gib,
        };
        let e = ctx_fits("--ctx 1048576", &hp, 1 << 20, 128, &small).unwrap_err();
        assert!(
            e.starts_with("--ctx 1048576: not enough memory for the context: KV cache 13."),
            "{e}"
        );
        assert!(
            e.contains("3.0 GiB available") && e.contains("use --ctx 131072 or smaller"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }
}
