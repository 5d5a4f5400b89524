//! Per-request logit processing ahead of the sampler: a hook the engine calls with a
//! request's logits before its [`crate::sampler::Sampler`] runs (logit bias, constrained
//! decoding), and again with the token that was sampled.

use crate::error::{Error, Result};

/// Changes one request's logits before sampling. `process` gets the request's logits row
/// (one entry per vocabulary token) and its tokens so far (prompt then generated, oldest
/// first); `accept` gets the token then sampled (also when it is a stop token).
pub trait LogitsProcessor: Send {
    fn process(&mut self, logits: &mut [f32], history: &[u32]) -> Result<()>;
    fn accept(&mut self, token: u32);
}

/// OpenAI's `logit_bias`: a value added to the logit of each listed token; a bias of -100
/// or less bans the token (its logit becomes -inf), as OpenAI documents for -100.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogitBias {
    bias: Vec<(u32, f32)>,
}

impl LogitBias {
    /// Every id must be below `vocab` and every bias finite; the error names the first that
    /// is not.
    pub fn new(bias: Vec<(u32, f32)>, vocab: usize) -> Result<LogitBias> {
        if let Some(&(id, _)) = bias.iter().find(|(id, _)| *id as usize >= vocab) {
            return Err(Error::Token { id, vocab });
        }
        if let Some(&(id, b)) = bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(Error::Other(format!(
                "logit_bias: the bias of token {id} must be finite, got {b}"
            )));
        }
        Ok(LogitBias { bias })
    }

    pub fn is_empty(&self) -> bool {
        self.bias.is_empty()
    }
}

impl LogitsProcessor for LogitBias {
    fn process(&mut self, logits: &mut [f32], _history: &[u32]) -> Result<()> {
        for &(id, b) in &self.bias {
            let Some(l) = logits.get_mut(id as usize) else {
                return Err(Error::Token {
                    id,
                    vocab: logits.len(),
                });
            };
            *l = if b <= -100.0 {
                f32::NEG_INFINITY
            } else {
                *l + b
            };
        }
        Ok(())
    }

    fn accept(&mut self, _token: u32) {}
}

/// Several processors, run in order on the same logits (e.g. a logit bias, then a grammar
/// constraint, so the bias cannot unmask what the grammar forbids); each accepts every token.
pub struct Chain(pub Vec<Box<dyn LogitsProcessor>>);

impl LogitsProcessor for Chain {
    fn process(&mut self, logits: &mut [f32], history: &[u32]) -> Result<()> {
        for p in &mut self.0 {
            p.process(logits, history)?;
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) {
        for p in &mut self.0 {
            p.accept(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_adds_and_bans() {
        let mut b = LogitBias::new(vec![(0, 2.5), (2, -100.0)], 3).unwrap();
        let mut l = [1.0, 1.0, 9.0];
        b.process(&mut l, &[]).unwrap();
        assert_eq!(l, [3.5, 1.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn bias_checks_ids_and_values() {
        let e = LogitBias::new(vec![(3, 1.0)], 3).unwrap_err().to_string();
        assert!(e.contains("token id 3"), "{e}");
        let e = LogitBias::new(vec![(1, f32::NAN)], 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("finite"), "{e}");
    }
}
