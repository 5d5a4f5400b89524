//! Autocast: a scoped, thread-local mixed-precision policy (PyTorch's `torch.autocast`).
//!
//! Inside `autocast(DType::BF16, || ...)` (or `F16`) the ops of [`AUTOCAST_OPS`] — matmul,
//! the convolutions and fused attention, the products that tensor cores speed up — cast their
//! f32/f16/bf16 inputs to the policy's dtype, compute in it, and return their output in f32
//! when any input was f32 (products write it directly from their f32 accumulators; the
//! others cast it back). Every other op (reductions, norms, softmax, losses,
//! elementwise) is untouched and so stays in f32. Ops with an f64 input are not eligible
//! (as in PyTorch). Layers whose products feed each other keep the intermediate in the low
//! dtype through [`to_low`] (ferrite-nn: `MultiheadAttention`'s projections and attention,
//! the first Linear, bias and activation of the transformer layers' feed-forward blocks, as
//! PyTorch computes them), so only a layer's output comes back to f32.
//!
//! Gradients follow the casts: the backward rule of `cast` casts the gradient back to the
//! input's dtype, so an f32 parameter receives an f32 gradient, and the product's backward
//! runs in the low dtype. `backward` itself runs with autocast off (`ferrite-autodiff`).
//!
//! Casts of trainable leaves (parameters, and views of them such as `weight.t()`, cast in the
//! parameter's own layout and viewed the same way) are cached
//! for the life of the outermost enabled scope, keyed by storage, layout and dtype: a weight
//! used several times in one forward pass is cast once. The cache assumes parameters are not
//! written inside the scope (open one scope per forward pass, update after it closes).
//!
//! [`prefetch`] makes those casts one op: called at the start of a scope with a model's
//! parameters, it casts, in one `Tensor::cast_each`, the ones that the previous outermost
//! scope on this thread cast (in the same dtype, the same layout, recording or not), and
//! puts them in the cache, where the products then find them. A training step's forward
//! pass casts the same weights each step; the first step learns which.

use crate::graph::{self, Grad, GradOp};
use crate::{DType, Error, Result, Tensor};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The ops autocast applies to (a closed list, like PyTorch's "lower precision" list). The
/// transposed and 1-d convolutions and `Linear`/`Bilinear`/RNN/attention layers reach these
/// through `conv2d` and `matmul`.
pub const AUTOCAST_OPS: &[&str] = &[
    "matmul",
    "matmul_bias",
    "conv2d",
    "conv_transpose2d",
    "attention",
];

/// (storage address, offset, dims, strides, target dtype, recording).
type Key = (usize, usize, Vec<usize>, Vec<usize>, DType, bool);

#[derive(Default)]
struct State {
    dtype: Option<DType>,
    /// Enabled scopes open on this thread (the cache lives while this is > 0).
    depth: usize,
    /// Cast of a trainable leaf, with the source kept alive so its address is not reused.
    cache: HashMap<Key, (Tensor, Tensor)>,
    /// The cache's keys when the last outermost scope closed (what `prefetch` casts).
    last: HashSet<Key>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Restores the previous policy when a scope ends (also on early return or unwinding).
struct Scope {
    prev: Option<DType>,
    enabled: bool,
}

impl Drop for Scope {
    fn drop(&mut self) {
        // Dropped outside the borrow so that the cached tensors' destructors may run freely.
        let dropped = STATE
            .try_with(|s| {
                let mut s = s.borrow_mut();
                s.dtype = self.prev;
                if self.enabled {
                    s.depth -= 1;
                    if s.depth == 0 {
                        let cache = std::mem::take(&mut s.cache);
                        s.last = cache.keys().cloned().collect();
                        return cache;
                    }
                }
                HashMap::new()
            })
            .unwrap_or_default();
        drop(dropped);
    }
}

fn enter(dtype: Option<DType>) -> Scope {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let prev = std::mem::replace(&mut s.dtype, dtype);
        if dtype.is_some() {
            s.depth += 1;
        }
        Scope {
            prev,
            enabled: dtype.is_some(),
        }
    })
}

/// Runs `f` with autocast to `dtype` (`F16` or `BF16`) on this thread; scopes nest (the
/// innermost policy applies). Any other dtype is an error.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> R) -> Result<R> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Error::dtype(
            "autocast",
            dtype,
            "the autocast dtype must be f16 or bf16",
        ));
    }
    let _scope = enter(Some(dtype));
    Ok(f())
}

/// Runs `f` with autocast off on this thread (also inside an autocast scope).
pub fn autocast_off<R>(f: impl FnOnce() -> R) -> R {
    let _scope = enter(None);
    f()
}

/// The policy in effect on this thread: `Some(F16 | BF16)` inside an enabled scope.
pub fn autocast_dtype() -> Option<DType> {
    STATE.try_with(|s| s.borrow().dtype).ok().flatten()
}

/// Whether gradients flow from `grad` straight into a trainable leaf through views only.
fn leaf_or_view_of_leaf(grad: &Grad) -> bool {
    match grad {
        Grad::Leaf(_) => true,
        Grad::Node(n) => {
            matches!(n.op, GradOp::View(_))
                && n.with_inputs(|ins| {
                    ins.first()
                        .and_then(|s| s.grad_info())
                        .is_some_and(leaf_or_view_of_leaf)
                })
                .unwrap_or(false)
        }
    }
}

/// `t` as a view in its storage order, and the permutation that gives `t` back from it: a
/// permuted view of dense data (`weight.t()`) is cast as the dense tensor (coalesced reads,
/// the copy in the parameter's own layout, cached under the parameter's own key) and the
/// permutation applied to the copy as a view, which the products consume in place. `t`
/// itself (and no permutation) when it is in storage order or not dense.
fn storage_order(t: &Tensor) -> Result<(Tensor, Option<Vec<usize>>)> {
    let strides = t.layout().strides();
    let mut order: Vec<usize> = (0..t.rank()).collect();
    order.sort_by_key(|&a| std::cmp::Reverse(strides[a]));
    if order.iter().enumerate().all(|(i, &a)| i == a) {
        return Ok((t.clone(), None));
    }
    let dense = t.permute(&order)?;
    if !dense.is_contiguous() {
        return Ok((t.clone(), None));
    }
    let mut inverse = vec![0; order.len()];
    for (i, &a) in order.iter().enumerate() {
        inverse[a] = i;
    }
    Ok((dense, Some(inverse)))
}

fn key_of(t: &Tensor, dtype: DType) -> Key {
    let l = t.layout();
    (
        Arc::as_ptr(t.storage_arc()) as *const u8 as usize,
        l.offset(),
        l.dims().to_vec(),
        l.strides().to_vec(),
        dtype,
        graph::is_recording(),
    )
}

fn cast_cached(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if !t.grad_info().is_some_and(leaf_or_view_of_leaf) {
        return t.cast(dtype);
    }
    let (dense, inverse) = storage_order(t)?;
    let key = key_of(&dense, dtype);
    let hit = STATE.with(|s| s.borrow().cache.get(&key).map(|(_, c)| c.clone()));
    let c = match hit {
        Some(c) => c,
        None => {
            let c = dense.cast(dtype)?;
            STATE.with(|s| s.borrow_mut().cache.insert(key, (dense, c.clone())));
            c
        }
    };
    match inverse {
        Some(inverse) => c.permute(&inverse),
        None => Ok(c),
    }
}

/// Inside an enabled scope: casts those of `params` (trainable leaves) that the previous
/// outermost scope on this thread cast to this scope's dtype, in one `Tensor::cast_each` a
/// source dtype, into the cache (see the module docs); the others, and any already cached,
/// are left alone. Outside a scope, or with nothing to cast, does nothing.
pub fn prefetch(params: &[Tensor]) -> Result<()> {
    let Some(low) = autocast_dtype() else {
        return Ok(());
    };
    let mut seen = HashSet::new();
    let mut want: Vec<(Key, &Tensor)> = STATE.with(|s| {
        let s = s.borrow();
        params
            .iter()
            .filter(|p| p.dtype() != low && matches!(p.grad_info(), Some(Grad::Leaf(_))))
            .map(|p| (key_of(p, low), p))
            .filter(|(k, _)| s.last.contains(k) && !s.cache.contains_key(k))
            .filter(|(k, _)| seen.insert(k.clone()))
            .collect()
    });
    want.sort_by_key(|(_, p)| p.dtype() as u8);
    for group in want.chunk_by(|a, b| a.1.dtype() == b.1.dtype()) {
        let srcs: Vec<&Tensor> = group.iter().map(|(_, p)| *p).collect();
        let casts = Tensor::cast_each(&srcs, low)?;
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            for ((k, p), c) in group.iter().zip(casts) {
                s.cache.insert(k.clone(), ((*p).clone(), c));
            }
        });
    }
    Ok(())
}

/// `t` in the autocast dtype for a product that keeps its output there (a layer whose next op
/// is another product, as `MultiheadAttention`'s projections feeding the fused attention):
/// cast as the eligible ops cast their inputs (cached for trainable leaves and their views),
/// or `None` when autocast is off or `t` is not f32/f16/bf16.
pub fn to_low(t: &Tensor) -> Result<Option<Tensor>> {
    let Some(low) = autocast_dtype() else {
        return Ok(None);
    };
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 if t.dtype() == low => Ok(Some(t.clone())),
        DType::F32 | DType::F16 | DType::BF16 => cast_cached(t, low).map(Some),
        _ => Ok(None),
    }
}

/// Runs an autocast-eligible op: `f` gets `inputs` cast to the policy's dtype when autocast
/// applies, and the dtype the result must have (f32 if any input was f32: an op that can
/// write it from low-precision operands does, anything else is cast to it), else `inputs`
/// unchanged and their first dtype.
pub(crate) fn eligible(
    inputs: &[&Tensor],
    f: impl FnOnce(&[&Tensor], DType) -> Result<Tensor>,
) -> Result<Tensor> {
    let own = inputs.first().map_or(DType::F32, |t| t.dtype());
    let Some(low) = autocast_dtype() else {
        return f(inputs, own);
    };
    let float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    if inputs.iter().any(|t| !float(t.dtype())) || inputs.iter().all(|t| t.dtype() == low) {
        return f(inputs, own);
    }
    let out = match inputs.iter().any(|t| t.dtype() == DType::F32) {
        true => DType::F32,
        false => inputs[0].dtype(),
    };
    let cast: Vec<Tensor> = inputs
        .iter()
        .map(|t| cast_cached(t, low))
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = cast.iter().collect();
    f(&refs, out)?.cast(out)
}

/// Number of cached casts on this thread (for tests).
pub fn autocast_cache_len() -> usize {
    STATE.try_with(|s| s.borrow().cache.len()).unwrap_or(0)
}
