//! ferrite-core
