//! Data loading: datasets of host examples, samplers, collation, and a [`DataLoader`] whose
//! worker threads build batches ahead of the training step (DESIGN.md principle 5).
//!
//! An example is a list of fields (`[image, label]`, `[features, target]`, `[x, y]`), each a
//! host buffer with its shape. The loader stacks each field over the batch (`[B, ...]`) on a
//! worker thread and uploads it to the device in order; on CUDA the upload goes through pinned
//! staging on the copy stream, so the next batch crosses while the current step runs.

mod csv;
mod digits;
mod idx;
mod image;
mod loader;
mod sampler;
mod text;

pub use self::csv::{CsvDataset, CsvOptions, CsvTarget};
pub use self::image::{ImageFolder, Transform, Transformed};
pub use digits::MnistDigits;
pub use idx::{IdxDataset, IdxFile};
pub use loader::{Batch, DataLoader, DataLoaderConfig, EpochIter, LoaderState};
pub use sampler::{epoch_order, Sampler};
pub use text::TextWindows;

use crate::{Error, Result};
use ferrite_core::HostBuffer;
use std::sync::Arc;

/// A host buffer and its shape: one field of an example or of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub data: HostBuffer,
    pub shape: Vec<usize>,
}

impl HostTensor {
    /// `data` must hold exactly the elements of `shape`.
    pub fn new(data: HostBuffer, shape: Vec<usize>) -> Result<HostTensor> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(Error::data(
                "HostTensor",
                format!("{} elements do not fill shape {shape:?}", data.len()),
            ));
        }
        Ok(HostTensor { data, shape })
    }

    /// A 0-d field (a label, a regression target).
    pub fn scalar(data: HostBuffer) -> HostTensor {
        HostTensor {
            data,
            shape: Vec::new(),
        }
    }
}

/// Where an example is drawn: lets random augmentations depend only on (seed, epoch, index),
/// so a resumed run sees the same examples as one never interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrawContext {
    pub seed: u64,
    pub epoch: u64,
}

/// A finite, indexable collection of examples. Implementations are shared by the loader's
/// worker threads.
pub trait Dataset: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Example `index` (< `len()`) as its fields; random transforms draw from `ctx`.
    fn get(&self, index: usize, ctx: DrawContext) -> Result<Vec<HostTensor>>;
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize, ctx: DrawContext) -> Result<Vec<HostTensor>> {
        (**self).get(index, ctx)
    }
}

/// Turns the examples of one batch into the batch's fields.
pub type Collate = Arc<dyn Fn(Vec<Vec<HostTensor>>) -> Result<Vec<HostTensor>> + Send + Sync>;

/// The default collation: field k of the batch stacks field k of every example into
/// `[B, ...shape]`; every example must have the same fields, dtypes and shapes.
pub fn stack(examples: Vec<Vec<HostTensor>>) -> Result<Vec<HostTensor>> {
    let what = "collate";
    let Some(first) = examples.first() else {
        return Err(Error::data(what, "a batch needs at least one example"));
    };
    let nfields = first.len();
    let specs: Vec<(ferrite_core::DType, Vec<usize>)> = first
        .iter()
        .map(|f| (f.data.dtype(), f.shape.clone()))
        .collect();
    let b = examples.len();
    let mut fields: Vec<HostBuffer> = specs
        .iter()
        .map(|(dt, shape)| empty_like(*dt, b * shape.iter().product::<usize>()))
        .collect();
    for (i, ex) in examples.into_iter().enumerate() {
        if ex.len() != nfields {
            return Err(Error::data(
                what,
                format!(
                    "example {i} of the batch has {} fields, the first has {nfields}",
                    ex.len()
                ),
            ));
        }
        for (k, f) in ex.into_iter().enumerate() {
            let (dt, shape) = &specs[k];
            if f.data.dtype() != *dt || &f.shape != shape {
                return Err(Error::data(
                    what,
                    format!(
                        "field {k} of example {i} is {} {:?}, the first example's is {dt} {shape:?}",
                        f.data.dtype(),
                        f.shape
                    ),
                ));
            }
            if !append(&mut fields[k], f.data) {
                return Err(Error::data(
                    what,
                    format!("field {k}: dtype changed while stacking"),
                ));
            }
        }
    }
    Ok(fields
        .into_iter()
        .zip(specs)
        .map(|(data, (_, shape))| {
            let mut s = vec![b];
            s.extend(shape);
            HostTensor { data, shape: s }
        })
        .collect())
}

fn empty_like(dt: ferrite_core::DType, cap: usize) -> HostBuffer {
    use ferrite_core::DType as D;
    match dt {
        D::F32 => HostBuffer::F32(Vec::with_capacity(cap)),
        D::F16 => HostBuffer::F16(Vec::with_capacity(cap)),
        D::BF16 => HostBuffer::BF16(Vec::with_capacity(cap)),
        D::F64 => HostBuffer::F64(Vec::with_capacity(cap)),
        D::I32 => HostBuffer::I32(Vec::with_capacity(cap)),
        D::I64 => HostBuffer::I64(Vec::with_capacity(cap)),
        D::U32 => HostBuffer::U32(Vec::with_capacity(cap)),
        D::U8 => HostBuffer::U8(Vec::with_capacity(cap)),
        D::Bool => HostBuffer::Bool(Vec::with_capacity(cap)),
    }
}

/// Appends `src` to `dst`; false (and nothing appended) when their dtypes differ.
fn append(dst: &mut HostBuffer, src: HostBuffer) -> bool {
    match (dst, src) {
        (HostBuffer::F32(d), HostBuffer::F32(s)) => d.extend(s),
        (HostBuffer::F16(d), HostBuffer::F16(s)) => d.extend(s),
        (HostBuffer::BF16(d), HostBuffer::BF16(s)) => d.extend(s),
        (HostBuffer::F64(d), HostBuffer::F64(s)) => d.extend(s),
        (HostBuffer::I32(d), HostBuffer::I32(s)) => d.extend(s),
        (HostBuffer::I64(d), HostBuffer::I64(s)) => d.extend(s),
        (HostBuffer::U32(d), HostBuffer::U32(s)) => d.extend(s),
        (HostBuffer::U8(d), HostBuffer::U8(s)) => d.extend(s),
        (HostBuffer::Bool(d), HostBuffer::Bool(s)) => d.extend(s),
        _ => return false,
    }
    true
}
