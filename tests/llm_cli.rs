//! The LLM subcommands as a user runs them: usage errors (exit code 2, before any model is
//! loaded), and with the default model (fetched on first use): greedy generation, the
//! context-size error, perplexity and bench output.

use std::process::{Command, Output};

fn ferrite(args: &[&str]) -> Output {
    ferrite_with(args, &[], None)
}

/// ferrite with extra environment variables and, optionally, `stdin` piped in.
fn ferrite_with(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
    c.args(args).envs(env.iter().copied());
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("run ferrite");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().expect("run ferrite")
}

#[test]
fn bad_environment_variables_are_errors_naming_them() {
    for (var, value, needle) in [
        (
            "FERRITE_THREADS",
            "100000",
            "FERRITE_THREADS=\"100000\": expected an integer from 1 to 1024",
        ),
        ("FERRITE_THREADS", "0", "FERRITE_THREADS=\"0\""),
        ("FERRITE_THREADS", "two", "FERRITE_THREADS=\"two\""),
        (
            "FERRITE_PRECISION",
            "fp8",
            "FERRITE_PRECISION: unknown precision \"fp8\"",
        ),
        (
            "FERRITE_ISA",
            "avx9",
            "FERRITE_ISA=\"avx9\": expected scalar, avx2, vnni, avx512 or amx",
        ),
        (
            "FERRITE_GPU_EAGER",
            "maybe",
            "FERRITE_GPU_EAGER=\"maybe\": expected 0 or 1",
        ),
        ("FERRITE_GPU_MV_UPT", "65", "FERRITE_GPU_MV_UPT=\"65\""),
        (
            "FERRITE_GPU_ATTN_KEYS",
            "48",
            "FERRITE_GPU_ATTN_KEYS=\"48\": expected a power of two from 16 to 1024",
        ),
        ("FERRITE_GPU_ATTN_KEYS", "8", "FERRITE_GPU_ATTN_KEYS=\"8\""),
    ] {
        let o = ferrite_with(&["run", "hi", "-n", "1"], &[(var, value)], None);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{var}={value}: {err}");
        assert!(err.contains(needle), "{var}={value}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn run_takes_the_prompt_as_llama_cpp_users_type_it() {
    assert!(
        default_model_available(),
        "fetching the default model failed"
    );
    let q = "What is the capital of France?";
    let want = "The capital of France is Paris.";
    let greedy = ["--chat", "--temp", "0", "-n", "12", "-ngl", "0"];
    // Positional, -p, piped stdin, -f FILE and -f - give the same answer (a final newline
    // of a file or pipe is not part of the prompt).
    let file = std::env::temp_dir().join(format!("ferrite-prompt-{}.txt", std::process::id()));
    std::fs::write(&file, format!("{q}\n")).unwrap();
    let f = file.to_str().unwrap();
    let runs: Vec<(Vec<&str>, Option<String>)> = vec![
        (vec![q], None),
        (vec!["-p", q], None),
        (vec![], Some(format!("{q}\n"))),
        (vec!["-f", f], None),
        (vec!["-f", "-"], Some(q.to_string())),
    ];
    for (extra, stdin) in runs {
        let args: Vec<&str> = ["run"]
            .iter()
            .chain(&extra)
            .chain(&greedy)
            .copied()
            .collect();
        let o = ferrite_with(&args, &[], stdin.as_deref());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert_eq!(out.trim(), want, "{args:?}");
        assert!(err.contains("stop: end of text"), "{args:?}: {err}");
    }
    std::fs::remove_file(&file).ok();
    // -sys adds a system message; --json reports text, tokens, counts and the stop reason.
    let o = ferrite(&[
        "run",
        "-sys",
        "You are a helpful assistant.",
        "-p",
        q,
        "--temp",
        "0",
        "-n",
        "12",
        "-s",
        "-1",
        "--json",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["text"].as_str().unwrap().contains("Paris"), "{v}");
    assert_eq!(
        v["generated_tokens"].as_u64().unwrap() as usize,
        v["tokens"].as_array().unwrap().len()
    );
    assert_eq!(v["stop"], "end of text");
    assert!(v["prompt_tokens"].as_u64().unwrap() > 10);
    // -n -1 runs to the end of the context; --ignore-eos past end-of-text tokens.
    let o = ferrite(&[
        "run",
        "-p",
        q,
        "--chat",
        "--temp",
        "0",
        "-n",
        "-1",
        "-c",
        "48",
        "--ignore-eos",
        "--json",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["stop"], "context full", "{v}");
    assert_eq!(
        v["prompt_tokens"].as_u64().unwrap() + v["generated_tokens"].as_u64().unwrap(),
        48
    );
    // Text spelling a control token is plain text: the reply does not end at once.
    let o = ferrite(&[
        "run",
        "--chat",
        "--temp",
        "0",
        "-n",
        "8",
        "--json",
        "-p",
        "<|im_end|>",
    ]);
    let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert!(v["generated_tokens"].as_u64().unwrap() > 0, "{v}");
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_model_file_that_is_missing_or_not_gguf_is_named_once() {
    let dir = std::env::temp_dir().join(format!("ferrite-llm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.gguf");
    let png = dir.join("picture.gguf");
    std::fs::write(&png, b"\x89PNG\r\n\x1a\n0000").unwrap();
    for (path, needle) in [
        (&missing, "No such file"),
        (&png, r#"gguf: not a GGUF file: it starts with "\x89PNG"#),
    ] {
        let o = ferrite(&["run", "-m", path.to_str().unwrap(), "hi"]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(needle), "{err}");
        let shown = path.display().to_string();
        assert_eq!(err.matches(&shown).count(), 1, "path named once: {err}");
        assert!(err.contains(&format!("error: loading {shown}: ")), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
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
            "expected one of: q8, q8x2, exact",
        ),
        (&["bench", "-r", "0"][..], "-r"),
        (&["run", "hi", "-n", "-2"][..], "-1 for no limit"),
        (&["run", "hi", "-s", "-5"][..], "-1 for random"),
        (&["run", "hi", "-p", "there"][..], "cannot be used with"),
        (
            &["run", "hi", "--top-k", "-3"][..],
            r#"expected a whole number >= 0, got "-3""#,
        ),
        (
            &["run", "hi", "-c", "abc"][..],
            r#"expected a whole number from 1 to 4294967295, got "abc""#,
        ),
        (
            &["run", "hi", "-t", "0"][..],
            r#"expected a whole number from 1 to 1024, got "0""#,
        ),
        (
            &["run", "hi", "--temp", "warm"][..],
            r#"expected a number, got "warm""#,
        ),
        (
            &["serve", "--body-timeout", "0"][..],
            r#"expected a whole number >= 1, got "0""#,
        ),
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
    let o = ferrite(&[
        "perplexity",
        "-f",
        text_file,
        "--ctx",
        "128",
        "--chunks",
        "1",
        "--json",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ppl = v["ppl"].as_f64().unwrap();
    // transformers: 3.8684 on the same 128 tokens (crates/llm/tests/fixtures/smollm2.json).
    assert!((ppl / 3.8684 - 1.0).abs() < 0.01, "{ppl}");
    assert_eq!(v["scored"], 127);
    // The whole file in windows of 128 every 64 tokens: every token after the first scored
    // once, with its uncertainty.
    let o = ferrite(&["perplexity", "-f", text_file, "-c", "128", "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        v["scored"].as_u64().unwrap() + 1,
        v["text_tokens"].as_u64().unwrap()
    );
    assert!(v["windows"].as_u64().unwrap() > 1, "{v}");
    let (ppl, err_ppl) = (
        v["ppl"].as_f64().unwrap(),
        v["ppl_uncertainty"].as_f64().unwrap(),
    );
    assert!(
        ppl > 1.5 && ppl < 10.0 && err_ppl > 0.0 && err_ppl < 0.5 * ppl,
        "{v}"
    );
    // Too little text blames the file.
    let short = std::env::temp_dir().join(format!("ferrite-ppl-{}.txt", std::process::id()));
    std::fs::write(&short, "a").unwrap();
    let o = ferrite(&["perplexity", "-f", short.to_str().unwrap()]);
    std::fs::remove_file(&short).ok();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains(
            "holds 1 token after tokenization; perplexity needs at least 2 tokens of text"
        ),
        "{err}"
    );
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
    assert_eq!(v["n_prompt"], 16);
    assert_eq!(v["n_gen"], 4);
    assert_eq!(v["results"][0]["n_prompt"], 16);
    assert_eq!(v["results"][1]["n_gen"], 4);
    assert_eq!(v["backend"], "cpu");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["device"].as_str().unwrap().starts_with("CPU ("), "{v}");
    let path = v["model"].as_str().unwrap();
    assert!(
        std::path::Path::new(path).is_absolute() && path.ends_with(".gguf"),
        "{v}"
    );
    // --ctx-size sizes the KV cache, and must hold the longest test.
    let o = ferrite(&[
        "bench", "-p", "16", "-n", "4", "-r", "1", "-c", "64", "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["ctx"], 64);
    let o = ferrite(&["bench", "-p", "64", "-n", "4", "-r", "1", "-c", "32"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o)
        .1
        .contains("--ctx-size 32 is smaller than the longest test"));
}
