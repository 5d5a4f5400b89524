//! What the device test binaries (`gpu`, `wgpu`) share: the cached SmolLM2 file, servers on it
//! with f32 activations on a given device, and a JSON client.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::{Model, Precision};
use ferrite_serve::{Loaded, RunningServer, ServeConfig, ServeDevice};
use serde_json::Value;

/// The cached SmolLM2 file, if it is there whole (no fetch: the GPU machine has no network).
pub fn smollm2_path() -> Option<PathBuf> {
    let p = ferrite_gguf::fetch::cache_dir()
        .ok()?
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::metadata(&p)
        .ok()
        .filter(|m| m.len() == 98_362_432)
        .map(|_| p)
}

/// A server on `path` and `device` with context `ctx` and `parallel` sequences, loading in the
/// background.
pub fn server(path: &Path, device: ServeDevice, ctx: usize, parallel: usize) -> RunningServer {
    let path = path.to_path_buf();
    let load: ferrite_serve::Loader = Box::new(move || {
        let mut model = Model::load(&path).map_err(|e| e.to_string())?;
        // f32 activations on every device (`--precision exact`): a GPU follows the CPU's
        // logits up to the summation order (the llm crate's greedy and logit checks are made
        // this way), where 8-bit activations would flip near ties between the two.
        model.set_precision(Precision::Exact);
        let tok = Tokenizer::from_gguf(model.gguf()).map_err(|e| e.to_string())?;
        Ok(Loaded { model, tok, device })
    });
    let mut cfg = ServeConfig::new("smollm2");
    cfg.ctx = Some(ctx);
    cfg.parallel = parallel;
    RunningServer::start("127.0.0.1:0".parse().unwrap(), cfg, load).unwrap()
}

/// A server of context 256 that answered /health with 200 (loading may take `limit`: on
/// lavapipe it compiles every shader).
pub fn start(path: &Path, device: ServeDevice, parallel: usize, limit: Duration) -> RunningServer {
    let s = server(path, device, 256, parallel);
    let t0 = Instant::now();
    let rt = runtime();
    loop {
        let status = rt.block_on(health(&s.url()));
        if status == 200 {
            return s;
        }
        assert!(
            status == 503 && t0.elapsed() < limit,
            "/health: {status} after {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Greedy texts of `prompts` on a device (`name`) against the CPU's: every one non-empty,
/// the first equal, and at least all but one (a near tie may flip, as the engine tests
/// allow). Returns how many are equal.
pub fn check_greedy_texts(name: &str, prompts: &[&str], cpu: &[String], dev: &[String]) -> usize {
    let mut same = 0;
    for (i, (c, g)) in cpu.iter().zip(dev).enumerate() {
        println!("  {:?}: {name} {g:?}, CPU {c:?}", prompts[i]);
        assert!(!g.is_empty());
        same += usize::from(g == c);
    }
    assert_eq!(dev[0], cpu[0], "{name} text differs from the CPU's");
    assert!(
        same + 1 >= prompts.len(),
        "only {same}/{} {name} texts equal the CPU's",
        prompts.len()
    );
    same
}

/// The status of `/health` (0 when nothing answers).
pub async fn health(url: &str) -> u16 {
    reqwest::get(format!("{url}/health"))
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// POSTs `body` to `path`; the answer must be 200 with a JSON body.
pub async fn post(url: &str, path: &str, body: &Value) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"))
}
