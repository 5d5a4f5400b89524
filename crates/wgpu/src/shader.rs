//! WGSL sources and how one becomes a compiled variant.
//!
//! Element representation on the device: every element is one 32-bit word, so a kernel is
//! written once over an element type alias and instantiated per dtype:
//! - f32, f16, bf16 as `f32`; f16 and bf16 results are rounded to their dtype on every store
//!   (`fit_T`), so values match a 16-bit store bit for bit (bf16) or within f16 rounding;
//! - i32 and i64 as `i32` (i64 data must fit i32: checked on upload; arithmetic wraps at 32 bits);
//! - u32, u8, bool as `u32` (u8 wraps at 8 bits, bool is 0 or 1);
//! - f64 is not supported (WGSL has no 64-bit float type that every adapter runs).
//!
//! A variant's source is `common.wgsl`, then per alias `alias T = f32;` and `fn fit_T`, then
//! the kernel file after a small preprocessor: `#if NAME` / `#else` / `#endif` lines keep or
//! drop text by the variant's defines. Each alias `X` defines `X_F`, `X_I` or `X_U` (its word
//! type) and `X_F16`, `X_BF16`, `X_U8`, `X_BOOL`, `X_I64` for those dtypes. Variants defining
//! `SG` use subgroup operations.

use ferrite_core::{DType, Error, Result};

/// One WGSL file, embedded.
pub struct Kernel {
    pub file: &'static str,
    pub src: &'static str,
    /// Entry points.
    pub entries: &'static [&'static str],
    /// The element aliases it is written over, each with the dtypes it is instantiated with.
    pub aliases: &'static [(&'static str, &'static [DType])],
    /// Extra define sets it is compiled with (beside the alias defines); `&[&[]]` for none.
    pub defines: &'static [&'static [&'static str]],
}

macro_rules! kernel {
    ($stem:literal, $entries:expr, $aliases:expr, $defines:expr) => {
        $crate::shader::Kernel {
            file: concat!($stem, ".wgsl"),
            src: include_str!(concat!($stem, ".wgsl")),
            entries: $entries,
            aliases: $aliases,
            defines: $defines,
        }
    };
}
pub(crate) use kernel;

pub(crate) const COMMON: &str = include_str!("common.wgsl");

/// Every dtype a float kernel runs.
pub(crate) const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
/// Every dtype the backend stores.
pub(crate) const ALL: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::U32,
    DType::U8,
    DType::Bool,
];
/// Index dtypes.
pub(crate) const INDEX: &[DType] = &[DType::I32, DType::I64, DType::U32, DType::U8];

/// The word type a dtype is stored as, or an error naming `op` for f64.
pub(crate) fn word(op: &'static str, dt: DType) -> Result<&'static str> {
    match dt {
        DType::F32 | DType::F16 | DType::BF16 => Ok("f32"),
        DType::I32 | DType::I64 => Ok("i32"),
        DType::U32 | DType::U8 | DType::Bool => Ok("u32"),
        DType::F64 => Err(Error::dtype(
            op,
            dt,
            "the wgpu backend has no 64-bit floats (WGSL has none that every adapter runs)",
        )),
    }
}

fn fit_fn(alias: &str, dt: DType) -> String {
    let body = match dt {
        // Round to nearest even at f16's precision with bit operations (pack2x16float needs a
        // capability not every adapter has): overflow to inf, subnormals at 2^-24 steps.
        DType::F16 => {
            "let b = bitcast<u32>(x);\n    \
             let a = b & 0x7fffffffu;\n    \
             if (a > 0x7f800000u) { return x; }\n    \
             if (a >= 0x477ff000u) { return bitcast<f32>((b & 0x80000000u) | 0x7f800000u); }\n    \
             if (a < 0x38800000u) { return round(x * 16777216.0) * (1.0 / 16777216.0); }\n    \
             return bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u);"
        }
        DType::BF16 => {
            "let b = bitcast<u32>(x);\n    \
             if ((b & 0x7fffffffu) > 0x7f800000u) { return x; }\n    \
             return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);"
        }
        DType::U8 => "return x & 255u;",
        DType::Bool => "return select(0u, 1u, x != 0u);",
        _ => "return x;",
    };
    format!("fn fit_{alias}(x: {alias}) -> {alias} {{\n    {body}\n}}\n")
}

/// The defines an alias of dtype `dt` sets.
fn alias_defines(alias: &str, dt: DType, out: &mut Vec<String>) {
    let w = match dt {
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 => "F",
        DType::I32 | DType::I64 => "I",
        _ => "U",
    };
    out.push(format!("{alias}_{w}"));
    let extra = match dt {
        DType::F16 => Some("F16"),
        DType::BF16 => Some("BF16"),
        DType::U8 => Some("U8"),
        DType::Bool => Some("BOOL"),
        DType::I64 => Some("I64"),
        _ => None,
    };
    if let Some(e) = extra {
        out.push(format!("{alias}_{e}"));
    }
}

/// Keeps or drops lines by `#if NAME` (also `#if !NAME`) / `#else` / `#endif`.
pub(crate) fn preprocess(file: &str, src: &str, defines: &[String]) -> Result<String> {
    let mut out = String::with_capacity(src.len());
    // (this branch active, parent active)
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |s: &Vec<(bool, bool)>| s.last().map(|&(a, p)| a && p).unwrap_or(true);
    for (n, line) in src.lines().enumerate() {
        let t = line.trim_start();
        if let Some(name) = t.strip_prefix("#if ") {
            let name = name.trim();
            let (neg, name) = match name.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, name),
            };
            let cond = defines.iter().any(|d| d == name) != neg;
            let parent = active(&stack);
            stack.push((cond, parent));
        } else if t.starts_with("#else") {
            match stack.last_mut() {
                Some(top) => top.0 = !top.0,
                None => {
                    return Err(Error::backend(
                        "wgsl",
                        format!("{file}:{}: #else without #if", n + 1),
                    ))
                }
            }
        } else if t.starts_with("#endif") {
            if stack.pop().is_none() {
                return Err(Error::backend(
                    "wgsl",
                    format!("{file}:{}: #endif without #if", n + 1),
                ));
            }
        } else if active(&stack) {
            out.push_str(line);
            out.push('\n');
        } else {
            // Keep line numbers of errors meaningful.
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(Error::backend("wgsl", format!("{file}: unclosed #if")));
    }
    Ok(out)
}

/// The define of variants that use subgroup operations (compiled only where the adapter has
/// them); their source begins with [`SUBGROUP_MARK`].
pub(crate) const SUBGROUPS: &str = "SG";
/// The first line of a variant that uses subgroup operations.
pub const SUBGROUP_MARK: &str = "// uses subgroup operations\n";

/// One compiled variant of a kernel: its element types and extra defines.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub types: Vec<(&'static str, DType)>,
    pub defines: Vec<&'static str>,
}

impl Variant {
    pub fn new(types: &[(&'static str, DType)], defines: &[&'static str]) -> Variant {
        Variant {
            types: types.to_vec(),
            defines: defines.to_vec(),
        }
    }
}

/// The full WGSL source of `kernel` instantiated as `v`.
pub(crate) fn source(kernel: &Kernel, v: &Variant) -> Result<String> {
    // naga takes subgroup builtins without an `enable` directive (it rejects `enable
    // subgroups;`); the first line marks the variants that need the capability.
    let mut head = if v.defines.contains(&SUBGROUPS) {
        String::from(SUBGROUP_MARK)
    } else {
        String::new()
    };
    head.push_str(COMMON);
    let mut defines: Vec<String> = v.defines.iter().map(|d| d.to_string()).collect();
    for &(alias, dt) in &v.types {
        head.push_str(&format!(
            "alias {alias} = {};\n",
            word(kernel.file_op(), dt)?
        ));
        head.push_str(&fit_fn(alias, dt));
        alias_defines(alias, dt, &mut defines);
    }
    Ok(head + &preprocess(kernel.file, kernel.src, &defines)?)
}

impl Kernel {
    fn file_op(&self) -> &'static str {
        self.file
    }

    /// Every variant this kernel may be compiled as (the naga test validates each).
    pub fn variants(&self) -> Vec<Variant> {
        let mut combos: Vec<Vec<(&'static str, DType)>> = vec![Vec::new()];
        for &(alias, dts) in self.aliases {
            let mut next = Vec::new();
            for c in &combos {
                for &dt in dts {
                    let mut c2 = c.clone();
                    c2.push((alias, dt));
                    next.push(c2);
                }
            }
            combos = next;
        }
        let mut out = Vec::new();
        for c in combos {
            for d in self.defines {
                out.push(Variant::new(&c, d));
            }
        }
        out
    }
}
