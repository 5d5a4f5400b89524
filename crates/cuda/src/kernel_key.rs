//! The text NVRTC compiles for a kernel source and the keys that name its cubins. Shared by
//! the crate (`kernels.rs`) and the build scripts that compile kernels ahead of time
//! (`build/aot.rs`; they include this file with `#[path]`), so the two cannot disagree.

use sha2::{Digest, Sha256};

/// The NVRTC options every source compiles with, in order.
pub const OPTIONS: [&str; 2] = ["--std=c++17", "-default-device"];

/// The architecture kernels compile for on a device of compute capability `major.minor`:
/// `sm_90a` on 9.0 (Hopper's arch-specific instructions, `wgmma`, which attention.cu uses
/// there; such a cubin runs on 9.0 devices only), `sm_<major><minor>` elsewhere.
pub fn arch_name(major: i32, minor: i32) -> String {
    match (major, minor) {
        (9, 0) => "sm_90a".to_string(),
        _ => format!("sm_{major}{minor}"),
    }
}

/// What NVRTC compiles for source `name`: `common.cuh`, a line directive, the source.
pub fn full_source(common: &str, name: &str, src: &str) -> String {
    format!("{common}\n#line 1 \"{name}.cu\"\n{src}")
}

/// sha256 (hex) of `full`, `--gpu-architecture=<arch>`, the options and `extra`: with `extra`
/// empty the key a build-time cubin carries, with the NVRTC version the disk cache's.
pub fn key(full: &str, arch: &str, extra: &str) -> String {
    let mut h = Sha256::new();
    h.update(full.as_bytes());
    h.update(format!("--gpu-architecture={arch}").as_bytes());
    for o in OPTIONS {
        h.update(o.as_bytes());
    }
    h.update(extra.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
