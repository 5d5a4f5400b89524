//! The CUDA benches' timing: device events around `reps` calls after a warm-up, median of
//! 5 such samples.

use ferrite_core::Result;
use ferrite_cuda::CudaDevice;

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median milliseconds per call of `f` over 5 samples of `reps` calls.
pub fn time(d: &CudaDevice, reps: usize, mut f: impl FnMut() -> Result<()>) -> f64 {
    for _ in 0..3 {
        f().unwrap();
    }
    d.synchronize().unwrap();
    let samples = (0..5)
        .map(|_| {
            d.time_ms(|| {
                for _ in 0..reps {
                    f()?;
                }
                Ok(())
            })
            .unwrap() as f64
                / reps as f64
        })
        .collect();
    median(samples)
}
