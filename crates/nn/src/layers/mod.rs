//! Layers, one file per family.

pub mod conv;
pub mod linear;
pub mod norm2d;
pub mod pool;
