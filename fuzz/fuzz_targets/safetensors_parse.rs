//! Any byte string: the safetensors reader either rejects it with a one-line error or
//! returns tensors whose byte ranges tile the data section in order, each sized by its shape.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match ferrite_nn::safetensors::parse(data, "fuzz") {
        Err(e) => {
            let msg = e.to_string();
            assert!(
                !msg.contains('\n') && !msg.contains('\r'),
                "multi-line error: {msg:?}"
            );
        }
        Ok(entries) => {
            let header = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
            let data_len = data.len() - 8 - header;
            let mut end = 0;
            for e in &entries {
                assert!(e.start <= e.end && e.end <= data_len, "{e:?}");
                assert_eq!(e.start, end, "{e:?}");
                end = e.end;
            }
            assert_eq!(end, data_len);
        }
    }
});
