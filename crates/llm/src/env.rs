//! The environment variables the LLM engine reads, each parsed and checked in one place.
//! [`check`] validates all of them (the CLI calls it first, so a bad value is an error naming
//! the variable, as a bad flag is); the readers below fall back to the default on a value
//! `check` would refuse, so library users never see a panic from the environment.

use crate::error::{Error, Result};

/// Largest `FERRITE_THREADS` (as `--threads`).
pub use ferrite_cpu::env::MAX_THREADS;

/// Every variable, what it takes, for `check` and the docs.
pub const VARIABLES: &[(&str, &str)] = &[
    ("FERRITE_THREADS", "worker threads, 1 to 1024"),
    ("FERRITE_PRECISION", "q8x2, q8 or exact"),
    (
        "FERRITE_ISA",
        "scalar, avx2, vnni, avx512 or amx (caps the CPU kernels)",
    ),
    (
        "FERRITE_GPU_MV_UPT",
        "units per thread of the GPU products, 1 to 64",
    ),
    (
        "FERRITE_GPU_ATTN_KEYS",
        "keys a split of the CUDA decode attention is a multiple of: 16, 32, 64 ... 1024",
    ),
    (
        "FERRITE_GPU_MMA_BLOCKS",
        "blocks per multiprocessor the int8 tensor-core products' K splits aim at, 1 to 16",
    ),
    (
        "FERRITE_GPU_TC_ROWS",
        "rows from which the CUDA engine's steps take the tensor-core products, 1 to 65536",
    ),
    (
        "FERRITE_GPU_MMQ_TILES",
        "most 8-row input tiles a block of the prefill's int8 tensor-core products takes: 1, 2, 4 or 8",
    ),
    (
        "FERRITE_GPU_MMQ_WX",
        "warps a weight tile of the prefill's int8 tensor-core products with two input tiles a block: 1 or 2",
    ),
    ("FERRITE_GPU_MMA", "0 or 1"),
    ("FERRITE_GPU_EAGER", "0 or 1"),
    ("FERRITE_GPU_PREFILL", "0 or 1"),
    ("FERRITE_GPU_PREFILL_BF16", "0 or 1"),
    ("FERRITE_GPU_PREFILL_MMQ", "0 or 1"),
    ("FERRITE_GPU_PREFILL_GRAPHS", "0 or 1"),
    ("FERRITE_GPU_SPLIT", "0 or 1"),
    ("FERRITE_GPU_PDL", "0 or 1"),
    ("FERRITE_GPU_DEVICE_SAMPLING", "0 or 1"),
    ("FERRITE_GPU_CHAIN", "0 or 1"),
    ("FERRITE_WGPU_CHAIN", "0 or 1"),
    ("FERRITE_WGPU_DEVICE_SAMPLING", "0 or 1"),
];

/// The variable's value; None when unset. Not UTF-8 is an error.
fn raw(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Error::Other(format!("{name} is not valid UTF-8")))
        }
    }
}

fn bad(name: &str, v: &str, want: &str) -> Error {
    Error::Other(format!("{name}={v:?}: expected {want}"))
}

/// An integer variable in `lo..=hi`; None when unset.
pub fn int(name: &str, lo: usize, hi: usize) -> Result<Option<usize>> {
    let Some(v) = raw(name)? else { return Ok(None) };
    match v.trim().parse::<usize>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
        _ => Err(bad(name, &v, &format!("an integer from {lo} to {hi}"))),
    }
}

/// A switch: 0/1, false/true, no/yes, off/on (any case); None when unset.
pub fn flag(name: &str) -> Result<Option<bool>> {
    let Some(v) = raw(name)? else { return Ok(None) };
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(Some(true)),
        "0" | "false" | "no" | "off" => Ok(Some(false)),
        _ => Err(bad(name, &v, "0 or 1")),
    }
}

/// A switch read by the engine: its value, or `default` when unset or invalid.
pub fn flag_or(name: &str, default: bool) -> bool {
    flag(name).ok().flatten().unwrap_or(default)
}

/// `FERRITE_THREADS`, checked.
pub fn threads() -> Result<Option<usize>> {
    ferrite_cpu::env::threads().map_err(Error::Other)
}

/// `FERRITE_ISA`, checked: the instruction-set cap by name.
pub fn isa() -> Result<Option<&'static str>> {
    ferrite_cpu::env::isa().map_err(Error::Other)
}

/// Checks every variable of [`VARIABLES`]; the first bad one is the error.
pub fn check() -> Result<()> {
    threads()?;
    crate::Model::default_precision()?;
    isa()?;
    int("FERRITE_GPU_MV_UPT", 1, 64)?;
    int("FERRITE_GPU_MMA_BLOCKS", 1, 16)?;
    if let Some(n) = int("FERRITE_GPU_ATTN_KEYS", 16, 1024)? {
        if !n.is_power_of_two() {
            return Err(bad(
                "FERRITE_GPU_ATTN_KEYS",
                &n.to_string(),
                "a power of two from 16 to 1024",
            ));
        }
    }
    int("FERRITE_GPU_TC_ROWS", 1, 65536)?;
    int("FERRITE_GPU_MMQ_WX", 1, 2)?;
    if let Some(n) = int("FERRITE_GPU_MMQ_TILES", 1, 8)? {
        if !n.is_power_of_two() {
            return Err(bad("FERRITE_GPU_MMQ_TILES", &n.to_string(), "1, 2, 4 or 8"));
        }
    }
    for (name, _) in VARIABLES.iter().filter(|(_, w)| *w == "0 or 1") {
        flag(name)?;
    }
    Ok(())
}
