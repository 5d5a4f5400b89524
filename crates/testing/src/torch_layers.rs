//! Convolution, pooling and channel-norm layers of ferrite-nn against PyTorch on any device
//! (fixtures from scripts/nn_ops_fixtures.py): parameters loaded by PyTorch's names, then per
//! train step the output and the gradients of the input and of every parameter, the buffers
//! after the steps (running statistics, num_batches_tracked), and an eval-mode output; f64.

use ferrite_autodiff::{backward_with, Var};
use ferrite_core::{ConvArgs, ConvTransposeArgs, DType, Device, Padding, PoolArgs, Tensor};
use ferrite_nn::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool1d, AvgPool2d, BatchNorm, Conv1d, Conv2d,
    ConvTranspose2d, GroupNorm, InstanceNorm2d, MaxPool1d, MaxPool2d, Module, ModuleExt,
};
use serde_json::Value;

fn fixtures() -> Value {
    let text = include_str!("../fixtures/nn_ops.json");
    serde_json::from_str(text).expect("nn_ops.json parses")
}

fn dims(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|d| d.as_u64().expect("a dim") as usize)
        .collect()
}

fn arr<const N: usize>(v: &Value) -> [usize; N] {
    dims(v).try_into().expect("array length")
}

fn tensor(v: &Value, dev: &Device) -> Tensor {
    let data: Vec<f64> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect();
    Tensor::from_vec(data, dims(&v["shape"]), dev).expect("fixture tensor")
}

fn pool_args<const N: usize>(a: &Value) -> PoolArgs<N> {
    PoolArgs {
        kernel: arr(&a["k"]),
        stride: arr(&a["stride"]),
        padding: arr(&a["padding"]),
        dilation: arr(&a["dilation"]),
        ceil_mode: a["ceil_mode"].as_bool().expect("ceil_mode"),
        count_include_pad: a["count_include_pad"].as_bool().expect("count_include_pad"),
    }
}

/// The ferrite layer for a fixture case, in f64 on `dev`.
fn build(c: &Value, dev: &Device) -> Box<dyn Module> {
    let a = &c["args"];
    let dt = DType::F64;
    let u = |k: &str| a[k].as_u64().expect(k) as usize;
    let b = |k: &str| a[k].as_bool().expect(k);
    let momentum = a["momentum"].as_f64();
    let m: Box<dyn Module> = match c["module"].as_str().expect("module") {
        "Conv2d" => {
            let args = ConvArgs {
                stride: arr(&a["stride"]),
                padding: match a["padding"].as_str() {
                    Some("same") => Padding::Same,
                    _ => Padding::Zeros(arr(&a["padding"])),
                },
                dilation: arr(&a["dilation"]),
                groups: u("groups"),
            };
            Box::new(
                Conv2d::new(u("in"), u("out"), arr(&a["k"]), args, b("bias"), dt, dev).unwrap(),
            )
        }
        "Conv1d" => {
            let args = ConvArgs {
                stride: arr(&a["stride"]),
                padding: Padding::Zeros(arr(&a["padding"])),
                dilation: arr(&a["dilation"]),
                groups: u("groups"),
            };
            let k = arr::<1>(&a["k"])[0];
            Box::new(Conv1d::new(u("in"), u("out"), k, args, b("bias"), dt, dev).unwrap())
        }
        "ConvTranspose2d" => {
            let args = ConvTransposeArgs {
                stride: arr(&a["stride"]),
                padding: arr(&a["padding"]),
                output_padding: arr(&a["output_padding"]),
                dilation: arr(&a["dilation"]),
                groups: u("groups"),
            };
            Box::new(
                ConvTranspose2d::new(u("in"), u("out"), arr(&a["k"]), args, b("bias"), dt, dev)
                    .unwrap(),
            )
        }
        "MaxPool2d" => Box::new(MaxPool2d::new(pool_args(a)).unwrap()),
        "MaxPool1d" => Box::new(MaxPool1d::new(pool_args(a)).unwrap()),
        "AvgPool2d" => Box::new(AvgPool2d::new(pool_args(a)).unwrap()),
        "AvgPool1d" => Box::new(AvgPool1d::new(pool_args(a)).unwrap()),
        "AdaptiveAvgPool2d" => Box::new(AdaptiveAvgPool2d::new(arr(&a["out"])).unwrap()),
        "AdaptiveMaxPool2d" => Box::new(AdaptiveMaxPool2d::new(arr(&a["out"])).unwrap()),
        "BatchNorm2d" => Box::new(
            BatchNorm::new_2d(u("c"), 1e-5, momentum, b("affine"), b("track"), dt, dev).unwrap(),
        ),
        "BatchNorm1d" => Box::new(
            BatchNorm::new_1d(u("c"), 1e-5, momentum, b("affine"), b("track"), dt, dev).unwrap(),
        ),
        "GroupNorm" => {
            Box::new(GroupNorm::new(u("groups"), u("c"), 1e-5, b("affine"), dt, dev).unwrap())
        }
        "InstanceNorm2d" => Box::new(
            InstanceNorm2d::new(u("c"), 1e-5, momentum, b("affine"), b("track"), dt, dev).unwrap(),
        ),
        other => panic!("no layer for fixture module {other}"),
    };
    m
}

fn close(what: &str, got: &Tensor, want: &Value, dev: &Device) -> Result<(), String> {
    let w = tensor(want, dev);
    if got.dims() != w.dims() {
        return Err(format!(
            "{what}: shape {} vs PyTorch {}",
            got.shape(),
            w.shape()
        ));
    }
    let (g, w) = (got.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if (a - b).abs() > 1e-9 * (1.0 + b.abs()) {
            return Err(format!("{what}[{i}]: {a} vs PyTorch {b}"));
        }
    }
    Ok(())
}

/// Every fixture case on `dev`; returns (cases checked, failures).
pub fn check_all(dev: &Device) -> (usize, Vec<String>) {
    let fx = fixtures();
    let cases = fx["cases"].as_object().expect("cases");
    assert!(cases.len() >= 19, "fixture lost cases");
    let mut failures = Vec::new();
    for (name, c) in cases {
        let mut m = build(c, dev);
        if let Err(e) = check_case(&mut m, c, dev) {
            failures.push(format!("{name} ({}): {e}", c["module"]));
        }
    }
    (cases.len(), failures)
}

fn check_case(m: &mut Box<dyn Module>, c: &Value, dev: &Device) -> Result<(), String> {
    let params = m.named_parameters();
    let want = c["params"].as_object().expect("params");
    let names: Vec<&String> = params.iter().map(|(n, _)| n).collect();
    let mut want_names: Vec<&String> = want.keys().collect();
    want_names.sort();
    let mut sorted = names.clone();
    sorted.sort();
    if sorted != want_names {
        return Err(format!("parameters {names:?} vs PyTorch {want_names:?}"));
    }
    for (n, p) in &params {
        p.copy_(&tensor(&want[n.as_str()], dev))
            .map_err(|e| format!("loading {n}: {e}"))?;
    }
    m.train();
    for (s, step) in c["steps"].as_array().expect("steps").iter().enumerate() {
        m.zero_grad();
        let x = Var::new(&tensor(&step["input"], dev)).unwrap();
        let y = m.forward(x.tensor()).map_err(|e| e.to_string())?;
        close(&format!("step {s} output"), &y, &step["output"], dev)?;
        backward_with(&y, &tensor(&step["r"], dev)).map_err(|e| e.to_string())?;
        let gx = x.grad().ok_or("no input gradient")?;
        close(
            &format!("step {s} input grad"),
            &gx,
            &step["input_grad"],
            dev,
        )?;
        for (n, p) in &params {
            let g = p.grad().ok_or(format!("no gradient for {n}"))?;
            close(
                &format!("step {s} grad {n}"),
                &g,
                &step["param_grads"][n.as_str()],
                dev,
            )?;
        }
    }
    let buffers = m.named_buffers();
    let want_b = c["buffers"].as_object().expect("buffers");
    if buffers.len() != want_b.len() {
        let got: Vec<&String> = buffers.iter().map(|(n, _)| n).collect();
        return Err(format!("buffers {got:?} vs PyTorch {:?}", want_b.keys()));
    }
    for (n, b) in &buffers {
        let w = want_b.get(n).ok_or(format!("unexpected buffer {n}"))?;
        close(&format!("buffer {n}"), b.tensor(), w, dev)?;
    }
    if let Some(ev) = c.get("eval") {
        m.eval();
        let y = m
            .forward(&tensor(&ev["input"], dev))
            .map_err(|e| e.to_string())?;
        close("eval output", &y, &ev["output"], dev)?;
    }
    Ok(())
}
