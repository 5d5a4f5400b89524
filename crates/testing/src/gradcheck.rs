//! Gradient mode of the harness: every differentiable case, in float64 on the given device,
//! backward through `ferrite-autodiff` against central finite differences.
//!
//! The scalar differentiated is `sum_k sum(out_k * w_k)` with fixed random weights `w_k`, so
//! every output element contributes. Up to `SAMPLES` elements of each float input are
//! perturbed by ±h (h = 1e-6 · max(1, |x|)).

use crate::{cases, make_input, Input, OpCase, SplitMix, Values};
use ferrite_autodiff::{backward, no_grad, Var};
use ferrite_core::{DType, Device, HostBuffer, Tensor};

const SAMPLES: usize = 6;

/// The differentiable cases, with their f32 inputs promoted to f64 (one case per op/shape).
pub fn grad_cases() -> Vec<OpCase> {
    cases()
        .into_iter()
        .filter(|c| c.differentiable && c.inputs.iter().any(|i| i.dtype == DType::F32))
        .map(|mut c| {
            for i in c.inputs.iter_mut() {
                if i.dtype == DType::F32 {
                    i.dtype = DType::F64;
                }
            }
            c.name = c.name.replacen("/f32/", "/f64-grad/", 1);
            c
        })
        .collect()
}

fn loss(case: &OpCase, ins: &[Tensor], weights: &[Option<Tensor>]) -> Result<Tensor, String> {
    let outs = (case.run)(ins).map_err(|e| format!("{}: {e}", case.name))?;
    let mut total: Option<Tensor> = None;
    for (o, w) in outs.iter().zip(weights) {
        if let Some(w) = w {
            let term = o
                .mul(w)
                .and_then(|t| t.sum_all())
                .map_err(|e| format!("{}: loss: {e}", case.name))?;
            total = Some(match total {
                Some(t) => t.add(&term).map_err(|e| e.to_string())?,
                None => term,
            });
        }
    }
    total.ok_or_else(|| format!("{}: no float output to differentiate", case.name))
}

/// Inputs, output weights and backward's gradients (one per input; `None` for non-float
/// inputs) of one case on `device`; `None` when the case has no differentiable output.
type Analytic = (Vec<Tensor>, Vec<Option<Tensor>>, Vec<Option<Tensor>>);

fn analytic(
    case: &OpCase,
    device: &Device,
    rng: &mut SplitMix,
    trainable: impl Fn(usize) -> bool,
) -> Result<Option<Analytic>, String> {
    let err = |e: ferrite_core::Error| format!("{}: {e}", case.name);
    let mut base = Vec::new();
    let mut vars = Vec::new();
    for (k, input) in case.inputs.iter().enumerate() {
        let (t, _) = make_input(input, device, rng).map_err(err)?;
        vars.push(if input.dtype.is_float() && trainable(k) {
            Some(Var::new(&t).map_err(err)?)
        } else {
            None
        });
        base.push(t);
    }
    let ins: Vec<Tensor> = base
        .iter()
        .zip(&vars)
        .map(|(t, v)| v.as_ref().map_or_else(|| t.clone(), |v| v.tensor().clone()))
        .collect();
    // Weights for every float output.
    let outs = no_grad(|| (case.run)(&base)).map_err(err)?;
    let mut weights = Vec::new();
    for o in &outs {
        weights.push(if o.dtype().is_float() {
            let w = Input {
                shape: o.dims().to_vec(),
                dtype: o.dtype(),
                values: Values::Uniform(-1.0, 1.0),
                view: crate::View::Contiguous,
            };
            Some(make_input(&w, device, rng).map_err(err)?.0)
        } else {
            None
        });
    }
    if weights.iter().all(Option::is_none) {
        return Ok(None);
    }
    let l = loss(case, &ins, &weights)?;
    if !l.requires_grad() {
        return Err(format!(
            "{}: loss does not require a gradient: the op was not recorded",
            case.name
        ));
    }
    backward(&l).map_err(err)?;
    let mut grads = Vec::new();
    for (k, (t, v)) in base.iter().zip(&vars).enumerate() {
        let Some(v) = v else {
            grads.push(None);
            continue;
        };
        let grad = match v.grad() {
            Some(g) => g,
            // No path from this input to the loss: the gradient is zero.
            None => t.zeros_like().map_err(err)?,
        };
        if grad.dims() != t.dims() {
            return Err(format!(
                "{}: gradient of input {k} has shape {:?}, input {:?}",
                case.name,
                grad.dims(),
                t.dims()
            ));
        }
        grads.push(Some(grad));
    }
    Ok(Some((base, weights, grads)))
}

/// Checks one case's gradients on `device`; `Ok(false)` when it has no differentiable output.
pub fn grad_check_case(case: &OpCase, device: &Device, seed: u64) -> Result<bool, String> {
    let mut rng = SplitMix(seed);
    let err = |e: ferrite_core::Error| format!("{}: {e}", case.name);
    let Some((base, weights, grads)) = analytic(case, device, &mut rng, |_| true)? else {
        return Ok(false);
    };
    for (k, (t, grad)) in base.iter().zip(&grads).enumerate() {
        let Some(grad) = grad else { continue };
        let g = grad.to_vec_f64().map_err(err)?;
        let x = t.to_vec_f64().map_err(err)?;
        let picks: Vec<usize> = if x.len() <= SAMPLES {
            (0..x.len()).collect()
        } else {
            (0..SAMPLES)
                .map(|_| (rng.next_u64() % x.len() as u64) as usize)
                .collect()
        };
        for e in picks {
            let h = 1e-6 * x[e].abs().max(1.0);
            let eval = |delta: f64| -> Result<f64, String> {
                let mut xv = x.clone();
                xv[e] += delta;
                let xt = Tensor::from_host(HostBuffer::F64(xv), t.dims(), device).map_err(err)?;
                let mut ins2 = base.clone();
                ins2[k] = xt;
                no_grad(|| loss(case, &ins2, &weights))?
                    .to_vec_f64()
                    .map_err(err)
                    .map(|v| v[0])
            };
            let numeric = (eval(h)? - eval(-h)?) / (2.0 * h);
            if (g[e] - numeric).abs() > 1e-6 + 1e-5 * numeric.abs() {
                return Err(format!(
                    "{}: d/d input {k}[{e}]: backward {} vs finite difference {numeric}",
                    case.name, g[e]
                ));
            }
        }
    }
    Ok(true)
}

/// Runs every gradient case; returns (checked count, failure messages).
pub fn grad_check_all(device: &Device) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (i, case) in grad_cases().iter().enumerate() {
        match grad_check_case(case, device, 5000 + i as u64) {
            Ok(true) => checked += 1,
            Ok(false) => {}
            Err(e) => failures.push(e),
        }
    }
    (checked, failures)
}

/// Backward of one case on `device` against backward on `oracle` (same inputs and weights):
/// every input gradient equal within 1e-9 + 1e-7 relative (the cases run in f64).
pub fn grad_compare_case(
    case: &OpCase,
    device: &Device,
    oracle: &Device,
    seed: u64,
) -> Result<bool, String> {
    grad_compare_case_tol(case, device, oracle, seed, EXACT)
}

/// Gradients of `case` on `device` and `oracle` agree within `tol` (for devices that compute
/// in another precision, e.g. f32 cases on two backends); `Ok(false)` when it has no
/// differentiable output.
pub fn grad_compare_case_tol(
    case: &OpCase,
    device: &Device,
    oracle: &Device,
    seed: u64,
    tol: crate::Tol,
) -> Result<bool, String> {
    let got = analytic(case, device, &mut SplitMix(seed), |_| true)?;
    let want = analytic(case, oracle, &mut SplitMix(seed), |_| true)?;
    let (Some((_, _, g)), Some((_, _, w))) = (got, want) else {
        return Ok(false);
    };
    for (k, (g, w)) in g.iter().zip(&w).enumerate() {
        let (Some(g), Some(w)) = (g, w) else { continue };
        if let Some((i, gv, wv)) = differ(case, g, w, tol)? {
            return Err(format!(
                "{}: d/d input {k}[{i}]: {gv} on the device, {wv} on the oracle",
                case.name
            ));
        }
    }
    Ok(true)
}

/// Gradients of the same f64 case on two backends: 1e-9 + 1e-7 relative.
const EXACT: crate::Tol = crate::Tol {
    atol: 1e-9,
    rtol: 1e-7,
};

/// The first element where two gradients differ by more than `tol`.
fn differ(
    case: &OpCase,
    g: &Tensor,
    w: &Tensor,
    tol: crate::Tol,
) -> Result<Option<(usize, f64, f64)>, String> {
    let err = |e: ferrite_core::Error| format!("{}: {e}", case.name);
    let (g, w) = (g.to_vec_f64().map_err(err)?, w.to_vec_f64().map_err(err)?);
    Ok(crate::compare(&g, &w, tol))
}

/// Backward of one case with one float input trainable at a time, against backward with all
/// of them trainable (same inputs and weights). Recording keeps of each input only what the
/// op's rule reads given which inputs require a gradient (`ferrite_core::graph::keeps`), so
/// this runs every rule under the other patterns too. Returns how many inputs were checked.
pub fn grad_single_input_case(case: &OpCase, device: &Device, seed: u64) -> Result<usize, String> {
    let floats: Vec<usize> = (0..case.inputs.len())
        .filter(|&k| case.inputs[k].dtype.is_float())
        .collect();
    if floats.len() < 2 {
        return Ok(0);
    }
    let Some((_, _, all)) = analytic(case, device, &mut SplitMix(seed), |_| true)? else {
        return Ok(0);
    };
    for &k in &floats {
        let one = analytic(case, device, &mut SplitMix(seed), |i| i == k)?;
        let (Some((_, _, one)), Some(want)) = (one, &all[k]) else {
            return Err(format!("{}: no gradient for input {k} alone", case.name));
        };
        let got = one[k]
            .as_ref()
            .ok_or_else(|| format!("{}: no gradient for input {k} alone", case.name))?;
        if let Some((i, gv, wv)) = differ(case, got, want, EXACT)? {
            return Err(format!(
                "{}: d/d input {k}[{i}]: {gv} with only it trainable, {wv} with all",
                case.name
            ));
        }
    }
    Ok(floats.len())
}

/// `grad_single_input_case` over every gradient case; (inputs checked, failures).
pub fn grad_single_input_all(device: &Device) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (i, case) in grad_cases().iter().enumerate() {
        match grad_single_input_case(case, device, 5000 + i as u64) {
            Ok(n) => checked += n,
            Err(e) => failures.push(e),
        }
    }
    (checked, failures)
}

/// Every gradient case on `device` against `oracle`; (compared count, failures).
pub fn grad_compare_all(device: &Device, oracle: &Device) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (i, case) in grad_cases().iter().enumerate() {
        match grad_compare_case(case, device, oracle, 5000 + i as u64) {
            Ok(true) => checked += 1,
            Ok(false) => {}
            Err(e) => failures.push(e),
        }
    }
    (checked, failures)
}
