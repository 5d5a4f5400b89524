//! LLM inference from GGUF files: one model definition (llama family, qwen2, gemma3) over a
//! kernel set (the CPU's here: quantized kernels that compute directly on GGUF blocks), the
//! paged KV cache, the engine (batched steps over many requests), tokenizer, chat templates,
//! sampler and the generation loop. `model::cuda` and `model::wgpu` are the CUDA and wgpu
//! kernel sets of the same model definition (the CUDA kernels and weights in `gpu`). A
//! [`Session`] runs one sequence on any kernel set (`run`, `chat`, `perplexity`), the engine
//! many.

pub mod chat;
pub mod engine;
pub mod env;
pub mod error;
pub mod generate;
pub mod gpu;
pub mod grammar;
pub mod kv_cache;
pub mod logits_processor;
pub mod model;
/// The GPU kernels compiled at build time (`build.rs`): one `&[Prebuilt]` per source.
mod prebuilt {
    include!(concat!(env!("OUT_DIR"), "/prebuilt.rs"));
}
pub mod sampler;
pub mod session;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
pub use model::{Config, Logits, Model, Precision, PrecisionPlan, Product, Session};
