//! The generation loop: prefill a prompt, then sample, stream and feed back one token at a
//! time until a stop condition.

use std::time::Instant;

use crate::engine::EngineKernels;
use crate::error::{Error, Result};
use crate::model::{Logits, Session};
use crate::sampler::{Sampler, StopStrings};
use crate::tokenizer::{StreamDecoder, TokenType, Tokenizer};

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token (EOS/EOT) was sampled; it is not part of the output.
    EndOfText,
    MaxTokens,
    StopString,
    /// The sampler's cancel flag was set (Ctrl-C in `ferrite chat`).
    Interrupted,
}

impl StopReason {
    /// Plain words for users and JSON: "end of text", "token limit", "stop string".
    pub fn name(self) -> &'static str {
        match self {
            StopReason::EndOfText => "end of text",
            StopReason::MaxTokens => "token limit",
            StopReason::StopString => "stop string",
            StopReason::Interrupted => "interrupted",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one `generate` call did. Times in seconds.
#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_tokens: usize,
    /// Sampled tokens, in order (without a final EOS/EOT).
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    pub prefill_secs: f64,
    /// Time from the first sampled token to the last one.
    pub decode_secs: f64,
}

impl Generation {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(1e-9)
    }

    /// Decode speed over the tokens that needed a forward pass of their own.
    pub fn decode_tok_s(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

/// Checks that `new_prompt` more tokens plus up to `max_new` generated ones fit the session.
pub fn check_fits<K: EngineKernels>(
    session: &Session<'_, K>,
    new_prompt: usize,
    max_new: usize,
) -> Result<()> {
    let need = session.pos() + new_prompt + max_new;
    if need > session.ctx() {
        return Err(Error::Context(format!(
            "prompt of {} tokens{} plus {max_new} to generate need {need} positions, but the context size is {} (raise --ctx, up to the model's {}, or lower -n)",
            new_prompt,
            if session.pos() > 0 { format!(" after {} cached", session.pos()) } else { String::new() },
            session.ctx(),
            session.config().ctx_train,
        )));
    }
    Ok(())
}

/// Runs `prompt` (appended after whatever the session holds), then samples up to `max_new`
/// tokens, calling `on_text` with each complete piece of UTF-8 text as it is produced (never
/// half a character; control tokens print nothing; text from a stop string on is withheld).
/// The session ends up holding the prompt and the generated tokens it ran: every one after an
/// end-of-text token, all but the last otherwise (`Session::pos()` says how many).
///
/// Where the kernel set picks tokens (CUDA, wgpu), greedy tokens are its pick, and sampled
/// ones its device sampler's (same distribution as `sampler`, another random stream;
/// penalties over the prompt and the generated tokens): 4 bytes back per token.
pub fn generate<K: EngineKernels>(
    session: &mut Session<'_, K>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    max_new: usize,
    stops: &[String],
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation> {
    check_fits(session, prompt.len(), max_new)?;
    if prompt.is_empty() {
        return Err(Error::Other("generate: empty prompt".into()));
    }
    let cfg = sampler.config().clone();
    // Greedy without penalties: the kernel set's pick where it has one. Otherwise its device
    // sampler where it has one, else the host sampler over the logits.
    let device =
        cfg.is_plain_greedy() || session.set_sampler(Some(&cfg), prompt, prompt.len() + max_new)?;
    // Chained (CUDA, wgpu): one step stays queued ahead of the token the host reads, so the device
    // does not idle while the host reads a token and queues the next step.
    let chain = device && session.chains();
    let mut history: Vec<u32> = prompt.to_vec();
    let t0 = Instant::now();
    let first = if chain {
        session.forward_queue(prompt).map(|()| 0)
    } else {
        next_token(session, sampler, prompt, &history, device)
    };
    let mut next = match first {
        Ok(t) => t,
        Err(e) => {
            session.set_sampler(None, &[], 0)?;
            return Err(e);
        }
    };
    // Picks queued and not read yet (chained).
    let mut queued = usize::from(chain);
    let mut gen = Generation {
        prompt_tokens: prompt.len(),
        tokens: Vec::with_capacity(max_new),
        text: String::new(),
        stop: StopReason::MaxTokens,
        prefill_secs: t0.elapsed().as_secs_f64(),
        decode_secs: 0.0,
    };
    let mut utf8 = StreamDecoder::new();
    let mut stop_strings = StopStrings::new(stops.iter().cloned());
    let mut t1 = Instant::now();
    let mut emit = |s: &str, gen: &mut Generation| {
        if !s.is_empty() {
            on_text(s);
            gen.text.push_str(s);
        }
    };
    let mut result = Ok(());
    for i in 0..max_new {
        if sampler.cancelled() {
            gen.stop = StopReason::Interrupted;
            break;
        }
        if chain {
            match chained_pick(session, i, max_new, &mut queued) {
                Ok(t) => next = t,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            if i == 0 {
                gen.prefill_secs = t0.elapsed().as_secs_f64();
                t1 = Instant::now();
            }
        }
        let id = next;
        if tok.is_eog(id) && !sampler.ignores_eos() {
            gen.stop = StopReason::EndOfText;
            break;
        }
        gen.tokens.push(id);
        history.push(id);
        if tok.token_type(id) != Some(TokenType::Control) {
            let piece = utf8.push(tok.token_bytes(id));
            let out = stop_strings.push(&piece);
            emit(&out, &mut gen);
            if stop_strings.stopped() {
                gen.stop = StopReason::StopString;
                break;
            }
        }
        if !chain && i + 1 < max_new {
            match next_token(session, sampler, &[id], &history, device) {
                Ok(t) => next = t,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
    }
    if queued > 0 && result.is_ok() {
        // Steps queued past the stop: read their picks and forget their positions, so the
        // session holds what the unchained loop would have run.
        for _ in 0..queued {
            session.take_pick()?;
        }
        session.truncate(session.pos() - queued);
    }
    session.set_sampler(None, &[], 0)?;
    result?;
    gen.decode_secs = t1.elapsed().as_secs_f64();
    if gen.stop != StopReason::StopString {
        let rest = utf8.finish();
        let mut out = stop_strings.push(&rest);
        if !stop_strings.stopped() {
            out.push_str(&stop_strings.finish());
        }
        emit(&out, &mut gen);
    }
    Ok(gen)
}

/// Greedy continuation of `prompt` by `n` tokens, without sampling machinery (for tests and
/// benchmarks): returns the chosen ids.
/// On a kernel set that picks tokens, its greedy pick (the same contract as `argmax`).
pub fn greedy<K: EngineKernels>(
    session: &mut Session<'_, K>,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<u32>> {
    check_fits(session, prompt.len(), n)?;
    let mut out = Vec::with_capacity(n);
    let mut next = greedy_step(session, prompt)?;
    for i in 0..n {
        out.push(next);
        if i + 1 < n {
            next = greedy_step(session, &[next])?;
        }
    }
    Ok(out)
}

/// Token `i` of a chained loop: first queues the step that picks token `i + 1` (when the
/// loop may still need it), then reads the oldest queued pick. `queued` counts the picks
/// queued and not read.
fn chained_pick<K: EngineKernels>(
    session: &mut Session<'_, K>,
    i: usize,
    max_new: usize,
    queued: &mut usize,
) -> Result<u32> {
    if i + *queued < max_new {
        session.forward_chained()?;
        *queued += 1;
    }
    *queued -= 1;
    session.take_pick()
}

/// Runs `tokens` and returns the greedy next token.
fn greedy_step<K: EngineKernels>(session: &mut Session<'_, K>, tokens: &[u32]) -> Result<u32> {
    match session.forward_pick(tokens)? {
        Some(t) => Ok(t),
        None => Ok(argmax(session.logits()?)),
    }
}

/// Runs `tokens` and returns the next token: the kernel set's pick (greedy or its device
/// sampler's) when `device` and it has one, else `sampler`'s over the host logits (penalties
/// over `history`).
fn next_token<K: EngineKernels>(
    session: &mut Session<'_, K>,
    sampler: &mut Sampler,
    tokens: &[u32],
    history: &[u32],
    device: bool,
) -> Result<u32> {
    if device {
        if let Some(t) = session.forward_pick(tokens)? {
            return Ok(t);
        }
    } else {
        session.forward(tokens, Logits::Last)?;
    }
    sampler
        .sample(session.logits()?, history)
        .map_err(|e| Error::Other(e.to_string()))
}

/// Index of the largest value (the first one on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Mean negative log-likelihood (nats) of `ids[1..]`, each predicted from the ids before it,
/// in one window starting at position 0 of a fresh session. Returns (mean NLL, count).
pub fn mean_nll<K: EngineKernels>(
    session: &mut Session<'_, K>,
    ids: &[u32],
) -> Result<(f64, usize)> {
    if ids.len() < 2 {
        return Err(Error::Other(format!(
            "perplexity needs at least 2 tokens, got {}",
            ids.len()
        )));
    }
    session.truncate(0);
    check_fits(session, ids.len(), 0)?;
    let vocab = session.config().vocab;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::Token { id, vocab });
    }
    // Logits of a chunk of tokens at a time: at most 8M values (32 MB) at once.
    let chunk = (8 * 1024 * 1024 / vocab).clamp(1, crate::model::MAX_BATCH);
    let inputs = &ids[..ids.len() - 1];
    let mut nll = 0f64;
    for (c, piece) in inputs.chunks(chunk).enumerate() {
        let logits = session.forward(piece, Logits::All)?;
        nll += chunk_nll(logits, vocab, &ids[c * chunk + 1..]);
    }
    Ok((nll / inputs.len() as f64, inputs.len()))
}

/// Sum over the rows of `logits` ([rows, vocab]) of -log softmax(row)[target], row i's
/// target being `targets[i]`; computed in f64 with the row max subtracted.
pub fn chunk_nll(logits: &[f32], vocab: usize, targets: &[u32]) -> f64 {
    logits
        .chunks_exact(vocab)
        .zip(targets)
        .map(|(row, &target)| {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
            let lse = row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln()
                + max;
            lse - row[target as usize] as f64
        })
        .sum()
}
