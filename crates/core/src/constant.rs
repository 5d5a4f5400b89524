//! Shared read-only constants: one contiguous tensor per (device, dtype, value bits, dims),
//! made by the `Fill` op at its first use and handed out again after, so the scalars and
//! paddings that ops and backward rules read (a mean's divisor, a mask's zero, the backward
//! seed, a narrow's zero padding, unit class weights) cost no kernel per use, and no node in
//! a CUDA graph captured after their first use (PyTorch passes such numbers as kernel
//! arguments; here they stay tensors, so every backend reads them as it reads any input).
//!
//! Contract: a constant is never written. `Tensor::copy_` and the optimizer's in-place
//! updates (`optim::fused_update`, `optim::step_scalars`) refuse one, naming it.
//!
//! Bounds: entries live for the process (a captured graph may hold their addresses, so none
//! is ever freed), at most [`MAX_ENTRIES`] of them, [`MAX_ONE`] bytes each and [`MAX_BYTES`]
//! in all. Past these, or for a first use while the device captures a graph (the fill then
//! belongs to the graph, its buffer written only when the graph replays), `constant` makes an
//! ordinary, unshared fill.

use crate::{DType, Device, DeviceKind, Error, Result, Shape, Storage, Tensor};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

/// Most constants kept.
pub const MAX_ENTRIES: usize = 4096;
/// Most bytes of constants kept (per process, all devices).
pub const MAX_BYTES: usize = 16 << 20;
/// Most bytes of one kept constant: larger fills cost their bandwidth more than their launch.
pub const MAX_ONE: usize = 64 << 10;

/// (device, dtype, value bits, dims). A device kind names one backend for the process (the
/// CUDA and wgpu crates keep one per ordinal), so a kept constant is that backend's buffer.
type Key = (DeviceKind, DType, u64, Vec<usize>);

#[derive(Default)]
struct Cache {
    map: HashMap<Key, Tensor>,
    /// The kept tensors' storages (by address): what `is_constant` recognizes.
    storages: HashSet<usize>,
    bytes: usize,
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn addr(s: &Arc<dyn Storage>) -> usize {
    Arc::as_ptr(s) as *const () as usize
}

/// Every element `value`, `dims`, `dtype`, on `device`: the shared constant (see the module
/// docs), or a fresh fill where none may be kept.
pub(crate) fn constant(value: f64, shape: Shape, dtype: DType, device: &Device) -> Result<Tensor> {
    let key: Key = (device.kind(), dtype, value.to_bits(), shape.dims().to_vec());
    if let Some(t) = cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map
        .get(&key)
    {
        return Ok(t.clone());
    }
    // Made outside the lock: the fill runs the backend.
    let t = Tensor::full(value, shape, dtype, device)?;
    if device.backend().capturing() {
        return Ok(t);
    }
    let bytes = t.elem_count() * dtype.size_in_bytes();
    let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(kept) = c.map.get(&key) {
        return Ok(kept.clone());
    }
    if bytes <= MAX_ONE && c.map.len() < MAX_ENTRIES && c.bytes + bytes <= MAX_BYTES {
        c.bytes += bytes;
        c.storages.insert(addr(t.storage_arc()));
        c.map.insert(key, t.clone());
    }
    Ok(t)
}

/// Whether `t` views a shared constant's storage.
pub(crate) fn is_constant(t: &Tensor) -> bool {
    let c = cache().lock().unwrap_or_else(|p| p.into_inner());
    c.storages.contains(&addr(t.storage_arc()))
}

/// The error of `op` writing in place into `t` (`what`) where `t` is a shared constant.
pub(crate) fn refuse_write(op: &'static str, what: &str, t: &Tensor) -> Result<()> {
    if is_constant(t) {
        return Err(Error::shape(
            op,
            format!(
                "{what} is a shared constant (Tensor::constant, scalar_like), which is never \
                 written: make a tensor of its own with Tensor::full"
            ),
        ));
    }
    Ok(())
}
