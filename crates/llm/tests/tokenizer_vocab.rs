//! llama.cpp's tokenizer test vectors: `ggml-vocab-<name>.gguf` (a vocabulary-only GGUF) with
//! `.inp` (inputs separated by `\n__ggml_vocab_test__\n`) and `.out` (expected ids, one line
//! per input), tokenized with add_special = false, parse_special = false, as llama.cpp's
//! `test-tokenizer-0` does.
//!
//! The files come from the PyPI source distribution `llama-cpp-python==0.3.16` (MIT), fetched
//! once with `python3 -m pip download` into the model cache (`$FERRITE_CACHE` or
//! `~/.cache/ferrite/models`), sha256-checked, and extracted there.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use ferrite_gguf::GgufFile;
use ferrite_llm::tokenizer::Tokenizer;

const SDIST: &str = "llama-cpp-python==0.3.16";
const SDIST_FILE: &str = "llama_cpp_python-0.3.16.tar.gz";
const SDIST_SHA256: &str = "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6";
/// The vocabularies this tokenizer passes every vector of.
const VOCABS: &[&str] = &[
    "llama-spm",
    "llama-bpe",
    "qwen2",
    "gpt-2",
    "phi-3",
    "mpt",
    "starcoder",
    "refact",
    "command-r",
    "falcon",
    "deepseek-coder",
    "deepseek-llm",
];

static FETCH: Mutex<()> = Mutex::new(());

/// Python: extract `models/ggml-vocab-*` of the sdist argv[1] into folder argv[2].
const EXTRACT: &str = r#"
import os, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    for m in t.getmembers():
        if m.isfile() and "/vendor/llama.cpp/models/ggml-vocab-" in m.name:
            with t.extractfile(m) as src, open(os.path.join(sys.argv[2], os.path.basename(m.name)), "wb") as dst:
                dst.write(src.read())
"#;

/// The folder holding the extracted vocab files, fetching them on first use.
fn vocab_dir() -> PathBuf {
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    let cache = ferrite_gguf::fetch::cache_dir().expect("model cache folder");
    let dir = cache.join("llama-cpp-python-0.3.16-vocab");
    if dir.join("ggml-vocab-llama-spm.gguf.out").exists() {
        return dir;
    }
    let work = cache.join(format!(".fetch-vocab-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).unwrap();
    eprintln!("fetching {SDIST} (sdist, ~50 MB) for the tokenizer test vectors ...");
    // --no-binary for this package only: pip prepares its metadata (no compiling), while its
    // build requirements may come as wheels.
    let ok = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
        ])
        .args(["--no-binary", "llama-cpp-python", SDIST, "-d"])
        .arg(&work)
        .status()
        .expect("run python3 -m pip")
        .success();
    assert!(ok, "python3 -m pip download {SDIST} failed");
    let tarball = work.join(SDIST_FILE);
    let sum = ferrite_gguf::fetch::sha256_file(&tarball).unwrap();
    assert_eq!(sum, SDIST_SHA256, "sha256 of {}", tarball.display());
    let out = work.join("vocab");
    fs::create_dir_all(&out).unwrap();
    let ok = Command::new("python3")
        .args(["-c", EXTRACT])
        .arg(&tarball)
        .arg(&out)
        .status()
        .expect("run python3")
        .success();
    assert!(
        ok,
        "extracting the vocab files from {} failed",
        tarball.display()
    );
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&out, &dir).unwrap();
    let _ = fs::remove_dir_all(&work);
    dir
}

fn read_cases(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let inp = fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    // The .inp file ends with a separator followed by nothing: that last entry is not a case.
    let inputs = &inputs[..outputs.len()];
    inputs.iter().map(|s| s.to_string()).zip(outputs).collect()
}

fn check_vocab(name: &str) {
    let dir = vocab_dir();
    let file = GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let cases = read_cases(&dir, name);
    assert!(cases.len() > 30, "{name}: only {} cases", cases.len());
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode_with(text, false, false).unwrap();
        if &got != want {
            failures.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_cpp_vocab_vectors() {
    let mut failed = Vec::new();
    for name in VOCABS {
        if let Err(e) = std::panic::catch_unwind(|| check_vocab(name)) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "panic".to_string());
            failed.push(msg);
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Decoding the expected ids gives back the input text (byte-level BPE is lossless; the
/// SentencePiece vocabularies' leading space is removed again).
#[test]
fn vocab_round_trips() {
    let dir = vocab_dir();
    for name in ["llama-bpe", "qwen2", "gpt-2", "llama-spm", "phi-3"] {
        let file = GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let mut failures = Vec::new();
        for (text, ids) in read_cases(&dir, name) {
            let got = tok.decode(&ids);
            if got != text {
                failures.push(format!("  {text:?} decoded to {got:?}"));
            }
        }
        assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
    }
}
