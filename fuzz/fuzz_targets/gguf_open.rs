//! Any byte string: `GgufFile` either rejects it with a one-line error or opens it, after
//! which every accessor works and tensor data lies inside the file (see
//! `ferrite_gguf::fuzz_open`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = ferrite_gguf::fuzz_open(data) {
        let msg = e.to_string();
        assert!(
            !msg.contains('\n') && !msg.contains('\r'),
            "multi-line error: {msg:?}"
        );
    }
});
