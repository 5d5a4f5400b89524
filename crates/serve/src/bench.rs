//! The streaming load tool (`ferrite bench-serve URL`): N concurrent clients each send
//! streaming `/v1/completions` requests (`ignore_eos`, greedy) one after another until the
//! request count is reached; reported: aggregate generated tokens per second, time to first
//! token and inter-token latency percentiles. Speaks plain OpenAI plus llama.cpp's
//! `ignore_eos`, so it measures llama-server the same way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// What to send.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Server base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    /// Concurrent streams.
    pub clients: usize,
    /// Requests in all (each client takes the next until none are left).
    pub requests: usize,
    pub max_tokens: usize,
    pub prompt: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Give up on one request after this long.
    pub timeout: Duration,
    /// Sampling temperature of every request (0: greedy).
    pub temperature: f64,
}

/// Nearest-rank percentiles, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Percentiles {
    /// Of `v` (sorted here); all zero when empty.
    pub fn of(v: &mut [f64]) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = (q * v.len() as f64).ceil() as usize;
            v[rank.clamp(1, v.len()) - 1]
        };
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            mean: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct BenchReport {
    pub clients: usize,
    pub requests_ok: usize,
    pub requests_failed: usize,
    /// The first failure's message, if any.
    pub first_error: Option<String>,
    pub wall_secs: f64,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Generated tokens of all requests over the wall time.
    pub tokens_per_sec: f64,
    pub ttft: Percentiles,
    pub itl: Percentiles,
}

impl BenchReport {
    pub fn to_json(&self) -> Value {
        let p = |p: &Percentiles| json!({"p50": p.p50, "p90": p.p90, "p99": p.p99, "mean": p.mean});
        json!({
            "clients": self.clients,
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "first_error": self.first_error,
            "wall_seconds": self.wall_secs,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens_per_second": self.tokens_per_sec,
            "ttft_seconds": p(&self.ttft),
            "inter_token_seconds": p(&self.itl),
        })
    }
}

/// One streamed request's timings.
struct One {
    ttft: Option<f64>,
    gaps: Vec<f64>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

async fn one(client: &reqwest::Client, cfg: &BenchConfig) -> Result<One, String> {
    let body = json!({
        "model": cfg.model,
        "prompt": cfg.prompt,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    let url = format!("{}/v1/completions", cfg.url.trim_end_matches('/'));
    let mut req = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(cfg.timeout);
    if let Some(k) = &cfg.api_key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let t0 = Instant::now();
    let mut resp = req.send().await.map_err(|e| format!("POST {url}: {e}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        return Err(format!("POST {url}: {status}: {text}"));
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut out = One {
        ttft: None,
        gaps: Vec::new(),
        prompt_tokens: 0,
        completion_tokens: 0,
    };
    let mut last: Option<Instant> = None;
    let mut chunks = 0;
    let mut usage = None;
    loop {
        let chunk = resp
            .chunk()
            .await
            .map_err(|e| format!("reading the stream: {e}"))?;
        let Some(chunk) = chunk else { break };
        let now = Instant::now();
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data)
                .map_err(|e| format!("a stream chunk is not JSON ({e}): {data}"))?;
            if let Some(e) = v.get("error") {
                return Err(format!("error in the stream: {e}"));
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                usage = Some((
                    u["prompt_tokens"].as_u64().unwrap_or(0) as usize,
                    u["completion_tokens"].as_u64().unwrap_or(0) as usize,
                ));
            }
            let text = v["choices"][0]["text"].as_str().unwrap_or("");
            if !text.is_empty() {
                chunks += 1;
                match last {
                    None => out.ttft = Some((now - t0).as_secs_f64()),
                    Some(l) => out.gaps.push((now - l).as_secs_f64()),
                }
                last = Some(now);
            }
        }
    }
    (out.prompt_tokens, out.completion_tokens) = usage.unwrap_or((0, chunks));
    Ok(out)
}

/// Runs the load and returns the aggregate.
pub async fn run(cfg: BenchConfig) -> Result<BenchReport, String> {
    if cfg.clients == 0 || cfg.requests == 0 || cfg.max_tokens == 0 {
        return Err("bench-serve: clients, requests and max tokens must each be at least 1".into());
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(cfg.clients)
        .build()
        .map_err(|e| format!("bench-serve: HTTP client: {e}"))?;
    let cfg = Arc::new(cfg);
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..cfg.clients.min(cfg.requests) {
        let (client, cfg, next) = (client.clone(), cfg.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < cfg.requests {
                results.push(one(&client, &cfg).await);
            }
            results
        }));
    }
    let mut report = BenchReport {
        clients: cfg.clients,
        ..BenchReport::default()
    };
    let (mut ttft, mut itl) = (Vec::new(), Vec::new());
    for t in tasks {
        let results = t
            .await
            .map_err(|e| format!("bench-serve: a client task: {e}"))?;
        for r in results {
            match r {
                Ok(o) => {
                    report.requests_ok += 1;
                    report.prompt_tokens += o.prompt_tokens;
                    report.completion_tokens += o.completion_tokens;
                    ttft.extend(o.ttft);
                    itl.extend(o.gaps);
                }
                Err(e) => {
                    report.requests_failed += 1;
                    report.first_error.get_or_insert(e);
                }
            }
        }
    }
    report.wall_secs = t0.elapsed().as_secs_f64();
    report.tokens_per_sec = report.completion_tokens as f64 / report.wall_secs.max(1e-9);
    report.ttft = Percentiles::of(&mut ttft);
    report.itl = Percentiles::of(&mut itl);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::Percentiles;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.p50, p.p90, p.p99, p.mean), (50.0, 90.0, 99.0, 50.5));
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
    }
}
