//! Any bytes as blocks of every supported type: dequantize either rejects the length or fills
//! exactly the output, without a panic; quantizing the finite result gives whole blocks.
#![no_main]

use ferrite_gguf::{quant, GgmlType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for ty in GgmlType::SUPPORTED {
        let Ok(y) = quant::dequantize_to_vec(ty, data) else {
            assert_ne!(data.len() % ty.type_size(), 0, "{ty}");
            continue;
        };
        assert_eq!(y.len(), data.len() / ty.type_size() * ty.block_size());
        if y.iter().all(|v| v.is_finite() && v.abs() < 1e4) {
            let q = quant::quantize_to_vec(ty, &y).unwrap();
            assert_eq!(q.len(), data.len(), "{ty}");
        }
    }
});
