//! Casts between every pair of dtypes. Integers (and bool) convert through i64, floats through
//! f64, each with Rust's `as` semantics: float to int truncates toward zero and saturates, NaN
//! becomes 0; int to narrower int wraps; nonzero becomes true.

use crate::elementwise::map;
use crate::storage::contig;
use ferrite_core::{DType, HostBuffer, Result, Tensor, WithDType};
use half::{bf16, f16};

#[derive(Clone, Copy)]
enum Via {
    Int(i64),
    Float(f64),
}

trait Src: WithDType {
    fn via(self) -> Via;
}
macro_rules! src_int { ($($t:ty),*) => { $(impl Src for $t { fn via(self) -> Via { Via::Int(self as i64) } })* } }
src_int!(i32, i64, u32, u8);
impl Src for bool {
    fn via(self) -> Via {
        Via::Int(self as i64)
    }
}
impl Src for f32 {
    fn via(self) -> Via {
        Via::Float(self as f64)
    }
}
impl Src for f64 {
    fn via(self) -> Via {
        Via::Float(self)
    }
}
impl Src for f16 {
    fn via(self) -> Via {
        Via::Float(self.to_f64())
    }
}
impl Src for bf16 {
    fn via(self) -> Via {
        Via::Float(self.to_f64())
    }
}

macro_rules! to_num {
    ($v:expr, $t:ty) => {
        match $v {
            Via::Int(i) => i as $t,
            Via::Float(f) => f as $t,
        }
    };
}

fn convert<S: Src>(x: &[S], to: DType) -> HostBuffer {
    match to {
        DType::F32 => HostBuffer::F32(map(x, |v| to_num!(v.via(), f32))),
        DType::F64 => HostBuffer::F64(map(x, |v| to_num!(v.via(), f64))),
        // Ints go to f16/bf16 through f64, which is exact up to 2^53: one rounding.
        DType::F16 => HostBuffer::F16(map(x, |v| f16::from_f64(to_num!(v.via(), f64)))),
        DType::BF16 => HostBuffer::BF16(map(x, |v| bf16::from_f64(to_num!(v.via(), f64)))),
        DType::I32 => HostBuffer::I32(map(x, |v| to_num!(v.via(), i32))),
        DType::I64 => HostBuffer::I64(map(x, |v| to_num!(v.via(), i64))),
        DType::U32 => HostBuffer::U32(map(x, |v| to_num!(v.via(), u32))),
        DType::U8 => HostBuffer::U8(map(x, |v| to_num!(v.via(), u8))),
        DType::Bool => HostBuffer::Bool(map(x, |v| match v.via() {
            Via::Int(i) => i != 0,
            Via::Float(f) => f != 0.0,
        })),
    }
}

pub(crate) fn cast(x: &Tensor, to: DType) -> Result<HostBuffer> {
    let n = "cast";
    Ok(match x.dtype() {
        DType::F32 => convert(&contig::<f32>(x, n)?, to),
        DType::F64 => convert(&contig::<f64>(x, n)?, to),
        DType::F16 => convert(&contig::<f16>(x, n)?, to),
        DType::BF16 => convert(&contig::<bf16>(x, n)?, to),
        DType::I32 => convert(&contig::<i32>(x, n)?, to),
        DType::I64 => convert(&contig::<i64>(x, n)?, to),
        DType::U32 => convert(&contig::<u32>(x, n)?, to),
        DType::U8 => convert(&contig::<u8>(x, n)?, to),
        DType::Bool => convert(&contig::<bool>(x, n)?, to),
    })
}
