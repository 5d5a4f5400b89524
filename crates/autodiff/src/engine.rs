//! The backward pass: reverse topological order over the recorded graph.

use crate::rules::vjp;
use ferrite_core::graph::{no_grad, Grad};
use ferrite_core::{Error, Result, Tensor};
use std::collections::{HashMap, HashSet};

/// Backpropagates from a scalar (one-element) tensor, seeding its gradient with 1.
pub fn backward(loss: &Tensor) -> Result<()> {
    if loss.elem_count() != 1 {
        return Err(Error::shape(
            "backward",
            format!(
                "needs a one-element tensor (got {}); pass an upstream gradient with backward_with",
                loss.shape()
            ),
        ));
    }
    let seed = Tensor::constant(1.0, loss.shape(), loss.dtype(), loss.device())?;
    backward_with(loss, &seed)
}

/// Backpropagates from `out` with upstream gradient `grad` (same shape and dtype). Runs with
/// autocast off: each rule computes in the dtypes its forward op ran in.
pub fn backward_with(out: &Tensor, grad: &Tensor) -> Result<()> {
    ferrite_core::autocast_off(|| backward_exact(out, grad))
}

fn backward_exact(out: &Tensor, grad: &Tensor) -> Result<()> {
    let root = out.grad_info().ok_or_else(|| {
        Error::backend("backward", "this tensor does not require a gradient (no input is a Var, or it was computed under no_grad)")
    })?;
    if grad.shape() != out.shape() || grad.dtype() != out.dtype() {
        return Err(Error::shape(
            "backward",
            format!(
                "upstream gradient {} {} does not match output {} {}",
                grad.shape(),
                grad.dtype(),
                out.shape(),
                out.dtype()
            ),
        ));
    }
    // Topological order by iterative depth-first search (post-order).
    let mut order: Vec<Grad> = Vec::new();
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<(Grad, bool)> = vec![(root.clone(), false)];
    while let Some((g, expanded)) = stack.pop() {
        if expanded {
            order.push(g);
            continue;
        }
        if !seen.insert(g.id()) {
            continue;
        }
        stack.push((g.clone(), true));
        if let Grad::Node(n) = &g {
            n.with_inputs(|inputs| {
                for ig in inputs.iter().filter_map(|s| s.grad_info()) {
                    if !seen.contains(&ig.id()) {
                        stack.push((ig.clone(), false));
                    }
                }
            })?;
        }
    }
    let mut grads: HashMap<usize, Tensor> = HashMap::new();
    grads.insert(root.id(), grad.detach());
    for g in order.iter().rev() {
        let Some(up) = grads.remove(&g.id()) else {
            continue;
        };
        match g {
            Grad::Leaf(slot) => {
                let mut s = slot
                    .grad
                    .lock()
                    .map_err(|_| Error::backend("backward", "gradient lock poisoned"))?;
                *s = Some(match s.take() {
                    Some(prev) => no_grad(|| prev.add(&up))?,
                    None => up,
                });
            }
            Grad::Node(n) => {
                // Taking the saved inputs releases them: activations are freed as backward goes.
                let inputs = n.take_inputs()?;
                let gs = no_grad(|| vjp(&n.op, n.output, &inputs, &up))?;
                for (t, gi) in inputs.iter().zip(gs) {
                    if let (Some(ig), Some(gi)) = (t.grad_info(), gi) {
                        let acc = match grads.remove(&ig.id()) {
                            Some(prev) => no_grad(|| prev.add(&gi))?,
                            None => gi,
                        };
                        grads.insert(ig.id(), acc);
                    }
                }
            }
        }
    }
    Ok(())
}
