//! LLM inference on the CPU from GGUF files: model graphs (llama family, gemma3), quantized
//! kernels that compute directly on GGUF blocks, the KV cache, tokenizer, chat templates,
//! sampler and the generation loop.

pub mod chat;
pub mod env;
pub mod error;
pub mod generate;
pub mod gpu;
pub mod kernels;
pub mod kv_cache;
pub mod model;
pub mod pool;
pub mod sampler;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
pub use model::{Config, Logits, Model, Precision, PrecisionPlan, Product, Session};
