//! LLM inference from GGUF files: one model definition (llama family, qwen2, gemma3) over a
//! kernel set (the CPU's here: quantized kernels that compute directly on GGUF blocks), the
//! paged KV cache, the engine (batched steps over many requests), tokenizer, chat templates,
//! sampler and the generation loop. `model::cuda` is the CUDA kernel set of the same model
//! definition (its kernels in `gpu`); `gpu` also holds the older CUDA launch plan
//! (`GpuSession`), still a model of its own and the default on CUDA until the engine is
//! measured against it.

mod arena;
pub mod chat;
pub mod engine;
pub mod env;
pub mod error;
pub mod generate;
pub mod gpu;
pub mod grammar;
pub mod kernels;
pub mod kv_cache;
pub mod logits_processor;
pub mod model;
pub mod pool;
/// The GPU kernels compiled at build time (`build.rs`): one `&[Prebuilt]` per source.
mod prebuilt {
    include!(concat!(env!("OUT_DIR"), "/prebuilt.rs"));
}
pub mod sampler;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
pub use model::{Config, Logits, Model, Precision, PrecisionPlan, Product, Session};
