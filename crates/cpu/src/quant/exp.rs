//! Exponentials of the CPU model: the gated units' activations (`g = silu(g) * u`,
//! `g = gelu_tanh(g) * u`) and attention's softmax numerators (`v = e^(v - max)`). On
//! AVX-512 sixteen lanes at a time with [`x86::exp16`] (degree-7 polynomial after a
//! reduction by ln 2, scaled by `vscalefps`: within 2e-7 relative of the exact value);
//! elsewhere the scalar forms, which are also the references.

use super::Isa;

/// `g[i] = act(g[i]) * u[i]` over the shorter length: `silu(x) = x / (1 + e^-x)`, or with
/// `gelu` `gelu_tanh(x) = 0.5 x (1 + tanh(y)) = x / (1 + e^(-2y))`,
/// `y = sqrt(2/pi) (x + 0.044715 x^3)`.
pub fn glu_mul(isa: Isa, gelu: bool, g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f; n bounds both slices.
        unsafe {
            match gelu {
                true => x86::glu::<true>(&mut g[..n], &u[..n]),
                false => x86::glu::<false>(&mut g[..n], &u[..n]),
            }
        }
        return;
    }
    let _ = isa;
    glu_mul_scalar(gelu, &mut g[..n], &u[..n]);
}

/// `v[i] = e^(v[i] - max)`; returns their sum.
pub fn exp_sub_sum(isa: Isa, v: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f.
        return unsafe { x86::exp_sub_sum(v, max) };
    }
    let _ = isa;
    exp_sub_sum_scalar(v, max)
}

pub fn glu_mul_scalar(gelu: bool, g: &mut [f32], u: &[f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    g.iter_mut().zip(u).for_each(|(g, u)| {
        let x = *g;
        let act = match gelu {
            true => 0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh()),
            false => x / (1.0 + (-x).exp()),
        };
        *g = act * u
    });
}

pub fn exp_sub_sum_scalar(v: &mut [f32], max: f32) -> f32 {
    let mut sum = 0f32;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// `e^x` per lane: `x = n ln2 + r` (`n` the nearest integer to `x / ln 2`, ln 2 in two
    /// parts), `e^r` by its degree-7 Taylor polynomial (`|r| <= ln2 / 2`: truncation below
    /// 1e-8 relative), times `2^n` by `vscalefps`. `x` is clamped to [-104, 88.7]: below
    /// the result is 0 (or a subnormal), above +inf is not reached (3.3e38 at the clamp).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn exp16(x: __m512) -> __m512 {
        let x = _mm512_max_ps(
            _mm512_min_ps(x, _mm512_set1_ps(88.7)),
            _mm512_set1_ps(-104.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.0 / 5040.0);
        for c in [
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }

    /// The mask of the first `min(left, 16)` lanes.
    #[inline]
    fn lanes(left: usize) -> __mmask16 {
        if left >= 16 {
            0xFFFF
        } else {
            (1u16 << left) - 1
        }
    }

    /// `g = act(g) * u` 16 lanes at a time (`GELU`: gelu_tanh, else silu); the tail through
    /// masked loads and stores.
    ///
    /// # Safety
    /// avx512f must be available; `g` and `u` have the same length.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn glu<const GELU: bool>(g: &mut [f32], u: &[f32]) {
        let n = g.len();
        let one = _mm512_set1_ps(1.0);
        let mut i = 0;
        while i < n {
            let m = lanes(n - i);
            // SAFETY: lanes of m lie inside g and u (same length, checked by the caller).
            unsafe {
                let x = _mm512_maskz_loadu_ps(m, g.as_ptr().add(i));
                let y = _mm512_maskz_loadu_ps(m, u.as_ptr().add(i));
                // silu: x / (1 + e^-x); gelu_tanh: x / (1 + e^(-2 sqrt(2/pi) (x + 0.044715 x^3))).
                let z = if GELU {
                    let x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
                    let inner = _mm512_fmadd_ps(_mm512_set1_ps(0.044715), x3, x);
                    _mm512_mul_ps(inner, _mm512_set1_ps(-2.0 * 0.797_884_6))
                } else {
                    _mm512_sub_ps(_mm512_setzero_ps(), x)
                };
                let act = _mm512_div_ps(x, _mm512_add_ps(one, exp16(z)));
                _mm512_mask_storeu_ps(g.as_mut_ptr().add(i), m, _mm512_mul_ps(act, y));
            }
            i += 16;
        }
    }

    /// `v = e^(v - max)` 16 lanes at a time; the sum of the results (lane sums, then the
    /// lanes in a fixed order).
    ///
    /// # Safety
    /// avx512f must be available.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_sub_sum(v: &mut [f32], max: f32) -> f32 {
        let n = v.len();
        let mx = _mm512_set1_ps(max);
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let m = lanes(n - i);
            // SAFETY: lanes of m lie inside v.
            unsafe {
                let x = _mm512_maskz_loadu_ps(m, v.as_ptr().add(i));
                let e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(x, mx)));
                _mm512_mask_storeu_ps(v.as_mut_ptr().add(i), m, e);
                acc = _mm512_add_ps(acc, e);
            }
            i += 16;
        }
        _mm512_reduce_add_ps(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_util::rand_f32;

    #[test]
    fn exp16_is_within_2e7_of_exact() {
        if !Isa::available().contains(&Isa::Avx512) {
            return;
        }
        let xs: Vec<f32> = (0..=20_000)
            .map(|i| -87.0 + 175.0 * i as f32 / 20_000.0)
            .chain([0.0, -0.0, 1e-8, -1e-8, 88.5, -103.0, -200.0, 100.0])
            .collect();
        for x in xs {
            let mut v = [x];
            let got = exp_sub_sum(Isa::Avx512, &mut v, 0.0);
            assert_eq!(got, v[0]);
            let want = (x.clamp(-104.0, 88.7) as f64).exp();
            let err = (got as f64 - want).abs();
            assert!(
                err <= 2e-7 * want || err < 1e-38,
                "e^{x}: {got} vs {want} (relative {})",
                err / want
            );
        }
    }

    /// Every instruction set against the scalar forms: GLU outputs within 1e-6 relative
    /// (plus 1e-7 absolute), softmax numerators and their sums within 1e-6, at lengths that
    /// leave every tail size.
    #[test]
    fn vector_forms_match_scalar() {
        for isa in Isa::available() {
            for n in [1usize, 15, 16, 17, 576, 1536 + 7] {
                let g0: Vec<f32> = rand_f32(n, n as u64).iter().map(|v| v * 12.0).collect();
                let u: Vec<f32> = rand_f32(n, 99 + n as u64);
                for gelu in [false, true] {
                    let (mut a, mut b) = (g0.clone(), g0.clone());
                    glu_mul(isa, gelu, &mut a, &u);
                    glu_mul_scalar(gelu, &mut b, &u);
                    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                        assert!(
                            (x - y).abs() <= 1e-6 * y.abs() + 1e-7,
                            "{isa:?} gelu={gelu} n={n} i={i}: {x} vs {y}"
                        );
                    }
                }
                let (mut a, mut b) = (g0.clone(), g0.clone());
                let max = g0.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
                let (sa, sb) = (
                    exp_sub_sum(isa, &mut a, max),
                    exp_sub_sum_scalar(&mut b, max),
                );
                assert!(
                    (sa - sb).abs() <= 1e-6 * sb,
                    "{isa:?} n={n}: sum {sa} vs {sb}"
                );
                for (x, y) in a.iter().zip(&b) {
                    assert!(
                        (x - y).abs() <= 1e-6 * y + 1e-30,
                        "{isa:?} n={n}: {x} vs {y}"
                    );
                }
            }
        }
    }
}
