//! `ferrite serve` as a user runs it: it prints where it listens, answers /health once the
//! default model is loaded, serves a completion, and exits cleanly on SIGTERM; and
//! `ferrite bench-serve` against it reports its figures.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn http(addr: &str, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    let status = buf
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        buf.split("\r\n\r\n").nth(1).unwrap_or("").to_string(),
    )
}

#[cfg(unix)]
#[test]
fn serve_answers_then_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args([
            "serve",
            "--port",
            "0",
            "--ctx",
            "128",
            "--parallel",
            "2",
            "--device",
            "cpu",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "serve exited before listening"
        );
        if let Some(rest) = line.trim().strip_prefix("serve: listening on http://") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let t0 = Instant::now();
    while http(
        &addr,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .0 != 200
    {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the model did not load"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let body = r#"{"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}"#;
    let (status, text) = http(
        &addr,
        &format!("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()),
    );
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"completion_tokens\":3"), "{text}");

    let bench = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args([
            "bench-serve",
            &format!("http://{addr}"),
            "-c",
            "2",
            "-r",
            "2",
            "--max-tokens",
            "3",
            "--json",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&bench.stdout);
    assert!(
        bench.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["requests_ok"], 2, "{v}");
    assert_eq!(v["completion_tokens"], 6, "{v}");
    assert!(v["tokens_per_second"].as_f64().unwrap() > 0.0, "{v}");

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "serve exited with {status}: {rest}");
    assert!(rest.contains("serve: stopped"), "{rest}");
}
