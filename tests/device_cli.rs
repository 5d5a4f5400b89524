//! `--device` on `run` and `bench`: malformed values are usage errors; `cuda` where there is no
//! CUDA device is a clear error before any model is loaded (skipped where a device exists);
//! wgpu names resolve against the adapters found, or list them, and `run` and `bench` on one
//! take the LLM engine's wgpu kernel set; `ferrite devices` lists all.

use std::process::{Command, Output};

fn ferrite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .output()
        .expect("run ferrite")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn malformed_device_is_a_usage_error() {
    for cmd in ["run", "bench"] {
        for bad in ["gpu", "cuda:", "cuda:x", "cuda0", "CPU"] {
            let o = ferrite(&[cmd, "--device", bad, "-m", "/nonexistent.gguf"]);
            assert_eq!(
                o.status.code(),
                Some(2),
                "{cmd} --device {bad}: {}",
                stderr(&o)
            );
            assert!(
                stderr(&o)
                    .contains("expected cpu, cuda, cuda:N, wgpu, wgpu:N, vulkan, metal or dx12"),
                "{cmd} --device {bad}: {}",
                stderr(&o)
            );
        }
    }
}

#[test]
fn cuda_without_a_device_is_a_clear_error() {
    if ferrite_llm::gpu::is_available() {
        eprintln!("skipped: a CUDA device is present");
        return;
    }
    for cmd in ["run", "bench"] {
        for dev in ["cuda", "cuda:1"] {
            let o = ferrite(&[cmd, "--device", dev, "-m", "/nonexistent.gguf"]);
            assert!(!o.status.success(), "{cmd} --device {dev}");
            let e = stderr(&o);
            assert!(e.contains("no CUDA device"), "{cmd} --device {dev}: {e}");
            assert!(!e.contains("panicked"), "{e}");
        }
    }
}

#[test]
fn absent_wgpu_adapter_lists_what_was_found() {
    for cmd in ["run", "bench"] {
        let o = ferrite(&[cmd, "--device", "wgpu:99", "-m", "/nonexistent.gguf"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("--device wgpu:99: no wgpu adapter 99; found: "),
            "{e}"
        );
        assert!(
            e.contains("wgpu:0") || e.contains("no wgpu adapter (no Vulkan"),
            "{e}"
        );
    }
    let metal = ferrite_wgpu::adapter_of_backend("metal");
    if metal.is_none() {
        let o = ferrite(&["run", "--device", "metal", "-m", "/nonexistent.gguf"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("--device metal: no metal adapter; found: "),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn wgpu_runs_the_llm_engine_and_serve() {
    if ferrite_wgpu::default_adapter().is_none() {
        eprintln!("skipped: no wgpu adapter");
        return;
    }
    // serve on wgpu listens, then the load fails on the missing file: the server exits
    // non-zero naming it (the served path: crates/serve/tests/wgpu.rs).
    let o = ferrite(&[
        "serve",
        "--device",
        "wgpu",
        "--port",
        "0",
        "-m",
        "/nonexistent.gguf",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("(loading the model on "), "{e}");
    assert!(e.contains("/nonexistent.gguf"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    // run on wgpu (the engine's wgpu kernel set) picks the CPU's exact-mode greedy tokens.
    let path = std::env::temp_dir().join(format!("ferrite-device-cli-{}.gguf", std::process::id()));
    let file = path.to_string_lossy().into_owned();
    let synth = ferrite(&[
        "synth",
        "--preset",
        "smollm2-135m",
        "--quant",
        "q8_0",
        "--layers",
        "2",
        "--vocab",
        "512",
        "-o",
        &file,
    ]);
    assert!(synth.status.success(), "{}", stderr(&synth));
    let tokens = |device: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
            .args([
                "run", "-m", &file, "--device", device, "--temp", "0", "-n", "6",
            ])
            .args(["--json", "once upon a time"])
            .env("FERRITE_PRECISION", "exact")
            .output()
            .expect("run ferrite");
        assert!(o.status.success(), "--device {device}: {}", stderr(&o));
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).expect("run --json prints JSON");
        (v["tokens"].clone(), v["device"].clone())
    };
    let (wgpu, dev) = tokens("wgpu");
    let (cpu, _) = tokens("cpu");
    // bench without --batch runs one sequence as `run` does: a session, decode chained.
    let o = ferrite(&[
        "bench", "-m", &file, "--device", "wgpu", "-p", "4", "-n", "4", "-r", "1", "--json",
    ]);
    assert!(o.status.success(), "bench --device wgpu: {}", stderr(&o));
    let b: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bench --json prints JSON");
    let _ = std::fs::remove_file(&path);
    assert_eq!(b["backend"], "wgpu", "{b}");
    assert_eq!(b["batch"], 1, "{b}");
    assert!(
        b["mode"].as_str().is_some_and(|m| m.starts_with("chained")),
        "{b}"
    );
    assert!(b["pick_read_us"].as_f64().is_some_and(|w| w >= 0.0), "{b}");
    let tests: Vec<_> = b["results"].as_array().expect("results").iter().collect();
    assert_eq!(tests.len(), 2, "{b}");
    for (t, name) in tests.iter().zip(["pp4", "tg4"]) {
        assert_eq!(t["test"], name, "{b}");
        assert!(t["tok_s_mean"].as_f64().is_some_and(|v| v > 0.0), "{b}");
    }
    assert!(
        dev.as_str().is_some_and(|d| d.starts_with("wgpu:")),
        "{dev}"
    );
    assert_eq!(wgpu.as_array().map(|a| a.len()), Some(6), "{wgpu}");
    assert_eq!(wgpu, cpu, "greedy tokens on wgpu and on the CPU (exact)");
}

#[test]
fn devices_lists_cpu_cuda_and_wgpu() {
    let o = ferrite(&["devices"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("cpu\n"), "{out}");
    match ferrite_wgpu::adapters().first() {
        Some(a) => {
            assert!(
                out.contains(&format!("wgpu:0  {} ({}", a.name, a.backend)),
                "{out}"
            );
            assert!(
                out.contains("shader-f16: ") && out.contains("largest storage binding"),
                "{out}"
            );
        }
        None => assert!(out.contains("no wgpu adapter"), "{out}"),
    }
    let o = ferrite(&["devices", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        v["wgpu_adapters"].as_array().map(|a| a.len()),
        Some(ferrite_wgpu::adapters().len())
    );
}
