//! Layers, one file per family.

pub mod conv;
pub mod linear;
pub mod norm2d;
pub mod pool;
pub mod activation;
pub mod attention;
pub mod dropout;
pub mod embedding;
pub mod norm;
pub mod reshape;
pub mod rnn;
