//! Channel normalization layers over `[n, c, ...]`: `BatchNorm1d/2d`, `GroupNorm`,
//! `InstanceNorm2d`, and `Dropout2d`, with PyTorch's names, defaults and buffers.
//!
//! Batch norm in training (or without running statistics) normalizes with the batch's mean and
//! biased variance (the fused `batch_norm` op); with `track_running_stats` it then updates, as
//! PyTorch does, `running_mean = (1 - m) running_mean + m mean`, `running_var = (1 - m)
//! running_var + m var_unbiased` and `num_batches_tracked += 1`, where m is `momentum`, or
//! 1 / num_batches_tracked (a cumulative average) when `momentum` is `None`. In eval mode
//! with running statistics it normalizes with them.

use super::conv::in_module;
use crate::{init, Buffer, Members, MembersMut, Module, Parameter};
use ferrite_core::{no_grad, DType, Device, Error, Result, Tensor};

fn affine_params(
    c: usize,
    affine: bool,
    dtype: DType,
    dev: &Device,
) -> Result<Option<(Parameter, Parameter)>> {
    affine
        .then(|| {
            Ok((
                Parameter::new(&init::ones([c], dtype, dev)?)?,
                Parameter::new(&init::zeros([c], dtype, dev)?)?,
            ))
        })
        .transpose()
}

/// (weight, bias) as tensors, ones and zeros when there are none.
fn affine_or_identity(
    p: &Option<(Parameter, Parameter)>,
    x: &Tensor,
    c: usize,
) -> Result<(Tensor, Tensor)> {
    match p {
        Some((w, b)) => Ok((w.tensor(), b.tensor())),
        None => Ok((
            Tensor::ones([c], x.dtype(), x.device())?,
            Tensor::zeros([c], x.dtype(), x.device())?,
        )),
    }
}

/// The running statistics of batch and instance norm.
struct Running {
    mean: Buffer,
    var: Buffer,
    num_batches_tracked: Buffer,
}

impl Running {
    fn new(c: usize, dtype: DType, dev: &Device) -> Result<Running> {
        Ok(Running {
            mean: Buffer::new(&init::zeros([c], dtype, dev)?)?,
            var: Buffer::new(&init::ones([c], dtype, dev)?)?,
            num_batches_tracked: Buffer::new(&Tensor::zeros((), DType::I64, dev)?)?,
        })
    }

    /// PyTorch's update from a batch's mean and biased variance over `m` values each; with
    /// `count`, num_batches_tracked goes up by one (batch norm; instance norm leaves it).
    fn update(
        &self,
        mean: &Tensor,
        var: &Tensor,
        m: usize,
        momentum: Option<f64>,
        count: bool,
    ) -> Result<()> {
        no_grad(|| {
            let nbt = self.num_batches_tracked.tensor();
            let next = nbt.add(&nbt.ones_like()?)?;
            if count {
                self.num_batches_tracked.copy_(&next)?;
            }
            let f = match momentum {
                Some(f) => Tensor::full(f, (), mean.dtype(), mean.device())?,
                // 1 / num_batches_tracked, on the device (no host read).
                None => next.cast(mean.dtype())?.recip()?,
            };
            let keep = f.neg()?.add_scalar(1.0)?;
            let unbiased = var.mul_scalar(m as f64 / (m as f64 - 1.0))?;
            let blend = |old: &Tensor, new: &Tensor| -> Result<Tensor> {
                let s = new.shape().clone();
                old.mul(&keep.broadcast_to(s.clone())?)?
                    .add(&new.mul(&f.broadcast_to(s)?)?)
            };
            self.mean.copy_(&blend(self.mean.tensor(), mean)?)?;
            self.var.copy_(&blend(self.var.tensor(), &unbiased)?)
        })
    }

    fn buffers(&self) -> Vec<(String, &Buffer)> {
        vec![
            ("running_mean".into(), &self.mean),
            ("running_var".into(), &self.var),
            ("num_batches_tracked".into(), &self.num_batches_tracked),
        ]
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Buffer)> {
        vec![
            ("running_mean".into(), &mut self.mean),
            ("running_var".into(), &mut self.var),
            ("num_batches_tracked".into(), &mut self.num_batches_tracked),
        ]
    }
}

fn check_features(module: &'static str, c: usize, eps: f64) -> Result<()> {
    if c == 0 || eps.is_nan() || eps < 0.0 {
        return Err(Error::module(
            module,
            format!("num_features ({c}) must be positive and eps ({eps}) non-negative"),
        ));
    }
    Ok(())
}

/// Batch norm over `[n, c, ...]`; `BatchNorm1d` takes `[n, c]` or `[n, c, l]`, `BatchNorm2d`
/// `[n, c, h, w]`.
pub struct BatchNorm {
    name: &'static str,
    ranks: &'static [usize],
    pub eps: f64,
    pub momentum: Option<f64>,
    affine: Option<(Parameter, Parameter)>,
    running: Option<Running>,
    pub training: bool,
}

/// PyTorch's `BatchNorm1d` (`[n, c]` or `[n, c, l]`).
pub type BatchNorm1d = BatchNorm;
/// PyTorch's `BatchNorm2d` (`[n, c, h, w]`).
pub type BatchNorm2d = BatchNorm;

impl BatchNorm {
    #[allow(clippy::too_many_arguments)]
    fn build(
        name: &'static str,
        ranks: &'static [usize],
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track_running_stats: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<BatchNorm> {
        check_features(name, num_features, eps)?;
        if let Some(m) = momentum {
            if !(0.0..=1.0).contains(&m) {
                return Err(Error::module(
                    name,
                    format!("momentum must be in [0, 1], got {m}"),
                ));
            }
        }
        Ok(BatchNorm {
            name,
            ranks,
            eps,
            momentum,
            affine: affine_params(num_features, affine, dtype, dev)?,
            running: track_running_stats
                .then(|| Running::new(num_features, dtype, dev))
                .transpose()?,
            training: true,
        })
    }

    /// PyTorch's `BatchNorm1d(num_features, eps=1e-5, momentum=0.1, affine=True,
    /// track_running_stats=True)`.
    #[allow(clippy::too_many_arguments)]
    pub fn new_1d(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track_running_stats: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<BatchNorm> {
        let r: &'static [usize] = &[2, 3];
        BatchNorm::build(
            "BatchNorm1d",
            r,
            num_features,
            eps,
            momentum,
            affine,
            track_running_stats,
            dtype,
            dev,
        )
    }

    /// PyTorch's `BatchNorm2d(num_features, eps=1e-5, momentum=0.1, affine=True,
    /// track_running_stats=True)`.
    #[allow(clippy::too_many_arguments)]
    pub fn new_2d(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track_running_stats: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<BatchNorm> {
        let r: &'static [usize] = &[4];
        BatchNorm::build(
            "BatchNorm2d",
            r,
            num_features,
            eps,
            momentum,
            affine,
            track_running_stats,
            dtype,
            dev,
        )
    }

    /// `BatchNorm2d` with PyTorch's defaults.
    pub fn default_2d(num_features: usize, dtype: DType, dev: &Device) -> Result<BatchNorm> {
        BatchNorm::new_2d(num_features, 1e-5, Some(0.1), true, true, dtype, dev)
    }

    /// `BatchNorm1d` with PyTorch's defaults.
    pub fn default_1d(num_features: usize, dtype: DType, dev: &Device) -> Result<BatchNorm> {
        BatchNorm::new_1d(num_features, 1e-5, Some(0.1), true, true, dtype, dev)
    }

    fn num_features(&self) -> usize {
        match (&self.affine, &self.running) {
            (Some((w, _)), _) => w.dims()[0],
            (None, Some(r)) => r.mean.shape().dims()[0],
            (None, None) => 0,
        }
    }
}

impl Module for BatchNorm {
    fn type_name(&self) -> &'static str {
        self.name
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.num_features();
        if !self.ranks.contains(&x.rank()) || (c > 0 && x.dims()[1] != c) {
            return Err(Error::module(
                self.name,
                format!(
                    "expected input of rank {:?} with {c} channels, got {}",
                    self.ranks,
                    x.shape()
                ),
            ));
        }
        let c = x.dims()[1];
        if let (false, Some(r)) = (self.training, &self.running) {
            let (w, b) = match &self.affine {
                Some((w, b)) => (Some(w.tensor()), Some(b.tensor())),
                None => (None, None),
            };
            return in_module(
                self.name,
                x.batch_norm_eval(
                    r.mean.tensor(),
                    r.var.tensor(),
                    w.as_ref(),
                    b.as_ref(),
                    self.eps,
                ),
            );
        }
        let m = x.elem_count() / c.max(1);
        if self.training && m <= 1 {
            return Err(Error::module(
                self.name,
                format!(
                    "expected more than 1 value per channel when training, got input {}",
                    x.shape()
                ),
            ));
        }
        let (w, b) = affine_or_identity(&self.affine, x, c)?;
        let (y, mean, var) = in_module(self.name, x.batch_norm_train(&w, &b, self.eps))?;
        if let (true, Some(r)) = (self.training, &self.running) {
            r.update(&mean, &var, m, self.momentum, true)?;
        }
        Ok(y)
    }

    fn members(&self) -> Members<'_> {
        let mut params = Vec::new();
        if let Some((w, b)) = &self.affine {
            params = vec![("weight".to_string(), w), ("bias".to_string(), b)];
        }
        Members {
            params,
            buffers: self
                .running
                .as_ref()
                .map(|r| r.buffers())
                .unwrap_or_default(),
            children: Vec::new(),
            training: Some(self.training),
            rng_calls: None,
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut params = Vec::new();
        if let Some((w, b)) = &mut self.affine {
            params = vec![("weight".to_string(), w), ("bias".to_string(), b)];
        }
        MembersMut {
            params,
            buffers: self
                .running
                .as_mut()
                .map(|r| r.buffers_mut())
                .unwrap_or_default(),
            children: Vec::new(),
            training: Some(&mut self.training),
        }
    }
}

/// PyTorch's `GroupNorm(num_groups, num_channels, eps=1e-5, affine=True)` over `[n, c, ...]`.
pub struct GroupNorm {
    pub num_groups: usize,
    pub num_channels: usize,
    pub eps: f64,
    affine: Option<(Parameter, Parameter)>,
}

impl GroupNorm {
    pub fn new(
        num_groups: usize,
        num_channels: usize,
        eps: f64,
        affine: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<GroupNorm> {
        check_features("GroupNorm", num_channels, eps)?;
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(Error::module(
                "GroupNorm",
                format!("num_groups {num_groups} must divide num_channels {num_channels}"),
            ));
        }
        Ok(GroupNorm {
            num_groups,
            num_channels,
            eps,
            affine: affine_params(num_channels, affine, dtype, dev)?,
        })
    }
}

impl Module for GroupNorm {
    fn type_name(&self) -> &'static str {
        "GroupNorm"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() < 2 || x.dims()[1] != self.num_channels {
            return Err(Error::module(
                "GroupNorm",
                format!(
                    "expected input [n, {}, ...], got {}",
                    self.num_channels,
                    x.shape()
                ),
            ));
        }
        let (w, b) = affine_or_identity(&self.affine, x, self.num_channels)?;
        in_module("GroupNorm", x.group_norm(self.num_groups, &w, &b, self.eps))
    }

    fn members(&self) -> Members<'_> {
        let mut params = Vec::new();
        if let Some((w, b)) = &self.affine {
            params = vec![("weight".to_string(), w), ("bias".to_string(), b)];
        }
        Members {
            params,
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut params = Vec::new();
        if let Some((w, b)) = &mut self.affine {
            params = vec![("weight".to_string(), w), ("bias".to_string(), b)];
        }
        MembersMut {
            params,
            ..MembersMut::default()
        }
    }
}

/// PyTorch's `InstanceNorm2d(num_features, eps=1e-5, momentum=0.1, affine=False,
/// track_running_stats=False)` over `[n, c, h, w]`: each (sample, channel) plane normalized by
/// its own statistics. With running statistics, training updates them from the planes'
/// statistics averaged over the batch (PyTorch's batch norm over `[1, n c, h, w]`), and eval
/// normalizes with them; num_batches_tracked stays 0, as in PyTorch.
pub struct InstanceNorm2d {
    pub eps: f64,
    pub momentum: Option<f64>,
    num_features: usize,
    affine: Option<(Parameter, Parameter)>,
    running: Option<Running>,
    pub training: bool,
}

impl InstanceNorm2d {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track_running_stats: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<InstanceNorm2d> {
        check_features("InstanceNorm2d", num_features, eps)?;
        Ok(InstanceNorm2d {
            eps,
            momentum,
            num_features,
            affine: affine_params(num_features, affine, dtype, dev)?,
            running: track_running_stats
                .then(|| Running::new(num_features, dtype, dev))
                .transpose()?,
            training: true,
        })
    }
}

impl Module for InstanceNorm2d {
    fn type_name(&self) -> &'static str {
        "InstanceNorm2d"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.num_features;
        if x.rank() != 4 || x.dims()[1] != c {
            return Err(Error::module(
                "InstanceNorm2d",
                format!("expected input [n, {c}, h, w], got {}", x.shape()),
            ));
        }
        let (w, b) = affine_or_identity(&self.affine, x, c)?;
        match (&self.running, self.training) {
            (None, _) => in_module("InstanceNorm2d", x.group_norm(c, &w, &b, self.eps)),
            (Some(r), false) => in_module(
                "InstanceNorm2d",
                x.batch_norm_eval(
                    r.mean.tensor(),
                    r.var.tensor(),
                    Some(&w),
                    Some(&b),
                    self.eps,
                ),
            ),
            (Some(r), true) => {
                let y = in_module("InstanceNorm2d", x.group_norm(c, &w, &b, self.eps))?;
                let (n, hw) = (x.dims()[0], x.dims()[2] * x.dims()[3]);
                // Per-plane statistics: batch norm of [1, n c, h w] gives them as [n c].
                let (_, mean, var) = no_grad(|| {
                    let flat = x.detach().reshape([1, n * c, hw])?;
                    let ones = Tensor::ones([n * c], x.dtype(), x.device())?;
                    flat.batch_norm_train(&ones, &ones.zeros_like()?, self.eps)
                })?;
                if hw <= 1 {
                    return Err(Error::module(
                        "InstanceNorm2d",
                        format!(
                            "expected more than 1 spatial element when training, got input {}",
                            x.shape()
                        ),
                    ));
                }
                let avg = |t: &Tensor| -> Result<Tensor> {
                    t.reshape([n, c])?
                        .sum(&[0], false)?
                        .mul_scalar(1.0 / n as f64)
                };
                // PyTorch's instance norm takes momentum None as 0 (no update).
                let momentum = Some(self.momentum.unwrap_or(0.0));
                r.update(&avg(&mean)?, &avg(&var)?, hw, momentum, false)?;
                Ok(y)
            }
        }
    }

    fn members(&self) -> Members<'_> {
        let mut params = Vec::new();
        if let Some((w, b)) = &self.affine {
            params = vec![("weight".to_string(), w), ("bias".to_string(), b)];
        }
        Members {
            params,
            buffers: self
                .running
                .as_ref()
                .map(|r| r.buffers())
                .unwrap_or_default(),
            children: Vec::new(),
            training: Some(self.training),
            rng_calls: None,
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut params = Vec::new();
        if let Some((w, b)) = &mut self.affine {
            params = vec![("weight".to_string(), w), ("bias".to_string(), b)];
        }
        MembersMut {
            params,
            buffers: self
                .running
                .as_mut()
                .map(|r| r.buffers_mut())
                .unwrap_or_default(),
            children: Vec::new(),
            training: Some(&mut self.training),
        }
    }
}

/// PyTorch's `Dropout2d(p=0.5)` over `[n, c, h, w]`: in training each (sample, channel) plane
/// is zeroed with probability p and the rest scaled by 1 / (1 - p); identity in eval mode.
/// Masks come from the seeded stream of `init` (`init::manual_seed`), the same on every device.
pub struct Dropout2d {
    pub p: f64,
    pub training: bool,
}

impl Dropout2d {
    pub fn new(p: f64) -> Result<Dropout2d> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::module(
                "Dropout2d",
                format!("p must be in [0, 1), got {p}"),
            ));
        }
        Ok(Dropout2d { p, training: true })
    }
}

impl Module for Dropout2d {
    fn type_name(&self) -> &'static str {
        "Dropout2d"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 4 {
            return Err(Error::module(
                "Dropout2d",
                format!("expected input [n, c, h, w], got {}", x.shape()),
            ));
        }
        if !self.training {
            return Ok(x.clone());
        }
        in_module("Dropout2d", x.dropout2d(self.p, init::next_seed()))
    }

    fn members(&self) -> Members<'_> {
        Members {
            training: Some(self.training),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            training: Some(&mut self.training),
            ..MembersMut::default()
        }
    }
}
