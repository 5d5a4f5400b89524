//! Measurement behind the default precision (docs/benchmarks.md, "Activation precision"):
//! for each chat question, greedy 12 tokens under each plan against the exact (f32) path,
//! and the logit error (max / rms against exact) along exact's answer, teacher-forced.
//!
//! Usage: cargo run --release -p ferrite-llm --example precision_dev -- smollm2|gemma3|FILE
//!        QUESTIONS.txt SPEC...
//! A SPEC is a named precision (q8, q8x2, exact, or any `--precision` name) or a list of
//! `product=format` separated by commas, applied in order: product one of all, qkv, wo, gu,
//! down, out, or `edgeN` (every product of the first and last N layers); format one of q8,
//! q8x2, f32. Example: `all=q8,down=q8x2,out=q8x2`.
use std::time::Instant;

use ferrite_cpu::quant::ActFormat;
use ferrite_llm::chat::{encode_prompt, ChatTemplate, Message};
use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::{Logits, Model, Precision, PrecisionPlan, Session};

const N: usize = 12;

fn fmt(s: &str) -> ActFormat {
    match s {
        "q8" => ActFormat::Q8,
        "q8x2" => ActFormat::Q8x2,
        "f32" => ActFormat::F32,
        _ => panic!("format {s}"),
    }
}

fn plan(spec: &str, m: &Model) -> PrecisionPlan {
    if let Ok(p) = spec.parse::<Precision>() {
        return p.plan(&m.cfg);
    }
    let nl = m.cfg.n_layer;
    let mut p = PrecisionPlan::uniform(nl, ActFormat::Q8);
    for item in spec.split(',') {
        let (k, v) = item.split_once('=').expect("product=format");
        let f = fmt(v);
        match k {
            "all" => p = PrecisionPlan::uniform(nl, f),
            "qkv" => p.layers.iter_mut().for_each(|l| l[0] = f),
            "wo" => p.layers.iter_mut().for_each(|l| l[1] = f),
            "gu" => p.layers.iter_mut().for_each(|l| l[2] = f),
            "down" => p.layers.iter_mut().for_each(|l| l[3] = f),
            "out" => p.output = f,
            e if e.starts_with("edge") => {
                let n: usize = e[4..].parse().expect("edgeN");
                for il in (0..n.min(nl)).chain(nl.saturating_sub(n)..nl) {
                    p.layers[il] = [f; 4];
                }
            }
            e => panic!("product {e}"),
        }
    }
    p
}

/// Greedy answer: up to N tokens, ending after an end-of-generation token.
fn greedy(m: &Model, tok: &Tokenizer, prompt: &[u32]) -> Vec<u32> {
    let mut s = Session::new(m, prompt.len() + N + 1).unwrap();
    let mut g = ferrite_llm::generate::greedy(&mut s, prompt, N).unwrap();
    if let Some(e) = g.iter().position(|&t| tok.is_eog(t)) {
        g.truncate(e + 1);
    }
    g
}

/// Top-1 minus top-2 logit.
fn margin(l: &[f32]) -> f32 {
    let mut v = l.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = match args[1].as_str() {
        "smollm2" => ferrite_gguf::fetch::smollm2_135m_instruct_q4_1().unwrap(),
        "gemma3" => ferrite_gguf::fetch::gemma3_270m_q4_k_m().unwrap(),
        p => p.into(),
    };
    let mut m = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(m.gguf()).unwrap();
    let tmpl = ChatTemplate::from_gguf(m.gguf(), &tok).unwrap();
    let qs: Vec<String> = std::fs::read_to_string(&args[2])
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(String::from)
        .collect();
    let prompts: Vec<Vec<u32>> = qs
        .iter()
        .map(|q| {
            let text = tmpl.render(&[Message::user(q.as_str())], true).unwrap();
            encode_prompt(&tok, &text).unwrap()
        })
        .collect();
    m.set_precision(Precision::Exact);
    let exact: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&m, &tok, p)).collect();
    // Exact logits along prompt + answer (the positions that predict the answer).
    let exact_logits: Vec<Vec<f32>> = prompts
        .iter()
        .zip(&exact)
        .map(|(p, a)| logits_along(&m, p, a))
        .collect();
    for (q, a) in qs.iter().zip(&exact) {
        println!("{q} -> {:?}", tok.decode(a));
    }
    for spec in &args[3..] {
        let pl = plan(spec, &m);
        m.set_plan(pl).unwrap();
        let t0 = Instant::now();
        let (mut same, mut max, mut sq, mut n) = (0, 0f32, 0f64, 0usize);
        let mut diverged = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let g = greedy(&m, &tok, p);
            if g == exact[i] {
                same += 1;
            } else {
                let at = g.iter().zip(&exact[i]).take_while(|(a, b)| a == b).count();
                let v = m.cfg.vocab;
                let mg = margin(&exact_logits[i][at * v..(at + 1) * v]);
                diverged.push(format!("q{i}@{at}(margin {mg:.3})"));
            }
            let l = logits_along(&m, p, &exact[i]);
            for (a, b) in l.iter().zip(&exact_logits[i]) {
                let d = a - b;
                max = max.max(d.abs());
                sq += (d as f64) * (d as f64);
                n += 1;
            }
        }
        println!(
            "{spec}: {same}/{} answers equal exact's first {N} tokens; logits vs exact max {max:.4} rms {:.4}; {:.1}s; diverged {}",
            prompts.len(),
            (sq / n as f64).sqrt(),
            t0.elapsed().as_secs_f64(),
            diverged.join(" ")
        );
    }
}

/// Logits at the positions predicting each answer token (N rows of vocab).
fn logits_along(m: &Model, prompt: &[u32], answer: &[u32]) -> Vec<f32> {
    let mut ids = prompt.to_vec();
    ids.extend_from_slice(&answer[..answer.len() - 1]);
    let mut s = Session::new(m, ids.len()).unwrap();
    let all = s.forward(&ids, Logits::All).unwrap();
    let v = m.cfg.vocab;
    all[(prompt.len() - 1) * v..].to_vec()
}
