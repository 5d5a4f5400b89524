//! Training: learning-rate schedulers with PyTorch's semantics (`lr_scheduler`). Optimizers,
//! mixed precision, data loading, metrics and the Trainer (DESIGN.md "Training") build on this
//! crate.

pub mod data;
pub mod error;
pub mod grad_scaler;
pub mod lr_scheduler;
pub mod metrics;
pub mod optim;
pub mod plot;
pub mod trainer;

pub use error::{Error, Result};
pub use grad_scaler::{GradScaler, GradScalerConfig};
pub use lr_scheduler::{LrGroups, LrScheduler, ParamGroups, Plateau, ReduceLROnPlateau, Schedule};
pub use optim::{Clip, Implementation, Optimizer, ParamGroup, Rule};
