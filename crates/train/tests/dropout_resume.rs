//! A model with dropout, interrupted mid-epoch and resumed from its checkpoint, gives the
//! same losses bit for bit as the run never interrupted: the checkpoint keeps each Dropout's
//! draw count and the initialization stream (`trainer.json` "rng").

use ferrite_core::{DType, Device, HostBuffer, Tensor};
use ferrite_nn::{Dropout, Linear, ModuleExt, ReLU, Sequential};
use ferrite_train::data::{DataLoader, DataLoaderConfig, Dataset, DrawContext, HostTensor};
use ferrite_train::trainer::{Trainer, TrainerConfig};
use ferrite_train::{Optimizer, Rule};
use std::sync::Arc;

/// 2-D points, class 1 when x + 2y > 0.
struct Points(usize);
impl Dataset for Points {
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, i: usize, _: DrawContext) -> ferrite_train::Result<Vec<HostTensor>> {
        let x = ((i * 37 % 101) as f32 / 50.0) - 1.0;
        let y = ((i * 53 % 97) as f32 / 48.0) - 1.0;
        Ok(vec![
            HostTensor::new(HostBuffer::F32(vec![x, y]), vec![2])?,
            HostTensor::scalar(HostBuffer::I64(vec![i64::from(x + 2.0 * y > 0.0)])),
        ])
    }
}

fn trainer(dev: &Device, out: std::path::PathBuf, max_steps: Option<usize>) -> Trainer {
    ferrite_nn::init::manual_seed(11);
    let model = Sequential::new()
        .with(Linear::new(2, 32, true, DType::F32, dev).expect("l1"))
        .with(ReLU)
        .with(Dropout::new(0.3).expect("dropout"))
        .with(Linear::new(32, 2, true, DType::F32, dev).expect("l2"));
    let opt = Optimizer::new(model.named_parameters(), 0.05, Rule::adam()).expect("opt");
    let cfg = TrainerConfig {
        log_every: 1,
        out_dir: Some(out),
        max_steps,
        progress: false,
        ..TrainerConfig::new(3)
    };
    let ce = |logits: &Tensor, t: &Tensor| {
        let n = t.elem_count();
        logits
            .log_softmax(-1)?
            .gather(&t.reshape([n, 1])?, 1)?
            .mean(&[], false)?
            .neg()
    };
    Trainer::new(Box::new(model), opt, Box::new(ce), dev, cfg).expect("trainer")
}

fn loader() -> DataLoader {
    DataLoader::new(Arc::new(Points(160)), DataLoaderConfig::new(16).shuffle(3)).expect("loader")
}

#[test]
fn interrupted_run_with_dropout_resumes_bit_exactly() {
    let dev = ferrite_cpu::cpu();
    let dir = |n: &str| {
        let d = std::env::temp_dir().join(format!("ferrite-dropout-{n}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    };
    let full = dir("full");
    let mut a = trainer(&dev, full.clone(), None);
    a.fit(&mut loader(), None).expect("fit");
    let want = a.step_losses.clone();
    assert_eq!(want.len(), 30);

    let out = dir("resume");
    let mut b = trainer(&dev, out.clone(), Some(14));
    b.fit(&mut loader(), None).expect("first part");
    let mut c = trainer(&dev, out.clone(), None);
    c.resume(&out.join("checkpoints/last")).expect("resume");
    c.fit(&mut loader(), None).expect("rest");
    assert_eq!(
        c.step_losses, want,
        "resumed losses equal the uninterrupted run's"
    );
    let state = std::fs::read_to_string(out.join("checkpoints/last/trainer.json")).unwrap();
    assert!(state.contains("\"rng\""), "{state}");
    let _ = std::fs::remove_dir_all(full);
    let _ = std::fs::remove_dir_all(out);
}
