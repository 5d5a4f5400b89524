//! The LLM subcommands as a user runs them: usage errors (exit code 2, before any model is
//! loaded), and with the default model (fetched on first use): greedy generation, the
//! context-size error, perplexity and bench output.

use std::process::{Command, Output};

fn ferrite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .output()
        .expect("run ferrite")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bad_sampling_flags_are_usage_errors() {
    for (args, needle) in [
        (
            &["run", "hi", "--temp", "-1"][..],
            "temperature must be finite and >= 0",
        ),
        (
            &["run", "hi", "--top-p", "0"][..],
            "top-p must be in (0, 1]",
        ),
        (
            &["run", "hi", "--top-p", "1.5"][..],
            "top-p must be in (0, 1]",
        ),
        (&["run", "hi", "--min-p", "2"][..], "must be in [0, 1]"),
        (&["run", "-n", "0"][..], "-n 0 with no prompt"),
        (
            &["run", "hi", "--precision", "fp8"][..],
            "expected q8, q8x2 or exact",
        ),
        (&["bench", "-r", "0"][..], "-r"),
    ] {
        let o = ferrite(args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

fn default_model_available() -> bool {
    ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().is_ok()
}

#[test]
fn greedy_run_with_the_default_model() {
    assert!(
        default_model_available(),
        "fetching the default model failed"
    );
    let o = ferrite(&["run", "The capital of France is", "--temp", "0", "-n", "3"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with(" Paris.\n"), "{out:?}");
    assert!(err.contains("tok/s"), "{err}");
    let o = ferrite(&[
        "run",
        "The capital of France is",
        "--temp",
        "0",
        "-n",
        "8",
        "--ctx",
        "6",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("prompt of 5 tokens plus 8 to generate need 13 positions")
            && err.contains("context size is 6"),
        "{err}"
    );
}

#[test]
fn perplexity_and_bench_with_the_default_model() {
    assert!(
        default_model_available(),
        "fetching the default model failed"
    );
    let text_file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/llm/tests/fixtures/genesis_1.txt"
    );
    let o = ferrite(&["perplexity", "-f", text_file, "--ctx", "128", "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ppl = v["ppl"].as_f64().unwrap();
    // transformers: 3.8684 on the same 128 tokens (crates/llm/tests/fixtures/smollm2.json).
    assert!((ppl / 3.8684 - 1.0).abs() < 0.01, "{ppl}");
    assert_eq!(v["scored"], 127);
    let o = ferrite(&["bench", "-p", "16", "-n", "4", "-r", "1", "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let tests: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["pp16", "tg4"]);
}
