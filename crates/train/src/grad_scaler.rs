//! Dynamic loss scaling for fp16 training (PyTorch's `torch.amp.GradScaler`), decided on the
//! device: the loss is multiplied by the scale before `backward`; the optimizer step unscales
//! the gradients inside its fused kernel, and when any gradient is inf/NaN the step changes
//! nothing, the scale is multiplied by `backoff_factor` and the growth count restarts; after
//! `growth_interval` finite steps in a row the scale is multiplied by `growth_factor`. The host
//! reads nothing: the scale, the growth count and the count of skipped steps are f64 device
//! scalars (read them when logging).
//!
//! ```ignore
//! let mut scaler = GradScaler::new(GradScalerConfig::default(), &dev)?;
//! opt.zero_grad();
//! let loss = model_loss(...)?;                 // f32 (or cast to it by `scale`)
//! ferrite_autodiff::backward(&scaler.scale(&loss)?)?;
//! scaler.step(&mut opt)?;                     // unscale, check, step or skip, update the scale
//! ```

use crate::optim::Optimizer;
use crate::{Error, Result};
use ferrite_core::{DType, Device, Tensor};

/// PyTorch's defaults: scale 2^16, growth 2 every 2000 finite steps, backoff 0.5.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradScalerConfig {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u64,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

pub struct GradScaler {
    cfg: GradScalerConfig,
    /// f64 device scalars: the scale, finite steps since the last change, skipped steps.
    scale: Tensor,
    growth: Tensor,
    skipped: Tensor,
}

impl GradScaler {
    pub fn new(cfg: GradScalerConfig, device: &Device) -> Result<GradScaler> {
        let what = "GradScaler";
        let bad = |name: &str, v: f64, want: &str| {
            Err(Error::config(
                what,
                format!("{name} must be {want}, got {v}"),
            ))
        };
        if !(cfg.init_scale.is_finite() && cfg.init_scale > 0.0) {
            return bad("init_scale", cfg.init_scale, "finite and > 0");
        }
        if !(cfg.growth_factor.is_finite() && cfg.growth_factor > 1.0) {
            return bad("growth_factor", cfg.growth_factor, "finite and > 1");
        }
        if !(cfg.backoff_factor > 0.0 && cfg.backoff_factor < 1.0) {
            return bad("backoff_factor", cfg.backoff_factor, "in (0, 1)");
        }
        if cfg.growth_interval == 0 {
            return Err(Error::config(
                what,
                "growth_interval must be at least 1, got 0",
            ));
        }
        let s = |v: f64| -> Result<Tensor> { Ok(Tensor::full(v, (), DType::F64, device)?) };
        Ok(GradScaler {
            cfg,
            scale: s(cfg.init_scale)?,
            growth: s(0.0)?,
            skipped: s(0.0)?,
        })
    }

    /// `loss × scale`, in f32 (a half-precision loss is cast first, so the scale itself never
    /// overflows it); differentiable, so `backward` of it gives scaled gradients.
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        let l = match loss.dtype() {
            DType::F16 | DType::BF16 => loss.cast(DType::F32)?,
            _ => loss.clone(),
        };
        Ok(l.mul(&self.scale.cast(l.dtype())?)?)
    }

    /// The optimizer step on the unscaled gradients (skipped when they are not finite), then
    /// the scale update. Enqueues device work only.
    pub fn step(&mut self, opt: &mut Optimizer) -> Result<()> {
        let inv = self.scale.recip()?;
        let finite = opt.step_scaled(Some(&inv))?;
        let f = finite.cast(DType::F64)?;
        let found = f.neg()?.add_scalar(1.0)?;
        let count = self.growth.add_scalar(1.0)?.mul(&f)?;
        // grow ⇔ finite and count reached the interval.
        let grow = count
            .ge(&Tensor::full(
                self.cfg.growth_interval as f64,
                (),
                DType::F64,
                count.device(),
            )?)?
            .cast(DType::F64)?;
        // factor = found ? backoff : (grow ? growth : 1)
        let factor = found.mul_scalar(self.cfg.backoff_factor)?.add(
            &f.mul(
                &grow
                    .mul_scalar(self.cfg.growth_factor - 1.0)?
                    .add_scalar(1.0)?,
            )?,
        )?;
        let scale = self.scale.mul(&factor)?;
        let count = count.mul(&grow.neg()?.add_scalar(1.0)?)?;
        let skipped = self.skipped.add(&found)?;
        self.scale.copy_(&scale)?;
        self.growth.copy_(&count)?;
        self.skipped.copy_(&skipped)?;
        Ok(())
    }

    /// The current scale (a device scalar; reading it waits).
    pub fn scale_tensor(&self) -> &Tensor {
        &self.scale
    }

    /// The settings it was made with.
    pub fn config(&self) -> GradScalerConfig {
        self.cfg
    }

    /// What a checkpoint keeps (PyTorch's `GradScaler.state_dict`): the scale, the finite
    /// steps since its last change, the skipped steps, and the settings. Reads the device.
    pub fn state_dict(&self) -> Result<serde_json::Value> {
        Ok(serde_json::json!({
            "scale": self.scale.item::<f64>()?,
            "growth_tracker": self.growth.item::<f64>()?,
            "skipped": self.skipped.item::<f64>()?,
            "growth_factor": self.cfg.growth_factor,
            "backoff_factor": self.cfg.backoff_factor,
            "growth_interval": self.cfg.growth_interval,
        }))
    }

    /// Restores `state_dict`'s values (written in place into the device scalars); a value that
    /// is missing or out of its domain is an error naming it, and nothing is written then.
    pub fn load_state_dict(&mut self, v: &serde_json::Value) -> Result<()> {
        let what = "GradScaler::load_state_dict";
        let get = |k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_f64)
                .ok_or_else(|| Error::state(what, format!("the saved state has no number `{k}`")))
        };
        let (scale, growth, skipped) = (get("scale")?, get("growth_tracker")?, get("skipped")?);
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::state(
                what,
                format!("scale must be finite and > 0, got {scale}"),
            ));
        }
        for (k, x) in [("growth_tracker", growth), ("skipped", skipped)] {
            if !(x.is_finite() && x >= 0.0 && x.fract() == 0.0) {
                return Err(Error::state(
                    what,
                    format!("{k} must be a whole number >= 0, got {x}"),
                ));
            }
        }
        let dev = self.scale.device().clone();
        for (dst, x) in [
            (&self.scale, scale),
            (&self.growth, growth),
            (&self.skipped, skipped),
        ] {
            dst.copy_(&Tensor::full(x, (), DType::F64, &dev)?)?;
        }
        Ok(())
    }

    /// Reads the scale and the number of skipped steps (one host wait each).
    pub fn read(&self) -> Result<(f64, u64)> {
        Ok((
            self.scale.item::<f64>()?,
            self.skipped.item::<f64>()? as u64,
        ))
    }
}
