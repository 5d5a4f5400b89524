//! LLM inference on the CPU from GGUF files: model graphs (llama family, gemma3), quantized
//! kernels that compute directly on GGUF blocks, the KV cache, tokenizer, chat templates,
//! sampler and the generation loop.

pub mod chat;
pub mod sampler;
pub mod tokenizer;
pub mod kernels;
