//! Forward + backward of an MLP 4096-4096-4096 at batch 256 in bf16 on CUDA, through
//! ferrite-autodiff: h = relu(x W1 + b1), y = h W2 + b2, loss = mean((y - t)^2). The same step
//! in PyTorch is `scripts/gpu/torch_mlp.py`; run both in one session and compare.
//! `cargo bench -p ferrite-cuda --bench mlp_bf16`.

use ferrite_autodiff::{backward, Var};
use ferrite_core::{DType, Result, Tensor};
use ferrite_cuda::CudaDevice;
use std::time::Instant;

fn main() -> Result<()> {
    if !ferrite_cuda::is_available() {
        println!("mlp_bf16: skipped: no CUDA device");
        return Ok(());
    }
    let d = CudaDevice::new(0)?;
    let dev = d.device();
    let (b, n) = (256usize, 4096usize);
    let bf = DType::BF16;
    let scale = 1.0 / (n as f64).sqrt();
    let w1 = Var::new(&Tensor::rand_uniform([n, n], -scale, scale, 1, bf, &dev)?)?;
    let b1 = Var::new(&Tensor::zeros([n], bf, &dev)?)?;
    let w2 = Var::new(&Tensor::rand_uniform([n, n], -scale, scale, 2, bf, &dev)?)?;
    let b2 = Var::new(&Tensor::zeros([n], bf, &dev)?)?;
    let x = Tensor::rand_normal([b, n], 0.0, 1.0, 3, bf, &dev)?;
    let t = Tensor::rand_normal([b, n], 0.0, 1.0, 4, bf, &dev)?;
    let params = [&w1, &b1, &w2, &b2];
    let step = || -> Result<Tensor> {
        for p in params {
            p.zero_grad();
        }
        let h = x.matmul(w1.tensor())?.add(b1.tensor())?.relu()?;
        let y = h.matmul(w2.tensor())?.add(b2.tensor())?;
        let l = y.sub(&t)?.square()?.mean(&[0, 1], false)?;
        backward(&l)?;
        Ok(l)
    };
    let l0 = step()?.to_vec_f64()?[0];
    for _ in 0..10 {
        step()?;
    }
    d.synchronize()?;
    let iters = 100;
    let mut samples = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..iters {
            step()?;
        }
        d.synchronize()?;
        samples.push(t0.elapsed().as_secs_f64() * 1e3 / iters as f64);
    }
    samples.sort_by(|a, c| a.total_cmp(c));
    let ms = samples[2];
    let flops = 6.0 * 2.0 * (b * n * n) as f64;
    let g = w1
        .grad()
        .map(|g| g.to_vec_f64())
        .transpose()?
        .unwrap_or_default();
    let gnorm: f64 = g.iter().map(|v| v * v).sum::<f64>().sqrt();
    println!(
        "loss {l0:.4}, |dW1| {gnorm:.4}, peak device memory {} MiB",
        d.memory_stats().peak_in_use >> 20
    );
    println!(
        "| mlp 4096-4096-4096 b256 bf16 fwd+bwd | ferrite {ms:.3} ms/step ({:.0} TFLOP/s) |",
        flops / ms / 1e9
    );
    Ok(())
}
