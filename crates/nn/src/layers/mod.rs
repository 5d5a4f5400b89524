//! Layers, one file per family.

pub mod linear;
