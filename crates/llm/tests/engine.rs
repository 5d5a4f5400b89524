//! The engine against single-sequence decoding: every sequence of a batch of mixed prompt
//! lengths (chunked prefill, block boundaries crossed, prompt prefixes shared with running
//! and with finished sequences) gets the same greedy tokens as alone, and logits within a
//! stated tolerance; for SmolLM2 and Gemma-3 (real weights) and a synthetic model of every
//! quantization format. Plus the engine's input checks, cancellation and per-request
//! sampling.

use std::collections::HashMap;
use std::path::PathBuf;

use ferrite_gguf::GgmlType;
use ferrite_llm::engine::{Engine, EngineConfig, FinishReason, Request, RequestId};
use ferrite_llm::generate::argmax;
use ferrite_llm::kv_cache::BLOCK_SIZE;
use ferrite_llm::sampler::{Sampler, SamplerConfig};
use ferrite_llm::synth::{write_synthetic, SynthConfig, QUANTS};
use ferrite_llm::{Logits, Model, Session};

/// A small synthetic llama (2 layers, d_model 256, 4 heads over 2 KV heads, 320 tokens) with
/// weights of type `quant`, loaded from a temporary file.
fn synthetic(quant: GgmlType) -> Model {
    let mut cfg = SynthConfig::preset("smollm2-135m")
        .unwrap()
        .with_layers(2)
        .unwrap()
        .with_vocab(320)
        .unwrap();
    cfg.d_model = 256;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.n_ff = 512;
    cfg.ctx = 512;
    // A name per call: tests run in parallel, and each removes its file after loading.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path: PathBuf = std::env::temp_dir().join(format!(
        "ferrite-engine-test-{}-{call}-{quant}.gguf",
        std::process::id()
    ));
    write_synthetic(&cfg, quant, 7, &path, &mut |_, _| {}).unwrap();
    let m = Model::load(&path).unwrap();
    // The mapping stays valid after the name is gone.
    let _ = std::fs::remove_file(&path);
    m
}

/// Greedy continuation of `prompt` alone: the tokens and the logits each was chosen from.
fn alone(m: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut s = Session::new(m, prompt.len() + n).unwrap();
    let mut logits = s.forward(prompt, Logits::Last).unwrap().to_vec();
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for i in 0..n {
        let t = argmax(&logits);
        toks.push(t);
        all.push(logits.clone());
        if i + 1 < n {
            logits = s.forward(&[t], Logits::Last).unwrap().to_vec();
        }
    }
    (toks, all)
}

fn tokens(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % (vocab - 1)) as u32)
        .collect()
}

/// What the batched run saw of one request.
#[derive(Default)]
struct Seen {
    tokens: Vec<u32>,
    max_diff: f32,
    finish: Option<FinishReason>,
}

/// Steps `e` until every request has ended, comparing each sampled token's logits with the
/// reference (alone) ones.
fn drain(
    e: &mut Engine<'_>,
    want: &HashMap<RequestId, (Vec<u32>, Vec<Vec<f32>>)>,
    seen: &mut HashMap<RequestId, Seen>,
    until_first_of: Option<RequestId>,
) {
    while e.has_work() {
        let outs = e.step().unwrap();
        let mut stop = false;
        for o in outs {
            let s = seen.entry(o.id).or_default();
            let (_, ref_logits) = &want[&o.id];
            let got = e.last_logits(o.id).unwrap();
            let step = s.tokens.len();
            let d = got
                .iter()
                .zip(&ref_logits[step])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            s.max_diff = s.max_diff.max(d);
            s.tokens.extend(o.token);
            s.finish = o.finish;
            stop |= Some(o.id) == until_first_of;
        }
        if stop {
            return;
        }
    }
}

/// The batch scenario: returns the largest logit difference to the alone runs, relative to
/// the largest |logit| (and asserts the tokens are equal).
fn batched_matches_alone(m: &Model, n_new: usize) -> f32 {
    let vocab = m.cfg.vocab;
    let base = tokens(48, 1, vocab);
    let bs = BLOCK_SIZE;
    let a = base[..2 * bs + 1].to_vec(); // crosses two block boundaries
    let b = tokens(5, 2, vocab); // short
    let e_ = tokens(bs + 4, 3, vocab); // a second chunked prompt
    let mut c = base[..2 * bs].to_vec(); // shares a's two full blocks while a runs
    c.extend(tokens(3, 4, vocab));
    let d = base[..bs].to_vec(); // exactly a's first block: its last token is recomputed
    let f = a.clone(); // a again, after a finished: from the cache of finished prefixes
    let mut eng = Engine::new(
        m,
        EngineConfig {
            ctx: 96,
            kv_blocks: 64,
            max_seqs: 8,
            // Prompts arrive in chunks of at most 12 tokens per step, beside decode tokens.
            step_tokens: 12,
        },
    )
    .unwrap();
    let mut want = HashMap::new();
    let mut seen = HashMap::new();
    let add = |eng: &mut Engine<'_>, want: &mut HashMap<_, _>, p: &Vec<u32>| {
        let id = eng.add_request(Request::greedy(p.clone(), n_new)).unwrap();
        want.insert(id, alone(m, p, n_new));
        id
    };
    let ida = add(&mut eng, &mut want, &a);
    add(&mut eng, &mut want, &b);
    add(&mut eng, &mut want, &e_);
    drain(&mut eng, &want, &mut seen, Some(ida));
    assert!(seen[&ida].tokens.len() == 1, "a has its first token");
    add(&mut eng, &mut want, &c);
    add(&mut eng, &mut want, &d);
    let hits0 = eng.stats().kv.prefix_hit_positions;
    assert_eq!(hits0, (2 * bs + bs - 1) as u64, "c and d share a's blocks");
    drain(&mut eng, &want, &mut seen, None);
    assert_eq!(eng.stats().kv.blocks_used, 0, "every block is released");
    add(&mut eng, &mut want, &f);
    assert_eq!(
        eng.stats().kv.prefix_hit_positions - hits0,
        2 * bs as u64,
        "f reuses a's cached blocks"
    );
    drain(&mut eng, &want, &mut seen, None);
    let spread = want
        .values()
        .flat_map(|(_, l)| l.iter().flatten())
        .fold(0f32, |m, v| m.max(v.abs()));
    let mut worst = 0f32;
    for (id, (toks, _)) in &want {
        let s = &seen[id];
        assert_eq!(
            &s.tokens, toks,
            "{id}: greedy tokens differ from the alone run"
        );
        assert_eq!(s.finish, Some(FinishReason::MaxTokens));
        worst = worst.max(s.max_diff / spread);
    }
    worst
}

/// Largest difference of the batched logits from the alone ones, relative to the largest
/// |logit|: none. Every multi-row kernel (Q4_1's and Q8_0's four-row forms, with 8-bit and
/// with q8x2 activations) performs the same float operations in the same order as the
/// one-row kernel, so a request's tokens never depend on what shares its batch (the server's
/// same-seed guarantee rests on this).
const BATCH_TOL: f32 = 0.0;

#[test]
fn synthetic_models_of_every_format_decode_the_same_in_a_batch() {
    for &q in QUANTS.iter() {
        let m = synthetic(q);
        let rel = batched_matches_alone(&m, 4);
        eprintln!("{q}: max logit difference batched vs alone {rel:.2e} of the range");
        assert!(rel <= BATCH_TOL, "{q}: {rel}");
    }
}

#[test]
fn smollm2_decodes_the_same_in_a_batch() {
    let m = Model::load(ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().expect("fetch SmolLM2"))
        .unwrap();
    let rel = batched_matches_alone(&m, 6);
    eprintln!("SmolLM2: max logit difference batched vs alone {rel:.2e} of the range");
    assert!(rel <= BATCH_TOL, "{rel}");
}

#[test]
fn gemma3_decodes_the_same_in_a_batch() {
    let m = Model::load(ferrite_gguf::fetch::gemma3_270m_q4_k_m().expect("fetch Gemma-3")).unwrap();
    let rel = batched_matches_alone(&m, 6);
    eprintln!("Gemma-3: max logit difference batched vs alone {rel:.2e} of the range");
    assert!(rel <= BATCH_TOL, "{rel}");
}

fn tiny() -> Model {
    synthetic(GgmlType::Q8_0)
}

#[test]
fn requests_over_the_context_or_the_cache_are_refused_with_both_numbers() {
    let m = tiny();
    let cfg = EngineConfig {
        ctx: 64,
        kv_blocks: 6,
        max_seqs: 4,
        step_tokens: 32,
    };
    let mut e = Engine::new(&m, cfg).unwrap();
    let err = e
        .add_request(Request::greedy(vec![1; 40], 30))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prompt of 40 tokens plus up to 30 generated need 70 positions")
            && err.contains("the context is 64"),
        "{err}"
    );
    // 60 positions: 4 blocks + 1 for a copy-on-write; fits the 6-block cache once.
    let id = e.add_request(Request::greedy(vec![1; 30], 30)).unwrap();
    let err = e
        .add_request(Request::greedy(vec![2; 20], 20))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("need 4 KV blocks of 16 positions, but 1 of 6 are free now"),
        "{err}"
    );
    assert_eq!(e.stats().running, 1);
    // Queued instead: it starts once the first request is cancelled.
    let mut r = Request::greedy(vec![2; 20], 20);
    r.queue = true;
    let q = e.add_request(r).unwrap();
    assert_eq!((e.stats().running, e.stats().waiting), (1, 1));
    e.step().unwrap();
    assert_eq!(e.stats().waiting, 1);
    e.cancel(id);
    let outs = e.step().unwrap();
    assert_eq!((e.stats().running, e.stats().waiting), (1, 0));
    assert!(outs.iter().all(|o| o.id == q));
    // More than the whole cache: refused even when queueing is asked for.
    let mut r = Request::greedy(vec![1; 60], 4);
    r.queue = true;
    let e2 = Engine::new(
        &m,
        EngineConfig {
            kv_blocks: 4,
            ..cfg
        },
    );
    let err = e2.unwrap().add_request(r).unwrap_err().to_string();
    assert!(
        err.contains("need 5 KV blocks of 16 positions, but the cache has 4"),
        "{err}"
    );
}

#[test]
fn invalid_requests_are_refused_before_any_work() {
    let m = tiny();
    let mut e = Engine::new(&m, EngineConfig::new(64, 4)).unwrap();
    let vocab = m.cfg.vocab as u32;
    let err = |e: &mut Engine<'_>, r: Request| e.add_request(r).unwrap_err().to_string();
    let msg = err(&mut e, Request::greedy(vec![1, vocab, 2], 4));
    assert!(
        msg.contains(&format!(
            "token id {vocab} is out of range for a vocabulary of {vocab}"
        )),
        "{msg}"
    );
    let msg = err(&mut e, Request::greedy(vec![1, u32::MAX], 4));
    assert!(msg.contains("token id 4294967295"), "{msg}");
    let mut r = Request::greedy(vec![1], 4);
    r.stop_tokens = vec![vocab + 5];
    assert!(err(&mut e, r).contains("out of range"));
    assert!(err(&mut e, Request::greedy(vec![], 4)).contains("empty prompt"));
    assert!(err(&mut e, Request::greedy(vec![1], 0)).contains("max_new must be at least 1"));
    let mut r = Request::greedy(vec![1], 4);
    r.sampling.temperature = f32::NAN;
    assert!(err(&mut e, r).contains("temperature"));
    let msg = err(&mut e, Request::greedy(vec![1], usize::MAX));
    assert!(msg.contains("the context is 64"), "{msg}");
    assert_eq!(e.stats().running + e.stats().waiting, 0);
    assert!(e.step().unwrap().is_empty());
    assert!(Engine::new(&m, EngineConfig::new(m.cfg.ctx_train + 1, 4)).is_err());
}

#[test]
fn cancel_frees_blocks_at_once_and_unknown_ids_are_a_no_op() {
    let m = tiny();
    let mut e = Engine::new(&m, EngineConfig::new(128, 4)).unwrap();
    let a = e
        .add_request(Request::greedy(tokens(40, 5, 300), 20))
        .unwrap();
    let b = e
        .add_request(Request::greedy(tokens(10, 6, 300), 2))
        .unwrap();
    e.step().unwrap();
    assert!(e.stats().kv.blocks_used >= 3);
    assert!(e.cancel(a));
    assert_eq!(e.stats().running, 1);
    let used = e.stats().kv.blocks_used;
    assert_eq!(used, 1, "only b's block is left");
    assert!(!e.cancel(a), "cancelling twice is a no-op");
    assert!(!e.cancel(RequestId(999)));
    let done = e.run_to_end().unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, b);
    assert_eq!(
        done[0].1.len(),
        1,
        "its first token came from the first step"
    );
    assert!(!e.cancel(b), "a finished request cancels as a no-op");
    assert_eq!(e.stats().kv.blocks_used, 0);
}

#[test]
fn stop_tokens_end_a_request_without_output() {
    let m = tiny();
    let p = tokens(9, 8, 300);
    let (want, _) = alone(&m, &p, 6);
    let mut e = Engine::new(&m, EngineConfig::new(64, 2)).unwrap();
    let mut r = Request::greedy(p, 6);
    r.stop_tokens = vec![want[3]];
    e.add_request(r).unwrap();
    let done = e.run_to_end().unwrap();
    let stop = want.iter().position(|&t| t == want[3]).unwrap();
    assert_eq!(done[0].1, want[..stop]);
    assert_eq!(done[0].2, FinishReason::StopToken(want[3]));
}

/// Each request samples with its own settings and seed: the same tokens in a batch as the
/// sampler gives over the alone logits.
#[test]
fn per_request_sampling_is_independent_of_the_batch() {
    let m = tiny();
    let mut e = Engine::new(&m, EngineConfig::new(64, 4)).unwrap();
    let mut want = Vec::new();
    for (i, temp) in [0.7f32, 1.3, 0.0].into_iter().enumerate() {
        let p = tokens(6 + 5 * i, 10 + i, 300);
        let sampling = SamplerConfig {
            temperature: temp,
            seed: 100 + i as u64,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        };
        // Alone: the same sampler over the alone logits.
        let mut s = Session::new(&m, 64).unwrap();
        let mut sampler = Sampler::new(sampling.clone()).unwrap();
        let mut hist = p.clone();
        let mut logits = s.forward(&p, Logits::Last).unwrap().to_vec();
        let mut toks = Vec::new();
        for _ in 0..8 {
            let t = sampler.sample(&mut logits, &hist).unwrap();
            toks.push(t);
            hist.push(t);
            logits = s.forward(&[t], Logits::Last).unwrap().to_vec();
        }
        let id = e
            .add_request(Request {
                prompt: p,
                sampling,
                max_new: 8,
                stop_tokens: vec![],
                queue: false,
            })
            .unwrap();
        want.push((id, toks));
    }
    let done = e.run_to_end().unwrap();
    for ((id, got, _), (wid, toks)) in done.iter().zip(&want) {
        assert_eq!(id, wid);
        assert_eq!(got, toks, "{id}");
    }
}

/// A random mix of requests (shared prefixes, queueing, cancellations) on a cache small
/// enough to force waiting and the eviction of cached prefixes: no step fails, the block
/// counters always add up, and every request that was not cancelled gets its alone tokens.
#[test]
fn random_traffic_keeps_the_books_and_the_tokens() {
    let m = tiny();
    let vocab = m.cfg.vocab;
    let mut eng = Engine::new(
        &m,
        EngineConfig {
            ctx: 80,
            kv_blocks: 10,
            max_seqs: 3,
            step_tokens: 20,
        },
    )
    .unwrap();
    let mut rng = ferrite_llm::sampler::Rng::new(5);
    let mut below = |n: u64| (rng.next_u64() % n) as usize;
    let stems: Vec<Vec<u32>> = (0..3).map(|s| tokens(40, 20 + s, vocab)).collect();
    let mut want: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut got: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut cancelled = Vec::new();
    let mut finished = 0;
    let (mut max_waiting, mut full_of_cache) = (0, false);
    for round in 0..60 {
        if round < 40 && below(2) == 0 {
            // A prompt: a stem's prefix (shared with others) plus a few tokens of its own.
            let mut p = stems[below(3)][..below(40) + 1].to_vec();
            p.extend(tokens(below(6), 100 + round, vocab));
            let n = below(8) + 1;
            let mut r = Request::greedy(p.clone(), n);
            r.queue = true;
            let id = eng.add_request(r).unwrap();
            want.insert(id, alone(&m, &p, n).0);
        }
        if below(7) == 0 && !want.is_empty() {
            let ids: Vec<RequestId> = want.keys().copied().collect();
            let id = ids[below(ids.len() as u64)];
            if eng.cancel(id) {
                cancelled.push(id);
            }
        }
        for o in eng.step().unwrap() {
            got.entry(o.id).or_default().extend(o.token);
            finished += usize::from(o.finish.is_some());
        }
        let st = eng.stats();
        assert_eq!(
            st.kv.blocks_used + st.kv.blocks_cached + st.kv.blocks_free,
            st.kv.blocks_total
        );
        assert!(st.running <= 3);
        max_waiting = max_waiting.max(st.waiting);
        full_of_cache |= st.kv.blocks_free == 0 && st.kv.blocks_cached > 0;
    }
    while eng.has_work() {
        for o in eng.step().unwrap() {
            got.entry(o.id).or_default().extend(o.token);
            finished += usize::from(o.finish.is_some());
        }
    }
    let st = eng.stats();
    assert_eq!(st.kv.blocks_used, 0);
    assert!(st.kv.prefix_hit_positions > 0, "prefixes were shared");
    assert!(max_waiting > 0, "requests had to wait");
    assert!(
        full_of_cache,
        "new blocks came from evicting cached prefixes"
    );
    assert_eq!(finished + cancelled.len(), want.len());
    for (id, toks) in &want {
        if !cancelled.contains(id) {
            assert_eq!(got.get(id).map_or(&[][..], |v| v), &toks[..], "{id}");
        }
    }
}

/// One engine request gives what `generate` over a `Session` gives (the loop of `run` and
/// `chat`): the same tokens, greedy and seeded sampling, ending at the token limit and at
/// end of text (the engine's stop token).
#[test]
fn engine_request_equals_the_session_loop() {
    use ferrite_llm::engine::{FinishReason, Request};
    use ferrite_llm::generate::{generate, StopReason};
    use ferrite_llm::tokenizer::Tokenizer;
    let m = Model::load(ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().expect("fetch SmolLM2"))
        .unwrap();
    let tok = Tokenizer::from_gguf(m.gguf()).unwrap();
    let ids = tok.encode("The capital of France is", true).unwrap();
    let eog: Vec<u32> = (0..m.cfg.vocab as u32).filter(|&t| tok.is_eog(t)).collect();
    assert!(!eog.is_empty(), "SmolLM2 has end-of-generation tokens");
    let sampled = SamplerConfig {
        temperature: 0.8,
        seed: 5,
        ..SamplerConfig::greedy()
    };
    for (cfg, n) in [
        (SamplerConfig::greedy(), 12),
        (sampled, 12),
        (SamplerConfig::greedy(), 40),
    ] {
        let mut s = Session::new(&m, 64).unwrap();
        let mut sampler = Sampler::new(cfg.clone()).unwrap();
        let want = generate(&mut s, &tok, &mut sampler, &ids, n, &[], &mut |_| {}).unwrap();
        let mut e = Engine::new(&m, EngineConfig::new(64, 1)).unwrap();
        e.add_request(Request {
            prompt: ids.clone(),
            sampling: cfg,
            max_new: n,
            stop_tokens: eog.clone(),
            queue: false,
        })
        .unwrap();
        let got = e.run_to_end().unwrap();
        assert_eq!(got.len(), 1);
        let (_, toks, finish) = &got[0];
        assert_eq!(toks, &want.tokens);
        match want.stop {
            StopReason::EndOfText => {
                assert!(matches!(finish, FinishReason::StopToken(t) if eog.contains(t)))
            }
            StopReason::MaxTokens => assert_eq!(*finish, FinishReason::MaxTokens),
            other => panic!("unexpected stop {other}"),
        }
        assert!(!e.has_work(), "the request ended");
        assert_eq!(e.stats().kv.blocks_used, 0);
    }
}

/// Requests under a grammar constraint (json_object over a hand-made byte vocabulary of the
/// tiny model's 320 ids: 0..256 single bytes, then words; id 300 the stop token) sampled in
/// one batch, their processors run in parallel: each gets the tokens it gets alone, and
/// each output is a prefix of a JSON object (random weights never close it within 40
/// tokens; the strings hold multi-byte characters built from single-byte tokens).
#[test]
fn constrained_requests_in_a_batch_equal_alone_and_stay_valid() {
    use std::sync::Arc;

    use ferrite_llm::grammar::{json_object, GrammarConstraint, TokenTrie};
    let m = tiny();
    let stop = 300u32;
    let words: [&[u8]; 8] = [
        b"{\"", b"\":", b"\",", b"true", b"null", b"12", b"\"}", b"ab",
    ];
    let bytes: Vec<Vec<u8>> = (0..320u32)
        .map(|i| match i {
            0..=255 => vec![i as u8],
            256..=263 => words[(i - 256) as usize].to_vec(),
            _ => Vec::new(),
        })
        .collect();
    let t: Vec<Option<&[u8]>> = bytes.iter().map(|b| Some(b.as_slice())).collect();
    let trie = Arc::new(TokenTrie::new(&t, 320));
    let g = Arc::new(json_object());
    let request = |i: usize| {
        let sampling = SamplerConfig {
            temperature: 1.0,
            seed: 40 + i as u64,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        };
        let req = Request {
            prompt: tokens(5 + i, 20 + i, 300),
            sampling,
            max_new: 40,
            stop_tokens: vec![stop],
            queue: false,
        };
        let c = GrammarConstraint::new(g.clone(), trie.clone(), vec![stop]).unwrap();
        (
            req,
            Box::new(c) as Box<dyn ferrite_llm::logits_processor::LogitsProcessor>,
        )
    };
    let mut alone = Vec::new();
    for i in 0..4 {
        let mut e = Engine::new(&m, EngineConfig::new(64, 4)).unwrap();
        let (req, c) = request(i);
        e.add_request_with(req, Some(c)).unwrap();
        alone.push(e.run_to_end().unwrap().remove(0));
    }
    let mut e = Engine::new(&m, EngineConfig::new(64, 4)).unwrap();
    for i in 0..4 {
        let (req, c) = request(i);
        e.add_request_with(req, Some(c)).unwrap();
    }
    let batched = e.run_to_end().unwrap();
    for (i, ((_, got, gf), (_, want, wf))) in batched.iter().zip(&alone).enumerate() {
        assert_eq!((got, gf), (want, wf), "request {i}");
        let text: Vec<u8> = got
            .iter()
            .flat_map(|&t| bytes[t as usize].clone())
            .collect();
        let mut check = GrammarConstraint::new(g.clone(), trie.clone(), vec![stop]).unwrap();
        assert!(
            check.advance_bytes(&text),
            "{:?}",
            String::from_utf8_lossy(&text)
        );
    }
}
