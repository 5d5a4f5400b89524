//! ggml tensor element types: ids as stored in GGUF, block sizes and block byte sizes.

/// Elements per block of every K-quant (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// A ggml tensor type. `block_size` elements are stored in `type_size` bytes; a row (dims[0])
/// must be a whole number of blocks. Ids 4, 5, 31..=33 and 36..=38 were removed from ggml and
/// are rejected as unknown.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// (type, GGUF id, block size, bytes per block, name). Sizes are ggml's `type_traits`.
const TABLE: &[(GgmlType, u32, usize, usize, &str)] = {
    use GgmlType::*;
    &[
        (F32, 0, 1, 4, "F32"),
        (F16, 1, 1, 2, "F16"),
        (Q4_0, 2, 32, 18, "Q4_0"),
        (Q4_1, 3, 32, 20, "Q4_1"),
        (Q5_0, 6, 32, 22, "Q5_0"),
        (Q5_1, 7, 32, 24, "Q5_1"),
        (Q8_0, 8, 32, 34, "Q8_0"),
        // ggml's block_q8_1 is {f16 d, f16 s, i8 qs[32]}: 36 bytes (gguf-py's table says 40,
        // from the older f32 layout).
        (Q8_1, 9, 32, 36, "Q8_1"),
        (Q2_K, 10, QK_K, 84, "Q2_K"),
        (Q3_K, 11, QK_K, 110, "Q3_K"),
        (Q4_K, 12, QK_K, 144, "Q4_K"),
        (Q5_K, 13, QK_K, 176, "Q5_K"),
        (Q6_K, 14, QK_K, 210, "Q6_K"),
        (Q8_K, 15, QK_K, 292, "Q8_K"),
        (IQ2_XXS, 16, QK_K, 66, "IQ2_XXS"),
        (IQ2_XS, 17, QK_K, 74, "IQ2_XS"),
        (IQ3_XXS, 18, QK_K, 98, "IQ3_XXS"),
        (IQ1_S, 19, QK_K, 50, "IQ1_S"),
        (IQ4_NL, 20, 32, 18, "IQ4_NL"),
        (IQ3_S, 21, QK_K, 110, "IQ3_S"),
        (IQ2_S, 22, QK_K, 82, "IQ2_S"),
        (IQ4_XS, 23, QK_K, 136, "IQ4_XS"),
        (I8, 24, 1, 1, "I8"),
        (I16, 25, 1, 2, "I16"),
        (I32, 26, 1, 4, "I32"),
        (I64, 27, 1, 8, "I64"),
        (F64, 28, 1, 8, "F64"),
        (IQ1_M, 29, QK_K, 56, "IQ1_M"),
        (BF16, 30, 1, 2, "BF16"),
        (TQ1_0, 34, QK_K, 54, "TQ1_0"),
        (TQ2_0, 35, QK_K, 66, "TQ2_0"),
        (MXFP4, 39, 32, 17, "MXFP4"),
        (NVFP4, 40, 64, 36, "NVFP4"),
        (Q1_0, 41, 128, 18, "Q1_0"),
    ]
};

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 34] = {
        let mut all = [GgmlType::F32; 34];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].0;
            i += 1;
        }
        all
    };

    /// The types this crate can dequantize and quantize.
    pub const SUPPORTED: [GgmlType; 15] = {
        use GgmlType::*;
        [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
        ]
    };

    fn row(self) -> &'static (GgmlType, u32, usize, usize, &'static str) {
        // TABLE lists every variant exactly once, in declaration order.
        &TABLE[self as usize]
    }

    /// The type stored under GGUF id `id`, or None for ids ggml does not (or no longer) define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The id stored in GGUF files.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.row().2
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().3
    }

    pub fn name(self) -> &'static str {
        self.row().4
    }

    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|r| r.4.eq_ignore_ascii_case(name))
            .map(|r| r.0)
    }

    /// Whether `quant::dequantize` / `quant::quantize` handle this type.
    pub fn is_supported(self) -> bool {
        GgmlType::SUPPORTED.contains(&self)
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes for `n_elements` elements, or None if `n_elements` is not a whole number of blocks
    /// or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_declaration_order_and_ids_round_trip() {
        for (i, r) in TABLE.iter().enumerate() {
            assert_eq!(r.0 as usize, i, "{}", r.4);
            assert_eq!(GgmlType::from_id(r.1), Some(r.0));
            assert_eq!(GgmlType::from_name(r.4), Some(r.0));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, 1000] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
        assert_eq!(GgmlType::ALL.len(), TABLE.len());
    }

    #[test]
    fn sizes_match_ggml() {
        assert_eq!(GgmlType::Q4_K.type_size(), 2 + 2 + 12 + 128);
        assert_eq!(GgmlType::Q6_K.type_size(), 128 + 64 + 16 + 2);
        assert_eq!(GgmlType::Q3_K.type_size(), 32 + 64 + 12 + 2);
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
