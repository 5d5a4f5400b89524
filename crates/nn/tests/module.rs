//! The Module API: dotted paths, modes, in-place parameter writes, gradients by name, moves,
//! and errors that name the module path.

use ferrite_autodiff::backward;
use ferrite_core::{DType, Error, Tensor};
use ferrite_cpu::{cpu, CpuStorage};
use ferrite_nn::{
    Buffer, Linear, Members, MembersMut, Module, ModuleDict, ModuleExt, ModuleList, Parameter,
    Sequential,
};

fn addr(t: &Tensor) -> usize {
    t.storage()
        .as_any()
        .downcast_ref::<CpuStorage>()
        .expect("a CPU tensor")
        .as_ptr()
}

/// A module with a mode flag and a buffer: adds its buffer in training, counts calls.
struct Shift {
    offset: Buffer,
    calls: Buffer,
    training: bool,
}

impl Shift {
    fn new(n: usize) -> Shift {
        let dev = cpu();
        Shift {
            offset: Buffer::new(&Tensor::ones([n], DType::F32, &dev).unwrap()).unwrap(),
            calls: Buffer::new(&Tensor::zeros((), DType::I64, &dev).unwrap()).unwrap(),
            training: true,
        }
    }
}

impl Module for Shift {
    fn type_name(&self) -> &'static str {
        "Shift"
    }
    fn forward(&self, x: &Tensor) -> ferrite_core::Result<Tensor> {
        match self.training {
            true => x.add(self.offset.tensor()),
            false => Ok(x.clone()),
        }
    }
    fn members(&self) -> Members<'_> {
        Members {
            buffers: vec![
                ("offset".into(), &self.offset),
                ("calls".into(), &self.calls),
            ],
            training: Some(self.training),
            ..Members::default()
        }
    }
    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            buffers: vec![
                ("offset".into(), &mut self.offset),
                ("calls".into(), &mut self.calls),
            ],
            training: Some(&mut self.training),
            ..MembersMut::default()
        }
    }
}

fn model() -> Sequential {
    let dev = cpu();
    let inner = Sequential::new()
        .with(Linear::new(3, 2, true, DType::F32, &dev).unwrap())
        .with(Shift::new(2));
    Sequential::new()
        .with(Linear::new(4, 3, false, DType::F32, &dev).unwrap())
        .with(inner)
}

#[test]
fn named_parameters_buffers_and_modules_use_dotted_paths() {
    let m = model();
    let names: Vec<_> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "1.0.weight", "1.0.bias"]);
    let shapes: Vec<_> = m
        .named_parameters()
        .into_iter()
        .map(|(_, p)| p.dims().to_vec())
        .collect();
    assert_eq!(shapes, [vec![3, 4], vec![2, 3], vec![2]]);
    let bufs: Vec<_> = m.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(bufs, ["1.1.offset", "1.1.calls"]);
    let mods = m.named_modules();
    assert_eq!(
        mods,
        [
            ("".to_string(), "Sequential"),
            ("0".to_string(), "Linear"),
            ("1".to_string(), "Sequential"),
            ("1.0".to_string(), "Linear"),
            ("1.1".to_string(), "Shift"),
        ]
    );
    assert_eq!(m.num_parameters(), (12 + 6 + 2, 12 + 6 + 2));

    let mut d = ModuleDict::new();
    d.insert("encoder", Box::new(model())).unwrap();
    let mut l = ModuleList::new();
    l.push(Box::new(
        Linear::new(2, 2, true, DType::F32, &cpu()).unwrap(),
    ));
    d.insert("heads", Box::new(l)).unwrap();
    let names: Vec<_> = d.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "encoder.0.weight",
            "encoder.1.0.weight",
            "encoder.1.0.bias",
            "heads.0.weight",
            "heads.0.bias"
        ]
    );
    assert!(d.insert("a.b", Box::new(Sequential::new())).is_err());
    let e = d.forward(&Tensor::zeros([1], DType::F32, &cpu()).unwrap());
    assert!(e.unwrap_err().to_string().contains("ModuleDict"));
}

#[test]
fn train_and_eval_reach_every_module() {
    let mut m = model();
    let x = Tensor::zeros([1, 4], DType::F32, &cpu()).unwrap();
    assert!(m.is_training());
    let y_train = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    m.eval();
    assert!(!m.is_training());
    let y_eval = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    for (a, b) in y_train.iter().zip(&y_eval) {
        assert!((a - b - 1.0).abs() < 1e-6, "{a} {b}");
    }
    m.train();
    assert!(m.is_training());
}

#[test]
fn parameters_are_written_in_place_and_keep_their_address() {
    let m = model();
    let params = m.named_parameters();
    let (_, w) = &params[0];
    let before = addr(&w.tensor());
    let new = Tensor::full(0.5, [3, 4], DType::F64, &cpu()).unwrap();
    w.copy_(&new).unwrap();
    // The module sees the write through its own handle.
    let again = m.named_parameters();
    assert_eq!(addr(&again[0].1.tensor()), before);
    assert!(again[0]
        .1
        .tensor()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|&v| v == 0.5));
    // A shape mismatch is an error and leaves the buffer alone.
    assert!(w
        .copy_(&Tensor::zeros([4, 3], DType::F32, &cpu()).unwrap())
        .is_err());
    // Parameter::new owns a copy: writing it does not touch the source tensor.
    let src = Tensor::zeros([2], DType::F32, &cpu()).unwrap();
    let p = Parameter::new(&src).unwrap();
    p.copy_(&Tensor::ones([2], DType::F32, &cpu()).unwrap())
        .unwrap();
    assert_eq!(src.to_vec::<f32>().unwrap(), [0.0, 0.0]);
    assert!(Parameter::new(&Tensor::zeros([2], DType::I64, &cpu()).unwrap()).is_err());
}

#[test]
fn backward_gives_each_parameter_its_gradient_by_name() {
    let dev = cpu();
    let w = Tensor::from_vec(vec![1.0f64, 2.0, -1.0, 0.5, 0.0, 3.0], [2, 3], &dev).unwrap();
    let b = Tensor::from_vec(vec![0.1f64, -0.2], [2], &dev).unwrap();
    let lin = Linear::from_tensors(&w, Some(&b)).unwrap();
    let x = Tensor::from_vec(vec![1.0f64, -1.0, 2.0, 0.5, 0.25, -0.5], [2, 3], &dev).unwrap();
    let loss = lin
        .forward(&x)
        .unwrap()
        .square()
        .unwrap()
        .sum_all()
        .unwrap();
    backward(&loss).unwrap();
    // y = x Wᵀ + b; dL/dy = 2y; dW = (2y)ᵀ x; db = sum(2y).
    let xv = x.to_vec::<f64>().unwrap();
    let wv = w.to_vec::<f64>().unwrap();
    let bv = b.to_vec::<f64>().unwrap();
    let mut y = [0.0f64; 4];
    for i in 0..2 {
        for o in 0..2 {
            y[i * 2 + o] = bv[o] + (0..3).map(|k| xv[i * 3 + k] * wv[o * 3 + k]).sum::<f64>();
        }
    }
    let mut dw = [0.0f64; 6];
    let mut db = [0.0f64; 2];
    for i in 0..2 {
        for o in 0..2 {
            db[o] += 2.0 * y[i * 2 + o];
            for k in 0..3 {
                dw[o * 3 + k] += 2.0 * y[i * 2 + o] * xv[i * 3 + k];
            }
        }
    }
    let grads = lin.named_grads();
    assert_eq!(grads[0].0, "weight");
    assert_eq!(grads[1].0, "bias");
    for (g, want) in grads[0].1.to_vec::<f64>().unwrap().iter().zip(dw) {
        assert!((g - want).abs() < 1e-12, "{g} {want}");
    }
    for (g, want) in grads[1].1.to_vec::<f64>().unwrap().iter().zip(db) {
        assert!((g - want).abs() < 1e-12, "{g} {want}");
    }
    lin.zero_grad();
    assert!(lin.named_grads().is_empty());
    // A frozen parameter gets no gradient.
    let mut lin = lin;
    lin.weight.set_requires_grad(false);
    let loss = lin.forward(&x).unwrap().sum_all().unwrap();
    backward(&loss).unwrap();
    let names: Vec<_> = lin.named_grads().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["bias"]);
    assert_eq!(lin.num_parameters(), (2, 8));
}

#[test]
fn to_dtype_casts_parameters_and_float_buffers_only() {
    let mut m = model();
    m.to_dtype(DType::F64).unwrap();
    assert!(m.parameters().iter().all(|p| p.dtype() == DType::F64));
    let bufs = m.named_buffers();
    assert_eq!(bufs[0].1.dtype(), DType::F64);
    assert_eq!(bufs[1].1.dtype(), DType::I64);
    let y = m
        .forward(&Tensor::zeros([2, 4], DType::F64, &cpu()).unwrap())
        .unwrap();
    assert_eq!(y.dims(), [2, 2]);
    m.to_device(&cpu()).unwrap();
    assert!(m.to_dtype(DType::I32).is_err());
}

#[test]
fn errors_name_the_module_path_type_and_shapes() {
    let m = model();
    let e = m
        .forward(&Tensor::zeros([8, 5], DType::F32, &cpu()).unwrap())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "0 (Linear): expected 4 input features, got input [8, 5]"
    );
    let mut d = ModuleDict::new();
    d.insert("features", Box::new(model())).unwrap();
    let e = ferrite_nn::forward_child(
        "features",
        d.get("features").unwrap(),
        &Tensor::zeros([8, 5], DType::F32, &cpu()).unwrap(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "features.0 (Linear): expected 4 input features, got input [8, 5]"
    );
    assert!(matches!(e, Error::Module { .. }));
    // A failing op inside a child is attributed to that child.
    let seq = Sequential::new().with(Shift::new(3));
    let e = seq
        .forward(&Tensor::zeros([2], DType::F32, &cpu()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("0 (Shift): "), "{e}");
    assert!(Linear::new(0, 3, true, DType::F32, &cpu()).is_err());
}

#[test]
fn boxed_modules_walk_like_concrete_ones() {
    let b: Box<dyn Module> = Box::new(model());
    assert_eq!(b.named_parameters().len(), 3);
    assert_eq!(b.type_name(), "Sequential");
}
