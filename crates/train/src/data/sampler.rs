//! Which examples an epoch visits, in which order: a pure function of (sampler, dataset
//! length, seed, epoch), so a resumed run replays the same order without saved RNG state.

use crate::{Error, Result};
use ferrite_core::rng;

/// PyTorch's samplers.
#[derive(Clone, Debug, PartialEq)]
pub enum Sampler {
    /// 0, 1, ..., len - 1.
    Sequential,
    /// A fresh permutation each epoch (`replacement: false`), or `num_samples` uniform draws.
    Random {
        replacement: bool,
        num_samples: Option<usize>,
    },
    /// `num_samples` indices drawn with probability proportional to `weights` (one per example).
    Weighted {
        weights: Vec<f64>,
        num_samples: usize,
        replacement: bool,
    },
}

/// Uniform f64 in [0, 1) from the Philox stream (seed, epoch) at `counter`: 53 bits from two
/// words.
fn unit(seed: u64, epoch: u64, counter: u64) -> f64 {
    let w = rng::words(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15), counter);
    let bits = ((w[0] as u64) << 21) ^ (w[1] as u64 >> 11);
    (bits & ((1u64 << 53) - 1)) as f64 / (1u64 << 53) as f64
}

/// Uniform integer in [0, n) (n > 0).
fn below(seed: u64, epoch: u64, counter: u64, n: usize) -> usize {
    ((unit(seed, epoch, counter) * n as f64) as usize).min(n - 1)
}

impl Sampler {
    pub fn validate(&self, len: usize) -> Result<()> {
        let what = "Sampler";
        match self {
            Sampler::Sequential => Ok(()),
            Sampler::Random {
                replacement,
                num_samples,
            } => match num_samples {
                Some(0) => Err(Error::config(what, "num_samples must be at least 1, got 0")),
                Some(n) if !replacement && *n > len => Err(Error::config(
                    what,
                    format!("{n} samples without replacement from a dataset of {len}"),
                )),
                _ => Ok(()),
            },
            Sampler::Weighted {
                weights,
                num_samples,
                replacement,
            } => {
                if weights.len() != len {
                    return Err(Error::config(
                        what,
                        format!("{} weights for a dataset of {len} examples", weights.len()),
                    ));
                }
                if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
                    return Err(Error::config(
                        what,
                        format!("weights must be finite and >= 0, got {w}"),
                    ));
                }
                let positive = weights.iter().filter(|w| **w > 0.0).count();
                if positive == 0 {
                    return Err(Error::config(what, "every weight is zero"));
                }
                if *num_samples == 0 {
                    return Err(Error::config(what, "num_samples must be at least 1, got 0"));
                }
                if !replacement && *num_samples > positive {
                    return Err(Error::config(
                        what,
                        format!(
                            "{num_samples} samples without replacement, only {positive} weights are positive"
                        ),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// The indices epoch `epoch` visits (validated sampler).
pub fn epoch_order(sampler: &Sampler, len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    match sampler {
        Sampler::Sequential => (0..len).collect(),
        Sampler::Random {
            replacement: false,
            num_samples,
        } => {
            // Fisher–Yates over the whole range; the first num_samples are taken.
            let mut v: Vec<usize> = (0..len).collect();
            for i in (1..len).rev() {
                let j = below(seed, epoch, i as u64, i + 1);
                v.swap(i, j);
            }
            v.truncate(num_samples.unwrap_or(len));
            v
        }
        Sampler::Random {
            replacement: true,
            num_samples,
        } => (0..num_samples.unwrap_or(len))
            .map(|i| below(seed, epoch, i as u64, len))
            .collect(),
        Sampler::Weighted {
            weights,
            num_samples,
            replacement,
        } => {
            if *replacement {
                let mut cdf = Vec::with_capacity(weights.len());
                let mut acc = 0.0;
                for w in weights {
                    acc += w;
                    cdf.push(acc);
                }
                (0..*num_samples)
                    .map(|i| {
                        let u = unit(seed, epoch, i as u64) * acc;
                        cdf.partition_point(|&c| c <= u).min(weights.len() - 1)
                    })
                    .collect()
            } else {
                // Efraimidis–Spirakis: the num_samples largest keys u^(1/w).
                let mut keys: Vec<(f64, usize)> = weights
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| **w > 0.0)
                    .map(|(i, w)| (unit(seed, epoch, i as u64).ln() / w, i))
                    .collect();
                keys.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                keys.into_iter()
                    .take(*num_samples)
                    .map(|(_, i)| i)
                    .collect()
            }
        }
    }
}
