//! ferrite-nn: neural-network modules over ferrite tensors, named and laid out as in PyTorch's
//! `torch.nn` so that state dicts move between the two unchanged.
//!
//! - `Module` (forward, members) and `ModuleExt` (dotted-path walks, train/eval, device and
//!   dtype moves) in `module.rs`;
//! - `Parameter` and `Buffer`: tensors that own one buffer for life, written in place
//!   (`parameter.rs`);
//! - containers: `Sequential`, `ModuleList`, `ModuleDict` (`container.rs`);
//! - layers (`layers/`), initialization (`init.rs`).

mod container;
pub mod init;
pub mod layers;
mod module;
mod parameter;

pub use container::{ModuleDict, ModuleList, Sequential};
pub use layers::conv::{Conv1d, Conv2d, ConvTranspose2d};
pub use layers::linear::{linear, Linear};
pub use layers::norm2d::{
    BatchNorm, BatchNorm1d, BatchNorm2d, Dropout2d, GroupNorm, InstanceNorm2d,
};
pub use layers::pool::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d,
};
pub use module::{forward_child, in_child, Members, MembersMut, Module, ModuleExt};
pub use parameter::{Buffer, Parameter};
