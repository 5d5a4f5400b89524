//! What the device sampler tests of the CUDA and wgpu binaries share: test data, the CPU
//! sampler's probabilities as a reference, and the check of a device's draws against them.
#![allow(dead_code)]

use ferrite_llm::sampler::{Sampler, SamplerConfig};

/// Deterministic pseudo-random numbers (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// n values uniform in [-1, 1).
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

/// `logits` with the CPU sampler's penalties over the last `penalty_last_n` of `history`
/// (llama.cpp's formulas, once per distinct token with its count).
pub fn penalized(cfg: &SamplerConfig, logits: &[f32], history: &[u32]) -> Vec<f32> {
    let mut l = logits.to_vec();
    let pen = cfg.penalty_last_n > 0
        && (cfg.repeat_penalty != 1.0
            || cfg.presence_penalty != 0.0
            || cfg.frequency_penalty != 0.0);
    if pen {
        let w = &history[history.len().saturating_sub(cfg.penalty_last_n)..];
        let mut seen = std::collections::BTreeMap::new();
        for &t in w {
            *seen.entry(t).or_insert(0u32) += 1;
        }
        for (&t, &n) in &seen {
            let v = &mut l[t as usize];
            if *v > 0.0 {
                *v /= cfg.repeat_penalty;
            } else {
                *v *= cfg.repeat_penalty;
            }
            *v -= n as f32 * cfg.frequency_penalty + cfg.presence_penalty;
        }
    }
    l
}

/// The CPU sampler's probabilities (crate::sampler's documented order: penalties, argmax at
/// temperature 0, temperature, top-k, top-p, min-p, renormalized), in f64.
pub fn cpu_probs(cfg: &SamplerConfig, logits: &[f32], history: &[u32]) -> Vec<f64> {
    let l = penalized(cfg, logits, history);
    let mut p = vec![0f64; l.len()];
    if cfg.temperature == 0.0 {
        p[ferrite_llm::generate::argmax(&l) as usize] = 1.0;
        return p;
    }
    let inv_t = 1.0 / cfg.temperature;
    let mut c: Vec<(f32, u32)> = l
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (v * inv_t, i as u32))
        .collect();
    c.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    if cfg.top_k > 0 {
        c.truncate(cfg.top_k);
    }
    let max = f64::from(c[0].0);
    let z: f64 = c.iter().map(|&(v, _)| (f64::from(v) - max).exp()).sum();
    let mut keep = c.len();
    let mut cum = 0.0;
    for (i, &(v, _)) in c.iter().enumerate() {
        let q = (f64::from(v) - max).exp() / z;
        if q < f64::from(cfg.min_p) / z {
            keep = i.max(1);
            break;
        }
        cum += q;
        if cum >= f64::from(cfg.top_p) {
            keep = i + 1;
            break;
        }
    }
    let kept = &c[..keep];
    let t: f64 = kept.iter().map(|&(v, _)| (f64::from(v) - max).exp()).sum();
    for &(v, id) in kept {
        p[id as usize] = (f64::from(v) - max).exp() / t;
    }
    p
}

/// Frequencies of the token ids `ids` over a vocabulary of `vocab`.
pub fn histogram(ids: &[u32], vocab: usize) -> Vec<f64> {
    let mut h = vec![0f64; vocab];
    for &t in ids {
        h[t as usize] += 1.0;
    }
    h.iter_mut().for_each(|v| *v /= ids.len() as f64);
    h
}

/// Checks a device's draws `ids` (from `logits`, `history`, settings `cfg`) against
/// `cpu_probs`: no token outside the CPU's kept set, every frequency within `tol` of its
/// probability; and the reference itself against as many of the CPU sampler's own draws.
/// `who` names the device in messages. Returns the device's max |freq - p|.
pub fn check_draws(
    who: &str,
    name: &str,
    cfg: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
    ids: &[u32],
    tol: f64,
) -> f64 {
    let vocab = logits.len();
    let p = cpu_probs(cfg, logits, history);
    for &t in ids {
        assert!(
            (t as usize) < vocab && p[t as usize] > 0.0,
            "{name}: drew token {t}, outside the CPU's kept set"
        );
    }
    let max_diff = |h: &[f64]| {
        h.iter()
            .zip(&p)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    };
    let dev_max = max_diff(&histogram(ids, vocab));
    let mut cpu = Sampler::new(cfg.clone()).unwrap();
    let cpu_ids: Vec<u32> = (0..ids.len())
        .map(|_| cpu.sample(&mut logits.to_vec(), history).unwrap())
        .collect();
    let cpu_max = max_diff(&histogram(&cpu_ids, vocab));
    let kept = p.iter().filter(|&&v| v > 0.0).count();
    eprintln!(
        "sampler {name}: {kept} kept of {vocab}, {} draws: max |freq - p| {who} {dev_max:.4}, \
         CPU sampler {cpu_max:.4} (bound {tol:.4})",
        ids.len()
    );
    assert!(
        cpu_max < tol,
        "{name}: the reference disagrees with the CPU sampler: {cpu_max}"
    );
    assert!(dev_max < tol, "{name}: {who} frequencies off by {dev_max}");
    dev_max
}
