//! State dicts: PyTorch order and names, in-place loads, strict and non-strict reports.

use ferrite_core::{DType, Tensor};
use ferrite_cpu::{cpu, CpuStorage};
use ferrite_nn::{
    load_state_dict, load_state_dict_file, save_state_dict, state_dict, Embedding, LayerNorm,
    Linear, ModuleExt, Sequential,
};

fn addr(t: &Tensor) -> usize {
    t.storage()
        .as_any()
        .downcast_ref::<CpuStorage>()
        .unwrap()
        .as_ptr()
}

fn model(seed: u64) -> Sequential {
    ferrite_nn::init::manual_seed(seed);
    let dev = cpu();
    Sequential::new()
        .with(Linear::new(4, 3, true, DType::F32, &dev).unwrap())
        .with(LayerNorm::new(&[3], 1e-5, true, true, DType::F32, &dev).unwrap())
        .with(Embedding::new(5, 3, Some(0), DType::F32, &dev).unwrap())
}

#[test]
fn save_and_load_round_trip_in_place() {
    let a = model(1);
    let b = model(2);
    let keys: Vec<_> = state_dict(&a).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight"]
    );
    let before: Vec<usize> = b.parameters().iter().map(|p| addr(&p.tensor())).collect();
    let path =
        std::env::temp_dir().join(format!("ferrite-nn-sd-{}.safetensors", std::process::id()));
    save_state_dict(&a, &path).unwrap();
    let r = load_state_dict_file(&b, &path, true).unwrap();
    assert!(r.is_clean());
    for ((ka, ta), (kb, tb)) in state_dict(&a).iter().zip(state_dict(&b).iter()) {
        assert_eq!(ka, kb);
        assert_eq!(
            ta.to_vec::<f32>().unwrap(),
            tb.to_vec::<f32>().unwrap(),
            "{ka}"
        );
    }
    let after: Vec<usize> = b.parameters().iter().map(|p| addr(&p.tensor())).collect();
    assert_eq!(before, after);
}

#[test]
fn strict_load_lists_every_problem_and_writes_nothing() {
    let m = model(3);
    let dev = cpu();
    let before = state_dict(&m)[0].1.to_vec::<f32>().unwrap();
    let state = vec![
        (
            "0.weight".to_string(),
            Tensor::zeros([4, 3], DType::F32, &dev).unwrap(),
        ),
        (
            "0.bias".to_string(),
            Tensor::zeros([3], DType::F64, &dev).unwrap(),
        ),
        (
            "1.weight".to_string(),
            Tensor::zeros([3], DType::F32, &dev).unwrap(),
        ),
        (
            "extra.weight".to_string(),
            Tensor::zeros([1], DType::F32, &dev).unwrap(),
        ),
    ];
    let e = load_state_dict(&m, &state, true).unwrap_err().to_string();
    assert_eq!(
        e,
        "Sequential: load_state_dict (strict): missing keys: 1.bias, 2.weight; unexpected keys: \
         extra.weight; shape mismatches: 0.weight (model [3, 4], state dict [4, 3])"
    );
    assert_eq!(state_dict(&m)[0].1.to_vec::<f32>().unwrap(), before);
    // Non-strict: the matching keys load (cast to the parameter's dtype), the rest is reported.
    let r = load_state_dict(&m, &state, false).unwrap();
    assert_eq!(r.missing, ["1.bias", "2.weight"]);
    assert_eq!(r.unexpected, ["extra.weight"]);
    assert_eq!(r.misshapen.len(), 1);
    assert_eq!(state_dict(&m)[1].1.to_vec::<f32>().unwrap(), [0.0; 3]);
    assert_eq!(state_dict(&m)[0].1.to_vec::<f32>().unwrap(), before);
}
