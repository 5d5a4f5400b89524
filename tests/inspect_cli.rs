//! `ferrite inspect` end to end: valid files print a report (text and JSON); every file of
//! the fuzz corpus (the malformed-file generator's output plus fuzzer finds) either prints a
//! report or fails with exit code 1 and exactly one `error:` line, fast and without a panic.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn ferrite() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A reader that goes away before the report (`ferrite inspect F | head -c 0`) ends the
/// command quietly, by SIGPIPE as other command-line tools, not by a panic in println!.
#[cfg(unix)]
#[test]
fn a_closed_standard_output_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let file = root().join("crates/gguf/tests/fixtures/pywriter.gguf");
    let mut child = ferrite()
        .arg("inspect")
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.signal(),
        Some(13),
        "SIGPIPE; {:?} {err}",
        out.status
    );
}

#[test]
fn inspect_reports_a_valid_file_as_text_and_json() {
    let file = root().join("crates/gguf/tests/fixtures/pywriter.gguf");
    let out = ferrite().arg("inspect").arg(&file).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("GGUF v3"), "{text}");
    assert!(
        text.contains("t.arr_str (array of string) = [\"a\", \"\", \"ü\"]"),
        "{text}"
    );
    assert!(text.contains("q8_0"), "{text}");
    assert!(text.contains("totals per type:"), "{text}");

    let out = ferrite()
        .arg("inspect")
        .arg("--json")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["version"], 3);
    assert_eq!(j["tensors"].as_array().unwrap().len(), 3);
    let q = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "q8_0")
        .unwrap();
    assert_eq!(q["type"], "Q8_0");
    assert_eq!(q["shape"], serde_json::json!([64, 3]));
    assert_eq!(q["n_bytes"], 6 * 34);
    assert_eq!(j["totals"]["F32"]["tensors"], 1);
    let md = j["metadata"].as_array().unwrap();
    let u64v = md.iter().find(|m| m["key"] == "t.u64").unwrap();
    assert_eq!(u64v["value"].as_u64(), Some(18_000_000_000_000_000_000));
}

fn check_malformed(path: &Path) -> bool {
    check_malformed_as(path, "gguf: ")
}

fn check_malformed_as(path: &Path, reader: &str) -> bool {
    let start = Instant::now();
    let out = ferrite().arg("inspect").arg(path).output().unwrap();
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        elapsed < Duration::from_secs(1),
        "{}: took {elapsed:?}",
        path.display()
    );
    assert!(!stderr.contains("panicked"), "{}: {stderr}", path.display());
    match out.status.code() {
        Some(0) => false,
        Some(1) => {
            assert_eq!(stderr.lines().count(), 1, "{}: {stderr}", path.display());
            assert!(
                stderr.starts_with("error: inspect "),
                "{}: {stderr}",
                path.display()
            );
            assert!(stderr.contains(reader), "{}: {stderr}", path.display());
            true
        }
        c => panic!("{}: exit code {c:?}: {stderr}", path.display()),
    }
}

#[test]
fn inspect_rejects_malformed_files_with_one_error_line() {
    let dir = root().join("fuzz/corpus/gguf_open");
    let mut rejected = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        if check_malformed(&entry.unwrap().path()) {
            rejected += 1;
        }
    }
    assert!(rejected >= 40, "only {rejected} files rejected");
    let missing = root().join("no/such/file.gguf");
    assert!(check_malformed(&missing));
}

#[test]
fn inspect_reports_safetensors_and_rejects_malformed_ones() {
    let dir = root().join("fuzz/corpus/safetensors_parse");
    let mut rejected = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        if check_malformed_as(&entry.unwrap().path(), "safetensors: ") {
            rejected += 1;
        }
    }
    assert!(rejected >= 20, "only {rejected} files rejected");
    let valid = dir.join("valid_all_dtypes.safetensors");
    let out = ferrite().arg("inspect").arg(&valid).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("safetensors, ") && text.contains("11 tensors"),
        "{text}"
    );
    assert!(text.contains("bf16    BF16    [1, 2]"), "{text}");
    let out = ferrite()
        .args(["inspect", "--json"])
        .arg(&valid)
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["tensor_count"], 11);
    let f64t = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "f64")
        .unwrap();
    assert_eq!(f64t["shape"], serde_json::json!([2, 1]));
    assert_eq!(f64t["bytes"], 16);
}
