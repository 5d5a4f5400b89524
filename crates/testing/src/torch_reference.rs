//! End-to-end checks against PyTorch on any device: a small MLP and a small attention block
//! with the weights of `fixtures/torch_reference.json` (written by
//! scripts/autodiff_fixtures.py) give PyTorch's loss and gradients; plain SGD written over the
//! API trains an MLP on a synthetic problem.

use ferrite_autodiff::{backward, no_grad, Var};
use ferrite_core::{DType, Device, Result, Tensor};

const FIXTURE: &str = include_str!("../fixtures/torch_reference.json");

fn fixture() -> std::result::Result<serde_json::Value, String> {
    serde_json::from_str(FIXTURE).map_err(|e| format!("fixture: {e}"))
}

fn floats(v: &serde_json::Value) -> std::result::Result<Vec<f64>, String> {
    v.as_array()
        .ok_or("fixture: expected an array")?
        .iter()
        .map(|x| {
            x.as_f64()
                .ok_or_else(|| "fixture: expected a number".to_string())
        })
        .collect()
}

fn tensor(
    v: &serde_json::Value,
    shape: &[usize],
    dt: DType,
    dev: &Device,
) -> std::result::Result<Tensor, String> {
    Tensor::from_slice(&floats(v)?, shape, dev)
        .and_then(|t| t.cast(dt))
        .map_err(|e| e.to_string())
}

fn var(
    v: &serde_json::Value,
    shape: &[usize],
    dt: DType,
    dev: &Device,
) -> std::result::Result<Var, String> {
    Var::new(&tensor(v, shape, dt, dev)?).map_err(|e| e.to_string())
}

fn close(name: &str, got: &Tensor, want: &[f64], rtol: f64) -> std::result::Result<(), String> {
    let g = got.to_vec_f64().map_err(|e| e.to_string())?;
    if g.len() != want.len() {
        return Err(format!(
            "{name}: {} values, PyTorch has {}",
            g.len(),
            want.len()
        ));
    }
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-12);
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        if (a - b).abs() > rtol * scale {
            return Err(format!(
                "{name}[{i}]: ferrite {a} vs torch {b} (max |torch| {scale})"
            ));
        }
    }
    Ok(())
}

fn grad(v: &Var, name: &str) -> std::result::Result<Tensor, String> {
    v.grad().ok_or_else(|| format!("{name}: no gradient"))
}

/// x W1 + b1 -> gelu -> W2 + b2, mean squared error against a target; loss and the four
/// parameter gradients against PyTorch, within `rtol` of the largest value.
pub fn mlp(dev: &Device, dt: DType, rtol: f64) -> std::result::Result<(), String> {
    let fx = fixture()?;
    let f = &fx["mlp"];
    let x = tensor(&f["x"], &[8, 6], dt, dev)?;
    let target = tensor(&f["target"], &[8, 4], dt, dev)?;
    let (w1, b1) = (
        var(&f["w1"], &[6, 16], dt, dev)?,
        var(&f["b1"], &[16], dt, dev)?,
    );
    let (w2, b2) = (
        var(&f["w2"], &[16, 4], dt, dev)?,
        var(&f["b2"], &[4], dt, dev)?,
    );
    let run = || -> Result<Tensor> {
        let h = x.matmul(w1.tensor())?.add(b1.tensor())?.gelu()?;
        h.matmul(w2.tensor())?
            .add(b2.tensor())?
            .sub(&target)?
            .square()?
            .mean(&[], false)
    };
    let loss = run().map_err(|e| e.to_string())?;
    close(
        "mlp loss",
        &loss,
        &[f["loss"].as_f64().unwrap_or(f64::NAN)],
        rtol,
    )?;
    backward(&loss).map_err(|e| e.to_string())?;
    for (n, v) in [("w1", &w1), ("b1", &b1), ("w2", &w2), ("b2", &b2)] {
        close(n, &grad(v, n)?, &floats(&f["grads"][n])?, rtol)?;
    }
    Ok(())
}

/// rms_norm -> q/k/v projections -> RoPE -> causal GQA attention -> output projection +
/// residual, loss = sum(y * r); loss and six gradients against PyTorch.
pub fn attention(dev: &Device, dt: DType, rtol: f64) -> std::result::Result<(), String> {
    let fx = fixture()?;
    let f = &fx["attention"];
    let (b, l, c, hq, hkv, hd) = (2, 5, 16, 4, 2, 4);
    let x = var(&f["x"], &[b, l, c], dt, dev)?;
    let g = var(&f["g"], &[c], dt, dev)?;
    let wq = var(&f["wq"], &[c, hq * hd], dt, dev)?;
    let wk = var(&f["wk"], &[c, hkv * hd], dt, dev)?;
    let wv = var(&f["wv"], &[c, hkv * hd], dt, dev)?;
    let wo = var(&f["wo"], &[hq * hd, c], dt, dev)?;
    let r = tensor(&f["r"], &[b, l, c], dt, dev)?;
    let cos = tensor(&f["cos"], &[l, hd / 2], dt, dev)?;
    let sin = tensor(&f["sin"], &[l, hd / 2], dt, dev)?;
    let run = || -> Result<Tensor> {
        let heads = |t: Tensor, n: usize| t.reshape([b, l, n, hd])?.transpose(1, 2);
        let h = x.tensor().rms_norm(g.tensor(), 1e-6)?;
        let q = heads(h.matmul(wq.tensor())?, hq)?.rope(&cos, &sin, false)?;
        let k = heads(h.matmul(wk.tensor())?, hkv)?.rope(&cos, &sin, false)?;
        let v = heads(h.matmul(wv.tensor())?, hkv)?;
        let a = Tensor::attention(&q, &k, &v, true, None)?
            .transpose(1, 2)?
            .reshape([b, l, hq * hd])?;
        x.tensor().add(&a.matmul(wo.tensor())?)?.mul(&r)?.sum_all()
    };
    let loss = run().map_err(|e| e.to_string())?;
    close(
        "attention loss",
        &loss,
        &[f["loss"].as_f64().unwrap_or(f64::NAN)],
        rtol,
    )?;
    backward(&loss).map_err(|e| e.to_string())?;
    for (n, v) in [
        ("x", &x),
        ("g", &g),
        ("wq", &wq),
        ("wk", &wk),
        ("wv", &wv),
        ("wo", &wo),
    ] {
        close(n, &grad(v, n)?, &floats(&f["grads"][n])?, rtol)?;
    }
    Ok(())
}

/// A student MLP 8-32-4 (tanh) learns a random teacher of the same shape by 1,500 steps of
/// full-batch SGD (lr 0.5); returns (first loss, last loss).
pub fn sgd_train(dev: &Device) -> Result<(f32, f32)> {
    let n = |shape: &[usize], std: f64, seed: u64| {
        Tensor::rand_normal(shape, 0.0, std, seed, DType::F32, dev)
    };
    let x = n(&[256, 8], 1.0, 1)?;
    let target = x
        .matmul(&n(&[8, 32], 0.5, 2)?)?
        .tanh()?
        .matmul(&n(&[32, 4], 0.5, 3)?)?;
    let mut params = Vec::new();
    for (s, seed) in [
        (vec![8, 32], 4),
        (vec![32], 5),
        (vec![32, 4], 6),
        (vec![4], 7),
    ] {
        params.push(Var::new(&n(&s, 0.3, seed)?)?);
    }
    let loss_of = |p: &[Var]| -> Result<Tensor> {
        let h = x.matmul(p[0].tensor())?.add(p[1].tensor())?.tanh()?;
        h.matmul(p[2].tensor())?
            .add(p[3].tensor())?
            .sub(&target)?
            .square()?
            .mean(&[], false)
    };
    let first = loss_of(&params)?.item::<f32>()?;
    let lr = 0.5;
    let mut last = first;
    for step in 0..1500 {
        let loss = loss_of(&params)?;
        if step % 100 == 99 {
            last = loss.item::<f32>()?;
        }
        backward(&loss)?;
        for p in params.iter_mut() {
            let g = p
                .grad()
                .ok_or_else(|| ferrite_core::Error::backend("sgd", "no gradient"))?;
            let next = no_grad(|| p.tensor().sub(&g.mul_scalar(lr)?))?;
            p.set(&next)?;
            p.zero_grad();
        }
    }
    Ok((first, last))
}
