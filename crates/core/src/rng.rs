//! Counter-based random numbers (Philox4x32-10, Salmon et al. 2011): element `i` of a random
//! tensor depends only on (seed, i), so every backend, and every thread, produces the same
//! numbers for the same seed.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds: counter (4 words) and key (2 words) to 4 random words.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        c = [
            ((p1 >> 32) as u32) ^ c[1] ^ k[0],
            p1 as u32,
            ((p0 >> 32) as u32) ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The four words for element `index` of a tensor drawn with `seed`.
pub fn words(seed: u64, index: u64) -> [u32; 4] {
    philox4x32(
        [index as u32, (index >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// A word to a float in [0, 1) with 24 bits of randomness (exact in f32).
pub fn unit_f32(w: u32) -> f32 {
    (w >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Element `index` of `rand_uniform(seed, low, high)`, computed in f32 (all backends agree).
pub fn uniform(seed: u64, index: u64, low: f32, high: f32) -> f32 {
    let u = unit_f32(words(seed, index)[0]);
    low + (high - low) * u
}

/// Element `index` of `rand_normal(seed, mean, std)` by Box–Muller, computed in f32.
pub fn normal(seed: u64, index: u64, mean: f32, std: f32) -> f32 {
    let w = words(seed, index);
    // u1 in (0, 1] so that ln(u1) is finite.
    let u1 = 1.0 - unit_f32(w[0]);
    let u2 = unit_f32(w[1]);
    let r = (-2.0 * u1.ln()).sqrt();
    mean + std * r * (2.0 * std::f32::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answer() {
        // Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
        assert_eq!(
            philox4x32([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn uniform_and_normal_moments() {
        let n = 200_000u64;
        let (mut s, mut s2) = (0.0f64, 0.0f64);
        for i in 0..n {
            let x = uniform(7, i, -1.0, 3.0) as f64;
            assert!((-1.0..3.0).contains(&x));
            s += x;
            s2 += x * x;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        assert!((var - 16.0 / 12.0).abs() < 0.02, "var {var}");
        let (mut s, mut s2) = (0.0f64, 0.0f64);
        for i in 0..n {
            let x = normal(7, i, 2.0, 0.5) as f64;
            s += x;
            s2 += x * x;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!((mean - 2.0).abs() < 0.005, "mean {mean}");
        assert!((var - 0.25).abs() < 0.005, "var {var}");
    }
}
