//! One CPU training step of `ferrite train fashion-cnn`'s model (`examples/fashion_cnn.rs`:
//! ResNet, 1 input channel, 3x3 stem, stages 24/48/96 with one BasicBlock each, 173,842
//! parameters; batch 128, cross-entropy, Adam): zero_grad, forward, loss, backward, the fused
//! Adam update, on a fixed random batch (so the data loader is not timed). Prints steps/s and
//! samples/s, then the CPU backend's per-op wall time over the timed steps
//! (`ferrite_cpu::profile`), largest first, as milliseconds per step.
//!
//! ```text
//! cargo bench -p ferrite-train --bench fashion_cnn_step            # 20 timed steps
//! cargo bench -p ferrite-train --bench fashion_cnn_step -- 50      # 50 timed steps
//! cargo bench -p ferrite-train --bench fashion_cnn_step -- quick   # batch 8, 2 steps: a check
//! ```
//!
//! `scripts/fashion_cnn_torch.py --epochs 1 --threads 2` is PyTorch's figure for the same model
//! (per epoch, data loading included).

use ferrite_core::{DType, Tensor};
use ferrite_nn::loss::{cross_entropy, CrossEntropyOptions};
use ferrite_nn::models::{ResNet, ResNetConfig};
use ferrite_nn::{Module, ModuleExt};
use ferrite_train::{Optimizer, Result, Rule};
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "quick");
    let (batch, warm, iters) = match quick {
        true => (8, 1, 2),
        false => (
            128,
            3,
            args.iter().find_map(|a| a.parse().ok()).unwrap_or(20),
        ),
    };
    let dev = ferrite_cpu::cpu();
    ferrite_nn::init::manual_seed(0);
    let c = ResNetConfig {
        in_channels: 1,
        widths: vec![24, 48, 96],
        blocks: vec![1, 1, 1],
        num_classes: 10,
        small_stem: true,
    };
    let mut model = ResNet::new(&c, DType::F32, &dev)?;
    model.train();
    let params = model.named_parameters();
    let n_params: usize = params.iter().map(|(_, p)| p.elem_count()).sum();
    let mut opt = Optimizer::new(params, 1e-3, Rule::adam())?;
    let x = Tensor::rand_normal([batch, 1, 28, 28], 0.0, 1.0, 1, DType::F32, &dev)?;
    let y = Tensor::rand_uniform([batch], 0.0, 10.0, 2, DType::F32, &dev)?
        .floor()?
        .cast(DType::I64)?;
    let ce = CrossEntropyOptions::default();
    let mut step = || -> Result<f32> {
        opt.zero_grad();
        let loss = cross_entropy(&model.forward(&x)?, &y, &ce)?;
        ferrite_autodiff::backward(&loss)?;
        opt.step()?;
        Ok(loss.item::<f32>()?)
    };
    for _ in 0..warm {
        step()?;
    }
    ferrite_cpu::profile::set_enabled(true);
    ferrite_cpu::profile::take();
    let t0 = Instant::now();
    let mut loss = f32::NAN;
    for _ in 0..iters {
        loss = step()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    ferrite_cpu::profile::set_enabled(false);
    let ops = ferrite_cpu::profile::take();
    println!("machine: {}", ferrite_cpu::machine_summary());
    println!(
        "fashion-cnn step, batch {batch}, {n_params} parameters, {iters} steps: {:.1} ms/step, {:.0} samples/s, last loss {loss:.4}",
        secs / iters as f64 * 1e3,
        (batch * iters) as f64 / secs
    );
    let total: f64 = ops.iter().map(|o| o.secs).sum();
    println!(
        "ops: {:.1} ms/step of the step's {:.1} (the rest: autodiff and module code, allocation)",
        total / iters as f64 * 1e3,
        secs / iters as f64 * 1e3
    );
    println!("| op | input | output | calls/step | ms/step | share of ops |");
    println!("|---|---|---|---|---|---|");
    for o in &ops {
        println!(
            "| {} | {:?} | {:?} | {} | {:.2} | {:.1}% |",
            o.op,
            o.input,
            o.output,
            o.calls / iters,
            o.secs / iters as f64 * 1e3,
            100.0 * o.secs / total.max(f64::MIN_POSITIVE)
        );
    }
    // Per op name, all shapes together.
    let mut by_op: Vec<(&str, f64)> = Vec::new();
    for o in &ops {
        match by_op.iter_mut().find(|(n, _)| *n == o.op) {
            Some(e) => e.1 += o.secs,
            None => by_op.push((o.op, o.secs)),
        }
    }
    by_op.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("| op (all shapes) | ms/step | share of ops |");
    println!("|---|---|---|");
    for (n, s) in by_op {
        println!(
            "| {n} | {:.2} | {:.1}% |",
            s / iters as f64 * 1e3,
            100.0 * s / total.max(f64::MIN_POSITIVE)
        );
    }
    Ok(())
}
