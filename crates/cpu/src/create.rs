//! Creation ops: fill, arange, and the counter-based random tensors.

use crate::storage::from_f32;
use ferrite_core::{rng, DType, HostBuffer, Shape};
use rayon::prelude::*;

/// `value` in every element, in a pooled buffer (written, so its pages are backed: a
/// calloc'd zero buffer would fault on first read, and again when reused for writing).
pub(crate) fn fill(value: f64, (shape, dtype): &(Shape, DType)) -> HostBuffer {
    let n = shape.elem_count();
    ferrite_core::map_host_same!(&HostBuffer::from_f64_slice(*dtype, &[value]), v => {
        v.first().map(|&x| crate::alloc::full(n, x)).unwrap_or_default()
    })
}

pub(crate) fn arange(start: f64, step: f64, (shape, dtype): &(Shape, DType)) -> HostBuffer {
    let v: Vec<f64> = (0..shape.elem_count())
        .map(|i| start + i as f64 * step)
        .collect();
    HostBuffer::from_f64_slice(*dtype, &v)
}

fn rand(dtype: DType, n: usize, f: impl Fn(u64) -> f32 + Sync + Send) -> HostBuffer {
    let v: Vec<f32> = (0..n)
        .into_par_iter()
        .with_min_len(1 << 14)
        .map(|i| f(i as u64))
        .collect();
    match dtype {
        DType::F64 => HostBuffer::F64(v.iter().map(|&x| x as f64).collect()),
        _ => from_f32(v, dtype),
    }
}

/// Computed in f32 (then converted), so every backend produces the same values.
pub(crate) fn rand_uniform(
    seed: u64,
    low: f64,
    high: f64,
    (shape, dtype): &(Shape, DType),
) -> HostBuffer {
    rand(*dtype, shape.elem_count(), |i| {
        rng::uniform(seed, i, low as f32, high as f32)
    })
}

pub(crate) fn rand_normal(
    seed: u64,
    mean: f64,
    std: f64,
    (shape, dtype): &(Shape, DType),
) -> HostBuffer {
    rand(*dtype, shape.elem_count(), |i| {
        rng::normal(seed, i, mean as f32, std as f32)
    })
}
