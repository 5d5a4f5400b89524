//! Fused multi-tensor optimizer updates: the small closed API behind `ferrite-train`'s
//! optimizers (DESIGN.md, "Training": one launch per parameter group and dtype).
//!
//! Why not an `Op`: ops are pure (each returns new storages and autodiff records it); an
//! optimizer update rewrites many existing buffers in place (parameters and their state), the
//! same contract as `Backend::write_into`. So it is three `Backend` methods beside `write_into`,
//! [`Backend::sum_squares`] (the multi-tensor norm), [`Backend::step_scalars`] (the step's
//! device scalars from its gradients: sum of squares, norm, finiteness, step counters) and [`Backend::fused_update`], reached
//! through [`sum_squares`], [`step_scalars`] and [`fused_update`] here, which validate the
//! request first.
//!
//! Numerics (what the composed reference in `ferrite-train` does, op for op): per-element work
//! in f32 for f32/f16/bf16 tensors (f64 for f64), each f64 hyperparameter rounded once to the
//! compute type, bias corrections and the learning-rate terms computed from the f64 device
//! scalars in f64 and then rounded. On the CPU the f32 result equals the composed one bit for
//! bit; CUDA may contract multiply-adds (FMA) and so differs in the last bits.

use crate::{DType, Device, Error, Layout, Result, Tensor};

/// One update rule with its constant hyperparameters (the learning rate and step count come
/// from device scalars). Field meanings are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpdateRule {
    /// State: `[momentum_buffer]` when `momentum > 0`, else none.
    Sgd {
        momentum: f64,
        dampening: f64,
        nesterov: bool,
        weight_decay: f64,
    },
    /// State: `[exp_avg, exp_avg_sq]`, plus `max_exp_avg_sq` with amsgrad. `decoupled`: AdamW.
    Adam {
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
        amsgrad: bool,
        decoupled: bool,
    },
    /// State: `[square_avg]`, then `momentum_buffer` when `momentum > 0`, then `grad_avg`
    /// when centered.
    RmsProp {
        alpha: f64,
        eps: f64,
        weight_decay: f64,
        momentum: f64,
        centered: bool,
    },
    /// State: `[sum]`.
    Adagrad {
        lr_decay: f64,
        weight_decay: f64,
        eps: f64,
    },
    /// State: `[exp_avg]`.
    Lion {
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
    },
    /// State: `[exp_avg, exp_avg_sq]`. The trust ratio ‖w‖ / ‖r‖ (1 where either is 0) needs
    /// each tensor's norms first: backends run it in two passes.
    Lamb {
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

impl UpdateRule {
    /// Number of state tensors per parameter.
    pub fn num_states(&self) -> usize {
        match *self {
            UpdateRule::Sgd { momentum, .. } => usize::from(momentum > 0.0),
            UpdateRule::Adam { amsgrad, .. } => 2 + usize::from(amsgrad),
            UpdateRule::RmsProp {
                momentum, centered, ..
            } => 1 + usize::from(momentum > 0.0) + usize::from(centered),
            UpdateRule::Adagrad { .. } | UpdateRule::Lion { .. } => 1,
            UpdateRule::Lamb { .. } => 2,
        }
    }
}

/// Gradient clipping folded into the update (the norm itself comes from [`sum_squares`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpdateClip {
    None,
    /// Scale each gradient by min(max / (norm + 1e-6), 1), PyTorch's `clip_grad_norm_`.
    Norm(f64),
    /// Clamp each gradient element to [-v, v].
    Value(f64),
}

/// One fused update of a parameter group's tensors of one dtype, in place.
pub struct FusedUpdate<'a> {
    pub rule: UpdateRule,
    /// Contiguous parameters, rewritten in place.
    pub params: &'a [Tensor],
    /// Their gradients (same shapes and dtype; any layout the backend accepts: contiguous).
    pub grads: &'a [Tensor],
    /// Per parameter, `rule.num_states()` contiguous state tensors (same shape and dtype),
    /// rewritten in place.
    pub states: &'a [Vec<Tensor>],
    /// Per parameter: this is its first update (SGD's momentum buffer starts as the gradient).
    pub first: &'a [bool],
    /// f64 scalars on the device: the learning rate, and this update's step number (1-based,
    /// already counting it).
    pub lr: &'a Tensor,
    pub step: &'a Tensor,
    /// f64 scalar on the device: the sum of squares of all gradients of the optimizer (from
    /// [`sum_squares`]). When its square root is not finite the update changes nothing.
    pub grad_sq: &'a Tensor,
    /// An f64 device scalar every gradient is multiplied by first (a loss scaler's 1 / scale);
    /// `grad_sq` is then of the gradients before it, and its root is scaled likewise.
    pub grad_scale: Option<&'a Tensor>,
    pub clip: UpdateClip,
}

fn f64_scalar(op: &'static str, what: &str, t: &Tensor, dev: &Device) -> Result<()> {
    if t.dtype() != DType::F64 || t.elem_count() != 1 || !t.device().same(dev) {
        return Err(Error::shape(
            op,
            format!(
                "{what} must be an f64 scalar on {dev}, got {} {} on {}",
                t.dtype(),
                t.shape(),
                t.device()
            ),
        ));
    }
    Ok(())
}

fn is_float(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// The checks of [`sum_squares`]' inputs: floats of any dtypes, contiguous, on `device`.
fn check_norm_inputs(op: &'static str, tensors: &[Tensor], device: &Device) -> Result<()> {
    for (i, t) in tensors.iter().enumerate() {
        if !t.device().same(device) {
            return Err(Error::DeviceMismatch {
                op,
                lhs: device.to_string(),
                rhs: format!("{} (tensor {i})", t.device()),
            });
        }
        if !is_float(t.dtype()) {
            return Err(Error::dtype(
                op,
                t.dtype(),
                format!("tensor {i}: needs a float dtype"),
            ));
        }
        if !t.is_contiguous() {
            return Err(Error::shape(
                op,
                format!("tensor {i} {} must be contiguous", t.shape()),
            ));
        }
    }
    Ok(())
}

/// The sum of the squares of every element of `tensors` (floats of any dtypes, one device),
/// accumulated in f64 in a fixed order (deterministic): an f64 scalar tensor. One pass over
/// the data, a few launches in all on CUDA.
pub fn sum_squares(tensors: &[Tensor], device: &Device) -> Result<Tensor> {
    check_norm_inputs("sum_squares", tensors, device)?;
    let s = device.backend().sum_squares(tensors)?;
    Ok(Tensor::from_storage(
        s,
        Layout::contiguous(crate::Shape::from(())),
        device.clone(),
    ))
}

/// An optimizer step's device scalars, computed from its gradients and rewritten in place
/// (f64 scalars on one device), in this order: `grad_sq` = the sum of squares of every element
/// of `grads` (f64, in an order fixed by the sizes alone, as [`sum_squares`]); `norm =
/// sqrt(grad_sq)` (times `grad_scale` when given) into `grad_norm`; `finite` when `norm - norm
/// == 0`; `steps += 1`; when `first_nonfinite` is given and holds 0 and the norm is not finite,
/// it takes the new `steps`; every `group_steps` counter `+= 1` when finite. On CUDA one
/// launch for a small model's gradients (two for more than 65,536 elements or several dtypes)
/// in place of the norm's launches and a dozen scalar ops (what the composed optimizer runs).
pub struct StepScalars<'a> {
    /// Contiguous float gradients of any dtypes, on the scalars' device.
    pub grads: &'a [Tensor],
    pub grad_sq: &'a Tensor,
    pub grad_scale: Option<&'a Tensor>,
    pub grad_norm: &'a Tensor,
    pub steps: &'a Tensor,
    pub first_nonfinite: Option<&'a Tensor>,
    pub group_steps: &'a [Tensor],
}

/// Validates and runs [`StepScalars`]; returns `finite` (a bool scalar).
pub fn step_scalars(s: &StepScalars<'_>) -> Result<Tensor> {
    let op = "step_scalars";
    let dev = s.grad_sq.device().clone();
    f64_scalar(op, "the gradient sum of squares", s.grad_sq, &dev)?;
    f64_scalar(op, "the gradient norm", s.grad_norm, &dev)?;
    f64_scalar(op, "the step counter", s.steps, &dev)?;
    check_norm_inputs(op, s.grads, &dev)?;
    if let Some(t) = s.grad_scale {
        f64_scalar(op, "the gradient scale", t, &dev)?;
    }
    if let Some(t) = s.first_nonfinite {
        f64_scalar(op, "the first non-finite step", t, &dev)?;
    }
    for t in s.group_steps {
        f64_scalar(op, "a group's step counter", t, &dev)?;
    }
    crate::constant::refuse_write(op, "the gradient sum of squares", s.grad_sq)?;
    crate::constant::refuse_write(op, "the gradient norm", s.grad_norm)?;
    crate::constant::refuse_write(op, "the step counter", s.steps)?;
    for t in s.first_nonfinite.iter().copied().chain(s.group_steps) {
        crate::constant::refuse_write(op, "a step scalar", t)?;
    }
    let out = dev.backend().step_scalars(s)?;
    Ok(Tensor::from_storage(
        out,
        Layout::contiguous(crate::Shape::from(())),
        dev,
    ))
}

/// Validates and runs one fused update (see [`FusedUpdate`]).
pub fn fused_update(u: &FusedUpdate<'_>) -> Result<()> {
    let op = "fused_update";
    let n = u.params.len();
    if u.grads.len() != n || u.states.len() != n || u.first.len() != n {
        return Err(Error::shape(
            op,
            format!(
                "{n} parameters but {} gradients, {} state lists, {} first-step flags",
                u.grads.len(),
                u.states.len(),
                u.first.len()
            ),
        ));
    }
    let Some(p0) = u.params.first() else {
        return Ok(());
    };
    let dev = p0.device().clone();
    let dt = p0.dtype();
    if !is_float(dt) {
        return Err(Error::dtype(op, dt, "parameters need a float dtype"));
    }
    f64_scalar(op, "the learning rate", u.lr, &dev)?;
    f64_scalar(op, "the step count", u.step, &dev)?;
    f64_scalar(op, "the gradient sum of squares", u.grad_sq, &dev)?;
    if let Some(t) = u.grad_scale {
        f64_scalar(op, "the gradient scale", t, &dev)?;
    }
    let k = u.rule.num_states();
    for (i, ((p, g), st)) in u.params.iter().zip(u.grads).zip(u.states).enumerate() {
        let mut all = vec![(p, "parameter"), (g, "gradient")];
        all.extend(st.iter().map(|s| (s, "state")));
        if st.len() != k {
            return Err(Error::shape(
                op,
                format!(
                    "parameter {i}: {} state tensors, the rule needs {k}",
                    st.len()
                ),
            ));
        }
        for (t, what) in &all {
            if !t.device().same(&dev) {
                return Err(Error::DeviceMismatch {
                    op,
                    lhs: dev.to_string(),
                    rhs: format!("{} ({what} {i})", t.device()),
                });
            }
            if t.dtype() != dt {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: dt,
                    rhs: t.dtype(),
                });
            }
            if t.dims() != p.dims() || !t.is_contiguous() {
                return Err(Error::shape(
                    op,
                    format!(
                        "parameter {i}: {what} {} must be contiguous and of the parameter's shape {}",
                        t.shape(),
                        p.shape()
                    ),
                ));
            }
        }
    }
    // Written buffers (parameters, state) are distinct storages, and none is also read (a
    // gradient or a scalar); what is only read may be shared (two parameters of `a + b` get
    // one gradient tensor). The CPU backend holds all of them at once.
    let key = |t: &Tensor| std::sync::Arc::as_ptr(t.storage_arc()) as *const () as usize;
    let mut written = std::collections::HashSet::new();
    for t in u.params.iter().chain(u.states.iter().flatten()) {
        crate::constant::refuse_write(op, "a parameter or state tensor", t)?;
        if !written.insert(key(t)) {
            return Err(Error::shape(
                op,
                "parameters and state tensors must be distinct storages",
            ));
        }
    }
    for t in u
        .grads
        .iter()
        .chain([u.lr, u.step, u.grad_sq])
        .chain(u.grad_scale)
    {
        if written.contains(&key(t)) {
            return Err(Error::shape(
                op,
                "a gradient or scalar shares its storage with a parameter or state tensor",
            ));
        }
    }
    dev.backend().fused_update(u)
}
