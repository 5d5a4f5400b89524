//! `Dropout(p=0.5)`: in training, zeroes each element with probability p and scales the rest
//! by 1 / (1 - p); the identity in eval mode. Masks come from the Philox RNG
//! (`Tensor::rand_uniform`), so a seed gives the same mask on every device.

use crate::{init, Members, MembersMut, Module};
use ferrite_core::{no_grad, DType, Error, Result, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// Drops elements of `x` with probability `p` (keeps where uniform[0, 1) ≥ p), drawing the
/// mask from Philox with `seed`; the identity when `training` is false or p = 0.
pub fn dropout(x: &Tensor, p: f64, training: bool, seed: u64) -> Result<Tensor> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::shape(
            "dropout",
            format!("probability must be in [0, 1), got {p}"),
        ));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    let mask = no_grad(|| -> Result<Tensor> {
        let u = Tensor::rand_uniform(x.shape().clone(), 0.0, 1.0, seed, DType::F32, x.device())?;
        u.ge(&u.scalar_like(p)?)?
            .cast(x.dtype())?
            .mul_scalar(1.0 / (1.0 - p))
    })?;
    x.mul(&mask)
}

pub struct Dropout {
    p: f64,
    training: bool,
    seed: u64,
    calls: AtomicU64,
}

impl Dropout {
    /// Whether `forward` returns its input unchanged (p = 0, or evaluation mode).
    pub fn is_identity(&self) -> bool {
        !self.training || self.p == 0.0
    }

    /// p in [0, 1); the mask stream is seeded from `init::next_seed()`.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::module(
                "Dropout",
                format!("dropout probability must be in [0, 1), got {p}"),
            ));
        }
        Ok(Dropout {
            p,
            training: true,
            seed: init::next_seed(),
            calls: AtomicU64::new(0),
        })
    }

    pub fn p(&self) -> f64 {
        self.p
    }

    /// The seed of the next mask (each forward in training takes the next one).
    pub fn next_mask_seed(&self) -> u64 {
        self.seed.wrapping_add(
            self.calls
                .load(Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )
    }
}

impl Module for Dropout {
    fn type_name(&self) -> &'static str {
        "Dropout"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.is_identity() {
            return Ok(x.clone());
        }
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let seed = self
            .seed
            .wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        dropout(x, self.p, true, seed).map_err(|e| Error::module("Dropout", e.to_string()))
    }

    fn members(&self) -> Members<'_> {
        Members {
            training: Some(self.training),
            rng_calls: Some(&self.calls),
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
