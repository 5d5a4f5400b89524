//! LLM inference from GGUF files: one model definition (llama family, qwen2, gemma3) over a
//! kernel set per backend (`model::cpu`, `model::cuda`, `model::wgpu`: each binds the
//! definition's fused kernels to its backend crate's kernels; the CUDA weights are in `gpu`),
//! the paged KV cache, the engine (batched steps over many requests), tokenizer, chat
//! templates, sampler and the generation loop. A [`Session`] runs one sequence on any kernel
//! set (`run`, `chat`, `perplexity`), the engine many.

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
pub mod sampler;
pub mod session;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
pub use model::{Config, Logits, Model, Precision, PrecisionPlan, Product, Session};
