//! End-to-end against PyTorch: the same weights give the same loss and gradients
//! (fixtures from scripts/autodiff_fixtures.py), in f64 and f32; and plain SGD written over
//! the API trains an MLP on a synthetic problem.

use ferrite_autodiff::{backward, no_grad, Var};
use ferrite_core::{DType, Result, Tensor};
use ferrite_cpu::cpu;
use serde_json::Value;

fn fixture() -> Value {
    let s = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/torch_reference.json"
    ))
    .unwrap();
    serde_json::from_str(&s).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn tensor(v: &Value, shape: &[usize], dt: DType) -> Tensor {
    Tensor::from_slice(&floats(v), shape, &cpu())
        .unwrap()
        .cast(dt)
        .unwrap()
}

fn var(v: &Value, shape: &[usize], dt: DType) -> Var {
    Var::new(&tensor(v, shape, dt)).unwrap()
}

fn assert_close(name: &str, got: &Tensor, want: &[f64], rtol: f64) {
    let g = got.to_vec_f64().unwrap();
    assert_eq!(g.len(), want.len(), "{name}: length");
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-12);
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= rtol * scale,
            "{name}[{i}]: ferrite {a} vs torch {b} (max |torch| {scale})"
        );
    }
}

fn mlp(dt: DType, rtol: f64) -> Result<()> {
    let f = &fixture()["mlp"];
    let x = tensor(&f["x"], &[8, 6], dt);
    let target = tensor(&f["target"], &[8, 4], dt);
    let (w1, b1) = (var(&f["w1"], &[6, 16], dt), var(&f["b1"], &[16], dt));
    let (w2, b2) = (var(&f["w2"], &[16, 4], dt), var(&f["b2"], &[4], dt));
    let h = x.matmul(w1.tensor())?.add(b1.tensor())?.gelu()?;
    let loss = h
        .matmul(w2.tensor())?
        .add(b2.tensor())?
        .sub(&target)?
        .square()?
        .mean(&[], false)?;
    assert_close("mlp loss", &loss, &[f["loss"].as_f64().unwrap()], rtol);
    backward(&loss)?;
    for (n, v) in [("w1", &w1), ("b1", &b1), ("w2", &w2), ("b2", &b2)] {
        assert_close(n, &v.grad().unwrap(), &floats(&f["grads"][n]), rtol);
    }
    Ok(())
}

#[test]
fn mlp_loss_and_gradients_match_pytorch() {
    mlp(DType::F64, 1e-12).unwrap();
    mlp(DType::F32, 1e-5).unwrap();
}

fn attention(dt: DType, rtol: f64) -> Result<()> {
    let f = &fixture()["attention"];
    let (b, l, c, hq, hkv, hd) = (2, 5, 16, 4, 2, 4);
    let x = var(&f["x"], &[b, l, c], dt);
    let g = var(&f["g"], &[c], dt);
    let wq = var(&f["wq"], &[c, hq * hd], dt);
    let wk = var(&f["wk"], &[c, hkv * hd], dt);
    let wv = var(&f["wv"], &[c, hkv * hd], dt);
    let wo = var(&f["wo"], &[hq * hd, c], dt);
    let r = tensor(&f["r"], &[b, l, c], dt);
    let (cos, sin) = (
        tensor(&f["cos"], &[l, hd / 2], dt),
        tensor(&f["sin"], &[l, hd / 2], dt),
    );
    let heads = |t: Tensor, n: usize| t.reshape([b, l, n, hd])?.transpose(1, 2);
    let h = x.tensor().rms_norm(g.tensor(), 1e-6)?;
    let q = heads(h.matmul(wq.tensor())?, hq)?.rope(&cos, &sin, false)?;
    let k = heads(h.matmul(wk.tensor())?, hkv)?.rope(&cos, &sin, false)?;
    let v = heads(h.matmul(wv.tensor())?, hkv)?;
    let a = Tensor::attention(&q, &k, &v, true, None)?
        .transpose(1, 2)?
        .reshape([b, l, hq * hd])?;
    let y = x.tensor().add(&a.matmul(wo.tensor())?)?;
    let loss = y.mul(&r)?.sum_all()?;
    assert_close(
        "attention loss",
        &loss,
        &[f["loss"].as_f64().unwrap()],
        rtol,
    );
    backward(&loss)?;
    for (n, v) in [
        ("x", &x),
        ("g", &g),
        ("wq", &wq),
        ("wk", &wk),
        ("wv", &wv),
        ("wo", &wo),
    ] {
        assert_close(n, &v.grad().unwrap(), &floats(&f["grads"][n]), rtol);
    }
    Ok(())
}

#[test]
fn attention_block_loss_and_gradients_match_pytorch() {
    attention(DType::F64, 1e-12).unwrap();
    attention(DType::F32, 1e-5).unwrap();
}

#[test]
fn sgd_trains_an_mlp_to_a_100x_lower_loss() {
    // A student MLP 8-32-4 (tanh) learns a random teacher of the same shape by full-batch SGD.
    let dev = cpu();
    let n = |shape: &[usize], std: f64, seed: u64| {
        Tensor::rand_normal(shape, 0.0, std, seed, DType::F32, &dev).unwrap()
    };
    let x = n(&[256, 8], 1.0, 1);
    let teacher = |x: &Tensor| {
        x.matmul(&n(&[8, 32], 0.5, 2))?
            .tanh()?
            .matmul(&n(&[32, 4], 0.5, 3))
    };
    let target = teacher(&x).unwrap();
    let mut params: Vec<Var> = [
        (vec![8, 32], 4),
        (vec![32], 5),
        (vec![32, 4], 6),
        (vec![4], 7),
    ]
    .into_iter()
    .map(|(s, seed)| Var::new(&n(&s, 0.3, seed)).unwrap())
    .collect();
    let loss_of = |p: &[Var]| -> Result<Tensor> {
        let h = x.matmul(p[0].tensor())?.add(p[1].tensor())?.tanh()?;
        h.matmul(p[2].tensor())?
            .add(p[3].tensor())?
            .sub(&target)?
            .square()?
            .mean(&[], false)
    };
    let first = loss_of(&params).unwrap().item::<f32>().unwrap();
    let lr = 0.5;
    let mut last = first;
    for _ in 0..1500 {
        let loss = loss_of(&params).unwrap();
        last = loss.item::<f32>().unwrap();
        backward(&loss).unwrap();
        for p in params.iter_mut() {
            let g = p.grad().unwrap();
            let next = no_grad(|| p.tensor().sub(&g.mul_scalar(lr)?)).unwrap();
            p.set(&next).unwrap();
            p.zero_grad();
        }
    }
    assert!(last < first / 100.0, "loss went from {first} to {last}");
}
