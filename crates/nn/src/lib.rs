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
pub use layers::linear::{linear, Linear};
pub use module::{forward_child, in_child, Members, MembersMut, Module, ModuleExt};
pub use parameter::{Buffer, Parameter};
