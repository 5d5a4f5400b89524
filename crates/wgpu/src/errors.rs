//! Errors found on the device. A kernel that meets bad data (an index out of range, an integer
//! division by zero) cannot return: it `atomicMax`es a code into the device error word and
//! writes 0 for that element. Every host read fetches the word with its data in the same
//! submission and fails with the error of the op that set it (the first bad op's code, or the
//! largest when several fail), like CUDA's asynchronous errors.

use ferrite_core::Error;

pub(crate) const INDEX_SELECT: u32 = 1;
pub(crate) const DIV_BY_ZERO: u32 = 2;
pub(crate) const GATHER: u32 = 3;
pub(crate) const SCATTER_ADD: u32 = 4;
pub(crate) const CROSS_ENTROPY: u32 = 5;

pub(crate) fn device_error(code: u32) -> Error {
    match code {
        INDEX_SELECT => Error::backend(
            "index_select",
            "an index is out of range (found on the device)",
        ),
        DIV_BY_ZERO => Error::backend("div", "integer division by zero (found on the device)"),
        GATHER => Error::backend("gather", "an index is out of range (found on the device)"),
        SCATTER_ADD => Error::backend(
            "scatter_add",
            "an index is out of range (found on the device)",
        ),
        CROSS_ENTROPY => Error::backend(
            "cross_entropy",
            "a target is outside [0, classes) and is not ignore_index (found on the device)",
        ),
        c => Error::backend("wgpu", format!("unknown device error code {c}")),
    }
}
