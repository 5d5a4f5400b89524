//! Layer norm kernels at the training benchmarks' shapes (a machine with an NVIDIA GPU):
//! char-GPT's rows (16,384 x 384) and GPT-2's (16,384 x 768), f32 rows as autocast runs them
//! (the forward written in bf16, the backward taking a bf16 gradient and adding the residual
//! stream's gradient), beside device-to-device copy bandwidth from the same run.
//! `cargo bench -p ferrite-cuda --bench norm`; prints a table.
//!
//! Timing: device events around `reps` launches after a warm-up, median of 5 such samples.
//! Bandwidth counts bytes read + written once each (weight and bias vectors aside).

use ferrite_core::{DType, Tensor};
use ferrite_cuda::CudaDevice;

mod common;
use common::time;

fn main() {
    if !ferrite_cuda::is_available() {
        println!("norm: skipped: no CUDA device");
        return;
    }
    let d = CudaDevice::new(0).unwrap();
    let dev = d.device();
    println!("device: {} ({} SMs)", d.name(), d.backend().sm_count);
    let gbs = |bytes: f64, ms: f64| bytes / ms / 1e6;
    let mut rows: Vec<(String, String, String)> = Vec::new();

    let n = 64usize << 20;
    let a = Tensor::rand_uniform([n], -1.0, 1.0, 1, DType::F32, &dev).unwrap();
    let an = a.narrow(0, 0, n - 1).unwrap();
    let copy = gbs(8.0 * n as f64, time(&d, 20, || an.contiguous().map(|_| ())));
    rows.push((
        "copy 64M f32 (cuMemcpyDtoD)".into(),
        format!("{copy:.0} GB/s"),
        "reference".into(),
    ));
    drop((a, an));

    for (r, c) in [(16384usize, 384usize), (16384, 768)] {
        let x = Tensor::rand_uniform([r, c], -3.0, 3.0, 2, DType::F32, &dev).unwrap();
        let w = Tensor::rand_uniform([c], 0.5, 1.5, 3, DType::F32, &dev).unwrap();
        let b = Tensor::rand_uniform([c], -1.0, 1.0, 4, DType::F32, &dev).unwrap();
        let g32 = Tensor::rand_uniform([r, c], -1.0, 1.0, 5, DType::F32, &dev).unwrap();
        let g16 = g32.cast(DType::BF16).unwrap();
        let acc = Tensor::rand_uniform([r, c], -1.0, 1.0, 6, DType::F32, &dev).unwrap();
        let e = (r * c) as f64;
        let mut row = |name: String, bytes: f64, ms: f64| {
            rows.push((
                name,
                format!("{:.1} us", ms * 1e3),
                format!(
                    "{:.0} GB/s, {:.0}% of copy",
                    gbs(bytes, ms),
                    100.0 * gbs(bytes, ms) / copy
                ),
            ))
        };
        let ms = time(&d, 50, || {
            x.layer_norm_to(&w, &b, 1e-5, DType::BF16).map(|_| ())
        });
        row(format!("layer_norm {r}x{c} f32 -> bf16"), 6.0 * e, ms);
        let ms = time(&d, 50, || {
            Tensor::layer_norm_backward_acc(&x, &w, &g16, 1e-5, Some(&acc)).map(|_| ())
        });
        row(
            format!("layer_norm_backward {r}x{c} f32, bf16 g, + acc"),
            14.0 * e,
            ms,
        );
        let ms = time(&d, 50, || {
            Tensor::layer_norm_backward(&x, &w, &g32, 1e-5).map(|_| ())
        });
        row(format!("layer_norm_backward {r}x{c} f32"), 12.0 * e, ms);
    }

    println!("\n| benchmark | ferrite | bandwidth |\n|---|---|---|");
    for (a, b, c) in rows {
        println!("| {a} | {b} | {c} |");
    }
}
