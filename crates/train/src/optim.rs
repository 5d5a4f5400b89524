//! Optimizers with PyTorch's update rules: SGD (momentum, dampening, Nesterov, weight decay),
//! Adam / AdamW (amsgrad), RMSprop (alpha, centered, momentum), Adagrad (lr decay, initial
//! accumulator), Lion and LAMB (trust ratio); parameter groups with their own hyperparameters,
//! gradient clipping by global norm or by value and non-finite detection, all on the device.
//!
//! State lives on the device beside the parameters ([`ferrite_nn::Buffer`]s written in place),
//! and so do the learning rate and step count of each group (f64 device scalars): a step
//! reads the host nothing and waits for nothing; a scheduler's `set_lr` writes the scalar.
//! By default an update is fused ([`Implementation::Fused`]): per parameter group and dtype
//! one multi-tensor kernel (`ferrite_core::optim::fused_update`: chunked CUDA launches over
//! many tensors, or a threaded CPU loop) updates parameters and state in place, after one
//! multi-tensor sum of squares for the global gradient norm. [`Implementation::Composed`]
//! builds the same update from tensor ops (10-20 small ops per parameter): the slow reference
//! the fused kernels are tested against.
//!
//! Non-finite gradients: each step computes the global gradient norm on the device; when it
//! is not finite the step leaves parameters and state untouched and records the step number
//! in a device flag, which [`Optimizer::check_finite`] reads (call it when the loss is logged).

use crate::lr_scheduler::ParamGroups;
use crate::{Error, Result};
use ferrite_core::optim::{FusedUpdate, StepScalars, UpdateClip, UpdateRule};
use ferrite_core::{DType, Device, DeviceKind, Tensor};
use ferrite_nn::{Buffer, Parameter};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// An optimizer's update rule and its hyperparameters (learning rate apart).
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    Sgd {
        momentum: f64,
        dampening: f64,
        nesterov: bool,
        weight_decay: f64,
    },
    /// Adam (`decoupled: false`: L2 weight decay added to the gradient) or AdamW (`true`).
    Adam {
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
        amsgrad: bool,
        decoupled: bool,
    },
    RmsProp {
        alpha: f64,
        eps: f64,
        weight_decay: f64,
        momentum: f64,
        centered: bool,
    },
    Adagrad {
        lr_decay: f64,
        weight_decay: f64,
        initial_accumulator_value: f64,
        eps: f64,
    },
    Lion {
        betas: (f64, f64),
        weight_decay: f64,
    },
    Lamb {
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
    },
}

impl Rule {
    /// PyTorch's defaults for each optimizer.
    pub fn sgd() -> Rule {
        Rule::Sgd {
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
    pub fn adam() -> Rule {
        Rule::Adam {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            decoupled: false,
        }
    }
    pub fn adamw() -> Rule {
        Rule::Adam {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            amsgrad: false,
            decoupled: true,
        }
    }
    pub fn rmsprop() -> Rule {
        Rule::RmsProp {
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
        }
    }
    pub fn adagrad() -> Rule {
        Rule::Adagrad {
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
        }
    }
    pub fn lion() -> Rule {
        Rule::Lion {
            betas: (0.9, 0.99),
            weight_decay: 0.0,
        }
    }
    pub fn lamb() -> Rule {
        Rule::Lamb {
            betas: (0.9, 0.999),
            eps: 1e-6,
            weight_decay: 0.0,
        }
    }

    /// PyTorch's class name.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::Sgd { .. } => "SGD",
            Rule::Adam {
                decoupled: false, ..
            } => "Adam",
            Rule::Adam {
                decoupled: true, ..
            } => "AdamW",
            Rule::RmsProp { .. } => "RMSprop",
            Rule::Adagrad { .. } => "Adagrad",
            Rule::Lion { .. } => "Lion",
            Rule::Lamb { .. } => "LAMB",
        }
    }

    /// State tensors per parameter, by PyTorch's names.
    fn state_names(&self) -> Vec<&'static str> {
        match self {
            Rule::Sgd { momentum, .. } if *momentum > 0.0 => vec!["momentum_buffer"],
            Rule::Sgd { .. } => vec![],
            Rule::Adam { amsgrad: true, .. } => vec!["exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
            Rule::Adam { .. } | Rule::Lamb { .. } => vec!["exp_avg", "exp_avg_sq"],
            Rule::RmsProp {
                momentum, centered, ..
            } => {
                let mut v = vec!["square_avg"];
                if *momentum > 0.0 {
                    v.push("momentum_buffer");
                }
                if *centered {
                    v.push("grad_avg");
                }
                v
            }
            Rule::Adagrad { .. } => vec!["sum"],
            Rule::Lion { .. } => vec!["exp_avg"],
        }
    }

    fn validate(&self, lr: f64) -> Result<()> {
        let what = self.name();
        let bad = |name: &str, v: f64, want: &str| {
            Err(Error::config(
                what,
                format!("{name} must be {want}, got {v}"),
            ))
        };
        if !(lr.is_finite() && lr >= 0.0) {
            return bad("learning rate", lr, "finite and >= 0");
        }
        let beta_ok = |(b1, b2): (f64, f64)| -> Result<()> {
            for (n, b) in [("beta1", b1), ("beta2", b2)] {
                if !(0.0..1.0).contains(&b) {
                    return bad(n, b, "in [0, 1)");
                }
            }
            Ok(())
        };
        let wd_ok = |wd: f64| {
            if wd.is_finite() && wd >= 0.0 {
                Ok(())
            } else {
                bad("weight_decay", wd, "finite and >= 0")
            }
        };
        let eps_ok = |eps: f64| {
            if eps.is_finite() && eps > 0.0 {
                Ok(())
            } else {
                bad("eps", eps, "finite and > 0")
            }
        };
        match *self {
            Rule::Sgd {
                momentum,
                dampening,
                nesterov,
                weight_decay,
            } => {
                wd_ok(weight_decay)?;
                if !(momentum.is_finite() && momentum >= 0.0) {
                    return bad("momentum", momentum, "finite and >= 0");
                }
                if !dampening.is_finite() {
                    return bad("dampening", dampening, "finite");
                }
                if nesterov && (momentum <= 0.0 || dampening != 0.0) {
                    return Err(Error::config(
                        what,
                        format!("Nesterov momentum needs momentum > 0 and zero dampening, got momentum {momentum}, dampening {dampening}"),
                    ));
                }
            }
            Rule::Adam {
                betas,
                eps,
                weight_decay,
                ..
            }
            | Rule::Lamb {
                betas,
                eps,
                weight_decay,
            } => {
                beta_ok(betas)?;
                eps_ok(eps)?;
                wd_ok(weight_decay)?;
            }
            Rule::RmsProp {
                alpha,
                eps,
                weight_decay,
                momentum,
                ..
            } => {
                if !(0.0..=1.0).contains(&alpha) {
                    return bad("alpha", alpha, "in [0, 1]");
                }
                eps_ok(eps)?;
                wd_ok(weight_decay)?;
                if !(momentum.is_finite() && momentum >= 0.0) {
                    return bad("momentum", momentum, "finite and >= 0");
                }
            }
            Rule::Adagrad {
                lr_decay,
                weight_decay,
                initial_accumulator_value,
                eps,
            } => {
                if !(lr_decay.is_finite() && lr_decay >= 0.0) {
                    return bad("lr_decay", lr_decay, "finite and >= 0");
                }
                if !(initial_accumulator_value.is_finite() && initial_accumulator_value >= 0.0) {
                    return bad(
                        "initial_accumulator_value",
                        initial_accumulator_value,
                        "finite and >= 0",
                    );
                }
                wd_ok(weight_decay)?;
                eps_ok(eps)?;
            }
            Rule::Lion {
                betas,
                weight_decay,
            } => {
                beta_ok(betas)?;
                wd_ok(weight_decay)?;
            }
        }
        Ok(())
    }
}

/// Gradient clipping applied at each step, on the device (PyTorch's `clip_grad_norm_` /
/// `clip_grad_value_` before `step`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Clip {
    /// Scale every gradient by min(1, max_norm / (global L2 norm + 1e-6)).
    Norm(f64),
    /// Clamp every gradient element to [-v, v].
    Value(f64),
}

/// How [`Optimizer::step`] runs the update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// One multi-tensor kernel per parameter group and dtype (the default).
    Fused,
    /// Composed from tensor ops, per parameter: the reference.
    Composed,
}

/// Named parameters with one learning rate and rule.
pub struct ParamGroup {
    pub params: Vec<(String, Parameter)>,
    pub lr: f64,
    pub rule: Rule,
}

struct Group {
    params: Vec<(String, Parameter)>,
    rule: Rule,
    lr: f64,
    initial_lr: Option<f64>,
    /// The learning rate and the number of steps taken, as f64 device scalars.
    lr_t: Tensor,
    step_t: Tensor,
    /// Per parameter: its state tensors in `rule.state_names()` order (created at the first
    /// step that has a gradient, as PyTorch's lazy state).
    state: Vec<Vec<Buffer>>,
    /// Per parameter: its f32 master copy, when master weights are on and the parameter is
    /// f16/bf16 (created with the state).
    master: Vec<Option<Buffer>>,
}

/// An optimizer over parameter groups on one device.
pub struct Optimizer {
    groups: Vec<Group>,
    device: Device,
    clip: Option<Clip>,
    steps: u64,
    implementation: Implementation,
    master_weights: bool,
    /// f64 device scalars: the gradients' sum of squares and global norm of the last step,
    /// and the first step (1-based) whose gradients were not finite (0: none).
    grad_sq: Tensor,
    grad_norm: Tensor,
    first_nonfinite: Tensor,
    /// Steps taken, as an f64 device scalar (what the non-finite flag records).
    steps_t: Tensor,
}

/// An f64 device scalar, filled by a kernel (not uploaded: a step may run inside a CUDA graph
/// capture, where uploads are refused).
fn scalar(v: f64, dev: &Device) -> Result<Tensor> {
    Ok(Tensor::full(v, (), DType::F64, dev)?)
}

impl Optimizer {
    /// One group.
    pub fn new(params: Vec<(String, Parameter)>, lr: f64, rule: Rule) -> Result<Optimizer> {
        Optimizer::with_groups(vec![ParamGroup { params, lr, rule }])
    }

    /// Several groups, each with its own rule and learning rate. Every parameter must be on
    /// one device and appear once.
    pub fn with_groups(groups: Vec<ParamGroup>) -> Result<Optimizer> {
        let what = "Optimizer";
        let device = groups
            .iter()
            .flat_map(|g| g.params.first())
            .map(|(_, p)| p.device().clone())
            .next()
            .ok_or_else(|| Error::config(what, "got no parameters"))?;
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for g in groups {
            g.rule.validate(g.lr)?;
            for (name, p) in &g.params {
                if !p.device().same(&device) {
                    return Err(Error::config(
                        what,
                        format!(
                            "parameter {name} is on {}, the others on {device}",
                            p.device()
                        ),
                    ));
                }
                if !seen.insert(name.clone()) {
                    return Err(Error::config(
                        what,
                        format!("parameter {name} appears in more than one place"),
                    ));
                }
            }
            out.push(Group {
                state: vec![Vec::new(); g.params.len()],
                master: vec![None; g.params.len()],
                lr_t: scalar(g.lr, &device)?,
                step_t: scalar(0.0, &device)?,
                params: g.params,
                rule: g.rule,
                lr: g.lr,
                initial_lr: None,
            });
        }
        // The wgpu backend has no fused kernels (its `fused_update` is an error).
        let implementation = if matches!(device.kind(), DeviceKind::Wgpu(_)) {
            Implementation::Composed
        } else {
            Implementation::Fused
        };
        Ok(Optimizer {
            grad_sq: scalar(0.0, &device)?,
            grad_norm: scalar(0.0, &device)?,
            first_nonfinite: scalar(0.0, &device)?,
            steps_t: scalar(0.0, &device)?,
            groups: out,
            device,
            clip: None,
            steps: 0,
            implementation,
            master_weights: false,
        })
    }

    pub fn set_clip(&mut self, clip: Option<Clip>) -> Result<()> {
        if let Some(Clip::Norm(v) | Clip::Value(v)) = clip {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::config(
                    "Optimizer",
                    format!("clipping threshold must be finite and > 0, got {v}"),
                ));
            }
        }
        self.clip = clip;
        Ok(())
    }

    /// Fused (the default) or composed updates; both give the same trajectory (bit for bit on
    /// the CPU in f32) and share the state, so this may change between steps.
    pub fn set_implementation(&mut self, implementation: Implementation) {
        self.implementation = implementation;
    }

    pub fn implementation(&self) -> Implementation {
        self.implementation
    }

    /// fp32 master weights for f16/bf16 parameters: from each such parameter's first step on,
    /// the update (and its state) runs on an f32 copy, and the parameter receives the copy
    /// rounded to its dtype after every step, so updates smaller than the half-precision
    /// spacing accumulate instead of rounding away. Off by default; switch it on before the
    /// first step (a parameter keeps the mode of its first step).
    pub fn set_master_weights(&mut self, on: bool) {
        self.master_weights = on;
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Counts a step that a replayed CUDA graph took (the device counters advance with the
    /// replay; the host count, kept in `state_dict`, needs this).
    pub fn count_replayed_step(&mut self) {
        self.steps += 1;
    }

    /// The global gradient L2 norm of the last step (a device scalar; reading it waits).
    pub fn grad_norm(&self) -> &Tensor {
        &self.grad_norm
    }

    /// Clears every parameter's gradient.
    pub fn zero_grad(&self) {
        for g in &self.groups {
            for (_, p) in &g.params {
                p.zero_grad();
            }
        }
    }

    /// Reads the non-finite flag (one host wait): an error naming the first step whose
    /// gradients were not finite (that step and any later such step changed nothing).
    pub fn check_finite(&self) -> Result<()> {
        let step = self.first_nonfinite.item::<f64>()?;
        if step > 0.0 {
            return Err(Error::state(
                "Optimizer",
                format!(
                    "gradients were not finite (NaN or infinite) at step {step}; that update was skipped"
                ),
            ));
        }
        Ok(())
    }

    /// One update of every parameter that has a gradient.
    pub fn step(&mut self) -> Result<()> {
        self.step_scaled(None).map(|_| ())
    }

    /// One update with every gradient first multiplied by `grad_scale` (an f64 device scalar:
    /// a loss scaler's 1 / scale). A step whose gradients are not finite changes nothing, and
    /// with a scale it is not reported by `check_finite` (overflow is what the scaler expects
    /// and handles). Returns the step's "gradients were finite" boolean device scalar.
    pub fn step_scaled(&mut self, grad_scale: Option<&Tensor>) -> Result<Tensor> {
        if let Some(t) = grad_scale {
            if t.dtype() != DType::F64 || t.elem_count() != 1 || !t.device().same(&self.device) {
                return Err(Error::config(
                    "Optimizer",
                    format!(
                        "the gradient scale must be an f64 scalar on {}, got {} {} on {}",
                        self.device,
                        t.dtype(),
                        t.shape(),
                        t.device()
                    ),
                ));
            }
        }
        match self.implementation {
            Implementation::Fused => self.step_fused(grad_scale),
            Implementation::Composed => self.step_composed(grad_scale),
        }
    }

    /// Keeps the global norm, flags the step when it is not finite (unless `scaled`); returns
    /// the "finite" boolean device scalar.
    fn note_norm(&mut self, norm: &Tensor, scaled: bool) -> Result<Tensor> {
        let dev = self.device.clone();
        self.grad_norm.copy_(norm)?;
        // finite ⇔ norm - norm == 0 (NaN for inf and NaN).
        let finite = norm.sub(norm)?.eq(&scalar(0.0, &dev)?)?;
        let steps = self.steps_t.add_scalar(1.0)?;
        self.steps_t.copy_(&steps)?;
        if scaled {
            return Ok(finite);
        }
        let bad_now = finite.cast(DType::F64)?.neg()?.add_scalar(1.0)?;
        let unset = self
            .first_nonfinite
            .eq(&scalar(0.0, &dev)?)?
            .cast(DType::F64)?;
        // The step number from the device counter (a captured step replays with the count of
        // the moment, not the one at capture).
        let mark = bad_now.mul(&unset)?.mul(&steps)?;
        let flag = self.first_nonfinite.add(&mark)?;
        self.first_nonfinite.copy_(&flag)?;
        Ok(finite)
    }

    fn step_fused(&mut self, grad_scale: Option<&Tensor>) -> Result<Tensor> {
        self.steps += 1;
        let mut grads: Vec<Vec<Option<Tensor>>> = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let mut v = Vec::with_capacity(g.params.len());
            for (_, p) in &g.params {
                v.push(p.grad().map(|t| t.contiguous()).transpose()?);
            }
            grads.push(v);
        }
        let all: Vec<Tensor> = grads.iter().flatten().flatten().cloned().collect();
        // The gradients' sum of squares, the norm, the non-finite flag and every step counter
        // in one launch for a small model (what `note_norm` and the per-group counters
        // compose from tensor ops).
        let group_steps: Vec<Tensor> = self.groups.iter().map(|g| g.step_t.clone()).collect();
        let finite = ferrite_core::optim::step_scalars(&StepScalars {
            grads: &all,
            grad_sq: &self.grad_sq,
            grad_scale,
            grad_norm: &self.grad_norm,
            steps: &self.steps_t,
            first_nonfinite: grad_scale.is_none().then_some(&self.first_nonfinite),
            group_steps: &group_steps,
        })?;
        let clip = match self.clip {
            None => UpdateClip::None,
            Some(Clip::Norm(m)) => UpdateClip::Norm(m),
            Some(Clip::Value(v)) => UpdateClip::Value(v),
        };
        for (g, gr) in self.groups.iter_mut().zip(grads) {
            // Per dtype: the parameters with a gradient, their state and first-step flags.
            let mut buckets: Vec<(DType, Bucket)> = Vec::new();
            for (i, grad) in gr.into_iter().enumerate() {
                let Some(grad) = grad else { continue };
                let p = g.params[i].1.clone();
                let first = g.state[i].is_empty();
                if first {
                    start_state(g, i, self.master_weights)?;
                }
                let (w, grad) = match &g.master[i] {
                    Some(m) => (m.tensor().clone(), grad.cast(DType::F32)?),
                    None => (p.tensor().detach(), grad),
                };
                let at = match buckets.iter().position(|(d, _)| *d == w.dtype()) {
                    Some(k) => k,
                    None => {
                        buckets.push((w.dtype(), Bucket::default()));
                        buckets.len() - 1
                    }
                };
                let b = &mut buckets[at].1;
                b.params.push(w);
                b.grads.push(grad);
                b.states
                    .push(g.state[i].iter().map(|s| s.tensor().clone()).collect());
                b.first.push(first);
            }
            let rule = update_rule(&g.rule);
            for (_, b) in &buckets {
                ferrite_core::optim::fused_update(&FusedUpdate {
                    rule,
                    params: &b.params,
                    grads: &b.grads,
                    states: &b.states,
                    first: &b.first,
                    lr: &g.lr_t,
                    step: &g.step_t,
                    grad_sq: &self.grad_sq,
                    grad_scale,
                    clip,
                })?;
            }
            write_back_masters(g)?;
        }
        Ok(finite)
    }

    fn step_composed(&mut self, grad_scale: Option<&Tensor>) -> Result<Tensor> {
        self.steps += 1;
        let dev = self.device.clone();
        let unscale = |gr: Tensor| -> Result<Tensor> {
            Ok(match grad_scale {
                Some(s) => gr.mul(&s.cast(gr.dtype())?)?,
                None => gr,
            })
        };
        // Global norm over every gradient (f32 partial sums, accumulated in f64).
        let mut sq = scalar(0.0, &dev)?;
        for g in &self.groups {
            for (_, p) in &g.params {
                if let Some(gr) = p.grad() {
                    let gr = unscale(gr)?;
                    let s = gr.cast(DType::F32)?.square()?.sum_all()?.cast(DType::F64)?;
                    sq = sq.add(&s)?;
                }
            }
        }
        let norm = sq.sqrt()?;
        let finite = self.note_norm(&norm, grad_scale.is_some())?;
        let coef = match self.clip {
            Some(Clip::Norm(max)) => Some(
                scalar(max, &dev)?
                    .div(&norm.add_scalar(1e-6)?)?
                    .minimum_scalar(1.0)?,
            ),
            _ => None,
        };
        for g in &mut self.groups {
            let step = g.step_t.add_scalar(1.0)?;
            g.step_t
                .copy_(&Tensor::where_cond(&finite, &step, &g.step_t)?)?;
            for i in 0..g.params.len() {
                let p = g.params[i].1.clone();
                let Some(grad) = p.grad() else { continue };
                let mut grad = unscale(grad)?;
                if let Some(c) = &coef {
                    grad = grad.mul(&c.cast(grad.dtype())?)?;
                }
                if let Some(Clip::Value(v)) = self.clip {
                    grad = grad.maximum_scalar(-v)?.minimum_scalar(v)?;
                }
                // PyTorch creates state lazily at a parameter's first step with a gradient
                // (SGD's momentum buffer then starts as that gradient).
                let first = g.state[i].is_empty();
                if first {
                    start_state(g, i, self.master_weights)?;
                }
                let w = match &g.master[i] {
                    Some(m) => {
                        grad = grad.cast(DType::F32)?;
                        m.tensor().clone()
                    }
                    None => p.tensor().detach(),
                };
                let (new_w, new_state) =
                    update(&g.rule, &w, &grad, &g.state[i], &g.lr_t, &g.step_t, first)?;
                w.copy_(&Tensor::where_cond(&finite, &new_w, &w)?)?;
                for (buf, v) in g.state[i].iter().zip(new_state) {
                    buf.tensor()
                        .copy_(&Tensor::where_cond(&finite, &v, buf.tensor())?)?;
                }
            }
            write_back_masters(g)?;
        }
        Ok(finite)
    }
}

/// One fused launch's tensors (one group, one dtype).
#[derive(Default)]
struct Bucket {
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
    states: Vec<Vec<Tensor>>,
    first: Vec<bool>,
}

/// The kernel's form of a rule (Adagrad's initial accumulator is `init_state`'s).
fn update_rule(rule: &Rule) -> UpdateRule {
    match *rule {
        Rule::Sgd {
            momentum,
            dampening,
            nesterov,
            weight_decay,
        } => UpdateRule::Sgd {
            momentum,
            dampening,
            nesterov,
            weight_decay,
        },
        Rule::Adam {
            betas: (beta1, beta2),
            eps,
            weight_decay,
            amsgrad,
            decoupled,
        } => UpdateRule::Adam {
            beta1,
            beta2,
            eps,
            weight_decay,
            amsgrad,
            decoupled,
        },
        Rule::RmsProp {
            alpha,
            eps,
            weight_decay,
            momentum,
            centered,
        } => UpdateRule::RmsProp {
            alpha,
            eps,
            weight_decay,
            momentum,
            centered,
        },
        Rule::Adagrad {
            lr_decay,
            weight_decay,
            eps,
            ..
        } => UpdateRule::Adagrad {
            lr_decay,
            weight_decay,
            eps,
        },
        Rule::Lion {
            betas: (beta1, beta2),
            weight_decay,
        } => UpdateRule::Lion {
            beta1,
            beta2,
            weight_decay,
        },
        Rule::Lamb {
            betas: (beta1, beta2),
            eps,
            weight_decay,
        } => UpdateRule::Lamb {
            beta1,
            beta2,
            eps,
            weight_decay,
        },
    }
}

/// A parameter's first step: its f32 master copy when `master` is on and it is f16/bf16, and
/// its state (f32 beside a master copy, else of the parameter's dtype).
fn start_state(g: &mut Group, i: usize, master: bool) -> Result<()> {
    let p = &g.params[i].1;
    if master && g.master[i].is_none() && matches!(p.dtype(), DType::F16 | DType::BF16) {
        g.master[i] = Some(Buffer::new(&p.tensor().detach().cast(DType::F32)?)?);
    }
    let like = match &g.master[i] {
        Some(m) => m.tensor().clone(),
        None => p.tensor().detach(),
    };
    g.state[i] = init_state(&g.rule, &like)?;
    Ok(())
}

/// Parameters with a master copy receive it rounded to their dtype (a skipped step leaves the
/// copy, so the parameter, unchanged).
fn write_back_masters(g: &Group) -> Result<()> {
    for ((_, p), m) in g.params.iter().zip(&g.master) {
        if let Some(m) = m {
            if p.grad().is_some() {
                p.copy_(&m.tensor().cast(p.dtype())?)?;
            }
        }
    }
    Ok(())
}

fn init_state(rule: &Rule, t: &Tensor) -> Result<Vec<Buffer>> {
    let fill = match rule {
        Rule::Adagrad {
            initial_accumulator_value,
            ..
        } => *initial_accumulator_value,
        _ => 0.0,
    };
    rule.state_names()
        .iter()
        .map(|_| Ok(Buffer::new(&t.full_like(fill)?)?))
        .collect()
}

/// `a + (b - a) * w` (PyTorch's `lerp`).
fn lerp(a: &Tensor, b: &Tensor, w: f64) -> Result<Tensor> {
    Ok(a.add(&b.sub(a)?.mul_scalar(w)?)?)
}

/// The new parameter and state for one parameter (w, g of one dtype; lr and step are f64
/// device scalars, `step` already counting this update).
fn update(
    rule: &Rule,
    w: &Tensor,
    g: &Tensor,
    state: &[Buffer],
    lr: &Tensor,
    step: &Tensor,
    first: bool,
) -> Result<(Tensor, Vec<Tensor>)> {
    let dt = w.dtype();
    let lr_w = lr.cast(dt)?;
    let s = |i: usize| state[i].tensor().clone();
    Ok(match *rule {
        Rule::Sgd {
            momentum,
            dampening,
            nesterov,
            weight_decay,
        } => {
            let mut d = g.clone();
            if weight_decay != 0.0 {
                d = d.add(&w.mul_scalar(weight_decay)?)?;
            }
            let mut st = Vec::new();
            if momentum != 0.0 {
                let buf = if first {
                    d.clone()
                } else {
                    s(0).mul_scalar(momentum)?
                        .add(&d.mul_scalar(1.0 - dampening)?)?
                };
                d = if nesterov {
                    d.add(&buf.mul_scalar(momentum)?)?
                } else {
                    buf.clone()
                };
                st.push(buf);
            }
            (w.sub(&d.mul(&lr_w)?)?, st)
        }
        Rule::Adam {
            betas: (b1, b2),
            eps,
            weight_decay,
            amsgrad,
            decoupled,
        } => {
            let mut w0 = w.clone();
            let mut g = g.clone();
            if weight_decay != 0.0 {
                if decoupled {
                    w0 = w0.mul(&decay(lr, weight_decay, dt)?)?;
                } else {
                    g = g.add(&w.mul_scalar(weight_decay)?)?;
                }
            }
            let m = lerp(&s(0), &g, 1.0 - b1)?;
            let v = s(1)
                .mul_scalar(b2)?
                .add(&g.mul(&g)?.mul_scalar(1.0 - b2)?)?;
            // Bias corrections in f64 on the device.
            let bc1 = pow_of(b1, step)?.neg()?.add_scalar(1.0)?;
            let bc2 = pow_of(b2, step)?.neg()?.add_scalar(1.0)?;
            let step_size = lr.div(&bc1)?.cast(dt)?;
            let bc2_sqrt = bc2.sqrt()?.cast(dt)?;
            let mut st = vec![m.clone(), v.clone()];
            let vmax = if amsgrad {
                let mx = s(2).maximum(&v)?;
                st.push(mx.clone());
                mx
            } else {
                v
            };
            let denom = vmax.sqrt()?.div(&bc2_sqrt)?.add_scalar(eps)?;
            (w0.sub(&m.div(&denom)?.mul(&step_size)?)?, st)
        }
        Rule::RmsProp {
            alpha,
            eps,
            weight_decay,
            momentum,
            centered,
        } => {
            let mut g = g.clone();
            if weight_decay != 0.0 {
                g = g.add(&w.mul_scalar(weight_decay)?)?;
            }
            let sq = s(0)
                .mul_scalar(alpha)?
                .add(&g.mul(&g)?.mul_scalar(1.0 - alpha)?)?;
            let mut st = vec![sq.clone()];
            let mut k = 1;
            let mom_idx = if momentum > 0.0 {
                k += 1;
                Some(k - 1)
            } else {
                None
            };
            let avg = if centered {
                let ga = lerp(&s(k), &g, 1.0 - alpha)?;
                let a = sq.sub(&ga.mul(&ga)?)?.sqrt()?.add_scalar(eps)?;
                st.push(ga);
                a
            } else {
                sq.sqrt()?.add_scalar(eps)?
            };
            let upd = g.div(&avg)?;
            match mom_idx {
                Some(mi) => {
                    let buf = s(mi).mul_scalar(momentum)?.add(&upd)?;
                    st.insert(1, buf.clone());
                    (w.sub(&buf.mul(&lr_w)?)?, st)
                }
                None => (w.sub(&upd.mul(&lr_w)?)?, st),
            }
        }
        Rule::Adagrad {
            lr_decay,
            weight_decay,
            eps,
            ..
        } => {
            let mut g = g.clone();
            if weight_decay != 0.0 {
                g = g.add(&w.mul_scalar(weight_decay)?)?;
            }
            // clr = lr / (1 + (step - 1) lr_decay)
            let clr = lr
                .div(
                    &step
                        .add_scalar(-1.0)?
                        .mul_scalar(lr_decay)?
                        .add_scalar(1.0)?,
                )?
                .cast(dt)?;
            let sum = s(0).add(&g.mul(&g)?)?;
            let std = sum.sqrt()?.add_scalar(eps)?;
            (w.sub(&g.div(&std)?.mul(&clr)?)?, vec![sum])
        }
        Rule::Lion {
            betas: (b1, b2),
            weight_decay,
        } => {
            let w0 = if weight_decay != 0.0 {
                w.mul(&decay(lr, weight_decay, dt)?)?
            } else {
                w.clone()
            };
            let m = s(0);
            let upd = m.mul_scalar(b1)?.add(&g.mul_scalar(1.0 - b1)?)?.sign()?;
            let m2 = m.mul_scalar(b2)?.add(&g.mul_scalar(1.0 - b2)?)?;
            (w0.sub(&upd.mul(&lr_w)?)?, vec![m2])
        }
        Rule::Lamb {
            betas: (b1, b2),
            eps,
            weight_decay,
        } => {
            let m = s(0).mul_scalar(b1)?.add(&g.mul_scalar(1.0 - b1)?)?;
            let v = s(1).mul_scalar(b2)?.add(&g.mul(g)?.mul_scalar(1.0 - b2)?)?;
            let bc1 = pow_of(b1, step)?.neg()?.add_scalar(1.0)?.cast(dt)?;
            let bc2 = pow_of(b2, step)?.neg()?.add_scalar(1.0)?.cast(dt)?;
            let mhat = m.div(&bc1)?;
            let vhat = v.div(&bc2)?;
            let mut r = mhat.div(&vhat.sqrt()?.add_scalar(eps)?)?;
            if weight_decay != 0.0 {
                r = r.add(&w.mul_scalar(weight_decay)?)?;
            }
            let wn = w.square()?.sum_all()?.sqrt()?;
            let rn = r.square()?.sum_all()?.sqrt()?;
            let zero = Tensor::zeros((), dt, w.device())?;
            let ok = wn.gt(&zero)?.cast(dt)?.mul(&rn.gt(&zero)?.cast(dt)?)?;
            // trust = ok ? wn / rn : 1, without dividing by zero.
            let safe_rn = rn.add(&ok.neg()?.add_scalar(1.0)?)?;
            let trust =
                Tensor::where_cond(&ok.gt(&zero)?, &wn.div(&safe_rn)?, &zero.add_scalar(1.0)?)?;
            (w.sub(&r.mul(&trust.mul(&lr_w)?)?)?, vec![m, v])
        }
    })
}

/// 1 - lr × weight_decay (decoupled decay), computed in f64 and rounded once to `dt`.
fn decay(lr: &Tensor, weight_decay: f64, dt: DType) -> Result<Tensor> {
    Ok(lr.mul_scalar(-weight_decay)?.add_scalar(1.0)?.cast(dt)?)
}

/// base^step for an f64 device scalar step.
fn pow_of(base: f64, step: &Tensor) -> Result<Tensor> {
    Ok(Tensor::full(base, (), DType::F64, step.device())?.pow(step)?)
}

impl ParamGroups for Optimizer {
    fn num_groups(&self) -> usize {
        self.groups.len()
    }
    fn lr(&self, group: usize) -> f64 {
        self.groups[group].lr
    }
    fn set_lr(&mut self, group: usize, lr: f64) {
        let g = &mut self.groups[group];
        g.lr = lr;
        // The device scalar is what a step reads; a failed write keeps the host value in step
        // with what the device will use next time a write succeeds.
        if let Ok(t) = Tensor::scalar(lr, &self.device) {
            let _ = g.lr_t.copy_(&t);
        }
    }
    fn initial_lr(&self, group: usize) -> Option<f64> {
        self.groups[group].initial_lr
    }
    fn set_initial_lr(&mut self, group: usize, lr: f64) {
        self.groups[group].initial_lr = Some(lr);
    }
    fn momentum(&self, group: usize) -> Option<f64> {
        match self.groups[group].rule {
            Rule::Sgd { momentum, .. } | Rule::RmsProp { momentum, .. } => Some(momentum),
            Rule::Adam { betas, .. } | Rule::Lion { betas, .. } | Rule::Lamb { betas, .. } => {
                Some(betas.0)
            }
            Rule::Adagrad { .. } => None,
        }
    }
    fn set_momentum(&mut self, group: usize, m: f64) {
        match &mut self.groups[group].rule {
            Rule::Sgd { momentum, .. } | Rule::RmsProp { momentum, .. } => *momentum = m,
            Rule::Adam { betas, .. } | Rule::Lion { betas, .. } | Rule::Lamb { betas, .. } => {
                betas.0 = m
            }
            Rule::Adagrad { .. } => {}
        }
    }
}

impl Optimizer {
    /// The optimizer's state: tensors by `"{param}.{state}"` (and `"{group}.step"`), and JSON
    /// metadata (rules, learning rates, step counts).
    pub fn state_dict(&self) -> Result<(BTreeMap<String, Tensor>, Value)> {
        let mut tensors = BTreeMap::new();
        let mut groups = Vec::new();
        for (gi, g) in self.groups.iter().enumerate() {
            let names = g.rule.state_names();
            for (i, (pname, _)) in g.params.iter().enumerate() {
                for (k, b) in g.state[i].iter().enumerate() {
                    tensors.insert(format!("{pname}.{}", names[k]), b.tensor().clone());
                }
                if let Some(m) = &g.master[i] {
                    tensors.insert(format!("{pname}.master"), m.tensor().clone());
                }
            }
            tensors.insert(format!("group{gi}.step"), g.step_t.clone());
            groups.push(json!({
                "rule": format!("{:?}", g.rule),
                "lr": g.lr,
                "initial_lr": g.initial_lr,
                "params": g.params.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
            }));
        }
        tensors.insert("first_nonfinite".into(), self.first_nonfinite.clone());
        Ok((
            tensors,
            json!({"kind": "Optimizer", "steps": self.steps, "groups": groups}),
        ))
    }

    /// Restores a state saved by `state_dict` for the same parameters: every mismatch (unknown
    /// or missing parameter names, other rules, shapes) is listed in one error.
    pub fn load_state_dict(
        &mut self,
        tensors: &BTreeMap<String, Tensor>,
        meta: &Value,
    ) -> Result<()> {
        let what = "Optimizer::load_state_dict";
        let mut problems = Vec::new();
        let groups = meta
            .get("groups")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::state(what, "metadata has no `groups` list"))?;
        if groups.len() != self.groups.len() {
            problems.push(format!(
                "state has {} parameter groups, the optimizer {}",
                groups.len(),
                self.groups.len()
            ));
        }
        for (gi, (g, m)) in self.groups.iter().zip(groups).enumerate() {
            let saved: Vec<String> = m
                .get("params")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let mine: Vec<String> = g.params.iter().map(|(n, _)| n.clone()).collect();
            for n in saved.iter().filter(|n| !mine.contains(n)) {
                problems.push(format!("group {gi}: unexpected parameter {n}"));
            }
            for n in mine.iter().filter(|n| !saved.contains(n)) {
                problems.push(format!("group {gi}: missing parameter {n}"));
            }
            let rule = format!("{:?}", g.rule);
            if m.get("rule").and_then(Value::as_str) != Some(rule.as_str()) {
                problems.push(format!(
                    "group {gi}: saved for {}, this group is {rule}",
                    m.get("rule").and_then(Value::as_str).unwrap_or("(none)")
                ));
            }
            for (pname, p) in &g.params {
                for s in g.rule.state_names() {
                    let key = format!("{pname}.{s}");
                    if let Some(t) = tensors.get(&key) {
                        if t.dims() != p.dims() {
                            problems.push(format!(
                                "{key}: saved {}, parameter is {}",
                                t.shape(),
                                p.shape()
                            ));
                        }
                    }
                }
            }
        }
        if !problems.is_empty() {
            return Err(Error::state(what, problems.join("; ")));
        }
        for (gi, (g, m)) in self.groups.iter_mut().zip(groups).enumerate() {
            let names = g.rule.state_names();
            for (i, (pname, p)) in g.params.iter().enumerate() {
                if let Some(mt) = tensors.get(&format!("{pname}.master")) {
                    let mt = mt.cast(DType::F32)?;
                    match &g.master[i] {
                        Some(m) => m.tensor().copy_(&mt)?,
                        None => g.master[i] = Some(Buffer::new(&mt)?),
                    }
                }
                let found: Vec<Option<&Tensor>> = names
                    .iter()
                    .map(|s| tensors.get(&format!("{pname}.{s}")))
                    .collect();
                if found.iter().all(Option::is_some) && !names.is_empty() {
                    if g.state[i].is_empty() {
                        let like = match &g.master[i] {
                            Some(m) => m.tensor().clone(),
                            None => p.tensor().detach(),
                        };
                        g.state[i] = init_state(&g.rule, &like)?;
                    }
                    for (b, t) in g.state[i].iter().zip(found.into_iter().flatten()) {
                        b.tensor().copy_(&t.cast(b.tensor().dtype())?)?;
                    }
                }
            }
            if let Some(t) = tensors.get(&format!("group{gi}.step")) {
                g.step_t.copy_(t)?;
            }
            if let Some(lr) = m.get("lr").and_then(Value::as_f64) {
                g.lr = lr;
                g.lr_t.copy_(&scalar(lr, &self.device)?)?;
            }
            g.initial_lr = m.get("initial_lr").and_then(Value::as_f64);
        }
        if let Some(t) = tensors.get("first_nonfinite") {
            self.first_nonfinite.copy_(t)?;
        }
        self.steps = meta.get("steps").and_then(Value::as_u64).unwrap_or(0);
        self.steps_t
            .copy_(&scalar(self.steps as f64, &self.device)?)?;
        Ok(())
    }
}
