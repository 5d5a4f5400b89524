//! The generation loop over a [`GpuSession`]: as `crate::generate::generate`, with every token
//! chosen on the device (4 bytes back per token): the step's argmax when sampling is greedy
//! without penalties, the device sampler (`GpuSession::set_sampler`) otherwise. Sampled tokens
//! follow the CPU sampler's distribution but not its random stream.

use std::time::Instant;

use super::GpuSession;
use crate::error::{Error, Result};
use crate::generate::{Generation, StopReason};
use crate::sampler::{Sampler, StopStrings};
use crate::tokenizer::{StreamDecoder, TokenType, Tokenizer};

/// Runs `prompt` (after whatever the session holds), then samples up to `max_new` tokens,
/// streaming text through `on_text` (see `crate::generate::generate`).
pub fn generate(
    session: &mut GpuSession<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    max_new: usize,
    stops: &[String],
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::Other("generate: empty prompt".into()));
    }
    let need = session.pos() + prompt.len() + max_new;
    if need > session.ctx() {
        return Err(Error::Context(format!(
            "prompt of {} tokens plus {max_new} to generate need {need} positions, but the context size is {} (raise --ctx, up to the model's {}, or lower -n)",
            prompt.len(),
            session.ctx(),
            session.model().cfg.ctx_train,
        )));
    }
    // The host `sampler` gives only its settings; the device keeps the state.
    session.set_sampler(Some(sampler.config()))?;
    session.set_history(prompt)?;
    let t0 = Instant::now();
    let mut next = session.forward_tokens(prompt)?;
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
    let t1 = Instant::now();
    let mut emit = |s: &str, gen: &mut Generation| {
        if !s.is_empty() {
            on_text(s);
            gen.text.push_str(s);
        }
    };
    for i in 0..max_new {
        if sampler.cancelled() {
            gen.stop = StopReason::Interrupted;
            break;
        }
        let id = next;
        if tok.is_eog(id) && !sampler.ignores_eos() {
            gen.stop = StopReason::EndOfText;
            break;
        }
        gen.tokens.push(id);
        if tok.token_type(id) != Some(TokenType::Control) {
            let piece = utf8.push(tok.token_bytes(id));
            let out = stop_strings.push(&piece);
            emit(&out, &mut gen);
            if stop_strings.stopped() {
                gen.stop = StopReason::StopString;
                break;
            }
        }
        if i + 1 < max_new {
            next = session.forward_token(id)?;
        }
    }
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

/// Mean negative log-likelihood of `ids[1..]`, each token scored from the ones before it, by
/// the batched prefill's all-position logits (as `crate::generate::mean_nll` on the CPU):
/// (mean NLL in nats, tokens scored). Starts from an empty cache.
pub fn mean_nll(session: &mut GpuSession<'_>, ids: &[u32]) -> Result<(f64, usize)> {
    if ids.len() < 2 {
        return Err(Error::Other(format!(
            "perplexity needs at least 2 tokens, got {}",
            ids.len()
        )));
    }
    session.truncate(0);
    let vocab = session.model().cfg.vocab;
    let inputs = &ids[..ids.len() - 1];
    let chunk = session.prefill_chunk();
    let mut nll = 0f64;
    for (c, piece) in inputs.chunks(chunk).enumerate() {
        let logits = session.forward_logits(piece)?;
        nll += crate::generate::chunk_nll(&logits, vocab, &ids[c * chunk + 1..]);
    }
    Ok((nll / inputs.len() as f64, inputs.len()))
}
