//! The CPU's quantized matrices and `qmatmul` over them: the matrix is its host bytes in GGUF
//! layout (a mapped file's, not copied) plus, on AVX-512, a packed copy of its whole 16-row
//! groups made at the first product ([`crate::quant::packed`], in the process's
//! [`Arena`]); the products are [`crate::quant::matmul`].

use std::any::Any;
use std::sync::{Arc, OnceLock};

use ferrite_core::quant::{check_matrix, ActFormat, QBytes, QStorage, QTensor, QType};
use ferrite_core::{Error, HostBuffer, Result, Storage, Tensor};

use crate::quant::arena::{Arena, Piece};
use crate::quant::{self, packed, Acts, Isa, MatOut, QMat};
use crate::storage::{contig, guards, CpuStorage};

/// A quantized matrix on the CPU.
pub struct CpuQMat {
    ty: QType,
    rows: usize,
    cols: usize,
    bytes: QBytes,
    /// The packed copy: unset until the first product on AVX-512, then the copy or `None`
    /// where the format has no packed form or memory could not be had.
    packed: OnceLock<Option<Piece>>,
}

impl QStorage for CpuQMat {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CpuQMat {
    /// `bytes` as a `rows x cols` matrix of `ty` (checked: the bytes the shape needs).
    pub fn new(ty: QType, rows: usize, cols: usize, bytes: QBytes) -> Result<CpuQMat> {
        check_matrix("CpuQMat::new", ty, rows, cols, bytes.byte_len())?;
        Ok(CpuQMat {
            ty,
            rows,
            cols,
            bytes,
            packed: OnceLock::new(),
        })
    }

    /// The CPU form of `w`; an error naming the op where `w` lives elsewhere.
    pub fn of<'a>(w: &'a QTensor, op: &'static str) -> Result<&'a CpuQMat> {
        w.storage()
            .as_any()
            .downcast_ref::<CpuQMat>()
            .ok_or_else(|| Error::backend(op, format!("{w:?} is not on the CPU")))
    }

    /// The matrix in GGUF layout alone.
    pub fn qmat(&self) -> QMat<'_> {
        // Cannot fail: the shape and bytes were checked in `new`.
        QMat::new(self.ty, self.rows, self.cols, self.bytes.as_slice())
            .unwrap_or_else(|e| unreachable!("CpuQMat checked at construction: {e}"))
    }

    /// The matrix for a product on `isa`: with its packed copy on AVX-512 (made by the first
    /// call; once every row is in the copy the host bytes are released, see
    /// [`QBytes::release`]).
    pub fn product_qmat(&self, isa: Isa) -> QMat<'_> {
        let q = self.qmat();
        if isa < Isa::Avx512 {
            return q;
        }
        let packed = self.packed.get_or_init(|| {
            let n = packed::packed_len(q.ty, q.rows, q.cols)?;
            let piece = Arena::global().alloc(n, |out| {
                packed::pack_into(q.ty, q.rows, q.cols, q.data, out)
            })?;
            if q.rows.is_multiple_of(packed::ROWS) {
                self.bytes.release();
            }
            Some(piece)
        });
        match packed {
            Some(p) => q.with_packed(p.as_slice()),
            None => q,
        }
    }
}

/// `x @ w^T` (validated by `QTensor::qmatmul`): one pass of [`quant::matmul`].
pub fn qmatmul(w: &QTensor, x: &Tensor, act: ActFormat) -> Result<Arc<dyn Storage>> {
    const OP: &str = "qmatmul";
    let m = CpuQMat::of(w, OP)?;
    let _guards = guards(&[x]);
    let xs = contig::<f32>(x, OP)?;
    let (rows, cols) = (w.rows(), w.cols());
    let t = xs.len().checked_div(cols).unwrap_or(0);
    let mut out = vec![0f32; t * rows];
    if t > 0 && rows > 0 {
        let isa = Isa::cached();
        let mut acts = Acts::default();
        acts.quantize(&xs, t, cols, &[act.for_product(w.ty())]);
        quant::matmul(
            isa,
            &acts,
            &mut [MatOut {
                w: m.product_qmat(isa),
                out: &mut out,
            }],
        );
    }
    Ok(Arc::new(CpuStorage::new(HostBuffer::F32(out))))
}
