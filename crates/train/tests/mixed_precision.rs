//! Mixed precision in the Trainer, on the CPU: bf16 autocast and fp16 with loss scaling follow
//! the f32 loss curve of a small transformer from the same initial weights; the fp16 scaler
//! skips a forced overflow (parameters untouched, scale halved) and training goes on; a
//! checkpoint keeps the scaler's state and resumes bit-exactly. The same checks run on CUDA in
//! `gpu.rs`.

#[path = "common/amp.rs"]
mod amp;

use ferrite_train::trainer::Precision;

#[test]
fn bf16_and_fp16_curves_follow_f32() {
    amp::check_curves(&ferrite_cpu::cpu());
}

#[test]
fn fp16_scaler_skips_a_forced_overflow_and_training_goes_on() {
    amp::check_forced_overflow(&ferrite_cpu::cpu());
}

#[test]
fn fp16_checkpoint_keeps_the_scaler_and_resumes_bit_exactly() {
    amp::check_resume(&ferrite_cpu::cpu());
}

/// `cuda_graph` captures on CUDA only: elsewhere an error at construction naming the device.
#[test]
fn cuda_graph_on_the_cpu_is_refused() {
    let dev = ferrite_cpu::cpu();
    let model = ferrite_nn::Linear::new(2, 2, true, ferrite_core::DType::F32, &dev).unwrap();
    let opt = ferrite_train::Optimizer::new(
        ferrite_nn::ModuleExt::named_parameters(&model),
        1e-3,
        ferrite_train::Rule::adam(),
    )
    .unwrap();
    let cfg = ferrite_train::trainer::TrainerConfig {
        cuda_graph: true,
        ..ferrite_train::trainer::TrainerConfig::new(1)
    };
    let e = ferrite_train::trainer::Trainer::new(
        Box::new(model),
        opt,
        Box::new(amp::lm_loss),
        &dev,
        cfg,
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(e.contains("cuda_graph") && e.contains("cpu"), "{e}");
}

#[test]
fn precision_names_parse_and_bad_ones_list_the_choices() {
    assert_eq!(Precision::parse("f32").unwrap(), Precision::F32);
    assert_eq!(Precision::parse("bf16").unwrap(), Precision::Bf16);
    assert_eq!(Precision::parse("fp16").unwrap(), Precision::Fp16);
    let e = Precision::parse("fp8").unwrap_err().to_string();
    assert!(e.contains("fp8") && e.contains("f32, bf16, fp16"), "{e}");
}
