//! OpenAI request bodies and their validation into a [`GenRequest`] the engine can take.
//! Every field is checked here, before the engine sees the request: each error names the
//! field and the range it must be in.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferrite_llm::chat::{ChatTemplate, Message};
use ferrite_llm::grammar::{json_object, json_schema_ordered, Grammar, OrderedValue};
use ferrite_llm::sampler::SamplerConfig;
use ferrite_llm::tokenizer::Tokenizer;
use serde::Deserialize;

use crate::error::ApiError;

/// Most `top_logprobs` / completions `logprobs` (OpenAI's limit for chat).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most stop strings, and the longest one in bytes.
pub const MAX_STOPS: usize = 16;
pub const MAX_STOP_BYTES: usize = 1024;
/// Most `logit_bias` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Most choices (`n`) per request.
pub const MAX_N: usize = 16;

/// What the engine thread needs to run one request.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// >= 1; prompt + max_new fits the context.
    pub max_new: usize,
    pub sampling: SamplerConfig,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// (token id < vocab, bias in [-100, 100]).
    pub logit_bias: Vec<(u32, f32)>,
    /// Log-probabilities wanted: None, or how many top alternatives per token (0..=20).
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    /// `response_format` json_object / json_schema: the grammar the output must follow.
    pub grammar: Option<Arc<Grammar>>,
    /// Choices to generate (1..=[`MAX_N`]), each its own engine request; choice i samples
    /// with seed + i.
    pub n: usize,
}

/// The model facts validation needs.
pub struct Limits<'a> {
    pub tok: &'a Tokenizer,
    pub template: Option<&'a ChatTemplate>,
    /// Positions per sequence (prompt + generated).
    pub ctx: usize,
    /// Valid token ids are below this.
    pub vocab: usize,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by chat and text completions (OpenAI's, then llama.cpp's extensions).
#[derive(Deserialize, Default)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<Stop>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<BTreeMap<String, f64>>,
    pub response_format: Option<ResponseFormat>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub ignore_eos: Option<bool>,
}

/// OpenAI's `response_format`: `{"type": "text" | "json_object" | "json_schema",
/// "json_schema": {"name", "schema", "strict", "description"}}`; llama.cpp's
/// `{"type": "json_object", "schema": {...}}` is taken as a schema too. Schemas are read with
/// their key order (properties are generated in it).
#[derive(Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
    pub schema: Option<OrderedValue>,
}

#[derive(Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    pub schema: Option<OrderedValue>,
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// The grammar the output must follow (None for text); schema errors name the keyword
    /// and where it is.
    fn grammar(&self, lim: &Limits<'_>) -> Result<Option<Arc<Grammar>>, ApiError> {
        let compile = |s: &OrderedValue, field: &str| {
            json_schema_ordered(&s.value, Some(&s.order))
                .map_err(|e| ApiError::invalid("response_format", format!("{field}: {e}")))
        };
        let g = match self.kind.as_str() {
            "text" => return Ok(None),
            "json_object" => match &self.schema {
                Some(s) => compile(s, "response_format.schema")?,
                None => json_object(),
            },
            "json_schema" => {
                let Some(js) = &self.json_schema else {
                    return Err(ApiError::invalid(
                        "response_format",
                        "response_format of type json_schema needs a json_schema object: {\"name\": ..., \"schema\": {...}}",
                    ));
                };
                if js.name.as_ref().is_some_and(|n| n.len() > 64) {
                    return Err(ApiError::invalid(
                        "response_format",
                        "response_format.json_schema.name may be at most 64 characters",
                    ));
                }
                match &js.schema {
                    Some(s) => compile(s, "response_format.json_schema.schema")?,
                    // No schema: any JSON value.
                    None => compile(
                        &OrderedValue {
                            value: serde_json::Value::Bool(true),
                            order: Default::default(),
                        },
                        "response_format.json_schema.schema",
                    )?,
                }
            }
            k => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!("response_format.type must be \"text\", \"json_object\" or \"json_schema\", got {k:?}"),
                ))
            }
        };
        if lim.tok.eog_tokens().is_empty() {
            return Err(ApiError::bad_request(
                "unsupported",
                "response_format: this model has no end-of-generation token to end a constrained document with",
            ));
        }
        Ok(Some(Arc::new(g)))
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
}

#[derive(Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub common: Common,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<serde_json::Value>,
}

/// `prompt`: text, token ids, or a list of one of either.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<i64>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub common: Common,
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub best_of: Option<i64>,
    pub suffix: Option<String>,
}

#[derive(Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default)]
    pub add_special: bool,
    #[serde(default)]
    pub parse_special: bool,
    #[serde(default)]
    pub with_pieces: bool,
}

#[derive(Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<i64>,
}

/// Checks token ids from a request: each in `0..vocab`.
pub fn token_ids(ids: &[i64], vocab: usize, param: &str) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .enumerate()
        .map(|(i, &t)| {
            if t < 0 || t as u64 >= vocab as u64 {
                Err(ApiError::invalid(
                    param,
                    format!(
                        "{param}[{i}]: token id {t} is out of range: ids are 0 to {}",
                        vocab - 1
                    ),
                ))
            } else {
                Ok(t as u32)
            }
        })
        .collect()
}

fn range(param: &str, v: f64, lo: f64, hi: f64, lo_open: bool) -> Result<f32, ApiError> {
    let ok = v.is_finite() && (if lo_open { v > lo } else { v >= lo }) && v <= hi;
    if ok {
        Ok(v as f32)
    } else {
        let open = if lo_open { "(" } else { "[" };
        Err(ApiError::invalid(
            param,
            format!("{param} must be in {open}{lo}, {hi}], got {v}"),
        ))
    }
}

/// A seed from the clock and a counter, for requests that give none.
fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ COUNTER
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Validates the shared fields and completes a [`GenRequest`] for `prompt`.
/// `max_tokens` is the request's limit (`max_completion_tokens` or `max_tokens`).
fn finish(
    c: &Common,
    max_tokens: Option<i64>,
    prompt: Vec<u32>,
    logprobs: Option<usize>,
    lim: &Limits<'_>,
) -> Result<GenRequest, ApiError> {
    let n = match c.n.unwrap_or(1) {
        n if (1..=MAX_N as i64).contains(&n) => n as usize,
        n => {
            return Err(ApiError::invalid(
                "n",
                format!("n must be from 1 to {MAX_N}, got {n}"),
            ))
        }
    };
    let grammar = match &c.response_format {
        None => None,
        Some(rf) => rf.grammar(lim)?,
    };
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);

    let p = prompt.len();
    if p == 0 {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if p >= lim.ctx {
        return Err(ApiError::bad_request(
            "context_length_exceeded",
            format!(
                "the prompt is {p} tokens, but this server's context is {} tokens (prompt plus at least one generated token must fit)",
                lim.ctx
            ),
        ));
    }
    let room = lim.ctx - p;
    let max_new = match max_tokens {
        None => room,
        Some(n) if n < 1 => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens must be at least 1, got {n}"),
            ))
        }
        Some(n) if n as u64 > room as u64 => {
            return Err(ApiError::bad_request(
                "context_length_exceeded",
                format!(
                    "this server's context is {} tokens, but {} were requested ({p} in the prompt, {n} to generate)",
                    lim.ctx,
                    (p as u64).saturating_add(n as u64)
                ),
            ))
        }
        Some(n) => n as usize,
    };

    let temperature = range("temperature", c.temperature.unwrap_or(1.0), 0.0, 2.0, false)?;
    let top_p = range("top_p", c.top_p.unwrap_or(1.0), 0.0, 1.0, false)?;
    let min_p = range("min_p", c.min_p.unwrap_or(0.0), 0.0, 1.0, false)?;
    let presence_penalty = range(
        "presence_penalty",
        c.presence_penalty.unwrap_or(0.0),
        -2.0,
        2.0,
        false,
    )?;
    let frequency_penalty = range(
        "frequency_penalty",
        c.frequency_penalty.unwrap_or(0.0),
        -2.0,
        2.0,
        false,
    )?;
    let repeat_penalty = range(
        "repeat_penalty",
        c.repeat_penalty.unwrap_or(1.0),
        0.0,
        100.0,
        true,
    )?;
    let mut top_k = match c.top_k.unwrap_or(0) {
        k if k < 0 => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be >= 0 (0 = off), got {k}"),
            ))
        }
        k => (k as u64).min(lim.vocab as u64) as usize,
    };
    // top_p 0 keeps only the most likely token, as OpenAI's API treats it.
    let top_p = if top_p == 0.0 {
        top_k = 1;
        1.0
    } else {
        top_p
    };
    let penalty_last_n = match c.repeat_last_n.unwrap_or(64) {
        -1 => lim.ctx,
        n if n < -1 => {
            return Err(ApiError::invalid(
                "repeat_last_n",
                format!("repeat_last_n must be >= 0, or -1 for the whole context, got {n}"),
            ))
        }
        n => (n as u64).min(lim.ctx as u64) as usize,
    };
    let seed = match c.seed {
        None | Some(-1) => random_seed(),
        Some(s) if s < 0 => {
            return Err(ApiError::invalid(
                "seed",
                format!("seed must be >= 0, or -1 for a random seed, got {s}"),
            ))
        }
        Some(s) => s as u64,
    };
    let sampling = SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        repeat_penalty,
        presence_penalty,
        frequency_penalty,
        penalty_last_n,
        seed,
    };
    sampling
        .validate()
        .map_err(|e| ApiError::bad_request("invalid_value", e.to_string()))?;

    let stop = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop strings, got {}", stop.len()),
        ));
    }
    if let Some(s) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "a stop string may be at most {MAX_STOP_BYTES} bytes, got {}",
                s.len()
            ),
        ));
    }

    let mut logit_bias = Vec::new();
    if let Some(map) = &c.logit_bias {
        if map.len() > MAX_LOGIT_BIAS {
            return Err(ApiError::invalid(
                "logit_bias",
                format!(
                    "at most {MAX_LOGIT_BIAS} logit_bias entries, got {}",
                    map.len()
                ),
            ));
        }
        for (k, &v) in map {
            let id = k
                .parse::<u64>()
                .ok()
                .filter(|&id| id < lim.vocab as u64)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!(
                            "logit_bias key {k:?} must be a token id from 0 to {}",
                            lim.vocab - 1
                        ),
                    )
                })?;
            let b = range("logit_bias", v, -100.0, 100.0, false)?;
            logit_bias.push((id as u32, b));
        }
    }

    Ok(GenRequest {
        prompt,
        max_new,
        sampling,
        stop,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        logit_bias,
        logprobs,
        stream,
        include_usage,
        grammar,
        n,
    })
}

impl ChatRequest {
    /// The prompt through the model's chat template, and the validated settings.
    pub fn validate(self, lim: &Limits<'_>) -> Result<GenRequest, ApiError> {
        if self.tools.as_ref().is_some_and(|t| !t.is_null()) {
            return Err(ApiError::bad_request(
                "unsupported",
                "tools (function calling) are not supported by this server",
            ));
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages must not be empty"));
        }
        let mut msgs = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                r => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!("messages[{i}].role {r:?} must be system, developer, user, assistant or tool"),
                    ))
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(s)) => s.clone(),
                Some(Content::Parts(parts)) => {
                    let mut s = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => s.push_str(t),
                            (k, _) => {
                                return Err(ApiError::invalid(
                                    "messages",
                                    format!("messages[{i}].content[{j}]: only text parts are supported, got type {k:?}"),
                                ))
                            }
                        }
                    }
                    s
                }
            };
            msgs.push(Message::new(role, content));
        }
        let top = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(n)) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&n) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {n}"),
                ))
            }
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                ))
            }
            (true, n) => Some(n.unwrap_or(0) as usize),
            (false, None) => None,
        };
        let Some(tmpl) = lim.template else {
            return Err(ApiError::bad_request(
                "unsupported",
                "this model has no usable chat template; use /v1/completions",
            ));
        };
        let ids = tmpl
            .encode(lim.tok, &msgs, true, false)
            .map_err(|e| ApiError::invalid("messages", format!("chat template: {e}")))?;
        let max = self.max_completion_tokens.or(self.common.max_tokens);
        let param_max = if self.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        finish(&self.common, max, ids, top, lim).map_err(|mut e| {
            if e.param.as_deref() == Some("max_tokens") {
                e.param = Some(param_max.to_string());
                e.message = e.message.replace("max_tokens", param_max);
            }
            e
        })
    }
}

impl CompletionRequest {
    /// The prompt as token ids (text is tokenized with BOS as the model asks, control tokens
    /// written in it parsed), and the validated settings.
    pub fn validate(self, lim: &Limits<'_>) -> Result<GenRequest, ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::bad_request(
                "unsupported",
                "echo is not supported by this server",
            ));
        }
        if let Some(b) = self.best_of {
            if b != 1 {
                return Err(ApiError::invalid(
                    "best_of",
                    format!("best_of must be 1, got {b}"),
                ));
            }
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad_request(
                "unsupported",
                "suffix (insertion) is not supported by this server",
            ));
        }
        let top = match self.logprobs {
            None => None,
            Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => Some(n as usize),
            Some(n) => {
                return Err(ApiError::invalid(
                    "logprobs",
                    format!("logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {n}"),
                ))
            }
        };
        let one = |n: usize| -> Result<(), ApiError> {
            if n == 1 {
                Ok(())
            } else {
                Err(ApiError::invalid(
                    "prompt",
                    format!("prompt lists must hold exactly one prompt (send one request per prompt), got {n}"),
                ))
            }
        };
        let text = |s: &str| -> Result<Vec<u32>, ApiError> {
            let ids = lim
                .tok
                .encode_with(s, true, true)
                .map_err(|e| ApiError::invalid("prompt", format!("tokenizing the prompt: {e}")))?;
            Ok(ids)
        };
        let ids = match &self.prompt {
            Prompt::Text(s) => text(s)?,
            Prompt::Texts(v) => {
                one(v.len())?;
                text(&v[0])?
            }
            Prompt::Tokens(t) => token_ids(t, lim.vocab, "prompt")?,
            Prompt::TokenLists(v) => {
                one(v.len())?;
                token_ids(&v[0], lim.vocab, "prompt")?
            }
        };
        let ids = if ids.is_empty() {
            lim.tok.bos().into_iter().collect()
        } else {
            ids
        };
        finish(&self.common, self.common.max_tokens, ids, top, lim)
    }
}
