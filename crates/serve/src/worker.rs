//! The engine thread: it loads the model, owns it and the [`Engine`] (on the CPU, on a CUDA
//! device over the weights uploaded once, [`GpuModel`], or on a wgpu adapter over
//! [`WgpuModel`]; one loop drives every kernel set), and talks to the HTTP handlers through channels. A handler sends [`Cmd::Submit`]
//! with a per-request event channel; the thread admits the request (answering on a
//! oneshot), steps the engine while any request runs, and sends each request its tokens
//! (detokenized, stop strings applied, log-probabilities if asked) and its end.
//! [`Cmd::Cancel`] (sent when a handler's request is dropped: the client went away) or a
//! closed event channel ends the generation at once and frees its KV blocks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ferrite_llm::chat::ChatTemplate;
use ferrite_llm::engine::{Engine, EngineConfig, EngineKernels, FinishReason, Request, RequestId};
use ferrite_llm::gpu::{CudaDevice, GpuModel};
use ferrite_llm::grammar::{GrammarConstraint, TokenTrie};
use ferrite_llm::kv_cache::BLOCK_SIZE;
use ferrite_llm::logits_processor::{Chain, LogitBias, LogitsProcessor};
use ferrite_llm::model::WgpuModel;
use ferrite_llm::sampler::StopStrings;
use ferrite_llm::tokenizer::{StreamDecoder, TokenType, Tokenizer};
use ferrite_llm::Model;
use tokio::sync::{mpsc, oneshot};

use crate::api::GenRequest;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// A loaded model and its tokenizer, as the loader hands them over, and where to run it.
pub struct Loaded {
    pub model: Model,
    pub tok: Tokenizer,
    pub device: ServeDevice,
}

/// Where the engine runs. On a GPU the weights are uploaded on the engine thread (on CUDA
/// after the memory check).
pub enum ServeDevice {
    Cpu,
    Cuda(CudaDevice),
    /// A wgpu adapter (Vulkan, Metal, DX12): the LLM engine's WGSL kernel set.
    Wgpu(ferrite_wgpu::WgpuDevice),
}

impl ServeDevice {
    /// The device as the server names it in messages.
    pub fn name(&self) -> String {
        match self {
            ServeDevice::Cpu => "the CPU".to_string(),
            ServeDevice::Cuda(d) => d.name().to_string(),
            ServeDevice::Wgpu(d) => format!("{} ({})", d.name(), d.backend_name()),
        }
    }
}

impl From<Option<CudaDevice>> for ServeDevice {
    fn from(d: Option<CudaDevice>) -> ServeDevice {
        d.map_or(ServeDevice::Cpu, ServeDevice::Cuda)
    }
}

impl Loaded {
    /// A model served on the CPU.
    pub fn cpu(model: Model, tok: Tokenizer) -> Loaded {
        Loaded {
            model,
            tok,
            device: ServeDevice::Cpu,
        }
    }
}

/// Loads the model on the engine thread (the server answers 503 until it returns).
pub type Loader = Box<dyn FnOnce() -> Result<Loaded, String> + Send>;

/// What handlers need of the loaded model.
pub struct Ready {
    pub tok: Tokenizer,
    /// None when the model's template does not load; `error` says why.
    pub template: Option<ChatTemplate>,
    pub template_error: Option<String>,
    pub ctx: usize,
    /// Token ids below this are valid (model and tokenizer both know them).
    pub vocab: usize,
    /// The vocabulary's token trie for constrained sampling, built by the first request
    /// with a `response_format` (on a blocking handler thread, not the engine's).
    pub trie: OnceLock<Arc<TokenTrie>>,
}

impl Ready {
    pub fn trie(&self) -> Arc<TokenTrie> {
        self.trie
            .get_or_init(|| Arc::new(TokenTrie::from_tokenizer(&self.tok, self.vocab)))
            .clone()
    }
}

/// Engine sizes chosen by the server's flags.
#[derive(Clone, Copy, Debug)]
pub struct WorkerConfig {
    /// Positions per sequence; None = the model's, at most 4096.
    pub ctx: Option<usize>,
    /// Sequences decoded together.
    pub parallel: usize,
    /// Requests that may wait for room; one more gets 429.
    pub max_queue: usize,
}

pub enum Cmd {
    Submit(Box<Submit>),
    Cancel(u64),
    /// Cancels what runs (each gets a 503 error event) and ends the thread.
    Shutdown,
}

pub struct Submit {
    /// The handler's name for the request (unique per server).
    pub key: u64,
    pub req: GenRequest,
    pub events: mpsc::UnboundedSender<Event>,
    /// Ok(prompt tokens) once admitted (running or queued), or why not.
    pub admitted: oneshot::Sender<Result<usize, ApiError>>,
}

/// One alternative token and its log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// The sampled token's log-probability and the most likely alternatives (most likely
/// first), from the distribution it was sampled from (after penalties and logit bias,
/// before temperature).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub chosen: TopLogprob,
    pub top: Vec<TopLogprob>,
}

#[derive(Debug)]
pub enum Event {
    /// A generated token of choice `index` and the text it completes (possibly empty: part
    /// of a UTF-8 char, a control token, text held back while it may start a stop string).
    Token {
        index: usize,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// The end of choice `index`: text held back until now, OpenAI's finish reason ("stop"
    /// or "length"), and how many tokens it generated.
    Done {
        index: usize,
        tail: String,
        finish: &'static str,
        completion_tokens: usize,
    },
    Error(ApiError),
}

struct Active {
    id: RequestId,
    /// The choice this request generates (`n` > 1: several share the handler's channel).
    index: usize,
    events: mpsc::UnboundedSender<Event>,
    decoder: StreamDecoder,
    stops: StopStrings,
    generated: usize,
    logprobs: Option<usize>,
    admitted: Instant,
    last: Option<Instant>,
    /// Under a grammar: set while the output is a complete document (a request cut by its
    /// token limit right there finishes with "stop").
    complete: Option<Arc<AtomicBool>>,
}

/// Runs the engine thread until [`Cmd::Shutdown`] or every sender is gone.
/// `ready` is called once the model is loaded (and, on CUDA, uploaded with the engine's KV
/// cache allocated); `failed` if any of that fails.
pub fn run(
    rx: Receiver<Cmd>,
    cfg: WorkerConfig,
    load: Loader,
    metrics: Arc<Metrics>,
    ready: impl FnOnce(Arc<Ready>),
    failed: impl FnOnce(String),
) {
    let Loaded { model, tok, device } = match load() {
        Ok(l) => l,
        Err(e) => return failed(e),
    };
    let ctx = cfg
        .ctx
        .unwrap_or(model.cfg.ctx_train.min(crate::DEFAULT_CTX_CAP));
    if ctx > model.cfg.ctx_train {
        return failed(format!(
            "--ctx {ctx} exceeds the model's context length {}",
            model.cfg.ctx_train
        ));
    }
    let ecfg = EngineConfig::new(ctx, cfg.parallel.max(1));
    let (template, template_error) = match ChatTemplate::from_gguf(model.gguf(), &tok) {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let vocab = model.cfg.vocab.min(tok.vocab_size());
    let shared = Arc::new(Ready {
        tok,
        template,
        template_error,
        ctx,
        vocab,
        trie: OnceLock::new(),
    });
    let where_ = device.name();
    match device {
        ServeDevice::Cpu => match Engine::new(&model, ecfg) {
            Ok(mut engine) => serve_loop(&mut engine, &rx, cfg, &metrics, shared, ready),
            Err(e) => failed(e.to_string()),
        },
        ServeDevice::Wgpu(dev) => {
            let wm = match WgpuModel::new(&model, &dev) {
                Ok(m) => m,
                Err(e) => return failed(format!("serve on {where_}: {e}")),
            };
            match Engine::wgpu(&wm, ecfg) {
                Ok(mut engine) => serve_loop(&mut engine, &rx, cfg, &metrics, shared, ready),
                Err(e) => failed(format!("serve on {where_}: {e}")),
            };
        }
        ServeDevice::Cuda(dev) => {
            let gm = match GpuModel::load(&model, &dev, ctx) {
                Ok(g) => g,
                Err(e) => return failed(format!("serve on {}: {e}", dev.name())),
            };
            if let Err(e) = check_cuda_memory(&gm, &dev, &ecfg) {
                return failed(e);
            }
            match Engine::cuda(&gm, ecfg) {
                Ok(mut engine) => serve_loop(&mut engine, &rx, cfg, &metrics, shared, ready),
                Err(e) => failed(format!("serve on {}: {e}", dev.name())),
            }
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Device bytes the CUDA engine of `ecfg` allocates besides the weights: the paged KV cache
/// (keys and values, f16, every layer, `ecfg.kv_blocks` blocks) and the step's activation,
/// logit and attention scratch (a lower bound: `CudaKernels` sizes it exactly), with the
/// device sampler's scratch (a u64 per vocabulary entry and sequence, made at the first
/// sampled step).
pub fn cuda_engine_bytes(c: &ferrite_llm::Config, ecfg: &EngineConfig) -> (usize, usize) {
    let block = c.n_layer * c.n_kv_head * BLOCK_SIZE * c.head_dim * 2;
    let kv = 2usize.saturating_mul(block).saturating_mul(ecfg.kv_blocks);
    let scratch = ferrite_llm::model::cuda::step_scratch_bytes(c, ecfg.step_tokens, ecfg.max_seqs);
    (kv, scratch)
}

/// Refuses, before allocating it, an engine whose KV cache and scratch exceed the device's
/// free memory once the weights are uploaded, saying what to lower.
pub fn check_cuda_memory(
    gm: &GpuModel,
    dev: &CudaDevice,
    ecfg: &EngineConfig,
) -> Result<(), String> {
    let (kv, scratch) = cuda_engine_bytes(&gm.cfg, ecfg);
    let _ = dev.empty_cache();
    let (free, total) = dev
        .mem_info()
        .map_err(|e| format!("serve on {}: reading free device memory: {e}", dev.name()))?;
    let need = kv.saturating_add(scratch);
    if need > free {
        return Err(format!(
            "serve: the engine does not fit the GPU ({}): its KV cache for --parallel {} sequences of --ctx {} ({} blocks of {BLOCK_SIZE} positions) takes {:.1} MiB and its step scratch {:.1} MiB, but {:.1} MiB of {:.1} MiB are free after the weights; lower --parallel or --ctx, or use --device cpu",
            dev.name(),
            ecfg.max_seqs,
            ecfg.ctx,
            ecfg.kv_blocks,
            kv as f64 / MIB,
            scratch as f64 / MIB,
            free as f64 / MIB,
            total as f64 / MIB
        ));
    }
    Ok(())
}

/// Adds choice `index` of `req` to the engine (its seed is the request's plus `index`):
/// queued when the cache cannot take it now and fewer than `max_queue` requests wait, else
/// refused with 429. Returns its id and, under a grammar, the constraint's completion flag.
fn admit<K: EngineKernels>(
    engine: &mut Engine<'_, K>,
    req: &GenRequest,
    index: usize,
    eog: &[u32],
    shared: &Ready,
    max_queue: usize,
) -> Result<(RequestId, Option<Arc<AtomicBool>>), ApiError> {
    let queue = engine.stats().waiting < max_queue;
    let mut r = Request::greedy(req.prompt.clone(), req.max_new);
    r.sampling = req.sampling.clone();
    r.sampling.seed = req.sampling.seed.wrapping_add(index as u64);
    r.stop_tokens = if req.ignore_eos {
        Vec::new()
    } else {
        eog.to_vec()
    };
    r.queue = queue;
    let mut procs: Vec<Box<dyn LogitsProcessor>> = Vec::new();
    if !req.logit_bias.is_empty() {
        let b = LogitBias::new(req.logit_bias.clone(), shared.vocab)
            .map_err(|e| ApiError::invalid("logit_bias", e.to_string()))?;
        procs.push(Box::new(b));
    }
    // The grammar runs last, so a bias cannot unmask what it forbids; its document ends at
    // an end-of-generation token whatever ignore_eos says.
    let mut complete = None;
    if let Some(g) = &req.grammar {
        let c = GrammarConstraint::new(g.clone(), shared.trie(), eog.to_vec())
            .map_err(|e| ApiError::invalid("response_format", e.to_string()))?;
        complete = Some(c.completion_flag());
        procs.push(Box::new(c));
        r.stop_tokens = eog.to_vec();
    }
    let processor: Option<Box<dyn LogitsProcessor>> = match procs.len() {
        0 => None,
        1 => procs.pop(),
        _ => Some(Box::new(Chain(procs))),
    };
    match engine.add_request_with(r, processor) {
        Ok(id) => Ok((id, complete)),
        Err(_) if !queue => Err(ApiError::queue_full(engine.stats().waiting)),
        Err(e) => Err(ApiError::bad_request("invalid_value", e.to_string())),
    }
}

/// The engine loop over either kernel set: admits, steps and answers until
/// [`Cmd::Shutdown`] or every sender is gone. On CUDA a step reads logits to the host only
/// where a request needs them (sampling, logit bias) or, here, while a request that asked
/// for logprobs runs; greedy requests without logprobs take the device's argmax.
fn serve_loop<K: EngineKernels>(
    engine: &mut Engine<'_, K>,
    rx: &Receiver<Cmd>,
    cfg: WorkerConfig,
    metrics: &Metrics,
    shared: Arc<Ready>,
    ready: impl FnOnce(Arc<Ready>),
) {
    metrics.set_engine(engine.stats());
    ready(shared.clone());
    let tok = &shared.tok;
    let eog: Vec<u32> = tok.eog_tokens().to_vec();

    // By (handler key, choice index).
    let mut active: HashMap<(u64, usize), Active> = HashMap::new();
    let mut keys: HashMap<RequestId, (u64, usize)> = HashMap::new();
    loop {
        // Block for a command while idle; otherwise take what has arrived and step.
        let mut cmds = Vec::new();
        if engine.has_work() {
            loop {
                match rx.try_recv() {
                    Ok(c) => cmds.push(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        cmds.push(Cmd::Shutdown);
                        break;
                    }
                }
            }
        } else {
            match rx.recv() {
                Ok(c) => cmds.push(c),
                Err(_) => cmds.push(Cmd::Shutdown),
            }
        }
        for cmd in cmds {
            match cmd {
                Cmd::Submit(s) => {
                    let s = *s;
                    // All n choices or none: a refusal cancels the ones already added.
                    let mut added = Vec::with_capacity(s.req.n);
                    let mut refused = None;
                    for i in 0..s.req.n {
                        match admit(engine, &s.req, i, &eog, &shared, cfg.max_queue) {
                            Ok(x) => added.push(x),
                            Err(e) => {
                                refused = Some(e);
                                break;
                            }
                        }
                    }
                    if let Some(e) = refused {
                        for (id, _) in added {
                            engine.cancel(id);
                        }
                        let _ = s.admitted.send(Err(e));
                        continue;
                    }
                    metrics.prompt_tokens(s.req.prompt.len());
                    if s.admitted.send(Ok(s.req.prompt.len())).is_err() {
                        // The handler is gone already.
                        for (id, _) in added {
                            engine.cancel(id);
                        }
                        metrics.cancelled();
                        continue;
                    }
                    for (index, (id, complete)) in added.into_iter().enumerate() {
                        keys.insert(id, (s.key, index));
                        active.insert(
                            (s.key, index),
                            Active {
                                id,
                                index,
                                events: s.events.clone(),
                                decoder: StreamDecoder::new(),
                                stops: StopStrings::new(s.req.stop.clone()),
                                generated: 0,
                                logprobs: s.req.logprobs,
                                admitted: Instant::now(),
                                last: None,
                                complete,
                            },
                        );
                    }
                }
                Cmd::Cancel(key) => {
                    let choices: Vec<(u64, usize)> =
                        active.keys().filter(|k| k.0 == key).copied().collect();
                    for k in &choices {
                        if let Some(a) = active.remove(k) {
                            keys.remove(&a.id);
                            engine.cancel(a.id);
                        }
                    }
                    if !choices.is_empty() {
                        metrics.cancelled();
                    }
                }
                Cmd::Shutdown => {
                    for (_, a) in active.drain() {
                        engine.cancel(a.id);
                        metrics.cancelled();
                        let _ = a.events.send(Event::Error(ApiError::unavailable(
                            "the server is shutting down",
                        )));
                    }
                    metrics.set_engine(engine.stats());
                    return;
                }
            }
        }
        if engine.has_work() {
            engine.set_keep_logits(active.values().any(|a| a.logprobs.is_some()));
            match engine.step() {
                Ok(outs) => {
                    for o in outs {
                        let Some(&key) = keys.get(&o.id) else {
                            continue;
                        };
                        let Some(a) = active.get_mut(&key) else {
                            continue;
                        };
                        let done = a
                            .complete
                            .as_ref()
                            .is_some_and(|c| c.load(Ordering::Relaxed));
                        let mut end = match o.finish {
                            Some(FinishReason::MaxTokens) if done => Some("stop"),
                            Some(FinishReason::MaxTokens) => Some("length"),
                            Some(FinishReason::StopToken(_)) => Some("stop"),
                            None => None,
                        };
                        let mut alive = true;
                        if let Some(t) = o.token {
                            let now = Instant::now();
                            match a.last {
                                None => metrics.ttft((now - a.admitted).as_secs_f64()),
                                Some(l) => metrics.inter_token((now - l).as_secs_f64()),
                            }
                            a.last = Some(now);
                            a.generated += 1;
                            metrics.generated_token();
                            let logprob = a.logprobs.and_then(|n| {
                                engine.last_logits(o.id).map(|l| logprobs(tok, l, t, n))
                            });
                            let text = if tok.token_type(t) == Some(TokenType::Control) {
                                String::new()
                            } else {
                                let piece = a.decoder.push(tok.token_bytes(t));
                                a.stops.push(&piece)
                            };
                            if a.stops.stopped() && end.is_none() {
                                end = Some("stop");
                                engine.cancel(o.id);
                            }
                            alive = a
                                .events
                                .send(Event::Token {
                                    index: a.index,
                                    text,
                                    logprob,
                                })
                                .is_ok();
                        }
                        if let Some(finish) = end {
                            let tail = if a.stops.stopped() {
                                String::new()
                            } else {
                                let rest = a.decoder.finish();
                                let mut t = a.stops.push(&rest);
                                if !a.stops.stopped() {
                                    t.push_str(&a.stops.finish());
                                }
                                t
                            };
                            let _ = a.events.send(Event::Done {
                                index: a.index,
                                tail,
                                finish,
                                completion_tokens: a.generated,
                            });
                            keys.remove(&o.id);
                            active.remove(&key);
                        } else if !alive {
                            // The client went away before the handler's guard said so.
                            engine.cancel(o.id);
                            metrics.cancelled();
                            keys.remove(&o.id);
                            active.remove(&key);
                        }
                    }
                }
                Err(e) => {
                    // The step failed: end every request with the error; the engine's
                    // bookkeeping is released with them.
                    let msg = format!("engine step failed: {e}");
                    for (_, a) in active.drain() {
                        engine.cancel(a.id);
                        let _ = a.events.send(Event::Error(ApiError::internal(msg.clone())));
                    }
                    keys.clear();
                }
            }
        }
        metrics.set_engine(engine.stats());
    }
}

/// Log-softmax of `logits` (f64 sums): the chosen token's log-probability and the `n` most
/// likely tokens'.
pub fn logprobs(tok: &Tokenizer, logits: &[f32], chosen: u32, n: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let max = f64::from(max);
    let lse = max
        + logits
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| (f64::from(l) - max).exp())
            .sum::<f64>()
            .ln();
    let entry = |id: u32| {
        let l = logits
            .get(id as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY);
        let lp = if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            (f64::from(l) - lse) as f32
        };
        // JSON has no -inf: report a floor as OpenAI does (-9999).
        let lp = if lp.is_finite() { lp } else { -9999.0 };
        let bytes = tok.token_bytes(id).to_vec();
        TopLogprob {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob: lp,
        }
    };
    let mut top = Vec::new();
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let key = |&i: &u32| {
            let l = logits[i as usize];
            if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                l
            }
        };
        let n = n.min(idx.len());
        let by = |a: &u32, b: &u32| key(b).total_cmp(&key(a)).then(a.cmp(b));
        if n < idx.len() {
            idx.select_nth_unstable_by(n - 1, by);
            idx.truncate(n);
        }
        idx.sort_unstable_by(by);
        // Banned or masked tokens (logit -inf) are no alternative.
        top = idx
            .into_iter()
            .filter(|&i| logits[i as usize] > f32::NEG_INFINITY)
            .map(entry)
            .collect();
    }
    TokenLogprob {
        chosen: entry(chosen),
        top,
    }
}
