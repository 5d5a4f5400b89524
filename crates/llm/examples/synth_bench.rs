//! Development benchmark without a model file: writes a random model with SmolLM2-135M's
//! shapes and types (Q4_1 layers, Q8_0 tied embedding) to a temporary file, then times
//! pp128 and tg64 like `ferrite bench`. For machines where the real model cannot be fetched.
//! Usage: synth_bench [REPS]   (threads: FERRITE_THREADS)
use std::time::Instant;

use ferrite_gguf::{GgmlType, GgufWriter, Value};
use ferrite_llm::{Logits, Model, Session};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = std::env::args().nth(1).map_or(Ok(5), |s| s.parse())?;
    let (d, ff, heads, kv, vocab, layers) = (576u64, 1536u64, 9u32, 3u32, 49152u64, 30u32);
    let mut w = GgufWriter::new();
    let a = "llama";
    w.set("general.architecture", Value::String(a.into()))?;
    w.set("llama.block_count", Value::U32(layers))?;
    w.set("llama.context_length", Value::U32(8192))?;
    w.set("llama.embedding_length", Value::U32(d as u32))?;
    w.set("llama.feed_forward_length", Value::U32(ff as u32))?;
    w.set("llama.attention.head_count", Value::U32(heads))?;
    w.set("llama.attention.head_count_kv", Value::U32(kv))?;
    w.set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))?;
    w.set("llama.rope.freq_base", Value::F32(100000.0))?;
    let mut seed = 0x1234_5678_u64;
    let mut mat = |w: &mut GgufWriter,
                   name: &str,
                   cols: u64,
                   rows: u64,
                   ty: GgmlType|
     -> Result<(), Box<dyn std::error::Error>> {
        let v: Vec<f32> = (0..cols * rows)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
            })
            .collect();
        w.add_f32_tensor(name, ty, &[cols, rows], &v)?;
        Ok(())
    };
    mat(&mut w, "token_embd.weight", d, vocab, GgmlType::Q8_0)?;
    let hd = d / heads as u64;
    for il in 0..layers {
        let n = |s: &str| format!("blk.{il}.{s}");
        mat(
            &mut w,
            &n("attn_q.weight"),
            d,
            heads as u64 * hd,
            GgmlType::Q4_1,
        )?;
        mat(
            &mut w,
            &n("attn_k.weight"),
            d,
            kv as u64 * hd,
            GgmlType::Q4_1,
        )?;
        mat(
            &mut w,
            &n("attn_v.weight"),
            d,
            kv as u64 * hd,
            GgmlType::Q4_1,
        )?;
        mat(&mut w, &n("attn_output.weight"), d, d, GgmlType::Q4_1)?;
        mat(&mut w, &n("ffn_gate.weight"), d, ff, GgmlType::Q4_1)?;
        mat(&mut w, &n("ffn_up.weight"), d, ff, GgmlType::Q4_1)?;
        mat(&mut w, &n("ffn_down.weight"), ff, d, GgmlType::Q4_1)?;
        w.add_f32_tensor(
            &n("attn_norm.weight"),
            GgmlType::F32,
            &[d],
            &vec![1.0; d as usize],
        )?;
        w.add_f32_tensor(
            &n("ffn_norm.weight"),
            GgmlType::F32,
            &[d],
            &vec![1.0; d as usize],
        )?;
    }
    w.add_f32_tensor(
        "output_norm.weight",
        GgmlType::F32,
        &[d],
        &vec![1.0; d as usize],
    )?;
    let path = std::env::temp_dir().join("ferrite_synth_smollm2.gguf");
    w.write(&path)?;
    let model = Model::load(&path)?;
    let mut s = Session::new(&model, 256)?;
    let toks: Vec<u32> = (0..128).map(|i| (i * 7919 + 13) % vocab as u32).collect();
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    for rep in 0..=reps {
        s.truncate(0);
        let t0 = Instant::now();
        s.forward(&toks, Logits::Last)?;
        let a = 128.0 / t0.elapsed().as_secs_f64();
        s.truncate(0);
        let t1 = Instant::now();
        for &t in &toks[..64] {
            s.forward(&[t], Logits::Last)?;
        }
        let b = 64.0 / t1.elapsed().as_secs_f64();
        if rep > 0 {
            pp.push(a);
            tg.push(b);
        }
    }
    let stat = |v: &[f64]| {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let sd =
            (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64).sqrt();
        format!(
            "{m:.1} ± {sd:.1} (max {:.1})",
            v.iter().cloned().fold(0.0, f64::max)
        )
    };
    println!(
        "threads {} isa {:?}: pp128 {} tok/s, tg64 {} tok/s",
        ferrite_cpu::spin_pool::Pool::global().threads(),
        model.isa(),
        stat(&pp),
        stat(&tg)
    );
    let _ = std::fs::remove_file(&path);
    Ok(())
}
