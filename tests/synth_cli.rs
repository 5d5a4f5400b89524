//! `ferrite synth` end to end: small files (2 layers) of each weight type load in ferrite-llm
//! with the expected tensor names, shapes and types and decode to finite logits; `run`,
//! `run --chat` and `bench` work on them; a seed gives the same bytes; bad flags are clean
//! errors. (The full-size presets are not written here: llama3-8b is 3.9 GiB.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferrite_gguf::{GgmlType, GgufFile};
use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::{Logits, Model, Session};

fn ferrite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .output()
        .expect("run ferrite")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A path in the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> TempFile {
        TempFile(
            std::env::temp_dir().join(format!("ferrite-synth-{}-{name}.gguf", std::process::id())),
        )
    }
    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn synth(out: &TempFile, args: &[&str]) {
    let mut all = vec!["synth", "-o", out.s()];
    all.extend_from_slice(args);
    let o = ferrite(&all);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    assert!(stderr(&o).contains("wrote "), "{}", stderr(&o));
}

/// Prompt + 4 greedy tokens through ferrite-llm; every logit finite and of sane size.
fn decode_finite(path: &Path, prompt: &str) -> Vec<u32> {
    let model = Model::load(path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let mut ids = tok.encode(prompt, true).unwrap();
    assert!(!ids.is_empty());
    let mut session = Session::new(&model, 32).unwrap();
    let mut out = Vec::new();
    for _ in 0..4 {
        let logits = session.forward(&ids, Logits::Last).unwrap();
        assert_eq!(logits.len(), model.cfg.vocab);
        let amax = logits.iter().fold(0f32, |a, x| a.max(x.abs()));
        assert!(
            logits.iter().all(|x| x.is_finite()) && amax > 0.0 && amax < 1e3,
            "{}: logits max |x| {amax}",
            path.display()
        );
        let next = ferrite_llm::generate::argmax(logits);
        out.push(next);
        ids = vec![next];
    }
    out
}

fn dims(f: &GgufFile, name: &str) -> (GgmlType, Vec<u64>) {
    let t = f.tensor(name).unwrap_or_else(|| panic!("missing {name}"));
    (t.ty, t.dims.clone())
}

#[test]
fn smollm2_two_layers_loads_and_decodes_for_each_weight_type() {
    for (quant, ty, fallback) in [
        ("q4_0", GgmlType::Q4_0, GgmlType::Q4_0),
        ("q4_1", GgmlType::Q4_1, GgmlType::Q4_1),
        ("q8_0", GgmlType::Q8_0, GgmlType::Q8_0),
        // 576-wide rows are not whole 256-blocks: Q5_0, as llama.cpp falls back.
        ("q4_k", GgmlType::Q4_K, GgmlType::Q5_0),
        ("q6_k", GgmlType::Q6_K, GgmlType::Q8_0),
        ("f16", GgmlType::F16, GgmlType::F16),
        ("f32", GgmlType::F32, GgmlType::F32),
    ] {
        let out = TempFile::new(quant);
        synth(
            &out,
            &[
                "--preset",
                "smollm2-135m",
                "--quant",
                quant,
                "--layers",
                "2",
            ],
        );
        let f = GgufFile::open(&out.0).unwrap();
        assert_eq!(f.tensors().len(), 1 + 2 * 9 + 1, "{quant}");
        assert!(f.tensor("output.weight").is_none(), "tied embeddings");
        assert_eq!(dims(&f, "token_embd.weight"), (fallback, vec![576, 49152]));
        assert_eq!(dims(&f, "blk.1.attn_q.weight"), (fallback, vec![576, 576]));
        assert_eq!(dims(&f, "blk.1.attn_k.weight"), (fallback, vec![576, 192]));
        assert_eq!(dims(&f, "blk.1.attn_v.weight"), (fallback, vec![576, 192]));
        assert_eq!(
            dims(&f, "blk.1.attn_output.weight"),
            (fallback, vec![576, 576])
        );
        assert_eq!(
            dims(&f, "blk.1.ffn_gate.weight"),
            (fallback, vec![576, 1536])
        );
        assert_eq!(dims(&f, "blk.1.ffn_up.weight"), (fallback, vec![576, 1536]));
        assert_eq!(dims(&f, "blk.1.ffn_down.weight"), (ty, vec![1536, 576]));
        for n in ["blk.0.attn_norm", "blk.1.ffn_norm", "output_norm"] {
            assert_eq!(dims(&f, &format!("{n}.weight")), (GgmlType::F32, vec![576]));
        }
        let norm = f
            .dequantize(f.tensor("output_norm.weight").unwrap())
            .unwrap();
        assert!(norm.iter().all(|x| (0.8..1.2).contains(x)), "{quant}");
        assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
        assert_eq!(f.get_u32("llama.attention.head_count_kv").unwrap(), 3);
        assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        drop(f);

        let model = Model::load(&out.0).unwrap();
        let c = &model.cfg;
        assert_eq!(
            (
                c.n_layer,
                c.d_model,
                c.n_head,
                c.n_kv_head,
                c.n_ff,
                c.vocab,
                c.ctx_train
            ),
            (2, 576, 9, 3, 1536, 49152, 8192),
            "{quant}"
        );
        drop(model);
        decode_finite(&out.0, "hello world");
    }
}

#[test]
fn llama3_shapes_one_layer_load_with_untied_output_and_bos() {
    let out = TempFile::new("llama3");
    synth(
        &out,
        &[
            "--preset",
            "llama3-8b",
            "--quant",
            "q4_0",
            "--layers",
            "1",
            "--vocab",
            "1024",
        ],
    );
    let f = GgufFile::open(&out.0).unwrap();
    assert_eq!(
        dims(&f, "output.weight"),
        (GgmlType::Q4_0, vec![4096, 1024])
    );
    assert_eq!(
        dims(&f, "blk.0.attn_k.weight"),
        (GgmlType::Q4_0, vec![4096, 1024])
    );
    assert_eq!(
        dims(&f, "blk.0.ffn_down.weight"),
        (GgmlType::Q4_0, vec![14336, 4096])
    );
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 500000.0);
    assert_eq!(f.get_usize("llama.context_length").unwrap(), 131072);
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.vocab_size(), 1024);
    assert_eq!(
        tok.token_text(tok.bos().unwrap()),
        Some("<|begin_of_text|>")
    );
    assert!(tok.is_eog(tok.token_id("<|eot_id|>").unwrap()));
    let ids = tok.encode("hello", true).unwrap();
    assert_eq!(ids[0], tok.bos().unwrap());
    assert_eq!(tok.decode(&ids[1..]), "hello");
    drop(f);
    let model = Model::load(&out.0).unwrap();
    assert_eq!(
        (model.cfg.n_head, model.cfg.n_kv_head, model.cfg.n_ff),
        (32, 8, 14336)
    );
    drop(model);
    decode_finite(&out.0, "hello");
}

#[test]
fn run_chat_and_bench_work_on_a_synthetic_file() {
    let out = TempFile::new("cli");
    synth(
        &out,
        &[
            "--preset",
            "smollm2-135m",
            "--layers",
            "2",
            "--vocab",
            "4096",
        ],
    );
    for args in [
        &["run", "-m", out.s(), "hello", "-n", "16", "--temp", "0"][..],
        &[
            "run",
            "-m",
            out.s(),
            "hello",
            "-n",
            "4",
            "--chat",
            "--seed",
            "1",
        ],
        &["bench", "-m", out.s(), "-p", "16", "-n", "4", "-r", "1"],
    ] {
        let o = ferrite(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let (a, b, c) = (
        TempFile::new("s1"),
        TempFile::new("s2"),
        TempFile::new("s3"),
    );
    let args = |seed: &'static str| {
        [
            "--preset",
            "smollm2-135m",
            "--quant",
            "q4_k",
            "--layers",
            "1",
            "--vocab",
            "512",
            "--seed",
            seed,
        ]
    };
    synth(&a, &args("7"));
    synth(&b, &args("7"));
    synth(&c, &args("8"));
    let read = |t: &TempFile| std::fs::read(&t.0).unwrap();
    assert!(read(&a) == read(&b), "same seed, different bytes");
    assert!(read(&a) != read(&c), "different seeds, same bytes");
}

#[test]
fn bad_flags_are_clean_errors() {
    let out = TempFile::new("bad");
    // (args, exit code, text): clap usage errors exit 2, failures 1.
    for (args, code, needle) in [
        (
            &["synth", "--preset", "gpt5", "-o", out.s()][..],
            2,
            "unknown preset \"gpt5\" (supported: smollm2-135m, llama3-8b)",
        ),
        (
            &[
                "synth",
                "--preset",
                "smollm2-135m",
                "--quant",
                "q9_9",
                "-o",
                out.s(),
            ],
            2,
            "unknown quant type \"q9_9\"",
        ),
        (
            &[
                "synth",
                "--preset",
                "smollm2-135m",
                "--quant",
                "q8_k",
                "-o",
                out.s(),
            ],
            2,
            "unknown quant type \"q8_k\"",
        ),
        (&["synth", "--preset", "smollm2-135m"], 2, "--output"),
        (
            &[
                "synth",
                "--preset",
                "smollm2-135m",
                "--layers",
                "0",
                "-o",
                out.s(),
            ],
            1,
            "--layers 0: expected a whole number from 1 to 4096",
        ),
        (
            &[
                "synth",
                "--preset",
                "llama3-8b",
                "--vocab",
                "100",
                "-o",
                out.s(),
            ],
            1,
            "--vocab 100: expected a whole number from 261 to ",
        ),
        (
            &[
                "synth",
                "--preset",
                "smollm2-135m",
                "-o",
                "/nonexistent-dir/x.gguf",
            ],
            1,
            "/nonexistent-dir/x.gguf",
        ),
    ] {
        let o = ferrite(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        if code == 1 {
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        }
    }
    assert!(!out.0.exists());
    // A write that fails half way (a full disk): one error line, and the device stays.
    let full = Path::new("/dev/full");
    if full.exists() {
        let o = ferrite(&["synth", "--preset", "smollm2-135m", "-o", "/dev/full"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("No space left on device"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(full.exists());
    }
}
