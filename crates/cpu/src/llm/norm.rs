//! RMS norms of the LLM kernels on the CPU (f32 rows; the sum of squares in f32, in order).

/// `y[r] = x[r] / rms(x[r]) * w` for each row of `n` values.
pub fn rms_norm_rows(x: &[f32], y: &mut [f32], w: &[f32], n: usize, eps: f32) {
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    }
}

/// RMS norm of each `n`-value piece of `x`, in place.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], n: usize, eps: f32) {
    for xr in x.chunks_exact_mut(n) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        xr.iter_mut().zip(w).for_each(|(v, &g)| *v = *v * inv * g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_normed_apart_and_in_place_agrees() {
        let x = [3.0f32, 4.0, 0.0, 2.0];
        let w = [1.0f32, 0.5];
        let mut y = [0.0f32; 4];
        rms_norm_rows(&x, &mut y, &w, 2, 0.0);
        // rms of (3, 4) is sqrt(12.5); of (0, 2) is sqrt(2)
        let (a, b) = (12.5f32.sqrt(), 2f32.sqrt());
        assert_eq!(y, [3.0 / a, 4.0 / a * 0.5, 0.0, 2.0 / b * 0.5]);
        let mut z = x;
        rms_norm_in_place(&mut z, &w, 2, 0.0);
        assert_eq!(z, y);
    }
}
