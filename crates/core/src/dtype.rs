//! Element types.

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I32,
    I64,
    U32,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// The type float kernels accumulate in: f32 for the 16-bit floats, else the type itself.
    pub fn accumulator(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        }
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U32 | DType::U8)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be a tensor element. `to_f64`/`from_f64` are exact for every value of
/// the float types and of integers up to 2^53; casts between tensors do not go through them.
pub trait WithDType: Copy + Default + Send + Sync + std::fmt::Debug + PartialOrd + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn wrap(v: Vec<Self>) -> crate::HostBuffer;
    fn unwrap(b: &crate::HostBuffer) -> Option<&[Self]>;
    /// The vector inside a buffer of this dtype.
    fn take_vec(b: crate::HostBuffer) -> Option<Vec<Self>>;
}

macro_rules! with_dtype {
    ($t:ty, $dt:ident, $to:expr, $from:expr) => {
        impl WithDType for $t {
            const DTYPE: DType = DType::$dt;
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn wrap(v: Vec<Self>) -> crate::HostBuffer {
                crate::HostBuffer::$dt(v)
            }
            fn unwrap(b: &crate::HostBuffer) -> Option<&[Self]> {
                match b {
                    crate::HostBuffer::$dt(v) => Some(v),
                    _ => None,
                }
            }
            fn take_vec(b: crate::HostBuffer) -> Option<Vec<Self>> {
                match b {
                    crate::HostBuffer::$dt(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

with_dtype!(f32, F32, |x: f32| x as f64, |v: f64| v as f32);
with_dtype!(f64, F64, |x: f64| x, |v: f64| v);
with_dtype!(f16, F16, |x: f16| x.to_f64(), f16::from_f64);
with_dtype!(bf16, BF16, |x: bf16| x.to_f64(), bf16::from_f64);
with_dtype!(i32, I32, |x: i32| x as f64, |v: f64| v as i32);
with_dtype!(i64, I64, |x: i64| x as f64, |v: f64| v as i64);
with_dtype!(u32, U32, |x: u32| x as f64, |v: f64| v as u32);
with_dtype!(u8, U8, |x: u8| x as f64, |v: f64| v as u8);
with_dtype!(bool, Bool, |x: bool| if x { 1.0 } else { 0.0 }, |v: f64| v
    != 0.0);
