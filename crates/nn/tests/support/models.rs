//! Whole models against PyTorch (`scripts/nn_model_fixtures.py`) on any device and float dtype:
//! a narrow ResNet-18 in torchvision's layout and a 2-layer TransformerEncoder language model
//! load PyTorch's state dicts unchanged (strict), then one train-mode batch must match
//! PyTorch's output, every parameter gradient of `sum(out * r)` and every buffer after the step
//! (running statistics, num_batches_tracked), and the eval-mode output afterwards.

use super::torch_cases::fixtures;
use ferrite_core::{DType, Device, Result, Tensor};
use ferrite_nn::models::{ResNet, ResNetConfig, TransformerEncoder};
use ferrite_nn::safetensors::SafetensorsFile;
use ferrite_nn::{
    load_state_dict_file, Embedding, EncoderConfig, Linear, Members, MembersMut, Module, ModuleExt,
};

/// The encoder fixture's model: token ids [b, t] -> logits [b, t, 61], causal.
pub struct EncoderLm {
    embedding: Embedding,
    encoder: TransformerEncoder,
    head: Linear,
}

impl EncoderLm {
    pub fn new(dtype: DType, dev: &Device) -> Result<EncoderLm> {
        let mut c = EncoderConfig::new(32, 4);
        c.dim_feedforward = 64;
        c.dropout = 0.0;
        c.batch_first = true;
        Ok(EncoderLm {
            embedding: Embedding::new(61, 32, None, dtype, dev)?,
            encoder: TransformerEncoder::new(c, 2, true, dtype, dev)?,
            head: Linear::new(32, 61, true, dtype, dev)?,
        })
    }
}

impl Module for EncoderLm {
    fn type_name(&self) -> &'static str {
        "Encoder"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = ferrite_nn::forward_child("embedding", &self.embedding, x)?;
        let h = self
            .encoder
            .forward_masked(&h, None, true)
            .map_err(|e| ferrite_nn::in_child(e, "encoder", "TransformerEncoder"))?;
        ferrite_nn::forward_child("head", &self.head, &h)
    }

    fn members(&self) -> Members<'_> {
        Members {
            children: vec![
                ("embedding".into(), &self.embedding as &dyn Module),
                ("encoder".into(), &self.encoder),
                ("head".into(), &self.head),
            ],
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            children: vec![
                ("embedding".into(), &mut self.embedding as &mut dyn Module),
                ("encoder".into(), &mut self.encoder),
                ("head".into(), &mut self.head),
            ],
            ..MembersMut::default()
        }
    }
}

/// The narrow ResNet-18 of the fixture (torchvision's stem and stages, widths 8..64).
pub fn resnet18_narrow(dtype: DType, dev: &Device) -> Result<ResNet> {
    let c = ResNetConfig {
        widths: vec![8, 16, 32, 64],
        ..ResNetConfig::resnet18(10)
    };
    ResNet::new(&c, dtype, dev)
}

/// Largest |got - want| over the largest |want| (1 where want is all zero).
fn rel_err(got: &Tensor, want: &Tensor) -> Result<f64> {
    let (g, w) = (got.to_vec_f64()?, want.to_vec_f64()?);
    if g.len() != w.len() {
        return Ok(f64::INFINITY);
    }
    let scale = w.iter().fold(0f64, |a, v| a.max(v.abs()));
    let worst = g
        .iter()
        .zip(&w)
        .fold(0f64, |a, (x, y)| a.max((x - y).abs()));
    Ok(worst / if scale > 0.0 { scale } else { 1.0 })
}

/// Runs fixture `name` on `model`: returns (checked tensors, failures).
pub fn check(
    name: &str,
    model: &mut (dyn Module + 'static),
    dtype: DType,
    dev: &Device,
    tol: f64,
) -> Result<(usize, Vec<String>)> {
    let dir = fixtures();
    let report = load_state_dict_file(&*model, dir.join(format!("{name}.safetensors")), true)?;
    assert!(report.is_clean(), "{name}: {report}");
    let reference = SafetensorsFile::open(dir.join(format!("{name}_ref.safetensors")))?;
    let get = |k: &str| reference.tensor(k, dev);
    let x = get("in")?;
    let x = if x.dtype().is_float() {
        x.cast(dtype)?
    } else {
        x
    };
    model.train();
    model.zero_grad();
    let out = model.forward(&x)?;
    let r = get("r")?.cast(dtype)?;
    ferrite_autodiff::backward(&out.mul(&r)?.sum_all()?)?;
    let mut t = Tally {
        name: format!("{name} {dtype}"),
        tol,
        checked: 0,
        failures: Vec::new(),
    };
    t.cmp("out", &out, &get("out")?)?;
    let grads = model.named_grads();
    let params = model.named_parameters();
    if grads.len() != params.len() {
        t.failures.push(format!(
            "{name}: {} of {} parameters got a gradient",
            grads.len(),
            params.len()
        ));
    }
    for (k, g) in &grads {
        t.cmp(&format!("grad {k}"), g, &get(&format!("grad.{k}"))?)?;
    }
    for (k, b) in model.named_buffers() {
        let want = get(&format!("after.{k}"))?;
        if want.dtype().is_float() {
            t.cmp(&format!("buffer {k}"), b.tensor(), &want)?;
        } else {
            t.checked += 1;
            if b.tensor().to_vec_f64()? != want.to_vec_f64()? {
                t.failures.push(format!("{name}: buffer {k} differs"));
            }
        }
    }
    model.eval();
    let eval_out = ferrite_core::no_grad(|| model.forward(&x))?;
    t.cmp("eval out", &eval_out, &get("eval_out")?)?;
    Ok((t.checked, t.failures))
}

struct Tally {
    name: String,
    tol: f64,
    checked: usize,
    failures: Vec<String>,
}

impl Tally {
    fn cmp(&mut self, what: &str, got: &Tensor, want: &Tensor) -> Result<()> {
        self.checked += 1;
        let e = rel_err(got, want)?;
        if e.is_nan() || e > self.tol {
            self.failures.push(format!(
                "{} {what}: relative error {e:e} > {:e}",
                self.name, self.tol
            ));
        }
        Ok(())
    }
}

/// Both models on `dev` in `dtype` with tolerance `tol` (relative to each tensor's largest
/// magnitude).
pub fn check_all(dev: &Device, dtype: DType, tol: f64) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut run = |name: &str, m: Result<Box<dyn Module>>| {
        let r = m.and_then(|mut m| check(name, &mut *m, dtype, dev, tol));
        match r {
            Ok((c, f)) => {
                checked += c;
                failures.extend(f);
            }
            Err(e) => failures.push(format!("{name} {dtype}: {e}")),
        }
    };
    run(
        "resnet18",
        resnet18_narrow(dtype, dev).map(|m| Box::new(m) as Box<dyn Module>),
    );
    run(
        "encoder",
        EncoderLm::new(dtype, dev).map(|m| Box::new(m) as Box<dyn Module>),
    );
    (checked, failures)
}
