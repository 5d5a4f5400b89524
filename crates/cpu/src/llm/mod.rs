//! The fused LLM kernels of the CPU backend around the quantized products (`crate::quant`),
//! run by the LLM crate's CPU kernel set (`ferrite_llm::model::cpu`): the paged KV cache's
//! blocks (`kv`), causal attention through block tables (`attention`), RoPE (`rope`) and
//! RMS norms (`norm`). The gated unit is `quant::exp::glu_mul`.

pub mod attention;
pub mod kv;
pub mod norm;
pub mod rope;
