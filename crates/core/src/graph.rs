//! What reverse-mode autodiff needs from every tensor: the op that produced it and, of its
//! inputs (and for a few ops its output), what the op's backward rule reads (`keeps`).
//! Recording happens only when an input requires a gradient and recording is on (see
//! `no_grad`); otherwise a tensor carries nothing extra. The backward rules live in
//! `ferrite-autodiff`.

use crate::{DType, Error, Layout, Op, Result, Shape, Storage, Tensor};
use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
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

/// How much of one input a recorded op keeps for its backward rule (see `keeps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Only the graph edge: the rule needs neither the values nor the dims (elementwise ops
    /// whose gradient has the output's shape, e.g. `add`; ops whose rule reads the output).
    Edge,
    /// The edge, the dims and the dtype (`sum`, `cast`, `cat`, ...).
    Meta,
    /// The tensor itself: the rule reads its values (the other operand of `mul`, ...).
    Value,
}

/// Whether the backward rule of `op` reads the op's outputs (every one of them, saved with
/// the node) instead of recomputing them from the inputs: ops whose derivative is a function
/// of their value (exp, sqrt, tanh, sigmoid, softmax, log-softmax), cross-entropy (its lse)
/// and attention (its output and lse, recorded with both).
pub fn keeps_output(op: &GradOp) -> bool {
    matches!(op, GradOp::Op(op) if op_keeps_output(op))
}

/// `keeps_output` of a recorded op.
pub fn op_keeps_output(op: &Op) -> bool {
    use crate::UnaryOp;
    matches!(
        op,
        Op::Unary(UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Tanh | UnaryOp::Sigmoid)
            | Op::Softmax
            | Op::LogSoftmax
            | Op::CrossEntropy { .. }
            | Op::Attention { .. }
    )
}

/// What the backward rule of `op` (in `ferrite-autodiff`'s `rules.rs`, which must read no
/// more than this) needs of input `k`, given which inputs require a gradient. Anything more
/// would keep activations alive for nothing until backward, or until the graph is dropped.
pub fn keeps(op: &GradOp, k: usize, requires_grad: impl Fn(usize) -> bool) -> Keep {
    use crate::{BinaryOp, ReduceOp};
    let value_if = |c: bool| if c { Keep::Value } else { Keep::Edge };
    // Cross-entropy's and attention's rules read their outputs and their inputs.
    if keeps_output(op)
        && !matches!(
            op,
            GradOp::Op(Op::CrossEntropy { .. } | Op::Attention { .. })
        )
    {
        return Keep::Edge;
    }
    let op = match op {
        GradOp::View(ViewOp::Permute(_)) => return Keep::Edge,
        // Reshape, narrow and broadcast need the dims only. Not the values: the view's
        // consumer may keep nothing (a cast, an add), and the node would then be all that keeps
        // the input's storage alive until backward.
        GradOp::View(_) => return Keep::Meta,
        GradOp::Op(op) => op,
    };
    match op {
        Op::Unary(u) => {
            use crate::UnaryOp::*;
            value_if(!matches!(u, Neg | Sign | Floor | Ceil | Round))
        }
        Op::Binary(b) => match b {
            BinaryOp::Add | BinaryOp::Sub => Keep::Edge,
            // d(ab)/da = b, d(ab)/db = a.
            BinaryOp::Mul => value_if(requires_grad(1 - k)),
            // d(a/b)/da = 1/b, d(a/b)/db = -a/b².
            BinaryOp::Div => value_if(k == 1 || requires_grad(1)),
            BinaryOp::Pow
            | BinaryOp::Maximum
            | BinaryOp::Minimum
            | BinaryOp::GeluBackward
            | BinaryOp::GeluTanhBackward
            | BinaryOp::SiluBackward
            | BinaryOp::ReluBackward => Keep::Value,
        },
        Op::Where => value_if(k == 0),
        Op::Reduce { op, .. } => match op {
            ReduceOp::Sum => Keep::Meta,
            ReduceOp::Max | ReduceOp::Min => Keep::Value,
            ReduceOp::ArgMax | ReduceOp::ArgMin => Keep::Edge,
        },
        // The other input's values; this one's layout (`Matmul`'s rule gives a transposed
        // matrix's gradient transposed).
        Op::Matmul => match requires_grad(1 - k) {
            true => Keep::Value,
            false => Keep::Meta,
        },
        // The bias's gradient is a sum of the output's, acc's is the output's: it keeps
        // nothing of either.
        Op::MatmulBias { .. } => match k < 2 && requires_grad(1 - k) {
            true => Keep::Value,
            false => Keep::Meta,
        },
        Op::Cast(_) | Op::Cat { .. } => Keep::Meta,
        Op::Copy | Op::Cumsum { .. } => Keep::Edge,
        Op::IndexSelect { .. } | Op::Gather { .. } => match k {
            0 => Keep::Meta,
            _ => Keep::Value,
        },
        Op::ScatterAdd { .. } => value_if(k == 1),
        // Attention: q, k, v and the key mask (when present) are all read by the backward.
        Op::Sort { .. } | Op::RmsNorm { .. } | Op::Attention { .. } => Keep::Value,
        // dx reads w's values and x's dims; dw reads x's values and w's dims (same for the
        // transposed convolution, its adjoint).
        Op::Conv2d(_) | Op::ConvTranspose2d(_) => match requires_grad(1 - k) {
            true => Keep::Value,
            false => Keep::Meta,
        },
        // The rule recomputes the indices from x.
        Op::MaxPool2d(_) | Op::AdaptiveMaxPool2d => Keep::Value,
        // The bias is not needed for the gradients.
        Op::BatchNorm { .. } | Op::GroupNorm { .. } => value_if(k < 2),
        Op::CrossEntropy { .. } => Keep::Value,
        // The bias is not needed for the gradients.
        Op::LayerNorm { .. } => value_if(k < 2),
        // x only when the angles are trained (the rule differentiates the composition).
        Op::Rope { .. } => value_if(k > 0 || requires_grad(1) || requires_grad(2)),
        // Kept output (see `keeps_output`), or not recorded (no differentiable output).
        Op::Softmax
        | Op::LogSoftmax
        | Op::SoftmaxBackward { .. }
        | Op::CrossEntropyBackward { .. }
        | Op::RmsNormBackward { .. }
        | Op::LayerNormBackward { .. }
        | Op::AttentionBackward { .. }
        | Op::Conv2dBackwardWeight(_)
        | Op::CastColSums(_)
        | Op::CastEach(_)
        | Op::MatmulBiasGelu
        | Op::MatmulGeluBackward
        | Op::BatchNormBackward { .. }
        | Op::GroupNormBackward { .. }
        | Op::Cmp(_)
        | Op::Fill { .. }
        | Op::Arange { .. }
        | Op::RandUniform { .. }
        | Op::RandNormal { .. } => Keep::Edge,
    }
}

/// One input of a recorded op, kept as far as the op's backward rule needs it (`keeps`).
/// Small (two words), so that a node holds its inputs inline.
#[derive(Clone)]
pub enum Saved {
    /// The tensor itself.
    Value(Tensor),
    /// Its graph edge, dims and dtype.
    Meta(Box<Meta>),
    /// Only its graph edge (`None` when no gradient flows to it).
    Edge(Option<Grad>),
}

/// What `Keep::Meta` keeps of an input.
#[derive(Clone)]
pub struct Meta {
    pub grad: Option<Grad>,
    pub shape: Shape,
    /// Its layout's strides (a rule may give a gradient the input's own layout).
    pub strides: Vec<usize>,
    pub dtype: DType,
}

impl Saved {
    fn new(t: &Tensor, keep: Keep) -> Saved {
        match keep {
            Keep::Value => Saved::Value(t.clone()),
            Keep::Meta => Saved::Meta(Box::new(Meta {
                grad: t.grad_info().cloned(),
                shape: t.shape().clone(),
                strides: t.layout().strides().to_vec(),
                dtype: t.dtype(),
            })),
            Keep::Edge => Saved::Edge(t.grad_info().cloned()),
        }
    }

    /// Its place in the recorded graph, if a gradient flows to it.
    pub fn grad_info(&self) -> Option<&Grad> {
        match self {
            Saved::Value(t) => t.grad_info(),
            Saved::Meta(m) => m.grad.as_ref(),
            Saved::Edge(grad) => grad.as_ref(),
        }
    }

    pub fn requires_grad(&self) -> bool {
        self.grad_info().is_some()
    }

    /// The tensor, when its values were kept.
    pub fn value(&self) -> Result<&Tensor> {
        match self {
            Saved::Value(t) => Ok(t),
            _ => Err(not_kept("values of an input")),
        }
    }

    pub fn shape(&self) -> Result<&Shape> {
        match self {
            Saved::Value(t) => Ok(t.shape()),
            Saved::Meta(m) => Ok(&m.shape),
            Saved::Edge(_) => Err(not_kept("shape of an input")),
        }
    }

    pub fn dims(&self) -> Result<&[usize]> {
        Ok(self.shape()?.dims())
    }

    pub fn strides(&self) -> Result<&[usize]> {
        match self {
            Saved::Value(t) => Ok(t.layout().strides()),
            Saved::Meta(m) => Ok(&m.strides),
            Saved::Edge(_) => Err(not_kept("strides of an input")),
        }
    }

    pub fn dtype(&self) -> Result<DType> {
        match self {
            Saved::Value(t) => Ok(t.dtype()),
            Saved::Meta(m) => Ok(m.dtype),
            Saved::Edge(_) => Err(not_kept("dtype of an input")),
        }
    }

    /// The node this input links to, if any (for dropping a graph without recursion).
    fn into_node(self) -> Option<NodeRef> {
        let grad = match self {
            Saved::Value(t) => return t.into_unique_node(),
            Saved::Meta(m) => m.grad,
            Saved::Edge(grad) => grad,
        };
        match grad {
            Some(Grad::Node(n)) => Some(n),
            _ => None,
        }
    }
}

fn not_kept(what: &str) -> Error {
    Error::backend(
        "backward",
        format!("a backward rule read the {what} that recording did not keep (graph::keeps)"),
    )
}

/// What a node keeps for its backward rule: its inputs (up to three inline, as for every
/// recorded op but `cat`, more on the heap) and, for the ops of `keeps_output`, the op's
/// outputs.
pub struct Inputs {
    slots: Slots,
    outputs: Vec<Arc<dyn Storage>>,
}

enum Slots {
    Few([Saved; 3], usize),
    Many(Vec<Saved>),
}

impl Inputs {
    fn new(op: &GradOp, ts: &[&Tensor], outputs: &[Arc<dyn Storage>]) -> Inputs {
        let rg = |k: usize| ts.get(k).is_some_and(|t| t.requires_grad());
        let saved = |k: usize| Saved::new(ts[k], keeps(op, k, rg));
        let slots = match ts.len() {
            0 => Slots::Few([Saved::Edge(None), Saved::Edge(None), Saved::Edge(None)], 0),
            1 => Slots::Few([saved(0), Saved::Edge(None), Saved::Edge(None)], 1),
            2 => Slots::Few([saved(0), saved(1), Saved::Edge(None)], 2),
            3 => Slots::Few([saved(0), saved(1), saved(2)], 3),
            n => Slots::Many((0..n).map(saved).collect()),
        };
        let outputs = match keeps_output(op) {
            true => outputs.to_vec(),
            false => Vec::new(),
        };
        Inputs { slots, outputs }
    }

    /// The op's (first) output, when the node kept it (`keeps_output`); `g` (the gradient
    /// of that output) gives its shape and device.
    pub fn output(&self, g: &Tensor) -> Result<Tensor> {
        self.output_as(0, g.shape(), g.dtype(), g.device())
    }

    /// Output `k` of the op, kept by the node (`keeps_output`), as a contiguous tensor of
    /// `shape` and `dtype` on `device`.
    pub fn output_as(
        &self,
        k: usize,
        shape: &Shape,
        dtype: DType,
        device: &crate::Device,
    ) -> Result<Tensor> {
        let s = self
            .outputs
            .get(k)
            .cloned()
            .ok_or_else(|| not_kept("output"))?;
        if s.len() != shape.elem_count() || s.dtype() != dtype {
            return Err(Error::backend(
                "backward",
                format!(
                    "kept output {k} ({} elements, {}) is not {shape} {dtype}",
                    s.len(),
                    s.dtype(),
                ),
            ));
        }
        Ok(Tensor::from_storage(
            s,
            Layout::contiguous(shape.clone()),
            device.clone(),
        ))
    }

    /// Moves the nodes that only these inputs keep alive onto `stack`, dropping the rest.
    fn into_nodes(self, stack: &mut Vec<NodeRef>) {
        match self.slots {
            Slots::Few(a, _) => stack.extend(a.into_iter().filter_map(Saved::into_node)),
            Slots::Many(v) => stack.extend(v.into_iter().filter_map(Saved::into_node)),
        }
    }
}

impl std::ops::Deref for Inputs {
    type Target = [Saved];
    fn deref(&self) -> &[Saved] {
        match &self.slots {
            Slots::Few(a, n) => &a[..*n],
            Slots::Many(v) => v,
        }
    }
}

/// An op application in the recorded graph. What its rule needs is held until backward has
/// used it.
pub struct Node {
    pub op: GradOp,
    /// Which output of a multi-output op this tensor is.
    pub output: usize,
    inputs: Mutex<Option<Inputs>>,
}

fn released() -> Error {
    Error::backend(
        "backward",
        "this graph was already released by an earlier backward(); run the forward pass again",
    )
}

impl Node {
    /// Runs `f` on the saved inputs, or errors when a backward pass has already released them.
    pub fn with_inputs<R>(&self, f: impl FnOnce(&Inputs) -> R) -> Result<R> {
        let g = self
            .inputs
            .lock()
            .map_err(|_| Error::backend("backward", "graph lock poisoned"))?;
        Ok(f(g.as_ref().ok_or_else(released)?))
    }

    /// Takes the saved inputs out, releasing them from the graph (backward uses each node
    /// once); an error when they were already released.
    pub fn take_inputs(&self) -> Result<Inputs> {
        self.inputs
            .lock()
            .map_err(|_| Error::backend("backward", "graph lock poisoned"))?
            .take()
            .ok_or_else(released)
    }

    /// Drops the inputs (and with them what they keep alive).
    pub fn release(&self) {
        if let Ok(mut i) = self.inputs.lock() {
            *i = None;
        }
    }

    fn take_inputs_into(&mut self, stack: &mut Vec<NodeRef>) {
        if let Some(i) = self.inputs.get_mut().ok().and_then(Option::take) {
            i.into_nodes(stack);
        }
    }
}

/// Dropping a long recorded chain must not recurse once per op: the nodes that die with this
/// one are moved onto a local stack and their inputs dropped iteratively.
impl Drop for Node {
    fn drop(&mut self) {
        let mut stack = Vec::new();
        self.take_inputs_into(&mut stack);
        while let Some(n) = stack.pop() {
            // The last handle moves the node out (its own drop then finds no inputs).
            if let Some(mut node) = n.into_inner() {
                node.take_inputs_into(&mut stack);
            }
        }
    }
}

/// A shared handle to a graph node: the node and a reference count in one allocation. Like
/// `Arc<Node>` without the weak count (one atomic operation less per node), and its memory is
/// reused: recording allocates a node per op and a forward pass keeps them all until the
/// graph is dropped, so freed nodes go to a per-thread list of spares (up to `SPARE_NODES`)
/// that the next recorded op takes from instead of the allocator.
pub struct NodeRef(NonNull<NodeBox>);

struct NodeBox {
    refs: AtomicUsize,
    node: Node,
}

// SAFETY: a `NodeRef` is a shared reference to a `Node` with an atomic count, like
// `Arc<Node>`; `Node` is `Send + Sync` (checked below), so sharing and sending handles across
// threads is sound.
unsafe impl Send for NodeRef {}
unsafe impl Sync for NodeRef {}
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Node>();
};

/// Spare node allocations kept per thread.
const SPARE_NODES: usize = 1024;

struct Spares(RefCell<Vec<NonNull<NodeBox>>>);

impl Drop for Spares {
    fn drop(&mut self) {
        for p in self.0.get_mut().drain(..) {
            // SAFETY: spares came from `alloc` with this layout and hold no live node.
            unsafe { std::alloc::dealloc(p.as_ptr().cast(), std::alloc::Layout::new::<NodeBox>()) };
        }
    }
}

thread_local! {
    static SPARES: Spares = const { Spares(RefCell::new(Vec::new())) };
}

impl NodeRef {
    fn new(node: Node) -> NodeRef {
        let layout = std::alloc::Layout::new::<NodeBox>();
        let spare = SPARES.try_with(|s| s.0.borrow_mut().pop()).ok().flatten();
        let ptr = spare.unwrap_or_else(|| {
            // SAFETY: `NodeBox` has a nonzero size.
            let p = unsafe { std::alloc::alloc(layout) };
            NonNull::new(p.cast()).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
        });
        // SAFETY: `ptr` is valid for writes of a `NodeBox` and holds no live value.
        unsafe {
            ptr.as_ptr().write(NodeBox {
                refs: AtomicUsize::new(1),
                node,
            })
        };
        NodeRef(ptr)
    }

    fn inner(&self) -> &NodeBox {
        // SAFETY: the box lives while any handle does.
        unsafe { self.0.as_ref() }
    }

    /// Identity of the node (stable while it lives).
    pub fn as_ptr(&self) -> *const Node {
        &self.inner().node
    }

    /// The node, when this was the last handle; else drops the handle and returns `None`.
    pub fn into_inner(self) -> Option<Node> {
        let this = std::mem::ManuallyDrop::new(self);
        if this.inner().refs.fetch_sub(1, Ordering::Release) != 1 {
            return None;
        }
        fence(Ordering::Acquire);
        // SAFETY: this was the last handle: nothing else reads the node, which is moved out
        // exactly once before its memory is recycled.
        let node = unsafe { std::ptr::read(&this.inner().node) };
        recycle(this.0);
        Some(node)
    }
}

/// Returns a node's memory (its node already dropped or moved out) to this thread's spares.
fn recycle(ptr: NonNull<NodeBox>) {
    let kept = SPARES
        .try_with(|s| {
            let mut s = s.0.borrow_mut();
            let keep = s.len() < SPARE_NODES;
            if keep {
                s.push(ptr);
            }
            keep
        })
        .unwrap_or(false);
    if !kept {
        // SAFETY: allocated by `NodeRef::new` with this layout; no live value in it.
        unsafe { std::alloc::dealloc(ptr.as_ptr().cast(), std::alloc::Layout::new::<NodeBox>()) };
    }
}

impl Clone for NodeRef {
    fn clone(&self) -> NodeRef {
        // Relaxed suffices for an increment from a live handle (as in `Arc`).
        if self.inner().refs.fetch_add(1, Ordering::Relaxed) > isize::MAX as usize {
            std::process::abort();
        }
        NodeRef(self.0)
    }
}

impl Drop for NodeRef {
    fn drop(&mut self) {
        if self.inner().refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        fence(Ordering::Acquire);
        // SAFETY: this was the last handle; the node is dropped once, then its memory reused.
        unsafe { std::ptr::drop_in_place(&mut (*self.0.as_ptr()).node) };
        recycle(self.0);
    }
}

impl std::ops::Deref for NodeRef {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.inner().node
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
    Node(NodeRef),
}

impl Grad {
    /// Identity of the graph vertex (stable while it lives).
    pub fn id(&self) -> usize {
        match self {
            Grad::Leaf(l) => Arc::as_ptr(l) as *const u8 as usize,
            Grad::Node(n) => n.as_ptr() as *const u8 as usize,
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
        | Op::CrossEntropyBackward { .. }
        | Op::RmsNormBackward { .. }
        | Op::LayerNormBackward { .. }
        | Op::AttentionBackward { .. }
        | Op::Conv2dBackwardWeight(_)
        | Op::CastColSums(_)
        | Op::CastEach(_)
        | Op::MatmulBiasGelu
        | Op::MatmulGeluBackward
        | Op::BatchNormBackward { .. }
        | Op::GroupNormBackward { .. } => false,
        // Indices, batch statistics and attention's lse carry no gradient.
        Op::Sort { .. }
        | Op::MaxPool2d(_)
        | Op::AdaptiveMaxPool2d
        | Op::BatchNorm { .. }
        | Op::Attention { .. } => k == 0,
        _ => true,
    }
}

/// A node for output `output` of `op`; `outputs` are all the op's outputs (kept when the
/// rule reads them, `keeps_output`).
pub(crate) fn node(
    op: GradOp,
    output: usize,
    inputs: &[&Tensor],
    outputs: &[Arc<dyn Storage>],
) -> Grad {
    let inputs = Inputs::new(&op, inputs, outputs);
    Grad::Node(NodeRef::new(Node {
        op,
        output,
        inputs: Mutex::new(Some(inputs)),
    }))
}
