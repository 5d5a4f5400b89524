//! conv2d forward and backward (input and weight gradients) over ResNet-50's 23 distinct
//! convolution shapes at batch 8, f32, on the CPU. `scripts/conv_bench_torch.py` prints the
//! same table for PyTorch on the same machine and thread count; run both on a quiet machine.
//!
//! Run: `cargo bench -p ferrite-cpu --bench conv_resnet50` (optional argument: batch size).
//! With the argument `fashion-cnn` it times the 8 convolution shapes of `ferrite train
//! fashion-cnn`'s ResNet instead (batch 128 unless given).

use ferrite_core::{Conv2dParams, DType, Tensor};
use ferrite_testing::bench_shapes::{FASHION_CNN_CONVS, RESNET50_CONVS};
use std::time::Instant;

/// Median of `reps` timings (seconds) after one warm-up call.
fn median(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    let mut ts: Vec<f64> = (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[ts.len() / 2]
}

fn main() {
    let fashion = std::env::args().any(|a| a == "fashion-cnn");
    let batch: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(if fashion { 128 } else { 8 });
    let shapes: &[_] = if fashion {
        &FASHION_CNN_CONVS
    } else {
        &RESNET50_CONVS
    };
    let dev = ferrite_cpu::cpu();
    println!("machine: {}", ferrite_cpu::machine_summary());
    println!("conv2d f32, batch {batch}, median of 5 (ms)");
    println!("| layer | fwd | bwd (input + weight) | fwd + bwd |");
    println!("|---|---|---|---|");
    let (mut tf, mut tb) = (0.0, 0.0);
    for (i, s) in shapes.iter().enumerate() {
        let p = Conv2dParams {
            stride: [s.stride; 2],
            padding: [s.pad; 2],
            dilation: [1, 1],
            groups: 1,
        };
        let seed = 3 * i as u64;
        let x = Tensor::rand_normal([batch, s.cin, s.hw, s.hw], 0.0, 1.0, seed, DType::F32, &dev)
            .unwrap();
        let w = Tensor::rand_normal(
            [s.cout, s.cin, s.k, s.k],
            0.0,
            0.05,
            seed + 1,
            DType::F32,
            &dev,
        )
        .unwrap();
        let y = x.conv2d_raw(&w, &p).unwrap();
        let g = Tensor::rand_normal(y.dims(), 0.0, 1.0, seed + 2, DType::F32, &dev).unwrap();
        let f = median(|| drop(x.conv2d_raw(&w, &p).unwrap()), 5);
        let b = median(
            || {
                drop(Tensor::conv2d_backward_input(&g, &w, &p, x.dims()).unwrap());
                drop(Tensor::conv2d_backward_weight(&x, &g, &p, w.dims()).unwrap());
            },
            5,
        );
        tf += f;
        tb += b;
        println!(
            "| {} | {:.2} | {:.2} | {:.2} |",
            s.name,
            f * 1e3,
            b * 1e3,
            (f + b) * 1e3
        );
    }
    println!(
        "| total | {:.1} | {:.1} | {:.1} |",
        tf * 1e3,
        tb * 1e3,
        (tf + tb) * 1e3
    );
}
