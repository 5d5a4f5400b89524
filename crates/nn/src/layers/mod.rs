//! Layers, one file per family.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod dropout;
pub mod embedding;
pub mod linear;
pub mod norm;
pub mod norm2d;
pub mod pool;
pub mod reshape;
pub mod rnn;
