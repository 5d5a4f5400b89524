//! The LLM engine on wgpu (`model/wgpu.rs`, the WGSL kernel set of the one model definition)
//! against the CPU engine. A plain binary (harness = false): where there is no wgpu adapter
//! (or no model file) each test is reported skipped by name. Here and in CI it runs on Mesa's
//! lavapipe (Vulkan on the CPU); on the GPU machine through Vulkan on the NVIDIA driver.
//!
//! Scenario (as the CUDA engine tests): six requests of mixed prompt lengths in chunks of 12
//! tokens per step, across block boundaries, two sharing a running request's blocks (one
//! exactly a full block: copy-on-write), one reusing a finished request's cached blocks.
//! Checked: every request's greedy tokens equal the same prompt alone on wgpu and its logits
//! too (every kernel computes a row from that row alone, in a fixed order); against the CPU
//! engine in exact mode (f32 activations, as the wgpu kernels), logits within a stated
//! fraction of the largest |logit| while the tokens agree, the first token equal (or a near
//! tie on the CPU).
//!
//! Usage: `cargo test -p ferrite-llm --test wgpu [-- FILTER]`; `FERRITE_WGPU_ADAPTER=i` picks
//! an adapter (default: `ferrite_wgpu::default_adapter()`).

mod sampler_support;

use std::collections::HashMap;
use std::path::PathBuf;

use ferrite_cpu::quant::ActFormat;
use ferrite_gguf::GgmlType;
use ferrite_llm::engine::{Engine, EngineConfig, EngineKernels, Request, RequestId};
use ferrite_llm::generate::mean_nll;
use ferrite_llm::kv_cache::BLOCK_SIZE;
use ferrite_llm::model::{WgpuKvStore, WgpuModel};
use ferrite_llm::sampler::{Sampler, SamplerConfig};
use ferrite_llm::synth::{write_synthetic, SynthConfig, VocabStyle, QUANTS};
use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::{Logits, Model, Precision, Session};
use ferrite_testing::runner::Runner;
use ferrite_wgpu::WgpuDevice;
use sampler_support::{check_draws, penalized, Rng};

type TestFn = fn(&WgpuDevice) -> Option<String>;

fn tests() -> Vec<(&'static str, TestFn)> {
    vec![
        (
            "wgpu_engine_synthetic_every_format_batch_equals_alone_and_cpu",
            engine_synthetic,
        ),
        (
            "wgpu_engine_q8_every_format_batch_equals_alone_and_cpu_q8",
            engine_synthetic_q8,
        ),
        (
            "wgpu_engine_gemma3_shaped_synthetic_matches_cpu",
            engine_synthetic_gemma_shape,
        ),
        (
            "wgpu_engine_smollm2_batch_equals_alone_and_cpu",
            engine_smollm2,
        ),
        (
            "wgpu_engine_gemma3_batch_equals_alone_and_cpu",
            engine_gemma3,
        ),
        ("wgpu_engine_cancel_frees_blocks", engine_cancel),
        (
            "wgpu_chained_decode_equals_one_token_at_a_time",
            chained_generation,
        ),
        (
            "wgpu_f16_fields_by_unpack2x16float_equal_bit_operations",
            f16_unpack,
        ),
        (
            "wgpu_profile_times_every_kernel_and_changes_no_logit",
            profile_kernels,
        ),
        (
            "wgpu_attention_split_over_workgroups_matches_cpu_in_any_chunking",
            long_context,
        ),
        ("wgpu_weights_split_over_bindings_match_cpu", weights_split),
        (
            "wgpu_weight_row_over_the_binding_limit_is_refused",
            weight_row_over_limit,
        ),
        (
            "wgpu_kv_cache_over_the_binding_limit_is_refused",
            kv_over_limit,
        ),
        (
            "wgpu_sampler_distribution_matches_cpu_probabilities",
            sampler_distribution,
        ),
        (
            "wgpu_sampler_same_seed_same_tokens_at_256_and_1024_threads",
            sampler_seed,
        ),
        (
            "wgpu_sampled_generation_chained_reads_back_only_ids",
            sampled_generation,
        ),
        (
            "wgpu_greedy_with_penalties_equals_cpu_pick",
            greedy_penalties,
        ),
        (
            "wgpu_engine_samples_on_the_device_per_request",
            engine_device_sampling,
        ),
        (
            "wgpu_device_sampler_states_survive_repacking",
            sampler_states_repack,
        ),
    ]
}

fn adapter() -> Result<WgpuDevice, String> {
    let i = match std::env::var("FERRITE_WGPU_ADAPTER") {
        Ok(v) => v
            .parse::<usize>()
            .map_err(|_| format!("FERRITE_WGPU_ADAPTER={v:?} is not an adapter index"))?,
        Err(_) => ferrite_wgpu::default_adapter().ok_or("no wgpu adapter")?,
    };
    WgpuDevice::new(i).map_err(|e| format!("wgpu adapter {i} failed to start: {e}"))
}

fn main() {
    let mut r = Runner::from_args();
    let dev = adapter();
    for (name, f) in tests() {
        match &dev {
            Ok(d) => r.run(name, || f(d)),
            Err(why) => r.skip(name, why),
        }
    }
    if let Ok(d) = &dev {
        println!("adapter: {} ({})", d.name(), d.backend_name());
    }
    r.finish("llm wgpu tests");
}

fn tmp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-wgpu-llm-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn synth_cfg(quant: GgmlType) -> SynthConfig {
    SynthConfig {
        preset: "wgpu-test",
        n_layer: 2,
        d_model: 512,
        n_head: 8,
        n_kv_head: 2,
        n_ff: 768,
        vocab: 1000,
        ctx: 256,
        rope_base: 10000.0,
        eps: 1e-5,
        tied_output: quant != GgmlType::Q4_1,
        vocab_style: VocabStyle::SmolLm2,
    }
}

fn synth_model(cfg: &SynthConfig, quant: GgmlType, dir: &std::path::Path) -> Model {
    let path = dir.join(format!("synth-{}-{}.gguf", cfg.preset, quant.name()));
    write_synthetic(cfg, quant, 7, &path, &mut |_, _| {}).unwrap();
    let mut m = Model::load(&path).unwrap();
    m.set_precision(Precision::Exact);
    m
}

fn cached_model(file: &str, size: u64) -> Option<PathBuf> {
    let p = ferrite_gguf::fetch::cache_dir().ok()?.join(file);
    std::fs::metadata(&p)
        .ok()
        .filter(|m| m.len() == size)
        .map(|_| p)
}

/// A request's greedy tokens and the logits each was chosen from.
type Run = (Vec<u32>, Vec<Vec<f32>>);

fn engine_cfg() -> EngineConfig {
    EngineConfig {
        ctx: 96,
        kv_blocks: 64,
        max_seqs: 8,
        // Prompts arrive in chunks of at most 12 tokens per step, beside decode tokens.
        step_tokens: 12,
    }
}

fn prompt(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % (vocab - 1)) as u32)
        .collect()
}

/// The prompts, in order of arrival: (prompt, phase). Phase 0 arrives at once; phase 1 once
/// the first prompt has its first token (shares its first two full blocks, and exactly its
/// first block: copy-on-write); phase 2 after all ended (from the cache of finished prefixes).
fn scenario(vocab: usize) -> Vec<(Vec<u32>, usize)> {
    let bs = BLOCK_SIZE;
    let base = prompt(48, 1, vocab);
    let a = base[..2 * bs + 1].to_vec();
    let mut c = base[..2 * bs].to_vec();
    c.extend(prompt(3, 4, vocab));
    vec![
        (a.clone(), 0),
        (prompt(5, 2, vocab), 0),
        (prompt(bs + 4, 3, vocab), 0),
        (c, 1),
        (base[..bs].to_vec(), 1),
        (a, 2),
    ]
}

/// Runs the scenario (or, with `alone`, each prompt in an engine of its own) through engines
/// made by `make`; returns each request's run in scenario order.
fn run_scenario<K: EngineKernels>(
    make: &mut dyn FnMut() -> Engine<'static, K>,
    vocab: usize,
    n_new: usize,
    alone: bool,
) -> Vec<Run> {
    let sc = scenario(vocab);
    if alone {
        return sc
            .iter()
            .map(|(p, _)| {
                let mut e = make();
                e.set_keep_logits(true);
                let id = e.add_request(Request::greedy(p.clone(), n_new)).unwrap();
                let mut runs = HashMap::new();
                drain_engine(&mut e, &mut runs, None);
                runs.remove(&id).unwrap()
            })
            .collect();
    }
    let mut e = make();
    e.set_keep_logits(true);
    let mut ids = Vec::new();
    let mut runs: HashMap<RequestId, Run> = HashMap::new();
    for phase in 0..3 {
        let before = e.stats().kv.prefix_hit_positions;
        for (p, _) in sc.iter().filter(|(_, ph)| *ph == phase) {
            ids.push(e.add_request(Request::greedy(p.clone(), n_new)).unwrap());
        }
        let hits = e.stats().kv.prefix_hit_positions;
        match phase {
            0 => drain_engine(&mut e, &mut runs, Some(ids[0])),
            1 => {
                assert_eq!(hits, (3 * BLOCK_SIZE - 1) as u64, "shared prefixes");
                drain_engine(&mut e, &mut runs, None);
                assert_eq!(e.stats().kv.blocks_used, 0, "every block is released");
            }
            _ => {
                assert!(
                    hits >= before + 2 * BLOCK_SIZE as u64,
                    "a reuses its own cached blocks: {} new hit positions",
                    hits - before
                );
                drain_engine(&mut e, &mut runs, None);
            }
        }
    }
    ids.iter().map(|id| runs.remove(id).unwrap()).collect()
}

fn drain_engine<K: EngineKernels>(
    e: &mut Engine<'_, K>,
    runs: &mut HashMap<RequestId, Run>,
    until_first_of: Option<RequestId>,
) {
    while e.has_work() {
        let outs = e.step().unwrap();
        let mut stop = false;
        for o in outs {
            let r = runs.entry(o.id).or_default();
            r.1.push(e.last_logits(o.id).unwrap().to_vec());
            r.0.extend(o.token);
            stop |= Some(o.id) == until_first_of;
        }
        if stop {
            return;
        }
    }
}

/// The largest |a - b| over the steps where both runs had the same tokens so far, relative
/// to the largest |logit| of b; and how many steps that covered.
fn run_diff(a: &Run, b: &Run) -> (f32, usize) {
    let spread = b.1.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    let mut worst = 0f32;
    let mut steps = 0;
    for i in 0..a.1.len().min(b.1.len()) {
        if a.0[..i] != b.0[..i] {
            break;
        }
        let d = a.1[i]
            .iter()
            .zip(&b.1[i])
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d / spread);
        steps += 1;
    }
    (worst, steps)
}

/// Leaks `v` for the engines' `'static` borrows inside one test (a few models per run).
fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// The synthetic Q4_0 model (`synth_cfg`) in a fresh test folder, and its upload to `dev`.
fn q4_0_model(dev: &WgpuDevice) -> (PathBuf, &'static Model, &'static WgpuModel) {
    let dir = tmp_dir();
    let model = leak(synth_model(
        &synth_cfg(GgmlType::Q4_0),
        GgmlType::Q4_0,
        &dir,
    ));
    let wm = leak(WgpuModel::new(model, dev).unwrap());
    (dir, model, wm)
}

/// The wgpu engine's scenario against the same prompts alone on wgpu (tokens and logits
/// equal) and against the CPU engine in exact mode (logits within `tol` of the largest
/// |logit| while the tokens agree; the first token equal or a near tie on the CPU). Returns
/// (worst CPU difference, requests whose tokens all match the CPU's).
fn engine_vs(
    name: &str,
    model: &'static Model,
    dev: &WgpuDevice,
    n_new: usize,
    tol: f32,
) -> (f32, usize) {
    engine_vs_with(
        name,
        model,
        leak(WgpuModel::new(model, dev).unwrap()),
        n_new,
        tol,
    )
}

fn engine_vs_with(
    name: &str,
    model: &'static Model,
    wm: &'static WgpuModel,
    n_new: usize,
    tol: f32,
) -> (f32, usize) {
    let vocab = model.cfg.vocab;
    let mut wgpu = || Engine::wgpu(wm, engine_cfg()).unwrap();
    let batched = run_scenario(&mut wgpu, vocab, n_new, false);
    let alone = run_scenario(&mut wgpu, vocab, n_new, true);
    for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
        assert_eq!(
            b.0, a.0,
            "{name}: request {i}: batched tokens differ from alone"
        );
        let (d, _) = run_diff(b, a);
        assert!(
            d == 0.0,
            "{name}: request {i}: batched logits differ from alone by {d:.3e} of the range"
        );
    }
    let mut cpu = || Engine::new(model, engine_cfg()).unwrap();
    let cpu_runs = run_scenario(&mut cpu, vocab, n_new, false);
    let mut worst = 0f32;
    let mut same = 0;
    for (i, (g, c)) in batched.iter().zip(&cpu_runs).enumerate() {
        let (d, steps) = run_diff(g, c);
        // A different first token is allowed only where it is a near tie on the CPU: its CPU
        // logit within the stated tolerance (of the logit range) of the CPU's pick.
        let (gt, ct) = (g.0[0] as usize, c.0[0] as usize);
        let cl = &c.1[0];
        let range = cl.iter().fold(0f32, |m, v| m.max(v.abs()));
        let gap = (cl[ct] - cl[gt]) / range;
        assert!(
            steps >= 1 && (gt == ct || gap <= tol),
            "{name}: request {i}: first token {gt} vs CPU {ct} (CPU logit gap {gap:.3e} of the range)"
        );
        assert!(
            d <= tol,
            "{name}: request {i}: logits differ from the CPU engine by {d:.3e} of the range (tolerance {tol:.1e})"
        );
        worst = worst.max(d);
        same += usize::from(g.0 == c.0);
    }
    eprintln!(
        "{name}: wgpu engine vs CPU engine: logits within {worst:.2e} of the range; {same}/{} requests with all tokens equal",
        batched.len()
    );
    (worst, same)
}

/// Synthetic 2-layer models of all 13 weight formats `ferrite synth` writes (every product,
/// the embedding lookup and, for Q4_1, an untied output matrix through its format's kernel),
/// and the 32-value formats wgpu.rs regroups in both of their upload layouts.
/// Tolerance: f32 on both sides, summation order only (lavapipe: under 1e-6 of the range).
fn engine_synthetic(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    for quant in QUANTS {
        let model = leak(synth_model(&synth_cfg(quant), quant, &dir));
        let name = format!("synthetic {quant}");
        let (_, same) = engine_vs(&name, model, dev, 6, 1e-5);
        assert!(
            same >= 5,
            "{name}: only {same}/6 requests with all tokens as the CPU's"
        );
    }
    // q, k, v and gate, up as separate products and a separate gated-unit pass (the path of
    // models whose types differ).
    let model = leak(synth_model(
        &synth_cfg(GgmlType::Q4_0),
        GgmlType::Q4_0,
        &dir,
    ));
    let wm = leak(WgpuModel::load(model, dev, false, None).unwrap());
    engine_vs_with(
        "synthetic Q4_0, q/k/v and gate/up apart",
        model,
        wm,
        6,
        1e-5,
    );
    // Q4_0, Q5_0 and Q8_0 rows of a whole number of 256 values (all of the above) are uploaded
    // regrouped by eight blocks; rows of 544 and 800 values keep the GGUF layout.
    for quant in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
        let mut cfg = synth_cfg(quant);
        cfg.preset = "wgpu-gguf-layout";
        cfg.d_model = 544;
        cfg.n_ff = 800;
        let model = leak(synth_model(&cfg, quant, &dir));
        let name = format!("synthetic {quant}, rows of 544 and 800 values");
        engine_vs(&name, model, dev, 6, 1e-5);
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// The q8 precision (8-bit activations quantized in each product's workgroup, `Q8` of
/// matvec.wgsl) for the weight types that have it, against the CPU's q8 mode, which
/// quantizes the same way: batched equals alone bit for bit, logits within 0.025 of the
/// range (the CUDA q8 tests' tolerance). The CPU's q8 mode keeps its KV cache in f16, this
/// kernel set in f32, and each input that this moves across a rounding edge moves a product
/// by a whole 8-bit step: ~1e-2 of the range here (with the CPU's KV cache in f32, measured
/// once: 4e-7, the same bytes). Also rows of 8,448 values (264 units: two activation tiles of
/// a one-row product, nine of an 8-row one), and Q4_0, Q5_0, Q8_0 in the GGUF layout.
fn engine_synthetic_q8(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    let q8_types = QUANTS
        .into_iter()
        .filter(|&q| ActFormat::for_weight(q) == ActFormat::Q8);
    let mut cases = Vec::new();
    for quant in q8_types {
        cases.push((synth_cfg(quant), quant, "rows of 512 and 768 values"));
    }
    assert_eq!(cases.len(), 7, "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K");
    for quant in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
        let mut cfg = synth_cfg(quant);
        cfg.preset = "wgpu-gguf-layout";
        cfg.d_model = 544;
        cfg.n_ff = 800;
        cases.push((cfg, quant, "rows of 544 and 800 values"));
    }
    let mut cfg = synth_cfg(GgmlType::Q4_0);
    cfg.preset = "wgpu-long-rows";
    cfg.d_model = 256;
    cfg.n_ff = 8448;
    cases.push((cfg, GgmlType::Q4_0, "rows of 8,448 values"));
    for (cfg, quant, what) in cases {
        let mut model = synth_model(&cfg, quant, &dir);
        model.set_precision(Precision::Q8);
        let model = leak(model);
        let wm = leak(WgpuModel::new(model, dev).unwrap());
        assert_eq!(wm.precision(), Precision::Q8);
        engine_vs_with(
            &format!("synthetic {quant} q8, {what}"),
            model,
            wm,
            6,
            0.025,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Head dims of 128 and 256 (several output dims per attention thread) and a grouped-query
/// ratio of 4, through the K-quant and Q8_0 kernels.
fn engine_synthetic_gemma_shape(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    for (quant, n_head) in [(GgmlType::Q4_K, 4), (GgmlType::Q8_0, 2)] {
        let mut cfg = synth_cfg(quant);
        cfg.preset = if n_head == 4 {
            "wgpu-hd128"
        } else {
            "wgpu-hd256"
        };
        cfg.n_head = n_head;
        cfg.n_kv_head = 1;
        let model = leak(synth_model(&cfg, quant, &dir));
        let name = format!("synthetic {quant}, head_dim {}", 512 / n_head);
        engine_vs(&name, model, dev, 4, 1e-5);
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// SmolLM2-135M-Instruct Q4_1: the engine scenario against the CPU engine (exact mode), and
/// the perplexity of a text against the CPU session's (`perplexity_vs_cpu`).
fn engine_smollm2(dev: &WgpuDevice) -> Option<String> {
    let Some(path) = cached_model("SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432) else {
        return Some("SmolLM2-135M-Instruct.Q4_1.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    model.set_precision(Precision::Exact);
    // lavapipe measured 1.8e-6 of the range; 1e-3 leaves room for a GPU's exp and tanh
    // (the CUDA engine test allows 2e-2 with its f16 KV cache). Few tokens: lavapipe runs
    // 135M parameters on the CPU.
    let model = leak(model);
    let (d, same) = engine_vs("SmolLM2 exact", model, dev, 4, 1e-3);
    assert!(
        same >= 5,
        "SmolLM2: {same}/6 requests with all tokens as the CPU's (max diff {d:.2e})"
    );
    perplexity_vs_cpu("SmolLM2", model, dev);
    None
}

/// Perplexity of the first 128 tokens of a text (`fixtures/genesis_1.txt`) on wgpu within 1%
/// of the CPU session's, the model in its current precision on both.
fn perplexity_vs_cpu(name: &str, model: &'static Model, dev: &WgpuDevice) {
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/genesis_1.txt"),
    )
    .unwrap();
    let mut ids = tok.encode(&text, true).unwrap();
    ids.truncate(128);
    let wm = WgpuModel::new(model, dev).unwrap();
    let mut g = Session::wgpu(&wm, ids.len()).unwrap();
    let mut c = Session::new(model, ids.len()).unwrap();
    let gp = mean_nll(&mut g, &ids).unwrap().0.exp();
    let cp = mean_nll(&mut c, &ids).unwrap().0.exp();
    println!(
        "{name}: perplexity over {} tokens: wgpu {gp:.4}, CPU {cp:.4}",
        ids.len()
    );
    assert!(
        (gp / cp - 1.0).abs() < 0.01,
        "{name}: perplexity wgpu {gp} against the CPU's {cp}"
    );
}

/// Gemma-3 270M Q4_K_M (F32, Q5_0, Q8_0, Q4_K, Q6_K weights; head norms, post norms,
/// sliding-window local layers, GELU-tanh): its 178 MB embedding exceeds lavapipe's 128 MiB
/// storage binding, so it also runs the split-by-rows path there.
fn engine_gemma3(dev: &WgpuDevice) -> Option<String> {
    let Some(path) = cached_model("gemma-3-270m-q4_k_m.gguf", 253_113_024) else {
        return Some("gemma-3-270m-q4_k_m.gguf is not in the model cache".into());
    };
    let mut model = Model::load(&path).unwrap();
    model.set_precision(Precision::Exact);
    // lavapipe measured 5.5e-6 of the range (see SmolLM2 for the tolerance).
    let model = leak(model);
    let (d, same) = engine_vs("Gemma3 exact", model, dev, 3, 1e-3);
    assert!(
        same >= 4,
        "Gemma3: {same}/6 requests with all tokens as the CPU's (max diff {d:.2e})"
    );
    perplexity_vs_cpu("Gemma3", model, dev);
    None
}

/// The products read f16 scales with `unpack2x16float` where the adapter has it and with bit
/// operations elsewhere; both are exact, so a prompt's logits and a decode step's are the same
/// bit for bit either way (Q4_0: f16 d; Q4_K: f16 d and dmin; F16 weights).
fn f16_unpack(dev: &WgpuDevice) -> Option<String> {
    if !dev.f16_in_f32() {
        return Some("the adapter has no unpack2x16float (SHADER_F16_IN_F32)".into());
    }
    let dir = tmp_dir();
    for quant in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16] {
        let model = leak(synth_model(&synth_cfg(quant), quant, &dir));
        let p = prompt(12, 5, model.cfg.vocab);
        let run = |unpack: bool| {
            dev.use_f16_in_f32(unpack);
            let wm = WgpuModel::new(model, dev).unwrap();
            let mut s = Session::wgpu(&wm, 64).unwrap();
            let mut l = s.forward(&p, Logits::Last).unwrap().to_vec();
            l.extend_from_slice(s.forward(&[7], Logits::Last).unwrap());
            l
        };
        let (bits, unpack) = (run(false), run(true));
        dev.use_f16_in_f32(true);
        assert!(dev.f16_in_f32());
        assert!(bits.iter().all(|v| v.is_finite()), "{quant:?}");
        assert_eq!(
            bits, unpack,
            "{quant:?}: logits with unpack2x16float and with bit operations"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Chained decode (`PREV_TOKEN`: step n + 1 submitted before the host reads step n's pick)
/// against one token at a time: the same tokens, text, stop reason and session position over
/// two turns, greedy and with a stop string from the middle of the greedy text (steps queued
/// past the stop are dropped). A chained step where chaining is off is refused.
fn chained_generation(dev: &WgpuDevice) -> Option<String> {
    use ferrite_llm::generate::{generate, Generation, StopReason};
    use ferrite_llm::tokenizer::Tokenizer;
    let (dir, model, wm) = q4_0_model(dev);
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let p: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 1000).collect();
    let run = |chain: bool, stops: &[String]| -> Vec<(Generation, usize)> {
        let mut s = Session::wgpu(wm, 96).unwrap();
        s.kernels_mut().set_chain(chain);
        assert_eq!(s.chains(), chain);
        (0..2)
            .map(|turn| {
                let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
                let g = generate(
                    &mut s,
                    &tok,
                    &mut sampler,
                    &p[turn..],
                    24,
                    stops,
                    &mut |_| {},
                )
                .unwrap();
                (g, s.pos())
            })
            .collect()
    };
    let greedy = run(false, &[]);
    let text = &greedy[0].0.text;
    let stop: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(3)
        .collect();
    for stops in [vec![], vec![stop.clone()]] {
        let (a, b) = (run(false, &stops), run(true, &stops));
        for ((ga, pa), (gb, pb)) in a.iter().zip(&b) {
            assert_eq!(gb.tokens, ga.tokens, "tokens (stops {stops:?})");
            assert_eq!(gb.text, ga.text);
            assert_eq!(gb.stop, ga.stop);
            assert_eq!(pb, pa, "session position after the generation");
        }
        if !stops.is_empty() {
            assert_eq!(b[0].0.stop, StopReason::StopString, "{stop:?} in {text:?}");
        }
    }
    let mut s = Session::wgpu(wm, 96).unwrap();
    s.kernels_mut().set_chain(false);
    s.forward_pick(&p).unwrap();
    s.forward_chained()
        .expect_err("a chained step where chaining is off");
    let mut s = Session::wgpu(wm, 96).unwrap();
    s.forward_queue(&p).unwrap();
    s.forward_chained().unwrap();
    let picks = [s.take_pick().unwrap(), s.take_pick().unwrap()];
    let e = s.take_pick().expect_err("no pick left to read");
    assert!(e.to_string().contains("no queued token read"), "{e}");
    let n = greedy[0].0.tokens.len().min(2);
    assert_eq!(picks[..n], greedy[0].0.tokens[..n], "two chained picks");
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// `FERRITE_WGPU_PROFILE`'s timing (`enable_profile`): a prompt chunk and a decode step of
/// a session, each kernel named in the report with its dispatches per step; the logits equal
/// those of a session without the profile bit for bit. Skipped where the adapter has no
/// timestamps inside passes (the error says so).
fn profile_kernels(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    let cfg = synth_cfg(GgmlType::Q4_0);
    let model = leak(synth_model(&cfg, GgmlType::Q4_0, &dir));
    let wm = leak(WgpuModel::new(model, dev).unwrap());
    let p = prompt(12, 3, model.cfg.vocab);
    let run = |profile: bool| {
        let mut s = Session::wgpu(wm, 64).unwrap();
        if profile {
            s.kernels_mut().enable_profile()?;
        }
        let mut logits = s.forward(&p, Logits::Last).unwrap().to_vec();
        logits.extend_from_slice(s.forward(&[5], Logits::Last).unwrap());
        Ok::<_, ferrite_llm::Error>((logits, s.kernels_mut().profile_report()))
    };
    let (plain, none) = run(false).unwrap();
    assert!(none.is_none(), "no report without the profile");
    let (timed, report) = match run(true) {
        Ok(v) => v,
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("no timestamp queries inside compute passes"),
                "{msg}"
            );
            return Some(msg);
        }
    };
    assert_eq!(plain, timed, "profiling changes no logit");
    let report = report.expect("a report after two steps");
    assert!(report.contains("2 steps"), "{report}");
    let layers = cfg.n_layer as f64;
    for (kernel, per_step) in [
        // Averaged over the two steps: the 12-row prompt step's four products per layer at
        // 8 rows, its logit row at 1; the decode step's products at 1. q|k|v and gate/up
        // have the norm folded in; the only norm launch left is each step's output norm.
        // Rows of 512 and 768 values: Q4_0 regrouped by eight blocks (q4_0x8).
        ("norm+matvec q4_0x8 x8", layers),
        ("matvec q4_0x8 x8", layers),
        ("norm+matvec q4_0x8 x1", layers),
        ("matvec q4_0x8 x1", layers + 1.0),
        ("attention", layers),
        ("rms_norm", 1.0),
        ("argmax", 1.0),
        ("embed q4_0x8", 1.0),
    ] {
        let row = format!("| {kernel} | {per_step:.1} | ");
        assert!(report.contains(&row), "{row:?} missing in\n{report}");
    }
    None
}

/// Rows of more than 256 keys split their attention over workgroups (1, 2 and 3 splits in a
/// 600-token prompt) and merge the partial results: every row's logits against the CPU
/// session in exact mode, then three greedy decode steps; and the same prompt fed in other
/// chunks (so each row meets other batches) gives the same logits bit for bit. Then the same
/// in the q8 precision (the normed products' 1 / rms from the quantization's block sums of
/// squares at every row count), against the CPU's q8 mode within the q8 tests' tolerance.
fn long_context(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    let mut cfg = synth_cfg(GgmlType::Q8_0);
    cfg.preset = "wgpu-long";
    cfg.ctx = 1024;
    let model = leak(synth_model(&cfg, GgmlType::Q8_0, &dir));
    let wm = leak(WgpuModel::new(model, dev).unwrap());
    long_prompt("exact", model, wm, 1e-5);
    let mut q8 = synth_model(&cfg, GgmlType::Q8_0, &dir);
    q8.set_precision(Precision::Q8);
    let q8 = leak(q8);
    let wq = leak(WgpuModel::new(q8, dev).unwrap());
    assert_eq!(wq.precision(), Precision::Q8);
    long_prompt("q8", q8, wq, 0.025);
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// `long_context`'s checks for one model: logits within `tol` of the range of the CPU's.
fn long_prompt(name: &str, model: &'static Model, wm: &'static WgpuModel, tol: f32) {
    let vocab = model.cfg.vocab;
    let p = prompt(600, 9, vocab);
    let mut g = Session::wgpu(wm, 700).unwrap();
    let mut c = Session::new(model, 700).unwrap();
    let mut gl = g.forward(&p, Logits::All).unwrap().to_vec();
    let mut cl = c.forward(&p, Logits::All).unwrap().to_vec();
    let mut tok = 0u32;
    for _ in 0..3 {
        let last = &cl[cl.len() - vocab..];
        tok = (0..vocab)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        gl.extend_from_slice(g.forward(&[tok], Logits::Last).unwrap());
        cl.extend_from_slice(c.forward(&[tok], Logits::Last).unwrap());
    }
    let range = cl.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = gl
        .iter()
        .zip(&cl)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    println!(
        "{name}: 600-token prompt + 3 steps: wgpu vs CPU logits within {:.2e} of the range",
        d / range
    );
    assert!(d <= tol * range, "{name}: wgpu vs CPU: {d} of {range}");
    let mut h = Session::wgpu(wm, 700).unwrap();
    let mut hl = Vec::new();
    for chunk in [&p[..37], &p[37..300], &p[300..]] {
        hl.extend_from_slice(h.forward(chunk, Logits::All).unwrap());
    }
    hl.extend_from_slice(h.forward(&[tok], Logits::Last).unwrap());
    assert!(
        hl[..600 * vocab] == gl[..600 * vocab],
        "{name}: prompt logits depend on the chunking"
    );
}

/// Cancelling frees a request's blocks at once; the other requests go on with the tokens
/// they have alone.
fn engine_cancel(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = leak(synth_model(
        &synth_cfg(GgmlType::Q8_0),
        GgmlType::Q8_0,
        &dir,
    ));
    let wm = leak(WgpuModel::new(model, dev).unwrap());
    let vocab = model.cfg.vocab;
    let mut e = Engine::wgpu(wm, engine_cfg()).unwrap();
    let long = e
        .add_request(Request::greedy(prompt(40, 5, vocab), 20))
        .unwrap();
    let short_prompt = prompt(7, 6, vocab);
    let short = e
        .add_request(Request::greedy(short_prompt.clone(), 6))
        .unwrap();
    let mut runs = HashMap::new();
    for _ in 0..3 {
        for o in e.step().unwrap() {
            runs.entry(o.id).or_insert_with(Vec::new).extend(o.token);
        }
    }
    let used = e.stats().kv.blocks_used;
    assert!(e.cancel(long));
    assert!(!e.cancel(long), "a cancelled id is a no-op");
    assert!(
        e.stats().kv.blocks_used < used,
        "cancel frees blocks at once"
    );
    while e.has_work() {
        for o in e.step().unwrap() {
            runs.entry(o.id).or_insert_with(Vec::new).extend(o.token);
        }
    }
    let mut alone = Engine::wgpu(wm, engine_cfg()).unwrap();
    let id = alone.add_request(Request::greedy(short_prompt, 6)).unwrap();
    let mut want = Vec::new();
    while alone.has_work() {
        for o in alone.step().unwrap() {
            assert_eq!(o.id, id);
            want.extend(o.token);
        }
    }
    assert_eq!(runs[&short], want, "the other request's tokens");
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// A KV cache larger than the adapter's largest storage binding is refused before any
/// allocation, naming both sizes.
fn kv_over_limit(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = leak(synth_model(
        &synth_cfg(GgmlType::Q8_0),
        GgmlType::Q8_0,
        &dir,
    ));
    let wm = WgpuModel::new(model, dev).unwrap();
    let c = &model.cfg;
    let block = c.n_layer * c.n_kv_head * BLOCK_SIZE * c.head_dim * 4;
    let limit = dev.limits().max_storage_buffer_binding_size as usize;
    let n = limit / block + 1;
    let e = match WgpuKvStore::new(&wm, n) {
        Ok(_) => panic!("{n} blocks of {block} bytes were accepted (limit {limit})"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(&format!("{n} blocks of {block} bytes"))
            && e.contains("largest storage binding"),
        "{e}"
    );
    assert!(WgpuKvStore::new(&wm, 4).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Every matrix split by rows over bindings of at most 64 KiB (as Gemma-3's embedding is on
/// lavapipe's 128 MiB binding): the embedding lookup and every product (the untied Q4_1
/// output, stacked q|k|v, gate/up pairs split at even rows) run once per piece; the logits
/// equal the unsplit run's bit for bit and the CPU's within the synthetic tolerance.
fn weights_split(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    let quant = GgmlType::Q4_1;
    let model = leak(synth_model(&synth_cfg(quant), quant, &dir));
    let split = leak(WgpuModel::load(model, dev, true, Some(64 << 10)).unwrap());
    let (d, _) = engine_vs_with("synthetic Q4_1 split by 64 KiB", model, split, 4, 1e-5);
    let whole = leak(WgpuModel::new(model, dev).unwrap());
    let vocab = model.cfg.vocab;
    let a = run_scenario(
        &mut || Engine::wgpu(split, engine_cfg()).unwrap(),
        vocab,
        4,
        false,
    );
    let b = run_scenario(
        &mut || Engine::wgpu(whole, engine_cfg()).unwrap(),
        vocab,
        4,
        false,
    );
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            x, y,
            "request {i}: split weights differ from whole ones (CPU diff {d:.2e})"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// A weight row larger than the largest binding is refused before any upload, naming the
/// tensor, the row's size and the limit.
fn weight_row_over_limit(dev: &WgpuDevice) -> Option<String> {
    let dir = tmp_dir();
    let model = leak(synth_model(
        &synth_cfg(GgmlType::Q8_0),
        GgmlType::Q8_0,
        &dir,
    ));
    let e = match WgpuModel::load(model, dev, true, Some(256)) {
        Ok(_) => panic!("a 256-byte binding was accepted for rows of 544 bytes"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("tensor token_embd.weight: one row takes 544 bytes")
            && e.contains("largest storage binding (256 bytes)"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    None
}

// ---- The device sampler (ferrite-wgpu's `llm/sample.wgsl`) ----

fn argmax(v: &[f32]) -> u32 {
    ferrite_llm::generate::argmax(v)
}

/// The bound on max |freq - p| over a vocabulary for `draws` draws: 4.5 times the largest
/// binomial standard deviation of a frequency, sqrt(p (1 - p) / draws) <= 0.5 / sqrt(draws)
/// (40,000 draws: 0.01125; 4,000: 0.0356).
fn freq_tol(draws: usize) -> f64 {
    4.5 * 0.5 / (draws as f64).sqrt()
}

/// Draws `draws` tokens with the device sampler (`sample_many`) and checks them against the
/// CPU sampler's probabilities within `freq_tol` (`sampler_support::check_draws`). Returns the
/// max |freq - p| on the device.
fn check_sampler(
    dev: &WgpuDevice,
    name: &str,
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    draws: usize,
) -> f64 {
    let ids = ferrite_llm::model::wgpu::sample_many(dev, cfg, logits, history, draws).unwrap();
    assert_eq!(ids.len(), draws, "{name}: tokens drawn");
    check_draws("device", name, cfg, logits, history, &ids, freq_tol(draws))
}

/// The device sampler's empirical distribution against the CPU sampler's probabilities for
/// each setting (temperature alone, the defaults, top-k, top-p, min-p, all three, penalties
/// over a history; a 49,152-token vocabulary as SmolLM2's), top-k 1 on a tie (the lowest
/// id), and penalties that move the argmax at temperature 0 and at top-k 1 (the CPU's pick).
fn sampler_distribution(dev: &WgpuDevice) -> Option<String> {
    let mut rng = Rng(11);
    let vocab = 64;
    let logits: Vec<f32> = rng.vec(vocab).iter().map(|v| v * 3.0).collect();
    let raw_top = argmax(&logits);
    let base = SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        penalty_last_n: 64,
        seed: 5,
    };
    let history: Vec<u32> = vec![raw_top, 3, 9, raw_top, 17, 3, raw_top, 40];
    let sets: Vec<(&str, SamplerConfig)> = vec![
        (
            "full softmax t=0.8",
            SamplerConfig {
                temperature: 0.8,
                ..base.clone()
            },
        ),
        (
            "defaults (t 0.8, k 40, p 0.95, min-p 0.05)",
            SamplerConfig {
                seed: 5,
                ..SamplerConfig::default()
            },
        ),
        (
            "top-k 5, t 1.5",
            SamplerConfig {
                temperature: 1.5,
                top_k: 5,
                ..base.clone()
            },
        ),
        (
            "top-p 0.5",
            SamplerConfig {
                top_p: 0.5,
                ..base.clone()
            },
        ),
        (
            "min-p 0.2",
            SamplerConfig {
                min_p: 0.2,
                ..base.clone()
            },
        ),
        (
            "top-k 10 + top-p 0.8 + min-p 0.1",
            SamplerConfig {
                top_k: 10,
                top_p: 0.8,
                min_p: 0.1,
                ..base.clone()
            },
        ),
        (
            "penalties (repeat 1.5, presence 0.5, frequency 0.3, last 6), t 0.7",
            SamplerConfig {
                temperature: 0.7,
                repeat_penalty: 1.5,
                presence_penalty: 0.5,
                frequency_penalty: 0.3,
                penalty_last_n: 6,
                ..base.clone()
            },
        ),
    ];
    let mut worst = 0f64;
    for (name, cfg) in &sets {
        worst = worst.max(check_sampler(dev, name, cfg, &logits, &history, 40_000));
    }
    // top-k 1 is the argmax (lowest id on ties).
    let mut tied = logits.clone();
    tied[50] = tied[raw_top as usize];
    let lo = raw_top.min(50);
    let k1 = SamplerConfig {
        top_k: 1,
        ..base.clone()
    };
    let ids = ferrite_llm::model::wgpu::sample_many(dev, &k1, &tied, &[], 200).unwrap();
    assert!(
        ids.iter().all(|&t| t == lo),
        "top-k 1: {ids:?} (argmax {lo})"
    );
    // Penalties that move the argmax, sampled at top-k 1 (the greedy ones: `greedy_penalties`).
    let pen_k1 = SamplerConfig {
        top_k: 1,
        repeat_penalty: 3.0,
        presence_penalty: 2.0,
        ..base.clone()
    };
    let want = argmax(&penalized(&pen_k1, &logits, &history));
    assert_ne!(want, raw_top, "the penalties should move the argmax");
    let ids = ferrite_llm::model::wgpu::sample_many(dev, &pen_k1, &logits, &history, 50).unwrap();
    assert!(
        ids.iter().all(|&t| t == want),
        "top-k 1 with penalties: {ids:?}, CPU {want}"
    );
    // A SmolLM2-sized vocabulary (radix passes over many keys, large kept sets).
    let big: Vec<f32> = rng.vec(49_152).iter().map(|v| v * 4.0).collect();
    let bh: Vec<u32> = (0..64).map(|i| (i * 769) % 49_152).collect();
    for (name, cfg) in [
        (
            "49152: defaults",
            SamplerConfig {
                seed: 9,
                ..SamplerConfig::default()
            },
        ),
        (
            "49152: top-p 0.9 alone (large kept set)",
            SamplerConfig {
                top_p: 0.9,
                ..base.clone()
            },
        ),
        (
            "49152: top-k 200, min-p 0.3, penalties",
            SamplerConfig {
                top_k: 200,
                min_p: 0.3,
                repeat_penalty: 1.3,
                frequency_penalty: 0.2,
                ..base.clone()
            },
        ),
    ] {
        // The large kept set's probabilities are all under 1e-3: fewer draws test its cut.
        let draws = if cfg.top_p == 0.9 { 1_000 } else { 4_000 };
        worst = worst.max(check_sampler(dev, name, &cfg, &big, &bh, draws));
    }
    eprintln!("device sampler: worst max |freq - p| {worst:.4}");
    None
}

/// Same seed, same tokens; another seed, other tokens; `sample_once` at draw counter i is
/// draw i of `sample_many` (the draw depends on the seed and the counter alone); workgroups
/// of 256 and of 1024 threads draw the same tokens (every sum is exact), on 1,000 and on
/// 49,152 logits.
fn sampler_seed(dev: &WgpuDevice) -> Option<String> {
    use ferrite_llm::model::wgpu::{sample_many, sample_many_threads, sample_once};
    let logits: Vec<f32> = Rng(3).vec(1000).iter().map(|v| v * 2.0).collect();
    let cfg = SamplerConfig {
        seed: 42,
        ..SamplerConfig::default()
    };
    let h = [1, 2, 3];
    let a = sample_many(dev, &cfg, &logits, &h, 300).unwrap();
    let b = sample_many(dev, &cfg, &logits, &h, 300).unwrap();
    assert_eq!(a, b, "same seed, different tokens");
    let other = SamplerConfig {
        seed: 43,
        ..cfg.clone()
    };
    let c = sample_many(dev, &other, &logits, &h, 300).unwrap();
    assert_ne!(a, c, "another seed, the same 300 tokens");
    let distinct = a.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert!(distinct > 5, "300 draws gave {distinct} distinct tokens");
    for i in [0usize, 7, 299] {
        let t = sample_once(dev, &cfg, &logits, &h, i as u64).unwrap();
        assert_eq!(t, a[i], "draw {i} alone");
    }
    let big: Vec<f32> = Rng(5).vec(49_152).iter().map(|v| v * 4.0).collect();
    let bh: Vec<u32> = (0..64).map(|i| (i * 769) % 49_152).collect();
    let wide = SamplerConfig {
        top_k: 0,
        top_p: 0.9,
        repeat_penalty: 1.3,
        ..cfg.clone()
    };
    let limits = dev.limits();
    for (name, cfg, l, hist, draws) in [
        ("1000 logits, defaults", &cfg, &logits, &h[..], 300),
        (
            "49152 logits, top-p 0.9, penalties",
            &wide,
            &big,
            &bh[..],
            100,
        ),
    ] {
        let small = sample_many_threads(dev, cfg, l, hist, draws, 256).unwrap();
        if limits.max_compute_invocations_per_workgroup < 1024 {
            continue;
        }
        let large = sample_many_threads(dev, cfg, l, hist, draws, 1024).unwrap();
        assert_eq!(small, large, "{name}: 256 against 1024 threads");
    }
    if limits.max_compute_invocations_per_workgroup < 1024 {
        eprintln!("  this adapter has no workgroups of 1024: 256 threads only");
    }
    None
}

/// Settings that spread the draws of a random-weight model: temperature 1.5, top-p 0.98,
/// seed 7.
fn hot_sampler() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.5,
        top_k: 0,
        top_p: 0.98,
        min_p: 0.0,
        seed: 7,
        ..SamplerConfig::default()
    }
}

/// Sampled generation through `Session::wgpu` (`generate`: the device sampler after each
/// step): chained (`forward_chained`, `take_pick`) and unchained give the same tokens, text
/// and session position, with and without penalties; no logits are read to the host, and the
/// chained loop reads one pick per token; the same seed gives the same tokens, another seed
/// others; a presence penalty over the whole history keeps every recent token out; after the
/// sampler is removed the session picks greedily again.
fn sampled_generation(dev: &WgpuDevice) -> Option<String> {
    use ferrite_llm::generate::{generate, Generation, StopReason};
    let (dir, model, wm) = q4_0_model(dev);
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 1000).collect();
    let n = 32;
    let run = |chain: bool, cfg: &SamplerConfig| -> (Generation, usize) {
        let mut s = Session::wgpu(wm, 96).unwrap();
        s.kernels_mut().set_chain(chain);
        let mut sampler = Sampler::new(cfg.clone()).unwrap();
        sampler.set_ignore_eos(true);
        let g = generate(&mut s, &tok, &mut sampler, &prompt, n, &[], &mut |_| {}).unwrap();
        assert_eq!(g.stop, StopReason::MaxTokens);
        assert_eq!(g.tokens.len(), n);
        let k = s.kernels();
        assert_eq!(k.logit_reads(), 0, "logits read to the host ({cfg:?})");
        if chain {
            assert_eq!(
                k.pick_wait().1,
                n as u64,
                "pick reads of a chained generation"
            );
        }
        (g, s.pos())
    };
    let hot = hot_sampler();
    let penal = SamplerConfig {
        repeat_penalty: 1.3,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        penalty_last_n: 16,
        ..hot.clone()
    };
    let mut first = Vec::new();
    for cfg in [&hot, &penal] {
        let (a, pa) = run(false, cfg);
        let (b, pb) = run(true, cfg);
        assert_eq!(b.tokens, a.tokens, "chained vs unchained tokens ({cfg:?})");
        assert_eq!(b.text, a.text);
        assert_eq!(pb, pa, "session position after the generation");
        let distinct = a
            .tokens
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        assert!(
            distinct > 8,
            "sampling at t 1.5 gave {distinct} distinct tokens: {:?}",
            a.tokens
        );
        first.push(a.tokens);
    }
    assert_ne!(first[0], first[1], "the penalties changed no token");
    assert_eq!(run(true, &hot).0.tokens, first[0], "same seed");
    let reseeded = SamplerConfig {
        seed: 8,
        ..hot.clone()
    };
    assert_ne!(run(true, &reseeded).0.tokens, first[0], "another seed");
    // A strong presence penalty over the whole history: no token repeats a recent one.
    let never = SamplerConfig {
        presence_penalty: 1e4,
        penalty_last_n: 256,
        ..hot.clone()
    };
    let (d, _) = run(true, &never);
    for (i, t) in d.tokens.iter().enumerate() {
        assert!(
            !prompt.contains(t) && !d.tokens[..i].contains(t),
            "token {i} ({t}) repeats: {:?}",
            d.tokens
        );
    }
    // Back to the greedy pick once the sampler is removed.
    let mut s = Session::wgpu(wm, 96).unwrap();
    assert!(s.set_sampler(Some(&hot), &prompt, 96).unwrap());
    assert!(!s.set_sampler(None, &[], 0).unwrap());
    let g1 = ferrite_llm::generate::greedy(&mut s, &prompt, 8).unwrap();
    let mut s2 = Session::wgpu(wm, 96).unwrap();
    let g2 = ferrite_llm::generate::greedy(&mut s2, &prompt, 8).unwrap();
    assert_eq!(g1, g2, "greedy after the sampler was removed");
    eprintln!("sampled generation: {:?}", first[0]);
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Greedy (temperature 0) with penalties: the device sampler's pick is the CPU sampler's.
/// On fixed logits whose argmax the penalties move (`sample_many`); and through
/// `Session::wgpu` step by step against a session without a sampler (its logits are the same
/// bits: each row is computed alone), the CPU sampler picking from those raw logits: the same
/// token every step, and the logits the device penalized in place equal the CPU's penalized
/// ones.
fn greedy_penalties(dev: &WgpuDevice) -> Option<String> {
    let logits: Vec<f32> = Rng(11).vec(64).iter().map(|v| v * 3.0).collect();
    let raw_top = argmax(&logits);
    let history: Vec<u32> = vec![raw_top, 3, 9, raw_top, 17, 3, raw_top, 40];
    let pen = SamplerConfig {
        temperature: 0.0,
        repeat_penalty: 3.0,
        presence_penalty: 2.0,
        ..SamplerConfig::greedy()
    };
    let want = Sampler::new(pen.clone())
        .unwrap()
        .sample(&mut logits.clone(), &history)
        .unwrap();
    assert_ne!(want, raw_top, "the penalties should move the argmax");
    let ids = ferrite_llm::model::wgpu::sample_many(dev, &pen, &logits, &history, 20).unwrap();
    assert!(
        ids.iter().all(|&t| t == want),
        "greedy with penalties: {ids:?}, CPU {want}"
    );

    let (dir, _, wm) = q4_0_model(dev);
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 1000).collect();
    let cfg = SamplerConfig {
        temperature: 0.0,
        repeat_penalty: 1.5,
        presence_penalty: 0.5,
        frequency_penalty: 0.5,
        penalty_last_n: 12,
        ..SamplerConfig::greedy()
    };
    let mut raw = Session::wgpu(wm, 96).unwrap();
    let mut dev_s = Session::wgpu(wm, 96).unwrap();
    assert!(dev_s.set_sampler(Some(&cfg), &prompt, 96).unwrap());
    let mut cpu = Sampler::new(cfg.clone()).unwrap();
    let mut history = prompt.clone();
    let mut input = prompt.clone();
    let mut moved = 0;
    for step in 0..24 {
        let l = raw.forward(&input, Logits::Last).unwrap().to_vec();
        let want = cpu.sample(&mut l.clone(), &history).unwrap();
        moved += usize::from(want != argmax(&l));
        let got = dev_s.forward_pick(&input).unwrap();
        assert_eq!(
            got,
            Some(want),
            "step {step}: device pick vs the CPU sampler's"
        );
        let p = penalized(&cfg, &l, &history);
        let d = dev_s.logits().unwrap();
        for (j, (a, b)) in d.iter().zip(&p).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "step {step}, logit {j}: penalized on the device {a}, on the host {b}"
            );
        }
        history.push(want);
        input = vec![want];
    }
    assert!(moved > 0, "the penalties never moved the argmax");
    eprintln!("greedy with penalties: {moved} of 24 picks moved by the penalties");
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Passes the logits through unchanged: a request with it samples on the host.
struct HostSampling;

impl ferrite_llm::logits_processor::LogitsProcessor for HostSampling {
    fn process(&mut self, _logits: &mut [f32], _history: &[u32]) -> ferrite_llm::Result<()> {
        Ok(())
    }
    fn accept(&mut self, _token: u32) {}
}

/// Requests that sample (not greedy) draw their tokens on the device, every such row of a
/// step in one dispatch (`sample_rows`), beside greedy requests:
/// - each drawn token is the device sampler's for its row of the step's logits: `sample_once`
///   on the logits the engine kept (after the penalties, so drawn again without them), with
///   that request's seed and draw counter;
/// - the penalties start from the prompt: the first step's penalized logits equal the host
///   sampler's on the same logits (the same request with a pass-through processor samples on
///   the host), and differ from the raw ones exactly at the prompt's tokens;
/// - the tokens do not depend on reading the logits to the host, and a request drawn in a
///   batch gets the tokens it gets alone;
/// - cancelling a sampling request ends it like any other.
fn engine_device_sampling(dev: &WgpuDevice) -> Option<String> {
    let (dir, model, wm) = q4_0_model(dev);
    let vocab = model.cfg.vocab;
    let plain = SamplerConfig {
        temperature: 1.3,
        top_k: 50,
        top_p: 0.95,
        min_p: 0.0,
        repeat_penalty: 1.0,
        seed: 11,
        ..SamplerConfig::default()
    };
    let penal = SamplerConfig {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.02,
        repeat_penalty: 1.3,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        penalty_last_n: 16,
        seed: 5,
    };
    let n_new = 16;
    let reqs = [
        (prompt(12, 1, vocab), SamplerConfig::greedy()),
        (prompt(30, 2, vocab), plain.clone()),
        (prompt(7, 3, vocab), penal.clone()),
        (prompt(7, 3, vocab), SamplerConfig::greedy()),
    ];
    let request = |k: usize| Request {
        sampling: reqs[k].1.clone(),
        ..Request::greedy(reqs[k].0.clone(), n_new)
    };
    // (requests to add, keep the logits, index of a request sampled on the host)
    let run = |which: &[usize], keep: bool, host: Option<usize>| -> Vec<Run> {
        let mut e = Engine::wgpu(wm, engine_cfg()).unwrap();
        e.set_keep_logits(keep);
        let ids: Vec<RequestId> = which
            .iter()
            .map(|&k| {
                let p: Option<Box<dyn ferrite_llm::logits_processor::LogitsProcessor>> =
                    (host == Some(k)).then(|| Box::new(HostSampling) as _);
                e.add_request_with(request(k), p).unwrap()
            })
            .collect();
        let mut runs: HashMap<RequestId, Run> = HashMap::new();
        while e.has_work() {
            for o in e.step().unwrap() {
                let r = runs.entry(o.id).or_default();
                if keep {
                    r.1.push(e.last_logits(o.id).unwrap().to_vec());
                }
                r.0.extend(o.token);
            }
        }
        ids.iter().map(|id| runs.remove(id).unwrap()).collect()
    };
    let kept = run(&[0, 1, 2], true, None);
    let unread = run(&[0, 1, 2], false, None);
    for k in 0..3 {
        assert_eq!(
            kept[k].0.len(),
            n_new,
            "request {k}: {} tokens",
            kept[k].0.len()
        );
        assert_eq!(
            kept[k].0, unread[k].0,
            "request {k}: its tokens depend on reading the logits"
        );
    }
    for (i, (t, l)) in kept[0].0.iter().zip(&kept[0].1).enumerate() {
        assert_eq!(*t, argmax(l), "greedy request, token {i}");
    }
    for (k, cfg) in [(1usize, &plain), (2, &penal)] {
        let nopen = SamplerConfig {
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            ..cfg.clone()
        };
        for (i, (t, l)) in kept[k].0.iter().zip(&kept[k].1).enumerate() {
            let want =
                ferrite_llm::model::wgpu::sample_once(dev, &nopen, l, &[], i as u64).unwrap();
            assert_eq!(
                *t, want,
                "request {k}, token {i}: not the device sampler's draw"
            );
        }
        let distinct: std::collections::HashSet<_> = kept[k].0.iter().collect();
        assert!(distinct.len() > 3, "request {k} drew {:?}", kept[k].0);
    }
    // The penalized request's first logits, penalized on the device and on the host, and
    // unpenalized (request 3: its prompt, greedy; a row's logits do not depend on the batch).
    let host = run(&[0, 1, 2], true, Some(2));
    let raw = run(&[3], true, None);
    let (d, h, r) = (&kept[2].1[0], &host[2].1[0], &raw[0].1[0]);
    for (j, (a, b)) in d.iter().zip(h).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "logit {j}: device penalty {a}, host {b}"
        );
        let recent = reqs[2].0.contains(&(j as u32));
        assert_eq!(a != &r[j], recent, "logit {j}: penalized {a}, raw {}", r[j]);
    }
    let alone2 = run(&[2], false, None);
    assert_eq!(alone2[0].0, kept[2].0, "request 2 alone draws other tokens");
    let alone = run(&[1], false, None);
    assert_eq!(alone[0].0, kept[1].0, "request 1 alone draws other tokens");
    // Cancelling a request that samples on the device.
    let mut e = Engine::wgpu(wm, engine_cfg()).unwrap();
    let a = e.add_request(request(1)).unwrap();
    let b = e.add_request(request(2)).unwrap();
    for _ in 0..5 {
        e.step().unwrap();
    }
    assert!(e.cancel(a));
    let rest = e.run_to_end().unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].0, b);
    assert_eq!(e.stats().kv.blocks_used, 0);
    let _ = std::fs::remove_dir_all(&dir);
    None
}

/// Device sampler states stay whole when the kernel set repacks them into a larger buffer
/// (sixteen states of 216 words added, five removed: the buffer is repacked twice): each
/// live sampler's first two draws on a step's logits are `sample_once`'s for its settings,
/// history and draw counters 0 and 1 (the second with the first token appended to the
/// history: the ring and the counter advanced on the device).
fn sampler_states_repack(dev: &WgpuDevice) -> Option<String> {
    let (dir, model, wm) = q4_0_model(dev);
    let vocab = model.cfg.vocab;
    let p = prompt(10, 9, vocab);
    let cfg = |id: u64| SamplerConfig {
        temperature: 1.2,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        presence_penalty: 3.0,
        frequency_penalty: 0.5,
        penalty_last_n: 200,
        seed: 100 + id,
        ..SamplerConfig::default()
    };
    let hist = |id: u64| prompt(20 + id as usize, 20 + id as usize, vocab);
    let mut s = Session::wgpu(wm, 96).unwrap();
    let mut live = Vec::new();
    for id in 1..=16u64 {
        s.kernels_mut()
            .add_sampler(id, &cfg(id), &hist(id), 200)
            .unwrap();
        live.push(id);
        if id % 3 == 0 {
            let gone = live.remove(0);
            s.kernels_mut().remove_sampler(gone);
        }
    }
    for &id in &live {
        let mut h = hist(id);
        for step in 0..2u64 {
            s.truncate(0);
            let l = s.forward(&p, Logits::Last).unwrap().to_vec();
            s.kernels_mut().sample_rows(&[(0, id)]).unwrap();
            let got = s.kernels().read_tokens().unwrap()[0];
            let want = ferrite_llm::model::wgpu::sample_once(dev, &cfg(id), &l, &h, step).unwrap();
            assert_eq!(got, want, "sampler {id}, draw {step}");
            h.push(got);
        }
    }
    let e = s.kernels_mut().sample_rows(&[(0, 1)]).unwrap_err();
    assert!(
        e.to_string().contains("request 1 has no device sampler"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    None
}
