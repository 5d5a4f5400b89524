//! Each fused op against its composition from primitives (`ferrite_core::composed`), on the
//! same random inputs, f32 and f64.

use ferrite_core::{composed, DType, Result, Tensor};

fn rand(shape: &[usize], seed: u64, dt: DType) -> Tensor {
    Tensor::rand_uniform(shape, -2.0, 2.0, seed, dt, &ferrite_cpu::cpu()).unwrap()
}

fn close(a: &Tensor, b: &Tensor, tol: f64) {
    assert_eq!(a.dims(), b.dims());
    let (x, y) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    let worst = x
        .iter()
        .zip(&y)
        .map(|(p, q)| (p - q).abs() / (1.0 + q.abs()))
        .fold(0.0, f64::max);
    assert!(
        worst <= tol,
        "fused vs composed: max relative difference {worst} > {tol}"
    );
}

fn each_dtype(f: impl Fn(DType, f64) -> Result<()>) {
    for (dt, tol) in [(DType::F32, 2e-6), (DType::F64, 1e-13)] {
        f(dt, tol).unwrap();
    }
}

#[test]
fn softmax_and_log_softmax() {
    each_dtype(|dt, tol| {
        let x = rand(&[33, 45, 65], 1, dt).mul_scalar(4.0)?;
        for axis in [-1, 0, 1] {
            close(&x.softmax(axis)?, &composed::softmax(&x, axis)?, tol);
            close(
                &x.log_softmax(axis)?,
                &composed::log_softmax(&x, axis)?,
                tol,
            );
        }
        Ok(())
    });
}

#[test]
fn norms() {
    each_dtype(|dt, tol| {
        let x = rand(&[31, 65], 2, dt).t()?; // non-contiguous [65, 31]
        let (w, b) = (rand(&[31], 3, dt), rand(&[31], 4, dt));
        close(
            &x.layer_norm(&w, &b, 1e-5)?,
            &composed::layer_norm(&x, &w, &b, 1e-5)?,
            tol * 4.0,
        );
        close(
            &x.rms_norm(&w, 1e-6)?,
            &composed::rms_norm(&x, &w, 1e-6)?,
            tol * 4.0,
        );
        Ok(())
    });
}

#[test]
fn rope_both_layouts() {
    each_dtype(|dt, tol| {
        let x = rand(&[2, 9, 17, 64], 5, dt);
        let (c, s) = (rand(&[17, 32], 6, dt), rand(&[17, 32], 7, dt));
        for interleaved in [false, true] {
            close(
                &x.rope(&c, &s, interleaved)?,
                &composed::rope(&x, &c, &s, interleaved)?,
                tol,
            );
        }
        // The two layouts really differ.
        let a = x.rope(&c, &s, true)?.to_vec_f64()?;
        let b = x.rope(&c, &s, false)?.to_vec_f64()?;
        assert!(a.iter().zip(&b).any(|(p, q)| (p - q).abs() > 1e-3));
        Ok(())
    });
}

#[test]
fn attention_grouped_query_causal() {
    each_dtype(|dt, tol| {
        for (lq, lk, causal) in [(7, 7, true), (3, 11, true), (5, 9, false), (1, 40, true)] {
            let q = rand(&[2, 9, lq, 32], 8, dt);
            let k = rand(&[2, 3, lk, 32], 9, dt);
            let v = rand(&[2, 3, lk, 24], 10, dt);
            close(
                &Tensor::attention(&q, &k, &v, causal, None)?,
                &composed::attention(&q, &k, &v, causal, None)?,
                tol * 4.0,
            );
        }
        Ok(())
    });
}

/// Backward kernels against autodiff through the composition is in ferrite-autodiff's tests;
/// here: each backward op against its closed form written with primitives.
#[test]
fn softmax_backward_kernels() {
    each_dtype(|dt, tol| {
        let x = rand(&[31, 65], 11, dt);
        let g = rand(&[31, 65], 12, dt);
        let y = x.softmax(-1)?;
        let want = y.mul(&g.sub(&g.mul(&y)?.sum(&[-1], true)?)?)?;
        close(&Tensor::softmax_backward(&y, &g, false)?, &want, tol * 4.0);
        let ly = x.log_softmax(-1)?;
        let want = g.sub(&ly.exp()?.mul(&g.sum(&[-1], true)?)?)?;
        close(&Tensor::softmax_backward(&ly, &g, true)?, &want, tol * 4.0);
        Ok(())
    });
}

/// A key-padding mask [b, lk]: batch row 0 pads keys 1 and lk - 1, batch row 1 every third
/// key from key 1 (or, with `full`, every key).
fn padding_mask(lk: usize, full: bool) -> Tensor {
    let mut m = vec![false; 2 * lk];
    m[1] = true;
    m[lk - 1] = true;
    for j in 0..lk {
        m[lk + j] = full || j % 3 == 1;
    }
    Tensor::from_vec(m, [2, lk], &ferrite_cpu::cpu()).unwrap()
}

#[test]
fn attention_key_padding_mask() {
    each_dtype(|dt, tol| {
        for (lq, lk, causal) in [(7, 7, true), (3, 11, true), (5, 9, false), (1, 40, true)] {
            let q = rand(&[2, 6, lq, 16], 8, dt);
            let k = rand(&[2, 3, lk, 16], 9, dt);
            let v = rand(&[2, 3, lk, 12], 10, dt);
            let m = padding_mask(lk, false);
            let fused = Tensor::attention_masked(&q, &k, &v, Some(&m), causal, None)?;
            let slow = composed::attention_masked(&q, &k, &v, Some(&m), causal, None)?;
            close(&fused, &slow, tol * 4.0);
            // The mask changes the result (it is not ignored).
            let plain = Tensor::attention(&q, &k, &v, causal, None)?.to_vec_f64()?;
            let got = fused.to_vec_f64()?;
            assert!(got.iter().zip(&plain).any(|(a, b)| (a - b).abs() > 1e-3));
        }
        Ok(())
    });
}

/// Queries whose every visible key is padding give NaN rows, like the composition (softmax
/// over all -inf scores); the other batch row is unaffected.
#[test]
fn attention_fully_masked_rows_are_nan() {
    each_dtype(|dt, tol| {
        let (q, k, v) = (
            rand(&[2, 4, 5, 8], 1, dt),
            rand(&[2, 2, 6, 8], 2, dt),
            rand(&[2, 2, 6, 8], 3, dt),
        );
        let m = padding_mask(6, true);
        for causal in [false, true] {
            let fused = Tensor::attention_masked(&q, &k, &v, Some(&m), causal, None)?;
            let slow = composed::attention_masked(&q, &k, &v, Some(&m), causal, None)?;
            let (a, b) = (fused.to_vec_f64()?, slow.to_vec_f64()?);
            let half = a.len() / 2;
            assert!(
                a[half..].iter().all(|x| x.is_nan()),
                "batch row 1 is all NaN"
            );
            assert!(b[half..].iter().all(|x| x.is_nan()));
            assert!(a[..half].iter().all(|x| x.is_finite()));
            close(&fused.narrow(0, 0, 1)?, &slow.narrow(0, 0, 1)?, tol * 4.0);
        }
        // Causal with only key 0 unmasked: the first query (which sees keys 0..=1) keeps it.
        let mut mk = vec![true; 12];
        mk[0] = false;
        mk[6] = false;
        let m = Tensor::from_vec(mk, [2, 6], &ferrite_cpu::cpu())?;
        let fused = Tensor::attention_masked(&q, &k, &v, Some(&m), true, None)?;
        assert!(fused.to_vec_f64()?.iter().all(|x| x.is_finite()));
        Ok(())
    });
}

#[test]
fn attention_mask_must_be_bool_batch_by_keys() {
    let cpu = ferrite_cpu::cpu();
    let q = rand(&[2, 2, 3, 4], 1, DType::F32);
    let k = rand(&[2, 1, 5, 4], 2, DType::F32);
    for (m, what) in [
        (
            Tensor::zeros([2, 4], DType::Bool, &cpu).unwrap(),
            "bool [2, 4]",
        ),
        (Tensor::zeros([2, 5], DType::U8, &cpu).unwrap(), "u8 [2, 5]"),
    ] {
        let e = Tensor::attention_masked(&q, &k, &k, Some(&m), false, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("attention: key mask must be bool [2, 5]") && e.contains(what),
            "{e}"
        );
    }
}
