//! `--device` on `run` and `bench`: malformed values are usage errors; `cuda` where there is no
//! CUDA device is a clear error before any model is loaded (skipped where a device exists).

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
                stderr(&o).contains("expected cpu, cuda or cuda:N"),
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
