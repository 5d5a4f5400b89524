//! Shared checks of a real model against the `transformers` fixtures written by
//! `scripts/llm_fixtures.py` (fp32 reference, weights dequantized from the same GGUF).

use std::path::{Path, PathBuf};

use ferrite_llm::generate::{greedy, mean_nll};
use ferrite_llm::{Logits, Model, Session};
use serde_json::Value;

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn load_json(name: &str) -> Value {
    let p = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Greedy tokens equal transformers' up to (not including) the first step whose reference
/// top-2 margin is below 0.5 logits: before that step the choice is robust to the
/// quantization noise of our kernels. Returns the number of steps compared.
pub fn check_greedy(model: &Model, fx: &Value) -> usize {
    let mut total = 0;
    for case in fx["greedy"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["new_ids"]);
        let margins: Vec<f64> = case["margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let robust = margins.iter().position(|&m| m < 0.5).unwrap_or(want.len());
        let mut s = Session::new(model, 256).unwrap();
        let got = greedy(&mut s, &prompt, want.len()).unwrap();
        assert_eq!(
            &got[..robust],
            &want[..robust],
            "prompt {:?}: greedy tokens differ before step {robust} (first reference margin < 0.5)",
            case["prompt"]
        );
        total += robust;
    }
    total
}

/// Final-position logits of the fixture prompt: (max |diff|, rms diff, reference std).
pub fn logits_error(model: &Model, fx: &Value, bin: &str) -> (f32, f32, f32) {
    let prompt = ids(&fx["logits"]["prompt_ids"]);
    let bytes = std::fs::read(fixtures_dir().join(bin)).unwrap();
    let want: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(want.len(), model.cfg.vocab);
    let mut s = Session::new(model, 64).unwrap();
    let got = s.forward(&prompt, Logits::Last).unwrap();
    let mut max = 0f32;
    let mut ss = 0f64;
    for (a, b) in got.iter().zip(&want) {
        max = max.max((a - b).abs());
        ss += ((a - b) as f64).powi(2);
    }
    let mean = want.iter().map(|&v| v as f64).sum::<f64>() / want.len() as f64;
    let std =
        (want.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    ((max), (ss / want.len() as f64).sqrt() as f32, std as f32)
}

/// Perplexity of each fixture window up to `max_ctx` tokens: (ctx, ours, reference).
pub fn perplexities(model: &Model, fx: &Value, max_ctx: usize) -> Vec<(usize, f64, f64)> {
    let mut out = Vec::new();
    for w in fx["perplexity"]["windows"].as_array().unwrap() {
        if w["ctx"].as_u64().unwrap() as usize > max_ctx {
            continue;
        }
        let ctx = w["ctx"].as_u64().unwrap() as usize;
        let ids = ids(&w["ids"]);
        let mut s = Session::new(model, ctx).unwrap();
        let (nll, n) = mean_nll(&mut s, &ids).unwrap();
        assert_eq!(n as u64, w["n_scored"].as_u64().unwrap());
        out.push((ctx, nll.exp(), w["ppl"].as_f64().unwrap()));
    }
    out
}
