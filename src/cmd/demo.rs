//! `ferrite demo`: a small tensor computation on the CPU, printed step by step: one attention
//! head over random tokens, fused and composed, to show the library in a few lines.

use ferrite_core::{composed, DType, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// Sequence length.
    #[arg(long, default_value_t = 4, value_parser = super::values::one_to_4096, allow_negative_numbers = true)]
    tokens: u16,
    /// Seed for the random inputs.
    #[arg(long, default_value_t = 0, value_parser = super::values::u64_any, allow_negative_numbers = true)]
    seed: u64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dev = ferrite_cpu::cpu();
    let (l, d) = (args.tokens as usize, 8);
    let x = Tensor::rand_normal([1, 1, l, d], 0.0, 1.0, args.seed, DType::F32, &dev)?;
    let w = Tensor::rand_normal([d, d], 0.0, 0.3, args.seed + 1, DType::F32, &dev)?;
    let q = x.matmul(&w)?;
    println!("q = x @ w:\n{q}");
    let out = Tensor::attention(&q, &x, &x, true, None)?;
    println!("causal attention (fused kernel):\n{out}");
    let slow = composed::attention(&q, &x, &x, true, None)?;
    let diff = out.sub(&slow)?.abs()?.max(&[], false)?.item::<f32>()?;
    println!("max |fused - composed| = {diff:.2e}");
    let probs = q.sum(&[-1], false)?.softmax(-1)?;
    let (top, idx) = probs.topk(1.min(l), -1, true)?;
    println!("softmax over row sums: {probs}\ntop-1: {top} at {idx}");
    Ok(())
}
