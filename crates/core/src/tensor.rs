//! `Tensor`: a strided view of a backend storage. Cheap to clone; views share storage.

use crate::backend::{Device, Storage};
use crate::error::fmt_shapes;
use crate::graph::{self, Grad, GradOp, LeafSlot, ViewOp};
use crate::op::{BinaryOp, CmpOp, Op, ReduceOp, UnaryOp};
use crate::{DType, Error, HostBuffer, Layout, Result, Shape, WithDType};
use std::sync::Arc;

#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

struct Inner {
    storage: Arc<dyn Storage>,
    layout: Layout,
    dtype: DType,
    device: Device,
    /// Set when a gradient flows to this tensor (a trainable leaf, or an op on one).
    grad: Option<Grad>,
}

impl Tensor {
    /// Wraps a storage; `layout` must lie within it (backends and views guarantee this).
    pub fn from_storage(storage: Arc<dyn Storage>, layout: Layout, device: Device) -> Tensor {
        let dtype = storage.dtype();
        Tensor(Arc::new(Inner {
            storage,
            layout,
            dtype,
            device,
            grad: None,
        }))
    }

    fn with_grad(&self, grad: Option<Grad>) -> Tensor {
        Tensor(Arc::new(Inner {
            storage: self.0.storage.clone(),
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            device: self.0.device.clone(),
            grad,
        }))
    }

    fn view(&self, layout: Layout, kind: ViewOp) -> Tensor {
        let grad = match self.requires_grad() && graph::is_recording() {
            true => Some(graph::node(GradOp::View(kind), 0, &[self], &[])),
            false => None,
        };
        Tensor(Arc::new(Inner {
            storage: self.0.storage.clone(),
            layout,
            dtype: self.0.dtype,
            device: self.0.device.clone(),
            grad,
        }))
    }

    // ---- autodiff ----

    /// Drops this handle; when it was the last one to its tensor, returns the tensor's graph
    /// node (so that the caller can drop the node without recursion).
    pub(crate) fn into_unique_node(self) -> Option<graph::NodeRef> {
        match Arc::into_inner(self.0)?.grad.take()? {
            Grad::Node(n) => Some(n),
            Grad::Leaf(_) => None,
        }
    }

    /// Whether a gradient flows to this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.grad.is_some()
    }

    /// Its place in the recorded graph, if any.
    pub fn grad_info(&self) -> Option<&Grad> {
        self.0.grad.as_ref()
    }

    /// The same data, cut from the graph: no gradient flows through the result.
    pub fn detach(&self) -> Tensor {
        self.with_grad(None)
    }

    /// The same data as a trainable leaf whose gradient accumulates in `slot`.
    pub fn as_leaf(&self, slot: Arc<LeafSlot>) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                "requires_grad",
                self.dtype(),
                "only float tensors can be trained",
            ));
        }
        Ok(self.with_grad(Some(Grad::Leaf(slot))))
    }

    // ---- accessors ----

    pub fn shape(&self) -> &Shape {
        self.0.layout.shape()
    }
    pub fn dims(&self) -> &[usize] {
        self.0.layout.dims()
    }
    pub fn rank(&self) -> usize {
        self.dims().len()
    }
    pub fn elem_count(&self) -> usize {
        self.shape().elem_count()
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    pub fn device(&self) -> &Device {
        &self.0.device
    }
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    pub fn storage(&self) -> &dyn Storage {
        &*self.0.storage
    }
    /// The shared storage handle (a backend that builds an op from other ops returns it).
    pub fn storage_arc(&self) -> &Arc<dyn Storage> {
        &self.0.storage
    }
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }
    /// True when both tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }
    /// Size of dim `axis` (negative counts from the end).
    pub fn dim(&self, axis: isize) -> Result<usize> {
        Ok(self.dims()[self.shape().axis("dim", axis)?])
    }

    // ---- creation ----

    pub fn from_host(data: HostBuffer, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let n = shape.checked_elem_count("from_vec")?;
        if n != data.len() {
            return Err(Error::shape(
                "from_vec",
                format!(
                    "{} elements do not fill shape {shape} ({n} elements)",
                    data.len()
                ),
            ));
        }
        let storage = device.backend().upload(data)?;
        Ok(Tensor::from_storage(
            storage,
            Layout::contiguous(shape),
            device.clone(),
        ))
    }

    pub fn from_vec<T: WithDType>(
        data: Vec<T>,
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::from_host(T::wrap(data), shape, device)
    }

    pub fn from_slice<T: WithDType>(
        data: &[T],
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }

    /// A 0-d tensor.
    pub fn scalar<T: WithDType>(value: T, device: &Device) -> Result<Tensor> {
        Tensor::from_vec(vec![value], (), device)
    }

    fn create(op: Op, shape: Shape, dtype: DType, device: &Device) -> Result<Tensor> {
        shape.checked_elem_count(op.name())?;
        let mut out = device.backend().exec(&op, &[], &[(shape.clone(), dtype)])?;
        let storage = out
            .pop()
            .ok_or_else(|| Error::backend(op.name(), "backend returned no output"))?;
        Ok(Tensor::from_storage(
            storage,
            Layout::contiguous(shape),
            device.clone(),
        ))
    }

    pub fn full(
        value: f64,
        shape: impl Into<Shape>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::create(Op::Fill { value }, shape.into(), dtype, device)
    }

    /// Every element `value`, read-only and shared: the same tensor for the same device,
    /// dtype, value and shape (made once, by a fill; see `constant.rs` for the bounds). For
    /// operands that are only read (scalars, paddings, unit weights); `copy_` and the
    /// optimizer's in-place updates refuse to write one. `full` makes a tensor of one's own.
    pub fn constant(
        value: f64,
        shape: impl Into<Shape>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        crate::constant::constant(value, shape.into(), dtype, device)
    }

    /// Whether this tensor views a shared constant ([`Tensor::constant`]).
    pub fn is_constant(&self) -> bool {
        crate::constant::is_constant(self)
    }

    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(0.0, shape, dtype, device)
    }
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(1.0, shape, dtype, device)
    }
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.dtype(), self.device())
    }
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Tensor::full(value, self.shape(), self.dtype(), self.device())
    }
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.dtype(), self.device())
    }

    /// `[start, start + step, ...)` up to (excluding) `end`.
    pub fn arange(
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::shape(
                "arange",
                format!("invalid range {start}..{end} step {step}"),
            ));
        }
        let n = ((end - start) / step).ceil().max(0.0);
        if n > (isize::MAX as f64) {
            return Err(Error::shape("arange", format!("{n} elements is too many")));
        }
        Tensor::create(
            Op::Arange { start, step },
            Shape::new([n as usize]),
            dtype,
            device,
        )
    }

    /// Uniform in [low, high), reproducible from `seed` on every backend.
    pub fn rand_uniform(
        shape: impl Into<Shape>,
        low: f64,
        high: f64,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        float_only("rand_uniform", dtype)?;
        Tensor::create(
            Op::RandUniform { seed, low, high },
            shape.into(),
            dtype,
            device,
        )
    }

    /// Normal(mean, std), reproducible from `seed` on every backend.
    pub fn rand_normal(
        shape: impl Into<Shape>,
        mean: f64,
        std: f64,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        float_only("rand_normal", dtype)?;
        Tensor::create(
            Op::RandNormal { seed, mean, std },
            shape.into(),
            dtype,
            device,
        )
    }

    // ---- host reads ----

    /// The elements in row-major order, waiting for the work that produces them.
    pub fn to_host(&self) -> Result<HostBuffer> {
        self.device()
            .backend()
            .to_host(self.storage(), self.layout())
    }

    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                lhs: self.dtype(),
                rhs: T::DTYPE,
            });
        }
        T::take_vec(self.to_host()?)
            .ok_or_else(|| Error::backend("to_vec", "backend returned the wrong dtype"))
    }

    /// This tensor on `device` (the same tensor when it is already there). Crossing devices
    /// copies through the host and is not recorded for autodiff.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if self.device().same(device) {
            return Ok(self.clone());
        }
        Tensor::from_host(self.to_host()?, self.shape().clone(), device)
    }

    /// Every element as f64, whatever the dtype.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(self.to_host()?.to_f64_vec())
    }

    /// The value of a one-element tensor.
    pub fn item<T: WithDType>(&self) -> Result<T> {
        if self.elem_count() != 1 {
            return Err(Error::shape(
                "item",
                format!("tensor of shape {} is not one element", self.shape()),
            ));
        }
        self.to_vec::<T>()?
            .pop()
            .ok_or_else(|| Error::backend("item", "backend returned no element"))
    }

    // ---- views ----

    /// Same elements, new shape; a view when strides allow, else a copy.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.checked_elem_count("reshape")? != self.elem_count() {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot reshape {} ({} elements) to {shape} ({} elements)",
                    self.shape(),
                    self.elem_count(),
                    shape.elem_count()
                ),
            ));
        }
        // The same shape is the same tensor (no view recorded: a rule that adds into its
        // input's gradient, `LayerNormBackward { acc }`, then sees the input itself).
        if shape == *self.shape() {
            return Ok(self.clone());
        }
        match self.layout().reshape(&shape) {
            Some(l) => Ok(self.view(l, ViewOp::Reshape)),
            None => {
                let c = self.contiguous()?;
                let l = Layout::contiguous(shape);
                Ok(c.view(l, ViewOp::Reshape))
            }
        }
    }

    /// Like `reshape` with one dim given as -1 (inferred).
    pub fn reshape_infer(&self, dims: &[isize]) -> Result<Tensor> {
        let known: usize = dims
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .product();
        let n_infer = dims.iter().filter(|&&d| d == -1).count();
        if n_infer > 1
            || dims.iter().any(|&d| d < -1)
            || (n_infer == 1 && (known == 0 || !self.elem_count().is_multiple_of(known)))
        {
            return Err(Error::shape(
                "reshape",
                format!("cannot reshape {} to {dims:?}", self.shape()),
            ));
        }
        let shape: Vec<usize> = dims
            .iter()
            .map(|&d| {
                if d == -1 {
                    self.elem_count() / known.max(1)
                } else {
                    d as usize
                }
            })
            .collect();
        self.reshape(shape)
    }

    pub fn flatten(&self) -> Result<Tensor> {
        self.reshape([self.elem_count()])
    }

    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        Ok(self.view(self.layout().permute(perm)?, ViewOp::Permute(perm.to_vec())))
    }

    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (
            self.shape().axis("transpose", a)?,
            self.shape().axis("transpose", b)?,
        );
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Swaps the last two dims.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::shape(
                "t",
                format!("needs rank >= 2, got {}", self.shape()),
            ));
        }
        self.transpose(-2, -1)
    }

    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let axis = self.shape().axis("narrow", axis)?;
        Ok(self.view(
            self.layout().narrow(axis, start, len)?,
            ViewOp::Narrow { axis, start },
        ))
    }

    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if self.shape() == &shape {
            return Ok(self.clone());
        }
        Ok(self.view(self.layout().broadcast_as(&shape)?, ViewOp::Broadcast))
    }

    /// `broadcast_to` where -1 keeps the existing size of that dim.
    pub fn expand(&self, dims: &[isize]) -> Result<Tensor> {
        let lead = dims.len().checked_sub(self.rank()).ok_or_else(|| {
            Error::shape(
                "expand",
                format!("cannot expand {} to {dims:?}", self.shape()),
            )
        })?;
        let shape: Vec<usize> = dims
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if d == -1 && i >= lead {
                    Ok(self.dims()[i - lead])
                } else if d >= 0 {
                    Ok(d as usize)
                } else {
                    Err(Error::shape(
                        "expand",
                        format!("cannot expand {} to {dims:?}", self.shape()),
                    ))
                }
            })
            .collect::<Result<_>>()?;
        self.broadcast_to(shape)
    }

    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        let a = self.shape().axis("squeeze", axis)?;
        if self.dims()[a] != 1 {
            return Err(Error::shape(
                "squeeze",
                format!("axis {a} of {} is not 1", self.shape()),
            ));
        }
        let mut dims = self.dims().to_vec();
        let mut strides = self.layout().strides().to_vec();
        dims.remove(a);
        strides.remove(a);
        Ok(self.view(
            Layout::new(Shape::new(dims), strides, self.layout().offset()),
            ViewOp::Reshape,
        ))
    }

    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let rank = self.rank() as isize;
        let a = if axis < 0 { axis + rank + 1 } else { axis };
        if a < 0 || a > rank {
            return Err(Error::Axis {
                op: "unsqueeze",
                axis,
                rank: self.rank(),
            });
        }
        let a = a as usize;
        let mut dims = self.dims().to_vec();
        let mut strides = self.layout().strides().to_vec();
        let s = if a < dims.len() {
            dims[a] * strides[a]
        } else {
            1
        };
        dims.insert(a, 1);
        strides.insert(a, s);
        Ok(self.view(
            Layout::new(Shape::new(dims), strides, self.layout().offset()),
            ViewOp::Reshape,
        ))
    }

    /// A contiguous copy in a new buffer of its own (PyTorch's `clone()`); recorded for
    /// autodiff like any op.
    pub fn copy(&self) -> Result<Tensor> {
        self.run1(Op::Copy, &[self], self.shape().clone(), self.dtype())
    }

    /// Writes `src` into this tensor's buffer in place (PyTorch's `copy_`): the storage keeps
    /// its address, so CUDA graphs that captured it stay valid, and every tensor viewing it
    /// sees the new values. `src` broadcasts to this shape and is cast to this dtype; this
    /// tensor must be contiguous. Not recorded for autodiff (a write, not an op); a graph that
    /// saved this storage for its backward reads the new values.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        let op = "copy_";
        Tensor::check_same_device(op, &[self, src])?;
        crate::constant::refuse_write(op, "the destination", self)?;
        if !self.is_contiguous() {
            return Err(Error::shape(
                op,
                format!(
                    "destination {} must be contiguous (strides {:?})",
                    self.shape(),
                    self.layout().strides()
                ),
            ));
        }
        let src = graph::no_grad(|| -> Result<Tensor> {
            let mut s = src.detach();
            if s.shape() != self.shape() {
                s = s.broadcast_to(self.shape().clone()).map_err(|_| {
                    Error::shape(
                        op,
                        format!(
                            "source {} does not broadcast to destination {}",
                            src.shape(),
                            self.shape()
                        ),
                    )
                })?;
            }
            if s.dtype() != self.dtype() {
                s = s.cast(self.dtype())?;
            }
            if s.shares_storage(self) {
                if s.layout() == self.layout() {
                    return Ok(s);
                }
                // Overlapping read and write: read through a copy.
                s = s.run1(Op::Copy, &[&s], s.shape().clone(), s.dtype())?;
            }
            Ok(s)
        })?;
        if src.shares_storage(self) || self.elem_count() == 0 {
            return Ok(());
        }
        self.device().backend().write_into(self, &src)
    }

    /// The same tensor, contiguous; copies only when the layout is not already contiguous.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous()
            && self.layout().offset() == 0
            && self.storage().len() == self.elem_count()
        {
            return Ok(self.clone());
        }
        self.run1(Op::Copy, &[self], self.shape().clone(), self.dtype())
    }

    // ---- op plumbing ----

    fn check_same_device(op: &'static str, inputs: &[&Tensor]) -> Result<()> {
        if let Some(first) = inputs.first() {
            for t in &inputs[1..] {
                if !t.device().same(first.device()) {
                    return Err(Error::DeviceMismatch {
                        op,
                        lhs: first.device().to_string(),
                        rhs: t.device().to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    pub(crate) fn run(
        &self,
        op: Op,
        inputs: &[&Tensor],
        outs: Vec<(Shape, DType)>,
    ) -> Result<Vec<Tensor>> {
        let dev = self.device();
        let storages = Tensor::exec(dev, &op, inputs, &outs)?;
        let record = inputs.iter().any(|t| t.requires_grad()) && graph::is_recording();
        // Every output, for the nodes of ops whose rule reads them (`graph::keeps_output`).
        let kept = match record && graph::op_keeps_output(&op) {
            true => storages.clone(),
            false => Vec::new(),
        };
        Ok(storages
            .into_iter()
            .zip(outs)
            .enumerate()
            .map(|(k, (storage, (shape, dtype)))| {
                let grad = (record && graph::differentiable_output(&op, k, dtype))
                    .then(|| graph::node(GradOp::Op(op.clone()), k, inputs, &kept));
                Tensor::output(storage, shape, dev, grad)
            })
            .collect())
    }

    /// `op` run by `dev`'s backend on `inputs` (one device), one storage per spec of `outs`.
    fn exec(
        dev: &Device,
        op: &Op,
        inputs: &[&Tensor],
        outs: &[(Shape, DType)],
    ) -> Result<Vec<Arc<dyn Storage>>> {
        Tensor::check_same_device(op.name(), inputs)?;
        let storages = dev.backend().exec(op, inputs, outs)?;
        if storages.len() != outs.len() {
            return Err(Error::backend(
                op.name(),
                "backend returned the wrong number of outputs",
            ));
        }
        Ok(storages)
    }

    /// An op's output: a new contiguous storage of `shape` and its place in the graph.
    fn output(
        storage: Arc<dyn Storage>,
        shape: Shape,
        device: &Device,
        grad: Option<Grad>,
    ) -> Tensor {
        Tensor(Arc::new(Inner {
            dtype: storage.dtype(),
            storage,
            layout: Layout::contiguous(shape),
            device: device.clone(),
            grad,
        }))
    }

    pub(crate) fn run1(
        &self,
        op: Op,
        inputs: &[&Tensor],
        shape: Shape,
        dtype: DType,
    ) -> Result<Tensor> {
        let name = op.name();
        self.run(op, inputs, vec![(shape, dtype)])?
            .pop()
            .ok_or_else(|| Error::backend(name, "backend returned no output"))
    }

    // ---- elementwise ----

    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let dt = self.dtype();
        if dt == DType::Bool || (dt.is_int() && !op.supports_int()) {
            return Err(Error::dtype(op.name(), dt, "needs a float dtype"));
        }
        if dt.is_int() && matches!(op, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round) {
            return Ok(self.clone());
        }
        self.run1(Op::Unary(op), &[self], self.shape().clone(), dt)
    }

    /// Broadcasts two tensors to their common shape (views, no copies).
    pub fn broadcast_pair(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        let shape = Shape::broadcast(op, a.shape(), b.shape())?;
        Ok((a.broadcast_to(&shape)?, b.broadcast_to(&shape)?))
    }

    pub fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        let (a, b) = Tensor::broadcast_pair(op.name(), self, rhs)?;
        if a.dtype() == DType::Bool || (op.float_only() && !a.dtype().is_float()) {
            let needs = match op.float_only() {
                true => "needs a float dtype",
                false => "needs a numeric dtype",
            };
            return Err(Error::dtype(op.name(), a.dtype(), needs));
        }
        a.run1(Op::Binary(op), &[&a, &b], a.shape().clone(), a.dtype())
    }

    pub fn cmp(&self, op: CmpOp, rhs: &Tensor) -> Result<Tensor> {
        let (a, b) = Tensor::broadcast_pair(op.name(), self, rhs)?;
        a.run1(Op::Cmp(op), &[&a, &b], a.shape().clone(), DType::Bool)
    }

    /// A tensor of this one's dtype and device holding `v`, broadcastable to anything.
    /// A 0-d `v` of this dtype and device: the shared read-only constant
    /// ([`Tensor::constant`]).
    pub fn scalar_like(&self, v: f64) -> Result<Tensor> {
        Tensor::constant(v, (), self.dtype(), self.device())
    }

    fn binary_scalar(&self, op: BinaryOp, v: f64) -> Result<Tensor> {
        self.binary(op, &self.scalar_like(v)?)
    }

    /// `cond ? on_true : on_false`, elementwise with broadcasting of all three.
    pub fn where_cond(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        if cond.dtype() != DType::Bool {
            return Err(Error::dtype(
                "where",
                cond.dtype(),
                "condition must be bool",
            ));
        }
        if on_true.dtype() != on_false.dtype() {
            return Err(Error::DTypeMismatch {
                op: "where",
                lhs: on_true.dtype(),
                rhs: on_false.dtype(),
            });
        }
        let shape = Shape::broadcast(
            "where",
            &Shape::broadcast("where", cond.shape(), on_true.shape())?,
            on_false.shape(),
        )?;
        let (c, a, b) = (
            cond.broadcast_to(&shape)?,
            on_true.broadcast_to(&shape)?,
            on_false.broadcast_to(&shape)?,
        );
        a.run1(Op::Where, &[&c, &a, &b], shape, a.dtype())
    }

    // ---- reductions ----

    fn reduce_axes(&self, op: &'static str, axes: &[isize]) -> Result<Vec<usize>> {
        let mut out = Vec::with_capacity(axes.len());
        for &a in axes {
            let a = self.shape().axis(op, a)?;
            if out.contains(&a) {
                return Err(Error::shape(op, format!("axis {a} given twice")));
            }
            out.push(a);
        }
        out.sort_unstable();
        Ok(out)
    }

    fn reduce(&self, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let name = op.name();
        if self.dtype() == DType::Bool {
            return Err(Error::dtype(name, DType::Bool, "needs a numeric dtype"));
        }
        // All axes when none are given.
        let axes = if axes.is_empty() {
            (0..self.rank()).collect()
        } else {
            self.reduce_axes(name, axes)?
        };
        let mut kept = self.dims().to_vec();
        for &a in &axes {
            if self.dims()[a] == 0 && op != ReduceOp::Sum {
                return Err(Error::shape(
                    name,
                    format!("cannot reduce an empty axis {a} of {}", self.shape()),
                ));
            }
            kept[a] = 1;
        }
        let out_dtype = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            DType::U32
        } else {
            self.dtype()
        };
        let out = if axes.is_empty() {
            // A 0-d tensor: nothing to reduce.
            match op {
                ReduceOp::ArgMax | ReduceOp::ArgMin => {
                    Tensor::zeros((), DType::U32, self.device())?
                }
                _ => self.clone(),
            }
        } else {
            self.run1(
                Op::Reduce {
                    op,
                    axes: axes.clone(),
                },
                &[self],
                Shape::new(kept),
                out_dtype,
            )?
        };
        if keepdim {
            return Ok(out);
        }
        let dims: Vec<usize> = self
            .dims()
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        out.reshape(dims)
    }

    /// Sum over `axes` (all when empty).
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }
    pub fn min(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim)
    }
    /// Index (u32) of the first maximum along `axis`.
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, &[axis], keepdim)
    }
    pub fn argmin(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMin, &[axis], keepdim)
    }
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// Number of elements `axes` cover (all when empty).
    fn count_over(&self, op: &'static str, axes: &[isize]) -> Result<usize> {
        if axes.is_empty() {
            return Ok(self.elem_count());
        }
        Ok(self
            .reduce_axes(op, axes)?
            .iter()
            .map(|&a| self.dims()[a])
            .product())
    }

    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        float_only("mean", self.dtype())?;
        let n = self.count_over("mean", axes)?;
        self.sum(axes, keepdim)?.div_scalar(n as f64)
    }

    /// Variance over `axes`; `unbiased` divides by n - 1.
    pub fn var(&self, axes: &[isize], keepdim: bool, unbiased: bool) -> Result<Tensor> {
        float_only("var", self.dtype())?;
        let n = self.count_over("var", axes)?;
        let d = self.sub(&self.mean(axes, true)?)?;
        let denom = if unbiased { n.saturating_sub(1) } else { n };
        d.square()?.sum(axes, keepdim)?.div_scalar(denom as f64)
    }

    /// log(sum(exp(x))) over `axes`, computed stably (max subtracted first).
    pub fn logsumexp(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        float_only("logsumexp", self.dtype())?;
        let m = self.max(axes, true)?;
        // An all -inf row would give -inf - -inf = NaN; shift by 0 there instead.
        let finite = m.abs()?.lt(&m.scalar_like(f64::INFINITY)?)?;
        let m = Tensor::where_cond(&finite, &m, &m.zeros_like()?)?;
        let s = self.sub(&m)?.exp()?.sum(axes, true)?.log()?.add(&m)?;
        if keepdim {
            Ok(s)
        } else {
            let dims: Vec<usize> = match axes.is_empty() {
                true => vec![],
                false => {
                    let ax = self.reduce_axes("logsumexp", axes)?;
                    self.dims()
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !ax.contains(i))
                        .map(|(_, &d)| d)
                        .collect()
                }
            };
            s.reshape(dims)
        }
    }

    // ---- matmul ----

    /// Matrix product with NumPy semantics: 1-D operands are promoted (and the added dim
    /// removed), batch dims broadcast. Transposed views are used in place, without copies.
    /// Autocast-eligible (`crate::autocast`).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        crate::autocast::eligible(&[self, rhs], |t, out| t[0].matmul_to(t[1], out))
    }

    /// `self.matmul(rhs) + bias` with `bias` `[n]` added over the last axis (a `Linear`
    /// layer: `x.matmul_bias(&w.t()?, Some(&b))`), one op where the product folds into rows
    /// of a matrix `rhs` and the bias has the output's dtype, else the product and an add.
    /// Autocast-eligible like `matmul`: under autocast an f32 bias is added to the f32
    /// output in f32 (a 16-bit bias stays as given: the low-dtype layers of
    /// `autocast::to_low`).
    pub fn matmul_bias(&self, rhs: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.matmul_bias_acc(rhs, bias, None)
    }

    /// `acc + self.matmul_bias(rhs, bias)`: a `Linear` layer's output added to the residual
    /// stream `acc`, one op (the sum in the product's epilogue) where `matmul_bias` is one
    /// and `acc` has the output's shape and dtype, else the layer and an add.
    pub fn matmul_bias_add(
        &self,
        rhs: &Tensor,
        bias: Option<&Tensor>,
        acc: &Tensor,
    ) -> Result<Tensor> {
        self.matmul_bias_acc(rhs, bias, Some(acc))
    }

    fn matmul_bias_acc(
        &self,
        rhs: &Tensor,
        bias: Option<&Tensor>,
        acc: Option<&Tensor>,
    ) -> Result<Tensor> {
        let apart = |y: Tensor| match acc {
            Some(acc) => acc.add(&y),
            None => Ok(y),
        };
        let Some(bias) = bias else {
            return apart(self.matmul(rhs)?);
        };
        let n = rhs.dims().last().copied().unwrap_or(0);
        if bias.dims() != [n] || rhs.rank() != 2 || self.rank() < 1 {
            let y = self.matmul(rhs)?;
            return apart(y.add(bias)?);
        }
        crate::autocast::eligible(&[self, rhs], |t, out| {
            let (a, b) = (t[0], t[1]);
            let Some((flat, od)) = Tensor::bias_rows(a, b, bias, out)? else {
                return apart(a.matmul_to(b, out)?.add(bias)?);
            };
            let out_rows = Shape::new([flat.dims()[0], n]);
            // The residual into the op where it is the output's shape and dtype, as it is (a
            // reshape would put a view node between it and its gradient, which a norm's
            // backward then could not take in: `ferrite-autodiff`'s `adds_into_first`).
            let fused_acc = match acc {
                Some(acc) if acc.dims() == od.as_slice() && acc.dtype() == out => Some(acc),
                _ => None,
            };
            let mut ins = vec![&flat, b, bias];
            ins.extend(fused_acc);
            let op = Op::MatmulBias {
                acc: fused_acc.is_some(),
            };
            let y = flat.run1(op, &ins, out_rows, out)?.reshape(od)?;
            match fused_acc {
                Some(_) => Ok(y),
                None => apart(y),
            }
        })
    }

    /// `gelu_tanh(self.matmul_bias(rhs, Some(bias)))`: a `Linear` layer and the tanh GELU
    /// after it, one op (`Op::MatmulBiasGelu`: the GELU in the product's epilogue, from the
    /// unrounded sum) where `matmul_bias` is one, else the two. Gradients flow as through
    /// the two: the graph records the product and the GELU of its output.
    pub fn matmul_bias_gelu(&self, rhs: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let n = rhs.dims().last().copied().unwrap_or(0);
        if bias.dims() != [n] || rhs.rank() != 2 || self.rank() < 1 {
            return self.matmul_bias(rhs, Some(bias))?.gelu_tanh();
        }
        crate::autocast::eligible(&[self, rhs], |t, out| {
            let (a, b) = (t[0], t[1]);
            let Some((flat, od)) = Tensor::bias_rows(a, b, bias, out)? else {
                return a.matmul_to(b, out)?.add(bias)?.gelu_tanh();
            };
            let rows = Shape::new([flat.dims()[0], n]);
            let ins = [&flat, b, bias];
            let dev = flat.device();
            let outs = vec![(rows.clone(), out), (rows.clone(), out)];
            let mut st = Tensor::exec(dev, &Op::MatmulBiasGelu, &ins, &outs)?.into_iter();
            let (Some(ys), Some(ps)) = (st.next(), st.next()) else {
                return Err(Error::backend(
                    "matmul_bias_gelu",
                    "backend returned no output",
                ));
            };
            let record = ins.iter().any(|t| t.requires_grad()) && graph::is_recording();
            let node = |op, inputs: &[&Tensor]| {
                record.then(|| graph::node(GradOp::Op(op), 0, inputs, &[]))
            };
            let p = Tensor::output(
                ps,
                rows.clone(),
                dev,
                node(Op::MatmulBias { acc: false }, &ins),
            );
            let y = Tensor::output(ys, rows, dev, node(Op::Unary(UnaryOp::GeluTanh), &[&p]));
            y.reshape(od)
        })
    }

    /// `gelu_tanh'(x) (self rhs)` in one op (`Op::MatmulGeluBackward`): the gradient of the
    /// input `x` of a tanh GELU whose output feeds a product, from that product's output
    /// gradient `self` [m, k] and its right operand transposed `rhs` [k, n]; x [m, n], all
    /// of one float dtype. Not differentiable.
    pub fn matmul_gelu_backward(&self, rhs: &Tensor, x: &Tensor) -> Result<Tensor> {
        let op = "matmul_gelu_backward";
        Tensor::check_matmul_dtypes(op, self, rhs, self.dtype())?;
        if x.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: x.dtype(),
            });
        }
        match (self.dims(), rhs.dims(), x.dims()) {
            ([m, k], [k2, n], [m2, n2]) if k == k2 && m == m2 && n == n2 => {}
            _ => {
                return Err(Error::shape(
                    op,
                    format!(
                        "needs g [m, k], b [k, n] and x [m, n]: {}",
                        fmt_shapes(&[self.shape(), rhs.shape(), x.shape()])
                    ),
                ))
            }
        }
        self.run1(
            Op::MatmulGeluBackward,
            &[self, rhs, x],
            x.shape().clone(),
            x.dtype(),
        )
    }

    /// `a` [.., k] as rows [m, k] and the output's dims, where `a b + bias` (b [k, n], bias
    /// [n] in the output dtype `out`) is one product op (`Op::MatmulBias`): the rows a view
    /// of `a`, the bias in `out`, nothing empty. `None` where it is not.
    fn bias_rows(
        a: &Tensor,
        b: &Tensor,
        bias: &Tensor,
        out: DType,
    ) -> Result<Option<(Tensor, Vec<usize>)>> {
        let k = a.dims()[a.rank() - 1];
        let rows = Shape::new([a.elem_count() / k.max(1), k]);
        let fused = bias.dtype() == out
            && b.dims()[0] == k
            && k > 0
            && a.elem_count() > 0
            && a.layout().reshape(&rows).is_some();
        if !fused {
            return Ok(None);
        }
        let mut od = a.dims()[..a.rank() - 1].to_vec();
        od.push(b.dims()[1]);
        let flat = a.reshape(rows)?;
        Tensor::check_matmul_dtypes("matmul_bias", &flat, b, out)?;
        Ok(Some((flat, od)))
    }

    /// Operand dtypes of a product with output `out`: equal float dtypes, the output theirs
    /// or f32 from f16/bf16.
    fn check_matmul_dtypes(op: &'static str, a: &Tensor, b: &Tensor, out: DType) -> Result<()> {
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        float_only(op, a.dtype())?;
        if !f32_partner(out, a.dtype()) {
            return Err(Error::dtype(
                op,
                out,
                format!("a {} product cannot write {out}", a.dtype()),
            ));
        }
        Ok(())
    }

    /// `matmul` in the operands' own dtype, whatever the autocast policy (for compositions
    /// that must stay in their dtype, such as adaptive pooling).
    pub(crate) fn matmul_exact(&self, rhs: &Tensor) -> Result<Tensor> {
        self.matmul_to(rhs, self.dtype())
    }

    /// `matmul` without autocast, written in `out`: the operands' dtype, or f32 from f16/bf16
    /// operands (f32 accumulation, one rounding): a backward that needs a 16-bit product's
    /// f32 sum, such as the gradient of autocast's weight copy.
    pub fn matmul_out(&self, rhs: &Tensor, out: DType) -> Result<Tensor> {
        self.matmul_to(rhs, out)
    }

    /// `matmul` with output dtype `out`: the operands' dtype, or f32 from f16/bf16 operands.
    fn matmul_to(&self, rhs: &Tensor, out: DType) -> Result<Tensor> {
        let op = "matmul";
        Tensor::check_matmul_dtypes(op, self, rhs, out)?;
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "needs rank >= 1 operands: {}",
                    fmt_shapes(&[self.shape(), rhs.shape()])
                ),
            ));
        }
        let a = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if rhs.rank() == 1 {
            rhs.unsqueeze(1)?
        } else {
            rhs.clone()
        };
        let (m, k) = (a.dims()[a.rank() - 2], a.dims()[a.rank() - 1]);
        let (k2, n) = (b.dims()[b.rank() - 2], b.dims()[b.rank() - 1]);
        if k != k2 {
            return Err(Error::shape(
                op,
                format!(
                    "inner dimensions differ: {}",
                    fmt_shapes(&[self.shape(), rhs.shape()])
                ),
            ));
        }
        let batch = Shape::broadcast(
            op,
            &Shape::new(&a.dims()[..a.rank() - 2]),
            &Shape::new(&b.dims()[..b.rank() - 2]),
        )
        .map_err(|_| {
            Error::shape(
                op,
                format!(
                    "batch dimensions do not broadcast: {}",
                    fmt_shapes(&[self.shape(), rhs.shape()])
                ),
            )
        })?;
        // A matrix rhs shared by every batch item: one product of [batch·m, k] rows when the
        // lhs batch dims merge into its rows as a view. The weight gradient is then one
        // product over all rows, not a product per batch item summed afterwards.
        if b.rank() == 2 && a.rank() > 2 && k > 0 && a.elem_count() > 0 {
            let rows = Shape::new([a.elem_count() / k, k]);
            if a.layout().reshape(&rows).is_some() {
                let mut od = a.dims()[..a.rank() - 1].to_vec();
                od.push(n);
                let flat = a.reshape(rows)?;
                let y = flat
                    .run1(
                        Op::Matmul,
                        &[&flat, &b],
                        Shape::new([flat.dims()[0], n]),
                        out,
                    )?
                    .reshape(od)?;
                return match rhs.rank() {
                    1 => y.squeeze(-1),
                    _ => Ok(y),
                };
            }
        }
        let mut ad = batch.dims().to_vec();
        ad.extend([m, k]);
        let mut bd = batch.dims().to_vec();
        bd.extend([k, n]);
        let (a, b) = (a.broadcast_to(ad)?, b.broadcast_to(bd)?);
        let mut od = batch.dims().to_vec();
        od.extend([m, n]);
        let y = a.run1(Op::Matmul, &[&a, &b], Shape::new(od), out)?;
        match (self.rank(), rhs.rank()) {
            (1, 1) => y.reshape(()),
            (1, _) => y.squeeze(-2),
            (_, 1) => y.squeeze(-1),
            _ => Ok(y),
        }
    }

    // ---- dtype, indexing, joining ----

    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        self.run1(Op::Cast(dtype), &[self], self.shape().clone(), dtype)
    }

    /// Each of `ts` (float tensors of one dtype, on one device) cast to the float `dtype`, in
    /// one op (`Op::CastEach`: one multi-tensor launch on CUDA). Gradients flow as through
    /// `cast`, each output being recorded as its own `Cast` of its input.
    pub fn cast_each(ts: &[&Tensor], dtype: DType) -> Result<Vec<Tensor>> {
        let op = "cast_each";
        let Some(first) = ts.first() else {
            return Ok(Vec::new());
        };
        float_only(op, dtype)?;
        for t in ts {
            float_only(op, t.dtype())?;
            if t.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: first.dtype(),
                    rhs: t.dtype(),
                });
            }
        }
        let outs: Vec<(Shape, DType)> = ts.iter().map(|t| (t.shape().clone(), dtype)).collect();
        let dev = first.device();
        let storages = Tensor::exec(dev, &Op::CastEach(dtype), ts, &outs)?;
        let recording = graph::is_recording();
        Ok(storages
            .into_iter()
            .zip(ts.iter().zip(outs))
            .map(|(storage, (t, (shape, _)))| {
                let grad = (recording && t.requires_grad())
                    .then(|| graph::node(GradOp::Op(Op::Cast(dtype)), 0, &[t], &[]));
                Tensor::output(storage, shape, dev, grad)
            })
            .collect())
    }

    /// `(self.cast(dtype), self.sum(&[0], false))` for a float matrix [m, n] in one op (one
    /// pass over `self` where the backend fuses them): a Linear's f32 output gradient made its
    /// products' 16-bit operand and summed into its bias gradient. Not differentiable.
    pub fn cast_col_sums(&self, dtype: DType) -> Result<(Tensor, Tensor)> {
        let op = "cast_col_sums";
        float_only(op, self.dtype())?;
        float_only(op, dtype)?;
        let [_, n] = self.dims() else {
            return Err(Error::shape(
                op,
                format!("needs a matrix [m, n], got {}", self.shape()),
            ));
        };
        let mut o = self.run(
            Op::CastColSums(dtype),
            &[self],
            vec![
                (self.shape().clone(), dtype),
                (Shape::new([*n]), self.dtype()),
            ],
        )?;
        match (o.pop(), o.pop()) {
            (Some(sums), Some(cast)) => Ok((cast, sums)),
            _ => Err(Error::backend(op, "backend returned too few outputs")),
        }
    }

    fn check_index(op: &'static str, index: &Tensor) -> Result<()> {
        if !index.dtype().is_int() {
            return Err(Error::dtype(
                op,
                index.dtype(),
                "index must be an integer dtype",
            ));
        }
        Ok(())
    }

    /// Entries of `axis` picked by a 1-D integer index.
    pub fn index_select(&self, index: &Tensor, axis: isize) -> Result<Tensor> {
        let op = "index_select";
        Tensor::check_index(op, index)?;
        if index.rank() != 1 {
            return Err(Error::shape(
                op,
                format!("index must be 1-D, got {}", index.shape()),
            ));
        }
        let axis = self.shape().axis(op, axis)?;
        let mut dims = self.dims().to_vec();
        dims[axis] = index.elem_count();
        self.run1(
            Op::IndexSelect { axis },
            &[self, index],
            Shape::new(dims),
            self.dtype(),
        )
    }

    /// Rows of an embedding table `[vocab, dim]` for integer ids of any shape -> `[..ids, dim]`.
    pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        if table.rank() != 2 {
            return Err(Error::shape(
                "embedding",
                format!("table must be [vocab, dim], got {}", table.shape()),
            ));
        }
        let mut dims = ids.dims().to_vec();
        dims.push(table.dims()[1]);
        table.index_select(&ids.flatten()?, 0)?.reshape(dims)
    }

    /// An index of the same rank as `x`, no larger than `x` outside `axis` (gather/scatter).
    fn fits_along(&self, x: &Tensor, axis: usize) -> bool {
        self.rank() == x.rank()
            && self
                .dims()
                .iter()
                .zip(x.dims())
                .enumerate()
                .all(|(i, (&d, &s))| i == axis || d <= s)
    }

    pub fn gather(&self, index: &Tensor, axis: isize) -> Result<Tensor> {
        let op = "gather";
        Tensor::check_index(op, index)?;
        let axis = self.shape().axis(op, axis)?;
        if !index.fits_along(self, axis) {
            return Err(Error::shape(
                op,
                format!(
                    "index {} does not fit input {} along axis {axis}",
                    index.shape(),
                    self.shape()
                ),
            ));
        }
        self.run1(
            Op::Gather { axis },
            &[self, index],
            index.shape().clone(),
            self.dtype(),
        )
    }

    /// `self` with `src` added at the positions `index` names along `axis`.
    pub fn scatter_add(&self, index: &Tensor, src: &Tensor, axis: isize) -> Result<Tensor> {
        let op = "scatter_add";
        Tensor::check_index(op, index)?;
        let axis = self.shape().axis(op, axis)?;
        if src.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: src.dtype(),
            });
        }
        if index.shape() != src.shape() || !index.fits_along(self, axis) {
            return Err(Error::shape(
                op,
                format!(
                    "index {} and src {} do not fit {} along axis {axis}",
                    index.shape(),
                    src.shape(),
                    self.shape()
                ),
            ));
        }
        self.run1(
            Op::ScatterAdd { axis },
            &[self, index, src],
            self.shape().clone(),
            self.dtype(),
        )
    }

    pub fn cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let op = "cat";
        let first = tensors
            .first()
            .ok_or_else(|| Error::shape(op, "needs at least one tensor"))?;
        let a = first.shape().axis(op, axis)?;
        let mut total = 0usize;
        for t in tensors {
            if t.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: first.dtype(),
                    rhs: t.dtype(),
                });
            }
            if t.rank() != first.rank()
                || t.dims()
                    .iter()
                    .zip(first.dims())
                    .enumerate()
                    .any(|(i, (x, y))| i != a && x != y)
            {
                return Err(Error::shape(
                    op,
                    format!(
                        "shapes differ outside axis {a}: {} and {}",
                        first.shape(),
                        t.shape()
                    ),
                ));
            }
            total += t.dims()[a];
        }
        if tensors.len() == 1 {
            return Ok((*first).clone());
        }
        let mut dims = first.dims().to_vec();
        dims[a] = total;
        first.run1(
            Op::Cat { axis: a },
            tensors,
            Shape::new(dims),
            first.dtype(),
        )
    }

    /// Joins equal-shaped tensors along a new axis.
    pub fn stack(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::shape("stack", "needs at least one tensor"))?;
        for t in tensors {
            if t.shape() != first.shape() {
                return Err(Error::shape(
                    "stack",
                    format!("shapes differ: {} and {}", first.shape(), t.shape()),
                ));
            }
        }
        let us = tensors
            .iter()
            .map(|t| t.unsqueeze(axis))
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&us.iter().collect::<Vec<_>>(), axis)
    }

    /// Views of consecutive pieces along `axis` with the given sizes (which must sum to the dim).
    pub fn split(&self, sizes: &[usize], axis: isize) -> Result<Vec<Tensor>> {
        let a = self.shape().axis("split", axis)?;
        if sizes.iter().sum::<usize>() != self.dims()[a] {
            return Err(Error::shape(
                "split",
                format!("sizes {sizes:?} do not sum to axis {a} of {}", self.shape()),
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let t = self.narrow(a as isize, start, s);
                start += s;
                t
            })
            .collect()
    }

    pub fn cumsum(&self, axis: isize) -> Result<Tensor> {
        let axis = self.shape().axis("cumsum", axis)?;
        if self.dtype() == DType::Bool {
            return Err(Error::dtype("cumsum", DType::Bool, "needs a numeric dtype"));
        }
        self.run1(
            Op::Cumsum { axis },
            &[self],
            self.shape().clone(),
            self.dtype(),
        )
    }

    /// (values, u32 indices) sorted along `axis`; stable.
    pub fn sort(&self, axis: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        let axis = self.shape().axis("sort", axis)?;
        let mut out = self.run(
            Op::Sort { axis, descending },
            &[self],
            vec![
                (self.shape().clone(), self.dtype()),
                (self.shape().clone(), DType::U32),
            ],
        )?;
        let idx = out.pop();
        let vals = out.pop();
        vals.zip(idx)
            .ok_or_else(|| Error::backend("sort", "backend returned too few outputs"))
    }

    /// The `k` largest (or smallest) entries along `axis`, in order, with their u32 indices.
    pub fn topk(&self, k: usize, axis: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        let a = self.shape().axis("topk", axis)?;
        if k > self.dims()[a] {
            return Err(Error::shape(
                "topk",
                format!("k = {k} exceeds axis {a} of {}", self.shape()),
            ));
        }
        let (v, i) = self.sort(a as isize, largest)?;
        Ok((v.narrow(a as isize, 0, k)?, i.narrow(a as isize, 0, k)?))
    }

    // ---- fused ----

    /// Runs a last-axis op on `axis` by moving it last and back (views).
    fn on_last_axis(
        &self,
        op_name: &'static str,
        axis: isize,
        f: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let a = self.shape().axis(op_name, axis)?;
        if a + 1 == self.rank() {
            return f(self);
        }
        f(&self.transpose(a as isize, -1)?)?.transpose(a as isize, -1)
    }

    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        float_only("softmax", self.dtype())?;
        self.on_last_axis("softmax", axis, |x| {
            x.run1(Op::Softmax, &[x], x.shape().clone(), x.dtype())
        })
    }

    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        float_only("log_softmax", self.dtype())?;
        self.on_last_axis("log_softmax", axis, |x| {
            x.run1(Op::LogSoftmax, &[x], x.shape().clone(), x.dtype())
        })
    }

    fn check_norm_param(&self, op: &'static str, p: &Tensor) -> Result<()> {
        float_only(op, self.dtype())?;
        if p.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: p.dtype(),
            });
        }
        let n = *self
            .dims()
            .last()
            .ok_or_else(|| Error::shape(op, "needs rank >= 1"))?;
        if p.dims() != [n] {
            return Err(Error::shape(
                op,
                format!(
                    "parameter {} does not match last dim of {}",
                    p.shape(),
                    self.shape()
                ),
            ));
        }
        Ok(())
    }

    /// Layer norm over the last axis with weight and bias `[n]`.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        self.layer_norm_to(weight, bias, eps, self.dtype())
    }

    /// `layer_norm` written in `dtype`: x's own, or f16/bf16 for f32 x (computed in f32 and
    /// rounded once: a norm whose output feeds an autocast product, no f32 copy written).
    pub fn layer_norm_to(
        &self,
        weight: &Tensor,
        bias: &Tensor,
        eps: f64,
        dtype: DType,
    ) -> Result<Tensor> {
        let op = "layer_norm";
        self.check_norm_param(op, weight)?;
        self.check_norm_param(op, bias)?;
        Tensor::check_half_of(op, self.dtype(), dtype)?;
        self.run1(
            Op::LayerNorm { eps },
            &[self, weight, bias],
            self.shape().clone(),
            dtype,
        )
    }

    /// `other` is `own` or, for f32 `own`, f16/bf16 (a norm's low-precision output or its
    /// gradient).
    fn check_half_of(op: &'static str, own: DType, other: DType) -> Result<()> {
        match f32_partner(own, other) {
            true => Ok(()),
            false => Err(Error::dtype(
                op,
                other,
                format!("must be {own} (or f16/bf16 when that is f32)"),
            )),
        }
    }

    /// RMS norm over the last axis with weight `[n]`.
    pub fn rms_norm(&self, weight: &Tensor, eps: f64) -> Result<Tensor> {
        self.check_norm_param("rms_norm", weight)?;
        self.run1(
            Op::RmsNorm { eps },
            &[self, weight],
            self.shape().clone(),
            self.dtype(),
        )
    }

    /// Rotary embedding of `x [..., l, d]` with `cos`, `sin` of shape `[l, d/2]`.
    pub fn rope(&self, cos: &Tensor, sin: &Tensor, interleaved: bool) -> Result<Tensor> {
        let op = "rope";
        float_only(op, self.dtype())?;
        if self.rank() < 2 {
            return Err(Error::shape(
                op,
                format!("x must be [..., l, d], got {}", self.shape()),
            ));
        }
        let (l, d) = (self.dims()[self.rank() - 2], self.dims()[self.rank() - 1]);
        if d % 2 != 0 || cos.dims() != [l, d / 2] || sin.dims() != [l, d / 2] {
            return Err(Error::shape(
                op,
                format!(
                    "x {} needs an even last dim and cos/sin [{l}, {}], got {} and {}",
                    self.shape(),
                    d / 2,
                    cos.shape(),
                    sin.shape()
                ),
            ));
        }
        for t in [cos, sin] {
            if t.dtype() != self.dtype() {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: self.dtype(),
                    rhs: t.dtype(),
                });
            }
        }
        self.run1(
            Op::Rope { interleaved },
            &[self, cos, sin],
            self.shape().clone(),
            self.dtype(),
        )
    }

    /// The output shape of attention(q, k, v), after checking dtypes and shapes (and the
    /// key-padding mask's: bool [b, lk]).
    fn attention_shape(
        op: &'static str,
        [q, k, v]: [&Tensor; 3],
        key_mask: Option<&Tensor>,
    ) -> Result<Shape> {
        float_only(op, q.dtype())?;
        for t in [k, v] {
            if t.dtype() != q.dtype() {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: q.dtype(),
                    rhs: t.dtype(),
                });
            }
        }
        let bad = || {
            Error::shape(op, format!("q, k, v must be [b, hq, lq, d], [b, hkv, lk, d], [b, hkv, lk, dv] with hq % hkv == 0; got {}", fmt_shapes(&[q.shape(), k.shape(), v.shape()])))
        };
        if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
            return Err(bad());
        }
        let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
        if qd[0] != kd[0]
            || kd[0] != vd[0]
            || kd[1] != vd[1]
            || kd[2] != vd[2]
            || qd[3] != kd[3]
            || kd[1] == 0
            || !qd[1].is_multiple_of(kd[1])
        {
            return Err(bad());
        }
        if let Some(m) = key_mask {
            Tensor::check_key_mask(op, q, k, m)?;
        }
        Ok(Shape::new([qd[0], qd[1], qd[2], vd[3]]))
    }

    /// Autocast-eligible (`crate::autocast`).
    /// Scaled dot-product attention, `q [b, hq, lq, d]`, `k [b, hkv, lk, d]`,
    /// `v [b, hkv, lk, dv]` -> `[b, hq, lq, dv]`; grouped-query when hkv < hq. `scale` defaults
    /// to 1/sqrt(d).
    pub fn attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        Tensor::attention_masked(q, k, v, None, causal, scale)
    }

    /// Autocast-eligible (`crate::autocast`; the mask is never cast).
    /// `attention` with an optional key-padding mask: bool `[b, lk]`, true where key j of
    /// batch row b is padding (PyTorch's `key_padding_mask`). Masked keys get probability 0;
    /// a query whose every visible key is masked gets a NaN row (see `Op::Attention`).
    pub fn attention_masked(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        Tensor::attention_shape("attention", [q, k, v], key_mask)?;
        let scale = scale.unwrap_or(1.0 / (q.dims()[3] as f64).sqrt());
        // Recorded for backward, the op also writes its lse (kept with the node, see
        // `graph::keeps_output`), so the backward need not recompute the forward.
        let record = [q, k, v].iter().any(|t| t.requires_grad()) && crate::graph::is_recording();
        crate::autocast::eligible(&[q, k, v], |t, _| {
            Tensor::attention_run(t, key_mask, causal, scale, record).map(|(o, _)| o)
        })
    }

    /// `attention_masked` and, per query, the natural log of the sum of exp(score) over the
    /// keys it sees (lse, f32 [b, hq, lq]; +inf where it sees no key): what
    /// `attention_backward_saved` reads. Not autocast (the inputs are taken as they are).
    pub fn attention_lse(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<(Tensor, Tensor)> {
        Tensor::attention_shape("attention", [q, k, v], key_mask)?;
        let scale = scale.unwrap_or(1.0 / (q.dims()[3] as f64).sqrt());
        Tensor::attention_run(&[q, k, v], key_mask, causal, scale, true)
            .map(|(o, lse)| (o, lse.expect("two outputs")))
    }

    /// Runs `Op::Attention` on checked operands; with `lse`, its second output too. The output
    /// is returned as [b, hq, lq, dv], a view of the op's [b, lq, hq, dv] storage.
    fn attention_run(
        t: &[&Tensor],
        key_mask: Option<&Tensor>,
        causal: bool,
        scale: f64,
        lse: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (q, k, v) = (t[0], t[1], t[2]);
        let out = Tensor::attention_shape("attention", [q, k, v], key_mask)?;
        let out = Shape::from([out.dims()[0], out.dims()[2], out.dims()[1], out.dims()[3]]);
        let op = Op::Attention {
            causal,
            scale,
            key_mask: key_mask.is_some(),
        };
        let mut outs = vec![(out, q.dtype())];
        if lse {
            let d = q.dims();
            outs.push((Shape::from([d[0], d[1], d[2]]), DType::F32));
        }
        let mut o = match key_mask {
            Some(m) => q.run(op, &[q, k, v, m], outs)?,
            None => q.run(op, &[q, k, v], outs)?,
        };
        let l = if lse { o.pop() } else { None };
        match o.pop() {
            Some(o) if l.is_some() == lse => Ok((o.permute(&[0, 2, 1, 3])?, l)),
            _ => Err(Error::backend(
                "attention",
                "backend returned too few outputs",
            )),
        }
    }

    /// A key-padding mask must be bool [b, lk] for q [b, ..] and k [b, hkv, lk, d].
    fn check_key_mask(op: &'static str, q: &Tensor, k: &Tensor, m: &Tensor) -> Result<()> {
        let want = [q.dims()[0], k.dims()[2]];
        if m.dtype() != DType::Bool || m.dims() != want {
            return Err(Error::shape(
                op,
                format!(
                    "key mask must be bool [{}, {}] ([batch, keys]), got {} {}",
                    want[0],
                    want[1],
                    m.dtype(),
                    m.shape()
                ),
            ));
        }
        Ok(())
    }
}

/// Dedicated backward kernels of the fused ops (used by `ferrite-autodiff`). Shapes are those
/// of the forward op's inputs and output; see `Op`.
impl Tensor {
    fn check_same(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        if a.shape() != b.shape() {
            return Err(Error::shape(
                op,
                format!("shapes differ: {} and {}", a.shape(), b.shape()),
            ));
        }
        Ok(())
    }

    /// dL/dx of softmax (or log_softmax with `log`) over the last axis, from its output `y`.
    pub fn softmax_backward(y: &Tensor, g: &Tensor, log: bool) -> Result<Tensor> {
        let op = if log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        };
        float_only(op, y.dtype())?;
        Tensor::check_same(op, y, g)?;
        y.run1(
            Op::SoftmaxBackward { log },
            &[y, g],
            y.shape().clone(),
            y.dtype(),
        )
    }

    /// (dx, dweight) of `rms_norm(x, weight, eps)` for upstream gradient `g`.
    pub fn rms_norm_backward(
        x: &Tensor,
        weight: &Tensor,
        g: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        Tensor::rms_norm_backward_acc(x, weight, g, eps, None)
    }

    /// `rms_norm_backward` with dx returned as `acc + dx` (`acc` shaped and typed as x: the
    /// gradient x already has from its other uses), summed in the same pass.
    pub fn rms_norm_backward_acc(
        x: &Tensor,
        weight: &Tensor,
        g: &Tensor,
        eps: f64,
        acc: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let op = "rms_norm_backward";
        x.check_norm_param(op, weight)?;
        Tensor::check_same(op, x, g)?;
        let mut ins = vec![x, weight, g];
        if let Some(a) = acc {
            Tensor::check_same(op, x, a)?;
            ins.push(a);
        }
        let acc = acc.is_some();
        let mut o = x.run(
            Op::RmsNormBackward { eps, acc },
            &ins,
            vec![
                (x.shape().clone(), x.dtype()),
                (weight.shape().clone(), x.dtype()),
            ],
        )?;
        let dw = o.pop();
        let dx = o.pop();
        dx.zip(dw)
            .ok_or_else(|| Error::backend(op, "backend returned too few outputs"))
    }

    /// (dx, dweight, dbias) of `layer_norm(x, weight, bias, eps)` for upstream gradient `g`.
    pub fn layer_norm_backward(
        x: &Tensor,
        weight: &Tensor,
        g: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        Tensor::layer_norm_backward_acc(x, weight, g, eps, None)
    }

    /// `layer_norm_backward` with dx returned as `acc + dx` (`acc` shaped and typed as x: the
    /// gradient x already has from its other uses, such as a residual connection), summed in
    /// the same pass.
    pub fn layer_norm_backward_acc(
        x: &Tensor,
        weight: &Tensor,
        g: &Tensor,
        eps: f64,
        acc: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let op = "layer_norm_backward";
        x.check_norm_param(op, weight)?;
        if x.shape() != g.shape() {
            return Err(Error::shape(
                op,
                format!("g {} does not match x {}", g.shape(), x.shape()),
            ));
        }
        Tensor::check_half_of(op, x.dtype(), g.dtype())?;
        let mut ins = vec![x, weight, g];
        if let Some(a) = acc {
            Tensor::check_same(op, x, a)?;
            ins.push(a);
        }
        let p = (weight.shape().clone(), x.dtype());
        let mut o = x.run(
            Op::LayerNormBackward {
                eps,
                acc: acc.is_some(),
            },
            &ins,
            vec![(x.shape().clone(), x.dtype()), p.clone(), p],
        )?;
        match (o.pop(), o.pop(), o.pop()) {
            (Some(db), Some(dw), Some(dx)) => Ok((dx, dw, db)),
            _ => Err(Error::backend(op, "backend returned too few outputs")),
        }
    }

    /// Checks the operands of the fused cross-entropy ops; returns (n, c).
    fn check_cross_entropy(
        op: &'static str,
        logits: &Tensor,
        target: &Tensor,
        weight: &Tensor,
        label_smoothing: f64,
    ) -> Result<(usize, usize)> {
        float_only(op, logits.dtype())?;
        let (n, c) = match logits.dims() {
            [n, c] => (*n, *c),
            _ => {
                return Err(Error::shape(
                    op,
                    format!("logits must be [n, classes], got {}", logits.shape()),
                ))
            }
        };
        if !target.dtype().is_int() || target.dims() != [n] {
            return Err(Error::shape(
                op,
                format!(
                    "target must be integer [{n}] for logits {}, got {} {}",
                    logits.shape(),
                    target.dtype(),
                    target.shape()
                ),
            ));
        }
        if weight.dims() != [c] || weight.dtype() != logits.dtype() {
            return Err(Error::shape(
                op,
                format!(
                    "weight must be {} [{c}], got {} {}",
                    logits.dtype(),
                    weight.dtype(),
                    weight.shape()
                ),
            ));
        }
        if !(0.0..=1.0).contains(&label_smoothing) {
            return Err(Error::shape(
                op,
                format!("label_smoothing must be in [0, 1], got {label_smoothing}"),
            ));
        }
        Ok((n, c))
    }

    /// Fused log-softmax + NLL over class indices (`Op::CrossEntropy`): per row (loss, lse,
    /// target's class weight, 0 where ignored) as an [n, 3] tensor in the logits' accumulator
    /// dtype (f32 for f16/bf16 logits); the gradient flows to `logits` only.
    pub fn cross_entropy_rows(
        logits: &Tensor,
        target: &Tensor,
        weight: &Tensor,
        ignore_index: i64,
        label_smoothing: f64,
    ) -> Result<Tensor> {
        let op = "cross_entropy";
        let (n, _) = Tensor::check_cross_entropy(op, logits, target, weight, label_smoothing)?;
        logits.run1(
            Op::CrossEntropy {
                ignore_index,
                label_smoothing,
            },
            &[logits, target, weight],
            Shape::from(vec![n, 3]),
            logits.dtype().accumulator(),
        )
    }

    /// dlogits of `cross_entropy_rows` given its output `out` and upstream gradient `g`
    /// (both [n, 3] in its output dtype; only g's column 0 is read), in the logits' dtype.
    pub fn cross_entropy_backward(
        logits: &Tensor,
        target: &Tensor,
        weight: &Tensor,
        out: &Tensor,
        g: &Tensor,
        ignore_index: i64,
        label_smoothing: f64,
    ) -> Result<Tensor> {
        let op = "cross_entropy_backward";
        let (n, _) = Tensor::check_cross_entropy(op, logits, target, weight, label_smoothing)?;
        let acc = logits.dtype().accumulator();
        for t in [out, g] {
            if t.dims() != [n, 3] || t.dtype() != acc {
                return Err(Error::shape(
                    op,
                    format!("expected {acc} [{n}, 3], got {} {}", t.dtype(), t.shape()),
                ));
            }
        }
        logits.run1(
            Op::CrossEntropyBackward {
                ignore_index,
                label_smoothing,
            },
            &[logits, target, weight, out, g],
            logits.shape().clone(),
            logits.dtype(),
        )
    }

    /// (dq, dk, dv) of `attention_masked(q, k, v, key_mask, causal, scale)` for upstream
    /// gradient `g`, shaped as q, k, v: [b, h, l, d] views of [b, l, h, d] storage.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_mask: Option<&Tensor>,
        g: &Tensor,
        causal: bool,
        scale: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        Tensor::attention_backward_run([q, k, v], key_mask, g, None, causal, scale)
    }

    /// `attention_backward` given the forward's output and lse (`attention_lse` of the same
    /// operands): backends may rebuild the probabilities from them instead of recomputing
    /// the forward.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward_saved(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_mask: Option<&Tensor>,
        g: &Tensor,
        (o, lse): (&Tensor, &Tensor),
        causal: bool,
        scale: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        Tensor::attention_backward_run([q, k, v], key_mask, g, Some((o, lse)), causal, scale)
    }

    /// Whether q, k, v (equal [b, h, l, d]) are views of one storage laid out as the rows
    /// [b, l, 3, h, d] of a self-attention's projection, q, k, v in that order.
    fn thirds_of_one_projection([q, k, v]: [&Tensor; 3]) -> bool {
        let d = q.dims();
        let one = |t: &Tensor| {
            Arc::ptr_eq(t.storage_arc(), q.storage_arc())
                && t.dims() == d
                && t.dtype() == q.dtype()
                && t.layout().strides() == q.layout().strides()
        };
        if d.len() != 4 || !one(k) || !one(v) {
            return false;
        }
        // [b, h, l, d] over rows of 3 h d: strides (l 3 h d, d, 3 h d, 1).
        let (h, l, e) = (d[1], d[2], d[1] * d[3]);
        let want = [l * 3 * e, d[3], 3 * e, 1];
        let s = q.layout().strides();
        let dims_ok = (0..4).all(|i| d[i] == 1 || s[i] == want[i]);
        let o = q.layout().offset();
        dims_ok && h > 0 && k.layout().offset() == o + e && v.layout().offset() == o + 2 * e
    }

    fn attention_backward_run(
        [q, k, v]: [&Tensor; 3],
        key_mask: Option<&Tensor>,
        g: &Tensor,
        saved: Option<(&Tensor, &Tensor)>,
        causal: bool,
        scale: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let out = Tensor::attention_shape("attention_backward", [q, k, v], key_mask)?;
        if g.shape() != &out || g.dtype() != q.dtype() {
            return Err(Error::shape(
                "attention_backward",
                format!(
                    "upstream gradient {} {} does not match the output {out} {}",
                    g.shape(),
                    g.dtype(),
                    q.dtype()
                ),
            ));
        }
        // Stored [b, l, h, d]: the shapes of q, k, v with heads and rows swapped; or, where
        // q, k and v are the thirds of one projection's rows ([b, l, 3 h d] viewed as heads),
        // stored the same way: one [b, l, 3, h, d] output, whose thirds the gradients are
        // (`ferrite-autodiff` joins the thirds' gradients back without a copy).
        let token_major = |t: &Tensor| {
            let d = t.dims();
            (Shape::from(vec![d[0], d[2], d[1], d[3]]), t.dtype())
        };
        let packed = Tensor::thirds_of_one_projection([q, k, v]);
        let outs = match packed {
            true => {
                let d = q.dims();
                vec![(Shape::from(vec![d[0], d[2], 3, d[1], d[3]]), q.dtype())]
            }
            false => vec![token_major(q), token_major(k), token_major(v)],
        };
        if let Some((o, lse)) = saved {
            let d = q.dims();
            if o.shape() != &out
                || o.dtype() != q.dtype()
                || !o.permute(&[0, 2, 1, 3])?.is_contiguous()
                || lse.dims() != [d[0], d[1], d[2]]
                || lse.dtype() != DType::F32
                || !lse.is_contiguous()
            {
                return Err(Error::shape(
                    "attention_backward",
                    format!(
                        "saved output {} {} and lse {} {} must be the forward's {out} {} (stored [b, lq, hq, dv]) and contiguous f32 [{}, {}, {}]",
                        o.shape(),
                        o.dtype(),
                        lse.shape(),
                        lse.dtype(),
                        q.dtype(),
                        d[0],
                        d[1],
                        d[2]
                    ),
                ));
            }
        }
        let op = Op::AttentionBackward {
            causal,
            scale,
            key_mask: key_mask.is_some(),
            saved: saved.is_some(),
            packed,
        };
        let mut ins = vec![q, k, v];
        ins.extend(key_mask);
        ins.push(g);
        if let Some((o, lse)) = saved {
            ins.extend([o, lse]);
        }
        let mut o = q.run(op, &ins, outs)?;
        if packed {
            let all = o
                .pop()
                .ok_or_else(|| Error::backend("attention_backward", "no output"))?;
            let d = q.dims();
            let third = |i: usize| -> Result<Tensor> {
                all.narrow(2, i, 1)?
                    .reshape([d[0], d[2], d[1], d[3]])?
                    .permute(&[0, 2, 1, 3])
            };
            return Ok((third(0)?, third(1)?, third(2)?));
        }
        match (o.pop(), o.pop(), o.pop()) {
            (Some(dv), Some(dk), Some(dq)) => Ok((
                dq.permute(&[0, 2, 1, 3])?,
                dk.permute(&[0, 2, 1, 3])?,
                dv.permute(&[0, 2, 1, 3])?,
            )),
            _ => Err(Error::backend(
                "attention_backward",
                "backend returned too few outputs",
            )),
        }
    }
}

/// `narrow` is `wide`, or f16/bf16 where `wide` is f32: the dtype pairs one op may mix (a
/// 16-bit product's f32 output, a norm's 16-bit output or gradient of f32 rows).
fn f32_partner(wide: DType, narrow: DType) -> bool {
    narrow == wide || (wide == DType::F32 && matches!(narrow, DType::F16 | DType::BF16))
}

fn float_only(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::dtype(op, dtype, "needs a float dtype"))
    }
}

macro_rules! unary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(pub fn $name(&self) -> Result<Tensor> { self.unary(UnaryOp::$op) })*
        }
    };
}
unary_methods!(
    neg => Neg, abs => Abs, sign => Sign, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
    recip => Recip, square => Square, sin => Sin, cos => Cos, tanh => Tanh, sigmoid => Sigmoid,
    relu => Relu, gelu => GeluErf, gelu_tanh => GeluTanh, silu => Silu, floor => Floor,
    ceil => Ceil, round => Round,
);

macro_rules! binary_methods {
    ($($name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> { self.binary(BinaryOp::$op, rhs) }
                pub fn $scalar(&self, v: f64) -> Result<Tensor> { self.binary_scalar(BinaryOp::$op, v) }
            )*
        }
    };
}
binary_methods!(
    add, add_scalar => Add, sub, sub_scalar => Sub, mul, mul_scalar => Mul, div, div_scalar => Div,
    pow, pow_scalar => Pow, maximum, maximum_scalar => Maximum, minimum, minimum_scalar => Minimum,
);

macro_rules! cmp_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> { self.cmp(CmpOp::$op, rhs) })*
        }
    };
}
cmp_methods!(eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge);

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor[{}, {}, {}]",
            self.shape(),
            self.dtype(),
            self.device()
        )
    }
}

/// Prints the values (up to 8 per dim, with `...`), then dtype, shape and device. Reading the
/// values waits for the work that produces them.
impl std::fmt::Display for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vals = match self.to_vec_f64() {
            Ok(v) => v,
            Err(e) => return write!(f, "<{e}>"),
        };
        fn rec(
            f: &mut std::fmt::Formatter<'_>,
            dims: &[usize],
            vals: &[f64],
            is_float: bool,
        ) -> std::fmt::Result {
            match dims.split_first() {
                None => {
                    let v = vals.first().copied().unwrap_or(f64::NAN);
                    if is_float {
                        write!(f, "{v:.4}")
                    } else {
                        write!(f, "{v}")
                    }
                }
                Some((&n, rest)) => {
                    let inner: usize = rest.iter().product();
                    f.write_str("[")?;
                    for i in 0..n {
                        if n > 8 && i == 4 {
                            f.write_str("..., ")?;
                        }
                        if n > 8 && (4..n - 4).contains(&i) {
                            continue;
                        }
                        rec(f, rest, &vals[i * inner..(i + 1) * inner], is_float)?;
                        if i + 1 < n {
                            f.write_str(", ")?;
                        }
                    }
                    f.write_str("]")
                }
            }
        }
        rec(f, self.dims(), &vals, self.dtype().is_float())?;
        write!(
            f,
            " ({}, {}, {})",
            self.dtype(),
            self.shape(),
            self.device()
        )
    }
}
