pub mod bench;
pub mod chat;
pub mod demo;
pub mod inspect;
pub mod llm_args;
pub mod perplexity;
pub mod run;
pub mod synth;
