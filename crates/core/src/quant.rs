//! Quantized matrices: a `rows x cols` weight kept in its GGUF block format on its device
//! (never dequantized in memory), and the products over it, `qmatmul` / `qmatvec`.
//!
//! Layout: row `r` is `cols` contiguous elements, `cols / block_size` blocks of the format
//! (ggml's layout, the file's bytes). A product computes `y[t][r] = dot(W[r], x[t])`, the
//! `Linear` convention (`x @ W^T`), with the activations in the [`ActFormat`] asked for.
//! The block formats themselves (sizes, reference dequantization) are `ferrite_gguf`'s.

use std::any::Any;
use std::sync::Arc;

pub use ferrite_gguf::GgmlType as QType;

use crate::{DType, Device, Error, Layout, Result, Tensor};

/// How a quantized product takes its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActFormat {
    /// 8-bit blocks of 32 with one scale each (llama.cpp's scheme).
    Q8,
    /// 8 bits plus the 8-bit rounding residual in steps of 1/256 of the first (~16 bits).
    Q8x2,
    /// f32 activations against the dequantized weights: the reference.
    F32,
}

impl ActFormat {
    /// The format a weight of `ty` multiplies with when 8-bit activations are asked for:
    /// `Q8` for the formats with integer kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K),
    /// else `F32`.
    pub fn for_weight(ty: QType) -> ActFormat {
        match ty {
            QType::Q4_0
            | QType::Q4_1
            | QType::Q5_0
            | QType::Q5_1
            | QType::Q8_0
            | QType::Q4_K
            | QType::Q6_K => ActFormat::Q8,
            _ => ActFormat::F32,
        }
    }

    /// What a product over a weight of `ty` runs when `self` is asked for: `self` where the
    /// weight has integer kernels, else `F32`.
    pub fn for_product(self, ty: QType) -> ActFormat {
        match ActFormat::for_weight(ty) {
            ActFormat::F32 => ActFormat::F32,
            _ => self,
        }
    }
}

/// Whether a matrix may be of this type: every block format and float type that GGUF files
/// hold weights in, except the activation-only Q8_1 and Q8_K.
pub fn is_supported(ty: QType) -> bool {
    ty.is_supported() && ty != QType::Q8_1 && ty != QType::Q8_K
}

/// The host bytes of one quantized matrix, owned elsewhere (a mapped file, a buffer) and
/// shared: a matrix on the host borrows them without a copy and keeps the owner alive.
pub trait HostBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
    /// How many bytes [`HostBytes::bytes`] holds, without building them where they are built
    /// at the first read.
    fn byte_len(&self) -> usize {
        self.bytes().len()
    }
    /// A hint that no product reads these bytes again soon (the CPU keeps them in another
    /// layout): a mapped file may drop its resident pages. They must read back the same.
    fn release(&self) {}
}

impl HostBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A shared handle to a matrix's host bytes; cheap to clone.
#[derive(Clone)]
pub struct QBytes(Arc<dyn HostBytes>);

impl QBytes {
    pub fn new(owner: Arc<dyn HostBytes>) -> QBytes {
        QBytes(owner)
    }

    /// Owned bytes.
    pub fn from_vec(bytes: Vec<u8>) -> QBytes {
        QBytes(Arc::new(bytes))
    }

    /// Rows of `parts` (matrices of `row_bytes`-byte rows) as one matrix's bytes, in `order`,
    /// built at the first read: a backend that joins matrices on the device (q, k and v
    /// stacked; gate and up interleaved) keeps no second host copy until one is asked for.
    /// `Interleaved` takes parts of equal row counts.
    pub fn join(parts: Vec<QBytes>, row_bytes: usize, order: RowOrder) -> QBytes {
        let len = parts.iter().map(QBytes::byte_len).sum();
        QBytes(Arc::new(Joined {
            parts,
            row_bytes,
            order,
            len,
            built: std::sync::OnceLock::new(),
        }))
    }

    pub fn as_slice(&self) -> &[u8] {
        self.0.bytes()
    }

    /// The length of [`QBytes::as_slice`] (not building bytes that are built lazily).
    pub fn byte_len(&self) -> usize {
        self.0.byte_len()
    }

    /// See [`HostBytes::release`].
    pub fn release(&self) {
        self.0.release()
    }
}

impl std::fmt::Debug for QBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QBytes({} bytes)", self.as_slice().len())
    }
}

/// How [`QBytes::join`] and [`join_rows`] order the rows of several matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    /// All rows of the first part, then all of the second, ...
    Stacked,
    /// Row 0 of each part in turn, then row 1 of each, ...
    Interleaved,
}

/// The rows of `parts` (`row_bytes` bytes each) as one matrix's bytes, in `order`.
pub fn join_rows(parts: &[&[u8]], row_bytes: usize, order: RowOrder) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    match order {
        RowOrder::Stacked => parts.iter().for_each(|p| out.extend_from_slice(p)),
        RowOrder::Interleaved => {
            let rows = parts.first().map_or(0, |p| p.len() / row_bytes.max(1));
            for r in 0..rows {
                for p in parts {
                    out.extend_from_slice(&p[r * row_bytes..(r + 1) * row_bytes]);
                }
            }
        }
    }
    out
}

struct Joined {
    parts: Vec<QBytes>,
    row_bytes: usize,
    order: RowOrder,
    len: usize,
    built: std::sync::OnceLock<Vec<u8>>,
}

impl HostBytes for Joined {
    fn bytes(&self) -> &[u8] {
        self.built.get_or_init(|| {
            let parts: Vec<&[u8]> = self.parts.iter().map(QBytes::as_slice).collect();
            join_rows(&parts, self.row_bytes, self.order)
        })
    }
    fn byte_len(&self) -> usize {
        self.len
    }
}

/// A backend's form of a quantized matrix (the backend downcasts through `as_any`).
pub trait QStorage: Any + Send + Sync {
    fn as_any(&self) -> &dyn Any;
}

struct Inner {
    ty: QType,
    rows: usize,
    cols: usize,
    host: QBytes,
    storage: Arc<dyn QStorage>,
    device: Device,
}

/// A quantized `rows x cols` matrix on a device; cheap to clone. It keeps its host bytes'
/// owner (for a mapped file, the mapping: no copy) so that it can move to another device.
#[derive(Clone)]
pub struct QTensor(Arc<Inner>);

impl std::fmt::Debug for QTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QTensor({}x{} {} on {})",
            self.0.rows, self.0.cols, self.0.ty, self.0.device
        )
    }
}

/// The bytes `rows x cols` elements of `ty` take; an error naming the op where the type is
/// not a matrix format, `cols` is not whole blocks or the size overflows.
pub fn matrix_bytes(op: &'static str, ty: QType, rows: usize, cols: usize) -> Result<usize> {
    if !is_supported(ty) {
        return Err(Error::Backend {
            op,
            msg: format!("{ty} is not a matrix format"),
        });
    }
    let bs = ty.block_size();
    if !cols.is_multiple_of(bs) {
        return Err(Error::Backend {
            op,
            msg: format!("row length {cols} is not a multiple of the {ty} block size {bs}"),
        });
    }
    (cols / bs)
        .checked_mul(ty.type_size())
        .and_then(|r| r.checked_mul(rows))
        .ok_or_else(|| Error::Backend {
            op,
            msg: format!("{rows}x{cols} {ty} overflows the address space"),
        })
}

/// Checks that `len` bytes are exactly a `rows x cols` matrix of `ty` (see [`matrix_bytes`]).
pub fn check_matrix(
    op: &'static str,
    ty: QType,
    rows: usize,
    cols: usize,
    len: usize,
) -> Result<()> {
    let need = matrix_bytes(op, ty, rows, cols)?;
    if len != need {
        return Err(Error::Backend {
            op,
            msg: format!("{rows}x{cols} {ty} needs {need} bytes, found {len}"),
        });
    }
    Ok(())
}

impl QTensor {
    /// `bytes` as a `rows x cols` matrix of `ty` on `device`: checked (a matrix format,
    /// whole blocks a row, exactly the bytes the shape needs), then the backend's
    /// `upload_quant` (the CPU wraps the bytes; a GPU copies them to its memory).
    pub fn new(
        device: &Device,
        ty: QType,
        rows: usize,
        cols: usize,
        bytes: QBytes,
    ) -> Result<QTensor> {
        check_matrix("QTensor::new", ty, rows, cols, bytes.byte_len())?;
        let storage = device.backend().upload_quant(ty, rows, cols, &bytes)?;
        Ok(QTensor(Arc::new(Inner {
            ty,
            rows,
            cols,
            host: bytes,
            storage,
            device: device.clone(),
        })))
    }

    /// A matrix whose device form a backend made itself (a layout of its choosing, e.g. the
    /// CUDA kernel set's split rows), over `host`'s bytes in GGUF layout (checked as in
    /// [`QTensor::new`]).
    pub fn from_storage(
        device: &Device,
        ty: QType,
        rows: usize,
        cols: usize,
        host: QBytes,
        storage: Arc<dyn QStorage>,
    ) -> Result<QTensor> {
        check_matrix("QTensor::from_storage", ty, rows, cols, host.byte_len())?;
        Ok(QTensor(Arc::new(Inner {
            ty,
            rows,
            cols,
            host,
            storage,
            device: device.clone(),
        })))
    }

    /// This matrix on `device` (the same matrix where it is there already).
    pub fn to_device(&self, device: &Device) -> Result<QTensor> {
        if self.0.device.same(device) {
            return Ok(self.clone());
        }
        QTensor::new(
            device,
            self.0.ty,
            self.0.rows,
            self.0.cols,
            self.0.host.clone(),
        )
    }

    pub fn ty(&self) -> QType {
        self.0.ty
    }
    pub fn rows(&self) -> usize {
        self.0.rows
    }
    pub fn cols(&self) -> usize {
        self.0.cols
    }
    pub fn device(&self) -> &Device {
        &self.0.device
    }
    /// The backend's storage (for the backend and its fused kernels).
    pub fn storage(&self) -> &dyn QStorage {
        &*self.0.storage
    }
    /// The matrix's bytes in GGUF layout, on the host.
    pub fn host_bytes(&self) -> &[u8] {
        self.0.host.as_slice()
    }
    /// `x @ W^T`: `x` is f32 `[..., cols]` on this matrix's device; the result is f32
    /// `[..., rows]`, each row's activations taken in `act` (for the weight formats without
    /// integer kernels always f32: [`ActFormat::for_product`]). Not differentiable: an `x`
    /// that requires a gradient is an error.
    pub fn qmatmul(&self, x: &Tensor, act: ActFormat) -> Result<Tensor> {
        const OP: &str = "qmatmul";
        if !x.device().same(&self.0.device) {
            return Err(Error::DeviceMismatch {
                op: OP,
                lhs: self.0.device.to_string(),
                rhs: x.device().to_string(),
            });
        }
        if x.dtype() != DType::F32 {
            return Err(Error::DType {
                op: OP,
                found: x.dtype(),
                msg: "activations must be f32".into(),
            });
        }
        if x.requires_grad() {
            return Err(Error::Backend {
                op: OP,
                msg: "quantized products are not differentiable; detach the input".into(),
            });
        }
        let dims = x.dims();
        if dims.last() != Some(&self.0.cols) {
            return Err(Error::Shape {
                op: OP,
                msg: format!(
                    "input {:?} does not end in the matrix's {} columns ({}x{} {})",
                    dims, self.0.cols, self.0.rows, self.0.cols, self.0.ty
                ),
            });
        }
        let x = x.contiguous()?;
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("rank checked above") = self.0.rows;
        let storage = self.0.device.backend().qmatmul(self, &x, act)?;
        Ok(Tensor::from_storage(
            storage,
            Layout::contiguous(out_dims),
            self.0.device.clone(),
        ))
    }

    /// `W x` for one vector `x` of `cols` values: `[rows]`.
    pub fn qmatvec(&self, x: &Tensor, act: ActFormat) -> Result<Tensor> {
        if x.rank() != 1 {
            return Err(Error::Shape {
                op: "qmatvec",
                msg: format!("input {:?} is not a vector", x.dims()),
            });
        }
        self.qmatmul(x, act)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts reads of its bytes (a joined matrix must not build them to learn its length).
    struct Counted(Vec<u8>, std::sync::atomic::AtomicUsize);

    impl HostBytes for Counted {
        fn bytes(&self) -> &[u8] {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            &self.0
        }
        fn byte_len(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn joined_rows_are_stacked_or_interleaved_and_built_at_the_first_read() {
        let a = Arc::new(Counted(vec![1, 2, 3, 4], Default::default()));
        let b = QBytes::from_vec(vec![5, 6, 7, 8]);
        let parts = vec![QBytes::new(a.clone()), b];
        let stacked = QBytes::join(parts.clone(), 2, RowOrder::Stacked);
        let inter = QBytes::join(parts, 2, RowOrder::Interleaved);
        assert_eq!((stacked.byte_len(), inter.byte_len()), (8, 8));
        let reads = || a.1.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(reads(), 0);
        assert_eq!(stacked.as_slice(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(inter.as_slice(), [1, 2, 5, 6, 3, 4, 7, 8]);
        assert_eq!(reads(), 2);
        // Built once.
        assert_eq!(inter.as_slice(), [1, 2, 5, 6, 3, 4, 7, 8]);
        assert_eq!(reads(), 2);
        // A matrix over joined bytes is checked by their length alone.
        check_matrix("test", QType::F32, 2, 1, stacked.byte_len()).unwrap();
        let e = check_matrix("test", QType::F32, 3, 1, 8)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "test: 3x1 F32 needs 12 bytes, found 8");
    }
}
