//! The CUDA side of LLM inference: the weights on the device ([`GpuModel`]), for the CUDA
//! kernel set (`crate::model::cuda`), which launches ferrite-cuda's kernels: the quantized
//! products (`ferrite_cuda::matvec`, `ferrite_cuda::qmatrix`) and the fused LLM kernels
//! (`ferrite_cuda::llm`: attention over the paged KV cache, norms, the large steps' helpers,
//! the device sampler).
//!
//! - [`GpuModel`] uploads every weight matrix's GGUF block bytes once, as they are in the file
//!   (formats without a kernel are converted to f16 at load, with a notice), after checking
//!   that weights plus KV cache fit the free device memory.
//! - Activations follow the CPU model's `Precision` at load: `Q8` quantizes each product's
//!   input to 8-bit units as the CPU does (`__dp4a` and int8 tensor cores); `Exact` and `Q8x2`
//!   keep f32 activations (q8x2 two-level units on the tensor cores for large steps).

pub(crate) mod weights;

pub use ferrite_cuda::llm::{upload_bytes, zeros};
pub use ferrite_cuda::matvec;
pub use ferrite_cuda::qmatrix::{Fmt, GpuMatrix};
pub use ferrite_cuda::{device_count, is_available, Buffer, CudaDevice, KernelSource};
pub use weights::{default_precision, GpuModel, Layout, F32_ACTS_MAX_WEIGHT_BYTES};

use crate::error::{Error, Result};
use crate::sampler::SamplerConfig;
use ferrite_core::SamplerSettings;
use ferrite_cuda::llm::sample;

/// A device buffer holding `v` (f32, little-endian).
pub fn upload_f32(dev: &CudaDevice, v: &[f32], what: &'static str) -> Result<Buffer> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Ok(upload_bytes(dev, &bytes, what)?)
}

/// Reads `n` f32 values at the start of `buf` (waits for the queued work).
pub fn read_f32(dev: &CudaDevice, buf: &Buffer, n: usize) -> Result<Vec<f32>> {
    let b = dev.read_bytes(buf, 0, n * 4)?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The device sampler's settings of `cfg`, after validating it.
pub(crate) fn sampler_settings(cfg: &SamplerConfig) -> Result<SamplerSettings> {
    cfg.settings().map_err(|e| Error::Other(e.to_string()))
}

/// Samples one token from `logits` (f32 [vocab] on the device; penalized in place) with the
/// device sampler (`ferrite_cuda::llm::sample::sample_once`; tests against the CPU sampler).
pub fn sample_once(
    dev: &CudaDevice,
    cfg: &SamplerConfig,
    logits: &Buffer,
    vocab: usize,
    history: &[u32],
    step: u64,
) -> Result<u32> {
    Ok(sample::sample_once(
        dev,
        &sampler_settings(cfg)?,
        logits,
        vocab,
        history,
        step,
    )?)
}

/// `draws` tokens from the same host `logits` with the device sampler, draw counters 0, 1,
/// ... (`ferrite_cuda::llm::sample::sample_many`; tests of its distribution).
pub fn sample_many(
    dev: &CudaDevice,
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    draws: usize,
) -> Result<Vec<u32>> {
    Ok(sample::sample_many(
        dev,
        &sampler_settings(cfg)?,
        logits,
        history,
        draws,
    )?)
}
