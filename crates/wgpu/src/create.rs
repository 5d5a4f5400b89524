//! fill, arange and random tensors (`create.wgsl`).

use crate::device::WgpuBackend;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::util::{fw, groups, uw};
use ferrite_core::{DType, Error, Result, Shape, Storage};
use std::sync::Arc;

pub(crate) static CREATE: Kernel = kernel!(
    "create",
    &["fill", "arange", "rand"],
    &[("T", shader::ALL)],
    &[&[]]
);

/// `value` as a word of dtype `dt` (the representation of `shader.rs`).
fn value_word(dt: DType, value: f64) -> u32 {
    match dt {
        DType::F32 | DType::F64 => (value as f32).to_bits(),
        DType::F16 => ferrite_core::f16::from_f64(value).to_f32().to_bits(),
        DType::BF16 => ferrite_core::bf16::from_f64(value).to_f32().to_bits(),
        DType::I32 => value as i32 as u32,
        // i64 is stored as i32 (saturating here as a cast would).
        DType::I64 => (value as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32,
        DType::U32 => value as u32,
        DType::U8 => value as u8 as u32,
        DType::Bool => (value != 0.0) as u32,
    }
}

pub(crate) fn fill(
    dev: &WgpuBackend,
    value: f64,
    spec: &(Shape, DType),
) -> Result<Vec<Arc<dyn Storage>>> {
    let (shape, dt) = spec;
    let n = shape.elem_count();
    let out = dev.alloc("full", *dt, n)?;
    let p = [uw("full", n)?, 0, value_word(*dt, value)];
    let v = Variant::new(&[("T", *dt)], &[]);
    dev.launch(
        "full",
        &CREATE,
        "fill",
        &v,
        &p,
        &[&out],
        &[],
        false,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn arange(
    dev: &WgpuBackend,
    start: f64,
    step: f64,
    spec: &(Shape, DType),
) -> Result<Vec<Arc<dyn Storage>>> {
    let (shape, dt) = spec;
    let n = shape.elem_count();
    let out = dev.alloc("arange", *dt, n)?;
    let (a, b) = if dt.is_float() {
        (fw(start), fw(step))
    } else {
        (start as i32 as u32, step as i32 as u32)
    };
    let p = [uw("arange", n)?, 0, a, b];
    let v = Variant::new(&[("T", *dt)], &[]);
    dev.launch(
        "arange",
        &CREATE,
        "arange",
        &v,
        &p,
        &[&out],
        &[],
        false,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}

/// Uniform in [a, b) or, with `normal`, normal(a, b): the same Philox stream as the CPU.
pub(crate) fn rand(
    dev: &WgpuBackend,
    seed: u64,
    a: f64,
    b: f64,
    normal: bool,
    spec: &(Shape, DType),
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = if normal {
        "rand_normal"
    } else {
        "rand_uniform"
    };
    let (shape, dt) = spec;
    if !dt.is_float() {
        return Err(Error::dtype(name, *dt, "needs a float dtype"));
    }
    let n = shape.elem_count();
    let out = dev.alloc(name, *dt, n)?;
    let p = [
        uw(name, n)?,
        normal as u32,
        fw(a),
        fw(b),
        seed as u32,
        (seed >> 32) as u32,
    ];
    let v = Variant::new(&[("T", *dt)], &[]);
    dev.launch(
        name,
        &CREATE,
        "rand",
        &v,
        &p,
        &[&out],
        &[],
        false,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}
