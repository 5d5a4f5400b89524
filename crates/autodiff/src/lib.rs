//! ferrite-autodiff: reverse-mode automatic differentiation over ferrite tensors.
//!
//! Every op on a tensor that requires a gradient is recorded (by `ferrite-core`, see
//! `ferrite_core::graph`), keeping of its inputs only what its backward rule reads;
//! `backward` walks that graph from a scalar in reverse topological order, applying the rules
//! in `rules.rs` (one exhaustive match over the ops), and accumulates gradients into the
//! trainable leaves (`Var`). Each op application's saved inputs are released as soon as its
//! rule has run; a second backward through the same graph is an error. Recording costs nothing
//! when no input requires a gradient, and `no_grad` turns it off.

mod engine;
mod rules;

pub use engine::{backward, backward_with};
pub use ferrite_core::graph::{enable_grad, no_grad};

use ferrite_core::graph::LeafSlot;
use ferrite_core::{Error, Result, Tensor};
use std::sync::Arc;

/// A trainable leaf: a tensor whose gradient accumulates across `backward` calls until
/// `zero_grad`.
#[derive(Clone)]
pub struct Var {
    tensor: Tensor,
    slot: Arc<LeafSlot>,
}

impl Var {
    /// A trainable copy of `t`'s handle (same storage, detached from any graph).
    pub fn new(t: &Tensor) -> Result<Var> {
        let slot = Arc::new(LeafSlot::default());
        Ok(Var {
            tensor: t.detach().as_leaf(slot.clone())?,
            slot,
        })
    }

    /// The tensor to compute with; ops on it are recorded.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The accumulated gradient, if any backward reached this leaf.
    pub fn grad(&self) -> Option<Tensor> {
        self.slot.grad.lock().ok().and_then(|g| g.clone())
    }

    pub fn zero_grad(&self) {
        if let Ok(mut g) = self.slot.grad.lock() {
            *g = None;
        }
    }

    /// Replaces the value (e.g. an optimizer step), keeping the gradient slot.
    pub fn set(&mut self, value: &Tensor) -> Result<()> {
        if value.shape() != self.tensor.shape() || value.dtype() != self.tensor.dtype() {
            return Err(Error::shape(
                "Var::set",
                format!(
                    "new value {} {} does not match {} {}",
                    value.shape(),
                    value.dtype(),
                    self.tensor.shape(),
                    self.tensor.dtype()
                ),
            ));
        }
        self.tensor = value.detach().as_leaf(self.slot.clone())?;
        Ok(())
    }
}
