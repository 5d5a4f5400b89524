//! Recording overhead: a 64-op elementwise chain on the CPU, forward under `no_grad` vs
//! forward with a trainable input (every op recorded), for a few tensor sizes.
//!
//! Run: `cargo bench -p ferrite-autodiff --bench recording`

use ferrite_autodiff::{no_grad, Var};
use ferrite_core::{DType, Result, Tensor};
use std::time::Instant;

fn chain(x: &Tensor) -> Result<Tensor> {
    let mut y = x.clone();
    for i in 0..16 {
        y = y
            .mul_scalar(0.9)?
            .add(x)?
            .tanh()?
            .add_scalar(i as f64 * 1e-3)?;
    }
    Ok(y)
}

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
    let dev = ferrite_cpu::cpu();
    println!("| tensor | no_grad forward | recorded forward | overhead |");
    println!("|---|---|---|---|");
    for (shape, reps) in [
        ([16usize, 16usize], 2000),
        ([128, 128], 500),
        ([512, 512], 50),
    ] {
        let x = Tensor::rand_normal(shape, 0.0, 1.0, 1, DType::F32, &dev).unwrap();
        let v = Var::new(&x).unwrap();
        // Interleave the two measurements so machine load affects both alike.
        let (mut a, mut b) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..5 {
            a = a.min(median(|| drop(no_grad(|| chain(&x)).unwrap()), reps));
            b = b.min(median(|| drop(chain(v.tensor()).unwrap()), reps));
        }
        println!(
            "| {shape:?} f32, 64 ops | {:.1} us | {:.1} us | {:+.1}% |",
            a * 1e6,
            b * 1e6,
            (b / a - 1.0) * 100.0
        );
    }
}
