//! `ferrite serve` through a real HTTP client, on the CPU with SmolLM2-135M (the cached
//! default model): OpenAI semantics (streamed = non-streamed, seeds, usage, stop strings,
//! logprobs, logit bias), 32 concurrent clients, every malformed or hostile request of the
//! issue answered with a clean 4xx while the server stays healthy, cancellation at random
//! points freeing every KV block, the API key, and shutdown.
//!
//! The cancellation test runs in its own binary (tests/cancel.rs: it measures the process's
//! memory). Most tests share one server (the engine is batch-invariant: a request's tokens do not
//! depend on what else runs); tests that check global state (KV blocks after cancellation,
//! the API key, shutdown) start their own.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_llm::grammar::json::validate;
use ferrite_llm::grammar::{json_object, GrammarConstraint, OrderedValue, TokenTrie};
use serde_json::{json, Value};

mod support;
use support::*;

fn text_of(v: &Value) -> String {
    let c = &v["choices"][0];
    c["message"]["content"]
        .as_str()
        .or(c["text"].as_str())
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_string()
}

/// The text, finish reason and usage of a stream's chunks; checks the chunk format.
fn stream_result(chunks: &[String], chat: bool) -> (String, String, Option<Value>) {
    assert_eq!(
        chunks.last().map(String::as_str),
        Some("[DONE]"),
        "{chunks:?}"
    );
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    for (i, c) in chunks[..chunks.len() - 1].iter().enumerate() {
        let v: Value = serde_json::from_str(c).unwrap();
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        assert_eq!(v["object"], object, "{c}");
        if v["choices"].as_array().unwrap().is_empty() {
            usage = Some(v["usage"].clone());
            continue;
        }
        let ch = &v["choices"][0];
        if chat {
            if i == 0 {
                assert_eq!(ch["delta"]["role"], "assistant", "{c}");
            }
            text.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        } else {
            text.push_str(ch["text"].as_str().unwrap());
        }
        if let Some(f) = ch["finish_reason"].as_str() {
            assert!(finish.is_none(), "two finish reasons");
            finish = Some(f.to_string());
        }
    }
    (text, finish.expect("no finish_reason"), usage)
}

#[tokio::test]
async fn health_models_tokenize_and_detokenize() {
    let url = shared();
    let h: Value = client()
        .get(format!("{url}/health"))
        .send()
        .await
        .unwrap()
        .json_text()
        .await;
    assert_eq!(h["status"], "ok");
    let m: Value = client()
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap()
        .json_text()
        .await;
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "smollm2");
    assert_eq!(m["data"][0]["meta"]["n_ctx"], 256);
    let (s, t) = post(url, "/tokenize", &json!({"content": "Hello world"})).await;
    assert_eq!(s, 200);
    let ids: Vec<i64> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{t}");
    let (s, d) = post(url, "/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(s, 200);
    assert_eq!(d["content"], "Hello world");
    let (s, p) = post(
        url,
        "/tokenize",
        &json!({"content": "Hi", "with_pieces": true}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(p["tokens"][0]["piece"], "Hi");
}

trait JsonText {
    async fn json_text(self) -> Value;
}

impl JsonText for reqwest::Response {
    async fn json_text(self) -> Value {
        serde_json::from_str(&self.text().await.unwrap()).unwrap()
    }
}

#[tokio::test]
async fn streamed_and_non_streamed_give_the_same_text() {
    let url = shared();
    let chat = json!({
        "model": "smollm2",
        "messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Name three colors."}],
        "max_tokens": 12, "seed": 42, "temperature": 0.9, "top_k": 40,
    });
    let (s, whole) = post(url, "/v1/chat/completions", &chat).await;
    assert_eq!(s, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let mut sc = chat.clone();
    sc["stream"] = json!(true);
    sc["stream_options"] = json!({"include_usage": true});
    let chunks = post_stream(url, "/v1/chat/completions", &sc).await;
    let (text, finish, usage) = stream_result(&chunks, true);
    assert_eq!(text, text_of(&whole));
    assert_eq!(
        finish,
        whole["choices"][0]["finish_reason"].as_str().unwrap()
    );
    assert_eq!(usage.unwrap(), whole["usage"]);
    let u = &whole["usage"];
    assert_eq!(
        u["total_tokens"],
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );

    let comp = json!({"prompt": "The capital of France is", "max_tokens": 10, "seed": 7, "temperature": 1.0});
    let (s, whole) = post(url, "/v1/completions", &comp).await;
    assert_eq!(s, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let mut sc = comp.clone();
    sc["stream"] = json!(true);
    let chunks = post_stream(url, "/v1/completions", &sc).await;
    let (text, finish, usage) = stream_result(&chunks, false);
    assert_eq!(text, text_of(&whole));
    assert_eq!(
        finish,
        whole["choices"][0]["finish_reason"].as_str().unwrap()
    );
    assert!(usage.is_none(), "no usage chunk unless asked");
}

#[tokio::test]
async fn the_same_seed_gives_the_same_text_alone_and_among_many() {
    let url = shared();
    let body = |seed: u64| {
        json!({"prompt": "Once upon a time", "max_tokens": 8, "seed": seed,
               "temperature": 1.0, "ignore_eos": true})
    };
    let (_, alone) = post(url, "/v1/completions", &body(1234)).await;
    let want = text_of(&alone);
    let mut tasks = Vec::new();
    for i in 0..12u64 {
        // Every third request has the seed under test; the rest are other traffic.
        let b = if i % 3 == 0 { body(1234) } else { body(i) };
        let u = url.to_string();
        tasks.push(tokio::spawn(async move {
            (i, post(&u, "/v1/completions", &b).await)
        }));
    }
    let mut others = std::collections::BTreeSet::new();
    for t in tasks {
        let (i, (s, v)) = t.await.unwrap();
        assert_eq!(s, 200, "{v}");
        if i % 3 == 0 {
            assert_eq!(text_of(&v), want, "request {i}");
        } else {
            others.insert(text_of(&v));
        }
    }
    assert!(
        others.len() > 1,
        "different seeds gave one text: {others:?}"
    );
}

#[tokio::test]
async fn thirty_two_concurrent_clients_complete_with_correct_usage() {
    let url = shared();
    let mut tasks = Vec::new();
    for i in 0..32usize {
        let u = url.to_string();
        // Prompts of 3 to 10 token ids; every client streams or not in turn.
        let prompt: Vec<u32> = (0..3 + i % 8)
            .map(|j| 100 + (i * 31 + j * 7) as u32 % 5000)
            .collect();
        let n = prompt.len();
        let stream = i % 2 == 0;
        tasks.push(tokio::spawn(async move {
            let body = json!({"prompt": prompt, "max_tokens": 4, "ignore_eos": true,
                              "temperature": 0, "stream": stream,
                              "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }});
            let usage = if stream {
                let chunks = post_stream(&u, "/v1/completions", &body).await;
                let (_, finish, usage) = stream_result(&chunks, false);
                assert_eq!(finish, "length");
                usage.unwrap()
            } else {
                let (s, v) = post(&u, "/v1/completions", &body).await;
                assert_eq!(s, 200, "{v}");
                assert_eq!(v["choices"][0]["finish_reason"], "length");
                v["usage"].clone()
            };
            assert_eq!(usage["prompt_tokens"], n);
            assert_eq!(usage["completion_tokens"], 4);
            assert_eq!(usage["total_tokens"], n + 4);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn stop_strings_logprobs_and_logit_bias() {
    let url = shared();
    let base = json!({"prompt": "1, 2, 3, 4,", "max_tokens": 8, "temperature": 0, "ignore_eos": true,
                      "logprobs": 3});
    let (s, v) = post(url, "/v1/completions", &base).await;
    assert_eq!(s, 200, "{v}");
    let text = text_of(&v);
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 8);
    assert_eq!(
        tokens
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<String>(),
        text
    );
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3);
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        // Greedy: the chosen token is the most likely one.
        assert!(
            (chosen - best).abs() < 1e-6 && chosen <= 0.0,
            "{chosen} vs {best}"
        );
    }

    // A stop string cuts the text before it.
    let cut = text.find(" 6").expect("greedy counting reaches 6");
    let mut b = base.clone();
    b["stop"] = json!([" 6", "unused"]);
    let (_, v) = post(url, "/v1/completions", &b).await;
    assert_eq!(text_of(&v), text[..cut]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Banning the first greedy token changes the first token.
    let first = post(
        url,
        "/tokenize",
        &json!({"content": tokens[0].as_str().unwrap()}),
    )
    .await
    .1["tokens"][0]
        .clone();
    let mut b = base.clone();
    b["logit_bias"] = json!({ first.to_string(): -100 });
    let (_, v) = post(url, "/v1/completions", &b).await;
    assert_ne!(v["choices"][0]["logprobs"]["tokens"][0], tokens[0], "{v}");

    // Chat logprobs: OpenAI's content list.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0,
                      "logprobs": true, "top_logprobs": 2, "ignore_eos": true});
    let (s, v) = post(url, "/v1/chat/completions", &chat).await;
    assert_eq!(s, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(content[0]["token"], content[0]["top_logprobs"][0]["token"]);
}

/// Every field required, every size bounded: any document fits 200 tokens.
const USER_SCHEMA: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 24},
    "age": {"type": "integer"},
    "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
    "admin": {"type": "boolean"},
    "role": {"enum": ["user", "editor", "owner"]}},
  "required": ["name", "age", "languages", "admin", "role"], "additionalProperties": false}"#;

/// Whether `text` is a prefix of a JSON object (the grammar over a vocabulary of bytes).
fn json_object_prefix(text: &str) -> bool {
    let bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let t: Vec<Option<&[u8]>> = bytes.iter().map(|b| Some(b.as_slice())).collect();
    let trie = Arc::new(TokenTrie::new(&t, 256));
    let mut c = GrammarConstraint::new(Arc::new(json_object()), trie, Vec::new()).unwrap();
    c.advance_bytes(text.as_bytes())
}

#[tokio::test]
async fn response_format_output_always_parses_and_validates() {
    let url = shared();
    let schema: Value = serde_json::from_str(USER_SCHEMA).unwrap();
    let order = ["name", "age", "languages", "admin", "role"];
    for seed in 0..4 {
        // json_schema on chat, sampled at temperature 1: parses, validates, schema order.
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "Make up a user profile."}}], "max_tokens": 200,
                "temperature": 1.0, "seed": {seed},
                "response_format": {{"type": "json_schema", "json_schema": {{"name": "user", "strict": true, "schema": {USER_SCHEMA}}}}}}}"#
        );
        let (s, v) = post_text(url, "/v1/chat/completions", body.clone()).await;
        assert_eq!(s, 200, "{v}");
        let text = text_of(&v);
        assert_eq!(
            v["choices"][0]["finish_reason"], "stop",
            "seed {seed}: {text}"
        );
        let doc: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        validate(&schema, &doc).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        let keys = serde_json::from_str::<OrderedValue>(&text).unwrap();
        assert_eq!(keys.order.keys_at("").unwrap(), order, "{text}");
        // The same request streamed gives the same text.
        if seed == 0 {
            // Re-serializing sorts the schema's keys: send it as text again.
            let sb = body.replacen("\"max_tokens\"", "\"stream\": true, \"max_tokens\"", 1);
            let chunks = post_stream_text(url, "/v1/chat/completions", sb).await;
            let (st, finish, _) = stream_result(&chunks, true);
            assert_eq!((st.as_str(), finish.as_str()), (text.as_str(), "stop"));
        }

        // json_object on completions: an object when it ends, else a prefix of one.
        let body = json!({"prompt": "A JSON object describing a cat:", "max_tokens": 60,
                          "temperature": 1.0, "seed": seed, "response_format": {"type": "json_object"}});
        let (s, v) = post(url, "/v1/completions", &body).await;
        assert_eq!(s, 200, "{v}");
        let text = text_of(&v);
        match v["choices"][0]["finish_reason"].as_str() {
            Some("stop") => {
                let doc: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
                assert!(doc.is_object(), "{text}");
            }
            Some("length") => {
                assert!(
                    json_object_prefix(&text),
                    "seed {seed}: not a prefix: {text:?}"
                );
                assert_eq!(v["usage"]["completion_tokens"], 60);
            }
            f => panic!("finish_reason {f:?}"),
        }
    }
    // Greedy with logprobs: each chosen token is the constrained distribution's best.
    let body = json!({"prompt": "{\"animal\": \"cat\", \"legs\":", "max_tokens": 30, "temperature": 0,
                      "logprobs": 2, "response_format": {"type": "json_object"}});
    let (s, v) = post(url, "/v1/completions", &body).await;
    assert_eq!(s, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let best = top
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!((chosen - best).abs() < 1e-6 && chosen > -9999.0, "{v}");
    }
    assert!(text_of(&v).starts_with('{'), "{v}");
}

/// One hostile request: raw HTTP text, the status and error code expected.
struct Bad {
    what: &'static str,
    request: String,
    status: u16,
    code: &'static str,
}

fn json_req(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn comp(extra: &str) -> String {
    json_req("/v1/completions", &format!("{{\"prompt\": \"Hi\"{extra}}}"))
}

#[tokio::test]
async fn every_bad_request_gets_a_clean_4xx_and_the_server_stays_healthy() {
    let url = shared();
    let big_prompt = "word ".repeat(10_000); // 50 KB
    let over_limit = "x".repeat(100 << 10);
    let cases = vec![
        Bad { what: "token id out of range", request: json_req("/v1/completions", "{\"prompt\": [1, 2, 99999999], \"max_tokens\": 2}"), status: 400, code: "invalid_value" },
        Bad { what: "token id at the vocab size", request: json_req("/v1/completions", "{\"prompt\": [49152], \"max_tokens\": 2}"), status: 400, code: "invalid_value" },
        Bad { what: "negative token id", request: json_req("/v1/completions", "{\"prompt\": [-1], \"max_tokens\": 2}"), status: 400, code: "invalid_value" },
        Bad { what: "token id above u32", request: json_req("/v1/completions", "{\"prompt\": [4294967296], \"max_tokens\": 2}"), status: 400, code: "invalid_value" },
        Bad { what: "detokenize negative id", request: json_req("/detokenize", "{\"tokens\": [-5]}"), status: 400, code: "invalid_value" },
        Bad { what: "prompt longer than the context", request: json_req("/v1/completions", &format!("{{\"prompt\": {:?}, \"max_tokens\": 2}}", (0..300).map(|i| i + 100).collect::<Vec<_>>())), status: 400, code: "context_length_exceeded" },
        Bad { what: "a 50 KB prompt", request: json_req("/v1/completions", &format!("{{\"prompt\": \"{big_prompt}\"}}")), status: 400, code: "context_length_exceeded" },
        Bad { what: "max_tokens huge", request: comp(", \"max_tokens\": 1000000000000"), status: 400, code: "context_length_exceeded" },
        Bad { what: "max_tokens negative", request: json_req("/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": -5}"), status: 400, code: "invalid_value" },
        Bad { what: "max_tokens zero", request: json_req("/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 0}"), status: 400, code: "invalid_value" },
        Bad { what: "max_tokens a float", request: json_req("/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 1e30}"), status: 400, code: "invalid_value" },
        Bad { what: "temperature 1e9", request: comp(", \"temperature\": 1e9"), status: 400, code: "invalid_value" },
        Bad { what: "temperature -1", request: comp(", \"temperature\": -1"), status: 400, code: "invalid_value" },
        Bad { what: "top_p -1", request: comp(", \"top_p\": -1"), status: 400, code: "invalid_value" },
        Bad { what: "top_p 2", request: comp(", \"top_p\": 2"), status: 400, code: "invalid_value" },
        Bad { what: "top_k negative", request: comp(", \"top_k\": -3"), status: 400, code: "invalid_value" },
        Bad { what: "min_p 5", request: comp(", \"min_p\": 5"), status: 400, code: "invalid_value" },
        Bad { what: "repeat_penalty 0", request: comp(", \"repeat_penalty\": 0"), status: 400, code: "invalid_value" },
        Bad { what: "presence_penalty 1e9", request: comp(", \"presence_penalty\": 1e9"), status: 400, code: "invalid_value" },
        Bad { what: "frequency_penalty -3", request: comp(", \"frequency_penalty\": -3"), status: 400, code: "invalid_value" },
        Bad { what: "completions logprobs 1000", request: comp(", \"logprobs\": 1000"), status: 400, code: "invalid_value" },
        Bad { what: "top_logprobs 1000", request: json_req("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"logprobs\": true, \"top_logprobs\": 1000}"), status: 400, code: "invalid_value" },
        Bad { what: "logit_bias id out of range", request: comp(", \"logit_bias\": {\"999999\": 1}"), status: 400, code: "invalid_value" },
        Bad { what: "logit_bias value 1e9", request: comp(", \"logit_bias\": {\"5\": 1e9}"), status: 400, code: "invalid_value" },
        Bad { what: "logit_bias key not a number", request: comp(", \"logit_bias\": {\"abc\": 1}"), status: 400, code: "invalid_value" },
        Bad { what: "n = 17", request: comp(", \"n\": 17"), status: 400, code: "invalid_value" },
        Bad { what: "n = 0", request: comp(", \"n\": 0"), status: 400, code: "invalid_value" },
        Bad { what: "seed -7", request: comp(", \"seed\": -7"), status: 400, code: "invalid_value" },
        Bad { what: "stop not a string", request: comp(", \"stop\": 5"), status: 400, code: "invalid_value" },
        Bad { what: "response_format json_schema without json_schema", request: comp(", \"response_format\": {\"type\": \"json_schema\"}"), status: 400, code: "invalid_value" },
        Bad { what: "response_format with an unsupported keyword", request: comp(", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": \"string\", \"pattern\": \"a+\"}}}"), status: 400, code: "invalid_value" },
        Bad { what: "response_format of an unknown type", request: comp(", \"response_format\": {\"type\": \"yaml\"}"), status: 400, code: "invalid_value" },
        Bad { what: "two prompts", request: json_req("/v1/completions", "{\"prompt\": [\"a\", \"b\"]}"), status: 400, code: "invalid_value" },
        Bad { what: "empty messages", request: json_req("/v1/chat/completions", "{\"messages\": []}"), status: 400, code: "invalid_value" },
        Bad { what: "unknown role", request: json_req("/v1/chat/completions", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}"), status: 400, code: "invalid_value" },
        Bad { what: "image content", request: json_req("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}"), status: 400, code: "invalid_value" },
        Bad { what: "messages missing", request: json_req("/v1/chat/completions", "{\"model\": \"x\"}"), status: 400, code: "invalid_value" },
        Bad { what: "malformed JSON", request: json_req("/v1/completions", "{\"prompt\": \"Hi\",, }"), status: 400, code: "invalid_json" },
        Bad { what: "truncated JSON", request: json_req("/v1/completions", "{\"prompt\": \"Hi\", \"max_to"), status: 400, code: "invalid_json" },
        Bad { what: "not JSON at all", request: json_req("/v1/completions", "\u{0}\u{1}garbage"), status: 400, code: "invalid_json" },
        Bad { what: "empty body", request: json_req("/v1/completions", ""), status: 400, code: "invalid_json" },
        Bad { what: "wrong content type", request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"prompt\":\"a\"}".to_string(), status: 415, code: "unsupported_media_type" },
        Bad { what: "no content type", request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"prompt\":\"a\"}".to_string(), status: 415, code: "unsupported_media_type" },
        Bad { what: "body over the limit", request: json_req("/v1/completions", &format!("{{\"prompt\": \"{over_limit}\"}}")), status: 413, code: "request_too_large" },
        Bad { what: "declared length over the limit", request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\nConnection: close\r\n\r\n{".to_string(), status: 413, code: "request_too_large" },
        Bad { what: "unknown route", request: "GET /v2/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_string(), status: 404, code: "not_found" },
        Bad { what: "wrong method", request: "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_string(), status: 405, code: "method_not_allowed" },
    ];
    let u = url.to_string();
    tokio::task::spawn_blocking(move || {
        for c in &cases {
            let (status, body) = raw(&u, &c.request);
            assert_eq!(status, c.status, "{}: {body}", c.what);
            let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {body}", c.what));
            assert_eq!(v["error"]["code"], c.code, "{}: {body}", c.what);
            assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", c.what);
            assert!(v["error"]["type"].is_string(), "{}", c.what);
        }
        // A client that stalls mid-body gets 408 after the body timeout.
        let mut s = TcpStream::connect(u.trim_start_matches("http://")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let t0 = Instant::now();
        s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ").unwrap();
        let (status, body) = read_answer(&mut s);
        assert_eq!(status, 408, "{body}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    })
    .await
    .unwrap();
    // Still healthy, and still serving.
    let (s, _) = post(
        url,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        client()
            .get(format!("{url}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn api_key_gives_401_without_it_and_health_stays_public() {
    let mut cfg = config();
    cfg.api_key = Some("sekret".into());
    let server = tokio::task::spawn_blocking(|| start(cfg)).await.unwrap();
    let url = server.url();
    let get = |path: &str, key: Option<&str>| {
        let mut r = client().get(format!("{url}{path}"));
        if let Some(k) = key {
            r = r.header("authorization", format!("Bearer {k}"));
        }
        r.send()
    };
    assert_eq!(get("/health", None).await.unwrap().status(), 200);
    let r = get("/v1/models", None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.json_text().await["error"]["code"], "invalid_api_key");
    assert_eq!(
        get("/v1/models", Some("wrong")).await.unwrap().status(),
        401
    );
    assert_eq!(get("/metrics", None).await.unwrap().status(), 401);
    assert_eq!(
        get("/v1/models", Some("sekret")).await.unwrap().status(),
        200
    );
    let (s, _) = post(
        &url,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 1}),
    )
    .await;
    assert_eq!(s, 401);
    let r = client()
        .post(format!("{url}/v1/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sekret")
        .body(json!({"prompt": "Hi", "max_tokens": 1}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_full_queue_answers_429() {
    let mut cfg = config();
    cfg.parallel = 1;
    cfg.max_queue = 1;
    let server = tokio::task::spawn_blocking(|| start(cfg)).await.unwrap();
    let url = server.url();
    let long = json!({"prompt": "Hi", "max_tokens": 200, "ignore_eos": true, "stream": true});
    // One runs, one waits; the third finds the queue full.
    let mut open = Vec::new();
    for _ in 0..2 {
        let r = client()
            .post(format!("{url}/v1/completions"))
            .header("content-type", "application/json")
            .body(long.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let (s, v) = post(
        &url,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 1}),
    )
    .await;
    assert_eq!(s, 429, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    drop(open);
    // Room again once the others are cancelled.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, _) = post(
            &url,
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 1}),
        )
        .await;
        if s == 200 {
            break;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // n choices are admitted all or none: 3 need one running and two waiting here.
    let (s, v) = post(
        &url,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 1, "n": 3}),
    )
    .await;
    assert_eq!(s, 429, "{v}");
    let (s, v) = post(
        &url,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 1, "n": 2}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn n_choices_each_with_its_own_seed() {
    let url = shared();
    let comp = json!({"prompt": "Once upon a time", "max_tokens": 12, "seed": 7, "temperature": 1.0,
                      "ignore_eos": true, "n": 3});
    let (s, v) = post(url, "/v1/completions", &comp).await;
    assert_eq!(s, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["completion_tokens"], 36);
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["total_tokens"], prompt + 36);
    // Choice i is the n = 1 answer for seed + i.
    for (i, t) in texts.iter().enumerate() {
        let mut one = comp.clone();
        one["n"] = json!(1);
        one["seed"] = json!(7 + i);
        let (_, w) = post(url, "/v1/completions", &one).await;
        assert_eq!(text_of(&w), *t, "choice {i}");
        assert_eq!(w["usage"]["prompt_tokens"], prompt);
    }
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "three seeds, one text: {texts:?}"
    );

    // Streamed chat: chunks carry each choice's index; the texts equal the whole answer's.
    let chat = json!({"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8,
                      "seed": 3, "temperature": 1.0, "n": 2, "ignore_eos": true});
    let (s, whole) = post(url, "/v1/chat/completions", &chat).await;
    assert_eq!(s, 200, "{whole}");
    let mut sc = chat.clone();
    sc["stream"] = json!(true);
    sc["stream_options"] = json!({"include_usage": true});
    let chunks = post_stream(url, "/v1/chat/completions", &sc).await;
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"));
    let mut texts = [String::new(), String::new()];
    let mut roles = [0, 0];
    let mut finishes = [0, 0];
    let mut usage = None;
    for c in &chunks[..chunks.len() - 1] {
        let v: Value = serde_json::from_str(c).unwrap();
        let Some(ch) = v["choices"].as_array().unwrap().first() else {
            usage = Some(v["usage"].clone());
            continue;
        };
        let i = ch["index"].as_u64().unwrap() as usize;
        if ch["delta"]["role"] == "assistant" {
            roles[i] += 1;
        }
        texts[i].push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        if ch["finish_reason"].is_string() {
            finishes[i] += 1;
        }
    }
    assert_eq!((roles, finishes), ([1, 1], [1, 1]));
    for i in 0..2 {
        assert_eq!(
            texts[i],
            whole["choices"][i]["message"]["content"].as_str().unwrap()
        );
    }
    assert_eq!(usage.unwrap(), whole["usage"]);
    assert_eq!(whole["usage"]["completion_tokens"], 16);
}

#[tokio::test]
async fn shutdown_ends_running_streams_and_returns() {
    let server = tokio::task::spawn_blocking(|| start(config()))
        .await
        .unwrap();
    let url = server.url();
    let mut r = client()
        .post(format!("{url}/v1/completions"))
        .header("content-type", "application/json")
        .body(
            json!({"prompt": "Hi", "max_tokens": 200, "ignore_eos": true, "stream": true})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert!(r.chunk().await.unwrap().is_some());
    let stopping = tokio::task::spawn_blocking(move || server.stop());
    let mut rest = String::new();
    while let Ok(Some(c)) = r.chunk().await {
        rest.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(rest.contains("shutting down"), "{rest}");
    stopping.await.unwrap().unwrap();
}

/// The official `openai` Python client (scripts/serve_openai_client.py) against the server;
/// reports itself skipped where python3 or the `openai` package is missing.
#[tokio::test]
async fn openai_python_client() {
    let has = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        println!("skipped: openai_python_client: python3 with the openai package is not installed (python3 -m pip install openai)");
        return;
    }
    let url = shared().to_string();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/serve_openai_client.py"
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "openai client failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("ok"), "{stdout}");
}

#[tokio::test]
async fn a_client_that_goes_away_is_cancelled_at_once() {
    let server = tokio::task::spawn_blocking(|| start(config()))
        .await
        .unwrap();
    let url = server.url();
    for stream in [false, true] {
        let before = metric(&url, "ferrite_requests_cancelled_total").await;
        let body = json!({"prompt": "Hi", "max_tokens": 200, "ignore_eos": true, "stream": stream});
        let req = client()
            .post(format!("{url}/v1/completions"))
            .header("content-type", "application/json")
            .body(body.to_string());
        if stream {
            let mut r = req.send().await.unwrap();
            assert!(r.chunk().await.unwrap().is_some());
        } else {
            let e = req
                .timeout(Duration::from_millis(300))
                .send()
                .await
                .unwrap_err();
            assert!(e.is_timeout(), "{e}");
        }
        // The generation stops long before its 200 tokens, counted as cancelled, its blocks
        // free. (The gauges are published after each engine step, so a read right after
        // the first token may still show the step before the request joined: wait for all
        // three together.)
        let t0 = Instant::now();
        loop {
            let running = metric(&url, "ferrite_requests_running").await;
            let cancelled = metric(&url, "ferrite_requests_cancelled_total").await;
            let used = metric(&url, "ferrite_kv_blocks_used").await;
            if running == 0.0 && cancelled == before + 1.0 && used == 0.0 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "stream={stream}: running {running}, cancelled {cancelled} (before {before}), blocks used {used}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap()
        .unwrap();
}
