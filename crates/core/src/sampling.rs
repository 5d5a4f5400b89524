//! The settings of the LLM kernels' device sampler, which each GPU backend implements
//! (ferrite-cuda's `llm::sample`, ferrite-wgpu's `llm::sample`) after the LLM crate's CPU
//! sampler, whose `SamplerConfig` validates them and fills this.

/// A device sampler's settings, valid by the CPU sampler's rules (the caller checks them):
/// `temperature` finite and >= 0 (0: greedy), `top_k` 0 (all) or the tokens kept, `top_p` in
/// (0, 1], `min_p` in [0, 1], `repeat_penalty` finite and > 0, `presence_penalty` and
/// `frequency_penalty` finite, the penalties over the last `penalty_last_n` history tokens,
/// `seed` of the random stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerSettings {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub penalty_last_n: usize,
    pub seed: u64,
}
