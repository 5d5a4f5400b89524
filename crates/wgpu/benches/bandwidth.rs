//! Elementwise and reduction bandwidth, wgpu vs CUDA on the same sizes in the same run (the
//! issue's bar: wgpu reaches at least 70% of CUDA's bandwidth). On the GPU machine through
//! Vulkan: `scripts/gpu/run.sh wgpu`; anywhere: `cargo bench -p ferrite-wgpu --bench
//! bandwidth [-- --quick] [--reps=N] [FILTER]` (`--quick`: small sizes, a check that it runs;
//! `--reps`: ops per sample, default 200; FILTER: only the cases whose name contains it).
//!
//! Timing: wall clock around `reps` ops after a warm-up, ending with a device-wide wait, median
//! of 5 samples. Bandwidth counts bytes read + written once each. 200 ops a sample measure
//! the sustained rate: with 50, a 4 MiB op's sample is a burst of ~0.4 ms whose start (the
//! first batch recorded before the device begins) and end (the last batch, which no host
//! work overlaps) weigh on wgpu's figure (docs/benchmarks.md, "Bind groups cached" and
//! after: 50 ops gave 48-79% of CUDA at 4 MiB where 200 give 97-107%).

use ferrite_core::{DType, Device, Result, Tensor};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Per call of `f`, in milliseconds (medians of 5 samples of `reps` calls): the whole time
/// until `sync.wait` returns; the host's time issuing the calls; and the host's time in
/// `sync.flush`, which submits what the calls recorded (nothing for CUDA, whose launches are
/// submitted as they are made).
fn time(reps: usize, sync: &Waits, f: &dyn Fn() -> Result<Tensor>) -> [f64; 3] {
    for _ in 0..3 {
        f().unwrap();
    }
    (sync.wait)().unwrap();
    let mut samples: [Vec<f64>; 3] = Default::default();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            f().unwrap();
        }
        let issued = t.elapsed().as_secs_f64();
        (sync.flush)();
        let flushed = t.elapsed().as_secs_f64();
        (sync.wait)().unwrap();
        let per = 1e3 / reps as f64;
        samples[0].push(t.elapsed().as_secs_f64() * per);
        samples[1].push(issued * per);
        samples[2].push((flushed - issued) * per);
    }
    samples.map(median)
}

/// One timed op, made ready on a device (inputs allocated there).
type Op = Box<dyn Fn() -> Result<Tensor>>;
/// Submits a device's recorded work (`flush`), and waits for all of it (`wait`).
struct Waits {
    flush: Box<dyn Fn()>,
    wait: Box<dyn Fn() -> Result<()>>,
}

struct Case {
    name: String,
    bytes: f64,
    run: Box<dyn Fn(&Device) -> Op>,
}

fn cases(quick: bool) -> Vec<Case> {
    let sizes: Vec<usize> = if quick {
        vec![1 << 12]
    } else {
        vec![1 << 20, 16 << 20, 64 << 20]
    };
    let mut out = Vec::new();
    for &n in &sizes {
        let mib = (n * 4) >> 20;
        out.push(Case {
            name: format!("add f32 [{n}] ({mib} MiB per operand)"),
            bytes: 3.0 * 4.0 * n as f64,
            run: Box::new(move |dev| {
                let a = Tensor::rand_uniform([n], -1.0, 1.0, 1, DType::F32, dev).unwrap();
                let b = Tensor::rand_uniform([n], -1.0, 1.0, 2, DType::F32, dev).unwrap();
                Box::new(move || a.add(&b))
            }),
        });
        out.push(Case {
            name: format!("gelu f32 [{n}]"),
            bytes: 2.0 * 4.0 * n as f64,
            run: Box::new(move |dev| {
                let a = Tensor::rand_uniform([n], -1.0, 1.0, 1, DType::F32, dev).unwrap();
                Box::new(move || a.gelu())
            }),
        });
        let cols = 4096;
        let rows = n / cols;
        out.push(Case {
            name: format!("sum f32 [{rows}, {cols}] over the last axis"),
            bytes: 4.0 * n as f64,
            run: Box::new(move |dev| {
                let a = Tensor::rand_uniform([rows, cols], -1.0, 1.0, 3, DType::F32, dev).unwrap();
                Box::new(move || a.sum(&[-1], true))
            }),
        });
        out.push(Case {
            name: format!("sum f32 [{n}] (all)"),
            bytes: 4.0 * n as f64,
            run: Box::new(move |dev| {
                let a = Tensor::rand_uniform([n], -1.0, 1.0, 4, DType::F32, dev).unwrap();
                Box::new(move || a.sum_all())
            }),
        });
    }
    out
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // cargo bench passes `--bench`; any other argument not starting with `--` filters cases
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let mut devices: Vec<(String, Device, Waits)> = Vec::new();
    match ferrite_wgpu::default_adapter().map(ferrite_wgpu::WgpuDevice::new) {
        Some(Ok(w)) => {
            let label = format!("wgpu ({}, {})", w.name(), w.backend_name());
            let dev = w.device();
            let w2 = w.clone();
            let sync = Waits {
                flush: Box::new(move || w2.flush()),
                wait: Box::new(move || w.synchronize()),
            };
            devices.push((label, dev, sync));
        }
        Some(Err(e)) => println!("wgpu adapter failed to open: {e}"),
        None => println!("bandwidth: no wgpu adapter"),
    }
    if ferrite_cuda::is_available() {
        match ferrite_cuda::CudaDevice::new(0) {
            Ok(c) => {
                let label = format!("cuda ({})", c.name());
                let dev = c.device();
                let sync = Waits {
                    flush: Box::new(|| {}),
                    wait: Box::new(move || c.synchronize()),
                };
                devices.push((label, dev, sync));
            }
            Err(e) => println!("CUDA device 0 failed to open: {e}"),
        }
    }
    if devices.is_empty() {
        println!("bandwidth: skipped: neither a wgpu adapter nor a CUDA device");
        return;
    }
    let reps = match std::env::args().find_map(|a| a.strip_prefix("--reps=").map(str::to_string)) {
        None => {
            if quick {
                3
            } else {
                200
            }
        }
        Some(n) => match n.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("bandwidth: --reps={n}: expected a count of ops of at least 1");
                std::process::exit(2);
            }
        },
    };
    // Per device: GB/s, then the host's microseconds per op issuing and submitting them.
    let head: Vec<String> = devices
        .iter()
        .map(|d| format!("{} GB/s | issue us/op | submit us/op", d.0))
        .collect();
    println!("| op | {} | wgpu / cuda |", head.join(" | "));
    println!("|---|{}---|", "---|---|---|".repeat(devices.len()));
    for case in cases(quick) {
        if filter
            .as_ref()
            .is_some_and(|f| !case.name.contains(f.as_str()))
        {
            continue;
        }
        let mut gbs = Vec::new();
        let mut cells = Vec::new();
        for (_, dev, sync) in &devices {
            let f = (case.run)(dev);
            let [ms, issue, submit] = time(reps, sync, f.as_ref());
            let gb = case.bytes / ms / 1e6;
            gbs.push(gb);
            cells.push(format!(
                "{gb:.0} | {:.1} | {:.1}",
                issue * 1e3,
                submit * 1e3
            ));
        }
        let ratio = if gbs.len() == 2 {
            format!("{:.0}%", 100.0 * gbs[0] / gbs[1])
        } else {
            "-".to_string()
        };
        println!("| {} | {} | {ratio} |", case.name, cells.join(" | "));
    }
}
