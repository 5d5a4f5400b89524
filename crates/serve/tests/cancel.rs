//! `ferrite serve` after many requests cancelled at random points (a client that gives up
//! before or during a non-streamed answer, or drops a stream after a few chunks): every
//! generation ends, every KV block is free, the server still answers, and the process's
//! resident memory stays within 32 MiB of its level after a warm-up round (no per-request
//! leak). Its own binary, so that no other test's server shares the process it measures.

use std::time::{Duration, Instant};

use serde_json::json;

mod support;
use support::*;

/// A small deterministic generator for the cancellation points.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The process's resident memory in bytes (Linux: /proc/self/statm), None elsewhere.
fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// `count` requests, each cancelled at a random point (`rng` decides), a few dozen in flight.
async fn cancel_round(url: &str, rng: &mut Lcg, count: usize) {
    let mut tasks = Vec::new();
    for i in 0..count {
        let u = url.to_string();
        let how = rng.below(4);
        let after = rng.below(6) as usize;
        let wait = Duration::from_millis(rng.below(40));
        let prompt: Vec<u32> = (0..(2 + rng.below(24)))
            .map(|j| (i as u32 * 13 + j as u32 * 101) % 49000)
            .collect();
        tasks.push(tokio::spawn(async move {
            let body =
                json!({"prompt": prompt, "max_tokens": 64, "ignore_eos": true, "stream": how != 0});
            let req = client()
                .post(format!("{u}/v1/completions"))
                .header("content-type", "application/json")
                .body(body.to_string());
            match how {
                // Non-streaming: the client gives up after a random wait (before or during
                // the generation).
                0 => {
                    let _ = req.timeout(wait).send().await;
                }
                // Streaming: drop after `after` chunks.
                _ => {
                    let Ok(mut r) = req.send().await else { return };
                    for _ in 0..after {
                        match r.chunk().await {
                            Ok(Some(_)) => {}
                            _ => break,
                        }
                    }
                }
            }
        }));
        // Keep a few dozen in flight.
        if tasks.len() >= 32 {
            for t in tasks.drain(..) {
                t.await.unwrap();
            }
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Waits until no request runs or waits and no KV block is in use.
async fn wait_idle(url: &str) {
    // Every generation ends (cancelled or done) and every block is free.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let used = metric(url, "ferrite_kv_blocks_used").await;
        let running = metric(url, "ferrite_requests_running").await;
        let waiting = metric(url, "ferrite_requests_waiting").await;
        if used == 0.0 && running == 0.0 && waiting == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after cancelling: {used} blocks used, {running} running, {waiting} waiting"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn cancelled_requests_free_every_kv_block_and_memory() {
    let count: usize = std::env::var("FERRITE_SERVE_CANCEL_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let server = tokio::task::spawn_blocking(|| start(config()))
        .await
        .unwrap();
    let url = server.url();
    let mut rng = Lcg(17);
    // Warm-up: the allocator's arenas, the runtime's threads and the kernels' scratch reach
    // their working size; the baseline is taken after it. (Measured on the 2-core build
    // machine from a 64-request warm-up: +81 MiB after 1,000 more, +86 after 2,500: growth
    // that levels off, not a per-request leak; hence the long warm-up.)
    cancel_round(&url, &mut rng, 500).await;
    wait_idle(&url).await;
    let base = resident_bytes();
    let t0 = Instant::now();
    cancel_round(&url, &mut rng, count).await;
    wait_idle(&url).await;
    let total = metric(&url, "ferrite_kv_blocks_total").await;
    let free = metric(&url, "ferrite_kv_blocks_free").await;
    let cached = metric(&url, "ferrite_kv_blocks_cached").await;
    assert_eq!(free + cached, total);
    assert!(metric(&url, "ferrite_requests_cancelled_total").await > 0.0);
    let after = resident_bytes();
    eprintln!(
        "{count} cancelled requests in {:.1} s; resident memory {:?} MiB before, {:?} MiB after",
        t0.elapsed().as_secs_f64(),
        base.map(|b| b >> 20),
        after.map(|b| b >> 20)
    );
    if let (Some(b), Some(a)) = (base, after) {
        // A leak of 32 KiB per request would add 31 MiB over 1,000.
        assert!(
            a <= b + (32 << 20),
            "resident memory grew from {} to {} MiB over {count} cancelled requests",
            b >> 20,
            a >> 20
        );
    }
    // The server still answers.
    let (s, _) = post(
        &url,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 200);
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap()
        .unwrap();
}
