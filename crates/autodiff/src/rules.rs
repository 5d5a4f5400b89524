//! Backward rules: one exhaustive match over every recorded op. Each rule maps the upstream
//! gradient `g` of one output to a gradient per input (`None` where none flows: integer
//! inputs, indices, conditions). Inputs are as the op received them (broadcasting happened in
//! recorded views, so binary rules see equal shapes). Recording keeps of each input only what
//! its rule reads (`ferrite_core::graph::keeps`: the values, the dims and dtype, or just the
//! graph edge), so a rule reads nothing more, and computes no gradient for an input that does
//! not require one. exp, sqrt, tanh, sigmoid, softmax and log-softmax read their kept output
//! (`graph::keeps_output`); other outputs a rule needs are recomputed from the inputs.
//!
//! Fused ops have dedicated backward kernels (`Op::*Backward`); RoPE with trainable angles
//! takes the vector-Jacobian product of its composition.
//!
//! Conventions: sign, floor, ceil and round have derivative 0; abs has derivative sign(x)
//! (0 at 0); relu has 0 at 0. Ties: `maximum`/`minimum` give the gradient to the first operand;
//! `max`/`min` reductions split it equally among all tied elements.

use ferrite_core::graph::{enable_grad, Grad, GradOp, Inputs, Saved, ViewOp};
use ferrite_core::{composed, BinaryOp, DType, Error, Op, ReduceOp, Result, Tensor, UnaryOp};

type Grads = Vec<Option<Tensor>>;

fn one(t: Tensor) -> Result<Grads> {
    Ok(vec![Some(t)])
}

/// The gradient of input `x` when it requires one: `f()`; else `None` (nothing computed).
fn when(x: &Saved, f: impl FnOnce() -> Result<Tensor>) -> Result<Option<Tensor>> {
    match x.requires_grad() {
        true => f().map(Some),
        false => Ok(None),
    }
}

/// Gradients of a product's operands a, b (x[0], x[1]): g bᵀ and aᵀ g, g first brought to
/// the operands' dtype (an f32 product of 16-bit operands). b's gradient is written in f32
/// where b is autocast's 16-bit copy of an f32 weight (`f32_cast_view`): the cast's rule
/// then hands it on as is, with no rounding to 16 bits and no cast kernel between.
///
/// With `pre`, x[0] is a tanh GELU's output (`pre` its input, as rows [m, k]) and the first
/// gradient is pre's instead, gelu_tanh'(pre) (g bᵀ), in one op (`vjp_through_gelu`).
fn matmul_grads(x: &Inputs, g: &Tensor, pre: Option<&Tensor>) -> Result<Grads> {
    let g = &g.cast(x[0].dtype()?)?;
    let left = match pre {
        Some(pre) => Some(g.matmul_gelu_backward(&x[1].value()?.t()?, pre)?),
        None => when(&x[0], || g.matmul(&x[1].value()?.t()?))?,
    };
    Ok(vec![
        left,
        when(&x[1], || {
            let a = x[0].value()?;
            let out = match a.dtype().is_float() && a.dtype().size_in_bytes() == 2 {
                true if f32_cast_view(&x[1]) => DType::F32,
                _ => a.dtype(),
            };
            // A transposed matrix (a Linear's `Wᵀ`): its gradient as `(gᵀ a)ᵀ`, a
            // transposed view of a contiguous product, so the transpose's own backward
            // gives `W`'s gradient contiguous, with no copy.
            let (d, s) = (x[1].dims()?, x[1].strides()?);
            if d.len() == 2 && d[0] > 1 && d[1] > 1 && s == [1, d[0]] {
                g.t()?.matmul_out(a, out)?.t()
            } else {
                a.t()?.matmul_out(g, out)
            }
        })?,
    ])
}

/// Whether `w` is a transposed view of a 16-bit cast of an f32 tensor: autocast's copy of an
/// f32 weight, used as a product's `Wᵀ`.
fn f32_cast_view(w: &Saved) -> bool {
    let Some(Grad::Node(view)) = w.grad_info() else {
        return false;
    };
    if !matches!(view.op, GradOp::View(ViewOp::Permute(_))) {
        return false;
    }
    view.with_inputs(|vi| vi.iter().next().is_some_and(cast_of_f32))
        .unwrap_or(false)
}

/// Whether `t` is a 16-bit cast of an f32 tensor (autocast's copy of an f32 parameter).
fn cast_of_f32(t: &Saved) -> bool {
    match t.grad_info() {
        Some(Grad::Node(c)) if matches!(c.op, GradOp::Op(Op::Cast(DType::BF16 | DType::F16))) => c
            .with_inputs(|ci| {
                ci.iter()
                    .next()
                    .is_some_and(|s| matches!(s.dtype(), Ok(DType::F32)))
            })
            .unwrap_or(false),
        _ => false,
    }
}

/// A bias's gradient: g [m, n] summed over its rows. Where the bias is autocast's 16-bit
/// copy of an f32 bias, in f32 by a product with a row of ones (cuBLASLt's f32 output of
/// 16-bit operands: one pass, no cast after; the cast's rule passes it on); else a column
/// sum in g's dtype.
fn bias_grad(bias: &Saved, g: &Tensor) -> Result<Tensor> {
    if g.dtype().size_in_bytes() == 2 && g.rank() == 2 && cast_of_f32(bias) {
        let (m, n) = (g.dims()[0], g.dims()[1]);
        let ones = Tensor::constant(1.0, [1, m], g.dtype(), g.device())?;
        return ones.matmul_out(g, DType::F32)?.reshape([n]);
    }
    g.sum(&[0], false)
}

/// `Op::MatmulBias`'s rule; `pre` as in `matmul_grads`.
fn matmul_bias_grads(acc: bool, x: &Inputs, g: &Tensor, pre: Option<&Tensor>) -> Result<Grads> {
    // An f32 gradient of 16-bit operands (autocast's f32 output): made the products'
    // operand and summed into the bias gradient in one pass.
    let low = x[0].dtype()?;
    let (gl, db) = match g.dtype() != low && x[2].requires_grad() && g.rank() == 2 {
        true => {
            let (gl, db) = g.cast_col_sums(low)?;
            (gl, Some(db))
        }
        false => (g.clone(), when(&x[2], || bias_grad(&x[2], g))?),
    };
    let mut grads = matmul_grads(x, &gl, pre)?;
    grads.push(db);
    if acc {
        grads.push(when(&x[3], || g.reshape(x[3].dims()?))?);
    }
    Ok(grads)
}

/// The rule of a product of matrices (`Matmul`, `MatmulBias`) whose left operand is the
/// output of a tanh GELU with input `pre` (rows [m, k]) that nothing else uses: the first
/// gradient is pre's, gelu_tanh'(pre) (g bᵀ) in one op (the derivative in the product's
/// epilogue), where the plain rule would give the operand's and the GELU's rule then
/// another pass over it. `None` for other ops.
pub(crate) fn vjp_through_gelu(
    op: &GradOp,
    x: &Inputs,
    g: &Tensor,
    pre: &Tensor,
) -> Result<Option<Grads>> {
    match op {
        GradOp::Op(Op::Matmul) => matmul_grads(x, g, Some(pre)).map(Some),
        GradOp::Op(Op::MatmulBias { acc }) => matmul_bias_grads(*acc, x, g, Some(pre)).map(Some),
        _ => Ok(None),
    }
}

pub(crate) fn vjp(op: &GradOp, output: usize, x: &Inputs, g: &Tensor) -> Result<Grads> {
    match op {
        GradOp::View(v) => view(v, &x[0], g),
        GradOp::Op(op) => primitive(op, output, x, g),
    }
}

fn view(v: &ViewOp, x: &Saved, g: &Tensor) -> Result<Grads> {
    match v {
        ViewOp::Reshape => one(g.reshape(x.shape()?)?),
        ViewOp::Permute(perm) => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            one(g.permute(&inv)?)
        }
        ViewOp::Narrow { axis, start } => {
            one(join_narrowed(vec![(*start, g.clone())], x.dims()?, *axis)?)
        }
        ViewOp::Broadcast => one(unbroadcast(g, x.dims()?)?),
    }
}

/// The gradient of a tensor of `dims` from the gradients of its narrowed views along `axis`,
/// given as (start, gradient), disjoint: the pieces in order with zeros in the gaps (shared
/// zero constants, no fill per backward), one `cat`; a piece covering the tensor is itself,
/// and pieces that already lie side by side in one storage (an op that wrote them into one
/// buffer: `attention_backward` for a projection's q, k, v) are that storage's view.
pub(crate) fn join_narrowed(
    mut parts: Vec<(usize, Tensor)>,
    dims: &[usize],
    axis: usize,
) -> Result<Tensor> {
    parts.sort_by_key(|(start, _)| *start);
    if let Some(whole) = tiled_view(&parts, dims, axis) {
        return Ok(whole);
    }
    let Some((_, first)) = parts.first() else {
        return Err(Error::backend("backward", "no gradient to join"));
    };
    let (dtype, device) = (first.dtype(), first.device().clone());
    let zeros = |n: usize| {
        let mut d = dims.to_vec();
        d[axis] = n;
        Tensor::constant(0.0, d, dtype, &device)
    };
    let mut pieces: Vec<Tensor> = Vec::new();
    let mut at = 0;
    for (start, g) in parts {
        if start > at {
            pieces.push(zeros(start - at)?);
        }
        at = start + g.dims()[axis];
        pieces.push(g);
    }
    if at < dims[axis] {
        pieces.push(zeros(dims[axis] - at)?);
    }
    match pieces.len() {
        1 => Ok(pieces.remove(0)),
        _ => Tensor::cat(&pieces.iter().collect::<Vec<_>>(), axis as isize),
    }
}

/// The view of one storage that `parts` (sorted by start) tile along `axis` without gaps:
/// each a view of that storage with the same strides and dtype, `dims` but for `axis`, at the
/// offset its start gives. `None` where they do not.
fn tiled_view(parts: &[(usize, Tensor)], dims: &[usize], axis: usize) -> Option<Tensor> {
    if parts.len() < 2 {
        return None;
    }
    let (_, first) = parts.first()?;
    let lay = first.layout();
    let stride = *lay.strides().get(axis)?;
    let mut at = 0;
    for (start, g) in parts {
        let l = g.layout();
        let same_dims =
            g.rank() == dims.len() && (0..dims.len()).all(|i| i == axis || g.dims()[i] == dims[i]);
        if *start != at
            || !same_dims
            || g.dtype() != first.dtype()
            || !std::sync::Arc::ptr_eq(g.storage_arc(), first.storage_arc())
            || l.strides() != lay.strides()
            || l.offset() != lay.offset() + start * stride
        {
            return None;
        }
        at += g.dims()[axis];
    }
    if at != dims[axis] {
        return None;
    }
    let layout = ferrite_core::Layout::new(dims.into(), lay.strides().to_vec(), lay.offset());
    Some(Tensor::from_storage(
        first.storage_arc().clone(),
        layout,
        first.device().clone(),
    ))
}

/// Sums `g` over the dims a broadcast to its shape added or stretched, back to `dims`.
fn unbroadcast(g: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let lead = g.rank() - dims.len();
    let axes: Vec<isize> = (0..g.rank())
        .filter(|&i| i < lead || (dims[i - lead] == 1 && g.dims()[i] != 1))
        .map(|i| i as isize)
        .collect();
    if axes.is_empty() {
        return g.reshape(dims);
    }
    g.sum(&axes, true)?.reshape(dims)
}

/// Zeros with the (kept) dims and dtype of input `x`, on `g`'s device.
fn zeros_as(x: &Saved, g: &Tensor) -> Result<Tensor> {
    Tensor::zeros(x.shape()?, x.dtype()?, g.device())
}

/// `g` where `cond`, else 0 (a broadcast scalar zero: no zero tensor is written).
fn mask(cond: &Tensor, g: &Tensor) -> Result<Tensor> {
    Tensor::where_cond(cond, g, &g.scalar_like(0.0)?)
}

fn unary(op: UnaryOp, x: &Inputs, g: &Tensor) -> Result<Tensor> {
    let zero = || g.zeros_like();
    // The output, for the ops whose derivative is a function of it (`graph::keeps_output`;
    // their input was not kept).
    let y = || x.output(g);
    let x = || x[0].value();
    match op {
        UnaryOp::Neg => g.neg(),
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => zero(),
        UnaryOp::Abs => g.mul(&x()?.sign()?),
        UnaryOp::Exp => g.mul(&y()?),
        UnaryOp::Log => g.div(x()?),
        UnaryOp::Sqrt => g.div(&y()?.mul_scalar(2.0)?),
        UnaryOp::Rsqrt => {
            let x = x()?;
            g.mul(&x.rsqrt()?.div(x)?.mul_scalar(-0.5)?)
        }
        UnaryOp::Recip => g.neg()?.div(&x()?.square()?),
        UnaryOp::Square => g.mul(&x()?.mul_scalar(2.0)?),
        UnaryOp::Sin => g.mul(&x()?.cos()?),
        UnaryOp::Cos => g.mul(&x()?.sin()?.neg()?),
        UnaryOp::Tanh => g.mul(&y()?.square()?.neg()?.add_scalar(1.0)?),
        UnaryOp::Sigmoid => {
            let s = y()?;
            g.mul(&s.mul(&s.neg()?.add_scalar(1.0)?)?)
        }
        UnaryOp::Relu => x()?.binary(BinaryOp::ReluBackward, g),
        UnaryOp::GeluErf => x()?.binary(BinaryOp::GeluBackward, g),
        UnaryOp::GeluTanh => x()?.binary(BinaryOp::GeluTanhBackward, g),
        UnaryOp::Silu => x()?.binary(BinaryOp::SiluBackward, g),
    }
}

/// f''(x) of the activation whose derivative `op` is (`BinaryOp::*Backward`).
fn activation_second_derivative(op: BinaryOp, x: &Tensor) -> Result<Tensor> {
    match op {
        // φ(x) (2 - x²)
        BinaryOp::GeluBackward => x
            .square()?
            .mul_scalar(-0.5)?
            .exp()?
            .mul_scalar(1.0 / (2.0 * std::f64::consts::PI).sqrt())?
            .mul(&x.square()?.neg()?.add_scalar(2.0)?),
        // With u = c (x + k x³), t = tanh(u): (1 - t²) (u' - ½ x (2 t u'² - u''))
        BinaryOp::GeluTanhBackward => {
            let (c, k) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
            let x2 = x.square()?;
            let t = x
                .mul(&x2.mul_scalar(k)?.add_scalar(1.0)?)?
                .mul_scalar(c)?
                .tanh()?;
            let du = x2.mul_scalar(3.0 * k * c)?.add_scalar(c)?;
            let ddu = x.mul_scalar(6.0 * k * c)?;
            let inner = t.mul(&du.square()?)?.mul_scalar(2.0)?.sub(&ddu)?;
            t.square()?
                .neg()?
                .add_scalar(1.0)?
                .mul(&du.sub(&x.mul(&inner)?.mul_scalar(0.5)?)?)
        }
        // s (1 - s) (2 + x (1 - 2 s)), s = sigmoid(x)
        _ => {
            let s = x.sigmoid()?;
            let ds = s.mul(&s.neg()?.add_scalar(1.0)?)?;
            ds.mul(
                &x.mul(&s.mul_scalar(-2.0)?.add_scalar(1.0)?)?
                    .add_scalar(2.0)?,
            )
        }
    }
}

fn binary(op: BinaryOp, a: &Saved, b: &Saved, g: &Tensor) -> Result<Grads> {
    let (ga, gb) = match op {
        BinaryOp::Add => (when(a, || Ok(g.clone()))?, when(b, || Ok(g.clone()))?),
        BinaryOp::Sub => (when(a, || Ok(g.clone()))?, when(b, || g.neg())?),
        BinaryOp::Mul => (
            when(a, || g.mul(b.value()?))?,
            when(b, || g.mul(a.value()?))?,
        ),
        BinaryOp::Div => (
            when(a, || g.div(b.value()?))?,
            when(b, || {
                let (a, b) = (a.value()?, b.value()?);
                g.neg()?.mul(a)?.div(&b.square()?)
            })?,
        ),
        BinaryOp::Pow => {
            let (av, bv) = (a.value()?, b.value()?);
            let ga = when(a, || g.mul(bv)?.mul(&av.pow(&bv.add_scalar(-1.0)?)?))?;
            // d/db a^b = a^b ln a, taken as 0 where a <= 0.
            let gb = when(b, || {
                let pos = av.gt(&av.scalar_like(0.0)?)?;
                let safe = Tensor::where_cond(&pos, av, &av.ones_like()?)?;
                mask(&pos, &g.mul(&av.pow(bv)?)?.mul(&safe.log()?)?)
            })?;
            (ga, gb)
        }
        // d/dx (g f'(x)) = g f''(x); d/dg = f'(x).
        // Zero almost everywhere in x; g passes where x > 0.
        BinaryOp::ReluBackward => (
            when(a, || a.value()?.zeros_like())?,
            when(b, || a.value()?.binary(op, g))?,
        ),
        BinaryOp::GeluBackward | BinaryOp::GeluTanhBackward | BinaryOp::SiluBackward => {
            let (x, gv) = (a.value()?, b.value()?);
            (
                when(a, || g.mul(gv)?.mul(&activation_second_derivative(op, x)?))?,
                when(b, || x.binary(op, g))?,
            )
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let (av, bv) = (a.value()?, b.value()?);
            let max = op == BinaryOp::Maximum;
            (
                when(a, || mask(&if max { av.ge(bv)? } else { av.le(bv)? }, g))?,
                when(b, || mask(&if max { av.lt(bv)? } else { av.gt(bv)? }, g))?,
            )
        }
    };
    Ok(vec![ga, gb])
}

/// Fused ops: the vector-Jacobian product of their composition from primitives.
fn through_composition(
    x: &[Tensor],
    g: &Tensor,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Grads> {
    enable_grad(|| {
        let vars = x
            .iter()
            .map(|t| {
                if t.dtype().is_float() {
                    crate::Var::new(t).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let ins: Vec<Tensor> = x
            .iter()
            .zip(&vars)
            .map(|(t, v)| v.as_ref().map_or_else(|| t.clone(), |v| v.tensor().clone()))
            .collect();
        let out = f(&ins)?;
        crate::backward_with(&out, g)?;
        Ok(vars
            .iter()
            .map(|v| v.as_ref().and_then(|v| v.grad()))
            .collect())
    })
}

/// Ops whose rule can add the gradient their first input has gathered from its other uses
/// (a residual connection's) to the one it computes, in the same pass: `vjp_into_first`.
pub(crate) fn adds_into_first(op: &GradOp) -> bool {
    matches!(op, GradOp::Op(Op::LayerNorm { .. } | Op::RmsNorm { .. }))
}

/// `vjp` with `acc` (the first input's gradient so far, which that input's other uses gave)
/// added to the gradient of the first input.
pub(crate) fn vjp_into_first(
    op: &GradOp,
    output: usize,
    x: &Inputs,
    g: &Tensor,
    acc: Tensor,
) -> Result<Grads> {
    let x0 = x[0].value()?;
    let fits = acc.shape() == x0.shape() && acc.dtype() == x0.dtype();
    match op {
        GradOp::Op(Op::LayerNorm { eps }) if fits => {
            let (dx, dw, db) =
                Tensor::layer_norm_backward_acc(x0, x[1].value()?, g, *eps, Some(&acc))?;
            Ok(vec![Some(dx), Some(dw), Some(db)])
        }
        GradOp::Op(Op::RmsNorm { eps }) if fits => {
            let (dx, dw) = Tensor::rms_norm_backward_acc(x0, x[1].value()?, g, *eps, Some(&acc))?;
            Ok(vec![Some(dx), Some(dw)])
        }
        _ => {
            let mut grads = vjp(op, output, x, g)?;
            if let Some(first) = grads.first_mut() {
                *first = Some(match first.take() {
                    Some(d) => acc.add(&d)?,
                    None => acc,
                });
            }
            Ok(grads)
        }
    }
}

fn primitive(op: &Op, output: usize, x: &Inputs, g: &Tensor) -> Result<Grads> {
    match op {
        Op::Unary(u) => one(unary(*u, x, g)?),
        Op::Binary(b) => binary(*b, &x[0], &x[1], g),
        Op::Where => {
            let c = x[0].value()?;
            Ok(vec![
                None,
                when(&x[1], || mask(c, g))?,
                when(&x[2], || Tensor::where_cond(c, &g.zeros_like()?, g))?,
            ])
        }
        Op::Reduce { op, axes } => {
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let xs = x[0].shape()?;
            match op {
                ReduceOp::Sum => one(g.broadcast_to(xs)?),
                ReduceOp::Max | ReduceOp::Min => {
                    let x0 = x[0].value()?;
                    let y = if *op == ReduceOp::Max {
                        x0.max(&axes, true)?
                    } else {
                        x0.min(&axes, true)?
                    };
                    let hit = x0.eq(&y)?;
                    let count = hit.cast(g.dtype())?.sum(&axes, true)?;
                    one(mask(&hit, &g.div(&count)?.broadcast_to(xs)?)?)
                }
                ReduceOp::ArgMax | ReduceOp::ArgMin => Ok(vec![None]),
            }
        }
        Op::Matmul => matmul_grads(x, g, None),
        Op::MatmulBias { acc } => matmul_bias_grads(*acc, x, g, None),
        Op::Cast(_) => {
            let dt = x[0].dtype()?;
            Ok(vec![match dt.is_float() {
                true => Some(g.cast(dt)?),
                false => None,
            }])
        }
        Op::Copy => one(g.clone()),
        Op::IndexSelect { axis } => {
            let index = x[1].value()?;
            let mut shape = vec![1; g.rank()];
            shape[*axis] = index.elem_count();
            let idx = index.reshape(shape)?.broadcast_to(g.shape())?;
            Ok(vec![
                Some(zeros_as(&x[0], g)?.scatter_add(&idx, g, *axis as isize)?),
                None,
            ])
        }
        Op::Gather { axis } => Ok(vec![
            Some(zeros_as(&x[0], g)?.scatter_add(x[1].value()?, g, *axis as isize)?),
            None,
        ]),
        Op::ScatterAdd { axis } => Ok(vec![
            when(&x[0], || Ok(g.clone()))?,
            None,
            when(&x[2], || g.gather(x[1].value()?, *axis as isize))?,
        ]),
        Op::Cat { axis } => {
            let sizes = x
                .iter()
                .map(|t| Ok(t.dims()?[*axis]))
                .collect::<Result<Vec<usize>>>()?;
            Ok(g.split(&sizes, *axis as isize)?
                .into_iter()
                .map(Some)
                .collect())
        }
        Op::Cumsum { axis } => {
            // Reverse cumulative sum: total - cumsum + g.
            let a = *axis as isize;
            one(g.sum(&[a], true)?.sub(&g.cumsum(a)?)?.add(g)?)
        }
        Op::Sort { axis, descending } => {
            debug_assert_eq!(output, 0, "only sorted values carry a gradient");
            let x0 = x[0].value()?;
            let (_, idx) = x0.sort(*axis as isize, *descending)?;
            one(x0.zeros_like()?.scatter_add(&idx, g, *axis as isize)?)
        }
        // The output was kept (`graph::keeps_output`).
        Op::Softmax => one(Tensor::softmax_backward(&x.output(g)?, g, false)?),
        Op::LogSoftmax => one(Tensor::softmax_backward(&x.output(g)?, g, true)?),
        Op::CrossEntropy {
            ignore_index,
            label_smoothing,
        } => {
            if x[2].requires_grad() {
                return Err(Error::backend(
                    "cross_entropy",
                    "class weights carry no gradient: detach them",
                ));
            }
            let d = Tensor::cross_entropy_backward(
                x[0].value()?,
                x[1].value()?,
                x[2].value()?,
                &x.output(g)?,
                g,
                *ignore_index,
                *label_smoothing,
            )?;
            Ok(vec![Some(d), None, None])
        }
        Op::LayerNorm { eps } => {
            let (dx, dw, db) = Tensor::layer_norm_backward(x[0].value()?, x[1].value()?, g, *eps)?;
            Ok(vec![Some(dx), Some(dw), Some(db)])
        }
        Op::RmsNorm { eps } => {
            let (dx, dw) = Tensor::rms_norm_backward(x[0].value()?, x[1].value()?, g, *eps)?;
            Ok(vec![Some(dx), Some(dw)])
        }
        // The rotation is orthogonal: its transpose rotates by -θ, i.e. sin -> -sin.
        Op::Rope { interleaved } if !x[1].requires_grad() && !x[2].requires_grad() => Ok(vec![
            Some(g.rope(x[1].value()?, &x[2].value()?.neg()?, *interleaved)?),
            None,
            None,
        ]),
        Op::Rope { interleaved } => {
            let x = x
                .iter()
                .map(|s| s.value().cloned())
                .collect::<Result<Vec<Tensor>>>()?;
            through_composition(&x, g, |t| composed::rope(&t[0], &t[1], &t[2], *interleaved))
        }
        Op::Attention {
            causal,
            scale,
            key_mask,
        } => {
            // The mask (input 3) goes to the backward as is and gets no gradient. The node
            // kept the forward's output and lse (`graph::keeps_output`).
            let mask = match key_mask {
                true => Some(x[3].value()?),
                false => None,
            };
            // The node's output (and g) are [b, lq, hq, dv]; the op reads them as
            // [b, hq, lq, dv] views.
            let q = x[0].value()?;
            let o = x.output(g)?.permute(&[0, 2, 1, 3])?;
            let d = q.dims();
            let lse = x.output_as(1, &[d[0], d[1], d[2]].into(), DType::F32, g.device())?;
            let (dq, dk, dv) = Tensor::attention_backward_saved(
                q,
                x[1].value()?,
                x[2].value()?,
                mask,
                &g.permute(&[0, 2, 1, 3])?,
                (&o, &lse),
                *causal,
                *scale,
            )?;
            let mut grads = vec![Some(dq), Some(dk), Some(dv)];
            if *key_mask {
                grads.push(None);
            }
            Ok(grads)
        }
        Op::Conv2d(p) => Ok(vec![
            when(&x[0], || {
                Tensor::conv2d_backward_input(g, x[1].value()?, p, x[0].dims()?)
            })?,
            when(&x[1], || {
                Tensor::conv2d_backward_weight(x[0].value()?, g, p, x[1].dims()?)
            })?,
        ]),
        // conv_transpose2d(x, w) is the adjoint of conv2d(·, w): dx = conv2d(g, w) and
        // dw is conv2d's weight gradient with input g and upstream gradient x.
        Op::ConvTranspose2d(p) => Ok(vec![
            when(&x[0], || g.conv2d_raw(x[1].value()?, p))?,
            when(&x[1], || {
                Tensor::conv2d_backward_weight(g, x[0].value()?, p, x[1].dims()?)
            })?,
        ]),
        Op::MaxPool2d(_) | Op::AdaptiveMaxPool2d => {
            debug_assert_eq!(output, 0, "only pooled values carry a gradient");
            let x0 = x[0].value()?;
            let idx = match op {
                Op::MaxPool2d(p) => x0.max_pool2d_raw(p)?.1,
                _ => {
                    x0.adaptive_max_pool2d_with_indices([g.dims()[2], g.dims()[3]])?
                        .1
                }
            };
            let d = x0.dims();
            let plane = |t: &Tensor, len: usize| t.reshape([d[0], d[1], len]);
            let flat_g = plane(&g.contiguous()?, g.dims()[2] * g.dims()[3])?;
            let flat_i = plane(&idx, g.dims()[2] * g.dims()[3])?;
            let z = Tensor::zeros([d[0], d[1], d[2] * d[3]], g.dtype(), g.device())?;
            one(z.scatter_add(&flat_i, &flat_g, 2)?.reshape(d)?)
        }
        Op::BatchNorm { eps } => {
            debug_assert_eq!(output, 0, "only the normalized output carries a gradient");
            let (dx, dw, db) = Tensor::batch_norm_backward(x[0].value()?, x[1].value()?, g, *eps)?;
            Ok(vec![Some(dx), Some(dw), Some(db)])
        }
        Op::GroupNorm { groups, eps } => {
            let (dx, dw, db) =
                Tensor::group_norm_backward(x[0].value()?, x[1].value()?, g, *groups, *eps)?;
            Ok(vec![Some(dx), Some(dw), Some(db)])
        }
        // Backward kernels are not differentiated again (they carry no graph node).
        Op::Conv2dBackwardWeight(_)
        | Op::CastColSums(_)
        | Op::CastEach(_)
        | Op::MatmulBiasGelu
        | Op::MatmulGeluBackward
        | Op::BatchNormBackward { .. }
        | Op::GroupNormBackward { .. } => Ok(vec![None; x.len()]),
        Op::SoftmaxBackward { .. }
        | Op::CrossEntropyBackward { .. }
        | Op::RmsNormBackward { .. }
        | Op::LayerNormBackward { .. }
        | Op::AttentionBackward { .. } => Ok(vec![None; x.len()]),
        Op::Cmp(_)
        | Op::Fill { .. }
        | Op::Arange { .. }
        | Op::RandUniform { .. }
        | Op::RandNormal { .. } => Ok(vec![None; x.len()]),
    }
}
