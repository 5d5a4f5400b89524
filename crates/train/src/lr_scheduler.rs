//! Learning-rate schedulers with PyTorch's semantics (`torch.optim.lr_scheduler`), step for
//! step: the same recursive ("chainable") updates, the same first step at construction, the
//! same handling of `initial_lr`, so a schedule here gives PyTorch's learning rates to the
//! last bits of an f64 (checked over 1,000 steps against a fixture from
//! `scripts/scheduler_fixtures.py`).
//!
//! A scheduler reads and writes an optimizer's parameter groups through [`ParamGroups`];
//! whether `step` is called once per batch or once per epoch is the caller's choice (the
//! Trainer's `SchedulerInterval`). Schedulers hold only host scalars: an optimizer that keeps
//! its learning rate in a device scalar writes it when `set_lr` is called, so a captured
//! training step reads the new value without re-capture.

use crate::{Error, Result};
use serde_json::{json, Value};
use std::f64::consts::PI;
use std::sync::Arc;

/// An optimizer's parameter groups as a scheduler sees them (PyTorch's `param_groups`
/// entries `lr`, `initial_lr`, and `momentum` or `betas[0]`).
pub trait ParamGroups {
    fn num_groups(&self) -> usize;
    fn lr(&self, group: usize) -> f64;
    fn set_lr(&mut self, group: usize, lr: f64);
    /// The learning rate the first scheduler attached to this group started from.
    fn initial_lr(&self, group: usize) -> Option<f64>;
    fn set_initial_lr(&mut self, group: usize, lr: f64);
    /// Momentum (SGD, RMSprop) or beta1 (Adam family); `None` if the optimizer has neither.
    fn momentum(&self, group: usize) -> Option<f64>;
    fn set_momentum(&mut self, group: usize, momentum: f64);
}

/// Plain parameter groups: learning rates (and optional momenta) for a loop that applies them
/// itself, and for tests.
#[derive(Clone, Debug, PartialEq)]
pub struct LrGroups {
    pub lr: Vec<f64>,
    pub initial_lr: Vec<Option<f64>>,
    pub momentum: Vec<Option<f64>>,
}

impl LrGroups {
    pub fn new(lrs: &[f64]) -> LrGroups {
        LrGroups {
            lr: lrs.to_vec(),
            initial_lr: vec![None; lrs.len()],
            momentum: vec![None; lrs.len()],
        }
    }

    pub fn with_momentum(lrs: &[f64], momentum: f64) -> LrGroups {
        LrGroups {
            momentum: vec![Some(momentum); lrs.len()],
            ..LrGroups::new(lrs)
        }
    }
}

impl ParamGroups for LrGroups {
    fn num_groups(&self) -> usize {
        self.lr.len()
    }
    fn lr(&self, group: usize) -> f64 {
        self.lr[group]
    }
    fn set_lr(&mut self, group: usize, lr: f64) {
        self.lr[group] = lr;
    }
    fn initial_lr(&self, group: usize) -> Option<f64> {
        self.initial_lr[group]
    }
    fn set_initial_lr(&mut self, group: usize, lr: f64) {
        self.initial_lr[group] = Some(lr);
    }
    fn momentum(&self, group: usize) -> Option<f64> {
        self.momentum[group]
    }
    fn set_momentum(&mut self, group: usize, momentum: f64) {
        self.momentum[group] = Some(momentum);
    }
}

/// A learning-rate multiplier of the step count, for `LambdaLR`.
pub type LrLambda = Arc<dyn Fn(i64) -> f64 + Send + Sync>;

/// OneCycleLR's settings (PyTorch's defaults from [`OneCycle::new`]).
#[derive(Clone, Debug, PartialEq)]
pub struct OneCycle {
    /// Peak learning rate per group (one value is used for every group).
    pub max_lr: Vec<f64>,
    pub total_steps: usize,
    pub pct_start: f64,
    /// Cosine annealing when true, linear otherwise.
    pub anneal_cos: bool,
    pub cycle_momentum: bool,
    pub base_momentum: f64,
    pub max_momentum: f64,
    pub div_factor: f64,
    pub final_div_factor: f64,
    pub three_phase: bool,
}

impl OneCycle {
    pub fn new(max_lr: &[f64], total_steps: usize) -> OneCycle {
        OneCycle {
            max_lr: max_lr.to_vec(),
            total_steps,
            pct_start: 0.3,
            anneal_cos: true,
            cycle_momentum: true,
            base_momentum: 0.85,
            max_momentum: 0.95,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }
}

/// What a scheduler does, with PyTorch's names and parameters.
#[derive(Clone)]
pub enum Schedule {
    /// lr × gamma every `step_size` steps.
    StepLR {
        step_size: usize,
        gamma: f64,
    },
    /// lr × gamma at each milestone (a milestone listed twice multiplies twice).
    MultiStepLR {
        milestones: Vec<usize>,
        gamma: f64,
    },
    /// lr × gamma every step.
    ExponentialLR {
        gamma: f64,
    },
    /// Cosine from the base rate to `eta_min` over `t_max` steps, then back (PyTorch's
    /// recursive form).
    CosineAnnealingLR {
        t_max: usize,
        eta_min: f64,
    },
    /// SGDR: cosine over `t_0` steps, restarting, each period `t_mult` times the last.
    CosineAnnealingWarmRestarts {
        t_0: usize,
        t_mult: usize,
        eta_min: f64,
    },
    /// Linear factor from `start_factor` to `end_factor` over `total_iters` steps (warm-up).
    LinearLR {
        start_factor: f64,
        end_factor: f64,
        total_iters: usize,
    },
    OneCycleLR(OneCycle),
    /// base lr × f(step): one function for every group, or one per group.
    LambdaLR(Vec<LrLambda>),
    /// Each schedule in turn, switching at the milestones (`milestones.len() + 1` schedules).
    SequentialLR {
        schedules: Vec<Schedule>,
        milestones: Vec<usize>,
    },
}

impl Schedule {
    /// PyTorch's class name.
    pub fn name(&self) -> &'static str {
        match self {
            Schedule::StepLR { .. } => "StepLR",
            Schedule::MultiStepLR { .. } => "MultiStepLR",
            Schedule::ExponentialLR { .. } => "ExponentialLR",
            Schedule::CosineAnnealingLR { .. } => "CosineAnnealingLR",
            Schedule::CosineAnnealingWarmRestarts { .. } => "CosineAnnealingWarmRestarts",
            Schedule::LinearLR { .. } => "LinearLR",
            Schedule::OneCycleLR(_) => "OneCycleLR",
            Schedule::LambdaLR(_) => "LambdaLR",
            Schedule::SequentialLR { .. } => "SequentialLR",
        }
    }

    /// LinearLR with PyTorch's defaults (1/3 → 1 over 5 steps).
    pub fn linear_warmup_default() -> Schedule {
        Schedule::LinearLR {
            start_factor: 1.0 / 3.0,
            end_factor: 1.0,
            total_iters: 5,
        }
    }
}

fn finite(what: &'static str, name: &str, v: f64) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::config(
            what,
            format!("{name} must be finite, got {v}"),
        ))
    }
}

/// Per-group values given as one value for all groups or one per group.
fn per_group(what: &'static str, name: &str, v: &[f64], groups: usize) -> Result<Vec<f64>> {
    match v.len() {
        1 => Ok(vec![v[0]; groups]),
        n if n == groups => Ok(v.to_vec()),
        n => Err(Error::config(
            what,
            format!("expected 1 or {groups} values of {name} (one per parameter group), got {n}"),
        )),
    }
}

/// Validates a schedule's hyperparameters (PyTorch's checks, plus finiteness).
fn validate(s: &Schedule, groups: usize) -> Result<()> {
    let what = s.name();
    match s {
        Schedule::StepLR { step_size, gamma } => {
            finite(what, "gamma", *gamma)?;
            if *step_size == 0 {
                return Err(Error::config(what, "step_size must be at least 1, got 0"));
            }
        }
        Schedule::MultiStepLR { gamma, .. } | Schedule::ExponentialLR { gamma } => {
            finite(what, "gamma", *gamma)?
        }
        Schedule::CosineAnnealingLR { t_max, eta_min } => {
            finite(what, "eta_min", *eta_min)?;
            if *t_max == 0 {
                return Err(Error::config(what, "T_max must be at least 1, got 0"));
            }
        }
        Schedule::CosineAnnealingWarmRestarts {
            t_0,
            t_mult,
            eta_min,
        } => {
            finite(what, "eta_min", *eta_min)?;
            if *t_0 == 0 {
                return Err(Error::config(what, "T_0 must be a positive integer, got 0"));
            }
            if *t_mult == 0 {
                return Err(Error::config(what, "T_mult must be an integer >= 1, got 0"));
            }
        }
        Schedule::LinearLR {
            start_factor,
            end_factor,
            total_iters,
        } => {
            if !(*start_factor > 0.0 && *start_factor <= 1.0) {
                return Err(Error::config(
                    what,
                    format!("start_factor must be in (0, 1], got {start_factor}"),
                ));
            }
            if !(*end_factor >= 0.0 && *end_factor <= 1.0) {
                return Err(Error::config(
                    what,
                    format!("end_factor must be in [0, 1], got {end_factor}"),
                ));
            }
            if *total_iters == 0 {
                return Err(Error::config(what, "total_iters must be at least 1, got 0"));
            }
        }
        Schedule::OneCycleLR(c) => {
            per_group(what, "max_lr", &c.max_lr, groups)?;
            for (name, v) in [
                ("pct_start", c.pct_start),
                ("base_momentum", c.base_momentum),
                ("max_momentum", c.max_momentum),
                ("div_factor", c.div_factor),
                ("final_div_factor", c.final_div_factor),
            ] {
                finite(what, name, v)?;
            }
            if let Some(bad) = c.max_lr.iter().find(|v| !v.is_finite() || **v < 0.0) {
                return Err(Error::config(
                    what,
                    format!("max_lr must be finite and >= 0, got {bad}"),
                ));
            }
            if c.total_steps == 0 {
                return Err(Error::config(what, "total_steps must be at least 1, got 0"));
            }
            if !(0.0..=1.0).contains(&c.pct_start) {
                return Err(Error::config(
                    what,
                    format!("pct_start must be in [0, 1], got {}", c.pct_start),
                ));
            }
            if c.div_factor <= 0.0 || c.final_div_factor <= 0.0 {
                return Err(Error::config(
                    what,
                    format!(
                        "div_factor and final_div_factor must be > 0, got {} and {}",
                        c.div_factor, c.final_div_factor
                    ),
                ));
            }
        }
        Schedule::LambdaLR(fs) => {
            if fs.len() != 1 && fs.len() != groups {
                return Err(Error::config(
                    what,
                    format!(
                        "expected 1 or {groups} lr_lambdas (one per parameter group), got {}",
                        fs.len()
                    ),
                ));
            }
        }
        Schedule::SequentialLR {
            schedules,
            milestones,
        } => {
            if schedules.is_empty() {
                return Err(Error::config(
                    what,
                    "expects at least one schedule, got none",
                ));
            }
            if milestones.len() + 1 != schedules.len() {
                return Err(Error::config(
                    what,
                    format!(
                        "expects one more schedule than milestones, got {} schedules and {} milestones",
                        schedules.len(),
                        milestones.len()
                    ),
                ));
            }
            if milestones.windows(2).any(|w| w[0] > w[1]) {
                return Err(Error::config(
                    what,
                    format!("milestones must be sorted, got {milestones:?}"),
                ));
            }
            if schedules
                .iter()
                .any(|s| matches!(s, Schedule::SequentialLR { .. }))
            {
                return Err(Error::config(what, "a SequentialLR cannot contain another"));
            }
        }
    }
    Ok(())
}

/// A learning-rate scheduler attached to an optimizer's parameter groups.
pub struct LrScheduler {
    schedule: Schedule,
    base_lrs: Vec<f64>,
    /// Steps taken (PyTorch's `last_epoch`): 0 after construction.
    last_epoch: i64,
    /// Calls of `step` since the (re)initialization (PyTorch's `_step_count`).
    step_count: u64,
    last_lr: Vec<f64>,
    /// True during the step taken at construction (PyTorch's `_is_initial`).
    is_initial: bool,
    /// CosineAnnealingWarmRestarts: position in and length of the current period.
    t_cur: i64,
    t_i: i64,
    /// OneCycleLR: per-group peak and final learning rates.
    max_lrs: Vec<f64>,
    min_lrs: Vec<f64>,
    /// SequentialLR: the schedules it switches between.
    children: Vec<LrScheduler>,
}

impl std::fmt::Debug for LrScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LrScheduler")
            .field("schedule", &self.schedule.name())
            .field("last_epoch", &self.last_epoch)
            .field("last_lr", &self.last_lr)
            .finish()
    }
}

fn lrs(opt: &dyn ParamGroups) -> Vec<f64> {
    (0..opt.num_groups()).map(|g| opt.lr(g)).collect()
}

impl LrScheduler {
    /// Attaches `schedule` to the groups and takes the first step, as PyTorch's constructor
    /// does: the groups' learning rates are those of step 0 afterwards.
    pub fn new(opt: &mut dyn ParamGroups, schedule: Schedule) -> Result<LrScheduler> {
        let groups = opt.num_groups();
        validate(&schedule, groups)?;
        let mut s = LrScheduler {
            base_lrs: Vec::new(),
            last_epoch: -1,
            step_count: 0,
            last_lr: Vec::new(),
            is_initial: false,
            t_cur: -1,
            t_i: 0,
            max_lrs: Vec::new(),
            min_lrs: Vec::new(),
            children: Vec::new(),
            schedule,
        };
        match &s.schedule {
            Schedule::SequentialLR {
                schedules,
                milestones,
            } => {
                for child in schedules.clone() {
                    s.children.push(LrScheduler::new(opt, child)?);
                }
                s.last_epoch = 0;
                for g in 0..groups {
                    if let Some(lr) = opt.initial_lr(g) {
                        opt.set_lr(g, lr);
                    }
                }
                for c in &mut s.children {
                    c.last_epoch -= 1;
                }
                let idx = milestones.partition_point(|&m| m == 0);
                s.children[idx].initial_step(opt)?;
                s.last_lr = s.children[idx].last_lr.clone();
                return Ok(s);
            }
            Schedule::OneCycleLR(c) => {
                let max_lrs = per_group("OneCycleLR", "max_lr", &c.max_lr, groups)?;
                if c.cycle_momentum {
                    if let Some(g) = (0..groups).find(|&g| opt.momentum(g).is_none()) {
                        return Err(Error::config(
                            "OneCycleLR",
                            format!(
                                "cycle_momentum needs an optimizer with momentum or beta1, \
                                 parameter group {g} has neither"
                            ),
                        ));
                    }
                }
                for (g, &max_lr) in max_lrs.iter().enumerate() {
                    let initial = max_lr / c.div_factor;
                    opt.set_initial_lr(g, initial);
                    s.min_lrs.push(initial / c.final_div_factor);
                    if c.cycle_momentum {
                        opt.set_momentum(g, c.max_momentum);
                    }
                }
                s.max_lrs = max_lrs;
            }
            Schedule::CosineAnnealingWarmRestarts { t_0, .. } => s.t_i = *t_0 as i64,
            _ => {}
        }
        for g in 0..groups {
            if opt.initial_lr(g).is_none() {
                let lr = opt.lr(g);
                opt.set_initial_lr(g, lr);
            }
        }
        s.base_lrs = (0..groups)
            .map(|g| opt.initial_lr(g).unwrap_or(0.0))
            .collect();
        s.initial_step(opt)?;
        Ok(s)
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The learning rates the last step set, one per group (PyTorch's `get_last_lr()`).
    pub fn last_lr(&self) -> &[f64] {
        &self.last_lr
    }

    /// Steps taken since construction (PyTorch's `last_epoch`).
    pub fn last_epoch(&self) -> i64 {
        self.last_epoch
    }

    fn initial_step(&mut self, opt: &mut dyn ParamGroups) -> Result<()> {
        self.step_count = 0;
        self.is_initial = true;
        let r = self.step(opt);
        self.is_initial = false;
        r
    }

    /// Advances one step and writes the new learning rates into the groups.
    pub fn step(&mut self, opt: &mut dyn ParamGroups) -> Result<()> {
        self.step_count += 1;
        match &self.schedule {
            Schedule::SequentialLR { milestones, .. } => {
                self.last_epoch += 1;
                let e = self.last_epoch;
                let idx = milestones.partition_point(|&m| (m as i64) <= e);
                let child = &mut self.children[idx];
                if idx > 0 && milestones[idx - 1] as i64 == e {
                    child.update_lr_at(opt, 0)?;
                } else {
                    child.step(opt)?;
                }
                self.last_lr = child.last_lr.clone();
                return Ok(());
            }
            Schedule::CosineAnnealingWarmRestarts { t_0, t_mult, .. } => {
                if self.last_epoch < 0 {
                    // The first step is PyTorch's `step(epoch=0)`.
                    self.t_i = *t_0 as i64;
                    self.t_cur = 0;
                    self.last_epoch = 0;
                } else {
                    self.last_epoch += 1;
                    self.t_cur += 1;
                    if self.t_cur >= self.t_i {
                        self.t_cur %= self.t_i;
                        self.t_i *= *t_mult as i64;
                    }
                }
                let v = self.get_lr(opt)?;
                self.apply(opt, &v);
                return Ok(());
            }
            _ => {}
        }
        self.last_epoch += 1;
        let v = self.get_lr(opt)?;
        self.apply(opt, &v);
        Ok(())
    }

    /// PyTorch's `_update_lr(epoch)`: jumps to `epoch`, through the closed form where the
    /// schedule has one. SequentialLR uses it to start a schedule at a milestone.
    fn update_lr_at(&mut self, opt: &mut dyn ParamGroups, epoch: i64) -> Result<()> {
        self.last_epoch = epoch;
        let v = match self.closed_form() {
            Some(v) => v,
            None => self.get_lr(opt)?,
        };
        self.apply(opt, &v);
        Ok(())
    }

    fn apply(&mut self, opt: &mut dyn ParamGroups, v: &[f64]) {
        for (g, &lr) in v.iter().enumerate() {
            opt.set_lr(g, lr);
        }
        self.last_lr = lrs(opt);
    }

    fn closed_form(&self) -> Option<Vec<f64>> {
        let e = self.last_epoch;
        let base = self.base_lrs.iter();
        Some(match &self.schedule {
            Schedule::StepLR { step_size, gamma } => base
                .map(|b| b * gamma.powf(e.div_euclid(*step_size as i64) as f64))
                .collect(),
            Schedule::MultiStepLR { milestones, gamma } => {
                let n = milestones.iter().filter(|&&m| m as i64 <= e).count();
                base.map(|b| b * gamma.powf(n as f64)).collect()
            }
            Schedule::LinearLR {
                start_factor,
                end_factor,
                total_iters,
            } => base
                .map(|b| {
                    b * (start_factor
                        + (end_factor - start_factor) * (*total_iters as i64).min(e) as f64
                            / *total_iters as f64)
                })
                .collect(),
            Schedule::ExponentialLR { gamma } => base.map(|b| b * gamma.powf(e as f64)).collect(),
            Schedule::CosineAnnealingLR { t_max, eta_min } => base
                .map(|b| {
                    eta_min + (b - eta_min) * (1.0 + (PI * e as f64 / *t_max as f64).cos()) / 2.0
                })
                .collect(),
            _ => return None,
        })
    }

    /// PyTorch's `get_lr()`: the chainable update from the groups' current rates.
    fn get_lr(&self, opt: &mut dyn ParamGroups) -> Result<Vec<f64>> {
        let e = self.last_epoch;
        let cur = lrs(&*opt);
        Ok(match &self.schedule {
            Schedule::StepLR { step_size, gamma } => {
                if e == 0 || e % *step_size as i64 != 0 {
                    cur
                } else {
                    cur.iter().map(|lr| lr * gamma).collect()
                }
            }
            Schedule::MultiStepLR { milestones, gamma } => {
                let n = milestones.iter().filter(|&&m| m as i64 == e).count();
                if n == 0 {
                    cur
                } else {
                    cur.iter().map(|lr| lr * gamma.powf(n as f64)).collect()
                }
            }
            Schedule::ExponentialLR { gamma } => {
                if self.is_initial {
                    cur
                } else {
                    cur.iter().map(|lr| lr * gamma).collect()
                }
            }
            Schedule::CosineAnnealingLR { t_max, eta_min } => {
                let t = *t_max as i64;
                let tf = *t_max as f64;
                if self.is_initial {
                    cur
                } else if self.step_count == 1 && e > 0 {
                    self.base_lrs
                        .iter()
                        .map(|b| eta_min + (b - eta_min) * (1.0 + (e as f64 * PI / tf).cos()) / 2.0)
                        .collect()
                } else if (e - 1 - t).rem_euclid(2 * t) == 0 {
                    cur.iter()
                        .zip(&self.base_lrs)
                        .map(|(lr, b)| lr + (b - eta_min) * (1.0 - (PI / tf).cos()) / 2.0)
                        .collect()
                } else {
                    cur.iter()
                        .map(|lr| {
                            (1.0 + (PI * e as f64 / tf).cos())
                                / (1.0 + (PI * (e - 1) as f64 / tf).cos())
                                * (lr - eta_min)
                                + eta_min
                        })
                        .collect()
                }
            }
            Schedule::CosineAnnealingWarmRestarts { eta_min, .. } => self
                .base_lrs
                .iter()
                .map(|b| {
                    eta_min
                        + (b - eta_min) * (1.0 + (PI * self.t_cur as f64 / self.t_i as f64).cos())
                            / 2.0
                })
                .collect(),
            Schedule::LinearLR {
                start_factor,
                end_factor,
                total_iters,
            } => {
                if e == 0 {
                    cur.iter().map(|lr| lr * start_factor).collect()
                } else if self.is_initial || e > *total_iters as i64 {
                    cur
                } else {
                    let d = end_factor - start_factor;
                    cur.iter()
                        .map(|lr| {
                            lr * (1.0
                                + d / (*total_iters as f64 * start_factor + (e - 1) as f64 * d))
                        })
                        .collect()
                }
            }
            Schedule::LambdaLR(fs) => self
                .base_lrs
                .iter()
                .enumerate()
                .map(|(g, b)| b * fs[if fs.len() == 1 { 0 } else { g }](e))
                .collect(),
            Schedule::OneCycleLR(c) => return self.one_cycle(c, opt),
            Schedule::SequentialLR { .. } => {
                return Err(Error::state(
                    "SequentialLR",
                    "has no learning rate of its own (its schedules step)",
                ))
            }
        })
    }

    fn one_cycle(&self, c: &OneCycle, opt: &mut dyn ParamGroups) -> Result<Vec<f64>> {
        let step = self.last_epoch;
        if step > c.total_steps as i64 {
            return Err(Error::state(
                "OneCycleLR",
                format!(
                    "tried to step {step} times; the schedule has {} total steps",
                    c.total_steps
                ),
            ));
        }
        let total = c.total_steps as f64;
        // (end step, start lr, end lr, start momentum, end momentum); lr ids: 0 initial, 1 max,
        // 2 min; momentum ids: 0 max, 1 base.
        let phases: Vec<(f64, u8, u8, u8, u8)> = if c.three_phase {
            vec![
                (c.pct_start * total - 1.0, 0, 1, 0, 1),
                (2.0 * c.pct_start * total - 2.0, 1, 0, 1, 0),
                (total - 1.0, 0, 2, 0, 0),
            ]
        } else {
            vec![
                (c.pct_start * total - 1.0, 0, 1, 0, 1),
                (total - 1.0, 1, 2, 1, 0),
            ]
        };
        let anneal = |start: f64, end: f64, pct: f64| {
            if c.anneal_cos {
                end + (start - end) / 2.0 * ((PI * pct).cos() + 1.0)
            } else {
                (end - start) * pct + start
            }
        };
        let mut out = Vec::with_capacity(self.max_lrs.len());
        for g in 0..self.max_lrs.len() {
            let initial = opt.initial_lr(g).unwrap_or(0.0);
            let lr_of = |id: u8| match id {
                0 => initial,
                1 => self.max_lrs[g],
                _ => self.min_lrs[g],
            };
            let mom_of = |id: u8| {
                if id == 0 {
                    c.max_momentum
                } else {
                    c.base_momentum
                }
            };
            let mut start_step = 0.0;
            for (i, &(end_step, slr, elr, sm, em)) in phases.iter().enumerate() {
                if step as f64 <= end_step || i == phases.len() - 1 {
                    let pct = (step as f64 - start_step) / (end_step - start_step);
                    out.push(anneal(lr_of(slr), lr_of(elr), pct));
                    if c.cycle_momentum {
                        // PyTorch writes the momentum (or beta1) as it computes the rate.
                        opt.set_momentum(g, anneal(mom_of(sm), mom_of(em), pct));
                    }
                    break;
                }
                start_step = end_step;
            }
        }
        Ok(out)
    }
}

/// Whether a lower or a higher metric is better, for [`ReduceLROnPlateau`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plateau {
    Min,
    Max,
}

/// Lowers the learning rate by `factor` once the metric has not improved for `patience`
/// steps (PyTorch's `ReduceLROnPlateau`, fed the metric at each `step`).
#[derive(Clone, Debug)]
pub struct ReduceLROnPlateau {
    pub mode: Plateau,
    pub factor: f64,
    pub patience: usize,
    pub threshold: f64,
    /// Relative threshold (`best × (1 ∓ threshold)`) when true, absolute otherwise.
    pub threshold_rel: bool,
    pub cooldown: usize,
    pub min_lrs: Vec<f64>,
    pub eps: f64,
    best: f64,
    num_bad_epochs: usize,
    cooldown_counter: usize,
    last_epoch: i64,
    last_lr: Vec<f64>,
}

impl ReduceLROnPlateau {
    /// PyTorch's defaults: factor 0.1, patience 10, threshold 1e-4 (relative), cooldown 0,
    /// min_lr 0, eps 1e-8.
    pub fn new(opt: &dyn ParamGroups, mode: Plateau) -> Result<ReduceLROnPlateau> {
        ReduceLROnPlateau::with(opt, mode, 0.1, 10, 1e-4, true, 0, &[0.0], 1e-8)
    }

    /// Every setting; `min_lrs` holds one value for all groups or one per group.
    #[allow(clippy::too_many_arguments)]
    pub fn with(
        opt: &dyn ParamGroups,
        mode: Plateau,
        factor: f64,
        patience: usize,
        threshold: f64,
        threshold_rel: bool,
        cooldown: usize,
        min_lrs: &[f64],
        eps: f64,
    ) -> Result<ReduceLROnPlateau> {
        let what = "ReduceLROnPlateau";
        if !(0.0..1.0).contains(&factor) {
            return Err(Error::config(
                what,
                format!("factor must be in [0, 1), got {factor}"),
            ));
        }
        finite(what, "threshold", threshold)?;
        finite(what, "eps", eps)?;
        if threshold < 0.0 {
            return Err(Error::config(
                what,
                format!("threshold must be >= 0, got {threshold}"),
            ));
        }
        let min_lrs = per_group(what, "min_lr", min_lrs, opt.num_groups())?;
        if let Some(bad) = min_lrs.iter().find(|v| !v.is_finite() || **v < 0.0) {
            return Err(Error::config(
                what,
                format!("min_lr must be finite and >= 0, got {bad}"),
            ));
        }
        Ok(ReduceLROnPlateau {
            mode,
            factor,
            patience,
            threshold,
            threshold_rel,
            cooldown,
            min_lrs,
            eps,
            best: match mode {
                Plateau::Min => f64::INFINITY,
                Plateau::Max => f64::NEG_INFINITY,
            },
            num_bad_epochs: 0,
            cooldown_counter: 0,
            last_epoch: 0,
            last_lr: lrs(opt),
        })
    }

    fn is_better(&self, a: f64) -> bool {
        match (self.mode, self.threshold_rel) {
            (Plateau::Min, true) => a < self.best * (1.0 - self.threshold),
            (Plateau::Min, false) => a < self.best - self.threshold,
            (Plateau::Max, true) => a > self.best * (self.threshold + 1.0),
            (Plateau::Max, false) => a > self.best + self.threshold,
        }
    }

    /// Feeds one metric value (a NaN metric counts as no improvement, as in PyTorch).
    pub fn step(&mut self, metric: f64, opt: &mut dyn ParamGroups) -> Result<()> {
        if opt.num_groups() != self.min_lrs.len() {
            return Err(Error::state(
                "ReduceLROnPlateau",
                format!(
                    "the optimizer has {} parameter groups, the scheduler was made for {}",
                    opt.num_groups(),
                    self.min_lrs.len()
                ),
            ));
        }
        self.last_epoch += 1;
        if self.is_better(metric) {
            self.best = metric;
            self.num_bad_epochs = 0;
        } else {
            self.num_bad_epochs += 1;
        }
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.num_bad_epochs = 0;
        }
        if self.num_bad_epochs > self.patience {
            for g in 0..opt.num_groups() {
                let old = opt.lr(g);
                let new = (old * self.factor).max(self.min_lrs[g]);
                if old - new > self.eps {
                    opt.set_lr(g, new);
                }
            }
            self.cooldown_counter = self.cooldown;
            self.num_bad_epochs = 0;
        }
        self.last_lr = lrs(opt);
        Ok(())
    }

    pub fn last_lr(&self) -> &[f64] {
        &self.last_lr
    }

    /// The best metric so far.
    pub fn best(&self) -> f64 {
        self.best
    }

    /// The state a checkpoint keeps (settings are the constructor's).
    pub fn state_dict(&self) -> Value {
        json!({
            "kind": "ReduceLROnPlateau",
            "best": json_f64(self.best),
            "num_bad_epochs": self.num_bad_epochs,
            "cooldown_counter": self.cooldown_counter,
            "last_epoch": self.last_epoch,
            "last_lr": self.last_lr,
        })
    }

    pub fn load_state_dict(&mut self, v: &Value) -> Result<()> {
        let what = "ReduceLROnPlateau";
        expect_kind(what, v, "ReduceLROnPlateau")?;
        let last_lr = get_f64s(what, v, "last_lr")?;
        if last_lr.len() != self.min_lrs.len() {
            return Err(Error::state(
                what,
                format!(
                    "state holds {} parameter groups, the scheduler has {}",
                    last_lr.len(),
                    self.min_lrs.len()
                ),
            ));
        }
        self.best = get_f64(what, v, "best")?;
        self.num_bad_epochs = get_u64(what, v, "num_bad_epochs")? as usize;
        self.cooldown_counter = get_u64(what, v, "cooldown_counter")? as usize;
        self.last_epoch = get_i64(what, v, "last_epoch")?;
        self.last_lr = last_lr;
        Ok(())
    }
}

/// JSON has no infinities: they are stored as strings.
fn json_f64(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!(x.to_string())
    }
}

fn field<'a>(what: &'static str, v: &'a Value, key: &str) -> Result<&'a Value> {
    v.get(key)
        .ok_or_else(|| Error::state(what, format!("state has no `{key}`")))
}

fn get_f64(what: &'static str, v: &Value, key: &str) -> Result<f64> {
    let x = field(what, v, key)?;
    x.as_f64()
        .or_else(|| x.as_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| Error::state(what, format!("`{key}` is not a number: {x}")))
}

fn get_i64(what: &'static str, v: &Value, key: &str) -> Result<i64> {
    let x = field(what, v, key)?;
    x.as_i64()
        .ok_or_else(|| Error::state(what, format!("`{key}` is not an integer: {x}")))
}

fn get_u64(what: &'static str, v: &Value, key: &str) -> Result<u64> {
    let x = field(what, v, key)?;
    x.as_u64()
        .ok_or_else(|| Error::state(what, format!("`{key}` is not a count: {x}")))
}

fn get_f64s(what: &'static str, v: &Value, key: &str) -> Result<Vec<f64>> {
    let x = field(what, v, key)?;
    x.as_array()
        .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
        .ok_or_else(|| Error::state(what, format!("`{key}` is not a list of numbers: {x}")))
}

fn expect_kind(what: &'static str, v: &Value, kind: &str) -> Result<()> {
    let found = v.get("kind").and_then(Value::as_str).unwrap_or("(none)");
    if found == kind {
        Ok(())
    } else {
        Err(Error::state(
            what,
            format!("state was saved by a {found} scheduler, not {kind}"),
        ))
    }
}

impl LrScheduler {
    /// The state a checkpoint keeps to resume the schedule exactly (settings and lambdas are
    /// the constructor's, as in PyTorch).
    pub fn state_dict(&self) -> Value {
        json!({
            "kind": self.schedule.name(),
            "base_lrs": self.base_lrs,
            "last_epoch": self.last_epoch,
            "step_count": self.step_count,
            "last_lr": self.last_lr,
            "t_cur": self.t_cur,
            "t_i": self.t_i,
            "max_lrs": self.max_lrs,
            "min_lrs": self.min_lrs,
            "children": self.children.iter().map(LrScheduler::state_dict).collect::<Vec<_>>(),
        })
    }

    /// Restores a state saved by `state_dict` from the same schedule over as many groups.
    pub fn load_state_dict(&mut self, v: &Value) -> Result<()> {
        let what = self.schedule.name();
        expect_kind(what, v, what)?;
        let last_lr = get_f64s(what, v, "last_lr")?;
        if last_lr.len() != self.last_lr.len() {
            return Err(Error::state(
                what,
                format!(
                    "state holds {} parameter groups, the scheduler has {}",
                    last_lr.len(),
                    self.last_lr.len()
                ),
            ));
        }
        let children = field(what, v, "children")?
            .as_array()
            .ok_or_else(|| Error::state(what, "`children` is not a list"))?;
        if children.len() != self.children.len() {
            return Err(Error::state(
                what,
                format!(
                    "state holds {} schedules, the scheduler has {}",
                    children.len(),
                    self.children.len()
                ),
            ));
        }
        for (c, s) in self.children.iter_mut().zip(children) {
            c.load_state_dict(s)?;
        }
        self.base_lrs = get_f64s(what, v, "base_lrs")?;
        self.max_lrs = get_f64s(what, v, "max_lrs")?;
        self.min_lrs = get_f64s(what, v, "min_lrs")?;
        self.last_epoch = get_i64(what, v, "last_epoch")?;
        self.step_count = get_u64(what, v, "step_count")?;
        self.t_cur = get_i64(what, v, "t_cur")?;
        self.t_i = get_i64(what, v, "t_i")?;
        self.last_lr = last_lr;
        Ok(())
    }
}
