//! `Parameter` (a trainable tensor) and `Buffer` (a non-trainable one such as running
//! statistics): each owns one contiguous buffer that in-place writes (`copy_`, optimizer
//! updates, state-dict loads) reuse, so its device address stays fixed for as long as the
//! module lives on that device (a CUDA graph that captured it stays valid).

use ferrite_autodiff::Var;
use ferrite_core::{DType, Device, Error, Result, Shape, Tensor};

/// A trainable tensor of a module. Clones are handles to the same buffer and gradient slot.
#[derive(Clone)]
pub struct Parameter {
    var: Var,
    requires_grad: bool,
}

impl Parameter {
    /// A parameter holding a copy of `value` in a buffer of its own (a float dtype).
    pub fn new(value: &Tensor) -> Result<Parameter> {
        if !value.dtype().is_float() {
            return Err(Error::dtype(
                "Parameter::new",
                value.dtype(),
                "parameters must be floating point",
            ));
        }
        let owned = ferrite_core::no_grad(|| value.detach().copy())?;
        Ok(Parameter {
            var: Var::new(&owned)?,
            requires_grad: true,
        })
    }

    /// The tensor to compute with: a trainable leaf when `requires_grad`, else a plain tensor
    /// on the same buffer.
    pub fn tensor(&self) -> Tensor {
        match self.requires_grad {
            true => self.var.tensor().clone(),
            false => self.var.tensor().detach(),
        }
    }

    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }

    /// Freezes (`false`) or unfreezes the parameter; a frozen one gets no gradient.
    pub fn set_requires_grad(&mut self, on: bool) {
        self.requires_grad = on;
    }

    /// The gradient accumulated by `backward` since the last `zero_grad`.
    pub fn grad(&self) -> Option<Tensor> {
        self.var.grad()
    }

    pub fn zero_grad(&self) {
        self.var.zero_grad();
    }

    pub fn shape(&self) -> &Shape {
        self.var.tensor().shape()
    }
    pub fn dims(&self) -> &[usize] {
        self.var.tensor().dims()
    }
    pub fn dtype(&self) -> DType {
        self.var.tensor().dtype()
    }
    pub fn device(&self) -> &Device {
        self.var.tensor().device()
    }
    pub fn elem_count(&self) -> usize {
        self.var.tensor().elem_count()
    }

    /// Writes `src` (broadcast to this shape, cast to this dtype) into the parameter's buffer
    /// in place; the address does not change. See `Tensor::copy_` for ordering.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        self.var.tensor().copy_(src)
    }

    /// Moves the parameter to `device`: a new buffer there (addresses captured before a move
    /// are stale, as in PyTorch's `module.to(device)`); the gradient is cleared.
    pub fn to_device(&mut self, device: &Device) -> Result<()> {
        if self.device().same(device) {
            return Ok(());
        }
        let moved = self.var.tensor().detach().to_device(device)?;
        self.var = Var::new(&moved)?;
        Ok(())
    }

    /// Casts the parameter to a float `dtype` (a new buffer; the gradient is cleared).
    pub fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        if self.dtype() == dtype {
            return Ok(());
        }
        if !dtype.is_float() {
            return Err(Error::dtype(
                "Parameter::to_dtype",
                dtype,
                "parameters must be floating point",
            ));
        }
        let cast = ferrite_core::no_grad(|| self.var.tensor().detach().cast(dtype))?;
        self.var = Var::new(&cast)?;
        Ok(())
    }
}

impl std::fmt::Debug for Parameter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Parameter({} {} on {}, requires_grad={})",
            self.shape(),
            self.dtype(),
            self.device(),
            self.requires_grad
        )
    }
}

/// A non-trainable tensor a module keeps and saves in its state dict (`running_mean`,
/// `num_batches_tracked`), written in place like a parameter. Clones share the buffer.
#[derive(Clone)]
pub struct Buffer {
    tensor: Tensor,
}

impl Buffer {
    /// A buffer holding a copy of `value` (any dtype).
    pub fn new(value: &Tensor) -> Result<Buffer> {
        Ok(Buffer {
            tensor: ferrite_core::no_grad(|| value.detach().copy())?,
        })
    }

    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }
    pub fn shape(&self) -> &Shape {
        self.tensor.shape()
    }
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }
    pub fn device(&self) -> &Device {
        self.tensor.device()
    }

    /// Writes `src` into the buffer in place (see `Parameter::copy_`).
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        self.tensor.copy_(src)
    }

    /// Moves the buffer to `device` (a new buffer there).
    pub fn to_device(&mut self, device: &Device) -> Result<()> {
        self.tensor = self.tensor.to_device(device)?;
        Ok(())
    }

    /// Casts a float buffer to a float `dtype`; integer buffers (`num_batches_tracked`) keep
    /// theirs, as in PyTorch's `module.to(dtype)`.
    pub fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        if self.tensor.dtype().is_float() && dtype.is_float() && dtype != self.dtype() {
            self.tensor = ferrite_core::no_grad(|| self.tensor.cast(dtype))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({} {} on {})",
            self.shape(),
            self.dtype(),
            self.device()
        )
    }
}
