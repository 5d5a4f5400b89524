//! A tiny random llama-family model written with `GgufWriter`: load-time validation errors,
//! and invariants of the forward pass (batched prefill = token-by-token decode; Q8 and Q8x2
//! activations near the exact mode; context and token-id errors).

use ferrite_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};
use ferrite_llm::{Error, Logits, Model, Precision, Session};

const D: u64 = 64;
const FF: u64 = 128;
const HEADS: u32 = 4;
const KV_HEADS: u32 = 2;
const VOCAB: u64 = 96;
const LAYERS: u32 = 2;

fn rand_vals(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect()
}

/// The writer for a valid tiny model; `edit` changes it before it is written.
fn tiny(arch: &str, edit: impl FnOnce(&mut GgufWriter)) -> Result<Model, Error> {
    let mut w = GgufWriter::new();
    let a = arch;
    w.set("general.architecture", Value::String(a.into()))
        .unwrap();
    w.set(&format!("{a}.block_count"), Value::U32(LAYERS))
        .unwrap();
    w.set(&format!("{a}.context_length"), Value::U32(64))
        .unwrap();
    w.set(&format!("{a}.embedding_length"), Value::U32(D as u32))
        .unwrap();
    w.set(&format!("{a}.feed_forward_length"), Value::U32(FF as u32))
        .unwrap();
    w.set(&format!("{a}.attention.head_count"), Value::U32(HEADS))
        .unwrap();
    w.set(
        &format!("{a}.attention.head_count_kv"),
        Value::U32(KV_HEADS),
    )
    .unwrap();
    w.set(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    )
    .unwrap();
    w.set(&format!("{a}.rope.freq_base"), Value::F32(10000.0))
        .unwrap();
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1)).unwrap();
    let tokens: ferrite_gguf::StrArray = (0..VOCAB).map(|i| format!("t{i}")).collect();
    w.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .unwrap();
    let mut seed = 1;
    let mut mat = |w: &mut GgufWriter, name: &str, cols: u64, rows: u64, ty: GgmlType| {
        seed += 1;
        let v = rand_vals((cols * rows) as usize, seed, 0.5);
        w.add_f32_tensor(name, ty, &[cols, rows], &v).unwrap();
    };
    mat(&mut w, "token_embd.weight", D, VOCAB, GgmlType::Q8_0);
    let hd = D / HEADS as u64;
    for il in 0..LAYERS {
        let n = |s: &str| format!("blk.{il}.{s}");
        mat(
            &mut w,
            &n("attn_q.weight"),
            D,
            HEADS as u64 * hd,
            GgmlType::Q4_1,
        );
        mat(
            &mut w,
            &n("attn_k.weight"),
            D,
            KV_HEADS as u64 * hd,
            GgmlType::Q4_0,
        );
        mat(
            &mut w,
            &n("attn_v.weight"),
            D,
            KV_HEADS as u64 * hd,
            GgmlType::Q5_0,
        );
        mat(
            &mut w,
            &n("attn_output.weight"),
            HEADS as u64 * hd,
            D,
            GgmlType::Q8_0,
        );
        mat(&mut w, &n("ffn_gate.weight"), D, FF, GgmlType::Q5_1);
        mat(&mut w, &n("ffn_up.weight"), D, FF, GgmlType::F16);
        mat(&mut w, &n("ffn_down.weight"), FF, D, GgmlType::Q4_1);
        for norm in ["attn_norm.weight", "ffn_norm.weight"] {
            let v: Vec<f32> = rand_vals(D as usize, 7 + il as u64, 0.2)
                .iter()
                .map(|x| 1.0 + x)
                .collect();
            w.add_f32_tensor(&n(norm), GgmlType::F32, &[D], &v).unwrap();
        }
    }
    w.add_f32_tensor(
        "output_norm.weight",
        GgmlType::F32,
        &[D],
        &vec![1.0; D as usize],
    )
    .unwrap();
    if arch == "gemma3" {
        let hd = D / HEADS as u64;
        w.set("gemma3.attention.sliding_window", Value::U32(4))
            .unwrap();
        w.set("gemma3.attention.key_length", Value::U32(hd as u32))
            .unwrap();
        w.set("gemma3.attention.value_length", Value::U32(hd as u32))
            .unwrap();
        for il in 0..LAYERS {
            let n = |s: &str| format!("blk.{il}.{s}");
            for (norm, len) in [
                ("attn_q_norm.weight", hd),
                ("attn_k_norm.weight", hd),
                ("post_attention_norm.weight", D),
                ("post_ffw_norm.weight", D),
            ] {
                let v = vec![1.0; len as usize];
                w.add_f32_tensor(&n(norm), GgmlType::F32, &[len], &v)
                    .unwrap();
            }
        }
    }
    edit(&mut w);
    Model::from_gguf(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap())
}

fn err_text(r: Result<Model, Error>) -> String {
    match r {
        Ok(_) => panic!("expected a load error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn valid_tiny_model_loads_with_tied_output() {
    let m = tiny("llama", |_| {}).unwrap();
    assert_eq!(m.cfg.vocab, VOCAB as usize);
    assert_eq!(m.cfg.head_dim, (D / HEADS as u64) as usize);
}

#[test]
fn unknown_architecture_is_a_load_error() {
    let e = err_text(tiny("mamba", |_| {}));
    assert!(e.contains("unknown architecture \"mamba\""), "{e}");
}

#[test]
fn missing_tensor_is_named() {
    // A third layer is declared but its tensors are absent.
    let e = err_text(tiny("llama", |w| {
        w.set("llama.block_count", Value::U32(3)).unwrap();
    }));
    assert!(e.contains("missing tensor blk.2.attn_norm.weight"), "{e}");
}

#[test]
fn misshapen_tensor_is_named_with_shapes() {
    let e = err_text(tiny("llama", |w| {
        w.add_f32_tensor(
            "output.weight",
            GgmlType::F32,
            &[D, VOCAB - 1],
            &vec![0.0; (D * (VOCAB - 1)) as usize],
        )
        .unwrap();
    }));
    assert!(
        e.contains("tensor output.weight: expected shape [64, 96]"),
        "{e}"
    );
}

#[test]
fn inconsistent_head_counts_are_a_load_error() {
    let e = err_text(tiny("llama", |w| {
        w.set("llama.attention.head_count_kv", Value::U32(3))
            .unwrap();
    }));
    assert!(e.contains("inconsistent head counts"), "{e}");
}

#[test]
fn out_of_range_token_ids_in_metadata_are_a_load_error() {
    let e = err_text(tiny("llama", |w| {
        w.set("tokenizer.ggml.eos_token_id", Value::U32(VOCAB as u32))
            .unwrap();
    }));
    assert!(
        e.contains("tokenizer.ggml.eos_token_id = 96 is out of range"),
        "{e}"
    );
}

#[test]
fn batched_prefill_equals_token_by_token_decode() {
    let m = tiny("llama", |_| {}).unwrap();
    let toks: Vec<u32> = (0..11).map(|i| (i * 37 % VOCAB as u32) + 1).collect();
    for p in [Precision::Exact, Precision::Q8] {
        let mut m = tiny("llama", |_| {}).unwrap();
        m.set_precision(p);
        let mut a = Session::new(&m, 32).unwrap();
        let all = a.forward(&toks, Logits::All).unwrap().to_vec();
        let mut b = Session::new(&m, 32).unwrap();
        for (i, &t) in toks.iter().enumerate() {
            let one = b.forward(&[t], Logits::Last).unwrap();
            let row = &all[i * VOCAB as usize..(i + 1) * VOCAB as usize];
            for (x, y) in one.iter().zip(row) {
                assert!((x - y).abs() < 1e-4, "{p:?} token {i}: {x} vs {y}");
            }
        }
    }
    let _ = m;
}

#[test]
fn quantized_activations_stay_near_exact() {
    let toks: Vec<u32> = (0..7).map(|i| i * 11 + 2).collect();
    let mut m = tiny("llama", |_| {}).unwrap();
    m.set_precision(Precision::Exact);
    let exact = Session::new(&m, 16)
        .unwrap()
        .forward(&toks, Logits::Last)
        .unwrap()
        .to_vec();
    let spread = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
    // 8-bit activations: a few percent of the logit range; Q8x2: ~256x less, plus the f16
    // KV cache of the non-exact modes (each stored key and value rounded by up to 2^-11 of
    // itself; measured 1.5e-3 of the range here, 4e-4 before the KV was f16).
    for (p, tol) in [
        (Precision::Q8, 0.05 * spread),
        (Precision::Q8x2, 2.5e-3 * spread),
    ] {
        m.set_precision(p);
        let got = Session::new(&m, 16)
            .unwrap()
            .forward(&toks, Logits::Last)
            .unwrap()
            .to_vec();
        let max = got
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max < tol, "{p:?}: max |diff| {max}, logit range {spread}");
    }
}

#[test]
fn context_and_token_errors_name_the_numbers() {
    let m = tiny("llama", |_| {}).unwrap();
    let mut s = Session::new(&m, 8).unwrap();
    let e = s.forward(&[1; 9], Logits::Last).unwrap_err().to_string();
    assert!(
        e.contains("need 9 positions") && e.contains("context size is 8"),
        "{e}"
    );
    let e = s
        .forward(&[1, VOCAB as u32], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("token id 96 is out of range for a vocabulary of 96"),
        "{e}"
    );
    assert_eq!(s.pos(), 0, "a rejected batch leaves the cache unchanged");
    let e = Session::new(&m, 65).err().unwrap().to_string();
    assert!(
        e.contains("context size 65") && e.contains("context length 64"),
        "{e}"
    );
}

/// gemma3 with a sliding window of 4 and two layers (both local: every 6th layer is global):
/// position p sees tokens p-6..=p only (3 new positions per layer), so changing token 0 leaves
/// the logits at position 10 unchanged while changing token 8 moves them.
#[test]
fn gemma3_sliding_window_limits_what_a_position_sees() {
    let mut m = tiny("gemma3", |_| {}).unwrap();
    m.set_precision(Precision::Exact);
    assert!(m.cfg.is_local(0) && m.cfg.is_local(1));
    let base: Vec<u32> = (0..11).map(|i| i * 7 % 90 + 3).collect();
    let run = |toks: &[u32]| {
        let mut s = Session::new(&m, 16).unwrap();
        s.forward(toks, Logits::Last).unwrap().to_vec()
    };
    let want = run(&base);
    let mut far = base.clone();
    far[0] = 50;
    far[3] = 51;
    let got = run(&far);
    let d_far = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        d_far < 1e-5,
        "a token outside the receptive field changed the logits by {d_far}"
    );
    let mut near = base.clone();
    near[8] = 50;
    let got = run(&near);
    let d_near = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        d_near > 1e-3,
        "a token inside the window did not matter ({d_near})"
    );
}

#[test]
fn absurd_hyperparameters_are_rejected_before_allocation() {
    let e = err_text(tiny("llama", |w| {
        w.set("llama.block_count", Value::U64(1 << 40)).unwrap();
    }));
    assert!(
        e.contains("block_count = 1099511627776 is out of range"),
        "{e}"
    );
    let e = err_text(tiny("llama", |w| {
        w.set("llama.attention.key_length", Value::U64(1 << 30))
            .unwrap();
    }));
    assert!(e.contains("out of range"), "{e}");
}

/// The same receptive field across KV block boundaries (blocks of 16 positions): position 35
/// sees 29..=35 through two local layers (window 4), keys from blocks 1 and 2; and the
/// whole prompt at once equals one token at a time.
#[test]
fn gemma3_sliding_window_across_block_boundaries() {
    let mut m = tiny("gemma3", |_| {}).unwrap();
    m.set_precision(Precision::Exact);
    let base: Vec<u32> = (0..36).map(|i| i * 5 % 90 + 2).collect();
    let run = |toks: &[u32]| {
        let mut s = Session::new(&m, 48).unwrap();
        s.forward(toks, Logits::Last).unwrap().to_vec()
    };
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let want = run(&base);
    let mut far = base.clone();
    far[28] = 61;
    far[3] = 62;
    assert!(
        max_diff(&run(&far), &want) < 1e-5,
        "a token outside the window mattered"
    );
    let mut near = base.clone();
    near[30] = 61;
    assert!(
        max_diff(&run(&near), &want) > 1e-3,
        "a token inside the window did not matter"
    );
    let mut s = Session::new(&m, 48).unwrap();
    let mut last = Vec::new();
    for &t in &base {
        last = s.forward(&[t], Logits::Last).unwrap().to_vec();
    }
    assert!(
        max_diff(&last, &want) < 1e-4,
        "one at a time differs from all at once"
    );
}

#[test]
fn non_finite_or_out_of_range_metadata_is_refused_naming_the_key() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "llama.rope.freq_base",
            Value::F32(f32::NAN),
            "llama.rope.freq_base = NaN",
        ),
        (
            "llama.rope.freq_base",
            Value::F32(0.0),
            "llama.rope.freq_base = 0",
        ),
        (
            "llama.rope.freq_base",
            Value::F32(f32::INFINITY),
            "llama.rope.freq_base = inf",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(f32::NAN),
            "llama.attention.layer_norm_rms_epsilon = NaN",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(0.0),
            "llama.attention.layer_norm_rms_epsilon = 0",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(-1e-5),
            "llama.attention.layer_norm_rms_epsilon = -0.00001",
        ),
        (
            "llama.attention.head_count",
            Value::U32(0),
            "llama.attention.head_count = 0",
        ),
        (
            "llama.attention.key_length",
            Value::U32(0),
            "llama.attention.key_length = 0",
        ),
        (
            "llama.rope.scaling.factor",
            Value::F32(f32::NAN),
            "llama.rope.scaling.factor = NaN",
        ),
    ];
    for (key, value, want) in cases {
        let e = err_text(tiny("llama", |w| {
            if key == "llama.rope.scaling.factor" {
                w.set("llama.rope.scaling.type", Value::String("linear".into()))
                    .unwrap();
            }
            w.set(key, value.clone()).unwrap();
        }));
        assert!(e.contains(want), "{key}: {e}");
    }
}
