//! Training steps/s of the reference workloads, the counterparts of
//! `../shared/reference/torch_train.py` (seed CNN, MLP, char-GPT) and
//! `../shared/reference/gpt2_train.py` (GPT-2 124M):
//!
//! - `seed-cnn`: conv 3->8 3x3 (padding 1), relu, global average pool, fc 8->2, cross-entropy;
//!   batch 32 of 3x32x32; SGD (lr 0.01) and Adam (lr 1e-3); f32.
//! - `mlp`: 784-512-512-10 with relu, batch 128, Adam (lr 1e-3); f32.
//! - `char-gpt`: 6 layers, 6 heads, 384 wide, context 256, batch 64, vocab 65; AdamW; bf16
//!   autocast, and f32.
//! - `gpt2`: GPT-2 124M (12 layers, 12 heads, 768 wide, context 1024, batch 16, vocab 50304,
//!   head tied to the token embedding); AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1),
//!   gradient clipping at global norm 1.0; bf16 autocast.
//!
//! A step is zero_grad, forward and cross-entropy (under the precision's autocast), backward
//! and the fused optimizer step, on a fixed random batch as in the references. On CUDA each
//! workload runs eagerly and captured as one CUDA graph (forward, loss, backward and the
//! update, after eager warm-up steps; what `TrainerConfig::cuda_graph` does), the counterpart
//! of torch_train.py's whole-step graph mode. The transformers are PyTorch's layout through
//! `TransformerEncoder` (pre-norm, packed qkv, a final LayerNorm, an unbiased head; GELU in
//! its exact form, where gpt2_train.py uses the tanh form: the same number of passes).
//!
//! Prints one JSON line per workload and mode: steps/s, tokens/s for the transformers, peak
//! device memory on CUDA. Run beside the references on the same GPU:
//!
//! ```text
//! cargo bench -p ferrite-train --bench train_step [-- WORKLOAD...]
//! python3 ../shared/reference/torch_train.py
//! python3 ../shared/reference/gpt2_train.py 16 1024 20
//! ```
//!
//! Workloads default to `seed-cnn mlp char-gpt` (add `gpt2`, or name any subset). `cpu` forces
//! the CPU; `eager` runs the eager modes only (bf16 where there is one; for a profiler's
//! per-kernel table), `graph` the captured modes only (on CUDA; with `eager`, to time the two
//! in either order); `quick` shrinks every workload and runs 3 steps (a check that it runs,
//! not a measurement); `f32-logits` casts the transformers' logits to f32 before the loss
//! (autocast's plain `Linear` output; the loss then reads f32 logits), for comparison with the
//! default bf16 logits.

use ferrite_core::{ConvArgs, DType, Device, Padding, Tensor};
use ferrite_nn::functional::relu;
use ferrite_nn::loss::{cross_entropy, CrossEntropyOptions};
use ferrite_nn::models::TransformerEncoder;
use ferrite_nn::{Conv2d, Embedding, EncoderConfig, Linear, Module, ModuleExt, Parameter};
use ferrite_train::trainer::Precision;
use ferrite_train::{Clip, Optimizer, Result, Rule};
use std::time::Instant;

/// One workload: its parameters and a closure computing the loss of the fixed batch.
struct Workload<'a> {
    name: String,
    params: Vec<(String, Parameter)>,
    loss: Box<dyn Fn() -> ferrite_core::Result<Tensor> + 'a>,
    /// Tokens a step trains on (0: not a language model).
    tokens: usize,
}

/// Timing of one mode.
struct Mode {
    precision: Precision,
    graph: bool,
    warm: usize,
    iters: usize,
}

fn random_ids(n: usize, classes: usize, seed: u64, dev: &Device) -> ferrite_core::Result<Tensor> {
    Tensor::rand_uniform([n], 0.0, classes as f64, seed, DType::F32, dev)?
        .floor()?
        .cast(DType::I64)
}

fn named(prefix: &str, m: &(dyn Module + 'static)) -> Vec<(String, Parameter)> {
    m.named_parameters()
        .into_iter()
        .map(|(n, p)| (format!("{prefix}.{n}"), p))
        .collect()
}

/// The seed CNN on a batch of `b` images 3x32x32.
fn seed_cnn(b: usize, dev: &Device) -> Result<Workload<'static>> {
    let args = ConvArgs {
        padding: Padding::Zeros([1, 1]),
        ..ConvArgs::default()
    };
    let conv = Conv2d::new(3, 8, [3, 3], args, true, DType::F32, dev)?;
    let fc = Linear::new(8, 2, true, DType::F32, dev)?;
    let x = Tensor::rand_normal([b, 3, 32, 32], 0.0, 1.0, 3, DType::F32, dev)?;
    let y = random_ids(b, 2, 4, dev)?;
    let mut params = named("c", &conv);
    params.extend(named("fc", &fc));
    let ce = CrossEntropyOptions::default();
    Ok(Workload {
        name: format!("seed_cnn_b{b}"),
        params,
        loss: Box::new(move || {
            let h = relu(&conv.forward(&x)?)?.mean(&[2, 3], false)?;
            cross_entropy(&fc.forward(&h)?, &y, &ce)
        }),
        tokens: 0,
    })
}

/// The MLP `widths[0]-...-widths[last]` with relu between layers, on a batch of `b`.
fn mlp(widths: &[usize], b: usize, dev: &Device) -> Result<Workload<'static>> {
    let layers = widths
        .windows(2)
        .map(|w| Linear::new(w[0], w[1], true, DType::F32, dev))
        .collect::<ferrite_core::Result<Vec<_>>>()?;
    let x = Tensor::rand_normal([b, widths[0]], 0.0, 1.0, 5, DType::F32, dev)?;
    let y = random_ids(b, *widths.last().unwrap_or(&1), 6, dev)?;
    let params = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| named(&format!("{}", 2 * i), l))
        .collect();
    let name = widths
        .iter()
        .map(|w| w.to_string())
        .collect::<Vec<_>>()
        .join("_");
    let ce = CrossEntropyOptions::default();
    Ok(Workload {
        name: format!("mlp_{name}_b{b}"),
        params,
        loss: Box::new(move || {
            let mut h = x.clone();
            for (i, l) in layers.iter().enumerate() {
                h = l.forward(&h)?;
                if i + 1 < layers.len() {
                    h = relu(&h)?;
                }
            }
            cross_entropy(&h, &y, &ce)
        }),
        tokens: 0,
    })
}

/// A GPT's shape.
struct Gpt {
    vocab: usize,
    ctx: usize,
    width: usize,
    layers: usize,
    heads: usize,
    batch: usize,
    /// The LM head shares the token embedding's matrix (GPT-2).
    tied: bool,
    /// The feed-forward activation: GPT-2's tanh GELU, the char-GPT's erf GELU (as the
    /// PyTorch references).
    act: ferrite_nn::Activation,
}

fn gpt(name: &str, s: &Gpt, f32_logits: bool, dev: &Device) -> Result<Workload<'static>> {
    let mut c = EncoderConfig::new(s.width, s.heads);
    c.dim_feedforward = 4 * s.width;
    c.dropout = 0.0;
    c.activation = s.act;
    c.batch_first = true;
    c.norm_first = true;
    let tok = Embedding::new(s.vocab, s.width, None, DType::F32, dev)?;
    let pos = Embedding::new(s.ctx, s.width, None, DType::F32, dev)?;
    let blocks = TransformerEncoder::new(c, s.layers, true, DType::F32, dev)?;
    let mut head = Linear::new(s.width, s.vocab, false, DType::F32, dev)?;
    let mut params = named("tok", &tok);
    params.extend(named("pos", &pos));
    params.extend(named("blocks", &blocks));
    if s.tied {
        head.weight = tok.weight.clone();
    } else {
        params.extend(named("head", &head));
    }
    let n = s.batch * s.ctx;
    let ids = random_ids(n, s.vocab, 1, dev)?.reshape([s.batch, s.ctx])?;
    let tgt = random_ids(n, s.vocab, 2, dev)?;
    let at = Tensor::arange(0.0, s.ctx as f64, 1.0, DType::I64, dev)?;
    let vocab = s.vocab;
    let ce = CrossEntropyOptions::default();
    Ok(Workload {
        name: format!(
            "{name}_{}x{}_t{}_b{}{}",
            s.layers,
            s.width,
            s.ctx,
            s.batch,
            if f32_logits { "_f32logits" } else { "" }
        ),
        params,
        loss: Box::new(move || {
            let x = tok.forward(&ids)?.add(&pos.forward(&at)?)?;
            // Logits in bf16 under autocast: the loss computes in f32 from them (as
            // PyTorch's `cross_entropy(logits.float())`), no f32 copy of them is written.
            let h = blocks.forward_masked(&x, None, true)?;
            let logits = match f32_logits {
                true => head.forward(&h)?,
                false => head.forward_low(&h)?,
            };
            cross_entropy(&logits.reshape([n, vocab])?, &tgt, &ce)
        }),
        tokens: n,
    })
}

fn run(
    w: &Workload,
    rule: Rule,
    lr: f64,
    clip: Option<Clip>,
    m: &Mode,
    dev: &Device,
) -> Result<()> {
    let n_params: usize = w.params.iter().map(|(_, p)| p.elem_count()).sum();
    let last = w
        .params
        .last()
        .map(|(_, p)| p.clone())
        .ok_or_else(|| ferrite_train::Error::config("train_step", "no parameters"))?;
    let mut opt = Optimizer::new(w.params.clone(), lr, rule.clone())?;
    opt.set_clip(clip)?;
    let precision = m.precision;
    let tensors: Vec<Tensor> = w.params.iter().map(|(_, p)| p.tensor()).collect();
    let step_once = |opt: &mut Optimizer| -> Result<Tensor> {
        let loss = precision.run_prefetched(&tensors, || (w.loss)())?;
        ferrite_autodiff::backward(&loss)?;
        opt.step()?;
        Ok(loss.detach())
    };
    // The host waits for the last update: `last`'s storage is ready after the step's write.
    let sync = |p: &Parameter| -> Result<()> {
        p.tensor().detach().narrow(0, 0, 1)?.to_vec_f64()?;
        Ok(())
    };
    let cuda = ferrite_cuda::CudaDevice::from_device(dev);
    // Each mode starts from an empty pool, as a training process does: what an earlier run
    // left cached would otherwise lay out this run's (and its captured graph's) buffers.
    if let Some(d) = &cuda {
        d.empty_cache()?;
    }
    for _ in 0..m.warm {
        opt.zero_grad();
        step_once(&mut opt)?;
    }
    opt.zero_grad();
    let captured = match (&cuda, m.graph) {
        (Some(d), true) => {
            let te = |e: ferrite_train::Error| ferrite_core::Error::backend("step", e.to_string());
            let g = d.capture(|| Ok(vec![step_once(&mut opt).map_err(te)?]))?;
            opt.zero_grad();
            Some(g)
        }
        _ => None,
    };
    let mut step = || -> Result<Tensor> {
        match &captured {
            Some(g) => {
                g.replay()?;
                Ok(g.outputs()[0].clone())
            }
            None => {
                opt.zero_grad();
                step_once(&mut opt)
            }
        }
    };
    step()?;
    sync(&last)?;
    match &cuda {
        Some(d) => d.reset_peak_memory(),
        None => ferrite_cpu::reset_peak(),
    }
    let launches = || cuda.as_ref().map_or(0, |d| d.sync_stats().launches);
    let l0 = launches();
    let t0 = Instant::now();
    let mut loss = None;
    for _ in 0..m.iters {
        loss = Some(step()?);
    }
    sync(&last)?;
    let rate = m.iters as f64 / t0.elapsed().as_secs_f64();
    // Kernels launched per step from the host (a replayed graph launches none).
    let per_step = (launches() - l0) as f64 / m.iters as f64;
    // Device memory held by tensors (CPU: storages' bytes, without the idle pool).
    let peak = match &cuda {
        Some(d) => d.memory_stats().peak_in_use,
        None => ferrite_cpu::peak_bytes_in_use(),
    } as f64
        / (1u64 << 20) as f64;
    let loss = match loss {
        Some(l) => l.item::<f32>()? as f64,
        None => f64::NAN,
    };
    let tokens = match w.tokens {
        0 => String::new(),
        t => format!(", \"tokens_per_s\": {:.0}", rate * t as f64),
    };
    println!(
        "{{\"workload\": \"{}\", \"device\": \"{dev}\", \"optimizer\": \"{}\", \"precision\": \"{}\", \"cuda_graph\": {}, \"params\": {n_params}, \"steps_per_s\": {rate:.2}{tokens}, \"launches_per_step\": {per_step:.0}, \"peak_mib\": {peak:.0}, \"last_loss\": {loss:.4}}}",
        w.name,
        rule.name().to_lowercase(),
        match precision {
            Precision::Bf16 => "bf16-autocast",
            _ => precision.name(),
        },
        captured.is_some(),
    );
    Ok(())
}

fn main() {
    if let Err(e) = bench() {
        eprintln!("train_step: {e}");
        std::process::exit(2);
    }
}

fn bench() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |a: &str| args.iter().any(|x| x == a);
    let (quick, eager_only, f32_logits) = (has("quick"), has("eager"), has("f32-logits"));
    let graph_only = has("graph");
    let dev = if !has("cpu") && ferrite_cuda::is_available() {
        ferrite_cuda::cuda(0)?
    } else {
        ferrite_cpu::cpu()
    };
    let cuda = ferrite_cuda::CudaDevice::from_device(&dev).is_some();
    let known = ["seed-cnn", "mlp", "char-gpt", "gpt2"];
    let mut chosen: Vec<&str> = known.iter().copied().filter(|w| has(w)).collect();
    if let Some(bad) = args.iter().find(|a| {
        !known.contains(&a.as_str())
            && !["cpu", "quick", "eager", "graph", "f32-logits", "--bench"].contains(&a.as_str())
    }) {
        return Err(ferrite_train::Error::config(
            "train_step",
            format!("unknown argument {bad:?}; workloads: {}", known.join(", ")),
        ));
    }
    if chosen.is_empty() {
        chosen = vec!["seed-cnn", "mlp", "char-gpt"];
    }
    // (warm-up, timed) steps: torch_train.py's 20/200 for the small models, 10/50 for
    // char-GPT; gpt2_train.py times 20 steps after 3.
    let modes = |precision: Precision, warm: usize, iters: usize| -> Vec<Mode> {
        let (warm, iters) = if quick { (1, 3) } else { (warm, iters) };
        let mut v = Vec::new();
        if !(cuda && graph_only) {
            v.push(Mode {
                precision,
                graph: false,
                warm,
                iters,
            });
        }
        if cuda && !eager_only {
            v.push(Mode {
                precision,
                graph: true,
                warm,
                iters,
            });
        }
        v
    };
    for w in chosen {
        match w {
            "seed-cnn" => {
                let wl = seed_cnn(32, &dev)?;
                for m in modes(Precision::F32, 20, 200) {
                    run(&wl, Rule::sgd(), 0.01, None, &m, &dev)?;
                    run(&wl, Rule::adam(), 1e-3, None, &m, &dev)?;
                }
            }
            "mlp" => {
                let wl = mlp(&[784, 512, 512, 10], 128, &dev)?;
                for m in modes(Precision::F32, 20, 200) {
                    run(&wl, Rule::adam(), 1e-3, None, &m, &dev)?;
                }
            }
            "char-gpt" => {
                let s = match quick {
                    true => Gpt {
                        vocab: 65,
                        ctx: 32,
                        width: 64,
                        layers: 1,
                        heads: 2,
                        batch: 4,
                        tied: false,
                        act: ferrite_nn::Activation::Gelu,
                    },
                    false => Gpt {
                        vocab: 65,
                        ctx: 256,
                        width: 384,
                        layers: 6,
                        heads: 6,
                        batch: 64,
                        tied: false,
                        act: ferrite_nn::Activation::Gelu,
                    },
                };
                ferrite_nn::init::manual_seed(0);
                let wl = gpt("gpt_char", &s, f32_logits, &dev)?;
                let mut ms = modes(Precision::Bf16, 10, 50);
                if !eager_only {
                    ms.extend(
                        modes(Precision::F32, 10, 50)
                            .into_iter()
                            .filter(|m| !m.graph),
                    );
                }
                for m in ms {
                    run(&wl, Rule::adamw(), 1e-3, None, &m, &dev)?;
                }
            }
            _ => {
                let s = match quick {
                    true => Gpt {
                        vocab: 512,
                        ctx: 64,
                        width: 64,
                        layers: 2,
                        heads: 2,
                        batch: 2,
                        tied: true,
                        act: ferrite_nn::Activation::GeluTanh,
                    },
                    false => Gpt {
                        vocab: 50304,
                        ctx: 1024,
                        width: 768,
                        layers: 12,
                        heads: 12,
                        batch: 16,
                        tied: true,
                        act: ferrite_nn::Activation::GeluTanh,
                    },
                };
                ferrite_nn::init::manual_seed(0);
                let wl = gpt("gpt2", &s, f32_logits, &dev)?;
                let rule = Rule::Adam {
                    betas: (0.9, 0.95),
                    eps: 1e-8,
                    weight_decay: 0.1,
                    amsgrad: false,
                    decoupled: true,
                };
                for m in modes(Precision::Bf16, 3, 20) {
                    run(&wl, rule.clone(), 6e-4, Some(Clip::Norm(1.0)), &m, &dev)?;
                }
            }
        }
    }
    Ok(())
}
