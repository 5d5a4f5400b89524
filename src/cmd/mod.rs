pub mod demo;
pub mod inspect;
