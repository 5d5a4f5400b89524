//! Rotary position embedding of the LLM kernels on the CPU: the angles of each row's position,
//! then the rotation of each head's first `rope_dim` values (pairs `(i, i + rope_dim/2)` in
//! the NeoX order, `(2i, 2i + 1)` otherwise).

/// cos/sin tables `[row][rope_dim/2]` for the rows' positions (each times `pos_scale`).
pub fn rope_table(
    inv: &[f32],
    positions: impl Iterator<Item = usize>,
    pos_scale: f32,
    cos: &mut Vec<f32>,
    sin: &mut Vec<f32>,
) {
    cos.clear();
    sin.clear();
    for p in positions {
        let p = p as f32 * pos_scale;
        for &f in inv {
            let a = p * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
}

/// Rotates the first `rope_dim` values of each of the `n_heads` heads of every row of `x`
/// (`[rows][n_heads * hd]`) by the angles of the row in `cos`/`sin`.
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    hd: usize,
    rope_dim: usize,
    neox: bool,
    cos: &[f32],
    sin: &[f32],
) {
    let half = rope_dim / 2;
    for (ti, row) in x.chunks_exact_mut(n_heads * hd).enumerate() {
        let (c, s) = (
            &cos[ti * half..(ti + 1) * half],
            &sin[ti * half..(ti + 1) * half],
        );
        for h in row.chunks_exact_mut(hd) {
            for i in 0..half {
                let (a, b) = if neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (h[a], h[b]);
                h[a] = x0 * c[i] - x1 * s[i];
                h[b] = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn angles_follow_each_rows_position() {
        let inv = [1.0f32, 0.01];
        let (mut c, mut s) = (Vec::new(), Vec::new());
        rope_table(&inv, [5usize, 0, 7].into_iter(), 1.0, &mut c, &mut s);
        assert_eq!(c.len(), 6);
        assert_eq!(c[2], 1.0);
        assert!((c[0] - 5f32.cos()).abs() < 1e-6);
        assert!((s[5] - (7.0 * inv[1]).sin()).abs() < 1e-6);
    }

    #[test]
    fn rotation_pairs_follow_the_order() {
        // one row, one head of 4 values, rope_dim 4: angles a0 (pair 0) and a1 (pair 1)
        let (cos, sin) = ([0.0f32, 1.0], [1.0f32, 0.0]);
        let mut neox = [1.0f32, 2.0, 3.0, 4.0];
        rope(&mut neox, 1, 4, 4, true, &cos, &sin);
        // pair (0, 2) turned by 90 degrees, pair (1, 3) unchanged
        assert_eq!(neox, [-3.0, 2.0, 1.0, 4.0]);
        let mut gptj = [1.0f32, 2.0, 3.0, 4.0];
        rope(&mut gptj, 1, 4, 4, false, &cos, &sin);
        // pair (0, 1) turned by 90 degrees, pair (2, 3) unchanged
        assert_eq!(gptj, [-2.0, 1.0, 3.0, 4.0]);
    }
}
