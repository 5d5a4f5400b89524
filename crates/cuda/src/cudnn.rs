//! conv2d, its input gradient (`conv_transpose2d`) and its weight gradient through cuDNN's
//! convolution API, with cuDNN (`libcudnn.so.9`) loaded at run time. conv.rs calls
//! [`conv`] first and runs its im2col + cuBLASLt path when this returns `None`: cuDNN absent,
//! turned off (`FERRITE_CONV=im2col` or `CudaDevice::set_conv_impl`), or rejecting the
//! configuration.
//!
//! Tensors are fully packed NCHW (made contiguous first), weights `[o, c/g, kh, kw]`;
//! f16/bf16 accumulate in f32 on tensor cores, f32 uses FMA math unless TF32 is enabled
//! (`set_tf32`), f64 runs in f64. The algorithm of each problem (direction, dtype, shapes,
//! parameters) is chosen once and cached: measured with cuDNN's `Find…AlgorithmEx` on the
//! call's own buffers (what PyTorch's `cudnn.benchmark` does), or taken from cuDNN's
//! heuristics (`Get…Algorithm_v7`) with `FERRITE_CUDNN_ALGO=heuristic` and while a CUDA
//! graph is being captured (measuring would synchronize). Workspaces come from the device's
//! caching pool and return to it when the call is queued (stream-ordered reuse).
//!
//! f16 and bf16 problems run through cuDNN's graph API instead (plan.rs: an execution plan
//! built and chosen once per problem, then executed per call), whose per-call host cost is a
//! few microseconds against the legacy calls' 0.1-0.3 ms; the legacy calls remain for f32,
//! f64, problems the graph API rejects, and `FERRITE_CUDNN_API=legacy`.

mod plan;

use crate::device::CudaBackend;
use cudarc::cudnn::sys;
use ferrite_core::{no_grad, Conv2dParams, DType, Error, Result, Shape, Storage, Tensor};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

/// Which convolution implementation a CUDA device uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvImpl {
    /// cuDNN where it loads and accepts the problem, im2col + cuBLASLt otherwise (default);
    /// the weight gradient of a small filter over a long reduction runs its own kernel
    /// (`wgrad_small` in conv.rs).
    Auto,
    /// cuDNN only: a missing library or a rejected problem is an error naming the op.
    Cudnn,
    /// im2col + cuBLASLt only.
    Im2col,
}

impl ConvImpl {
    /// `FERRITE_CONV` (`auto`, `cudnn` or `im2col`; unset means `auto`).
    pub fn from_env() -> Result<ConvImpl> {
        match std::env::var("FERRITE_CONV") {
            Err(std::env::VarError::NotPresent) => Ok(ConvImpl::Auto),
            Ok(v) => ConvImpl::parse(&v),
            Err(std::env::VarError::NotUnicode(v)) => ConvImpl::parse(&v.to_string_lossy()),
        }
    }

    pub fn parse(v: &str) -> Result<ConvImpl> {
        match v {
            "" | "auto" => Ok(ConvImpl::Auto),
            "cudnn" => Ok(ConvImpl::Cudnn),
            "im2col" => Ok(ConvImpl::Im2col),
            other => Err(Error::backend(
                "cuda",
                format!("FERRITE_CONV: expected auto, cudnn or im2col, got {other:?}"),
            )),
        }
    }
}

/// How the algorithm of a new problem is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AlgoChoice {
    Find,
    Heuristic,
}

fn algo_choice_from_env() -> Result<AlgoChoice> {
    match std::env::var("FERRITE_CUDNN_ALGO").as_deref() {
        Err(_) | Ok("") | Ok("find") => Ok(AlgoChoice::Find),
        Ok("heuristic") => Ok(AlgoChoice::Heuristic),
        Ok(other) => Err(Error::backend(
            "cuda",
            format!("FERRITE_CUDNN_ALGO: expected find or heuristic, got {other:?}"),
        )),
    }
}

/// `FERRITE_CUDNN_API`: `graph` (default: f16/bf16 through execution plans) or `legacy`.
fn graph_api_from_env() -> Result<bool> {
    match std::env::var("FERRITE_CUDNN_API").as_deref() {
        Err(_) | Ok("") | Ok("graph") => Ok(true),
        Ok("legacy") => Ok(false),
        Ok(other) => Err(Error::backend(
            "cuda",
            format!("FERRITE_CUDNN_API: expected graph or legacy, got {other:?}"),
        )),
    }
}

/// Settings read from the environment when a device starts (validated there).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvSettings {
    pub(crate) imp: ConvImpl,
    algo: AlgoChoice,
    graph: bool,
}

impl ConvSettings {
    pub(crate) fn from_env() -> Result<ConvSettings> {
        Ok(ConvSettings {
            imp: ConvImpl::from_env()?,
            algo: algo_choice_from_env()?,
            graph: graph_api_from_env()?,
        })
    }
}

/// Counts of convolution calls by path, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConvStats {
    /// Calls cuDNN ran.
    pub cudnn: u64,
    /// Calls the im2col path ran (cuDNN off, absent or rejecting the problem).
    pub im2col: u64,
    /// Weight gradients of small filters that `wgrad_small` ran (conv.rs, `Auto` only).
    pub direct: u64,
}

/// Largest workspace an algorithm may use.
const MAX_WORKSPACE: usize = 1 << 30;

/// Every cuDNN entry point this file calls: checked at load so that a library missing one
/// turns cuDNN off instead of failing inside a call.
const SYMBOLS: [&str; 24] = [
    "cudnnGetVersion",
    "cudnnCreate",
    "cudnnDestroy",
    "cudnnSetStream",
    "cudnnCreateTensorDescriptor",
    "cudnnSetTensor4dDescriptor",
    "cudnnDestroyTensorDescriptor",
    "cudnnCreateFilterDescriptor",
    "cudnnSetFilter4dDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnSetConvolution2dDescriptor",
    "cudnnSetConvolutionGroupCount",
    "cudnnSetConvolutionMathType",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnFindConvolutionForwardAlgorithmEx",
    "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "cudnnFindConvolutionBackwardFilterAlgorithmEx",
    "cudnnConvolutionForward",
    "cudnnConvolutionBackwardData",
    "cudnnConvolutionBackwardFilter",
];

/// cuDNN's version (e.g. 90800 for 9.8.0) once the library loaded with every entry point this
/// file needs, or why it did not. Loaded once per process.
pub fn cudnn_version() -> std::result::Result<usize, String> {
    static LOADED: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the library.
            if !unsafe { sys::is_culib_present() } {
                return Err("the cuDNN library (libcudnn.so.9) is not installed".into());
            }
            // SAFETY: the library is present (checked above), so culib() does not panic.
            let lib = unsafe { sys::culib() };
            for s in SYMBOLS {
                // SAFETY: looking a symbol up does not call it.
                if unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err() {
                    return Err(format!("the cuDNN library lacks {s}"));
                }
            }
            // SAFETY: the symbol exists (checked above); it takes no arguments.
            let v = unsafe { sys::cudnnGetVersion() };
            if !(90000..100000).contains(&v) {
                return Err(format!("cuDNN {v} found; 9.x is required"));
            }
            Ok(v)
        })
        .clone()
}

/// Whether the loaded cuDNN has the graph (backend) API entry points plan.rs calls.
fn graph_api_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        if cudnn_version().is_err() {
            return false;
        }
        // SAFETY: the library loaded (cudnn_version), so culib() does not panic; looking a
        // symbol up does not call it.
        let lib = unsafe { sys::culib() };
        plan::SYMBOLS
            .iter()
            .all(|s| unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_ok())
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Dir {
    Forward,
    BackwardData,
    BackwardFilter,
}

impl Dir {
    fn op(self) -> &'static str {
        match self {
            Dir::Forward => "conv2d",
            Dir::BackwardData => "conv_transpose2d",
            Dir::BackwardFilter => "conv2d_backward_weight",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    dir: Dir,
    dtype: DType,
    tf32: bool,
    x: [usize; 4],
    w: [usize; 4],
    y: [usize; 4],
    p: ([usize; 2], [usize; 2], [usize; 2], usize),
}

#[derive(Clone, Copy, Debug)]
enum Algo {
    Fwd(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

#[derive(Clone, Copy, Debug)]
struct Chosen {
    algo: Algo,
    math: sys::cudnnMathType_t,
    workspace: usize,
}

/// A device's cuDNN handle (bound to its compute stream), its algorithm cache and its
/// execution plans; `None` in a cache marks a problem cuDNN (or its graph API) rejected.
pub(crate) struct Cudnn {
    handle: sys::cudnnHandle_t,
    algos: HashMap<Key, Option<Chosen>>,
    plans: HashMap<Key, Option<plan::Plan>>,
}

// SAFETY: the handle is used only under the device's lock, with its context bound.
unsafe impl Send for Cudnn {}

impl Drop for Cudnn {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreate and not destroyed elsewhere.
        unsafe {
            let _ = sys::cudnnDestroy(self.handle);
        }
    }
}

fn status(op: &'static str, what: &str, s: sys::cudnnStatus_t) -> Result<()> {
    match s {
        sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS => Ok(()),
        other => Err(Error::backend(op, format!("cuDNN {what}: {other:?}"))),
    }
}

/// Descriptors of one problem, destroyed on drop.
struct Descs {
    x: sys::cudnnTensorDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each was created by its cudnnCreate* (null ones were never created).
        unsafe {
            if !self.x.is_null() {
                let _ = sys::cudnnDestroyTensorDescriptor(self.x);
            }
            if !self.y.is_null() {
                let _ = sys::cudnnDestroyTensorDescriptor(self.y);
            }
            if !self.w.is_null() {
                let _ = sys::cudnnDestroyFilterDescriptor(self.w);
            }
            if !self.conv.is_null() {
                let _ = sys::cudnnDestroyConvolutionDescriptor(self.conv);
            }
        }
    }
}

fn data_type(dt: DType) -> Option<sys::cudnnDataType_t> {
    use sys::cudnnDataType_t as D;
    match dt {
        DType::F32 => Some(D::CUDNN_DATA_FLOAT),
        DType::F64 => Some(D::CUDNN_DATA_DOUBLE),
        DType::F16 => Some(D::CUDNN_DATA_HALF),
        DType::BF16 => Some(D::CUDNN_DATA_BFLOAT16),
        _ => None,
    }
}

/// Whether `a` may run a `dt` convolution: f64 (the dtype of precision checks) takes only
/// the direct and GEMM algorithms, never the FFT or Winograd transforms, whose rounding
/// (about 1e-8 relative) is far above f64's.
fn algo_allowed(dt: DType, a: Algo) -> bool {
    use sys::cudnnConvolutionBwdDataAlgo_t as D;
    use sys::cudnnConvolutionBwdFilterAlgo_t as W;
    use sys::cudnnConvolutionFwdAlgo_t as F;
    if dt != DType::F64 {
        return true;
    }
    match a {
        Algo::Fwd(x) => !matches!(
            x,
            F::CUDNN_CONVOLUTION_FWD_ALGO_FFT
                | F::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING
                | F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD
                | F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
        ),
        Algo::Data(x) => !matches!(
            x,
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT
                | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING
                | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD
                | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED
        ),
        Algo::Filter(x) => !matches!(
            x,
            W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT
                | W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING
                | W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD
                | W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED
        ),
    }
}

/// The math types an algorithm may use for `dt`: no TF32 for f32 unless enabled, never a
/// down-conversion of f32 or f64.
fn math_allowed(dt: DType, tf32: bool, m: sys::cudnnMathType_t) -> bool {
    use sys::cudnnMathType_t as M;
    match dt {
        DType::F16 | DType::BF16 => true,
        DType::F32 if tf32 => m != M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        _ => matches!(m, M::CUDNN_DEFAULT_MATH | M::CUDNN_FMA_MATH),
    }
}

fn default_math(dt: DType, tf32: bool) -> sys::cudnnMathType_t {
    use sys::cudnnMathType_t as M;
    match dt {
        DType::F16 | DType::BF16 => M::CUDNN_TENSOR_OP_MATH,
        DType::F32 if tf32 => M::CUDNN_TENSOR_OP_MATH,
        DType::F32 => M::CUDNN_FMA_MATH,
        _ => M::CUDNN_DEFAULT_MATH,
    }
}

fn dims4(d: &[usize]) -> Option<[c_int; 4]> {
    if d.len() != 4 || d.iter().product::<usize>() > i32::MAX as usize {
        return None;
    }
    let mut out = [0; 4];
    for (o, &v) in out.iter_mut().zip(d) {
        *o = c_int::try_from(v).ok().filter(|&v| v > 0)?;
    }
    Some(out)
}

/// The descriptors of a problem, or `None` where cuDNN's legacy API cannot describe it
/// (zero or over-`i32` sizes) or rejects a descriptor.
fn descs(key: &Key, math: sys::cudnnMathType_t) -> Option<Descs> {
    let dt = data_type(key.dtype)?;
    let (x, w, y) = (dims4(&key.x)?, dims4(&key.w)?, dims4(&key.y)?);
    let (stride, pad, dil, groups) = key.p;
    let i = |v: usize| c_int::try_from(v).ok();
    let (s0, s1, p0, p1, d0, d1, g) = (
        i(stride[0])?,
        i(stride[1])?,
        i(pad[0])?,
        i(pad[1])?,
        i(dil[0])?,
        i(dil[1])?,
        i(groups)?,
    );
    let compute = if key.dtype == DType::F64 {
        sys::cudnnDataType_t::CUDNN_DATA_DOUBLE
    } else {
        sys::cudnnDataType_t::CUDNN_DATA_FLOAT
    };
    let mut d = Descs {
        x: std::ptr::null_mut(),
        y: std::ptr::null_mut(),
        w: std::ptr::null_mut(),
        conv: std::ptr::null_mut(),
    };
    let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
    // SAFETY: each descriptor is created before it is set; all are destroyed by Descs' drop.
    let ok = unsafe {
        sys::cudnnCreateTensorDescriptor(&mut d.x).result().is_ok()
            && sys::cudnnCreateTensorDescriptor(&mut d.y).result().is_ok()
            && sys::cudnnCreateFilterDescriptor(&mut d.w).result().is_ok()
            && sys::cudnnCreateConvolutionDescriptor(&mut d.conv)
                .result()
                .is_ok()
            && sys::cudnnSetTensor4dDescriptor(d.x, nchw, dt, x[0], x[1], x[2], x[3])
                .result()
                .is_ok()
            && sys::cudnnSetTensor4dDescriptor(d.y, nchw, dt, y[0], y[1], y[2], y[3])
                .result()
                .is_ok()
            && sys::cudnnSetFilter4dDescriptor(d.w, dt, nchw, w[0], w[1], w[2], w[3])
                .result()
                .is_ok()
            && sys::cudnnSetConvolution2dDescriptor(
                d.conv,
                p0,
                p1,
                s0,
                s1,
                d0,
                d1,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                compute,
            )
            .result()
            .is_ok()
            && sys::cudnnSetConvolutionGroupCount(d.conv, g)
                .result()
                .is_ok()
            && sys::cudnnSetConvolutionMathType(d.conv, math)
                .result()
                .is_ok()
    };
    ok.then_some(d)
}

/// Device addresses of one call: x, w, y as in the forward problem (one of them is the
/// output, per direction).
struct Ptrs {
    x: u64,
    w: u64,
    y: u64,
}

impl Cudnn {
    fn new(dev: &CudaBackend, op: &'static str) -> Result<Cudnn> {
        let mut handle: sys::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: the device's context is bound by the caller; the handle is destroyed on
        // drop; the stream outlives the device's handles.
        unsafe {
            status(op, "create", sys::cudnnCreate(&mut handle))?;
            let c = Cudnn {
                handle,
                algos: HashMap::new(),
                plans: HashMap::new(),
            };
            status(
                op,
                "set stream",
                sys::cudnnSetStream(c.handle, dev.compute.0 as sys::cudaStream_t),
            )?;
            Ok(c)
        }
    }

    /// The algorithm for `key`: cached, else measured on the call's buffers (`Find`, outside
    /// graph capture) or cuDNN's heuristic pick; `None` when cuDNN offers none.
    fn choose(
        &mut self,
        dev: &CudaBackend,
        key: Key,
        settings: ConvSettings,
        ptrs: &Ptrs,
    ) -> Result<Option<Chosen>> {
        if let Some(c) = self.algos.get(&key) {
            return Ok(*c);
        }
        let capturing = dev.capturing.load(Ordering::Acquire);
        let find = settings.algo == AlgoChoice::Find && !capturing;
        let math = default_math(key.dtype, key.tf32);
        let Some(d) = descs(&key, math) else {
            self.algos.insert(key, None);
            return Ok(None);
        };
        let chosen = if find {
            self.find(dev, &key, &d, ptrs)?
        } else {
            self.heuristic(&key, &d)
        };
        // A heuristic pick made during capture is not cached: the next eager call measures.
        if find || !capturing || chosen.is_none() {
            self.algos.insert(key, chosen);
        }
        Ok(chosen)
    }

    /// The execution plan for `key` (f16/bf16): cached, else built from cuDNN's heuristic
    /// candidates and, where measuring is allowed (not capturing, `FERRITE_CUDNN_ALGO=find`),
    /// the fastest of them on the call's buffers; `None` when the graph API offers none.
    fn plan(
        &mut self,
        dev: &CudaBackend,
        key: Key,
        settings: ConvSettings,
        ptrs: &Ptrs,
    ) -> Result<Option<&plan::Plan>> {
        if !self.plans.contains_key(&key) {
            let Some(dt) = data_type(key.dtype) else {
                return Ok(None);
            };
            let mut cands = plan::candidates(self.handle, &key, dt, MAX_WORKSPACE);
            let measure = settings.algo == AlgoChoice::Find
                && !dev.capturing.load(Ordering::Acquire)
                && cands.len() > 1;
            let best = match measure {
                true => self.fastest(dev, key.dir.op(), &cands, ptrs)?,
                false => 0,
            };
            let chosen = (best < cands.len()).then(|| cands.swap_remove(best));
            self.plans.insert(key, chosen);
        }
        Ok(self.plans.get(&key).and_then(Option::as_ref))
    }

    /// Index of the candidate with the least device time over 3 runs on the call's buffers
    /// (each run overwrites the output, which the real call then writes).
    fn fastest(
        &self,
        dev: &CudaBackend,
        op: &'static str,
        cands: &[plan::Plan],
        ptrs: &Ptrs,
    ) -> Result<usize> {
        let mut best = (f32::INFINITY, 0);
        for (i, p) in cands.iter().enumerate() {
            let ws = dev.alloc.alloc(p.workspace, op)?;
            let run = || plan::execute(self.handle, p, [ptrs.x, ptrs.w, ptrs.y], ws.ptr);
            if run() != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                continue;
            }
            let t = crate::driver::Timer::new()?;
            t.start(&dev.compute)?;
            let ok = (0..3).all(|_| run() == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS);
            let ms = t.stop_ms(&dev.compute)?;
            if ok && ms < best.0 {
                best = (ms, i);
            }
        }
        Ok(best.1)
    }

    fn heuristic(&self, key: &Key, d: &Descs) -> Option<Chosen> {
        const N: usize = 16;
        let mut n: c_int = 0;
        macro_rules! pick {
            ($perf:ty, $get:ident, $wrap:ident, $a:expr, $b:expr, $c:expr, $dd:expr) => {{
                // SAFETY: all-zero bytes are a valid perf struct (algo 0, status success).
                let mut perf: [$perf; N] = unsafe { std::mem::zeroed() };
                // SAFETY: the descriptors are live; perf has room for N results.
                let s = unsafe {
                    sys::$get(
                        self.handle,
                        $a,
                        $b,
                        $c,
                        $dd,
                        N as c_int,
                        &mut n,
                        perf.as_mut_ptr(),
                    )
                };
                if s != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                    return None;
                }
                perf[..(n.max(0) as usize).min(N)]
                    .iter()
                    .find(|p| {
                        p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                            && p.memory <= MAX_WORKSPACE
                            && math_allowed(key.dtype, key.tf32, p.mathType)
                            && algo_allowed(key.dtype, Algo::$wrap(p.algo))
                    })
                    .map(|p| Chosen {
                        algo: Algo::$wrap(p.algo),
                        math: p.mathType,
                        workspace: p.memory,
                    })
            }};
        }
        match key.dir {
            Dir::Forward => pick!(
                sys::cudnnConvolutionFwdAlgoPerf_t,
                cudnnGetConvolutionForwardAlgorithm_v7,
                Fwd,
                d.x,
                d.w,
                d.conv,
                d.y
            ),
            Dir::BackwardData => pick!(
                sys::cudnnConvolutionBwdDataAlgoPerf_t,
                cudnnGetConvolutionBackwardDataAlgorithm_v7,
                Data,
                d.w,
                d.y,
                d.conv,
                d.x
            ),
            Dir::BackwardFilter => pick!(
                sys::cudnnConvolutionBwdFilterAlgoPerf_t,
                cudnnGetConvolutionBackwardFilterAlgorithm_v7,
                Filter,
                d.x,
                d.y,
                d.conv,
                d.w
            ),
        }
    }

    /// Measures the algorithms on the call's buffers (the output is overwritten by each
    /// trial and then by the real call), with a workspace from the pool.
    fn find(&self, dev: &CudaBackend, key: &Key, d: &Descs, ptrs: &Ptrs) -> Result<Option<Chosen>> {
        const N: usize = 16;
        let op = key.dir.op();
        // The largest workspace the pool grants, from MAX_WORKSPACE down to 16 MiB.
        let mut ws_size = MAX_WORKSPACE;
        let ws = loop {
            match dev.alloc.alloc(ws_size, op) {
                Ok(b) => break Some(b),
                Err(_) if ws_size > 16 << 20 => ws_size /= 2,
                Err(_) => break None,
            }
        };
        let (ws_ptr, ws_size) = match &ws {
            Some(b) => (b.ptr as *mut c_void, ws_size),
            None => (std::ptr::null_mut(), 0),
        };
        let mut n: c_int = 0;
        let (x, w, y) = (
            ptrs.x as *mut c_void,
            ptrs.w as *mut c_void,
            ptrs.y as *mut c_void,
        );
        macro_rules! pick {
            ($perf:ty, $wrap:ident, $call:expr) => {{
                // SAFETY: all-zero bytes are a valid perf struct (algo 0, status success).
                let mut perf: [$perf; N] = unsafe { std::mem::zeroed() };
                let s = $call(perf.as_mut_ptr());
                if s != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                    return Ok(None);
                }
                // Sorted by time: the fastest allowed one.
                perf[..(n.max(0) as usize).min(N)]
                    .iter()
                    .find(|p| {
                        p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                            && p.memory <= ws_size
                            && math_allowed(key.dtype, key.tf32, p.mathType)
                            && algo_allowed(key.dtype, Algo::$wrap(p.algo))
                    })
                    .map(|p| Chosen {
                        algo: Algo::$wrap(p.algo),
                        math: p.mathType,
                        workspace: p.memory,
                    })
            }};
        }
        // SAFETY (each call): live descriptors matching the buffers, which are device
        // allocations of the described sizes ordered on the handle's stream (the compute
        // stream); the workspace holds ws_size bytes; perf has room for N results.
        let chosen = match key.dir {
            Dir::Forward => pick!(sys::cudnnConvolutionFwdAlgoPerf_t, Fwd, |perf| unsafe {
                sys::cudnnFindConvolutionForwardAlgorithmEx(
                    self.handle,
                    d.x,
                    x,
                    d.w,
                    w,
                    d.conv,
                    d.y,
                    y,
                    N as c_int,
                    &mut n,
                    perf,
                    ws_ptr,
                    ws_size,
                )
            }),
            Dir::BackwardData => pick!(
                sys::cudnnConvolutionBwdDataAlgoPerf_t,
                Data,
                |perf| unsafe {
                    sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                        self.handle,
                        d.w,
                        w,
                        d.y,
                        y,
                        d.conv,
                        d.x,
                        x,
                        N as c_int,
                        &mut n,
                        perf,
                        ws_ptr,
                        ws_size,
                    )
                }
            ),
            Dir::BackwardFilter => pick!(
                sys::cudnnConvolutionBwdFilterAlgoPerf_t,
                Filter,
                |perf| unsafe {
                    sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        self.handle,
                        d.x,
                        x,
                        d.y,
                        y,
                        d.conv,
                        d.w,
                        w,
                        N as c_int,
                        &mut n,
                        perf,
                        ws_ptr,
                        ws_size,
                    )
                }
            ),
        };
        Ok(chosen)
    }
}

/// Runs `dir` through cuDNN: `a`, `b` are the op's inputs (forward: x, w; backward data:
/// gy, w; backward filter: x, gy) and `out` its output's shape. `Ok(None)` means "use the
/// im2col path" (cuDNN off, absent, or rejecting this problem in `Auto` mode).
fn run(
    dev: &CudaBackend,
    dir: Dir,
    a: &Tensor,
    b: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Option<Vec<Arc<dyn Storage>>>> {
    let op = dir.op();
    let settings = dev.conv_settings();
    if settings.imp == ConvImpl::Im2col {
        return Ok(None);
    }
    let required = settings.imp == ConvImpl::Cudnn;
    let reject = |why: String| -> Result<Option<Vec<Arc<dyn Storage>>>> {
        if required {
            Err(Error::backend(op, format!("{why} (FERRITE_CONV=cudnn)")))
        } else {
            Ok(None)
        }
    };
    if let Err(why) = cudnn_version() {
        return reject(why);
    }
    let dtype = a.dtype();
    if data_type(dtype).is_none() {
        return reject(format!("cuDNN has no {dtype} convolution"));
    }
    // f64 is the dtype of precision checks: cuDNN 9's f64 convolution was measured at 7e-8
    // relative error (f32-level rounding) on an H100, so `Auto` keeps f64 on im2col.
    if dtype == DType::F64 && !required {
        return Ok(None);
    }
    let dims = |d: &[usize]| -> [usize; 4] {
        let mut o = [0; 4];
        o.copy_from_slice(&d[..4]);
        o
    };
    let (x, w, y) = match dir {
        Dir::Forward => (dims(a.dims()), dims(b.dims()), dims(out.dims())),
        Dir::BackwardData => (dims(out.dims()), dims(b.dims()), dims(a.dims())),
        Dir::BackwardFilter => (dims(a.dims()), dims(out.dims()), dims(b.dims())),
    };
    let key = Key {
        dir,
        dtype,
        tf32: dtype == DType::F32 && dev.tf32.load(Ordering::Relaxed),
        x,
        w,
        y,
        p: (p.stride, p.padding, p.dilation, p.groups),
    };
    let (a, b) = no_grad(|| Ok::<_, Error>((a.contiguous()?, b.contiguous()?)))?;
    let result = dev.alloc_out(out.elem_count(), dtype, op)?;
    let (sa, sb) = (dev.input(&a, op)?, dev.input(&b, op)?);
    let (pa, pb) = (CudaBackend::ptr(&a, sa), CudaBackend::ptr(&b, sb));
    let po = result.ptr();
    if [pa, pb, po].iter().any(|p| p % 16 != 0) {
        return reject("an operand is not 16-byte aligned".into());
    }
    let ptrs = match dir {
        Dir::Forward => Ptrs {
            x: pa,
            w: pb,
            y: po,
        },
        Dir::BackwardData => Ptrs {
            x: po,
            w: pb,
            y: pa,
        },
        Dir::BackwardFilter => Ptrs {
            x: pa,
            w: po,
            y: pb,
        },
    };
    let mut guard = dev.cudnn.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(Cudnn::new(dev, op)?);
    }
    let Some(c) = guard.as_mut() else {
        return reject("no cuDNN handle".into());
    };
    if settings.graph && matches!(dtype, DType::F16 | DType::BF16) && graph_api_present() {
        let handle = c.handle;
        if let Some(p) = c.plan(dev, key, settings, &ptrs)? {
            let ws = dev.alloc.alloc(p.workspace, op)?;
            let s = plan::execute(handle, p, [ptrs.x, ptrs.w, ptrs.y], ws.ptr);
            drop(guard);
            status(op, "execute plan", s)?;
            dev.conv_cudnn_calls.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(dev.finish_one(result)?));
        }
    }
    let Some(chosen) = c.choose(dev, key, settings, &ptrs)? else {
        return reject(format!(
            "cuDNN has no algorithm for {dtype} x {x:?} w {w:?} y {y:?} {p:?}"
        ));
    };
    let Some(d) = descs(&key, chosen.math) else {
        return reject(format!(
            "cuDNN rejects {dtype} x {x:?} w {w:?} y {y:?} {p:?}"
        ));
    };
    let ws = dev.alloc.alloc(chosen.workspace, op)?;
    let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if dtype == DType::F64 {
        (&one64 as *const f64 as _, &zero64 as *const f64 as _)
    } else {
        (&one32 as *const f32 as _, &zero32 as *const f32 as _)
    };
    let (px, pw, py) = (
        ptrs.x as *mut c_void,
        ptrs.w as *mut c_void,
        ptrs.y as *mut c_void,
    );
    let wsp = ws.ptr as *mut c_void;
    // SAFETY: live descriptors matching the buffers (device allocations of the described
    // sizes, inputs made ready on the compute stream, which is the handle's stream); the
    // workspace holds what the algorithm asked for; alpha/beta live across the call. The
    // workspace block returns to the pool after the call is queued (stream-ordered reuse).
    let s = unsafe {
        match chosen.algo {
            Algo::Fwd(algo) => sys::cudnnConvolutionForward(
                c.handle,
                alpha,
                d.x,
                px,
                d.w,
                pw,
                d.conv,
                algo,
                wsp,
                chosen.workspace,
                beta,
                d.y,
                py,
            ),
            Algo::Data(algo) => sys::cudnnConvolutionBackwardData(
                c.handle,
                alpha,
                d.w,
                pw,
                d.y,
                py,
                d.conv,
                algo,
                wsp,
                chosen.workspace,
                beta,
                d.x,
                px,
            ),
            Algo::Filter(algo) => sys::cudnnConvolutionBackwardFilter(
                c.handle,
                alpha,
                d.x,
                px,
                d.y,
                py,
                d.conv,
                algo,
                wsp,
                chosen.workspace,
                beta,
                d.w,
                pw,
            ),
        }
    };
    drop(guard);
    status(op, &format!("{:?}", chosen.algo), s)?;
    dev.conv_cudnn_calls.fetch_add(1, Ordering::Relaxed);
    Ok(Some(dev.finish_one(result)?))
}

/// conv2d (x, w) -> y of shape `out`, or `None` for the im2col path.
pub(crate) fn conv2d(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Option<Vec<Arc<dyn Storage>>>> {
    run(dev, Dir::Forward, x, w, p, out)
}

/// conv2d's input gradient (gy, w) -> dx of shape `out`, or `None` for the im2col path.
pub(crate) fn conv_transpose2d(
    dev: &CudaBackend,
    gy: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Option<Vec<Arc<dyn Storage>>>> {
    run(dev, Dir::BackwardData, gy, w, p, out)
}

/// conv2d's weight gradient (x, gy) -> dw of shape `out`, or `None` for the im2col path.
pub(crate) fn conv2d_backward_weight(
    dev: &CudaBackend,
    x: &Tensor,
    gy: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Option<Vec<Arc<dyn Storage>>>> {
    run(dev, Dir::BackwardFilter, x, gy, p, out)
}
