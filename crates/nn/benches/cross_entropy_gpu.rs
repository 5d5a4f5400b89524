//! The fused cross-entropy on [8192, 50304] bf16 logits on CUDA: the forward kernel, the
//! backward kernel, and the whole `cross_entropy(...).backward()` through autodiff (mean
//! reduction, the few small ops around the kernels included). Bandwidth counts the bytes the
//! work must touch: the logits read twice (forward, backward) and dlogits written once, 3 x N x
//! C x 2 bytes. PyTorch's `F.cross_entropy` forward + backward on the same shape is
//! `scripts/gpu/torch_cross_entropy.py`; run both in one session.
//! `cargo bench -p ferrite-nn --bench cross_entropy_gpu`.

use ferrite_autodiff::{backward, Var};
use ferrite_core::{DType, Result, Tensor};
use ferrite_cuda::CudaDevice;
use ferrite_nn::loss::{cross_entropy, CrossEntropyOptions};

/// H100 SXM memory bandwidth the target is stated against (bytes/s).
const PEAK: f64 = 3.1e12;

fn main() -> Result<()> {
    if !ferrite_cuda::is_available() {
        println!("cross_entropy_gpu: skipped: no CUDA device");
        return Ok(());
    }
    let d = CudaDevice::new(0)?;
    let dev = d.device();
    let (n, c) = (8192usize, 50304usize);
    let x = Tensor::rand_normal([n, c], 0.0, 2.0, 1, DType::BF16, &dev)?;
    let t = Tensor::arange(0.0, n as f64, 1.0, DType::I64, &dev)?
        .mul_scalar(7919.0)?
        .cast(DType::F64)?;
    let t = t
        .sub(&t.div_scalar(c as f64)?.floor()?.mul_scalar(c as f64)?)?
        .cast(DType::I64)?;
    let w = Tensor::ones([c], DType::BF16, &dev)?;
    let g = Tensor::full(1.0 / n as f64, [n, 3], DType::BF16, &dev)?;
    let bytes = (n * c * 2) as f64;
    let reps = 20;
    let report = |name: &str, ms: f32, b: f64| {
        let s = ms as f64 / 1e3;
        println!(
            "| cross_entropy {name} [{n}, {c}] bf16 | {:.3} ms | {:.0} GB/s | {:.0}% of {:.1} TB/s |",
            ms,
            b / s / 1e9,
            100.0 * b / s / PEAK,
            PEAK / 1e12
        );
    };
    for eps in [0.0, 0.1] {
        let out = Tensor::cross_entropy_rows(&x, &t, &w, -100, eps)?;
        let dx = Tensor::cross_entropy_backward(&x, &t, &w, &out, &g, -100, eps)?;
        d.synchronize()?;
        drop((out, dx));
        let fwd = d.time_ms(|| {
            for _ in 0..reps {
                Tensor::cross_entropy_rows(&x, &t, &w, -100, eps)?;
            }
            Ok(())
        })? / reps as f32;
        let out = Tensor::cross_entropy_rows(&x, &t, &w, -100, eps)?;
        let bwd = d.time_ms(|| {
            for _ in 0..reps {
                Tensor::cross_entropy_backward(&x, &t, &w, &out, &g, -100, eps)?;
            }
            Ok(())
        })? / reps as f32;
        let tag = if eps > 0.0 { " smoothing 0.1" } else { "" };
        report(&format!("forward{tag}"), fwd, bytes);
        report(&format!("backward{tag}"), bwd, 2.0 * bytes);
        report(&format!("forward + backward{tag}"), fwd + bwd, 3.0 * bytes);
    }
    let v = Var::new(&x)?;
    let step = || -> Result<()> {
        v.zero_grad();
        let l = cross_entropy(v.tensor(), &t, &CrossEntropyOptions::default())?;
        backward(&l)?;
        Ok(())
    };
    step()?;
    d.synchronize()?;
    let ms = d.time_ms(|| {
        for _ in 0..reps {
            step()?;
        }
        Ok(())
    })? / reps as f32;
    report("loss + backward (autodiff)", ms, 3.0 * bytes);
    Ok(())
}
