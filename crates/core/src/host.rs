//! Host-side element buffers: how data enters and leaves every backend, and the CPU backend's
//! storage.

use crate::DType;
use half::{bf16, f16};

/// A contiguous buffer of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum HostBuffer {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U32(Vec<u32>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

/// Applies `$body` to the inner `Vec` of any `HostBuffer` variant, bound as `$v`.
#[macro_export]
macro_rules! map_host {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::HostBuffer::F32($v) => $body,
            $crate::HostBuffer::F16($v) => $body,
            $crate::HostBuffer::BF16($v) => $body,
            $crate::HostBuffer::F64($v) => $body,
            $crate::HostBuffer::I32($v) => $body,
            $crate::HostBuffer::I64($v) => $body,
            $crate::HostBuffer::U32($v) => $body,
            $crate::HostBuffer::U8($v) => $body,
            $crate::HostBuffer::Bool($v) => $body,
        }
    };
}

impl HostBuffer {
    pub fn dtype(&self) -> DType {
        match self {
            HostBuffer::F32(_) => DType::F32,
            HostBuffer::F16(_) => DType::F16,
            HostBuffer::BF16(_) => DType::BF16,
            HostBuffer::F64(_) => DType::F64,
            HostBuffer::I32(_) => DType::I32,
            HostBuffer::I64(_) => DType::I64,
            HostBuffer::U32(_) => DType::U32,
            HostBuffer::U8(_) => DType::U8,
            HostBuffer::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        map_host!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element as f64 (exact for floats; integers beyond 2^53 round).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        use crate::WithDType;
        map_host!(self, v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// A buffer of `dtype` from f64 values (rounded / truncated toward zero like `as`).
    pub fn from_f64_slice(dtype: DType, data: &[f64]) -> HostBuffer {
        match dtype {
            DType::F32 => HostBuffer::F32(data.iter().map(|&x| x as f32).collect()),
            DType::F16 => HostBuffer::F16(data.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => HostBuffer::BF16(data.iter().map(|&x| bf16::from_f64(x)).collect()),
            DType::F64 => HostBuffer::F64(data.to_vec()),
            DType::I32 => HostBuffer::I32(data.iter().map(|&x| x as i32).collect()),
            DType::I64 => HostBuffer::I64(data.iter().map(|&x| x as i64).collect()),
            DType::U32 => HostBuffer::U32(data.iter().map(|&x| x as u32).collect()),
            DType::U8 => HostBuffer::U8(data.iter().map(|&x| x as u8).collect()),
            DType::Bool => HostBuffer::Bool(data.iter().map(|&x| x != 0.0).collect()),
        }
    }
}

/// Maps the inner `Vec` of any `HostBuffer` variant through `$body` into the same variant.
#[macro_export]
macro_rules! map_host_same {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::HostBuffer::F32($v) => $crate::HostBuffer::F32($body),
            $crate::HostBuffer::F16($v) => $crate::HostBuffer::F16($body),
            $crate::HostBuffer::BF16($v) => $crate::HostBuffer::BF16($body),
            $crate::HostBuffer::F64($v) => $crate::HostBuffer::F64($body),
            $crate::HostBuffer::I32($v) => $crate::HostBuffer::I32($body),
            $crate::HostBuffer::I64($v) => $crate::HostBuffer::I64($body),
            $crate::HostBuffer::U32($v) => $crate::HostBuffer::U32($body),
            $crate::HostBuffer::U8($v) => $crate::HostBuffer::U8($body),
            $crate::HostBuffer::Bool($v) => $crate::HostBuffer::Bool($body),
        }
    };
}

impl HostBuffer {
    /// A buffer of `n` copies of this buffer's first element (empty when this one is).
    pub fn repeat_to(&self, n: usize) -> HostBuffer {
        map_host_same!(self, v => v.first().map(|&x| vec![x; n]).unwrap_or_default())
    }
}
