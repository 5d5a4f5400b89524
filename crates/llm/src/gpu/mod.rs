//! The CUDA side of LLM inference: the weights on the device and the kernels of the CUDA
//! kernel set (`crate::model::cuda`, the model definition's kernels on CUDA).
//!
//! - [`GpuModel`] uploads every weight matrix's GGUF block bytes once, as they are in the file
//!   (formats without a kernel are converted to f16 at load, with a notice), after checking
//!   that weights plus KV cache fit the free device memory.
//! - Kernels are CUDA C++ next to their wrappers: ferrite-cuda's `matvec` (with `quant.cuh`,
//!   the block formats; quantized products of a few rows, the embedding, the greedy pick) and
//!   `qmatrix` (`GpuMatrix`, the weights on the device), then here `paged.cu` by `paged.rs` (RoPE, the KV append and attention through block tables,
//!   the split-K and gated-unit epilogues), `prefill.cu` by `prefill.rs` (dequantization and
//!   the int8 tensor-core products of large steps), `sample.cu` by `sample.rs` (the device
//!   sampler), `decode.cu` by `decode.rs` (the RMS norms; the one-sequence attention step
//!   that the `ops` tests compare `paged_attn` against).
//! - Activations follow the CPU model's `Precision` at load: `Q8` quantizes each product's
//!   input to 8-bit units as the CPU does (`__dp4a` and int8 tensor cores); `Exact` and `Q8x2`
//!   keep f32 activations (q8x2 two-level units on the tensor cores for large steps).

pub(crate) mod decode;
pub mod ops;
pub(crate) mod paged;
pub(crate) mod prefill;
pub(crate) mod sample;
pub(crate) mod weights;

pub use ferrite_cuda::matvec;
pub use ferrite_cuda::qmatrix::{Fmt, GpuMatrix};
pub use ferrite_cuda::{device_count, is_available, Buffer, CudaDevice, KernelSource};
pub use sample::{sample_many, sample_once};
pub use weights::{default_precision, GpuModel, Layout, F32_ACTS_MAX_WEIGHT_BYTES};

use crate::error::{Error, Result};

/// Every kernel source of this crate's GPU kernels (the compile-all test walks this list;
/// the products, `ferrite_cuda::matvec`, are ferrite-cuda's and its tests').
pub fn sources() -> Vec<&'static KernelSource> {
    vec![
        &decode::SOURCE,
        &prefill::SOURCE,
        &sample::SOURCE,
        &paged::SOURCE,
    ]
}

/// Launches one kernel of the decode path on the compute stream (`ferrite_cuda::step`).
pub(crate) fn launch(
    dev: &CudaDevice,
    op: &'static str,
    src: &'static KernelSource,
    name: &str,
    cfg: ferrite_cuda::LaunchConfig,
    args: ferrite_cuda::KernelArgs,
) -> Result<()> {
    ferrite_cuda::step::launch(dev, op, src, name, cfg, args).gpu()
}

/// Maps a CUDA backend error into this crate's error type.
pub(crate) fn cuda_err(e: ferrite_core::Error) -> Error {
    Error::from(e)
}

pub(crate) trait CudaResult<T> {
    fn gpu(self) -> Result<T>;
}

impl<T> CudaResult<T> for ferrite_core::Result<T> {
    fn gpu(self) -> Result<T> {
        self.map_err(cuda_err)
    }
}

/// A device buffer holding `v` (f32, little-endian).
pub fn upload_f32(dev: &CudaDevice, v: &[f32], what: &'static str) -> Result<Buffer> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    upload_bytes(dev, &bytes, what)
}

/// A device buffer holding `bytes`.
pub fn upload_bytes(dev: &CudaDevice, bytes: &[u8], what: &'static str) -> Result<Buffer> {
    let buf = dev.alloc_bytes(bytes.len().max(16), what).gpu()?;
    if !bytes.is_empty() {
        dev.write_bytes(&buf, 0, bytes).gpu()?;
    }
    Ok(buf)
}

/// Reads `n` f32 values at the start of `buf` (waits for the queued work).
pub fn read_f32(dev: &CudaDevice, buf: &Buffer, n: usize) -> Result<Vec<f32>> {
    let b = dev.read_bytes(buf, 0, n * 4).gpu()?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// A zeroed device buffer of `bytes` bytes (at least 16).
pub fn zeros(dev: &CudaDevice, bytes: usize, what: &'static str) -> Result<Buffer> {
    let buf = dev.alloc_bytes(bytes.max(16), what).gpu()?;
    dev.zero_bytes(&buf).gpu()?;
    Ok(buf)
}

/// One kernel launch of the decode step, with its arguments (rebuilt into `KernelArgs` at each
/// enqueue: the step list is built once per session and enqueued eagerly or under capture).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Launch {
    Matvec(matvec::MvLaunch),
    Embed(matvec::EmbedLaunch),
    Argmax(matvec::ArgmaxLaunch),
    Norm(decode::NormLaunch),
    Paged(paged::PagedLaunch),
}

impl Launch {
    pub(crate) fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        match self {
            Launch::Matvec(l) => l.enqueue(dev).gpu(),
            Launch::Embed(l) => l.enqueue(dev).gpu(),
            Launch::Argmax(l) => l.enqueue(dev).gpu(),
            Launch::Norm(l) => l.enqueue(dev),
            Launch::Paged(l) => l.enqueue(dev),
        }
    }
}
