//! GPU decode tests. A plain binary (harness = false): where there is no CUDA device (or no
//! NVRTC, or no model file) each test is reported skipped by name; on a machine with an
//! NVIDIA GPU each runs and the binary exits non-zero on any failure.
//!
//! Usage: `cargo test -p ferrite-llm --test gpu [-- FILTER]`.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use ferrite_llm::gpu::CudaDevice;

type TestFn = fn(&CudaDevice);

/// Tests that need only NVRTC (no GPU).
fn nvrtc_tests() -> Vec<(&'static str, fn())> {
    vec![(
        "every_gpu_llm_kernel_compiles_for_sm_90",
        every_kernel_compiles,
    )]
}

fn gpu_tests() -> Vec<(&'static str, TestFn)> {
    vec![]
}

fn main() {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |n: &str| filter.as_ref().is_none_or(|f| n.contains(f.as_str()));
    let (mut passed, mut failed, mut skipped) = (0, Vec::new(), 0);
    let mut run = |name: &str, f: &mut dyn FnMut()| {
        let t = Instant::now();
        match std::panic::catch_unwind(AssertUnwindSafe(f)) {
            Ok(()) => {
                println!("test {name} ... ok ({:.2} s)", t.elapsed().as_secs_f64());
                passed += 1;
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!("test {name} ... FAILED\n{msg}");
                failed.push(name.to_string());
            }
        }
    };
    let nvrtc = ferrite_cuda::nvrtc_present();
    for (name, f) in nvrtc_tests() {
        if !wanted(name) {
            continue;
        }
        if nvrtc {
            run(name, &mut || f());
        } else {
            println!("test {name} ... skipped: NVRTC (libnvrtc.so.13) is not installed");
            skipped += 1;
        }
    }
    let dev = if ferrite_llm::gpu::is_available() {
        match CudaDevice::new(0) {
            Ok(d) => Some(d),
            Err(e) => {
                println!("CUDA device 0 failed to start: {e}");
                None
            }
        }
    } else {
        None
    };
    for (name, f) in gpu_tests() {
        if !wanted(name) {
            continue;
        }
        match &dev {
            Some(d) => run(name, &mut || f(d)),
            None => {
                println!("test {name} ... skipped: no CUDA device");
                skipped += 1;
            }
        }
    }
    println!(
        "\nllm gpu tests: {passed} passed, {} failed, {skipped} skipped",
        failed.len()
    );
    if !failed.is_empty() {
        println!("failed: {}", failed.join(", "));
        std::process::exit(1);
    }
}

fn every_kernel_compiles() {
    for src in ferrite_llm::gpu::sources() {
        if let Err(e) = ferrite_cuda::compile(src, "sm_90") {
            panic!("{e}");
        }
    }
}
