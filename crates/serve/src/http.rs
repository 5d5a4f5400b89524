//! The axum router: endpoints, body reading (content type, size limit, timeout), JSON
//! parsing, API-key check, request counting, and the OpenAI response and chunk formats.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::api::{self, ChatRequest, CompletionRequest, GenRequest, Limits};
use crate::error::ApiError;
use crate::worker::{Cmd, Event, Ready, Submit, TokenLogprob, TopLogprob};
use crate::{AppState, Status};

type St = Arc<AppState>;

pub(crate) fn router(state: St) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Counts every answer by route and status for `/metrics`.
async fn count(State(st): State<St>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_string();
    let resp = next.run(req).await;
    st.metrics.request(&route, resp.status().as_u16());
    resp
}

/// With an API key set, every route but `/health` needs `Authorization: Bearer KEY`.
async fn auth(State(st): State<St>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        if req.uri().path() != "/health" {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
                return ApiError::unauthorized().into_response();
            }
        }
    }
    next.run(req).await
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("no route {} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::method_not_allowed(format!(
        "{} is not allowed on {}",
        req.method(),
        req.uri().path()
    ))
}

fn ready(st: &AppState) -> Result<Arc<Ready>, ApiError> {
    if st.stopping.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    match &*st.status.read().unwrap_or_else(|p| p.into_inner()) {
        Status::Loading => Err(ApiError::unavailable("the model is loading")),
        Status::Ready(r) => Ok(r.clone()),
        Status::Failed(e) => Err(ApiError::unavailable(format!(
            "the model failed to load: {e}"
        ))),
    }
}

async fn health(State(st): State<St>) -> Response {
    match ready(&st) {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(st): State<St>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

async fn models(State(st): State<St>) -> Response {
    let mut m = json!({
        "id": st.cfg.model_id,
        "object": "model",
        "created": st.created,
        "owned_by": "ferrite",
    });
    if let Ok(r) = ready(&st) {
        m["meta"] = json!({"n_ctx": r.ctx, "n_vocab": r.vocab});
    }
    Json(json!({"object": "list", "data": [m]})).into_response()
}

/// Reads a JSON body: `application/json` content type, at most `body_limit` bytes, all of
/// it within `body_timeout` (a client that stalls mid-body gets 408).
async fn read_json<T: DeserializeOwned>(
    st: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::unsupported_media(format!(
            "the body must be JSON with `Content-Type: application/json`, got {:?}",
            ct
        )));
    }
    let limit = st.cfg.body_limit;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit as u64) {
        return Err(ApiError::too_large(format!(
            "the body is {n} bytes; the limit is {limit}"
        )));
    }
    let read = async {
        let mut stream = body.into_data_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::bad_request("invalid_body", format!("reading the body: {e}"))
            })?;
            if buf.len() + chunk.len() > limit {
                return Err(ApiError::too_large(format!(
                    "the body is over the limit of {limit} bytes"
                )));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok::<_, ApiError>(buf)
    };
    let secs = st.cfg.body_timeout.as_secs_f64();
    let bytes = tokio::time::timeout(st.cfg.body_timeout, read)
        .await
        .map_err(|_| ApiError::timeout(format!("the body did not arrive within {secs} s")))??;
    serde_json::from_slice(&bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            ApiError::bad_request("invalid_value", format!("invalid request: {e}"))
        }
        _ => ApiError::bad_request("invalid_json", format!("malformed JSON: {e}")),
    })
}

/// Runs request validation (tokenization, chat template) off the async threads.
async fn validate(
    ready: Arc<Ready>,
    f: impl FnOnce(&Limits<'_>) -> Result<GenRequest, ApiError> + Send + 'static,
) -> Result<GenRequest, ApiError> {
    tokio::task::spawn_blocking(move || {
        let lim = Limits {
            tok: &ready.tok,
            template: ready.template.as_ref(),
            ctx: ready.ctx,
            vocab: ready.vocab,
        };
        let gen = f(&lim)?;
        if gen.grammar.is_some() {
            ready.trie();
        }
        Ok(gen)
    })
    .await
    .map_err(|e| ApiError::internal(format!("validating the request: {e}")))?
}

async fn chat(State(st): State<St>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let req: ChatRequest = read_json(&st, &headers, body).await?;
        let r = ready(&st)?;
        if r.template.is_none() {
            let why = r.template_error.clone().unwrap_or_default();
            return Err(ApiError::bad_request(
                "unsupported",
                format!("this model's chat template does not load ({why}); use /v1/completions"),
            ));
        }
        let gen = validate(r, move |lim| req.validate(lim)).await?;
        Ok(generate(st.clone(), Kind::Chat, gen).await)
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(st): State<St>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let req: CompletionRequest = read_json(&st, &headers, body).await?;
        let r = ready(&st)?;
        let gen = validate(r, move |lim| req.validate(lim)).await?;
        Ok::<_, ApiError>(generate(st.clone(), Kind::Completion, gen).await)
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

async fn tokenize(State(st): State<St>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let req: api::TokenizeRequest = read_json(&st, &headers, body).await?;
        let r = ready(&st)?;
        tokio::task::spawn_blocking(move || {
            let ids = r
                .tok
                .encode_with(&req.content, req.add_special, req.parse_special)
                .map_err(|e| ApiError::invalid("content", format!("tokenizing: {e}")))?;
            let tokens: Vec<Value> = if req.with_pieces {
                ids.iter()
                    .map(|&id| {
                        let b = r.tok.token_bytes(id);
                        let piece = match std::str::from_utf8(b) {
                            Ok(s) => json!(s),
                            Err(_) => json!(b),
                        };
                        json!({"id": id, "piece": piece})
                    })
                    .collect()
            } else {
                ids.iter().map(|&id| json!(id)).collect()
            };
            Ok::<_, ApiError>(Json(json!({ "tokens": tokens })).into_response())
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenize: {e}")))?
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

async fn detokenize(State(st): State<St>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let req: api::DetokenizeRequest = read_json(&st, &headers, body).await?;
        let r = ready(&st)?;
        let ids = api::token_ids(&req.tokens, r.vocab, "tokens")?;
        Ok::<_, ApiError>(Json(json!({ "content": r.tok.decode(&ids) })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// Sends `Cmd::Cancel` when dropped: a handler or stream that ends early (the client went
/// away) cancels its generation at once. After the end it is a no-op for the engine thread.
struct CancelGuard {
    key: u64,
    cmd: std::sync::mpsc::Sender<Cmd>,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        let _ = self.cmd.send(Cmd::Cancel(self.key));
    }
}

/// Fields every response and chunk repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn wrap(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": crate::FINGERPRINT,
            "choices": choices,
        })
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

fn top_json(t: &TopLogprob) -> Value {
    json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes})
}

/// Chat log-probabilities: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut v = top_json(&l.chosen);
            v["top_logprobs"] = Value::Array(l.top.iter().map(top_json).collect());
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions (legacy) log-probabilities: parallel lists, `text_offset` counting from
/// `offset` (the text already sent before these tokens, in chars).
fn completion_logprobs(lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for l in lps {
        tokens.push(json!(l.chosen.token));
        token_logprobs.push(json!(l.chosen.logprob));
        let mut m = serde_json::Map::new();
        for t in &l.top {
            m.insert(t.token.clone(), json!(t.logprob));
        }
        top.push(Value::Object(m));
        offsets.push(json!(offset));
        offset += l.chosen.token.chars().count();
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

/// Submits `gen` to the engine thread and answers with the whole result or a stream.
async fn generate(st: St, kind: Kind, gen: GenRequest) -> Response {
    let key = st.next_key.fetch_add(1, Ordering::Relaxed);
    let (etx, erx) = mpsc::unbounded_channel();
    let (atx, arx) = oneshot::channel();
    let (stream, include_usage, want_lp) = (gen.stream, gen.include_usage, gen.logprobs.is_some());
    let n = gen.n;
    let submit = Submit {
        key,
        req: gen,
        events: etx,
        admitted: atx,
    };
    if st.cmd.send(Cmd::Submit(Box::new(submit))).is_err() {
        return ApiError::unavailable("the engine has stopped").into_response();
    }
    let guard = CancelGuard {
        key,
        cmd: st.cmd.clone(),
    };
    let prompt_tokens = match arx.await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return e.into_response(),
        Err(_) => return ApiError::unavailable("the engine has stopped").into_response(),
    };
    let meta = Meta {
        id: match kind {
            Kind::Chat => format!("chatcmpl-{key}"),
            Kind::Completion => format!("cmpl-{key}"),
        },
        created: unix_now(),
        model: st.cfg.model_id.clone(),
        kind,
    };
    if stream {
        stream_response(meta, erx, guard, prompt_tokens, include_usage, want_lp, n).into_response()
    } else {
        whole_response(meta, erx, guard, prompt_tokens, want_lp, n).await
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Collects every choice's text (by index) until all `n` have ended.
async fn whole_response(
    meta: Meta,
    mut erx: mpsc::UnboundedReceiver<Event>,
    _guard: CancelGuard,
    prompt_tokens: usize,
    want_lp: bool,
    n: usize,
) -> Response {
    let mut texts = vec![String::new(); n];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut finishes: Vec<&'static str> = vec!["stop"; n];
    let mut completion = 0;
    let mut left = n;
    while left > 0 {
        match erx.recv().await {
            Some(Event::Token {
                index,
                text: t,
                logprob,
            }) => {
                if let (Some(text), Some(lp)) = (texts.get_mut(index), lps.get_mut(index)) {
                    text.push_str(&t);
                    lp.extend(logprob);
                }
            }
            Some(Event::Done {
                index,
                tail,
                finish,
                completion_tokens,
            }) => {
                if let (Some(text), Some(f)) = (texts.get_mut(index), finishes.get_mut(index)) {
                    text.push_str(&tail);
                    *f = finish;
                }
                completion += completion_tokens;
                left -= 1;
            }
            Some(Event::Error(e)) => return e.into_response(),
            None => return ApiError::internal("the engine thread ended").into_response(),
        }
    }
    let choices: Vec<Value> = (0..n)
        .map(|i| match meta.kind {
            Kind::Chat => json!({
                "index": i,
                "message": {"role": "assistant", "content": texts[i]},
                "logprobs": if want_lp { chat_logprobs(&lps[i]) } else { Value::Null },
                "finish_reason": finishes[i],
            }),
            Kind::Completion => json!({
                "index": i,
                "text": texts[i],
                "logprobs": if want_lp { completion_logprobs(&lps[i], 0) } else { Value::Null },
                "finish_reason": finishes[i],
            }),
        })
        .collect();
    let mut body = meta.wrap(false, Value::Array(choices));
    body["usage"] = usage(prompt_tokens, completion);
    Json(body).into_response()
}

/// Where a stream is.
enum Phase {
    /// Chat streams open with a chunk holding the assistant role, one per choice: the next
    /// choice to open.
    Start(usize),
    Body,
    /// Sent the last content chunk; next the usage chunk (if asked), then `[DONE]`.
    Usage(usize),
    Done,
    End,
}

struct StreamState {
    meta: Meta,
    erx: mpsc::UnboundedReceiver<Event>,
    _guard: CancelGuard,
    prompt_tokens: usize,
    include_usage: bool,
    want_lp: bool,
    phase: Phase,
    /// Chars of text sent so far per choice (completions' `text_offset`).
    sent_chars: Vec<usize>,
    /// Choices not ended yet, and the tokens the ended ones generated.
    left: usize,
    completion: usize,
}

impl StreamState {
    fn chunk(&self, choice: Value) -> String {
        let mut c = self.meta.wrap(true, json!([choice]));
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c.to_string()
    }

    fn content_chunk(
        &mut self,
        index: usize,
        text: &str,
        lp: Option<TokenLogprob>,
        finish: Option<&str>,
    ) -> String {
        let lps: Vec<TokenLogprob> = lp.into_iter().collect();
        let sent = self.sent_chars.get(index).copied().unwrap_or(0);
        let choice = match self.meta.kind {
            Kind::Chat => {
                let delta = if text.is_empty() && finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({
                    "index": index,
                    "delta": delta,
                    "logprobs": if self.want_lp && !lps.is_empty() { chat_logprobs(&lps) } else { Value::Null },
                    "finish_reason": finish,
                })
            }
            Kind::Completion => json!({
                "index": index,
                "text": text,
                "logprobs": if self.want_lp && !lps.is_empty() { completion_logprobs(&lps, sent) } else { Value::Null },
                "finish_reason": finish,
            }),
        };
        if let Some(c) = self.sent_chars.get_mut(index) {
            *c += text.chars().count();
        }
        self.chunk(choice)
    }

    /// The next SSE data line, or None at the end.
    async fn next(&mut self) -> Option<String> {
        loop {
            match self.phase {
                Phase::Start(i) => {
                    if self.meta.kind != Kind::Chat || i >= self.sent_chars.len() {
                        self.phase = Phase::Body;
                        continue;
                    }
                    self.phase = Phase::Start(i + 1);
                    return Some(self.chunk(json!({
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": null,
                        "finish_reason": null,
                    })));
                }
                Phase::Body => match self.erx.recv().await {
                    Some(Event::Token {
                        index,
                        text,
                        logprob,
                    }) => {
                        if text.is_empty() && logprob.is_none() {
                            continue;
                        }
                        return Some(self.content_chunk(index, &text, logprob, None));
                    }
                    Some(Event::Done {
                        index,
                        tail,
                        finish,
                        completion_tokens,
                    }) => {
                        self.completion += completion_tokens;
                        self.left = self.left.saturating_sub(1);
                        if self.left == 0 {
                            self.phase = Phase::Usage(self.completion);
                        }
                        return Some(self.content_chunk(index, &tail, None, Some(finish)));
                    }
                    Some(Event::Error(e)) => {
                        self.phase = Phase::End;
                        return Some(e.body().to_string());
                    }
                    None => {
                        self.phase = Phase::End;
                        return Some(
                            ApiError::internal("the engine thread ended")
                                .body()
                                .to_string(),
                        );
                    }
                },
                Phase::Usage(n) => {
                    self.phase = Phase::Done;
                    if self.include_usage {
                        let mut c = self.meta.wrap(true, json!([]));
                        c["usage"] = usage(self.prompt_tokens, n);
                        return Some(c.to_string());
                    }
                }
                Phase::Done => {
                    self.phase = Phase::End;
                    return Some("[DONE]".to_string());
                }
                Phase::End => return None,
            }
        }
    }
}

fn stream_response(
    meta: Meta,
    erx: mpsc::UnboundedReceiver<Event>,
    guard: CancelGuard,
    prompt_tokens: usize,
    include_usage: bool,
    want_lp: bool,
    n: usize,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let state = StreamState {
        meta,
        erx,
        _guard: guard,
        prompt_tokens,
        include_usage,
        want_lp,
        phase: Phase::Start(0),
        sent_chars: vec![0; n],
        left: n,
        completion: 0,
    };
    let s = futures_util::stream::unfold(state, |mut st| async move {
        let line = st.next().await?;
        Some((Ok(SseEvent::default().data(line)), st))
    });
    Sse::new(s)
}
