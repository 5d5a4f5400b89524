//! What reverse-mode autodiff needs from every tensor: the op that produced it and its inputs.
//! Recording happens only when an input requires a gradient and recording is on (see
//! `no_grad`); otherwise a tensor carries nothing extra. The backward rules live in
//! `ferrite-autodiff`.

use crate::{Error, Op, Result, Tensor};
use std::cell::Cell;
use std::sync::{Arc, Mutex};

/// A view (no data movement) recorded for backward.
#[derive(Clone, Debug, PartialEq)]
pub enum ViewOp {
    /// Any change of dims with the same elements in order (reshape, squeeze, unsqueeze).
    Reshape,
    /// New dim `i` is old dim `perm[i]`.
    Permute(Vec<usize>),
    /// Entries `start..start + len` of `axis`.
    Narrow { axis: usize, start: usize },
    /// Broadcast to a larger shape (new leading dims, stretched size-1 dims).
    Broadcast,
}

/// How a tensor was made.
#[derive(Clone, Debug, PartialEq)]
pub enum GradOp {
    Op(Op),
    View(ViewOp),
}

/// A node's inputs: up to three inline (every op but `Cat` and attention backward), the rest
/// on the heap. Recording allocates once per op (the node) rather than twice.
#[derive(Clone, Default)]
struct Inputs {
    inline: [Option<Tensor>; 3],
    more: Vec<Tensor>,
}

impl Inputs {
    fn new(ts: &[&Tensor]) -> Inputs {
        let mut i = Inputs::default();
        for (k, t) in ts.iter().enumerate() {
            match i.inline.get_mut(k) {
                Some(slot) => *slot = Some((*t).clone()),
                None => i.more.push((*t).clone()),
            }
        }
        i
    }

    fn into_stack(self, stack: &mut Vec<Tensor>) {
        stack.extend(self.inline.into_iter().flatten());
        stack.extend(self.more);
    }
}

/// An op application in the recorded graph. Its inputs are held until backward has used them.
pub struct Node {
    pub op: GradOp,
    /// Which output of a multi-output op this tensor is.
    pub output: usize,
    inputs: Mutex<Option<Inputs>>,
}

impl Node {
    /// The inputs, or an error when a backward pass has already released them.
    pub fn inputs(&self) -> Result<Vec<Tensor>> {
        let g = self
            .inputs
            .lock()
            .map_err(|_| Error::backend("backward", "graph lock poisoned"))?;
        let i = g.as_ref().ok_or_else(|| {
            Error::backend("backward", "this graph was already released by an earlier backward(); run the forward pass again")
        })?;
        let mut v = Vec::with_capacity(3 + i.more.len());
        i.clone().into_stack(&mut v);
        Ok(v)
    }

    /// Moves the inputs onto `stack` (for dropping without recursion).
    pub(crate) fn take_inputs_into(&mut self, stack: &mut Vec<Tensor>) {
        if let Some(i) = self.inputs.get_mut().ok().and_then(|i| i.take()) {
            i.into_stack(stack);
        }
    }

    /// Drops the inputs (and with them what they keep alive).
    pub fn release(&self) {
        if let Ok(mut i) = self.inputs.lock() {
            *i = None;
        }
    }
}

/// Dropping a long recorded chain must not recurse once per op: the inputs of nodes that die
/// with this one are moved onto a local stack and dropped iteratively.
impl Drop for Node {
    fn drop(&mut self) {
        let mut stack = Vec::new();
        self.take_inputs_into(&mut stack);
        while let Some(t) = stack.pop() {
            t.take_unique_inputs_into(&mut stack);
        }
    }
}

/// Where a trainable leaf's gradient accumulates.
#[derive(Default)]
pub struct LeafSlot {
    pub grad: Mutex<Option<Tensor>>,
}

/// A tensor's place in the graph.
#[derive(Clone)]
pub enum Grad {
    Leaf(Arc<LeafSlot>),
    Node(Arc<Node>),
}

impl Grad {
    /// Identity of the graph vertex (stable while it lives).
    pub fn id(&self) -> usize {
        match self {
            Grad::Leaf(l) => Arc::as_ptr(l) as *const u8 as usize,
            Grad::Node(n) => Arc::as_ptr(n) as *const u8 as usize,
        }
    }
}

thread_local! {
    static NO_GRAD: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f` with recording off on this thread: nothing computed inside requires a gradient.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            NO_GRAD.with(|c| c.set(c.get() - 1));
        }
    }
    NO_GRAD.with(|c| c.set(c.get() + 1));
    let _g = Guard;
    f()
}

/// Runs `f` with recording on, also inside `no_grad` (backward rules that differentiate a
/// composition use it).
pub fn enable_grad<R>(f: impl FnOnce() -> R) -> R {
    let saved = NO_GRAD.with(|c| c.replace(0));
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_GRAD.with(|c| c.set(self.0));
        }
    }
    let _r = Restore(saved);
    f()
}

pub fn is_recording() -> bool {
    NO_GRAD.with(|c| c.get() == 0)
}

/// Whether output `k` of `op` carries a gradient (float data that depends smoothly on inputs).
pub fn differentiable_output(op: &Op, k: usize, dtype: crate::DType) -> bool {
    if !dtype.is_float() {
        return false;
    }
    match op {
        Op::Cmp(_)
        | Op::Fill { .. }
        | Op::Arange { .. }
        | Op::RandUniform { .. }
        | Op::RandNormal { .. } => false,
        // Backward kernels are not differentiated again (no second-order gradients).
        Op::SoftmaxBackward { .. }
        | Op::RmsNormBackward { .. }
        | Op::LayerNormBackward { .. }
        | Op::AttentionBackward { .. } => false,
        Op::Sort { .. } => k == 0,
        _ => true,
    }
}

pub(crate) fn node(op: GradOp, output: usize, inputs: &[&Tensor]) -> Grad {
    Grad::Node(Arc::new(Node {
        op,
        output,
        inputs: Mutex::new(Some(Inputs::new(inputs))),
    }))
}
