//! The optimizer step alone, fused against composed, over the parameter shapes of GPT-2 124M
//! (AdamW, clipping at norm 1.0), the seed CNN (SGD and Adam) and the MLP 784-512-512-10
//! (Adam), f32 parameters. Gradients are set once; each timed step is `Optimizer::step`
//! (global norm, non-finite check, update of every parameter and its state).
//!
//! Prints per workload and implementation: ms per step, kernel launches and host waits per
//! step (CUDA), and the bandwidth the step's bytes need (reads of p, g and the state, writes
//! of p and the state, plus one read of g for the norm) against a 3 TB/s ceiling (H100 HBM3).
//! PyTorch's step over the same shapes: `scripts/gpu/torch_optim_step.py`.
//!
//! `cargo bench -p ferrite-train --bench optim_step` (CUDA when there is a device, else the
//! CPU); `-- cpu` forces the CPU; `-- quick` runs one GPT-2 layer and few iterations (a check
//! that it runs, not a measurement).

use ferrite_core::{DType, Device, Tensor};
use ferrite_nn::Parameter;
use ferrite_train::Result;
use ferrite_train::{Clip, Implementation, Optimizer, Rule};
use std::time::Instant;

/// GPT-2 124M's parameters (Hugging Face names and layouts; the LM head is tied to wte).
fn gpt2_shapes(layers: usize) -> Vec<Vec<usize>> {
    let (d, v, t) = (768, 50257, 1024);
    let mut s = vec![vec![v, d], vec![t, d]];
    for _ in 0..layers {
        s.extend([
            vec![d],
            vec![d],
            vec![d, 3 * d],
            vec![3 * d],
            vec![d, d],
            vec![d],
            vec![d],
            vec![d],
            vec![d, 4 * d],
            vec![4 * d],
            vec![4 * d, d],
            vec![d],
        ]);
    }
    s.extend([vec![d], vec![d]]);
    s
}

fn seed_cnn_shapes() -> Vec<Vec<usize>> {
    vec![vec![8, 3, 3, 3], vec![8], vec![2, 8], vec![2]]
}

fn mlp_shapes() -> Vec<Vec<usize>> {
    vec![
        vec![512, 784],
        vec![512],
        vec![512, 512],
        vec![512],
        vec![10, 512],
        vec![10],
    ]
}

fn params(shapes: &[Vec<usize>], dev: &Device) -> Result<Vec<(String, Parameter)>> {
    let mut loss: Option<Tensor> = None;
    let mut out = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let w = Tensor::rand_normal(s.clone(), 0.0, 0.02, i as u64, DType::F32, dev)?;
        let p = Parameter::new(&w)?;
        let g = Tensor::rand_normal(s.clone(), 0.0, 1e-3, 1000 + i as u64, DType::F32, dev)?;
        let term = p.tensor().mul(&g)?.sum_all()?;
        loss = Some(match loss {
            Some(l) => l.add(&term)?,
            None => term,
        });
        out.push((format!("p{i}"), p));
    }
    if let Some(l) = loss {
        ferrite_autodiff::backward(&l)?;
    }
    Ok(out)
}

fn state_count(rule: &Rule) -> usize {
    match rule {
        Rule::Sgd { momentum, .. } => usize::from(*momentum > 0.0),
        Rule::Adam { amsgrad, .. } => 2 + usize::from(*amsgrad),
        _ => 2,
    }
}

struct Cuda(Option<ferrite_cuda::CudaDevice>);

impl Cuda {
    fn sync(&self) -> Result<()> {
        match &self.0 {
            Some(d) => Ok(d.synchronize()?),
            None => Ok(()),
        }
    }
    fn counters(&self) -> (u64, u64) {
        self.0.as_ref().map_or((0, 0), |d| {
            let s = d.sync_stats();
            (s.launches, s.host_waits)
        })
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    name: &str,
    shapes: &[Vec<usize>],
    rule: Rule,
    clip: Option<Clip>,
    imp: Implementation,
    iters: usize,
    dev: &Device,
    cuda: &Cuda,
) -> Result<()> {
    let ps = params(shapes, dev)?;
    let n: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let ns = state_count(&rule);
    let mut opt = Optimizer::new(ps, 1e-4, rule)?;
    opt.set_implementation(imp);
    opt.set_clip(clip)?;
    for _ in 0..3 {
        opt.step()?;
    }
    cuda.sync()?;
    let mut samples = Vec::new();
    let (l0, w0) = cuda.counters();
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..iters {
            opt.step()?;
        }
        cuda.sync()?;
        samples.push(t0.elapsed().as_secs_f64() * 1e3 / iters as f64);
    }
    let (l1, w1) = cuda.counters();
    opt.check_finite()?;
    samples.sort_by(|a, b| a.total_cmp(b));
    let ms = samples[2];
    let steps = (5 * iters) as f64;
    // p, g and the state read; p and the state written; g read again for the norm.
    let bytes = (n * 4 * (4 + 2 * ns)) as f64;
    let gbs = bytes / ms / 1e6;
    // Host waits: the 5 synchronizes of the timing are not the step's.
    let counts = match cuda.0 {
        Some(_) => format!(
            "{:.1} launches, {:.2} host waits per step",
            (l1 - l0) as f64 / steps,
            (w1 - w0).saturating_sub(5) as f64 / steps
        ),
        None => "cpu".to_string(),
    };
    println!(
        "| optim step {name} ({n} params, {} tensors) | {imp:?} | {ms:.3} ms | {counts} | {gbs:.0} GB/s = {:.1}% of 3 TB/s |",
        shapes.len(),
        gbs / 3000.0 * 100.0
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let force_cpu = args.iter().any(|a| a == "cpu");
    let quick = args.iter().any(|a| a == "quick");
    let (dev, cuda) = if !force_cpu && ferrite_cuda::is_available() {
        let d = ferrite_cuda::CudaDevice::new(0)?;
        (d.device(), Cuda(Some(d)))
    } else {
        (ferrite_cpu::cpu(), Cuda(None))
    };
    println!("optim_step on {dev}{}", if quick { " (quick)" } else { "" });
    let adamw = Rule::Adam {
        betas: (0.9, 0.95),
        eps: 1e-8,
        weight_decay: 0.1,
        amsgrad: false,
        decoupled: true,
    };
    let gpt2 = gpt2_shapes(if quick { 1 } else { 12 });
    let small_iters = if quick { 3 } else { 200 };
    let big_iters = if quick { 1 } else { 20 };
    for imp in [Implementation::Fused, Implementation::Composed] {
        run(
            "gpt2-124m adamw clip 1.0",
            &gpt2,
            adamw.clone(),
            Some(Clip::Norm(1.0)),
            imp,
            big_iters,
            &dev,
            &cuda,
        )?;
        for (name, shapes, rule) in [
            ("seed-cnn sgd", seed_cnn_shapes(), Rule::sgd()),
            ("seed-cnn adam", seed_cnn_shapes(), Rule::adam()),
            ("mlp 784-512-512-10 adam", mlp_shapes(), Rule::adam()),
        ] {
            run(name, &shapes, rule, None, imp, small_iters, &dev, &cuda)?;
        }
    }
    Ok(())
}
