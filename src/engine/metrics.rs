//! Live performance figures of a turn: decode tokens/s (sliding window and turn average), prefill
//! tokens/s, prefill latency (submit → first sampled token), time to first visible answer token,
//! context fill and memory.
//!
//! Owns the arithmetic only, on a timeline of offsets since the turn was submitted, so every figure
//! is a pure function of that timeline (tests feed synthetic ones). The worker records the timeline
//! and sends `LiveStats` snapshots; the TUI's own figures (per-turn averages, the sparkline, the
//! warm-up rate) call the functions here too, so no rate is computed anywhere else. Draws nothing.

use std::time::Duration;

use crate::backend::MemoryReport;

use super::events::{DeviceMemory, LiveStats};

/// Decode steps averaged by the "now" rate: long enough to smooth scheduler jitter, short enough to
/// show a slowdown (e.g. weights being paged in) within a couple of seconds.
pub const DECODE_RATE_WINDOW: usize = 16;

/// Tokens per second from a token count and the time they took; `None` when no time passed.
pub fn tokens_per_second(tokens: u64, elapsed: Duration) -> Option<f64> {
    let s = elapsed.as_secs_f64();
    (tokens > 0 && s > 0.0).then(|| tokens as f64 / s)
}

/// Decode rate over the last `window` steps. `start` is when the first sampled token was ready
/// (end of prefill); `token_ends[k]` is when decode step k finished. Both are offsets since submit.
/// With fewer than `window` steps the window starts at `start`.
pub fn decode_rate_window(start: Duration, token_ends: &[Duration], window: usize) -> Option<f64> {
    let n = token_ends.len();
    if n == 0 || window == 0 {
        return None;
    }
    let w = window.min(n);
    let from = if w == n { start } else { token_ends[n - w - 1] };
    tokens_per_second(w as u64, token_ends[n - 1].saturating_sub(from))
}

/// Decode rate over the whole turn: every decode step divided by the time from `start` to the last.
pub fn decode_rate_average(start: Duration, token_ends: &[Duration]) -> Option<f64> {
    decode_rate_window(start, token_ends, token_ends.len())
}

/// Timeline of one turn; every instant is an offset since the turn was submitted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnTimeline {
    /// Tokens the prefill actually evaluated (prompt minus the reused live prefix).
    pub prefill_tokens: u32,
    /// When the prefill started and ended (the end is when the first token can be sampled).
    pub prefill_start: Option<Duration>,
    pub prefill_end: Option<Duration>,
    /// When the first token was sampled (the prefill latency the user perceives).
    pub first_sampled: Option<Duration>,
    /// When the first answer (non-reasoning) text became visible.
    pub first_answer: Option<Duration>,
    /// When each decode step (evaluating one sampled token) finished.
    pub token_ends: Vec<Duration>,
}

impl TurnTimeline {
    pub fn prefill_started(&mut self, at: Duration) {
        self.prefill_start = Some(at);
    }
    pub fn prefill_finished(&mut self, at: Duration, evaluated_tokens: u32) {
        self.prefill_end = Some(at);
        self.prefill_tokens = evaluated_tokens;
    }
    pub fn token_sampled(&mut self, at: Duration) {
        self.first_sampled.get_or_insert(at);
    }
    pub fn answer_visible(&mut self, at: Duration) {
        self.first_answer.get_or_insert(at);
    }
    pub fn decode_step_finished(&mut self, at: Duration) {
        self.token_ends.push(at);
    }

    /// Prefill throughput over the evaluated (not reused) tokens.
    pub fn prefill_rate(&self) -> Option<f64> {
        let (s, e) = (self.prefill_start?, self.prefill_end?);
        tokens_per_second(self.prefill_tokens as u64, e.saturating_sub(s))
    }

    /// Where decode timing starts: the first sampled token, else the prefill end.
    fn decode_start(&self) -> Option<Duration> {
        self.first_sampled.or(self.prefill_end)
    }

    pub fn decode_rate_now(&self) -> Option<f64> {
        decode_rate_window(self.decode_start()?, &self.token_ends, DECODE_RATE_WINDOW)
    }

    pub fn decode_rate_average(&self) -> Option<f64> {
        decode_rate_average(self.decode_start()?, &self.token_ends)
    }

    /// A snapshot for the UI. `context_used`/`context_size` are tokens; `mem` is the backend report.
    pub fn stats(&self, context_used: u32, context_size: u32, mem: &MemoryReport) -> LiveStats {
        LiveStats {
            decode_tps_now: self.decode_rate_now(),
            decode_tps_avg: self.decode_rate_average(),
            prefill_tps: self.prefill_rate(),
            prefill_latency: self.first_sampled,
            first_answer_latency: self.first_answer,
            generated: self.token_ends.len() as u32,
            context_used,
            context_size,
            kv_bytes: mem.kv_bytes,
            scratch_bytes: mem.scratch_bytes,
            device_weight_bytes: mem.device_weight_bytes,
            device_memory: device_memory(mem),
        }
    }
}

/// Device memory figures of a backend report, when it knows both.
pub fn device_memory(mem: &MemoryReport) -> Option<DeviceMemory> {
    Some(DeviceMemory {
        used_bytes: mem.device_used?,
        total_bytes: mem.device_total?,
    })
}

/// Time left for `total` units at the average pace of the `done` units so far (prefill tokens,
/// warm-up bytes); `None` before any progress.
pub fn time_left(done: u64, total: u64, elapsed: Duration) -> Option<Duration> {
    let s = elapsed.as_secs_f64();
    (done > 0 && s > 0.0).then(|| Duration::from_secs_f64(s * total.saturating_sub(done) as f64 / done as f64))
}

/// Transfer rate in GiB/s and the time left, for warm-up and copy progress lines.
pub fn transfer_rate(done_bytes: u64, total_bytes: u64, elapsed: Duration) -> (Option<f64>, Option<Duration>) {
    let rate = tokens_per_second(done_bytes, elapsed).map(|bytes_per_s| bytes_per_s / crate::units::GIB as f64);
    (rate, time_left(done_bytes, total_bytes, elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn steady_decode_rate_is_exact() {
        // Prefill ends at 500 ms, then one token every 50 ms → exactly 20 tok/s, now and average.
        let ends: Vec<Duration> = (1..=40).map(|k| ms(500 + 50 * k)).collect();
        let now = decode_rate_window(ms(500), &ends, 16).unwrap();
        let avg = decode_rate_average(ms(500), &ends).unwrap();
        // Tolerance: f64 rounding of millisecond sums only.
        assert!((now - 20.0).abs() < 1e-9, "{now}");
        assert!((avg - 20.0).abs() < 1e-9, "{avg}");
    }

    #[test]
    fn window_tracks_a_slowdown_while_average_lags() {
        // 30 steps at 10 ms, then 16 steps at 100 ms: the window sees only the slow part (10 tok/s),
        // the average is 46 tokens over 300 + 1600 ms.
        let mut ends = Vec::new();
        let mut t = 0u64;
        for _ in 0..30 {
            t += 10;
            ends.push(ms(t));
        }
        for _ in 0..16 {
            t += 100;
            ends.push(ms(t));
        }
        let now = decode_rate_window(Duration::ZERO, &ends, 16).unwrap();
        let avg = decode_rate_average(Duration::ZERO, &ends).unwrap();
        assert!((now - 10.0).abs() < 1e-9, "{now}");
        assert!((avg - 46.0 / 1.9).abs() < 1e-9, "{avg}");
    }

    #[test]
    fn short_turns_use_the_decode_start() {
        let ends = [ms(150), ms(200)];
        // 2 tokens over 100 ms since the first sample at 100 ms.
        assert!((decode_rate_window(ms(100), &ends, 16).unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(decode_rate_window(ms(100), &[], 16), None);
        assert_eq!(tokens_per_second(5, Duration::ZERO), None);
    }

    #[test]
    fn timeline_snapshot() {
        let mut tl = TurnTimeline::default();
        tl.prefill_started(ms(2));
        tl.prefill_finished(ms(402), 1000); // 1000 tokens in 400 ms = 2500 tok/s
        tl.token_sampled(ms(410));
        tl.token_sampled(ms(999)); // only the first counts
        for k in 1..=10u64 {
            tl.decode_step_finished(ms(410 + 25 * k)); // 40 tok/s
            if k == 4 {
                tl.answer_visible(ms(410 + 25 * k));
            }
        }
        let mem = MemoryReport {
            kv_bytes: 7,
            scratch_bytes: 9,
            device_used: Some(1),
            device_total: Some(2),
            ..Default::default()
        };
        let s = tl.stats(1010, 4096, &mem);
        assert!((s.prefill_tps.unwrap() - 2500.0).abs() < 1e-6);
        assert!((s.decode_tps_avg.unwrap() - 40.0).abs() < 1e-9);
        assert!((s.decode_tps_now.unwrap() - 40.0).abs() < 1e-9);
        assert_eq!(s.prefill_latency, Some(ms(410)));
        assert_eq!(s.first_answer_latency, Some(ms(510)));
        assert_eq!(s.generated, 10);
        assert_eq!(
            (s.context_used, s.context_size, s.kv_bytes, s.scratch_bytes),
            (1010, 4096, 7, 9)
        );
        assert_eq!(
            s.device_memory,
            Some(DeviceMemory {
                used_bytes: 1,
                total_bytes: 2
            })
        );
    }

    #[test]
    fn transfer_rate_and_eta() {
        // 4 GiB of 12 GiB in 2 s → 2 GiB/s, 4 s left.
        let g = 1u64 << 30;
        let (rate, eta) = transfer_rate(4 * g, 12 * g, Duration::from_secs(2));
        assert!((rate.unwrap() - 2.0).abs() < 1e-12);
        assert!((eta.unwrap().as_secs_f64() - 4.0).abs() < 1e-9);
        assert_eq!(transfer_rate(0, g, Duration::from_secs(1)), (None, None));
    }
}
