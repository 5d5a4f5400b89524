//! `Op::Matmul` and `Op::MatmulBias` (the bias in the epilogue) through cuBLASLt: f32 (TF32
//! when opted in), f16, bf16 (f32 accumulate; f32 output on request), f64;
//! batched with one stride per operand (stride 0 for a broadcast batch), transposed views
//! passed as transposes, never copied. Operands whose batch dims do not fold into one stride,
//! or whose matrix has no unit stride, are copied contiguous first.
//!
//! cuBLASLt is column-major: the row-major product C[m, n] = A[m, k] B[k, n] is computed as
//! C^T[n, m] = B^T[n, k] A^T[k, m], with a row-major matrix read as its column-major transpose.

use crate::alloc::Block;
use crate::device::CudaBackend;
use crate::storage::CudaStorage;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as lts;
use ferrite_core::{DType, Error, Layout, Result, Shape, Storage, Tensor};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

const WORKSPACE: usize = 32 << 20;

/// Products with at most this many outputs (all batches) and a depth of at most
/// [`SHORT_K`] get no workspace, so cuBLASLt picks no split-K algorithm for them: at such
/// sizes the split's separate reduction kernel costs more than the split saves (a small
/// model's step: 2 of 30 launches).
const SMALL_OUT: usize = 1 << 16;
const SHORT_K: usize = 256;

/// The workspace offered to cuBLASLt for a `batch` x [m, k] x [k, n] product.
fn workspace_for(batch: usize, m: usize, n: usize, k: usize) -> usize {
    match batch * m * n <= SMALL_OUT && k <= SHORT_K {
        true => 0,
        false => WORKSPACE,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    dtype: DType,
    tf32: bool,
    /// (rows, cols, ld, batch stride) of cuBLAS's A, B and D; transposes; batch; alignments.
    a: (u64, u64, i64, i64),
    b: (u64, u64, i64, i64),
    ta: bool,
    tb: bool,
    batch: i32,
    align: [u32; 3],
    /// f32 output from f16/bf16 operands (`gemm_nt_f32`, `Op::Matmul` under autocast).
    out32: bool,
    /// The bias epilogue (`Op::MatmulBias`), and its residual as C (beta 1).
    bias: bool,
    acc: bool,
    gelu: Gelu,
}

/// The tanh GELU in the epilogue (`Op::MatmulBiasGelu`, `Op::MatmulGeluBackward`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Gelu {
    No,
    /// GELU_AUX_BIAS: D = gelu(p), the auxiliary output p (a bias is given).
    Forward,
    /// DGELU: D = gelu'(aux) (a b), aux the GELU's input.
    Backward,
}

pub(crate) struct Blas {
    handle: lts::cublasLtHandle_t,
    workspace: Arc<Block>,
    algos: HashMap<Key, lts::cublasLtMatmulAlgo_t>,
    /// Problems cuBLASLt has no algorithm for (an epilogue it lacks), asked once.
    missing: std::collections::HashSet<Key>,
}

unsafe impl Send for Blas {}

impl Blas {
    /// The device's handle, created at first use.
    fn get<'a>(
        dev: &CudaBackend,
        slot: &'a mut Option<Blas>,
        op: &'static str,
    ) -> Result<&'a mut Blas> {
        if slot.is_none() {
            *slot = Some(Blas::new(dev)?);
        }
        slot.as_mut()
            .ok_or_else(|| Error::backend(op, "no cuBLASLt handle"))
    }

    /// cuBLASLt's first heuristic pick for this problem given `workspace` bytes (from
    /// [`workspace_for`]: 0 or [`WORKSPACE`]; operand alignments from `key`), cached per key.
    ///
    /// # Safety
    /// The descriptors must be valid and describe the problem `key` stands for.
    unsafe fn algo(
        &mut self,
        key: Key,
        desc: lts::cublasLtMatmulDesc_t,
        la: lts::cublasLtMatrixLayout_t,
        lb: lts::cublasLtMatrixLayout_t,
        ld: lts::cublasLtMatrixLayout_t,
        workspace: usize,
    ) -> std::result::Result<lts::cublasLtMatmulAlgo_t, cudarc::cublaslt::result::CublasError> {
        if let Some(a) = self.algos.get(&key) {
            return Ok(*a);
        }
        if self.missing.contains(&key) {
            return Err(cudarc::cublaslt::result::CublasError(
                lts::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
            ));
        }
        // SAFETY: the preference is created and destroyed here; the caller vouches for the
        // descriptors; attribute buffers live across each call.
        unsafe {
            let pref = lt::create_matmul_pref()?;
            let ws = workspace as u64;
            use lts::cublasLtMatmulPreferenceAttributes_t as P;
            let mut r = lt::set_matmul_pref_attribute(
                pref,
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            );
            for (attr, al) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]),
            ] {
                r = r.and_then(|()| {
                    lt::set_matmul_pref_attribute(pref, attr, &al as *const u32 as *const c_void, 4)
                });
            }
            let h = r.and_then(|()| {
                lt::get_matmul_algo_heuristic(self.handle, desc, la, lb, ld, ld, pref)
            });
            let _ = lt::destroy_matmul_pref(pref);
            if h.is_err() {
                self.missing.insert(key);
            }
            let algo = h?.algo;
            self.algos.insert(key, algo);
            Ok(algo)
        }
    }
}

/// Sets attribute `attr` of the matmul descriptor `desc` to `v`.
///
/// # Safety
/// `desc` must be live and `T` the type cuBLASLt gives `attr`.
unsafe fn set_attr<T>(
    desc: lts::cublasLtMatmulDesc_t,
    attr: lts::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: `v` lives across the call and is `size_of::<T>()` bytes; the caller vouches
    // for `desc` and the type.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(lt_err)
}

/// cuBLAS's name for a float dtype (callers pass f32, f16, bf16 or f64).
fn dtype_of(dt: DType) -> lts::cudaDataType {
    match dt {
        DType::F16 => lts::cudaDataType::CUDA_R_16F,
        DType::BF16 => lts::cudaDataType::CUDA_R_16BF,
        DType::F64 => lts::cudaDataType::CUDA_R_64F,
        _ => lts::cudaDataType::CUDA_R_32F,
    }
}

fn lt_err(e: cudarc::cublaslt::result::CublasError) -> Error {
    Error::backend("matmul", format!("cuBLASLt error {:?}", e.0))
}

impl Blas {
    fn new(dev: &CudaBackend) -> Result<Blas> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { lts::is_culib_present() } {
            return Err(Error::backend(
                "matmul",
                "the cuBLASLt library (libcublasLt.so) is not installed",
            ));
        }
        Ok(Blas {
            handle: lt::create_handle().map_err(lt_err)?,
            workspace: dev.alloc.alloc(WORKSPACE, "matmul")?,
            algos: HashMap::new(),
            missing: Default::default(),
        })
    }
}

/// One operand as a column-major cuBLAS matrix: (rows, cols, ld, transposed).
/// `r x c` is the row-major matrix with strides (sr, sc).
fn as_colmajor(r: usize, c: usize, sr: usize, sc: usize) -> Option<(u64, u64, i64, bool)> {
    let sc = if c == 1 { 1 } else { sc };
    let sr = if r == 1 { c.max(1) } else { sr };
    if sc == 1 && sr >= c.max(1) {
        // Row-major rows: the column-major c x r matrix with leading dim sr, untransposed.
        Some((c as u64, r as u64, sr as i64, false))
    } else if sr == 1 && sc >= r.max(1) {
        // Column-major storage: the column-major r x c matrix, used transposed.
        Some((r as u64, c as u64, sc as i64, true))
    } else {
        None
    }
}

/// The single batch stride of a tensor's leading dims, if they fold into one.
fn batch_stride(dims: &[usize], strides: &[usize]) -> Option<i64> {
    let nb = dims.len().saturating_sub(2);
    let live: Vec<(usize, usize)> = (0..nb)
        .filter(|&i| dims[i] > 1)
        .map(|i| (dims[i], strides[i]))
        .collect();
    for w in live.windows(2) {
        if w[0].1 != w[1].1 * w[1].0 {
            return None;
        }
    }
    Some(live.last().map(|&(_, s)| s as i64).unwrap_or(0))
}

struct Operand {
    ptr: u64,
    mat: (u64, u64, i64, bool),
    bstride: i64,
    _keep: Option<Arc<dyn Storage>>,
}

fn operand(dev: &CudaBackend, t: &Tensor, op: &'static str) -> Result<Operand> {
    let s = dev.input(t, op)?;
    let dims = t.dims();
    let st = t.layout().strides();
    let r = dims.len();
    let (rows, cols) = (dims[r - 2], dims[r - 1]);
    if let (Some(mat), Some(bstride)) = (
        as_colmajor(rows, cols, st[r - 2], st[r - 1]),
        batch_stride(dims, st),
    ) {
        return Ok(Operand {
            ptr: CudaBackend::ptr(t, s),
            mat,
            bstride,
            _keep: None,
        });
    }
    // Copy to contiguous: rows of `cols`, batches of rows * cols.
    let c = crate::elementwise::copy_into(dev, s, t.layout(), op)?;
    let keep = dev
        .finish_one(c)?
        .pop()
        .ok_or_else(|| Error::backend(op, "copy produced no output"))?;
    let ptr = keep
        .as_any()
        .downcast_ref::<CudaStorage>()
        .map(|c| c.device_ptr())
        .unwrap_or(0);
    let lay = Layout::contiguous(t.shape().clone());
    let cst = lay.strides();
    Ok(Operand {
        ptr,
        mat: as_colmajor(rows, cols, cst[r - 2], cst[r - 1])
            .ok_or_else(|| Error::backend(op, "contiguous operand rejected"))?,
        bstride: (rows * cols) as i64,
        _keep: Some(keep),
    })
}

fn align_of(ptr: u64) -> u32 {
    if ptr == 0 {
        return 256;
    }
    (1u64 << ptr.trailing_zeros().min(8)) as u32
}

/// `Op::Matmul` (`bias` None) and `Op::MatmulBias` (2-D operands; the bias in cuBLASLt's
/// epilogue and `acc`, the residual [m, n], as its C with beta 1: both added in f32 before
/// the output's rounding): output dtype `out_dt`, a's or f32 from f16/bf16 operands.
pub(crate) fn matmul(
    dev: &CudaBackend,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    acc: Option<&Tensor>,
    out_shape: &Shape,
    out_dt: DType,
) -> Result<Vec<Arc<dyn Storage>>> {
    lt_matmul(dev, a, b, bias, acc, None, out_shape, out_dt)?
        .ok_or_else(|| Error::backend("matmul", "cuBLASLt has no algorithm"))
}

/// `matmul` with the tanh GELU's epilogues: `Gelu::Forward` with `bias` returns (gelu(p),
/// p); `Gelu::Backward` with `aux`, the GELU's input (contiguous [m, n], aligned, n a
/// multiple of 8), returns gelu'(aux) (a b). The caller checks what cuBLASLt supports
/// (`gelu_epilogue`); `None` where cuBLASLt has no algorithm for a GELU epilogue.
#[allow(clippy::too_many_arguments)]
fn lt_matmul(
    dev: &CudaBackend,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    acc: Option<&Tensor>,
    gelu: Option<(Gelu, Option<&Tensor>)>,
    out_shape: &Shape,
    out_dt: DType,
) -> Result<Option<Vec<Arc<dyn Storage>>>> {
    let (gelu, aux) = gelu.unwrap_or((Gelu::No, None));
    let op = match (gelu, bias.is_some()) {
        (Gelu::Forward, _) => "matmul_bias_gelu",
        (Gelu::Backward, _) => "matmul_gelu_backward",
        (Gelu::No, true) => "matmul_bias",
        (Gelu::No, false) => "matmul",
    };
    // Dtypes and the bias's shape as the ops state them (checked by `Tensor`).
    let dt = a.dtype();
    let out32 = out_dt != dt;
    let (data_t, compute, scale_t) = match dt {
        DType::F32 => (
            lts::cudaDataType::CUDA_R_32F,
            if dev.tf32.load(std::sync::atomic::Ordering::Relaxed) {
                lts::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
            } else {
                lts::cublasComputeType_t::CUBLAS_COMPUTE_32F
            },
            lts::cudaDataType::CUDA_R_32F,
        ),
        DType::F16 => (
            lts::cudaDataType::CUDA_R_16F,
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lts::cudaDataType::CUDA_R_32F,
        ),
        DType::BF16 => (
            lts::cudaDataType::CUDA_R_16BF,
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lts::cudaDataType::CUDA_R_32F,
        ),
        DType::F64 => (
            lts::cudaDataType::CUDA_R_64F,
            lts::cublasComputeType_t::CUBLAS_COMPUTE_64F,
            lts::cudaDataType::CUDA_R_64F,
        ),
        other => return Err(Error::dtype(op, other, "needs a float dtype")),
    };
    let od = out_shape.dims();
    let r = od.len();
    let (m, n) = (od[r - 2], od[r - 1]);
    let k = a.dims()[a.dims().len() - 1];
    let batch: usize = od[..r - 2].iter().product();
    let total = out_shape.elem_count();
    if (k == 0 || total == 0) && gelu != Gelu::No {
        return Ok(None);
    }
    if k == 0 || total == 0 {
        // An empty sum: zeros, plus the bias on every row.
        let zeros = crate::create::fill(dev, 0.0, &(out_shape.clone(), out_dt))?;
        return match bias {
            Some(bias) if total > 0 => {
                let z = Tensor::from_storage(
                    zeros
                        .into_iter()
                        .next()
                        .ok_or_else(|| Error::backend(op, "no output"))?,
                    Layout::contiguous(out_shape.clone()),
                    a.device().clone(),
                );
                let row = bias.broadcast_to(out_shape.clone())?;
                crate::elementwise::binary(dev, ferrite_core::BinaryOp::Add, &z, &row)
            }
            _ => Ok(zeros),
        }
        .map(Some);
    }
    let out = dev.alloc_out(total, out_dt, op)?;
    // The GELU's auxiliary matrix: written (forward) or read (backward), [m, n] packed.
    let aux_out = match gelu {
        Gelu::Forward => Some(dev.alloc_out(total, out_dt, op)?),
        _ => None,
    };
    let aux_ptr = match (&aux_out, aux) {
        (Some(o), _) => Some(o.ptr()),
        (None, Some(x)) => Some(CudaBackend::ptr(x, dev.input(x, op)?)),
        (None, None) => None,
    };
    let oa = operand(dev, a, op)?;
    let ob = operand(dev, b, op)?;
    // The bias as a packed, 16-byte aligned vector (a strided or offset view is copied).
    let mut _bias_copy = None;
    let bias_in = match bias {
        Some(t) => {
            let s = dev.input(t, op)?;
            let st = t.layout().strides();
            let p = CudaBackend::ptr(t, s);
            if (t.elem_count() > 1 && st[st.len() - 1] != 1) || align_of(p) < 16 {
                let c = crate::elementwise::copy_into(dev, s, t.layout(), op)?;
                let p = c.ptr();
                _bias_copy = Some(c);
                Some(p)
            } else {
                Some(p)
            }
        }
        None => None,
    };
    // The residual as C: packed rows like D (a strided view is copied).
    let mut _acc_copy = None;
    let acc_in = match acc {
        Some(t) => {
            let s = dev.input(t, op)?;
            match t.layout().is_contiguous() {
                true => Some(CudaBackend::ptr(t, s)),
                false => {
                    let c = crate::elementwise::copy_into(dev, s, t.layout(), op)?;
                    let p = c.ptr();
                    _acc_copy = Some(c);
                    Some(p)
                }
            }
        }
        None => None,
    };
    let c_ptr = acc_in.unwrap_or(out.ptr());
    let tf32 = compute == lts::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32;
    // cuBLAS's A is our B, its B our A.
    let key = Key {
        dtype: dt,
        tf32,
        a: (ob.mat.0, ob.mat.1, ob.mat.2, ob.bstride),
        b: (oa.mat.0, oa.mat.1, oa.mat.2, oa.bstride),
        ta: ob.mat.3,
        tb: oa.mat.3,
        batch: batch as i32,
        align: [
            align_of(ob.ptr),
            align_of(oa.ptr),
            align_of(out.ptr()).min(align_of(c_ptr)),
        ],
        out32,
        bias: bias_in.is_some(),
        acc: acc_in.is_some(),
        gelu,
    };
    let mut guard = dev.blas.lock().unwrap_or_else(|p| p.into_inner());
    let blas = Blas::get(dev, &mut guard, op)?;
    // SAFETY: descriptors are created and destroyed here; pointers reference live device
    // buffers ordered on the compute stream; alpha/beta live across the call.
    unsafe {
        let desc = lt::create_matmul_desc(compute, scale_t).map_err(lt_err)?;
        use lts::cublasLtMatmulDescAttributes_t as D;
        set_attr(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &(key.ta as i32))?;
        set_attr(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &(key.tb as i32))?;
        let layout = |ty: lts::cudaDataType,
                      (rows, cols, ld, bs): (u64, u64, i64, i64)|
         -> Result<lts::cublasLtMatrixLayout_t> {
            let l = lt::create_matrix_layout(ty, rows, cols, ld).map_err(lt_err)?;
            if batch > 1 {
                let c = batch as i32;
                lt::set_matrix_layout_attribute(
                    l,
                    lts::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &c as *const i32 as *const c_void,
                    4,
                )
                .map_err(lt_err)?;
                lt::set_matrix_layout_attribute(
                    l,
                    lts::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &bs as *const i64 as *const c_void,
                    8,
                )
                .map_err(lt_err)?;
            }
            Ok(l)
        };
        use lts::cublasLtEpilogue_t as E;
        let epi = match (gelu, bias_in.is_some()) {
            (Gelu::Forward, _) => Some(E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS),
            (Gelu::Backward, _) => Some(E::CUBLASLT_EPILOGUE_DGELU),
            (Gelu::No, true) => Some(E::CUBLASLT_EPILOGUE_BIAS),
            (Gelu::No, false) => None,
        };
        if let Some(epi) = epi {
            set_attr(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
        }
        let bt = dtype_of(out_dt);
        if let Some(bp) = bias_in {
            // Row-major [m, n] is cuBLAS's column-major n x m: a bias over n is one per row
            // of D, which is what the BIAS epilogue broadcasts (over columns and batches).
            set_attr(desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp)?;
            set_attr(desc, D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt)?;
        }
        if let Some(xp) = aux_ptr {
            // The auxiliary matrix is laid out as D: column-major n x m, leading dim n.
            set_attr(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &xp)?;
            set_attr(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(n as i64))?;
            set_attr(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &bt)?;
        }
        let la = layout(data_t, key.a)?;
        let lb = layout(data_t, key.b)?;
        let ld = layout(
            dtype_of(out_dt),
            (n as u64, m as u64, n as i64, (m * n) as i64),
        )?;
        let algo = match blas.algo(key, desc, la, lb, ld, workspace_for(batch, m, n, k)) {
            Ok(algo) => algo,
            Err(e) => {
                let _ = lt::destroy_matrix_layout(la);
                let _ = lt::destroy_matrix_layout(lb);
                let _ = lt::destroy_matrix_layout(ld);
                let _ = lt::destroy_matmul_desc(desc);
                if gelu != Gelu::No {
                    return Ok(None);
                }
                return Err(Error::backend(
                    op,
                    format!(
                        "cuBLASLt has no algorithm for {dt} [{batch}] {m}x{k} x {k}x{n}: {:?}",
                        e.0
                    ),
                ));
            }
        };
        let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
        let (beta32, beta64) = match acc_in {
            Some(_) => (one32, one64),
            None => (zero32, zero64),
        };
        let (alpha, beta): (*const c_void, *const c_void) = if dt == DType::F64 {
            (&one64 as *const f64 as _, &beta64 as *const f64 as _)
        } else {
            (&one32 as *const f32 as _, &beta32 as *const f32 as _)
        };
        let r = lt::matmul(
            blas.handle,
            desc,
            alpha,
            beta,
            ob.ptr as *const c_void,
            la,
            oa.ptr as *const c_void,
            lb,
            c_ptr as *const c_void,
            ld,
            out.ptr() as *mut c_void,
            ld,
            &algo,
            blas.workspace.ptr as *mut c_void,
            WORKSPACE,
            dev.compute.0 as lts::cudaStream_t,
        );
        let _ = lt::destroy_matrix_layout(la);
        let _ = lt::destroy_matrix_layout(lb);
        let _ = lt::destroy_matrix_layout(ld);
        let _ = lt::destroy_matmul_desc(desc);
        r.map_err(lt_err)?;
    }
    drop(guard);
    match aux_out {
        Some(p) => dev.finish(vec![out, p]),
        None => dev.finish_one(out),
    }
    .map(Some)
}

/// D[m, n] = A[m, k] B[n, k]^T (+ D when `accumulate`), with A and B row-major f16 or bf16
/// (row strides `lda`, `ldb` elements) and D row-major f32 (row stride `ldd`), f32
/// accumulation; pointers are device addresses ordered on the compute stream. For pipelines
/// that multiply by weight matrices stored as rows (`CudaDevice::gemm_nt_f32`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_nt_f32(
    dev: &CudaBackend,
    dt: DType,
    (a, lda): (u64, usize),
    (b, ldb): (u64, usize),
    (d, ldd): (u64, usize),
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) -> Result<()> {
    let op = "gemm_nt_f32";
    let data_t = match dt {
        DType::F16 => lts::cudaDataType::CUDA_R_16F,
        DType::BF16 => lts::cudaDataType::CUDA_R_16BF,
        // f32 operands with f32 products (CUBLAS_COMPUTE_32F: no TF32 rounding)
        DType::F32 => lts::cudaDataType::CUDA_R_32F,
        other => return Err(Error::dtype(op, other, "needs f16, bf16 or f32 operands")),
    };
    if m == 0 || n == 0 || k == 0 {
        return Err(Error::backend(
            op,
            format!("empty product {m}x{k} x {k}x{n}"),
        ));
    }
    if lda < k || ldb < k || ldd < n {
        return Err(Error::backend(
            op,
            format!("row strides {lda}, {ldb}, {ldd} below the rows ({k}, {k}, {n})"),
        ));
    }
    // Column-major: D^T[n, m] = op(B^T stored k x n)^T [n, k] * A^T[k, m].
    let key = Key {
        dtype: dt,
        tf32: false,
        a: (k as u64, n as u64, ldb as i64, 0),
        b: (k as u64, m as u64, lda as i64, 0),
        ta: true,
        tb: false,
        batch: ldd as i32, // (no batch: the slot keys the output row stride)
        align: [align_of(b), align_of(a), align_of(d)],
        out32: true,
        bias: false,
        acc: false,
        gelu: Gelu::No,
    };
    let mut guard = dev.blas.lock().unwrap_or_else(|p| p.into_inner());
    let blas = Blas::get(dev, &mut guard, op)?;
    // SAFETY: descriptors are created and destroyed here; the caller passes live device
    // addresses covering the operands, ordered on the compute stream; alpha/beta live across
    // the call.
    unsafe {
        let desc = lt::create_matmul_desc(
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lts::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_err)?;
        set_attr(
            desc,
            lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &1i32,
        )?;
        let la =
            lt::create_matrix_layout(data_t, k as u64, n as u64, ldb as i64).map_err(lt_err)?;
        let lb =
            lt::create_matrix_layout(data_t, k as u64, m as u64, lda as i64).map_err(lt_err)?;
        let ld = lt::create_matrix_layout(
            lts::cudaDataType::CUDA_R_32F,
            n as u64,
            m as u64,
            ldd as i64,
        )
        .map_err(lt_err)?;
        let algo = blas
            .algo(key, desc, la, lb, ld, workspace_for(1, m, n, k))
            .map_err(|e| {
                Error::backend(
                    op,
                    format!(
                        "cuBLASLt has no algorithm for {dt} {m}x{k} x {k}x{n} -> f32: {:?}",
                        e.0
                    ),
                )
            });
        let (one, zero) = (1.0f32, 0.0f32);
        let beta: *const c_void = if accumulate {
            &one as *const f32 as _
        } else {
            &zero as *const f32 as _
        };
        let r = algo.and_then(|algo| {
            lt::matmul(
                blas.handle,
                desc,
                &one as *const f32 as _,
                beta,
                b as *const c_void,
                la,
                a as *const c_void,
                lb,
                d as *const c_void,
                ld,
                d as *mut c_void,
                ld,
                &algo,
                blas.workspace.ptr as *mut c_void,
                WORKSPACE,
                dev.compute.0 as lts::cudaStream_t,
            )
            .map_err(lt_err)
        });
        let _ = lt::destroy_matrix_layout(la);
        let _ = lt::destroy_matrix_layout(lb);
        let _ = lt::destroy_matrix_layout(ld);
        let _ = lt::destroy_matmul_desc(desc);
        r?;
    }
    Ok(())
}

/// Whether cuBLASLt's GELU epilogues may take a product with `n` output columns from
/// `dt` operands: f32 or 16-bit, the auxiliary matrix's leading dimension a multiple of 8.
fn gelu_epilogue(dt: DType, n: usize) -> bool {
    matches!(dt, DType::F32 | DType::F16 | DType::BF16) && n.is_multiple_of(8)
}

/// A backend-made tensor over `s`'s first storage, contiguous `shape`, on `like`'s device.
fn tensor_of(s: Vec<Arc<dyn Storage>>, shape: &Shape, like: &Tensor) -> Result<Tensor> {
    let st = s
        .into_iter()
        .next()
        .ok_or_else(|| Error::backend("matmul", "no output"))?;
    Ok(Tensor::from_storage(
        st,
        Layout::contiguous(shape.clone()),
        like.device().clone(),
    ))
}

/// `Op::MatmulBiasGelu`: (gelu_tanh(p), p), p = a b + bias, each rounded once from the
/// f32 (f64) sum: cuBLASLt's GELU_AUX_BIAS epilogue where it has one, else the product in
/// f32 (f64) and the GELU and roundings as separate kernels.
pub(crate) fn matmul_bias_gelu(
    dev: &CudaBackend,
    a: &Tensor,
    b: &Tensor,
    bias: &Tensor,
    out_shape: &Shape,
    out_dt: DType,
) -> Result<Vec<Arc<dyn Storage>>> {
    let n = out_shape.dims().last().copied().unwrap_or(0);
    if gelu_epilogue(a.dtype(), n) {
        let g = Some((Gelu::Forward, None));
        if let Some(o) = lt_matmul(dev, a, b, Some(bias), None, g, out_shape, out_dt)? {
            return Ok(o);
        }
    }
    let wide = match a.dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let bias_w = match bias.dtype() == wide {
        true => bias.clone(),
        false => tensor_of(crate::cast::cast(dev, bias, wide)?, bias.shape(), bias)?,
    };
    let p = tensor_of(
        matmul(dev, a, b, Some(&bias_w), None, out_shape, wide)?,
        out_shape,
        a,
    )?;
    let y = tensor_of(
        crate::elementwise::unary(dev, ferrite_core::UnaryOp::GeluTanh, &p)?,
        out_shape,
        a,
    )?;
    let low = |t: Tensor| match out_dt == wide {
        true => Ok(vec![t.storage_arc().clone()]),
        false => crate::cast::cast(dev, &t, out_dt),
    };
    let mut o = low(y)?;
    o.extend(low(p)?);
    Ok(o)
}

/// `Op::MatmulGeluBackward`: gelu_tanh'(x) (g b), rounded once from the f32 (f64) product:
/// cuBLASLt's DGELU epilogue where it has one (x contiguous), else the product in f32
/// (f64) and the derivative as a separate kernel.
pub(crate) fn matmul_gelu_backward(
    dev: &CudaBackend,
    g: &Tensor,
    b: &Tensor,
    x: &Tensor,
    out_shape: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let dt = x.dtype();
    let n = out_shape.dims().last().copied().unwrap_or(0);
    let packed = x.layout().is_contiguous() && {
        let s = dev.input(x, "matmul_gelu_backward")?;
        align_of(CudaBackend::ptr(x, s)) >= 16
    };
    if gelu_epilogue(dt, n) && packed {
        let gl = Some((Gelu::Backward, Some(x)));
        if let Some(o) = lt_matmul(dev, g, b, None, None, gl, out_shape, dt)? {
            return Ok(o);
        }
    }
    let wide = match dt {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let q = tensor_of(
        matmul(dev, g, b, None, None, out_shape, wide)?,
        out_shape,
        g,
    )?;
    let xw = match dt == wide {
        true => x.clone(),
        false => tensor_of(crate::cast::cast(dev, x, wide)?, out_shape, x)?,
    };
    let d = tensor_of(
        crate::elementwise::binary(dev, ferrite_core::BinaryOp::GeluTanhBackward, &xw, &q)?,
        out_shape,
        x,
    )?;
    match dt == wide {
        true => Ok(vec![d.storage_arc().clone()]),
        false => crate::cast::cast(dev, &d, dt),
    }
}
