//! The fused LLM kernels of the CUDA backend, launched by the LLM crate's CUDA kernel set
//! (`ferrite_llm::model::cuda`) beside the quantized products (`crate::matvec`):
//!
//! - `decode.cu` by `decode.rs`: the RMS norms; the attention's shape and splits;
//! - `paged.cu` by `paged.rs`: RoPE + KV append and the decode attention through block tables
//!   (split over the key length), per-head norms, row gathers, per-row argmax, KV block
//!   copies (the engine's batched steps);
//! - `prefill.cu` by `prefill.rs`: dequantization into operand rows, the attention and GLU
//!   outputs written as the next product's operands, the int8 tensor-core products of large
//!   steps with two-level (q8x2) inputs and the matrix copies they read;
//! - `sample.cu` by `sample.rs`: the device sampler;
//! - `ops`: each kernel on its own, on buffers the caller owns (tests, benchmarks).
//!
//! Every launch goes on the device's compute stream (`crate::step`), so a kernel set's step
//! can be captured into a CUDA graph.

pub mod decode;
pub mod ops;
pub mod paged;
pub mod prefill;
pub mod sample;

use crate::step::launch;
use crate::{matvec, Buffer, CudaDevice, KernelSource};
use ferrite_core::Result;

/// Every kernel source of this module (the compile-all test walks `crate::all_sources`).
pub fn sources() -> Vec<&'static KernelSource> {
    vec![
        &decode::SOURCE,
        &prefill::SOURCE,
        &sample::SOURCE,
        &paged::SOURCE,
    ]
}

/// A zeroed device buffer of `bytes` bytes (at least 16).
pub fn zeros(dev: &CudaDevice, bytes: usize, what: &'static str) -> Result<Buffer> {
    let buf = dev.alloc_bytes(bytes.max(16), what)?;
    dev.zero_bytes(&buf)?;
    Ok(buf)
}

/// A device buffer holding `bytes`.
pub fn upload_bytes(dev: &CudaDevice, bytes: &[u8], what: &'static str) -> Result<Buffer> {
    let buf = dev.alloc_bytes(bytes.len().max(16), what)?;
    if !bytes.is_empty() {
        dev.write_bytes(&buf, 0, bytes)?;
    }
    Ok(buf)
}

/// One kernel launch of a step, with its arguments (rebuilt into `KernelArgs` at each
/// enqueue: a kernel set builds its step's launches once and enqueues them eagerly or under
/// capture).
#[derive(Clone, Copy, Debug)]
pub enum Launch {
    Matvec(matvec::MvLaunch),
    Embed(matvec::EmbedLaunch),
    Argmax(matvec::ArgmaxLaunch),
    Norm(decode::NormLaunch),
    Paged(paged::PagedLaunch),
}

impl Launch {
    pub fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        match self {
            Launch::Matvec(l) => l.enqueue(dev),
            Launch::Embed(l) => l.enqueue(dev),
            Launch::Argmax(l) => l.enqueue(dev),
            Launch::Norm(l) => l.enqueue(dev),
            Launch::Paged(l) => l.enqueue(dev),
        }
    }
}
