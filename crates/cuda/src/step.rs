//! What the LLM step kernels (`matvec` here, and the LLM crate's kernel set) share: their
//! launch (programmatic dependent launch on sm_90+ unless `FERRITE_GPU_PDL=0`) and the
//! readers of their tuning variables. A reader falls back to its default on a value it would
//! refuse; `ferrite_llm::env::check` reports such values as errors before a program runs.

use crate::{CudaDevice, KernelArgs, KernelSource, LaunchConfig};
use ferrite_core::Result;

/// An integer variable in `lo..=hi`; None when unset or out of range.
pub fn int(name: &str, lo: usize, hi: usize) -> Option<usize> {
    let v = std::env::var(name).ok()?;
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
}

/// A switch (0/1, false/true, no/yes, off/on, any case): its value, or `default` when unset
/// or not one of those.
pub fn flag_or(name: &str, default: bool) -> bool {
    match std::env::var(name).map(|v| v.trim().to_ascii_lowercase()) {
        Ok(v) if matches!(v.as_str(), "1" | "true" | "yes" | "on") => true,
        Ok(v) if matches!(v.as_str(), "0" | "false" | "no" | "off") => false,
        _ => default,
    }
}

/// Whether step kernels go out with programmatic dependent launch: on sm_90+ unless
/// `FERRITE_GPU_PDL=0`. Every step kernel waits for its predecessors before it touches
/// activations (`pdl_wait` in quant.cuh), so results are the same either way.
pub fn pdl(dev: &CudaDevice) -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| flag_or("FERRITE_GPU_PDL", true)) && dev.compute_capability().0 >= 9
}

/// Launches one step kernel on the compute stream.
pub fn launch(
    dev: &CudaDevice,
    op: &'static str,
    src: &'static KernelSource,
    name: &str,
    cfg: LaunchConfig,
    args: KernelArgs,
) -> Result<()> {
    if pdl(dev) {
        dev.launch_pdl(op, src, name, cfg, args)
    } else {
        dev.launch(op, src, name, cfg, args)
    }
}
