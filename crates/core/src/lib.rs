//! ferrite-core: tensors, dtypes, shapes and strided layouts, devices, the closed set of
//! primitive ops and the backend trait every device implements.
//!
//! Backends live in their own crates (`ferrite-cpu`, ...); a `Device` is a handle to one.

pub mod autocast;
mod backend;
mod channel_norm;
pub mod composed;
mod constant;
mod conv;
mod dtype;
mod error;
pub mod graph;
mod host;
pub mod op;
pub mod optim;
pub mod quant;
pub mod rng;
mod sampling;
mod shape;
mod tensor;

pub use autocast::{autocast, autocast_dtype, autocast_off};
pub use backend::{Backend, Device, DeviceKind, Storage};
pub use conv::{ConvArgs, ConvGeometry, ConvTransposeArgs, Padding, PoolArgs};
pub use dtype::{DType, WithDType};
pub use error::{Error, Result};
pub use graph::no_grad;
pub use half::{bf16, f16};
pub use host::HostBuffer;
pub use op::{BinaryOp, CmpOp, Conv2dParams, Op, Pool2dParams, ReduceOp, UnaryOp};
pub use quant::{ActFormat, HostBytes, QBytes, QStorage, QTensor, QType};
pub use sampling::SamplerSettings;
pub use shape::{Layout, Shape, StridedIndex};
pub use tensor::Tensor;
