//! CPU benchmarks with their references measured in the same run:
//! - sgemm 1024x1024x1024 f32 vs NumPy's matmul (OpenBLAS), via scripts/numpy_bench.py;
//! - elementwise add over 16M f32 vs a plain memcpy of the same bytes.
//!
//! Run: `cargo bench -p ferrite-cpu --bench cpu_ops` (from the repository root).

use ferrite_core::{DType, Tensor};
use std::time::Instant;

fn median(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    let mut ts: Vec<f64> = (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[ts.len() / 2]
}

fn numpy_reference() -> Option<(String, f64, f64)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/numpy_bench.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    let field = |k: &str| -> Option<String> {
        let i = s.find(&format!("\"{k}\": "))? + k.len() + 4;
        let rest = &s[i..];
        let end = rest.find([',', '}'])?;
        Some(rest[..end].trim().trim_matches('"').to_string())
    };
    Some((
        field("numpy")?,
        field("sgemm_1024")?.parse().ok()?,
        field("add_16m")?.parse().ok()?,
    ))
}

fn main() {
    let dev = ferrite_cpu::cpu();
    let threads = rayon::current_num_threads();

    let a = Tensor::rand_normal([1024, 1024], 0.0, 1.0, 1, DType::F32, &dev).unwrap();
    let b = Tensor::rand_normal([1024, 1024], 0.0, 1.0, 2, DType::F32, &dev).unwrap();
    // Three alternating rounds of ferrite and NumPy, best of each: other load on the machine
    // then hits both sides alike.
    let mut t_gemm = f64::INFINITY;
    let mut np: Option<(String, f64, f64)> = None;
    for _ in 0..3 {
        t_gemm = t_gemm.min(median(|| drop(a.matmul(&b).unwrap()), 20));
        if let Some((v, g, ad)) = numpy_reference() {
            np = Some(match np {
                Some((_, g0, a0)) => (v, g0.min(g), a0.min(ad)),
                None => (v, g, ad),
            });
        }
    }

    let n = 16 << 20;
    let x = Tensor::rand_normal([n], 0.0, 1.0, 3, DType::F32, &dev).unwrap();
    let y = Tensor::rand_normal([n], 0.0, 1.0, 4, DType::F32, &dev).unwrap();
    let t_add = median(|| drop(x.add(&y).unwrap()), 20);
    let src = x.to_vec::<f32>().unwrap();
    let mut dst = vec![0f32; n];
    let t_copy = median(|| dst.copy_from_slice(std::hint::black_box(&src)), 20);

    let gflops = |t: f64| 2.0 * 1024f64.powi(3) / t / 1e9;
    let gbs = |bytes: f64, t: f64| bytes / t / 1e9;
    let bytes = (n * 4) as f64;
    println!("threads: {threads}");
    println!("| benchmark | ferrite | reference | ratio |");
    println!("|---|---|---|---|");
    match np {
        Some((ver, np_gemm, np_add)) => {
            println!("| sgemm 1024^3 f32 | {:.2} ms ({:.1} GFLOP/s) | NumPy {ver}: {:.2} ms ({:.1} GFLOP/s) | {:.2} |",
                t_gemm * 1e3, gflops(t_gemm), np_gemm * 1e3, gflops(np_gemm), np_gemm / t_gemm);
            println!("| add 16M f32 (NumPy, for context) | {:.2} ms | NumPy: {:.2} ms | {:.2} |", t_add * 1e3, np_add * 1e3, np_add / t_add);
        }
        None => println!("| sgemm 1024^3 f32 | {:.2} ms ({:.1} GFLOP/s) | NumPy unavailable (python3 -m pip install numpy) | - |", t_gemm * 1e3, gflops(t_gemm)),
    }
    // Bandwidth: add reads 2 and writes 1 buffer; memcpy reads 1 and writes 1.
    let (bw_add, bw_copy) = (gbs(3.0 * bytes, t_add), gbs(2.0 * bytes, t_copy));
    println!("| add 16M f32 | {:.2} ms ({bw_add:.1} GB/s) | memcpy 64 MiB: {:.2} ms ({bw_copy:.1} GB/s) | {:.2} |",
        t_add * 1e3, t_copy * 1e3, bw_add / bw_copy);
}
