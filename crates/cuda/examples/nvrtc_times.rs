//! Compile time of each fused LLM kernel source (`llm::sources`) with NVRTC (no GPU needed),
//! one after another and all at once on threads, with an empty kernel cache.
//! Usage: LD_LIBRARY_PATH=<dir of libnvrtc.so.13> cargo run --release -p ferrite-cuda
//!        --example nvrtc_times [-- sm_90]
use std::time::Instant;

fn main() {
    let arch = std::env::args().nth(1).unwrap_or_else(|| "sm_90".into());
    let dir = std::env::temp_dir().join(format!("ferrite-nvrtc-times-{}", std::process::id()));
    // An empty cache for each pass, so every source really compiles.
    std::env::set_var("FERRITE_CACHE", dir.join("one"));
    let t = Instant::now();
    for src in ferrite_cuda::llm::sources() {
        let t0 = Instant::now();
        ferrite_cuda::compile(src, &arch).expect("compile");
        println!("{}.cu: {:.2} s", src.name, t0.elapsed().as_secs_f64());
    }
    println!("one after another: {:.2} s", t.elapsed().as_secs_f64());
    std::env::set_var("FERRITE_CACHE", dir.join("all"));
    let t = Instant::now();
    let hs: Vec<_> = ferrite_cuda::llm::sources()
        .into_iter()
        .map(|src| {
            let arch = arch.clone();
            std::thread::spawn(move || ferrite_cuda::compile(src, &arch).map(|_| ()))
        })
        .collect();
    for h in hs {
        h.join().expect("thread").expect("compile");
    }
    println!("all at once on threads: {:.2} s", t.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&dir);
}
