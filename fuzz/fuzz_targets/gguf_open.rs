//! Any byte string: `GgufFile` either rejects it with an error or opens it, after which every
//! accessor works and tensor data lies inside the file (see `ferrite_gguf::fuzz_open`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferrite_gguf::fuzz_open(data);
});
