//! `sample.wgsl`: token sampling on the device after a step's logits (`sample_rows`, a
//! workgroup per logit row): penalties, temperature, top-k, top-p, min-p and one draw from a
//! counter-based random stream, the CPU sampler's operations in its order. Each sampling
//! request has a state on the device ([`state_words`]: its settings, draw
//! counter and a ring of its last tokens), kept for a kernel set's requests in one buffer
//! ([`SamplerArena`]). [`sample_many`] and [`sample_once`] run the kernel alone (tests).

use std::collections::HashMap;

use ferrite_core::{Error, Result, SamplerSettings};

use super::{check_binding, compile, map_words, word, zeros, Dispatch, Module};
use crate::qmatrix;
use crate::WgpuDevice;

/// The module's source with 256 threads a workgroup ([`sample_source`] for others).
pub const SAMPLE: &str = include_str!("sample.wgsl");
/// Its entry points.
pub const ENTRIES: &[&str] = &["sample_rows"];

/// Workgroup sizes of `sample.wgsl`: 256 on every adapter, 1024 where its limits allow.
pub const SAMPLE_THREADS: [u32; 2] = [256, 1024];

/// `sample.wgsl` with `threads` threads a workgroup (one of [`SAMPLE_THREADS`]).
pub fn sample_source(threads: u32) -> String {
    SAMPLE.replace(
        "const SW: u32 = 256u;",
        &format!("const SW: u32 = {threads}u;"),
    )
}

/// Workgroup memory `sample.wgsl` takes with 1024 threads, at most (16 bytes a thread, 4 KiB
/// of bins and a few scalars): more than the 16 KiB every adapter offers, so that size runs
/// only where the adapter's limit allows it (the naga test checks the module against it).
pub const SAMPLE_1024_WORKGROUP_BYTES: u32 = 16 * 1024 + 4096 + 256;

/// The workgroup size the device sampler takes on `dev`: 1024 threads on a GPU that allows a
/// workgroup of 1024 and `SAMPLE_1024_WORKGROUP_BYTES` of workgroup memory, else 256 (the
/// size every adapter allows). A CPU adapter takes 256: there the wider workgroup runs no
/// faster and its barriers cost more (lavapipe: the sampler tests 4x slower).
pub fn sample_threads(dev: &WgpuDevice) -> u32 {
    let l = dev.limits();
    let big = SAMPLE_THREADS[1];
    if !dev.is_cpu()
        && l.max_compute_invocations_per_workgroup >= big
        && l.max_compute_workgroup_size_x >= big
        && l.max_compute_workgroup_storage_size >= SAMPLE_1024_WORKGROUP_BYTES
    {
        big
    } else {
        SAMPLE_THREADS[0]
    }
}

/// Words of a sampler's state before its history ring (`HEAD` of `sample.wgsl`).
pub const SAMPLER_HEAD: usize = 16;

/// The history ring of a sampler `s` whose history may grow to `cap` tokens: the last
/// `penalty_last_n` tokens (no more than `cap`), none where no penalty applies.
pub fn ring(s: &SamplerSettings, cap: usize) -> usize {
    let pen = s.repeat_penalty != 1.0 || s.presence_penalty != 0.0 || s.frequency_penalty != 0.0;
    if pen {
        s.penalty_last_n.min(cap).min(u32::MAX as usize)
    } else {
        0
    }
}

/// The state of sampler `s` in `sample.wgsl`'s layout ([`SAMPLER_HEAD`] words of settings and
/// counters, then a ring of `ring` tokens): history `history` (its last `ring` tokens kept),
/// draw counter `step`.
pub fn state_words(s: &SamplerSettings, history: &[u32], ring: usize, step: u64) -> Vec<u32> {
    let greedy = s.temperature == 0.0;
    let inv_t: f32 = if greedy { 1.0 } else { 1.0 / s.temperature };
    let clamp = |v: usize| v.min(u32::MAX as usize) as u32;
    let mut w = vec![0u32; SAMPLER_HEAD + ring];
    w[..6].copy_from_slice(&[
        inv_t.to_bits(),
        s.top_p.to_bits(),
        s.min_p.to_bits(),
        s.repeat_penalty.to_bits(),
        s.presence_penalty.to_bits(),
        s.frequency_penalty.to_bits(),
    ]);
    w[6] = clamp(s.top_k);
    w[7] = clamp(s.penalty_last_n);
    w[8] = u32::from(greedy);
    w[9] = clamp(history.len());
    w[10] = ring as u32;
    w[12] = s.seed as u32;
    w[13] = (s.seed >> 32) as u32;
    w[14] = step as u32;
    w[15] = (step >> 32) as u32;
    if ring > 0 {
        let first = history.len().saturating_sub(ring);
        for (h, &tok) in history.iter().enumerate().skip(first) {
            w[SAMPLER_HEAD + h % ring] = tok;
        }
    }
    w
}

/// Device samplers' states packed in one buffer (which `sample_rows` binds), by request id.
/// States are appended; when the buffer is full, the live ones are copied, packed, into a new
/// buffer (twice their size plus the new one).
#[derive(Default)]
pub struct SamplerArena {
    buf: Option<wgpu::Buffer>,
    /// Words the buffer holds, and words from its start taken (live states and gaps).
    cap: usize,
    end: usize,
    /// Request id -> (first word, words) of its state.
    at: HashMap<u64, (usize, usize)>,
}

impl SamplerArena {
    /// Stores state `words` for request `id` on `dev` (replacing its state, if it has one).
    pub fn add(&mut self, dev: &WgpuDevice, id: u64, words: &[u32]) -> Result<()> {
        const OP: &str = "add_sampler";
        self.at.remove(&id);
        let n = words.len();
        if self.buf.is_none() || self.end + n > self.cap {
            let live: usize = self.at.values().map(|r| r.1).sum();
            let cap = (2 * (live + n)).next_power_of_two().max(1024);
            check_binding(
                dev,
                OP,
                &format!("the states of {} device samplers", self.at.len() + 1),
                cap * 4,
            )?;
            let d = dev.raw_device();
            let buf = zeros(d, "llm device samplers", cap * 4);
            let mut end = 0;
            if let Some(old) = &self.buf {
                let mut enc =
                    d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                let mut live: Vec<_> = self.at.iter_mut().collect();
                live.sort_by_key(|(_, r)| r.0);
                for (_, r) in live {
                    let bytes = (r.1 * 4) as u64;
                    enc.copy_buffer_to_buffer(old, (r.0 * 4) as u64, &buf, (end * 4) as u64, bytes);
                    r.0 = end;
                    end += r.1;
                }
                dev.raw_queue().submit([enc.finish()]);
            }
            self.buf = Some(buf);
            self.cap = cap;
            self.end = end;
        }
        let Some(buf) = &self.buf else {
            return Err(Error::backend(OP, "no state buffer"));
        };
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        dev.raw_queue()
            .write_buffer(buf, (self.end * 4) as u64, &bytes);
        self.at.insert(id, (self.end, n));
        self.end += n;
        Ok(())
    }

    /// Forgets request `id`'s state (its words are reclaimed when the buffer is repacked, or
    /// when no sampler is left).
    pub fn remove(&mut self, id: u64) {
        self.at.remove(&id);
        if self.at.is_empty() {
            self.end = 0;
        }
    }

    /// The first word of request `id`'s state in [`SamplerArena::buffer`], if it has one.
    pub fn offset(&self, id: u64) -> Option<usize> {
        self.at.get(&id).map(|r| r.0)
    }

    /// The buffer of the states (none before the first `add`).
    pub fn buffer(&self) -> Option<&wgpu::Buffer> {
        self.buf.as_ref()
    }
}

/// A row `sample_rows` draws: its sampler's state at word `state` of the states buffer, its
/// logits row `row`, the slot of its token in the tokens buffer.
#[derive(Clone, Copy, Debug)]
pub struct SampleRow {
    pub state: usize,
    pub row: usize,
    pub slot: usize,
}

/// Bytes of `sample_rows`' masses for `rows` rows of `vocab` logits (u64 `[rows][vocab]`).
pub fn masses_bytes(rows: usize, vocab: usize) -> usize {
    rows * vocab * 8
}

/// `sample_rows` with `threads` threads a workgroup, a workgroup per row of `rows`: draws the
/// row's token into `toks[slot]` (u32) with the sampler at `states[state..]` (u32), penalizing
/// row `row` of `logits` (`[..][vocab]`) in place, and advances the sampler's history and
/// draw counter; workgroup i uses `masses` ([`masses_bytes`] of `rows.len()` rows) row i.
pub fn sample_rows(
    threads: u32,
    vocab: usize,
    rows: &[SampleRow],
    states: &wgpu::Buffer,
    logits: &wgpu::Buffer,
    masses: &wgpu::Buffer,
    toks: &wgpu::Buffer,
) -> Result<Dispatch> {
    const OP: &str = "sample_rows";
    let mut params = Vec::with_capacity(2 + 3 * rows.len());
    params.extend([word(OP, "vocab", vocab)?, word(OP, "rows", rows.len())?]);
    for r in rows {
        params.extend([
            word(OP, "sampler offset", r.state)?,
            word(OP, "logit row", r.row)?,
            word(OP, "token slot", r.slot)?,
        ]);
    }
    Ok(Dispatch {
        module: Module::Sample(threads),
        entry: OP,
        params,
        binds: vec![
            (1, states.clone()),
            (2, logits.clone()),
            (3, masses.clone()),
            (4, toks.clone()),
        ],
        groups: rows.len(),
    })
}

/// Draws `draws` tokens from the same `logits` (f32 [vocab]) with the device sampler of
/// settings `s`, draw i with draw counter i, the logits and the history `history` as given
/// (the penalties apply to a fresh copy each time), reading back once per batch of draws.
/// Draws run as rows of `sample_rows` dispatches, up to 4M logits a batch.
pub fn sample_many(
    dev: &WgpuDevice,
    s: &SamplerSettings,
    logits: &[f32],
    history: &[u32],
    draws: usize,
) -> Result<Vec<u32>> {
    sample_draws(dev, s, logits, history, 0, draws, sample_threads(dev))
}

/// [`sample_many`] with workgroups of `threads` threads (one of [`SAMPLE_THREADS`]; the draws
/// do not depend on it).
pub fn sample_many_threads(
    dev: &WgpuDevice,
    s: &SamplerSettings,
    logits: &[f32],
    history: &[u32],
    draws: usize,
    threads: u32,
) -> Result<Vec<u32>> {
    if !SAMPLE_THREADS.contains(&threads) {
        return Err(Error::backend(
            "sample_many",
            format!("{threads} threads a workgroup (256 or 1024)"),
        ));
    }
    sample_draws(dev, s, logits, history, 0, draws, threads)
}

/// The token the device sampler of settings `s` draws from `logits` (f32 [vocab]; a copy is
/// penalized) with history `history` at draw counter `step`, as a step's `sample_rows` would.
pub fn sample_once(
    dev: &WgpuDevice,
    s: &SamplerSettings,
    logits: &[f32],
    history: &[u32],
    step: u64,
) -> Result<u32> {
    let t = sample_draws(dev, s, logits, history, step, 1, sample_threads(dev))?;
    t.first()
        .copied()
        .ok_or_else(|| Error::backend("sample_once", "no token drawn"))
}

/// `draws` draws of `sample_many`, draw counters `first`, `first + 1`, ...
fn sample_draws(
    dev: &WgpuDevice,
    s: &SamplerSettings,
    logits: &[f32],
    history: &[u32],
    first: u64,
    draws: usize,
    threads: u32,
) -> Result<Vec<u32>> {
    const OP: &str = "sample_many";
    let vocab = logits.len();
    if vocab == 0 {
        return Err(Error::backend(OP, "no logits"));
    }
    let d = dev.raw_device();
    let q = dev.raw_queue();
    let module = Module::Sample(threads);
    let pipe = compile(d, module.label(), module.source(), "sample_rows")?;
    let ring_len = ring(s, history.len());
    let words = SAMPLER_HEAD + ring_len;
    let batch = ((4 << 20) / vocab).clamp(1, 4096).min(draws.max(1));
    check_binding(
        dev,
        OP,
        &format!("masses for {batch} draws from a vocabulary of {vocab}"),
        masses_bytes(batch, vocab),
    )?;
    let states = zeros(d, "sample_many states", batch * words * 4);
    let lbuf = zeros(d, "sample_many logits", batch * vocab * 4);
    let qs = zeros(d, "sample_many masses", masses_bytes(batch, vocab));
    let toks = zeros(d, "sample_many tokens", batch * 4);
    let rb = d.create_buffer(&wgpu::BufferDescriptor {
        label: Some("sample_many readback"),
        size: (batch * 4).max(4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let lrow: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let lbytes = lrow.repeat(batch);
    let mut out = Vec::with_capacity(draws);
    while out.len() < draws {
        let rows = batch.min(draws - out.len());
        let mut sw = Vec::with_capacity(rows * words);
        let mut picks = Vec::with_capacity(rows);
        for r in 0..rows {
            let step = first + (out.len() + r) as u64;
            sw.extend(state_words(s, history, ring_len, step));
            picks.push(SampleRow {
                state: r * words,
                row: r,
                slot: r,
            });
        }
        let disp = sample_rows(threads, vocab, &picks, &states, &lbuf, &qs, &toks)?;
        let sb: Vec<u8> = sw.iter().flat_map(|w| w.to_le_bytes()).collect();
        q.write_buffer(&states, 0, &sb);
        q.write_buffer(&lbuf, 0, &lbytes[..rows * vocab * 4]);
        let pb: Vec<u8> = disp.params.iter().flat_map(|w| w.to_le_bytes()).collect();
        let pbuf = qmatrix::upload_bytes(d, "sample_many params", &pb)?;
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: pbuf.as_entire_binding(),
        }];
        for (binding, b) in &disp.binds {
            entries.push(wgpu::BindGroupEntry {
                binding: *binding,
                resource: b.as_entire_binding(),
            });
        }
        let bind = d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.layout,
            entries: &entries,
        });
        let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("sample_many"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipe.pipe);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(disp.groups as u32, 1, 1);
        }
        enc.copy_buffer_to_buffer(&toks, 0, &rb, 0, (rows * 4) as u64);
        let idx = q.submit([enc.finish()]);
        out.extend(map_words(dev, OP, &rb, rows * 4, Some(idx))?);
    }
    Ok(out)
}
