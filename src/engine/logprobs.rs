//! Log-probabilities of next-token logits and the JSON forms that carry them
//! (docs/sampler.md#log-probability-dumps).
//!
//! Owns: top-k by logit, logsumexp, per-token logprobs, C `%.9g` number formatting, ds4's JSON string
//! escaping, and the `--dump-logprobs` / `score` JSON writers. Must not evaluate the model or know
//! about tokenizers: token bytes come in from the caller.

use std::fmt::Write as _;

/// Most entries a dump may list per step (ds4 caps `--logprobs-top-k` the same way).
pub const MAX_DUMP_TOP_K: usize = 128;

/// One token's logit and log-probability under the full softmax.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenScore {
    pub id: u32,
    pub logit: f32,
    pub logprob: f32,
}

/// log Σ exp(logit) over the finite logits, accumulated in f64 around the maximum; `None` when no
/// logit is finite.
pub fn logsumexp(logits: &[f32]) -> Option<f64> {
    let max = logits
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return None;
    }
    let max = max as f64;
    let sum: f64 = logits
        .iter()
        .filter(|v| v.is_finite())
        .map(|&v| (v as f64 - max).exp())
        .sum();
    Some(max + sum.ln())
}

/// The `k` highest finite logits, descending, ties to the lower id (the order ds4 reports).
pub fn top_k_by_logit(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_finite() || (top.len() == k && v <= top[k - 1].1) {
            continue;
        }
        // Insert after every entry with a logit >= v, so equal logits keep id order.
        let at = top.partition_point(|&(_, t)| t >= v);
        top.insert(at, (i as u32, v));
        top.truncate(k);
    }
    top
}

/// Top-k entries with their logprob = logit − logsumexp (the lse in f64, the result rounded to f32).
/// Empty when no logit is finite.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<TokenScore> {
    let Some(lse) = logsumexp(logits) else {
        return Vec::new();
    };
    top_k_by_logit(logits, k)
        .into_iter()
        .map(|(id, logit)| TokenScore {
            id,
            logit,
            logprob: (logit as f64 - lse) as f32,
        })
        .collect()
}

/// Format like C's `printf("%.9g", x)`: 9 significant digits, exponent form below 1e-4 or from 1e9,
/// trailing zeros removed. Non-finite values print as C does (`inf`, `-inf`, `nan`).
pub fn format_g9(x: f64) -> String {
    const P: i32 = 9;
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    // The exponent after rounding to P significant digits decides the style.
    let sci = format!("{:.*e}", (P - 1) as usize, x);
    let (mantissa, exp) = sci.split_once('e').expect("exponent form has an 'e'");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    if !(-4..P).contains(&exp) {
        let m = strip_fraction_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (P - 1 - exp) as usize;
        strip_fraction_zeros(&format!("{x:.decimals$}")).to_string()
    }
}

fn strip_fraction_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// Append `bytes` as a JSON string the way ds4 writes token text: `"`, `\`, `\n`, `\r`, `\t`
/// escaped, other control bytes as `\u00XX`; if the bytes are not valid UTF-8, every byte ≥ 0x80
/// is written as `\u00XX` too (the separate `bytes` array stays authoritative).
pub fn push_json_string(out: &mut String, bytes: &[u8]) {
    let valid = std::str::from_utf8(bytes).ok();
    out.push('"');
    match valid {
        Some(text) => {
            for ch in text.chars() {
                push_json_char(out, ch);
            }
        }
        None => {
            for &b in bytes {
                if b >= 0x80 {
                    let _ = write!(out, "\\u{b:04x}");
                } else {
                    push_json_char(out, b as char);
                }
            }
        }
    }
    out.push('"');
}

fn push_json_char(out: &mut String, ch: char) {
    match ch {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x20 => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
        c => out.push(c),
    }
}

/// `{"id":N,"text":"…","bytes":[…]}` for one token.
pub fn push_token_json(out: &mut String, id: u32, bytes: &[u8]) {
    let _ = write!(out, "{{\"id\":{id},\"text\":");
    push_json_string(out, bytes);
    out.push_str(",\"bytes\":[");
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{b}");
    }
    out.push_str("]}");
}

/// Builds the `--dump-logprobs` document in ds4's exact layout (docs/sampler.md#log-probability-dumps):
/// one header, one line per greedy step, a closing bracket. `source` is "ds4-chat" (nothing reads it;
/// the rest is ds4's shape).
#[derive(Debug)]
pub struct LogprobDump {
    text: String,
    steps: usize,
}

impl LogprobDump {
    pub fn new(prompt_tokens: usize, ctx: usize, top_k: usize) -> Self {
        let text = format!(
            "{{\n  \"source\":\"ds4-chat\",\n  \"prompt_tokens\":{prompt_tokens},\n  \"ctx\":{ctx},\n  \"top_k\":{top_k},\n  \"steps\":[\n"
        );
        LogprobDump { text, steps: 0 }
    }

    /// One step: the selected token and the top entries (ids with their bytes from `token_bytes`).
    pub fn push_step(&mut self, selected: u32, top: &[TokenScore], token_bytes: &dyn Fn(u32) -> Vec<u8>) {
        if self.steps > 0 {
            self.text.push_str(",\n");
        }
        let _ = write!(self.text, "    {{\"step\":{},\"selected\":", self.steps);
        push_token_json(&mut self.text, selected, &token_bytes(selected));
        self.text.push_str(",\"top_logprobs\":[");
        for (i, s) in top.iter().enumerate() {
            if i > 0 {
                self.text.push(',');
            }
            self.text.push_str("{\"token\":");
            push_token_json(&mut self.text, s.id, &token_bytes(s.id));
            let _ = write!(
                self.text,
                ",\"logit\":{},\"logprob\":{}}}",
                format_g9(s.logit as f64),
                format_g9(s.logprob as f64)
            );
        }
        self.text.push_str("]}");
        self.steps += 1;
    }

    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The finished document.
    pub fn finish(mut self) -> String {
        self.text.push_str("\n  ]\n}\n");
        self.text
    }
}

/// One teacher-forced position of `ds4-chat score`: the next-token distribution after `token`.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoredPosition {
    pub pos: usize,
    pub token: u32,
    pub top: Vec<TokenScore>,
}

/// `{"n_vocab":V,"positions":[{"pos":i,"token":t,"top":[[id,logit,logprob],…]},…]}` on one line.
pub fn score_json(n_vocab: usize, positions: &[ScoredPosition]) -> String {
    let mut out = format!("{{\"n_vocab\":{n_vocab},\"positions\":[");
    for (i, p) in positions.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{{\"pos\":{},\"token\":{},\"top\":[", p.pos, p.token);
        for (j, s) in p.top.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "[{},{},{}]",
                s.id,
                format_g9(s.logit as f64),
                format_g9(s.logprob as f64)
            );
        }
        out.push_str("]}");
    }
    out.push_str("]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected strings are what glibc's printf("%.9g") prints for these values (checked with
    /// Python's `'%.9g' % x`, which follows C).
    fn f32_of(s: &str) -> f64 {
        s.parse::<f32>().unwrap() as f64
    }

    #[test]
    fn format_g9_matches_c_printf() {
        let cases: [(f64, &str); 12] = [
            (f32_of("9.16088104"), "9.16088104"),
            (f32_of("-4.64313507"), "-4.64313507"),
            (0.5, "0.5"),
            (1.0, "1"),
            (-13.0, "-13"),
            (123456789.0, "123456789"),
            (1234567890.0, "1.23456789e+09"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (1e100, "1e+100"),
            (999999999.5, "1e+09"),
            (0.0, "0"),
        ];
        for (x, want) in cases {
            assert_eq!(format_g9(x), want, "format_g9({x:e})");
        }
        assert_eq!(format_g9(f64::NEG_INFINITY), "-inf");
    }

    /// Softmax of [ln 1, ln 2, ln 3, ln 4] is [0.1, 0.2, 0.3, 0.4]; lse = ln 10.
    #[test]
    fn logprobs_against_a_hand_softmax() {
        let logits: Vec<f32> = [1.0f64, 2.0, 3.0, 4.0].iter().map(|w| w.ln() as f32).collect();
        let lse = logsumexp(&logits).unwrap();
        assert!((lse - 10f64.ln()).abs() < 1e-6, "lse {lse}");
        let top = top_logprobs(&logits, 2);
        assert_eq!(top.iter().map(|s| s.id).collect::<Vec<_>>(), [3, 2]);
        // f32 rounding of ln(w) bounds the error near 1e-7.
        assert!((top[0].logprob as f64 - 0.4f64.ln()).abs() < 1e-6);
        assert!((top[1].logprob as f64 - 0.3f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn non_finite_logits_are_left_out() {
        let logits = [f32::NAN, 0.0, f32::NEG_INFINITY, 0.0, f32::INFINITY];
        // Two finite zeros: lse = ln 2.
        assert!((logsumexp(&logits).unwrap() - 2f64.ln()).abs() < 1e-12);
        let top = top_logprobs(&logits, 5);
        assert_eq!(top.iter().map(|s| s.id).collect::<Vec<_>>(), [1, 3]);
        assert!(logsumexp(&[f32::NAN, f32::NEG_INFINITY]).is_none());
        assert!(top_logprobs(&[f32::NAN], 3).is_empty());
    }

    #[test]
    fn top_k_ties_go_to_the_lower_id() {
        let logits = [2.0, 5.0, 3.0, 5.0, 3.0, 1.0];
        assert_eq!(top_k_by_logit(&logits, 4), [(1, 5.0), (3, 5.0), (2, 3.0), (4, 3.0)]);
        assert_eq!(top_k_by_logit(&logits, 0), []);
        assert_eq!(top_k_by_logit(&logits, 10).len(), 6);
    }

    #[test]
    fn json_strings_escape_like_ds4() {
        let mut s = String::new();
        push_json_string(&mut s, b"a\"b\\c\nd\te\x01\x7f");
        assert_eq!(s, "\"a\\\"b\\\\c\\nd\\te\\u0001\x7f\"");
        // Valid UTF-8 passes through; a byte fragment of "儿" (e5 84 bf) is escaped byte by byte.
        let mut s = String::new();
        push_json_string(&mut s, "儿".as_bytes());
        assert_eq!(s, "\"儿\"");
        let mut s = String::new();
        push_json_string(&mut s, &[b'x', 0xe5, 0x84]);
        assert_eq!(s, "\"x\\u00e5\\u0084\"");
    }

    #[test]
    fn dump_has_ds4_layout_and_parses() {
        let mut d = LogprobDump::new(3, 4096, 2);
        let bytes = |id: u32| {
            if id == 7 {
                vec![0xe5, 0x84]
            } else {
                format!("t{id}").into_bytes()
            }
        };
        let top = [
            TokenScore {
                id: 7,
                logit: 2.5,
                logprob: -0.25,
            },
            TokenScore {
                id: 1,
                logit: 1.0,
                logprob: -1.75,
            },
        ];
        d.push_step(7, &top, &bytes);
        d.push_step(1, &top[1..], &bytes);
        let text = d.finish();
        assert!(text.starts_with("{\n  \"source\":\"ds4-chat\",\n  \"prompt_tokens\":3,\n  \"ctx\":4096,\n"));
        assert!(text.contains(
            "    {\"step\":0,\"selected\":{\"id\":7,\"text\":\"\\u00e5\\u0084\",\"bytes\":[229,132]},\"top_logprobs\":[{\"token\":{\"id\":7,"
        ));
        assert!(text.ends_with("]}\n  ]\n}\n"));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["steps"][1]["top_logprobs"][0]["logprob"], -1.75);
        assert_eq!(v["steps"][0]["top_logprobs"][1]["token"]["text"], "t1");
    }

    #[test]
    fn score_json_shape() {
        let p = ScoredPosition {
            pos: 0,
            token: 5,
            top: vec![TokenScore {
                id: 2,
                logit: 1.5,
                logprob: -0.5,
            }],
        };
        assert_eq!(
            score_json(10, &[p]),
            "{\"n_vocab\":10,\"positions\":[{\"pos\":0,\"token\":5,\"top\":[[2,1.5,-0.5]]}]}"
        );
    }
}
