//! Dequantization and quantization compared bit for bit with PyPI `gguf`
//! (fixtures from scripts/gguf_fixtures.py), and quantize -> dequantize error bounds.

use std::path::PathBuf;

use ferrite_gguf::quant::{self, max_error_bound};
use ferrite_gguf::{GgmlType, GgufFile};

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/gguf_fixtures.py)", p.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

const DEQUANT_TYPES: [GgmlType; 12] = {
    use GgmlType::*;
    [
        F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ]
};

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    for ty in DEQUANT_TYPES {
        let blocks = fixture(&format!("quant/{ty}.blocks"));
        let want = f32s(&fixture(&format!("quant/{ty}.deq.f32")));
        assert!(want.len() >= 1024, "{ty}: fixture too small");
        let got = quant::dequantize_to_vec(ty, &blocks).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty} element {i}: got {g}, gguf-py {w}"
            );
        }
        assert!(want.iter().any(|&v| v != 0.0), "{ty}: fixture is all zeros");
    }
}

#[test]
fn quantize_matches_gguf_py_bit_for_bit() {
    use GgmlType::*;
    for ty in [F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0] {
        let src = f32s(&fixture(&format!("quant/{ty}.src.f32")));
        let want = fixture(&format!("quant/{ty}.quant"));
        let got = quant::quantize_to_vec(ty, &src).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            let blk = i / ty.type_size();
            panic!(
                "{ty}: byte {i} (block {blk}) differs: got {:#04x}, gguf-py {:#04x}",
                got[i], want[i]
            );
        }
    }
}

/// A deterministic xorshift generator for test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform().max(1e-7), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

/// Blocks of different shapes: normal, scaled, all-positive, all-negative, one outlier,
/// constant, zero, a ramp.
fn test_blocks(bs: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut out = Vec::new();
    for scale in [1e-4f32, 0.02, 1.0, 300.0] {
        for _ in 0..20 {
            out.push((0..bs).map(|_| rng.normal() * scale).collect());
        }
        out.push((0..bs).map(|_| rng.uniform() * scale + scale).collect());
        out.push(
            (0..bs)
                .map(|_| -rng.uniform() * scale - 0.5 * scale)
                .collect(),
        );
        let mut o: Vec<f32> = (0..bs).map(|_| rng.normal() * scale * 0.01).collect();
        o[bs / 3] = 5.0 * scale;
        out.push(o);
        out.push(vec![0.7 * scale; bs]);
        out.push(
            (0..bs)
                .map(|i| (i as f32 / bs as f32 - 0.5) * scale)
                .collect(),
        );
    }
    out.push(vec![0.0; bs]);
    out
}

#[test]
fn quantize_dequantize_error_within_bound() {
    for ty in GgmlType::SUPPORTED {
        let bs = ty.block_size().max(32);
        let mut worst = 0f32;
        let mut sq = 0f64;
        let mut n = 0usize;
        for x in test_blocks(bs) {
            let q = quant::quantize_to_vec(ty, &x).unwrap();
            assert_eq!(q.len(), bs / ty.block_size() * ty.type_size());
            let y = quant::dequantize_to_vec(ty, &q).unwrap();
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let bound = max_error_bound(ty, &x);
            for (i, (a, b)) in x.iter().zip(&y).enumerate() {
                let err = (a - b).abs();
                assert!(
                    err <= bound,
                    "{ty}: element {i}: {a} -> {b}, error {err} > bound {bound}"
                );
                if amax > 0.0 {
                    worst = worst.max(err / amax);
                    sq += f64::from(err / amax).powi(2);
                    n += 1;
                }
            }
        }
        let rms = (sq / n as f64).sqrt();
        eprintln!("{ty}: max error {worst:.3e} x amax, rms {rms:.3e} x amax");
    }
}

#[test]
fn q8k_bsums_are_group_sums() {
    let x: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    let q = quant::quantize_to_vec(GgmlType::Q8_K, &x).unwrap();
    let b = quant::BlockQ8K::read(&q);
    for g in 0..16 {
        let s: i16 = b.qs[16 * g..16 * g + 16]
            .iter()
            .map(|&v| i16::from(v))
            .sum();
        assert_eq!(b.bsums[g], s);
    }
    // The largest magnitude (50/7 at i = 0 -> -50/7) maps to -127 exactly.
    assert_eq!(b.qs.iter().map(|&v| i32::from(v).abs()).max(), Some(127));
}

#[test]
fn q8_1_sum_field_is_d_times_sum() {
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 10.0).collect();
    let q = quant::quantize_to_vec(GgmlType::Q8_1, &x).unwrap();
    let b = quant::BlockQ8_1::read(&q);
    let sum: i32 = b.qs.iter().map(|&v| i32::from(v)).sum();
    assert_eq!(b.s, half::f16::from_f32(sum as f32 * (21.0 / 127.0)));
    assert_eq!(b.d, half::f16::from_f32(21.0 / 127.0));
    // q = round(x * 127 / 21): x = 21 -> 127, x = -10 -> -60.
    assert_eq!(b.qs[31], 127);
    assert_eq!(b.qs[0], -60);
}

#[test]
fn dequantize_errors_name_type_and_sizes() {
    let e = quant::dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut [0.0; 256]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "gguf: dequantize: unsupported tensor type IQ2_XXS"
    );
    let e = quant::dequantize(GgmlType::Q4_0, &[0; 17], &mut [0.0; 32]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "gguf: dequantize: 32 values of Q4_0 need 18 bytes, got 17 bytes"
    );
    let e = quant::dequantize(GgmlType::Q4_K, &[0; 144], &mut [0.0; 255]).unwrap_err();
    assert!(
        e.to_string()
            .contains("not a multiple of the Q4_K block size 256"),
        "{e}"
    );
    let e = quant::quantize_to_vec(GgmlType::Q4_0, &[f32::NAN; 32]).unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");
    let e = quant::quantize_to_vec(GgmlType::Q8_0, &[1e9; 32]).unwrap_err();
    assert!(
        e.to_string().contains("too large for its f16 scales"),
        "{e}"
    );
}

#[test]
fn reads_file_written_by_gguf_py() {
    let f = GgufFile::from_bytes(fixture("pywriter.gguf")).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("t.u8").unwrap(), 200);
    assert_eq!(f.get_i32("t.i8").unwrap(), -100);
    assert_eq!(f.get_u32("t.u16").unwrap(), 60000);
    assert_eq!(f.get_i32("t.i16").unwrap(), -30000);
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i32("t.i32").unwrap(), -2_000_000_000);
    assert_eq!(f.get_f32("t.f32").unwrap(), 0.15625);
    assert_eq!(f.get_u64("t.u64").unwrap(), 18_000_000_000_000_000_000);
    assert_eq!(f.get_i64("t.i64").unwrap(), -9_000_000_000_000_000_000);
    assert_eq!(f.get_f64("t.f64").unwrap(), -2.5e-300);
    assert!(f.get_bool("t.bool").unwrap());
    assert_eq!(f.get_str("t.str").unwrap(), "héllo ✓");
    assert_eq!(f.get_i32_array("t.arr_i32").unwrap(), &[1, -2, 3]);
    assert_eq!(f.get_str_array("t.arr_str").unwrap(), vec!["a", "", "ü"]);
    assert_eq!(f.get_f32_array("t.arr_f32").unwrap(), &[0.5, -1.25]);
    let nested = f.get_array("t.nested").unwrap();
    assert_eq!(nested.len(), 2);
    assert_eq!(
        f.get_u32("t.str").unwrap_err().to_string(),
        "gguf: metadata key 't.str': expected an integer fitting u32, found string"
    );
    assert_eq!(
        f.get_u32("t.i8").unwrap_err().to_string(),
        "gguf: metadata key 't.i8': expected an integer fitting u32, found i8 -100 (out of range)"
    );
    let x: Vec<f32> = (0..192).map(|i| (i as f32 - 96.0) / 16.0).collect();
    assert_eq!(f.tensor_f32("f32").unwrap(), x);
    assert_eq!(f.tensor_f32("f16").unwrap(), x); // all exactly representable in f16
    let t = f.tensor("q8_0").unwrap();
    assert_eq!(
        (t.ty, t.dims.as_slice(), t.n_bytes),
        (GgmlType::Q8_0, &[64u64, 3][..], 6 * 34)
    );
    let y = f.dequantize(t).unwrap();
    assert_eq!(
        y,
        quant::dequantize_to_vec(
            GgmlType::Q8_0,
            &quant::quantize_to_vec(GgmlType::Q8_0, &x).unwrap()
        )
        .unwrap()
    );
    assert_eq!(t.offset % 32, 0);
}

/// Q8_1 and Q8_K, which PyPI `gguf` cannot dequantize, against their definitions on
/// hand-built blocks: y = d * q.
#[test]
fn q8_1_and_q8_k_dequantize_by_definition() {
    let mut b = half::f16::from_f32(0.5).to_le_bytes().to_vec(); // d
    b.extend_from_slice(&half::f16::from_f32(123.0).to_le_bytes()); // s (not used by y)
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let y = quant::dequantize_to_vec(GgmlType::Q8_1, &b).unwrap();
    assert_eq!(
        y,
        (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect::<Vec<_>>()
    );

    let mut b = 0.25f32.to_le_bytes().to_vec();
    b.extend((0..256i32).map(|i| (i - 128) as i8 as u8));
    b.extend(std::iter::repeat_n(0u8, 32)); // bsums
    let y = quant::dequantize_to_vec(GgmlType::Q8_K, &b).unwrap();
    assert_eq!(
        y,
        (0..256)
            .map(|i| (i as f32 - 128.0) * 0.25)
            .collect::<Vec<_>>()
    );
}
