//! `ferrite bench --batch B` on a small synthetic model: the JSON report names the batch and
//! gives aggregate and per-sequence speeds (per sequence = aggregate / B); bad combinations
//! are clean errors.

use std::path::PathBuf;
use std::process::{Command, Output};

fn ferrite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .output()
        .expect("run ferrite")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A synthetic 1-layer SmolLM2-shaped model in the temp dir, removed when dropped.
struct Synth(PathBuf);

impl Synth {
    /// `name`: the test's, so tests running at once use files of their own.
    fn new(name: &str) -> Synth {
        let p = std::env::temp_dir().join(format!(
            "ferrite-bench-batch-{}-{name}.gguf",
            std::process::id()
        ));
        let o = ferrite(&[
            "synth",
            "--preset",
            "smollm2-135m",
            "--layers",
            "1",
            "--vocab",
            "1024",
            "-o",
            p.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        Synth(p)
    }
    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Synth {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `ferrite bench --device cpu -m M -r 1 --json` with `extra` flags.
fn bench_json(m: &Synth, extra: &[&str]) -> Output {
    let mut a = vec!["bench", "--device", "cpu", "-m", m.s(), "-r", "1", "--json"];
    a.extend_from_slice(extra);
    ferrite(&a)
}

#[test]
fn bench_batch_reports_aggregate_and_per_sequence_speeds() {
    let m = Synth::new("speeds");
    let o = bench_json(&m, &["-p", "20", "-n", "5", "--batch", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["batch"], 3);
    assert_eq!(j["backend"], "CPU engine");
    assert_eq!(j["precision"], "q8x2", "{j}");
    let r = j["results"].as_array().unwrap();
    assert_eq!(r[0]["test"], "pp20");
    assert_eq!(r[1]["test"], "tg5");
    let pp = r[0]["tok_s_mean"].as_f64().unwrap();
    let tg = r[1]["tok_s_mean"].as_f64().unwrap();
    let per = r[1]["per_sequence_tok_s_mean"].as_f64().unwrap();
    assert!(pp > 0.0 && tg > 0.0, "{j}");
    assert!((per * 3.0 / tg - 1.0).abs() < 1e-9, "{per} x 3 vs {tg}");

    let o = bench_json(&m, &["-p", "0", "-n", "5", "--batch", "2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--batch needs -p and -n of at least 1"),
        "{}",
        stderr(&o)
    );
    let o = ferrite(&["bench", "-m", m.s(), "--batch", "0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--batch"), "{}", stderr(&o));
}

#[test]
fn bench_batch_samples_with_temp() {
    let m = Synth::new("temp");
    let o = bench_json(&m, &["-p", "8", "-n", "4", "--batch", "2", "--temp", "0.8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["temperature"].as_f64(), Some(0.8f32 as f64), "{j}");
    assert!(
        j["detail"]
            .as_str()
            .unwrap()
            .contains("sampling at temperature 0.8"),
        "{j}"
    );
    assert!(j["results"][1]["tok_s_mean"].as_f64().unwrap() > 0.0, "{j}");
    // Batch-1 figures without --batch are greedy: --temp there is refused, naming --batch.
    let o = bench_json(&m, &["-p", "8", "-n", "4", "--temp", "0.8"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("give --batch too"), "{}", stderr(&o));
    let o = bench_json(&m, &["-p", "8", "-n", "4", "--batch", "2", "--temp", "nan"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("temperature"), "{}", stderr(&o));
}
