//! The op-case harness (DESIGN.md, "Testing"): one list of op cases over odd shapes
//! (1, 31, 33, 45x65, zero-size), non-contiguous views and every dtype with its tolerance.
//! Each case runs through the public `Tensor` API on any device and is compared with a plain
//! float64 reference written here, independently of every backend.
//!
//! Modes: `check_case` / `check_all` (a backend against the f64 reference; any backend runs
//! the same list) and `grad_check_case` / `grad_check_all` (backward through
//! `ferrite-autodiff` against float64 finite differences, on the same cases' `run` closures;
//! `grad_single_input_all`: each float input trainable alone against all of them trainable).

pub mod bench_shapes;
mod cases;
pub mod ce_cases;
mod gradcheck;
pub mod quant_cases;
pub mod reference;
pub mod runner;
pub mod torch_layers;
pub mod torch_reference;
pub mod wgsl;

pub use cases::cases;
use ferrite_core::{DType, Device, HostBuffer, Result, Tensor};
pub use gradcheck::{
    grad_cases, grad_check_all, grad_check_case, grad_compare_all, grad_compare_case,
    grad_compare_case_tol, grad_single_input_all, grad_single_input_case,
};
use std::sync::Arc;

/// A dense float64 array, row-major: the reference's data type.
#[derive(Clone, Debug, PartialEq)]
pub struct Ref {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Ref {
    pub fn new(shape: Vec<usize>, data: Vec<f64>) -> Ref {
        Ref { shape, data }
    }
}

/// How an input's values are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Values {
    /// Uniform in [lo, hi).
    Uniform(f64, f64),
    /// Magnitude in [lo, hi) with a random sign (keeps away from 0).
    AwayFromZero(f64, f64),
    /// Integers in [lo, hi) (stored in the input's dtype).
    Ints(i64, i64),
    /// Random booleans.
    Bools,
    /// A key-padding mask (bool, last dim = keys): random, except that key 0 of every row is
    /// false (every query keeps a key); with `true` the last row is all true (its queries see
    /// no key). Contiguous or narrowed views only.
    PaddingMask(bool),
}

/// How an input is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum View {
    Contiguous,
    /// The last two dims swapped in storage (a `.t()` view).
    Transposed,
    /// A narrow of a wider last dim (row stride > row length, offset 1).
    Narrowed,
}

#[derive(Clone, Debug)]
pub struct Input {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub values: Values,
    pub view: View,
}

/// Per-dtype tolerance: |got - want| <= atol + rtol * |want|.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub atol: f64,
    pub rtol: f64,
}

pub fn default_tol(dtype: DType) -> Tol {
    match dtype {
        DType::F64 => Tol {
            atol: 1e-10,
            rtol: 1e-10,
        },
        DType::F32 => Tol {
            atol: 1e-5,
            rtol: 1e-4,
        },
        DType::F16 => Tol {
            atol: 2e-3,
            rtol: 4e-3,
        },
        DType::BF16 => Tol {
            atol: 1e-2,
            rtol: 1.6e-2,
        },
        _ => Tol {
            atol: 0.0,
            rtol: 0.0,
        },
    }
}

pub type RunFn = Arc<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync>;
pub type RefFn = Arc<dyn Fn(&[Ref]) -> Vec<Ref> + Send + Sync>;

pub struct OpCase {
    /// `op/variant/dtype/shapes`, unique.
    pub name: String,
    pub inputs: Vec<Input>,
    pub run: RunFn,
    pub reference: RefFn,
    /// One tolerance per output.
    pub tol: Vec<Tol>,
    /// Whether gradients flow through `run` w.r.t. the float inputs.
    pub differentiable: bool,
}

/// splitmix64: the inputs' seeded source (distinct from the tensor RNG under test).
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn draw(values: Values, n: usize, rng: &mut SplitMix) -> Vec<f64> {
    (0..n)
        .map(|_| match values {
            Values::Uniform(lo, hi) => lo + (hi - lo) * rng.unit(),
            Values::AwayFromZero(lo, hi) => {
                let m = lo + (hi - lo) * rng.unit();
                if rng.next_u64() & 1 == 0 {
                    m
                } else {
                    -m
                }
            }
            Values::Ints(lo, hi) => (lo + (rng.next_u64() % (hi - lo) as u64) as i64) as f64,
            Values::Bools | Values::PaddingMask(_) => (rng.next_u64() & 1) as f64,
        })
        .collect()
}

/// Applies `Values::PaddingMask`'s rules to drawn values stored as `store_shape` (the logical
/// last dim `keys` at column offset `off` of each stored row).
fn padding_mask(vals: &mut [f64], store_shape: &[usize], keys: usize, off: usize, full: bool) {
    let w = store_shape.last().copied().unwrap_or(0);
    if w == 0 || keys == 0 {
        return;
    }
    let rows = vals.len() / w;
    for r in 0..rows {
        vals[r * w + off] = 0.0;
    }
    if full && rows > 0 {
        vals[(rows - 1) * w + off..(rows - 1) * w + off + keys].fill(1.0);
    }
}

/// Builds one input on `device` with the requested view, and its exact f64 values (after
/// rounding to the dtype) for the reference.
pub fn make_input(input: &Input, device: &Device, rng: &mut SplitMix) -> Result<(Tensor, Ref)> {
    let shape = &input.shape;
    let (store_shape, view): (Vec<usize>, View) = match input.view {
        View::Transposed if shape.len() >= 2 => {
            let mut s = shape.clone();
            let r = s.len();
            s.swap(r - 1, r - 2);
            (s, View::Transposed)
        }
        View::Narrowed if !shape.is_empty() => {
            let mut s = shape.clone();
            *s.last_mut().unwrap_or(&mut 0) += 3;
            (s, View::Narrowed)
        }
        _ => (shape.clone(), View::Contiguous),
    };
    let n: usize = store_shape.iter().product();
    let mut vals = draw(input.values, n, rng);
    if let Values::PaddingMask(full) = input.values {
        let keys = shape.last().copied().unwrap_or(0);
        let off = (view == View::Narrowed) as usize;
        padding_mask(&mut vals, &store_shape, keys, off, full);
    }
    let t = Tensor::from_host(
        HostBuffer::from_f64_slice(input.dtype, &vals),
        store_shape,
        device,
    )?;
    let t = match view {
        View::Transposed => t.t()?,
        View::Narrowed => t.narrow(-1, 1, *shape.last().unwrap_or(&0))?,
        View::Contiguous => t,
    };
    let data = t.to_vec_f64()?;
    Ok((t, Ref::new(shape.clone(), data)))
}

/// Largest violation of the tolerance, as (index, got, want); `None` when all within.
pub fn compare(got: &[f64], want: &[f64], tol: Tol) -> Option<(usize, f64, f64)> {
    let mut worst: Option<(usize, f64, f64, f64)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok =
            (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol.atol + tol.rtol * w.abs();
        if !ok {
            let excess = if (g - w).is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs()
            };
            if worst.is_none_or(|(_, _, _, e)| excess > e) {
                worst = Some((i, g, w, excess));
            }
        }
    }
    worst.map(|(i, g, w, _)| (i, g, w))
}

/// Runs a case on `device` and compares every output with the f64 reference.
pub fn check_case(case: &OpCase, device: &Device, seed: u64) -> std::result::Result<(), String> {
    let mut rng = SplitMix(seed);
    let mut ts = Vec::new();
    let mut refs = Vec::new();
    for input in &case.inputs {
        let (t, r) = make_input(input, device, &mut rng)
            .map_err(|e| format!("{}: making inputs: {e}", case.name))?;
        ts.push(t);
        refs.push(r);
    }
    let outs = (case.run)(&ts).map_err(|e| format!("{}: {e}", case.name))?;
    let wants = (case.reference)(&refs);
    if outs.len() != wants.len() {
        return Err(format!(
            "{}: {} outputs, reference has {}",
            case.name,
            outs.len(),
            wants.len()
        ));
    }
    for (k, (o, w)) in outs.iter().zip(&wants).enumerate() {
        if o.dims() != w.shape.as_slice() {
            return Err(format!(
                "{}: output {k} has shape {:?}, reference {:?}",
                case.name,
                o.dims(),
                w.shape
            ));
        }
        let got = o
            .to_vec_f64()
            .map_err(|e| format!("{}: reading output {k}: {e}", case.name))?;
        let tol = case.tol.get(k).copied().unwrap_or(Tol {
            atol: 0.0,
            rtol: 0.0,
        });
        if let Some((i, g, wv)) = compare(&got, &w.data, tol) {
            return Err(format!(
                "{}: output {k} element {i}: got {g}, want {wv} (atol {}, rtol {})",
                case.name, tol.atol, tol.rtol
            ));
        }
    }
    Ok(())
}

/// Runs every case; returns (passed count, failure messages).
pub fn check_all(device: &Device) -> (usize, Vec<String>) {
    let mut passed = 0;
    let mut failures = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        match check_case(case, device, 1000 + i as u64) {
            Ok(()) => passed += 1,
            Err(e) => failures.push(e),
        }
    }
    (passed, failures)
}

/// Runs a case on `device` and on `oracle` (the CPU) with the same inputs; every output must
/// match the f64 reference and the oracle's output, each within the case's tolerance.
pub fn check_case_vs(
    case: &OpCase,
    device: &Device,
    oracle: &Device,
    seed: u64,
) -> std::result::Result<(), String> {
    check_case(case, device, seed)?;
    let run_on = |dev: &Device| -> std::result::Result<Vec<Vec<f64>>, String> {
        let mut rng = SplitMix(seed);
        let mut ts = Vec::new();
        for input in &case.inputs {
            let (t, _) = make_input(input, dev, &mut rng)
                .map_err(|e| format!("{}: making inputs: {e}", case.name))?;
            ts.push(t);
        }
        let outs = (case.run)(&ts).map_err(|e| format!("{}: {e}", case.name))?;
        outs.iter()
            .map(|o| {
                o.to_vec_f64()
                    .map_err(|e| format!("{}: reading: {e}", case.name))
            })
            .collect()
    };
    let got = run_on(device)?;
    let want = run_on(oracle)?;
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let tol = case.tol.get(k).copied().unwrap_or(Tol {
            atol: 0.0,
            rtol: 0.0,
        });
        if let Some((i, gv, wv)) = compare(g, w, tol) {
            return Err(format!(
                "{}: output {k} element {i}: got {gv}, the oracle {wv} (atol {}, rtol {})",
                case.name, tol.atol, tol.rtol
            ));
        }
    }
    Ok(())
}

/// Every case on `device` against the f64 reference and `oracle`; (passed, failures).
pub fn check_all_vs(device: &Device, oracle: &Device) -> (usize, Vec<String>) {
    let mut passed = 0;
    let mut failures = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        match check_case_vs(case, device, oracle, 1000 + i as u64) {
            Ok(()) => passed += 1,
            Err(e) => failures.push(e),
        }
    }
    (passed, failures)
}
