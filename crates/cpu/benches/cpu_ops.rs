//! CPU benchmarks with their references measured in the same run:
//! - sgemm 1024x1024x1024 f32 vs NumPy's matmul (OpenBLAS), via scripts/numpy_bench.py;
//! - elementwise add over 16M f32 vs a plain memcpy of the same bytes.
//!
//! It prints the machine (CPU model, the ISA matmul dispatches to, threads, load) and its f32
//! FMA peak on one and on all threads, so that sgemm figures read as a fraction of what the
//! machine can do.
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

/// f32 FMA throughput of the machine: `threads` threads each run independent chains of
/// 512-bit (else 256-bit) FMAs, the ceiling any sgemm can reach. GFLOP/s over all threads,
/// best of 5 short runs (a run another process interrupts reads low, never high).
fn fma_peak(threads: usize) -> f64 {
    const ITERS: usize = 2_000_000;
    let run = || -> f64 {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F (checked above).
                return unsafe { fma_chains_avx512(ITERS) };
            }
            if std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU supports AVX2 and FMA (checked above).
                return unsafe { fma_chains_avx2(ITERS) };
            }
        }
        f64::NAN
    };
    (0..5)
        .map(|_| {
            let t0 = Instant::now();
            let flops: f64 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads).map(|_| s.spawn(run)).collect();
                hs.into_iter().map(|h| h.join().unwrap_or(f64::NAN)).sum()
            });
            flops / t0.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// 12 independent accumulators hide the FMA latency (4 cycles x 2 ports + slack).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains_avx512(iters: usize) -> f64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 12];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    std::hint::black_box(acc);
    (iters * 12 * 16 * 2) as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains_avx2(iters: usize) -> f64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    std::hint::black_box(acc);
    (iters * 12 * 8 * 2) as f64
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

    // The same product on one thread: per-core throughput, comparable across machines with
    // different core counts.
    let t_gemm1 = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map(|pool| pool.install(|| median(|| drop(a.matmul(&b).unwrap()), 10)))
        .unwrap_or(f64::NAN);

    let gflops = |t: f64| 2.0 * 1024f64.powi(3) / t / 1e9;
    let gbs = |bytes: f64, t: f64| bytes / t / 1e9;
    let bytes = (n * 4) as f64;
    // Peak FMA throughput with one thread and with every thread: when the second figure is
    // not ~threads x the first, the threads share cores (e.g. SMT siblings behind vCPUs).
    let (peak1, peak_all) = (fma_peak(1), fma_peak(threads));
    println!("machine: {}", ferrite_cpu::machine_summary());
    println!(
        "f32 FMA peak: {peak1:.1} GFLOP/s on 1 thread, {peak_all:.1} GFLOP/s on {threads} threads"
    );
    println!("threads: {threads}");
    println!("| benchmark | ferrite | reference | ratio |");
    println!("|---|---|---|---|");
    match np {
        Some((ver, np_gemm, np_add)) => {
            println!("| sgemm 1024^3 f32 | {:.2} ms ({:.1} GFLOP/s, {:.0}% of FMA peak) | NumPy {ver}: {:.2} ms ({:.1} GFLOP/s) | {:.2} |",
                t_gemm * 1e3, gflops(t_gemm), 100.0 * gflops(t_gemm) / peak_all, np_gemm * 1e3, gflops(np_gemm), np_gemm / t_gemm);
            println!("| add 16M f32 (NumPy, for context) | {:.2} ms | NumPy: {:.2} ms | {:.2} |", t_add * 1e3, np_add * 1e3, np_add / t_add);
        }
        None => println!("| sgemm 1024^3 f32 | {:.2} ms ({:.1} GFLOP/s) | NumPy unavailable (python3 -m pip install numpy) | - |", t_gemm * 1e3, gflops(t_gemm)),
    }
    println!(
        "| sgemm 1024^3 f32, 1 thread | {:.2} ms ({:.1} GFLOP/s, {:.0}% of 1-thread FMA peak) | | |",
        t_gemm1 * 1e3,
        gflops(t_gemm1),
        100.0 * gflops(t_gemm1) / peak1
    );
    // Bandwidth: add reads 2 and writes 1 buffer; memcpy reads 1 and writes 1.
    let (bw_add, bw_copy) = (gbs(3.0 * bytes, t_add), gbs(2.0 * bytes, t_copy));
    println!("| add 16M f32 | {:.2} ms ({bw_add:.1} GB/s) | memcpy 64 MiB: {:.2} ms ({bw_copy:.1} GB/s) | {:.2} |",
        t_add * 1e3, t_copy * 1e3, bw_add / bw_copy);
}
