//! Initialization, seeded like `torch.manual_seed`: every initializer draws from the Philox
//! RNG ops (`Tensor::rand_uniform` / `rand_normal`) with a seed taken from a per-thread
//! stream, so a seed gives the same numbers on every device (they are not PyTorch's numbers:
//! its CPU generator is a Mersenne twister; fixtures carry their parameters instead).
//!
//! Fan conventions are PyTorch's (`torch.nn.init._calculate_fan_in_and_fan_out`): for a
//! weight `[out, in, k...]`, fan_in = in * prod(k), fan_out = out * prod(k).

use ferrite_core::{no_grad, DType, Device, Error, Result, Shape, Tensor};
use std::cell::Cell;

thread_local! {
    static SEED: Cell<(u64, u64)> = const { Cell::new((0x5EED, 0)) };
}

/// Restarts this thread's initialization stream at `seed` (PyTorch's `torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    SEED.with(|s| s.set((seed, 0)));
}

/// This thread's initialization stream as (seed, draws so far): what a checkpoint keeps so
/// that a resumed run draws the same seeds (Dropout2d takes one per forward).
pub fn rng_state() -> (u64, u64) {
    SEED.with(|s| s.get())
}

/// Restores a state returned by `rng_state`.
pub fn set_rng_state(state: (u64, u64)) {
    SEED.with(|s| s.set(state));
}

/// The next seed of this thread's stream (splitmix64 of seed and counter).
pub fn next_seed() -> u64 {
    SEED.with(|s| {
        let (base, n) = s.get();
        s.set((base, n + 1));
        let mut z = base
            .wrapping_add(n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

/// `torch.nn.init.calculate_gain(nonlinearity, param)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nonlinearity {
    Linear,
    Sigmoid,
    Tanh,
    Relu,
    /// With the negative slope (PyTorch's default param 0.01).
    LeakyRelu(f64),
    Selu,
}

pub fn calculate_gain(nl: Nonlinearity) -> f64 {
    match nl {
        Nonlinearity::Linear | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f64.sqrt(),
        Nonlinearity::LeakyRelu(a) => (2.0 / (1.0 + a * a)).sqrt(),
        Nonlinearity::Selu => 0.75,
    }
}

/// (fan_in, fan_out) of a weight shape; needs rank ≥ 2.
pub fn fans(shape: &Shape) -> Result<(usize, usize)> {
    let d = shape.dims();
    if d.len() < 2 {
        return Err(Error::shape(
            "init",
            format!("fan in and fan out need at least 2 dims, got {shape}"),
        ));
    }
    let rf: usize = d[2..].iter().product();
    Ok((d[1] * rf, d[0] * rf))
}

/// Which fan kaiming initialization preserves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanMode {
    FanIn,
    FanOut,
}

pub fn uniform(
    shape: impl Into<Shape>,
    low: f64,
    high: f64,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    if low.is_nan() || high.is_nan() || low > high {
        return Err(Error::shape(
            "init::uniform",
            format!("invalid bounds [{low}, {high})"),
        ));
    }
    no_grad(|| Tensor::rand_uniform(shape, low, high, next_seed(), dtype, dev))
}

pub fn normal(
    shape: impl Into<Shape>,
    mean: f64,
    std: f64,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    if std.is_nan() || std < 0.0 {
        return Err(Error::shape("init::normal", format!("invalid std {std}")));
    }
    no_grad(|| Tensor::rand_normal(shape, mean, std, next_seed(), dtype, dev))
}

pub fn zeros(shape: impl Into<Shape>, dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::zeros(shape, dtype, dev)
}

pub fn ones(shape: impl Into<Shape>, dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::ones(shape, dtype, dev)
}

/// U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
pub fn xavier_uniform(
    shape: impl Into<Shape>,
    gain: f64,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let shape = shape.into();
    let (fi, fo) = fans(&shape)?;
    let a = gain * (6.0 / (fi + fo) as f64).sqrt();
    uniform(shape, -a, a, dtype, dev)
}

/// N(0, std²) with std = gain * sqrt(2 / (fan_in + fan_out)).
pub fn xavier_normal(
    shape: impl Into<Shape>,
    gain: f64,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let shape = shape.into();
    let (fi, fo) = fans(&shape)?;
    normal(
        shape,
        0.0,
        gain * (2.0 / (fi + fo) as f64).sqrt(),
        dtype,
        dev,
    )
}

fn kaiming_std(shape: &Shape, mode: FanMode, nl: Nonlinearity) -> Result<f64> {
    let (fi, fo) = fans(shape)?;
    let fan = match mode {
        FanMode::FanIn => fi,
        FanMode::FanOut => fo,
    };
    if fan == 0 {
        return Err(Error::shape(
            "init::kaiming",
            format!("zero fan for shape {shape}"),
        ));
    }
    Ok(calculate_gain(nl) / (fan as f64).sqrt())
}

/// U(-b, b) with b = gain * sqrt(3 / fan) (PyTorch's `kaiming_uniform_`).
pub fn kaiming_uniform(
    shape: impl Into<Shape>,
    mode: FanMode,
    nl: Nonlinearity,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let shape = shape.into();
    let b = 3f64.sqrt() * kaiming_std(&shape, mode, nl)?;
    uniform(shape, -b, b, dtype, dev)
}

/// N(0, (gain / sqrt(fan))²) (PyTorch's `kaiming_normal_`).
pub fn kaiming_normal(
    shape: impl Into<Shape>,
    mode: FanMode,
    nl: Nonlinearity,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let shape = shape.into();
    let std = kaiming_std(&shape, mode, nl)?;
    normal(shape, 0.0, std, dtype, dev)
}

/// A (semi-)orthogonal matrix scaled by `gain` over the first dim vs the rest (PyTorch's
/// `orthogonal_`): QR of a normal matrix (modified Gram–Schmidt in f64 on the host), with
/// the signs of R's diagonal folded in so the distribution is uniform (Haar).
pub fn orthogonal(
    shape: impl Into<Shape>,
    gain: f64,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let shape = shape.into();
    let d = shape.dims();
    if d.len() < 2 {
        return Err(Error::shape(
            "init::orthogonal",
            format!("needs at least 2 dims, got {shape}"),
        ));
    }
    let rows = d[0];
    let cols: usize = d[1..].iter().product();
    if rows == 0 || cols == 0 {
        return Tensor::zeros(shape, dtype, dev);
    }
    // Orthonormalize the columns of a tall [m, n] matrix, m >= n.
    let (m, n) = (rows.max(cols), rows.min(cols));
    let cpu_seed = next_seed();
    let g =
        no_grad(|| Tensor::rand_normal([n, m], 0.0, 1.0, cpu_seed, DType::F64, dev)?.to_vec_f64())?;
    // q[j] is column j (length m).
    let mut q: Vec<Vec<f64>> = g.chunks(m).map(|c| c.to_vec()).collect();
    for j in 0..n {
        let (done, rest) = q.split_at_mut(j);
        let col = &mut rest[0];
        for prev in done.iter() {
            let dot: f64 = col.iter().zip(prev).map(|(a, b)| a * b).sum();
            for (c, p) in col.iter_mut().zip(prev) {
                *c -= dot * p;
            }
        }
        let norm = col.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm == 0.0 {
            return Err(Error::backend(
                "init::orthogonal",
                "degenerate random matrix (zero column)",
            ));
        }
        for v in col.iter_mut() {
            *v /= norm;
        }
    }
    // Gram–Schmidt gives R's diagonal positive, which is the Haar-uniform sign choice.
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            // rows >= cols: Q [rows, cols] = columns j = c; else Q^T.
            let v = if rows >= cols { q[c][r] } else { q[r][c] };
            out[r * cols + c] = gain * v;
        }
    }
    no_grad(|| {
        Tensor::from_host(
            ferrite_core::HostBuffer::from_f64_slice(dtype, &out),
            shape,
            dev,
        )
    })
}
