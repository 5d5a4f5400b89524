//! Causal bf16 attention, forward and backward, at the training workloads' shapes (GPT-2 124M:
//! b16 h12 l1024 d64; char-GPT: b64 h6 l256 d64), q, k and v read as views of one
//! [b, l, 3, h, d] projection as the models' self-attention reads them. PyTorch's
//! `scaled_dot_product_attention` on the same shapes is `scripts/gpu/torch_attention.py`; run
//! both in one session. `cargo bench -p ferrite-cuda --bench attention`.
//!
//! Timing: device events around `reps` calls after a warm-up, median of 5 samples. FLOPs count
//! the causal half of the products (forward 2, backward 5, as FlashAttention reports them).
//! Rows "with lse / from it": the forward that also writes its lse and the backward that
//! reads the saved output and lse (what a recorded training step runs).

use ferrite_core::{DType, Result, Tensor};
use ferrite_cuda::CudaDevice;

mod common;
use common::time;

fn main() -> Result<()> {
    if !ferrite_cuda::is_available() {
        println!("attention: skipped: no CUDA device");
        return Ok(());
    }
    let d = CudaDevice::new(0)?;
    let dev = d.device();
    println!("device: {}", d.name());
    println!("\n| shape (causal, bf16) | forward | backward |\n|---|---|---|");
    for (name, b, h, l, hd) in [
        ("GPT-2 b16 h12 l1024 d64", 16, 12, 1024, 64),
        ("char-GPT b64 h6 l256 d64", 64, 6, 256, 64),
    ] {
        let qkv = Tensor::rand_uniform([b, l, 3, h, hd], -1.0, 1.0, 1, DType::BF16, &dev)?;
        let part = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3])
        };
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let g = Tensor::rand_uniform([b, h, l, hd], -1.0, 1.0, 2, DType::BF16, &dev)?;
        let scale = 1.0 / (hd as f64).sqrt();
        // One causal product: 2 b h l^2 d / 2 FLOPs.
        let product = (b * h * l * l * hd) as f64;
        let fwd = time(&d, 10, || {
            Tensor::attention_masked(&q, &k, &v, None, true, Some(scale)).map(|_| ())
        });
        let bwd = time(&d, 10, || {
            Tensor::attention_backward(&q, &k, &v, None, &g, true, scale).map(|_| ())
        });
        // What a recorded step runs: the forward with its lse, the backward from them.
        let fwd_lse = time(&d, 10, || {
            Tensor::attention_lse(&q, &k, &v, None, true, Some(scale)).map(|_| ())
        });
        let (o, lse) = Tensor::attention_lse(&q, &k, &v, None, true, Some(scale))?;
        let bwd_saved = time(&d, 10, || {
            Tensor::attention_backward_saved(&q, &k, &v, None, &g, (&o, &lse), true, scale)
                .map(|_| ())
        });
        let row = |what: &str, f: f64, b: f64| {
            println!(
                "| {name}{what} | {f:.3} ms, {:.0} TFLOP/s | {b:.3} ms, {:.0} TFLOP/s |",
                2.0 * product / f / 1e9,
                5.0 * product / b / 1e9
            )
        };
        row("", fwd, bwd);
        row(", with lse / from it", fwd_lse, bwd_saved);
    }
    Ok(())
}
