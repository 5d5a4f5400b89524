//! Counters and histograms for `GET /metrics`, in Prometheus' text format (version 0.0.4).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ferrite_llm::engine::EngineStats;

/// Upper bounds (seconds) of the latency histograms' buckets; `+Inf` is implied.
const TTFT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A cumulative histogram over fixed bucket bounds.
struct Histogram {
    bounds: &'static [f64],
    /// Per-bucket (not cumulative) counts, one more than `bounds` (+Inf); sum; count.
    data: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            data: Mutex::new((vec![0; bounds.len() + 1], 0.0, 0)),
        }
    }

    fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        let mut d = self.data.lock().unwrap_or_else(|p| p.into_inner());
        d.0[i] += 1;
        d.1 += v;
        d.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let d = self.data.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += d.0[i];
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        cum += d.0[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", d.1, d.2);
    }
}

/// Everything `/metrics` reports. Shared by the HTTP handlers and the engine thread.
pub struct Metrics {
    /// Finished HTTP requests by (route, status code).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// Generations ended early: the client went away (or the server shut down).
    cancelled: AtomicU64,
    ttft: Histogram,
    itl: Histogram,
    /// The engine's counters after its last step (None until the model is loaded).
    engine: Mutex<Option<EngineStats>>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            itl: Histogram::new(ITL_BOUNDS),
            engine: Mutex::new(None),
        }
    }
}

impl Metrics {
    pub fn request(&self, route: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((route.to_string(), status)).or_insert(0) += 1;
    }

    pub fn prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn generated_token(&self) {
        self.generated_tokens.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    pub fn ttft(&self, secs: f64) {
        self.ttft.observe(secs);
    }

    pub fn inter_token(&self, secs: f64) {
        self.itl.observe(secs);
    }

    pub fn set_engine(&self, s: EngineStats) {
        *self.engine.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
    }

    pub fn engine(&self) -> Option<EngineStats> {
        *self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP ferrite_requests_total HTTP requests answered, by route and status code.\n# TYPE ferrite_requests_total counter\n");
        for ((route, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "ferrite_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(
            &mut out,
            "ferrite_prompt_tokens_total",
            "Prompt tokens of admitted requests.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "ferrite_generated_tokens_total",
            "Tokens generated.",
            self.generated_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "ferrite_requests_cancelled_total",
            "Generations cancelled before their end (client disconnected or shutdown).",
            self.cancelled.load(Ordering::Relaxed),
        );
        if let Some(s) = self.engine() {
            gauge(
                &mut out,
                "ferrite_requests_waiting",
                "Requests queued for room in the KV cache.",
                s.waiting as u64,
            );
            gauge(
                &mut out,
                "ferrite_requests_running",
                "Sequences in the running batch.",
                s.running as u64,
            );
            gauge(
                &mut out,
                "ferrite_kv_blocks_total",
                "KV cache blocks.",
                s.kv.blocks_total as u64,
            );
            gauge(
                &mut out,
                "ferrite_kv_blocks_used",
                "KV cache blocks held by running sequences.",
                s.kv.blocks_used as u64,
            );
            gauge(
                &mut out,
                "ferrite_kv_blocks_cached",
                "KV cache blocks free but keeping a finished prompt prefix for reuse.",
                s.kv.blocks_cached as u64,
            );
            gauge(
                &mut out,
                "ferrite_kv_blocks_free",
                "KV cache blocks holding nothing.",
                s.kv.blocks_free as u64,
            );
            gauge(
                &mut out,
                "ferrite_kv_block_size",
                "Positions per KV cache block.",
                s.kv.block_size as u64,
            );
            counter(
                &mut out,
                "ferrite_prefix_cache_hit_positions_total",
                "Prompt positions served from shared or cached KV blocks instead of computed.",
                s.kv.prefix_hit_positions,
            );
        }
        self.ttft.render(
            &mut out,
            "ferrite_time_to_first_token_seconds",
            "From a request's admission to its first generated token.",
        );
        self.itl.render(
            &mut out,
            "ferrite_inter_token_latency_seconds",
            "Between consecutive generated tokens of one request.",
        );
        if let Some(rss) = resident_bytes() {
            gauge(
                &mut out,
                "process_resident_memory_bytes",
                "Resident memory of the server process.",
                rss,
            );
        }
        out
    }
}

/// Resident set size from /proc/self/statm (Linux); None elsewhere.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.1, 0.5, 3.0] {
            h.observe(v);
        }
        let mut s = String::new();
        h.render(&mut s, "x", "help");
        assert!(s.contains("x_bucket{le=\"0.1\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"1\"} 3\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 4\n"), "{s}");
        assert!(s.contains("x_sum 3.65\nx_count 4\n"), "{s}");
    }
}
