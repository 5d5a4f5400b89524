//! `ferrite serve` on a wgpu adapter (Vulkan, Metal, DX12) against the same server on the
//! CPU, with SmolLM2-135M. A plain binary (harness = false): without a wgpu adapter, or
//! without the cached model file, each test is reported skipped by name. In CI it runs on
//! Mesa's lavapipe (Vulkan on the CPU); on a machine with an NVIDIA GPU through its Vulkan
//! driver.
//!
//! Usage: `cargo test -p ferrite-serve --test wgpu [-- FILTER]`.

mod device_support;

use std::path::Path;
use std::time::{Duration, Instant};

use device_support::{check_greedy_texts, health, post, runtime, server, smollm2_path};
use ferrite_llm::Model;
use ferrite_serve::{RunningServer, ServeDevice};
use ferrite_testing::runner::Runner;
use ferrite_wgpu::WgpuDevice;
use serde_json::{json, Value};

/// A test returns None when it ran, or the reason it was skipped.
type TestFn = fn(&WgpuDevice, &Path) -> Option<String>;

fn tests() -> Vec<(&'static str, TestFn)> {
    vec![
        (
            "serve_wgpu_greedy_matches_cpu_batched_and_alone_and_seeds_repeat",
            greedy_matches_cpu,
        ),
        (
            "serve_wgpu_kv_cache_past_the_adapters_limits_fails_the_load",
            kv_cache_too_large,
        ),
    ]
}

fn main() {
    let mut r = Runner::from_args();
    let dev = match ferrite_wgpu::default_adapter().map(WgpuDevice::new) {
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            println!("wgpu adapter failed to open: {e}");
            None
        }
        None => None,
    };
    let model = smollm2_path();
    for (name, f) in tests() {
        match (&dev, &model) {
            (Some(d), Some(m)) => r.run(name, || f(d, m)),
            (None, _) => r.skip(name, "no wgpu adapter"),
            (_, None) => r.skip(
                name,
                "SmolLM2-135M-Instruct.Q4_1.gguf is not in the ferrite cache",
            ),
        }
    }
    r.finish("serve wgpu tests");
}

/// A ready server on `device`: context 256, 4 parallel.
fn start(path: &Path, device: ServeDevice) -> RunningServer {
    device_support::start(path, device, 4, Duration::from_secs(300))
}

fn text(v: &Value) -> String {
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Greedy completions on the wgpu server, four sent at once (one batch), equal the CPU
/// server's: the France prompt always, at least 3 of the 4 (the engine tests allow one
/// near-tie flip on SmolLM2); a request alone gives its batched text exactly. Then, on the
/// same server (starting one compiles every shader: most of this test's time on lavapipe),
/// sampled completions (temperature 0.9, top-p 0.95) with a seed: the same seed gives the
/// same text twice, and three seeds do not all give one text.
fn greedy_matches_cpu(dev: &WgpuDevice, path: &Path) -> Option<String> {
    let prompts = [
        "The capital of France is",
        "1, 2, 3, 4,",
        "Here is a short poem about the sea:",
        "def fibonacci(n):",
    ];
    let body =
        |p: &str| json!({"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let rt = runtime();
    let run_all = |url: &str| -> Vec<String> {
        rt.block_on(async {
            let bodies: Vec<Value> = prompts.iter().map(|p| body(p)).collect();
            let all = bodies.iter().map(|b| post(url, "/v1/completions", b));
            futures_util::future::join_all(all)
                .await
                .iter()
                .map(text)
                .collect()
        })
    };
    let cpu = start(path, ServeDevice::Cpu);
    let cpu_texts = run_all(&cpu.url());
    cpu.stop().unwrap();
    let gpu = start(path, ServeDevice::Wgpu(dev.clone()));
    let gpu_texts = run_all(&gpu.url());
    let alone = text(&rt.block_on(post(&gpu.url(), "/v1/completions", &body(prompts[1]))));
    let sampled = seeded_sampling(&rt, &gpu.url());
    gpu.stop().unwrap();

    check_greedy_texts("wgpu", &prompts, &cpu_texts, &gpu_texts);
    assert_eq!(alone, gpu_texts[1], "alone against batched");
    println!("  seeds 7, 7, 8, 9: {sampled:?}");
    assert!(sampled.iter().all(|t| !t.is_empty()));
    assert_eq!(sampled[0], sampled[1], "seed 7 twice");
    assert!(
        sampled[1..].iter().any(|t| t != &sampled[1]),
        "three seeds gave one text"
    );
    None
}

/// Completions of one prompt at temperature 0.9, top-p 0.95, with seeds 7, 7, 8 and 9.
fn seeded_sampling(rt: &tokio::runtime::Runtime, url: &str) -> Vec<String> {
    let body = |seed: u64| {
        json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.9,
               "top_p": 0.95, "seed": seed, "ignore_eos": true})
    };
    [7u64, 7, 8, 9]
        .iter()
        .map(|&s| text(&rt.block_on(post(url, "/v1/completions", &body(s)))))
        .collect()
}

/// An engine whose KV cache exceeds the adapter's largest storage binding (1024 sequences
/// of SmolLM2's full context, f32 keys: ~190 GB) fails the load with an error naming the
/// KV cache, and the server ends instead of answering 503 forever.
fn kv_cache_too_large(dev: &WgpuDevice, path: &Path) -> Option<String> {
    let ctx = Model::load(path).unwrap().cfg.ctx_train;
    let s = server(path, ServeDevice::Wgpu(dev.clone()), ctx, 1024);
    let t0 = Instant::now();
    let rt = runtime();
    // the server stops listening once the load failed
    while rt.block_on(health(&s.url())) != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "still serving after {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let e = s.stop().expect_err("a load that cannot fit succeeded");
    println!("  {e}");
    assert!(e.contains("KV cache"), "{e}");
    assert!(e.contains(dev.name()), "{e}");
    None
}
