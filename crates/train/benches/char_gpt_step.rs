//! One training step of `../shared/reference/torch_train.py`'s char-GPT (T3: 6 layers, 6
//! heads, 384 wide, context 256, batch 64, vocab 65; AdamW; bf16 autocast), eager, in f32 and
//! in bf16 autocast (`Precision::Bf16`'s scope): zero_grad, forward + cross-entropy under
//! the precision's autocast, backward, the fused AdamW step. The model is PyTorch's layout
//! through `TransformerEncoder` (pre-norm, GELU, packed qkv, a final LayerNorm, an unbiased
//! head); the batch is fixed random ids, as in the reference.
//!
//! On CUDA the bf16 step also runs captured as one CUDA graph (forward, loss, backward and the
//! AdamW update, after 3 eager warm-up steps; what `TrainerConfig::cuda_graph` does), the
//! counterpart of torch_train.py's whole-step graph mode.
//!
//! Prints one JSON line per mode (steps/s, tokens/s, peak device memory on CUDA), as
//! torch_train.py does. Run beside it on the same GPU:
//!
//! ```text
//! cargo bench -p ferrite-train --bench char_gpt_step         # CUDA (the CPU without one)
//! python3 ../shared/reference/torch_train.py | grep gpt_char
//! ```
//!
//! `-- cpu` forces the CPU; `-- eager` runs only the bf16 eager mode (for a profiler's
//! per-kernel table); `-- quick` runs a 1-layer, 64-wide, context-32, batch-4 model for
//! 3 steps (a check that it runs, not a measurement).

use ferrite_core::{DType, Device, Tensor};
use ferrite_nn::loss::{cross_entropy, CrossEntropyOptions};
use ferrite_nn::models::TransformerEncoder;
use ferrite_nn::{Embedding, EncoderConfig, Linear, Module, ModuleExt};
use ferrite_train::trainer::Precision;
use ferrite_train::{Optimizer, Result, Rule};
use std::time::Instant;

struct Gpt {
    tok: Embedding,
    pos: Embedding,
    blocks: TransformerEncoder,
    head: Linear,
}

struct Size {
    vocab: usize,
    ctx: usize,
    width: usize,
    layers: usize,
    heads: usize,
    batch: usize,
}

impl Gpt {
    fn new(s: &Size, dev: &Device) -> Result<Gpt> {
        let mut c = EncoderConfig::new(s.width, s.heads);
        c.dim_feedforward = 4 * s.width;
        c.dropout = 0.0;
        c.gelu = true;
        c.batch_first = true;
        c.norm_first = true;
        Ok(Gpt {
            tok: Embedding::new(s.vocab, s.width, None, DType::F32, dev)?,
            pos: Embedding::new(s.ctx, s.width, None, DType::F32, dev)?,
            blocks: TransformerEncoder::new(c, s.layers, true, DType::F32, dev)?,
            head: Linear::new(s.width, s.vocab, false, DType::F32, dev)?,
        })
    }

    /// Logits `[b, t, vocab]` of ids `[b, t]`.
    fn logits(&self, ids: &Tensor, pos: &Tensor) -> ferrite_core::Result<Tensor> {
        let x = self.tok.forward(ids)?.add(&self.pos.forward(pos)?)?;
        self.head
            .forward(&self.blocks.forward_masked(&x, None, true)?)
    }

    fn params(&self) -> Vec<(String, ferrite_nn::Parameter)> {
        let mut p = Vec::new();
        for (prefix, m) in [
            ("tok", &self.tok as &dyn Module),
            ("pos", &self.pos),
            ("blocks", &self.blocks),
            ("head", &self.head),
        ] {
            for (n, q) in m.named_parameters() {
                p.push((format!("{prefix}.{n}"), q));
            }
        }
        p
    }
}

fn run(
    s: &Size,
    precision: Precision,
    graph: bool,
    warm: usize,
    iters: usize,
    dev: &Device,
) -> Result<()> {
    ferrite_nn::init::manual_seed(0);
    let model = Gpt::new(s, dev)?;
    let params = model.params();
    let n_params: usize = params.iter().map(|(_, p)| p.elem_count()).sum();
    let last = params
        .last()
        .map(|(_, p)| p.clone())
        .ok_or_else(|| ferrite_train::Error::config("char_gpt_step", "no parameters"))?;
    let mut opt = Optimizer::new(params, 1e-3, Rule::adamw())?;
    let n = s.batch * s.ctx;
    let ids = Tensor::rand_uniform([n], 0.0, s.vocab as f64, 1, DType::F32, dev)?
        .floor()?
        .cast(DType::I64)?;
    let tgt = Tensor::rand_uniform([n], 0.0, s.vocab as f64, 2, DType::F32, dev)?
        .floor()?
        .cast(DType::I64)?;
    let ids = ids.reshape([s.batch, s.ctx])?;
    let pos = Tensor::arange(0.0, s.ctx as f64, 1.0, DType::I64, dev)?;
    let ce = CrossEntropyOptions::default();
    let forward_backward = |opt: &mut Optimizer| -> Result<Tensor> {
        let loss = precision.run(|| {
            let logits = model.logits(&ids, &pos)?;
            cross_entropy(&logits.reshape([n, s.vocab])?, &tgt, &ce)
        })?;
        ferrite_autodiff::backward(&loss)?;
        opt.step()?;
        Ok(loss.detach())
    };
    // The host waits for the last update: `last`'s storage is ready after the step's write.
    let sync = |p: &ferrite_nn::Parameter| -> Result<()> {
        p.tensor().detach().narrow(0, 0, 1)?.to_vec_f64()?;
        Ok(())
    };
    let cuda = ferrite_cuda::CudaDevice::from_device(dev);
    for _ in 0..warm {
        opt.zero_grad();
        forward_backward(&mut opt)?;
    }
    opt.zero_grad();
    let captured = match (&cuda, graph) {
        (Some(d), true) => {
            let te = |e: ferrite_train::Error| ferrite_core::Error::backend("step", e.to_string());
            let g = d.capture(|| Ok(vec![forward_backward(&mut opt).map_err(te)?]))?;
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
                forward_backward(&mut opt)
            }
        }
    };
    step()?;
    sync(&last)?;
    if let Some(d) = &cuda {
        d.reset_peak_memory();
    }
    let t0 = Instant::now();
    let mut loss = None;
    for _ in 0..iters {
        loss = Some(step()?);
    }
    sync(&last)?;
    let secs = t0.elapsed().as_secs_f64();
    let rate = iters as f64 / secs;
    let peak = cuda
        .as_ref()
        .map(|d| d.memory_stats().peak_in_use as f64 / (1u64 << 20) as f64);
    let loss = match loss {
        Some(l) => l.item::<f32>()? as f64,
        None => f64::NAN,
    };
    println!(
        "{{\"workload\": \"gpt_char_{}x{}_t{}_b{}\", \"device\": \"{dev}\", \"optimizer\": \"adamw\", \"precision\": \"{}\", \"cuda_graph\": {}, \"params\": {n_params}, \"steps_per_s\": {rate:.2}, \"tokens_per_s\": {:.0}, \"peak_mib\": {}, \"last_loss\": {loss:.4}}}",
        s.layers,
        s.width,
        s.ctx,
        s.batch,
        match precision {
            Precision::Bf16 => "bf16-autocast",
            _ => precision.name(),
        },
        captured.is_some(),
        rate * n as f64,
        peak.map_or("null".to_string(), |m| format!("{m:.0}")),
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let force_cpu = args.iter().any(|a| a == "cpu");
    let quick = args.iter().any(|a| a == "quick");
    let eager_only = args.iter().any(|a| a == "eager");
    let dev = if !force_cpu && ferrite_cuda::is_available() {
        ferrite_cuda::cuda(0)?
    } else {
        ferrite_cpu::cpu()
    };
    let (s, warm, iters) = match quick {
        true => (
            Size {
                vocab: 65,
                ctx: 32,
                width: 64,
                layers: 1,
                heads: 2,
                batch: 4,
            },
            1,
            3,
        ),
        false => (
            Size {
                vocab: 65,
                ctx: 256,
                width: 384,
                layers: 6,
                heads: 6,
                batch: 64,
            },
            10,
            50,
        ),
    };
    let cuda = ferrite_cuda::CudaDevice::from_device(&dev).is_some();
    run(&s, Precision::Bf16, false, warm, iters, &dev)?;
    if eager_only {
        return Ok(());
    }
    if cuda {
        run(&s, Precision::Bf16, true, warm, iters, &dev)?;
    }
    run(&s, Precision::F32, false, warm, iters, &dev)?;
    Ok(())
}
