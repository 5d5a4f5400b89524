//! The LLM crate's CPU sampler (`ferrite_llm::sampler`) on the device: one launch after a step draws the token of
//! every logit row whose sequence samples (`sample_rows`), so a sampled step reads back one
//! token id per sequence.
//!
//! State on the device: `SampleParams` (64 bytes: the settings, the history length and the draw
//! counter, both advanced by the kernel), the token history (u32, one per context position:
//! the prompt written by the host, each sampled token appended by the kernel), and a u64 scratch
//! per vocabulary entry. Same seed, same settings, same logits: the same tokens (the kernel is
//! deterministic).
//!
//! The random numbers are not the CPU sampler's stream (xoshiro256**): draw `i` uses
//! SplitMix64 of (seed, i), a counter-based generator, so a replayed graph needs no host
//! state. The distribution is the CPU's: the same penalties, temperature, top-k, top-p and min-p
//! cuts in the same order (candidates ordered by logit, then id), and a draw proportional to
//! exp(s - max). Probabilities are held as fixed-point masses round(exp(s - max) * 2^40), so a
//! token under 2^-41 of the top one's probability is never drawn, and the top-p cut may differ
//! from the CPU's f64 sum where the cumulative probability lies within ~1e-12 of `top_p`.

use super::{upload_bytes, zeros};
use crate::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};
use ferrite_core::{Error, Result, SamplerSettings};

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "llm_sample",
    src: concat!(include_str!("../quant.cuh"), include_str!("sample.cu")),
    prebuilt: crate::prebuilt::LLM_SAMPLE,
};

/// Bytes of `SampleParams` (sample.cu).
const PARAMS_BYTES: usize = 64;
/// Byte offset of `hist_len` in `SampleParams`.
const HIST_LEN_OFF: usize = 36;
/// Byte offset of the draw counter (u64) in `SampleParams`.
const STEP_OFF: usize = 56;

/// `SampleParams` of `cfg`, with an empty history of `hist_cap` tokens and draw counter 0.
fn params_bytes(cfg: &SamplerSettings, hist_cap: usize) -> [u8; PARAMS_BYTES] {
    let mut b = [0u8; PARAMS_BYTES];
    let greedy = cfg.temperature == 0.0;
    let inv_t = if greedy { 1.0 } else { 1.0 / cfg.temperature };
    let f = [
        inv_t,
        cfg.top_p,
        cfg.min_p,
        cfg.repeat_penalty,
        cfg.presence_penalty,
        cfg.frequency_penalty,
    ];
    for (i, v) in f.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    let clamp = |v: usize| v.min(u32::MAX as usize) as u32;
    let u = [
        clamp(cfg.top_k),
        clamp(cfg.penalty_last_n),
        u32::from(greedy),
        0,
        clamp(hist_cap),
        0,
    ];
    for (i, v) in u.iter().enumerate() {
        b[24 + i * 4..28 + i * 4].copy_from_slice(&v.to_le_bytes());
    }
    b[48..56].copy_from_slice(&cfg.seed.to_le_bytes());
    b
}

/// A sampler's state on the device: its settings and draw counter (`SampleParams`) and its
/// token history, with room for `cap` tokens. Its scratch is the kernel set's, one per logit
/// row (`sample_rows`).
pub struct SamplerState {
    params: Buffer,
    hist: Buffer,
    cap: usize,
}

impl SamplerState {
    /// The history starts empty and the draw counter at 0.
    pub fn new(dev: &CudaDevice, cfg: &SamplerSettings, cap: usize) -> Result<SamplerState> {
        let params = zeros(dev, PARAMS_BYTES, "llm sampler params")?;
        dev.write_bytes(&params, 0, &params_bytes(cfg, cap))?;
        let hist = zeros(dev, cap.max(1) * 4, "llm sampler history")?;
        Ok(SamplerState { params, hist, cap })
    }

    /// Replaces the history with `tokens` (their last `cap` if longer); the draw counter
    /// keeps counting.
    pub fn set_history(&self, dev: &CudaDevice, tokens: &[u32]) -> Result<()> {
        let t = &tokens[tokens.len().saturating_sub(self.cap)..];
        if !t.is_empty() {
            let b: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
            dev.write_bytes(&self.hist, 0, &b)?;
        }
        dev.write_bytes(&self.params, HIST_LEN_OFF, &(t.len() as u32).to_le_bytes())
    }
}

/// Bytes of `SpRow` (sample.cu): one row of a `sample_rows` table.
pub const ROW_BYTES: usize = 48;

/// One row of a `sample_rows` launch; addresses are device addresses.
pub struct SampleRow<'a> {
    /// The row's request's sampler.
    pub state: &'a SamplerState,
    /// f32 [vocab], penalized in place.
    pub logits: u64,
    /// u64 [vocab] of the row's own.
    pub scratch: u64,
    /// Where the u32 token goes.
    pub out: u64,
    /// A second place for the token (a mailbox slot the host reads), or 0.
    pub mail: u64,
}

/// Draws one token for each of `rows` in one launch (`sample_rows`, a block of 1024 threads per
/// row). `table` (at least `rows.len() * ROW_BYTES` bytes) is rewritten, stream-ordered,
/// before the launch.
pub fn sample_rows(
    dev: &CudaDevice,
    table: &Buffer,
    rows: &[SampleRow<'_>],
    vocab: usize,
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    if table.bytes() < rows.len() * ROW_BYTES {
        return Err(Error::backend(
            "sample_rows",
            format!("a table of {} bytes for {} rows", table.bytes(), rows.len()),
        ));
    }
    let mut b = Vec::with_capacity(rows.len() * ROW_BYTES);
    for r in rows {
        for p in [
            r.state.params.ptr(),
            r.state.hist.ptr(),
            r.logits,
            r.scratch,
            r.out,
            r.mail,
        ] {
            b.extend_from_slice(&p.to_le_bytes());
        }
    }
    dev.write_bytes(table, 0, &b)?;
    let cfg = LaunchConfig::new((rows.len() as u32, 1, 1), (1024, 1, 1), 0);
    let args = KernelArgs::new().arg(table.ptr()).arg(vocab as u32);
    super::launch(dev, "sample", &SOURCE, "sample_rows", cfg, args)
}

/// Samples one token from `logits` (f32 [vocab] on the device; penalized in place) with the
/// device sampler, as a step would (`sample_rows`, one row): `history` is the token history,
/// `step` the draw counter (the random number of draw `step` for `cfg.seed`). For tests of the
/// kernel against the CPU sampler: each call allocates the sampler's state and reads back the
/// token.
pub fn sample_once(
    dev: &CudaDevice,
    cfg: &SamplerSettings,
    logits: &Buffer,
    vocab: usize,
    history: &[u32],
    step: u64,
) -> Result<u32> {
    if logits.bytes() < vocab * 4 {
        return Err(Error::backend(
            "sample_once",
            format!(
                "{} bytes of logits for a vocabulary of {vocab}",
                logits.bytes()
            ),
        ));
    }
    let s = SamplerState::new(dev, cfg, history.len().max(1))?;
    s.set_history(dev, history)?;
    dev.write_bytes(&s.params, STEP_OFF, &step.to_le_bytes())?;
    let (table, scratch) = one_row_scratch(dev, vocab)?;
    let out = zeros(dev, 16, "llm sample token")?;
    let row = SampleRow {
        state: &s,
        logits: logits.ptr(),
        scratch: scratch.ptr(),
        out: out.ptr(),
        mail: 0,
    };
    sample_rows(dev, &table, &[row], vocab)?;
    let b = dev.read_bytes(&out, 0, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The row table and the u64 [vocab] scratch of a one-row `sample_rows`.
fn one_row_scratch(dev: &CudaDevice, vocab: usize) -> Result<(Buffer, Buffer)> {
    Ok((
        zeros(dev, ROW_BYTES, "llm sample table")?,
        zeros(dev, vocab * 8, "llm sampler scratch")?,
    ))
}

/// Draws `draws` tokens from the same `logits` (f32 [vocab], host), draw counters 0, 1, ...,
/// reading back once at the end (tests: the empirical distribution of the device sampler).
/// The logits are uploaded again before each draw (the penalties change them in place), and
/// the history is reset to `history` each time.
pub fn sample_many(
    dev: &CudaDevice,
    cfg: &SamplerSettings,
    logits: &[f32],
    history: &[u32],
    draws: usize,
) -> Result<Vec<u32>> {
    let vocab = logits.len();
    let s = SamplerState::new(dev, cfg, history.len() + 1)?;
    let lbytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let lbuf = upload_bytes(dev, &lbytes, "llm sample logits")?;
    let (table, scratch) = one_row_scratch(dev, vocab)?;
    let out = zeros(dev, draws.max(1) * 4, "llm sample tokens")?;
    for i in 0..draws {
        dev.write_bytes(&lbuf, 0, &lbytes)?;
        s.set_history(dev, history)?;
        let at = out.ptr() + (i * 4) as u64;
        let row = SampleRow {
            state: &s,
            logits: lbuf.ptr(),
            scratch: scratch.ptr(),
            out: at,
            mail: 0,
        };
        sample_rows(dev, &table, &[row], vocab)?;
    }
    let b = dev.read_bytes(&out, 0, draws * 4)?;
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
