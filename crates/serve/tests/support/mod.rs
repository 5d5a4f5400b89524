//! What the HTTP test binaries share: a CPU server on SmolLM2-135M (the cached default model),
//! started on an ephemeral port, and small clients for its endpoints.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::Model;
use ferrite_serve::{Loaded, RunningServer, ServeConfig};
use serde_json::Value;

pub fn loader() -> ferrite_serve::Loader {
    Box::new(|| {
        let path = ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().map_err(|e| e.to_string())?;
        let model = Model::load(&path).map_err(|e| e.to_string())?;
        let tok = Tokenizer::from_gguf(model.gguf()).map_err(|e| e.to_string())?;
        Ok(Loaded::cpu(model, tok))
    })
}

pub fn config() -> ServeConfig {
    let mut c = ServeConfig::new("smollm2");
    c.ctx = Some(256);
    c.parallel = 8;
    c.max_queue = 256;
    c.body_limit = 64 << 10;
    c.body_timeout = Duration::from_millis(1500);
    c
}

/// Starts a server and waits until `/health` says it is ready.
pub fn start(cfg: ServeConfig) -> RunningServer {
    let s = RunningServer::start("127.0.0.1:0".parse().unwrap(), cfg, loader()).unwrap();
    let t0 = Instant::now();
    loop {
        let (status, _) = raw(
            &s.url(),
            "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        if status == 200 {
            return s;
        }
        assert!(status == 503, "/health while loading: {status}");
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the model did not load"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn shared() -> &'static str {
    static S: OnceLock<RunningServer> = OnceLock::new();
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| S.get_or_init(|| start(config())).url())
}

/// Sends raw bytes, returns (status, body) of the answer.
pub fn raw(url: &str, request: &str) -> (u16, String) {
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    read_answer(&mut s)
}

pub fn read_answer(s: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::new()
}

pub async fn post(url: &str, path: &str, body: &Value) -> (u16, Value) {
    post_text(url, path, body.to_string()).await
}

/// [`post`] of a body given as text (to keep a schema's key order).
pub async fn post_text(url: &str, path: &str, body: String) -> (u16, Value) {
    let r = client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
    (status, v)
}

/// The `data:` payloads of an SSE body, in order.
pub async fn post_stream(url: &str, path: &str, body: &Value) -> Vec<String> {
    post_stream_text(url, path, body.to_string()).await
}

pub async fn post_stream_text(url: &str, path: &str, body: String) -> Vec<String> {
    let r = client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let text = r.text().await.unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

pub async fn metric(url: &str, name: &str) -> f64 {
    let text = client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
        .parse()
        .unwrap()
}
