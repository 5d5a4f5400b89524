//! What a benchmark ran on: CPU model, the SIMD level matmul dispatches to, threads, load.

/// The instruction-set level the `gemm` crate's f32/f64 kernels dispatch to at run time
/// (it checks the same features: AVX-512F for its x86-v4 kernels, else AVX2 + FMA).
pub fn gemm_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "x86-64-v4 (AVX-512)";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "x86-64-v3 (AVX2+FMA)";
        }
        "x86-64 (SSE2)"
    }
    #[cfg(target_arch = "aarch64")]
    {
        "aarch64 (NEON)"
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// One line: `CPU model; N online CPUs; ISA; rayon threads; load average`.
pub fn machine_summary() -> String {
    let online = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    format!(
        "{}; {online} CPUs available; matmul ISA {}; {} rayon threads; load average {load}",
        cpu_model(),
        gemm_isa(),
        rayon::current_num_threads()
    )
}
