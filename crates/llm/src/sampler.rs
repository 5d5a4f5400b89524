//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
//! penalties over a recent window, and a seeded RNG of our own (same seed, same tokens, on
//! every platform). Plus [`StopStrings`], which holds back text that may begin a stop string.
//!
//! Order of operations on the logits (transformers' order):
//! 1. penalties over the last `penalty_last_n` tokens of the history (llama.cpp's formulas);
//! 2. `temperature == 0`: the argmax (lowest id on ties), done;
//! 3. divide by the temperature, softmax;
//! 4. keep the `top_k` most likely (0 = all), then the smallest set whose probability reaches
//!    `top_p` (1 = all), then those with probability >= `min_p` x the largest (0 = all);
//! 5. draw from the kept tokens, renormalized.

use std::collections::HashMap;

#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum SamplerError {
    /// A setting out of its range; names the setting, its range and the value.
    #[error("sampler: {name} must be {range}, got {value}")]
    Config {
        name: &'static str,
        range: &'static str,
        value: String,
    },
    #[error("sampler: {0}")]
    Logits(String),
}

/// Sampling settings. `Default` is llama.cpp's defaults; [`SamplerConfig::greedy`] is argmax.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy; otherwise logits are divided by it. Finite, >= 0.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = no limit.
    pub top_k: usize,
    /// Nucleus: keep the smallest set with probability >= top_p. In (0, 1]; 1 = off.
    pub top_p: f32,
    /// Keep tokens with probability >= min_p x the top probability. In [0, 1]; 0 = off.
    pub min_p: f32,
    /// Divides positive logits / multiplies negative ones of recent tokens. > 0; 1 = off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every recent token. Finite; 0 = off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every recent token. Finite; 0 = off.
    pub frequency_penalty: f32,
    /// How many of the last history tokens the penalties look at; 0 = none.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Argmax, no penalties.
    pub fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        }
    }

    /// Whether these settings always pick the argmax of the raw logits (lowest id on ties),
    /// as a kernel set's own greedy pick does.
    pub fn is_plain_greedy(&self) -> bool {
        let no_penalty = self.penalty_last_n == 0
            || (self.repeat_penalty == 1.0
                && self.presence_penalty == 0.0
                && self.frequency_penalty == 0.0);
        self.temperature == 0.0 && no_penalty
    }

    /// Checks every setting's range (see the field docs).
    /// The device samplers' settings (ferrite-cuda's and ferrite-wgpu's), after `validate`.
    pub fn settings(&self) -> Result<ferrite_core::SamplerSettings, SamplerError> {
        self.validate()?;
        Ok(ferrite_core::SamplerSettings {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.penalty_last_n,
            seed: self.seed,
        })
    }

    pub fn validate(&self) -> Result<(), SamplerError> {
        let bad = |name, range, value: f32| {
            Err(SamplerError::Config {
                name,
                range,
                value: value.to_string(),
            })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", "finite and >= 0", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "in (0, 1]", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "in [0, 1]", self.min_p);
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", "finite and > 0", self.repeat_penalty);
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", "finite", self.presence_penalty);
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", "finite", self.frequency_penalty);
        }
        Ok(())
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, and the same stream everywhere.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1), 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A sampler: settings, RNG state and scratch space, reused across steps.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    cand: Vec<(f32, u32)>,
    counts: HashMap<u32, u32>,
    ignore_eos: bool,
    cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Sampler {
    /// Validates `cfg` and seeds the RNG with `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Result<Sampler, SamplerError> {
        cfg.validate()?;
        Ok(Sampler {
            rng: Rng::new(cfg.seed),
            cfg,
            cand: Vec::new(),
            counts: HashMap::new(),
            ignore_eos: false,
            cancel: None,
        })
    }

    /// A flag that, once set (e.g. by a Ctrl-C handler), ends the generation in progress
    /// before its next token (`StopReason::Interrupted`). The loop does not clear it.
    pub fn set_cancel(&mut self, flag: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>) {
        self.cancel = flag;
    }

    /// Whether the cancel flag is set.
    pub fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// With `true`, an end-of-generation token does not end generation: the loop feeds it
    /// back like any other token (it prints nothing) and goes on to the token limit
    /// (`--ignore-eos`, for benchmarks and long outputs).
    pub fn set_ignore_eos(&mut self, on: bool) {
        self.ignore_eos = on;
    }

    pub fn ignores_eos(&self) -> bool {
        self.ignore_eos
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token from `logits` (one per vocab entry; modified in place by the
    /// penalties) given the tokens so far (`history`, oldest first). NaN logits count as
    /// -inf; no finite logit, or a history token outside the vocabulary, is an error.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32, SamplerError> {
        if logits.is_empty() {
            return Err(SamplerError::Logits("empty logits".to_string()));
        }
        self.apply_penalties(logits, history)?;
        if self.cfg.temperature == 0.0 {
            return argmax(logits)
                .ok_or_else(|| SamplerError::Logits("no finite logit".to_string()));
        }
        let inv_t = 1.0 / self.cfg.temperature;
        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (l * inv_t, i as u32)),
        );
        if self.cand.is_empty() {
            return Err(SamplerError::Logits("no finite logit".to_string()));
        }
        let by_logit_desc =
            |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let k = self.cfg.top_k;
        if k > 0 && k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit_desc);
            self.cand.truncate(k);
        }
        // Softmax over the candidates (max-subtracted, f64): p_i = exp(l_i - max) / z.
        let max = self
            .cand
            .iter()
            .map(|c| c.0)
            .fold(f32::NEG_INFINITY, f32::max);
        let max = f64::from(max);
        let z: f64 = self
            .cand
            .iter()
            .map(|&(l, _)| (f64::from(l) - max).exp())
            .sum();
        let prob = |l: f32| (f64::from(l) - max).exp() / z;
        let top_p = f64::from(self.cfg.top_p);
        let floor = f64::from(self.cfg.min_p) / z; // min_p x the top probability (1/z)
        let filtering = self.cfg.top_p < 1.0 || self.cfg.min_p > 0.0;
        // Only the head of the sorted order matters for the cut: sort a prefix of m tokens,
        // and grow it (x4) until the cut falls inside it, so a peaked distribution over a large
        // vocabulary costs O(n), not a full sort.
        let n = self.cand.len();
        let mut m = if filtering { n.min(64) } else { n };
        let keep = loop {
            if !filtering {
                break n; // every candidate stays; any order samples the same distribution
            }
            if m < n {
                self.cand.select_nth_unstable_by(m - 1, by_logit_desc);
            }
            self.cand[..m].sort_unstable_by(by_logit_desc);
            let mut cum = 0.0;
            let mut cut = None;
            for (i, &(l, _)) in self.cand[..m].iter().enumerate() {
                let p = prob(l);
                if p < floor {
                    cut = Some(i.max(1));
                    break;
                }
                cum += p;
                if cum >= top_p {
                    cut = Some(i + 1);
                    break;
                }
            }
            match cut {
                Some(k) => break k,
                None if m == n => break n,
                None => m = n.min(m * 4),
            }
        };
        let kept_total: f64 = self.cand[..keep].iter().map(|c| prob(c.0)).sum();
        let mut u = self.rng.next_f64() * kept_total;
        for &(l, id) in &self.cand[..keep] {
            let p = prob(l);
            if u < p {
                return Ok(id);
            }
            u -= p;
        }
        // Rounding left u at the very end: the last kept token.
        Ok(self.cand[keep - 1].1)
    }

    /// llama.cpp's penalties: for each token among the last `penalty_last_n` of `history`,
    /// seen `c` times: divide a positive logit (multiply a negative one) by `repeat_penalty`,
    /// then subtract `c * frequency_penalty + presence_penalty`.
    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) -> Result<(), SamplerError> {
        let c = &self.cfg;
        if c.penalty_last_n == 0
            || (c.repeat_penalty == 1.0 && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0)
        {
            return Ok(());
        }
        let window = &history[history.len().saturating_sub(c.penalty_last_n)..];
        self.counts.clear();
        for &t in window {
            if t as usize >= logits.len() {
                return Err(SamplerError::Logits(format!(
                    "history token {t} is out of range for {} logits",
                    logits.len()
                )));
            }
            *self.counts.entry(t).or_insert(0) += 1;
        }
        for (&t, &n) in &self.counts {
            let l = &mut logits[t as usize];
            if *l > 0.0 {
                *l /= c.repeat_penalty;
            } else {
                *l *= c.repeat_penalty;
            }
            *l -= n as f32 * c.frequency_penalty + c.presence_penalty;
        }
        Ok(())
    }
}

/// Index of the largest finite logit (NaN and infinities ignored; lowest id on ties), or of
/// +inf if one is present.
fn argmax(logits: &[f32]) -> Option<u32> {
    // Two passes the compiler vectorizes: the largest value in 16 lanes (a NaN compares false,
    // so it is never taken), then the first index holding it. The first index of the largest
    // value is the lowest id among ties, as [`argmax_scalar`] picks.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = logits.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            if l > *m {
                *m = l;
            }
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &l in lanes.iter().chain(rest) {
        if l > max {
            max = l;
        }
    }
    if max == f32::NEG_INFINITY {
        return None;
    }
    let c = logits
        .chunks(16)
        .position(|c| c.iter().fold(false, |any, &l| any | (l == max)))?;
    let i = logits[16 * c..].iter().position(|&l| l == max)?;
    Some((16 * c + i) as u32)
}

/// The reference of [`argmax`]: the lowest id of the largest logit that is neither NaN nor
/// `-inf`; `None` where there is none.
#[cfg(test)]
fn argmax_scalar(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(f32, u32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY {
            continue;
        }
        if best.is_none_or(|(b, _)| l > b) {
            best = Some((l, i as u32));
        }
    }
    best.map(|(_, i)| i)
}

/// Stop strings for streamed text: text that could still turn into a stop string is held
/// back until it is clear either way.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopStrings {
    /// Empty strings in `stops` are ignored.
    pub fn new(stops: impl IntoIterator<Item = impl Into<String>>) -> StopStrings {
        StopStrings {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            ..StopStrings::default()
        }
    }

    /// Adds newly decoded text; returns what may be shown now. After a stop string appears,
    /// returns the text before it and [`StopStrings::stopped`] turns true.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(text);
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = self.held[..pos].to_string();
            self.held.clear();
            return out;
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in self.held.char_indices() {
                let tail = &self.held[i..];
                if tail.len() < s.len() && s.starts_with(tail) {
                    hold = hold.max(tail.len());
                    break;
                }
            }
        }
        let cut = self.held.len() - hold;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The text still held back (shown when generation ends without a stop).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-pass argmax picks what the one-pass reference picks: ties (the lowest id),
    /// NaN and -inf skipped, +inf, signed zeros, lengths around the 16-lane chunks.
    #[test]
    fn argmax_equals_scalar_reference() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 40) as u32
        };
        for n in [0usize, 1, 15, 16, 17, 33, 49152] {
            for case in 0..8 {
                let mut v: Vec<f32> = (0..n).map(|_| (next() % 64) as f32 - 32.0).collect();
                for x in v.iter_mut() {
                    match (case, next() % 50) {
                        (1, 0) => *x = f32::NAN,
                        (2, 0) => *x = f32::NEG_INFINITY,
                        (3, 0) => *x = f32::INFINITY,
                        (4, _) => *x = f32::NAN,
                        (5, _) => *x = if next() % 2 == 0 { 0.0 } else { -0.0 },
                        (6, _) => *x = f32::NEG_INFINITY,
                        _ => {}
                    }
                }
                assert_eq!(argmax(&v), argmax_scalar(&v), "n={n} case {case}");
            }
        }
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), None);
    }
}
