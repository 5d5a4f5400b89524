//! LLM decode on a CUDA GPU, one graph per token.
//!
//! - [`GpuModel`] uploads every weight matrix's GGUF block bytes once, as they are in the file
//!   (formats without a kernel are converted to f16 at load, with a notice), after checking
//!   that weights plus KV cache fit the free device memory.
//! - [`GpuSession`] runs one token at a time: embedding, then per layer five kernels: a fused
//!   RMS-norm + QKV product; the attention step (RoPE, append to the f16 KV cache preallocated
//!   to the context, decode attention split over the KV length, merge of the splits by the last
//!   block); the output product with the residual add; a fused RMS-norm + gate/up product with
//!   SwiGLU/GeGLU; the down product with the residual add. Then the final norm and output
//!   product with per-block argmax partials, and the final argmax. The whole step is captured
//!   once as a CUDA graph and replayed; between replays the host writes the token and position
//!   (8 bytes) and reads back the greedy token id (4 bytes). With a sampler set
//!   (`GpuSession::set_sampler`), the last kernel is the full sampler (`sample.rs`) instead of
//!   the argmax: still one token id back per step.
//! - Activations follow the CPU model's `Precision` at load: `Q8` (the llama default) quantizes
//!   each product's input to 8-bit units as the CPU does and takes `__dp4a` integer dot
//!   products (the fast mode, `matvec.cu`); `Exact` (and `Q8x2`) keep f32 activations, so the
//!   logits follow the CPU's exact mode up to summation order and the f16 KV cache.
//!
//! - Prompts of two or more tokens go through the batched prefill (`prefill.rs`): chunks of up
//!   to 512 tokens, dequantized f16 weights x tensor-core products, the CUDA flash attention op
//!   over the KV cache written in place.
//!
//! Kernels are CUDA C++ next to their wrappers: `matvec.cu` (with `quant.cuh`, the block
//! formats) by `matvec.rs`, `decode.cu` by `decode.rs`.

pub(crate) mod decode;
mod generate;
pub(crate) mod matvec;
pub mod ops;
pub(crate) mod paged;
pub(crate) mod prefill;
pub(crate) mod sample;
mod session;
pub(crate) mod weights;

pub use ferrite_cuda::{device_count, is_available, Buffer, CudaDevice, KernelSource};
pub use generate::{generate, mean_nll};
pub use prefill::CHUNK as PREFILL_CHUNK;
pub use sample::{sample_many, sample_once};
pub(crate) use session::device_greedy;
pub use session::GpuSession;
pub use weights::{default_precision, Fmt, GpuMatrix, GpuModel, Layout, F32_ACTS_MAX_WEIGHT_BYTES};

use crate::error::{Error, Result};

/// Every kernel source of the GPU decode path (the compile-all test walks this list).
pub fn sources() -> Vec<&'static KernelSource> {
    vec![
        &matvec::SOURCE,
        &decode::SOURCE,
        &prefill::SOURCE,
        &sample::SOURCE,
        &paged::SOURCE,
    ]
}

/// Whether kernels go out with programmatic dependent launch: on sm_90+ unless
/// `FERRITE_GPU_PDL=0`. Every kernel of the step waits for its predecessors before it touches
/// activations (`pdl_wait` in quant.cuh), so results are the same either way.
fn pdl(dev: &CudaDevice) -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| crate::env::flag_or("FERRITE_GPU_PDL", true))
        && dev.compute_capability().0 >= 9
}

/// Launches one kernel of the decode path on the compute stream.
pub(crate) fn launch(
    dev: &CudaDevice,
    op: &'static str,
    src: &'static KernelSource,
    name: &str,
    cfg: ferrite_cuda::LaunchConfig,
    args: ferrite_cuda::KernelArgs,
) -> Result<()> {
    if pdl(dev) {
        dev.launch_pdl(op, src, name, cfg, args).gpu()
    } else {
        dev.launch(op, src, name, cfg, args).gpu()
    }
}

/// Maps a CUDA backend error into this crate's error type.
pub(crate) fn cuda_err(e: ferrite_core::Error) -> Error {
    Error::Other(format!("cuda: {e}"))
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
    Attn(decode::AttnLaunch),
    Norm(decode::NormLaunch),
    Sample(sample::SampleLaunch),
    Paged(paged::PagedLaunch),
}

impl Launch {
    pub(crate) fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        match self {
            Launch::Matvec(l) => l.enqueue(dev),
            Launch::Embed(l) => l.enqueue(dev),
            Launch::Argmax(l) => l.enqueue(dev),
            Launch::Attn(l) => l.enqueue(dev),
            Launch::Norm(l) => l.enqueue(dev),
            Launch::Sample(l) => l.enqueue(dev),
            Launch::Paged(l) => l.enqueue(dev),
        }
    }
}
