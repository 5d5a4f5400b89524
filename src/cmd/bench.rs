//! `ferrite bench [-m FILE] [-p 512] [-n 128] [-r 5] [--json]`: prompt processing (pp) and
//! text generation (tg) speed, mean ± sd over repetitions after one warm-up, like
//! llama-bench. pp runs `-p` tokens as one batch into an empty cache; tg generates `-n`
//! tokens one at a time from an empty cache. With `--device cuda` (the default where a CUDA
//! device is present) both run on the GPU: pp as the batched prefill (chunks of up to 512
//! tokens on tensor-core products and the flash attention; two warm-ups, as a prompt from
//! position 0 is replayed from its bucket's graph from the third time it is seen), tg as
//! decode steps each returning its greedy token; the report adds the decode bandwidth, weight
//! bytes read per token x tok/s. `--batch B` runs B sequences through the
//! engine at once (on the CPU or, with `--device cuda`, the CUDA kernel set of the same model
//! definition) and reports aggregate and per-sequence speeds. On a wgpu adapter (`--device
//! wgpu|vulkan|metal|dx12`) one sequence runs as `ferrite run` runs it (a session on the wgpu
//! kernel set, decode chained), `--batch B` through the engine's wgpu kernel set.

use ferrite_llm::gpu::{CudaDevice, GpuModel};
use ferrite_llm::{Logits, Session};

use super::llm_args::{DeviceArgs, Loaded, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Prompt tokens (0 skips the pp test).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512, value_parser = super::values::usize_any, allow_negative_numbers = true)]
    pub p: usize,
    /// Generated tokens (0 skips the tg test).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, value_parser = super::values::usize_any, allow_negative_numbers = true)]
    pub n: usize,
    /// Repetitions.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_parser = super::values::u32_positive, allow_negative_numbers = true)]
    pub r: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Sequences decoded together through the engine (CPU, CUDA or wgpu): each gets a `-p`-token
    /// prompt and generates `-n` tokens; reports aggregate and per-sequence decode tok/s and pp.
    #[arg(long, value_parser = super::values::one_to_256, allow_negative_numbers = true)]
    pub batch: Option<u32>,
    /// With --batch: the sequences sample at this temperature (top-k 40, top-p 0.95, min-p
    /// 0.05, a seed per sequence) instead of greedy; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.0, value_parser = super::llm_args::parse_temp)]
    pub temp: f32,
}

const MIB: f64 = 1024.0 * 1024.0;

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.p == 0 && args.n == 0 {
        anyhow::bail!("nothing to measure: -p and -n are both 0");
    }
    let wgpu = args.device.wgpu()?;
    let cuda = match wgpu {
        Some(_) => None,
        None => args.device.cuda()?,
    };
    let loaded = args.model.load()?;
    let model = &loaded.model;
    let vocab = model.cfg.vocab;
    let tests = args.p.max(args.n).max(1);
    if tests > model.cfg.ctx_train {
        anyhow::bail!(
            "{tests} tokens exceed the model's context length {}",
            model.cfg.ctx_train
        );
    }
    // The KV cache holds the longest test, or `--ctx` positions if given (at least the test).
    let need = match args.model.ctx {
        Some(_) => {
            let c = args.model.ctx(model)?;
            if c < tests {
                anyhow::bail!(
                    "--ctx-size {c} is smaller than the longest test ({tests} tokens: -p {}, -n {})",
                    args.p,
                    args.n
                );
            }
            c
        }
        None => tests,
    };
    // Deterministic token ids spread over the vocabulary.
    let tokens: Vec<u32> = (0..need)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    let on = match (&wgpu, &cuda) {
        (Some(dev), _) => BenchDevice::Wgpu(dev),
        (None, Some(dev)) => BenchDevice::Cuda(dev),
        (None, None) => BenchDevice::Cpu,
    };
    if let Some(b) = args.batch {
        return run_batch(&args, &loaded, b as usize, on);
    }
    if args.temp > 0.0 {
        anyhow::bail!(
            "--temp {} samples through the engine: give --batch too (--batch 1 for one sequence)",
            args.temp
        );
    }
    if let Some(dev) = &wgpu {
        return run_wgpu(&args, &loaded, dev, need, &tokens);
    }
    if let Some(dev) = cuda {
        return run_cuda(&args, &loaded, &dev, need, &tokens);
    }
    let mut session = Session::new(model, need)?;
    let threads = ferrite_cpu::spin_pool::Pool::global().threads();
    let mut results = Vec::new();
    for (name, count) in [("pp", args.p), ("tg", args.n)] {
        if count == 0 {
            continue;
        }
        let mut speeds = Vec::new();
        for rep in 0..=args.r {
            session.truncate(0);
            let t0 = std::time::Instant::now();
            if name == "pp" {
                session.forward(&tokens[..count], Logits::Last)?;
            } else {
                for &t in &tokens[..count] {
                    session.forward(&[t], Logits::Last)?;
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            if rep > 0 {
                speeds.push(count as f64 / secs);
            }
        }
        let (mean, sd) = mean_sd(&speeds);
        results.push((format!("{name}{count}"), mean, sd, speeds));
    }
    let name = loaded.path.file_name().map_or_else(
        || loaded.path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let size_mib = model.gguf().file_size() as f64 / (1024.0 * 1024.0);
    if args.json {
        let tests: Vec<_> = results.iter().map(|r| test_json(r, &args)).collect();
        let out = serde_json::json!({
            "model": loaded.path, "model_file": name, "size_mib": size_mib,
            "arch": model.cfg.arch_name, "backend": "cpu",
            "device": format!("CPU ({}, {threads} threads)", model.isa().name()),
            "threads": threads, "isa": model.isa().name(),
            "precision": model.precision().name(), "n_prompt": args.p, "n_gen": args.n,
            "ctx": need, "repetitions": args.r, "version": env!("CARGO_PKG_VERSION"),
            "results": tests,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("| model | size | backend | threads | precision | test | t/s |");
        println!("| --- | ---: | --- | ---: | --- | ---: | ---: |");
        for (t, m, s, _) in &results {
            println!(
                "| {name} | {size_mib:.2} MiB | CPU ({}) | {threads} | {} | {t} | {m:.2} ± {s:.2} |",
                model.isa().name(),
                model.precision()
            );
        }
    }
    let _ = vocab;
    Ok(())
}

fn file_name(loaded: &Loaded) -> String {
    loaded.path.file_name().map_or_else(
        || loaded.path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// One test result: name (`pp512`), mean and sd tok/s, each repetition's tok/s.
type TestResult = (String, f64, f64, Vec<f64>);

/// A test result as `--json` prints it.
fn test_json((t, m, s, v): &TestResult, args: &Args) -> serde_json::Value {
    let (np, ng) = test_sizes(t, args);
    serde_json::json!({"test": t, "n_prompt": np, "n_gen": ng,
        "tok_s_mean": m, "tok_s_sd": s, "samples": v})
}

/// pp and tg of one sequence on a GPU kernel set, `-r` repetitions after a warm-up (pp: two,
/// the first compiling the kernels, the second recording the prompt's graph), each from an
/// empty cache. Each step reads back its greedy token, as generation does; decode keeps one
/// step queued ahead of the token it reads where the kernel set chains its picks
/// (`FERRITE_GPU_CHAIN=0` / `FERRITE_WGPU_CHAIN=0`: each step waits for the last one's token).
fn session_runs<K: ferrite_llm::engine::EngineKernels>(
    session: &mut Session<'_, K>,
    args: &Args,
    tokens: &[u32],
) -> anyhow::Result<Vec<TestResult>> {
    let mut results = Vec::new();
    for (name, count) in [("pp", args.p), ("tg", args.n)] {
        if count == 0 {
            continue;
        }
        let mut speeds = Vec::new();
        let warm = if name == "pp" { 2 } else { 1 };
        for rep in 0..args.r + warm {
            session.truncate(0);
            let t0 = std::time::Instant::now();
            if name == "pp" {
                session.forward_pick(&tokens[..count])?;
            } else if session.chains() {
                session.forward_queue(&tokens[..1])?;
                for _ in 1..count {
                    session.forward_chained()?;
                    session.take_pick()?;
                }
                session.take_pick()?;
            } else {
                for &t in &tokens[..count] {
                    session.forward_pick(&[t])?;
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            if rep >= warm {
                speeds.push(count as f64 / secs);
            }
        }
        let (mean, sd) = mean_sd(&speeds);
        results.push((format!("{name}{count}"), mean, sd, speeds));
    }
    Ok(results)
}

/// A GPU kernel set's activations by its precision: 8-bit (`q8`) or `f32`.
fn acts_name(p: ferrite_llm::Precision) -> &'static str {
    if p == ferrite_llm::Precision::Q8 {
        "q8"
    } else {
        "f32"
    }
}

/// pp and tg on a wgpu adapter, one sequence (`Session::wgpu`: the model definition on the
/// wgpu kernel set, decode chained as `ferrite run` runs it).
fn run_wgpu(
    args: &Args,
    loaded: &Loaded,
    dev: &ferrite_wgpu::WgpuDevice,
    need: usize,
    tokens: &[u32],
) -> anyhow::Result<()> {
    let model = &loaded.model;
    let wm = ferrite_llm::model::WgpuModel::new(model, dev)?;
    let mut session = Session::wgpu(&wm, need)?;
    let results = session_runs(&mut session, args, tokens)?;
    // Time the chained decode's token reads waited for the device, per token.
    let (wait, reads) = session.kernels().pick_wait();
    let wait_us = wait.as_secs_f64() * 1e6 / reads.max(1) as f64;
    let name = file_name(loaded);
    let device = format!("{}, {}", dev.name(), dev.backend_name());
    let mode = format!(
        "{}{} activations",
        if session.chains() { "chained, " } else { "" },
        acts_name(wm.precision())
    );
    if args.json {
        let tests: Vec<_> = results.iter().map(|r| test_json(r, args)).collect();
        let out = serde_json::json!({
            "model": loaded.path, "model_file": name,
            "size_mib": model.gguf().file_size() as f64 / MIB,
            "arch": model.cfg.arch_name, "backend": "wgpu", "device": device, "mode": mode,
            "precision": acts_name(wm.precision()),
            "batch": 1, "n_prompt": args.p, "n_gen": args.n, "ctx": need,
            "version": env!("CARGO_PKG_VERSION"), "weight_bytes": wm.weight_bytes(),
            "repetitions": args.r, "results": tests, "pick_read_us": wait_us,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("| model | backend | mode | test | t/s |");
        println!("| --- | --- | --- | ---: | ---: |");
        for (t, m, s, _) in &results {
            println!("| {name} | wgpu ({device}) | {mode} | {t} | {m:.2} ± {s:.2} |");
        }
        if reads > 0 {
            eprintln!("chained decode: {wait_us:.0} us a token waiting for the device and reading the pick");
        }
    }
    Ok(())
}

/// pp and tg on the GPU, one sequence (`Session::cuda`: the model definition on the CUDA kernel
/// set, decode steps replayed from a graph); tg also as GB/s of weights read.
fn run_cuda(
    args: &Args,
    loaded: &Loaded,
    dev: &CudaDevice,
    need: usize,
    tokens: &[u32],
) -> anyhow::Result<()> {
    let model = &loaded.model;
    dev.reset_peak_memory();
    let free0 = dev.mem_info()?.0;
    let gm = GpuModel::load(model, dev, need)?;
    let mut session = Session::cuda(&gm, need)?;
    let per_token = gm.bytes_per_token() as f64;
    let results = session_runs(&mut session, args, tokens)?;
    // Device memory: the allocator's peak (weights, KV cache, activations, prefill scratch),
    // and what the process took from the driver since before the load (adds the kernels'
    // modules, cuBLASLt's workspace and the graph), against weights + KV cache + 10% + 256 MiB.
    let mem = dev.memory_stats();
    let taken = free0.saturating_sub(dev.mem_info()?.0);
    let (wb, kvb) = (gm.weight_bytes(), session.kv_store().bytes());
    let bound = (wb + kvb) as f64 * 1.1 + 256.0 * MIB;
    let name = file_name(loaded);
    let size_mib = model.gguf().file_size() as f64 / MIB;
    let backend = format!("CUDA ({})", dev.name());
    let acts = acts_name(gm.precision());
    let mode = format!(
        "{}{}, {acts} activations",
        if session.kernels().uses_graphs() {
            "graph"
        } else {
            "eager launches"
        },
        if session.chains() { ", chained" } else { "" },
    );
    let gb_s = |tok_s: f64| per_token * tok_s / 1e9;
    if args.json {
        let tests: Vec<_> = results
            .iter()
            .map(|r| {
                let mut j = test_json(r, args);
                if r.0.starts_with("tg") {
                    j["weight_gb_s"] = serde_json::json!(gb_s(r.1));
                }
                j
            })
            .collect();
        let out = serde_json::json!({
            "model": loaded.path, "model_file": name, "size_mib": size_mib,
            "arch": model.cfg.arch_name, "backend": "cuda", "device": backend,
            "kernels": dev.kernel_compiler(), "precision": acts,
            "n_prompt": args.p, "n_gen": args.n, "ctx": need,
            "version": env!("CARGO_PKG_VERSION"), "mode": mode, "step_rows": ferrite_llm::session::CUDA_ROWS,
            "weight_bytes_per_token": per_token, "repetitions": args.r, "results": tests,
            "memory": {"peak_in_use": mem.peak_in_use, "reserved": mem.reserved,
                       "taken_from_driver": taken, "weights": wb, "kv_cache": kvb, "bound": bound},
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("| model | size | backend | mode | test | t/s | weights GB/s |");
        println!("| --- | ---: | --- | --- | ---: | ---: | ---: |");
        for (t, m, s, _) in &results {
            let bw = if t.starts_with("tg") {
                format!("{:.0}", gb_s(*m))
            } else {
                "-".to_string()
            };
            println!("| {name} | {size_mib:.2} MiB | {backend} | {mode} | {t} | {m:.2} ± {s:.2} | {bw} |");
        }
        eprintln!(
            "{:.1} MiB of weights read per token; pp: steps of up to {} tokens",
            per_token / MIB,
            ferrite_llm::session::CUDA_ROWS,
        );
        eprintln!(
            "device memory: peak {:.1} MiB allocated ({:.1} MiB reserved), {:.1} MiB taken from the driver; weights {:.1} MiB + KV cache {:.1} MiB ({} positions): bound (+10% + 256 MiB) {:.1} MiB",
            mem.peak_in_use as f64 / MIB,
            mem.reserved as f64 / MIB,
            taken as f64 / MIB,
            wb as f64 / MIB,
            kvb as f64 / MIB,
            session.ctx(),
            bound / MIB
        );
    }
    Ok(())
}

/// `--batch B` on the engine (CPU, or CUDA with a device): B requests of `-p` prompt tokens
/// (different per sequence) and `-n` generated tokens each (greedy, no stop token), added at
/// once. pp: prompt tokens of all sequences over the time until every sequence has its first
/// token (chunked prefill, the engine's step budget); tg: tokens generated after the first
/// ones over the time from there to the end, in aggregate and per sequence.
/// Where `run_batch` runs the engine.
#[derive(Clone, Copy)]
enum BenchDevice<'a> {
    Cpu,
    Cuda(&'a CudaDevice),
    Wgpu(&'a ferrite_wgpu::WgpuDevice),
}

fn run_batch(args: &Args, loaded: &Loaded, b: usize, on: BenchDevice<'_>) -> anyhow::Result<()> {
    use ferrite_llm::engine::{Engine, EngineConfig};
    let model = &loaded.model;
    if args.p == 0 || args.n == 0 {
        anyhow::bail!("--batch needs -p and -n of at least 1");
    }
    let ctx = args.p + args.n;
    if ctx > model.cfg.ctx_train {
        anyhow::bail!(
            "-p {} plus -n {} exceed the model's context length {}",
            args.p,
            args.n,
            model.cfg.ctx_train
        );
    }
    let (runs, backend, device, detail) = match on {
        BenchDevice::Wgpu(dev) => {
            let wm = ferrite_llm::model::WgpuModel::new(model, dev)?;
            let mut engine = Engine::wgpu(&wm, EngineConfig::new(ctx, b))?;
            let runs = engine_runs(&mut engine, args, b, model.cfg.vocab)?;
            (
                runs,
                "wgpu engine",
                format!("{}, {}", dev.name(), dev.backend_name()),
                format!("{} activations", acts_name(wm.precision())),
            )
        }
        BenchDevice::Cuda(dev) => {
            let gm = GpuModel::load(model, dev, ctx)?;
            let mut engine = Engine::cuda(&gm, EngineConfig::new(ctx, b))?;
            let runs = engine_runs(&mut engine, args, b, model.cfg.vocab)?;
            let (graphs, replays) = engine.kernels().graph_stats();
            (
                runs,
                "CUDA engine",
                dev.name().to_string(),
                format!(
                    "{} activations, {graphs} graphs, {replays} replays, kernels by {}",
                    acts_name(gm.precision()),
                    dev.kernel_compiler()
                ),
            )
        }
        BenchDevice::Cpu => {
            let mut engine = Engine::new(model, EngineConfig::new(ctx, b))?;
            let runs = engine_runs(&mut engine, args, b, model.cfg.vocab)?;
            let threads = ferrite_cpu::spin_pool::Pool::global().threads();
            (
                runs,
                "CPU engine",
                format!("CPU ({})", model.isa().name()),
                format!("{threads} threads"),
            )
        }
    };
    let pp: Vec<f64> = runs.iter().map(|r| r.0).collect();
    let tg: Vec<f64> = runs.iter().map(|r| r.1).collect();
    let per_seq: Vec<f64> = tg.iter().map(|v| v / b as f64).collect();
    let ((ppm, pps), (tgm, tgs), (psm, pss)) = (mean_sd(&pp), mean_sd(&tg), mean_sd(&per_seq));
    let name = file_name(loaded);
    let detail = if args.temp > 0.0 {
        format!("{detail}, sampling at temperature {}", args.temp)
    } else {
        detail
    };
    if args.json {
        let out = serde_json::json!({
            "model": name, "arch": model.cfg.arch_name, "backend": backend, "device": device,
            "detail": detail, "threads": ferrite_cpu::spin_pool::Pool::global().threads(),
            "isa": model.isa().name(),
            "precision": model.precision().name(), "batch": b, "temperature": args.temp,
            "n_prompt": args.p, "n_gen": args.n, "repetitions": args.r,
            "results": [
                {"test": format!("pp{}", args.p), "tok_s_mean": ppm, "tok_s_sd": pps, "samples": pp},
                {"test": format!("tg{}", args.n), "tok_s_mean": tgm, "tok_s_sd": tgs, "samples": tg,
                 "per_sequence_tok_s_mean": psm, "per_sequence_tok_s_sd": pss},
            ],
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("| model | backend | detail | batch | test | aggregate t/s | per sequence t/s |");
        println!("| --- | --- | --- | ---: | ---: | ---: | ---: |");
        println!(
            "| {name} | {backend} ({device}) | {detail} | {b} | pp{} | {ppm:.2} ± {pps:.2} | - |",
            args.p
        );
        println!(
            "| {name} | {backend} ({device}) | {detail} | {b} | tg{} | {tgm:.2} ± {tgs:.2} | {psm:.2} ± {pss:.2} |",
            args.n
        );
    }
    Ok(())
}

/// (pp tok/s, tg tok/s) of each repetition after the warm-up (see `run_batch`).
fn engine_runs<K: ferrite_llm::engine::EngineKernels>(
    engine: &mut ferrite_llm::engine::Engine<'_, K>,
    args: &Args,
    b: usize,
    vocab: usize,
) -> anyhow::Result<Vec<(f64, f64)>> {
    use ferrite_llm::engine::Request;
    let mut runs = Vec::new();
    for rep in 0..=args.r {
        let start = std::time::Instant::now();
        for s in 0..b {
            // Distinct prompts: no prefix is shared between sequences or repetitions.
            let prompt: Vec<u32> = (0..args.p)
                .map(|i| {
                    ((i * 7919 + (s + 1) * 104_729 + rep as usize * 15_485_863) % vocab) as u32
                })
                .collect();
            let mut req = Request::greedy(prompt, args.n);
            if args.temp > 0.0 {
                req.sampling = ferrite_llm::sampler::SamplerConfig {
                    temperature: args.temp,
                    seed: s as u64 + 1,
                    ..Default::default()
                };
            }
            engine.add_request(req)?;
        }
        let mut started = std::collections::HashSet::new();
        let mut t_first = None;
        let mut generated = 0usize;
        while engine.has_work() {
            for o in engine.step()? {
                generated += usize::from(o.token.is_some());
                started.insert(o.id);
            }
            if t_first.is_none() && started.len() == b {
                t_first = Some(start.elapsed().as_secs_f64());
            }
        }
        let total = start.elapsed().as_secs_f64();
        let pp_secs = t_first.unwrap_or(total);
        let tg_tokens = generated.saturating_sub(b);
        if rep > 0 {
            runs.push((
                (b * args.p) as f64 / pp_secs,
                tg_tokens as f64 / (total - pp_secs).max(1e-9),
            ));
        }
    }
    Ok(runs)
}

/// (n_prompt, n_gen) of a test named "ppN" or "tgN", as llama-bench reports them.
fn test_sizes(test: &str, args: &Args) -> (usize, usize) {
    if test.starts_with("pp") {
        (args.p, 0)
    } else {
        (0, args.n)
    }
}
