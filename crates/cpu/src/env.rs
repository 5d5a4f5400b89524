//! The environment variables the CPU's LLM kernels read, each parsed and checked in one
//! place. A reader returns the error naming the variable for a value it refuses; callers that
//! must not fail (the thread pool, the instruction-set probe) fall back to the default, and
//! programs call [`check`] first so a bad value is reported as a bad flag is.

/// Largest `FERRITE_THREADS`.
pub const MAX_THREADS: usize = 1024;

/// Every variable, what it takes.
pub const VARIABLES: &[(&str, &str)] = &[
    ("FERRITE_THREADS", "worker threads, 1 to 1024"),
    (
        "FERRITE_ISA",
        "scalar, avx2, vnni, avx512 or amx (caps the CPU kernels)",
    ),
];

/// The variable's value; None when unset. Not UTF-8 is an error.
fn raw(name: &str) -> Result<Option<String>, String> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not valid UTF-8")),
    }
}

/// `FERRITE_THREADS`, checked: 1 to [`MAX_THREADS`].
pub fn threads() -> Result<Option<usize>, String> {
    let Some(v) = raw("FERRITE_THREADS")? else {
        return Ok(None);
    };
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "FERRITE_THREADS={v:?}: expected an integer from 1 to {MAX_THREADS}"
        )),
    }
}

/// `FERRITE_ISA`, checked: the instruction-set cap by name.
pub fn isa() -> Result<Option<&'static str>, String> {
    let Some(v) = raw("FERRITE_ISA")? else {
        return Ok(None);
    };
    match v.trim() {
        "scalar" => Ok(Some("scalar")),
        "avx2" => Ok(Some("avx2")),
        "vnni" => Ok(Some("vnni")),
        "avx512" => Ok(Some("avx512")),
        "amx" => Ok(Some("amx")),
        _ => Err(format!(
            "FERRITE_ISA={v:?}: expected scalar, avx2, vnni, avx512 or amx"
        )),
    }
}

/// Checks every variable of [`VARIABLES`]; the first bad one is the error.
pub fn check() -> Result<(), String> {
    threads()?;
    isa()?;
    Ok(())
}
