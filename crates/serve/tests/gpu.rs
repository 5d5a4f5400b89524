//! `ferrite serve` on CUDA against the same server on the CPU, with SmolLM2-135M. A plain
//! binary (harness = false): without a CUDA device, or without the cached model file (the
//! GPU machine has no network), each test is reported skipped by name; on a machine with an
//! NVIDIA GPU each runs and the binary exits non-zero on any failure.
//!
//! Usage: `cargo test -p ferrite-serve --test gpu [-- FILTER]`.

use std::path::Path;
use std::time::Duration;

mod device_support;

use device_support::{check_greedy_texts, post, runtime, smollm2_path};
use ferrite_llm::gpu::CudaDevice;
use ferrite_llm::Model;
use ferrite_serve::RunningServer;
use ferrite_testing::runner::Runner;
use serde_json::{json, Value};

/// A test returns None when it ran, or the reason it was skipped.
type TestFn = fn(&CudaDevice, &Path) -> Option<String>;

fn tests() -> Vec<(&'static str, TestFn)> {
    vec![
        (
            "serve_cuda_greedy_matches_cpu_and_returns_logprobs",
            greedy_matches_cpu_and_logprobs,
        ),
        (
            "serve_cuda_memory_check_sizes_the_kv_cache_and_refuses_too_much",
            memory_check,
        ),
        (
            "serve_cuda_json_schema_output_validates_and_n_choices_follow_their_seeds",
            json_schema_and_n,
        ),
    ]
}

fn main() {
    let mut r = Runner::from_args();
    let dev = if ferrite_llm::gpu::is_available() {
        match CudaDevice::new(0) {
            Ok(d) => Some(d),
            Err(e) => {
                println!("CUDA device 0 failed to start: {e}");
                None
            }
        }
    } else {
        None
    };
    let model = smollm2_path();
    for (name, f) in tests() {
        match (&dev, &model) {
            (Some(d), Some(m)) => r.run(name, || f(d, m)),
            (None, _) => r.skip(name, "no CUDA device"),
            (_, None) => r.skip(
                name,
                "SmolLM2-135M-Instruct.Q4_1.gguf is not in the ferrite cache",
            ),
        }
    }
    r.finish("serve gpu tests");
}

/// A server on `device` (None: the CPU) that is ready: context 256, 8 parallel.
fn start(path: &Path, device: Option<CudaDevice>) -> RunningServer {
    device_support::start(path, device.into(), 8, Duration::from_secs(120))
}

/// Greedy completions on the CUDA server (sent at once with a logprobs request, so greedy
/// rows share steps whose logits are read to the host and steps whose are not) equal the
/// CPU server's text: the France prompt always (the llm tests' 32-token greedy reference),
/// at least 3 of the 4 prompts (the engine tests allow one near-tie flip on SmolLM2); a
/// request alone gives the batched text exactly (batch invariance). Logprobs come back on
/// CUDA: one per token, the chosen token the most likely, within 0.2 of the CPU's (logits
/// within 0.1 each: the chosen one's and the log-sum-exp's).
fn greedy_matches_cpu_and_logprobs(dev: &CudaDevice, path: &Path) -> Option<String> {
    let prompts = [
        "The capital of France is",
        "1, 2, 3, 4,",
        "Here is a short poem about the sea:",
        "def fibonacci(n):",
    ];
    let body = |p: &str, logprobs: bool| {
        let mut b = json!({"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true});
        if logprobs {
            b["logprobs"] = json!(3);
        }
        b
    };
    let rt = runtime();
    let run_all = |url: &str| -> (Vec<String>, Value) {
        rt.block_on(async {
            let bodies: Vec<Value> = prompts.iter().map(|p| body(p, false)).collect();
            let lp_body = body(prompts[0], true);
            let greedy = bodies.iter().map(|b| post(url, "/v1/completions", b));
            let lp = post(url, "/v1/completions", &lp_body);
            let (texts, lp) = tokio::join!(futures_util::future::join_all(greedy), lp);
            let texts = texts
                .iter()
                .map(|v| v["choices"][0]["text"].as_str().unwrap().to_string())
                .collect();
            (texts, lp)
        })
    };
    let cpu = start(path, None);
    let (cpu_texts, cpu_lp) = run_all(&cpu.url());
    cpu.stop().unwrap();
    let gpu = start(path, Some(dev.clone()));
    let (gpu_texts, gpu_lp) = run_all(&gpu.url());
    // Alone: the same text as in a shared batch.
    let alone = rt.block_on(post(
        &gpu.url(),
        "/v1/completions",
        &body(prompts[1], false),
    ));
    gpu.stop().unwrap();

    let same = check_greedy_texts("CUDA", &prompts, &cpu_texts, &gpu_texts);
    assert_eq!(alone["choices"][0]["text"].as_str().unwrap(), gpu_texts[1]);

    let (c, g) = (&cpu_lp["choices"][0], &gpu_lp["choices"][0]);
    assert_eq!(g["text"], c["text"], "logprobs request text");
    assert_eq!(g["text"].as_str().unwrap(), gpu_texts[0]);
    let (cl, gl) = (&c["logprobs"], &g["logprobs"]);
    assert_eq!(gl["tokens"], cl["tokens"]);
    let gvals = gl["token_logprobs"].as_array().unwrap();
    let cvals = cl["token_logprobs"].as_array().unwrap();
    assert_eq!(gvals.len(), 24);
    assert_eq!(gvals.len(), cvals.len());
    for (i, (gv, cv)) in gvals.iter().zip(cvals).enumerate() {
        let (gv, cv) = (gv.as_f64().unwrap(), cv.as_f64().unwrap());
        assert!(gv <= 0.0 && gv > -9999.0, "token {i}: CUDA logprob {gv}");
        assert!(
            (gv - cv).abs() < 0.2,
            "token {i}: CUDA logprob {gv}, CPU {cv}"
        );
        let top = gl["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 3, "token {i}: {top:?}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        // Greedy: the chosen token is the most likely one.
        assert!(
            (gv - best).abs() < 1e-6,
            "token {i}: chosen {gv}, best {best}"
        );
    }
    println!(
        "  {same}/{} greedy texts equal; logprobs of {:?} within 0.2 of the CPU's",
        prompts.len(),
        g["text"].as_str().unwrap()
    );
    None
}

/// The server's estimate of the engine's KV cache is what `CudaKvStore` allocates; an
/// engine that cannot fit (1024 sequences of 8192 positions: about 190 GB of KV cache for
/// SmolLM2) is refused before allocation, naming the flags to lower; a small one passes.
fn memory_check(dev: &CudaDevice, path: &Path) -> Option<String> {
    use ferrite_llm::engine::EngineConfig;
    use ferrite_llm::gpu::GpuModel;
    use ferrite_llm::model::CudaKvStore;
    use ferrite_serve::worker::{check_cuda_memory, cuda_engine_bytes};
    let model = Model::load(path).unwrap();
    let gm = GpuModel::load(&model, dev, 256).unwrap();
    let small = EngineConfig::new(256, 8);
    let store = CudaKvStore::new(&gm, small.kv_blocks).unwrap();
    assert_eq!(cuda_engine_bytes(&gm.cfg, &small).0, store.bytes());
    drop(store);
    check_cuda_memory(&gm, dev, &small).unwrap();
    let huge = EngineConfig::new(model.cfg.ctx_train, 1024);
    let (kv, _) = cuda_engine_bytes(&gm.cfg, &huge);
    let (_, total) = dev.mem_info().unwrap();
    assert!(
        kv > total,
        "{kv} bytes of KV cache fit {total}: pick a larger test size"
    );
    let e = check_cuda_memory(&gm, dev, &huge).unwrap_err();
    assert!(
        e.contains("does not fit the GPU") && e.contains("lower --parallel or --ctx"),
        "{e}"
    );
    println!("  refused: {e}");
    None
}

/// Every size bounded: any valid document fits the 256-position context.
const USER_SCHEMA: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 24},
    "age": {"type": "integer"},
    "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
    "admin": {"type": "boolean"},
    "role": {"enum": ["user", "editor", "owner"]}},
  "required": ["name", "age", "languages", "admin", "role"], "additionalProperties": false}"#;

/// On CUDA, constrained requests (json_schema sampled at temperature 1, a greedy
/// json_object) sent at once with unconstrained greedy ones (so steps mix rows whose logits
/// the host masks with rows the device picks): every schema reply ends with "stop", parses
/// and validates; the greedy json_object reply is an object or, cut by max_tokens, a prefix
/// that the CPU's grammar accepts. Then n = 3: three choices, usage summed, choice i equal to
/// the n = 1 answer for seed + i.
fn json_schema_and_n(dev: &CudaDevice, path: &Path) -> Option<String> {
    use ferrite_llm::grammar::json::validate;
    let schema: Value = serde_json::from_str(USER_SCHEMA).unwrap();
    let rt = runtime();
    let gpu = start(path, Some(dev.clone()));
    let url = gpu.url();
    let bodies: Vec<Value> = (0..4)
        .map(|seed| {
            let text = format!(
                r#"{{"messages": [{{"role": "user", "content": "Make up a user profile."}}], "max_tokens": 200,
                    "temperature": 1.0, "seed": {seed},
                    "response_format": {{"type": "json_schema", "json_schema": {{"name": "user", "schema": {USER_SCHEMA}}}}}}}"#
            );
            serde_json::from_str(&text).unwrap()
        })
        .collect();
    let greedy = json!({"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let obj = json!({"prompt": "A JSON object describing a cat:", "max_tokens": 60, "temperature": 0,
                     "response_format": {"type": "json_object"}});
    let (schema_replies, _, obj_reply) = rt.block_on(async {
        let s = bodies.iter().map(|b| post(&url, "/v1/chat/completions", b));
        tokio::join!(
            futures_util::future::join_all(s),
            post(&url, "/v1/completions", &greedy),
            post(&url, "/v1/completions", &obj)
        )
    });
    for (seed, v) in schema_replies.iter().enumerate() {
        let c = &v["choices"][0];
        let text = c["message"]["content"].as_str().unwrap();
        println!("  seed {seed}: {text}");
        assert_eq!(c["finish_reason"], "stop", "seed {seed}: {text}");
        let doc: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        validate(&schema, &doc).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
    }
    let c = &obj_reply["choices"][0];
    let text = c["text"].as_str().unwrap();
    println!("  json_object (greedy): {text}");
    if c["finish_reason"] == "stop" {
        let doc: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(doc.is_object(), "{text}");
    } else {
        let g = std::sync::Arc::new(ferrite_llm::grammar::json_object());
        let bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let t: Vec<Option<&[u8]>> = bytes.iter().map(|b| Some(b.as_slice())).collect();
        let trie = std::sync::Arc::new(ferrite_llm::grammar::TokenTrie::new(&t, 256));
        let mut gc = ferrite_llm::grammar::GrammarConstraint::new(g, trie, Vec::new()).unwrap();
        assert!(
            gc.advance_bytes(text.as_bytes()),
            "not a JSON prefix: {text:?}"
        );
    }

    let comp = json!({"prompt": "Once upon a time", "max_tokens": 12, "seed": 7, "temperature": 1.0,
                      "ignore_eos": true, "n": 3});
    let many = rt.block_on(post(&url, "/v1/completions", &comp));
    let choices = many["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    assert_eq!(many["usage"]["completion_tokens"], 36);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let mut one = comp.clone();
        one["n"] = json!(1);
        one["seed"] = json!(7 + i);
        let w = rt.block_on(post(&url, "/v1/completions", &one));
        assert_eq!(w["choices"][0]["text"], c["text"], "choice {i}");
    }
    gpu.stop().unwrap();
    None
}
