//! CUDA's quantized matrices (a [`GpuMatrix`] as a `QTensor`'s storage) and `qmatmul` over
//! them: `matvec`'s products for any number of input rows, f32 inputs or, for `ActFormat::Q8`
//! on the formats with integer kernels, inputs quantized to 8-bit units (`__dp4a`). `Q8x2`
//! runs the f32 inputs here (finer than q8x2; the LLM kernel set's large steps take q8x2 on
//! the int8 tensor cores instead).

use std::any::Any;
use std::sync::Arc;

use ferrite_core::quant::{ActFormat, QBytes, QStorage, QTensor, QType};
use ferrite_core::{DType, Error, Result, Storage, Tensor};

use crate::matvec::{self, Mode, Seg};
use crate::qmatrix::GpuMatrix;
use crate::CudaDevice;

/// A quantized matrix on a CUDA device.
pub struct CudaQMat(GpuMatrix);

impl QStorage for CudaQMat {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CudaQMat {
    pub fn new(m: GpuMatrix) -> CudaQMat {
        CudaQMat(m)
    }

    pub fn matrix(&self) -> &GpuMatrix {
        &self.0
    }

    /// `m` (uploaded from `host`'s GGUF bytes, in any layout) as a `QTensor` on `dev`.
    pub fn qtensor(dev: &CudaDevice, m: GpuMatrix, host: QBytes) -> Result<QTensor> {
        let (ty, rows, cols) = (m.file_type, m.rows, m.cols);
        QTensor::from_storage(&dev.device(), ty, rows, cols, host, Arc::new(CudaQMat(m)))
    }

    /// The CUDA form of `w`; an error naming the op where `w` lives elsewhere.
    pub fn of<'a>(w: &'a QTensor, op: &'static str) -> Result<&'a CudaQMat> {
        w.storage()
            .as_any()
            .downcast_ref::<CudaQMat>()
            .ok_or_else(|| Error::backend(op, format!("{w:?} is not on CUDA")))
    }
}

/// `Backend::upload_quant`: the bytes in GGUF layout (formats without a kernel as f16).
pub fn upload_quant(
    dev: &CudaDevice,
    ty: QType,
    rows: usize,
    cols: usize,
    bytes: &QBytes,
) -> Result<Arc<dyn QStorage>> {
    let m = GpuMatrix::upload(dev, "QTensor", ty, rows, cols, bytes.as_slice())?;
    Ok(Arc::new(CudaQMat(m)))
}

/// `Backend::qmatmul` (validated by `QTensor::qmatmul`: `x` contiguous f32 `[t, cols]`).
pub fn qmatmul(
    dev: &CudaDevice,
    w: &QTensor,
    x: &Tensor,
    act: ActFormat,
) -> Result<Arc<dyn Storage>> {
    const OP: &str = "qmatmul";
    let m = CudaQMat::of(w, OP)?.matrix();
    let (rows, cols) = (m.rows, m.cols);
    let t = x.elem_count().checked_div(cols).unwrap_or(0);
    let out = dev.alloc_bytes((t * rows * 4).max(16), OP)?;
    if t > 0 {
        // The products read their input from byte 0 of a buffer.
        let x = if x.layout().offset() == 0 {
            x.clone()
        } else {
            x.copy()?
        };
        let (xb, _) = dev.buffer_of(&x)?;
        let seg = Seg {
            w: m,
            bias: None,
            out_off: 0,
        };
        let mut l = matvec::plan(dev.sm_count(), &[seg], Mode::Store, &xb, None, &out, None)?
            .with_rows(t, cols * 4, rows * 4)?;
        let scratch;
        if act.for_product(w.ty()) == ActFormat::Q8 {
            scratch = dev.alloc_bytes(matvec::q8_bytes(cols) * t, OP)?;
            // Unchanged (f32 inputs) for a format without an 8-bit kernel on CUDA.
            l = l.with_q8(dev.sm_count(), &scratch)?;
        }
        l.enqueue(dev)?;
        // The input copy and the scratch go back to the allocator at return.
        dev.synchronize()?;
    }
    let y = dev.tensor(&out, 0, &[t * rows], DType::F32)?;
    Ok(y.storage_arc().clone())
}
