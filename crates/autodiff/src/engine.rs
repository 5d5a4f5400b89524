//! The backward pass: reverse topological order over the recorded graph.

use crate::rules::{adds_into_first, join_narrowed, vjp, vjp_into_first, vjp_through_gelu};
use ferrite_core::graph::{no_grad, Grad, GradOp, Inputs, ViewOp};
use ferrite_core::{DType, Error, Op, Result, Tensor, UnaryOp};
use std::collections::{HashMap, HashSet};

/// A gradient being accumulated: a tensor, or the gradients of narrowed views of one tensor
/// along one axis, kept apart until the tensor's gradient is read so that disjoint pieces
/// (q, k and v sliced from one projection) join in one `cat` with zeros in the gaps, instead
/// of each being padded to the full size and the padded copies summed.
enum Acc {
    Full(Tensor),
    Pieces {
        axis: usize,
        dims: Vec<usize>,
        /// (start along `axis`, gradient of the view)
        parts: Vec<(usize, Tensor)>,
    },
}

impl Acc {
    fn tensor(self) -> Result<Tensor> {
        match self {
            Acc::Full(t) => Ok(t),
            Acc::Pieces { axis, dims, parts } => join_narrowed(parts, &dims, axis),
        }
    }

    /// `self` plus `other`: pieces along one axis that do not overlap stay pieces.
    fn add(self, other: Acc) -> Result<Acc> {
        if let (
            Acc::Pieces { axis, dims, parts },
            Acc::Pieces {
                axis: a2,
                dims: d2,
                parts: p2,
            },
        ) = (&self, &other)
        {
            let disjoint = |p: &[(usize, Tensor)], q: &[(usize, Tensor)]| {
                p.iter().all(|(s, t)| {
                    q.iter()
                        .all(|(s2, t2)| s + t.dims()[*axis] <= *s2 || s2 + t2.dims()[*axis] <= *s)
                })
            };
            if axis == a2 && dims == d2 && disjoint(parts, p2) {
                let (axis, dims) = (*axis, dims.clone());
                let mut parts = match self {
                    Acc::Pieces { parts, .. } => parts,
                    Acc::Full(_) => Vec::new(),
                };
                if let Acc::Pieces { parts: p2, .. } = other {
                    parts.extend(p2);
                }
                return Ok(Acc::Pieces { axis, dims, parts });
            }
        }
        // A 16-bit tensor's gradient may come in f32 from some uses (`rules::matmul_grads`):
        // mixed contributions add in f32.
        no_grad(|| {
            let (a, b) = (self.tensor()?, other.tensor()?);
            let (a, b) = match a.dtype() == b.dtype() {
                true => (a, b),
                false => (a.cast(DType::F32)?, b.cast(DType::F32)?),
            };
            Ok(Acc::Full(a.add(&b)?))
        })
    }
}

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
    // How many inputs of recorded ops each node is (an op taking it twice counts twice).
    let mut uses: HashMap<usize, usize> = HashMap::new();
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
                    *uses.entry(ig.id()).or_default() += 1;
                    if !seen.contains(&ig.id()) {
                        stack.push((ig.clone(), false));
                    }
                }
            })?;
        }
    }
    let mut grads: HashMap<usize, Acc> = HashMap::new();
    grads.insert(root.id(), Acc::Full(grad.detach()));
    for g in order.iter().rev() {
        let Some(up) = grads.remove(&g.id()) else {
            continue;
        };
        let up = no_grad(|| up.tensor())?;
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
                // A narrowed view's gradient is kept as a piece of its input's (see `Acc`).
                let gs: Vec<Option<Acc>> = match &n.op {
                    GradOp::View(ViewOp::Narrow { axis, start }) if inputs.len() == 1 => {
                        vec![Some(Acc::Pieces {
                            axis: *axis,
                            dims: inputs[0].dims()?.to_vec(),
                            parts: vec![(*start, up)],
                        })]
                    }
                    _ if let Some((pre, edge)) = gelu_feed(&n.op, &inputs, &uses)? => {
                        // The product's left gradient goes to the GELU's input (the GELU's
                        // node and the reshapes between are passed over: nothing else feeds
                        // them a gradient).
                        let rows = no_grad(|| pre.reshape(inputs[0].dims()?))?;
                        let mut gs = no_grad(|| vjp_through_gelu(&n.op, &inputs, &up, &rows))?
                            .ok_or_else(|| Error::backend("backward", "no product rule"))?;
                        if let Some(d) = gs.first_mut().and_then(Option::take) {
                            let d = Acc::Full(no_grad(|| d.reshape(pre.shape()))?);
                            gather(&mut grads, edge.id(), d)?;
                        }
                        gs.into_iter().map(|g| g.map(Acc::Full)).collect()
                    }
                    _ => {
                        // A rule that adds into its first input's gradient takes what that
                        // input has gathered so far (saving a pass over it).
                        let acc = match inputs.first().and_then(|t| t.grad_info()) {
                            Some(ig) if adds_into_first(&n.op) => match grads.remove(&ig.id()) {
                                Some(Acc::Full(t)) => Some(t),
                                other => {
                                    if let Some(pieces) = other {
                                        grads.insert(ig.id(), pieces);
                                    }
                                    None
                                }
                            },
                            _ => None,
                        };
                        no_grad(|| match acc {
                            Some(acc) => vjp_into_first(&n.op, n.output, &inputs, &up, acc),
                            None => vjp(&n.op, n.output, &inputs, &up),
                        })?
                        .into_iter()
                        .map(|g| g.map(Acc::Full))
                        .collect()
                    }
                };
                for (t, gi) in inputs.iter().zip(gs) {
                    if let (Some(ig), Some(gi)) = (t.grad_info(), gi) {
                        gather(&mut grads, ig.id(), gi)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Adds `g` to the gradient gathered so far for node `id`.
fn gather(grads: &mut HashMap<usize, Acc>, id: usize, g: Acc) -> Result<()> {
    let acc = match grads.remove(&id) {
        Some(prev) => prev.add(g)?,
        None => g,
    };
    grads.insert(id, acc);
    Ok(())
}

/// Where `op` is a product of matrices (`Matmul`, `MatmulBias`) whose left operand is the
/// output of a tanh GELU, directly or through reshapes, that no other recorded op takes:
/// the GELU's input (its saved value, taken from the GELU's node) and its graph edge.
fn gelu_feed(
    op: &GradOp,
    inputs: &Inputs,
    uses: &HashMap<usize, usize>,
) -> Result<Option<(Tensor, Grad)>> {
    let matrix = |i: usize| inputs[i].dims().is_ok_and(|d| d.len() == 2);
    match op {
        GradOp::Op(Op::MatmulBias { .. }) => {}
        GradOp::Op(Op::Matmul) if matrix(0) && matrix(1) => {}
        _ => return Ok(None),
    }
    let Some(mut at) = inputs[0].grad_info().cloned() else {
        return Ok(None);
    };
    loop {
        let Grad::Node(node) = &at else {
            return Ok(None);
        };
        if uses.get(&at.id()) != Some(&1) {
            return Ok(None);
        }
        match &node.op {
            GradOp::View(ViewOp::Reshape) => {
                match node.with_inputs(|i| i[0].grad_info().cloned())? {
                    Some(next) => at = next,
                    None => return Ok(None),
                }
            }
            GradOp::Op(Op::Unary(UnaryOp::GeluTanh)) => {
                let ins = node.take_inputs()?;
                let pre = ins[0].value()?.clone();
                return Ok(ins[0].grad_info().cloned().map(|edge| (pre, edge)));
            }
            _ => return Ok(None),
        }
    }
}
