//! Development check: greedy decode of a prompt with timing.
//! Usage: cargo run --release -p ferrite-llm --example greedy_dev -- MODEL.gguf "prompt" N
use std::time::Instant;

use ferrite_llm::tokenizer::Tokenizer;
use ferrite_llm::{Logits, Model, Session};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mut model = Model::load(&args[1])?;
    if std::env::var_os("EXACT").is_some() {
        model.set_precision(ferrite_llm::Precision::Exact);
    }
    if std::env::var_os("X2").is_some() {
        model.set_precision(ferrite_llm::Precision::Q8x2);
    }
    let tok = Tokenizer::from_gguf(model.gguf())?;
    let n: usize = args.get(3).map_or(Ok(32), |s| s.parse())?;
    let ids = tok.encode(&args[2], true)?;
    println!("prompt ids {ids:?}");
    let mut s = Session::new(&model, 2048)?;
    let t0 = Instant::now();
    let mut logits = s.forward(&ids, Logits::Last)?.to_vec();
    let tp = t0.elapsed().as_secs_f64();
    let mut out = Vec::new();
    let t1 = Instant::now();
    for _ in 0..n {
        let next = logits
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0 as u32;
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        println!(
            "{next} margin {:.3} top5 {:?}",
            sorted[0] - sorted[1],
            &sorted[..5]
        );
        out.push(next);
        logits = s.forward(&[next], Logits::Last)?.to_vec();
    }
    let td = t1.elapsed().as_secs_f64();
    println!("{:?}\n{:?}", out, tok.decode(&out));
    println!(
        "prefill {} tok {:.1} tok/s; decode {:.1} tok/s",
        ids.len(),
        ids.len() as f64 / tp,
        n as f64 / td
    );
    Ok(())
}
