//! IDX files (MNIST, Fashion-MNIST): big-endian header, magic `00 00 TT NN` (TT the element
//! type, NN the number of dims), one u32 size per dim, then the elements. Gzipped files
//! (`.gz`, or gzip magic) are decompressed on open.

use super::{Dataset, DrawContext, HostTensor};
use crate::{Error, Result};
use ferrite_core::HostBuffer;
use std::io::Read;
use std::path::{Path, PathBuf};

const WHAT: &str = "IdxDataset";

/// A parsed IDX file of unsigned bytes (the only element type MNIST-style data uses).
#[derive(Clone, Debug)]
pub struct IdxFile {
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

/// The most bytes an IDX file may expand to (gzip bombs are refused before allocation).
const MAX_BYTES: u64 = 1 << 31;

fn read_all(path: &Path) -> Result<Vec<u8>> {
    let shown = path.display();
    let raw =
        std::fs::read(path).map_err(|e| Error::data(WHAT, format!("cannot read {shown}: {e}")))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .take(MAX_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| Error::data(WHAT, format!("{shown}: not a valid gzip stream: {e}")))?;
        if out.len() as u64 > MAX_BYTES {
            return Err(Error::data(
                WHAT,
                format!("{shown}: decompresses to more than {MAX_BYTES} bytes"),
            ));
        }
        Ok(out)
    } else {
        Ok(raw)
    }
}

impl IdxFile {
    pub fn open(path: &Path) -> Result<IdxFile> {
        IdxFile::parse(&read_all(path)?, &path.display().to_string())
    }

    /// Parses IDX bytes; `name` appears in errors.
    pub fn parse(b: &[u8], name: &str) -> Result<IdxFile> {
        if b.len() < 4 {
            return Err(Error::data(
                WHAT,
                format!(
                    "{name}: {} bytes, shorter than the 4-byte IDX magic",
                    b.len()
                ),
            ));
        }
        if b[0] != 0 || b[1] != 0 {
            return Err(Error::data(
                WHAT,
                format!(
                    "{name}: not an IDX file (magic bytes 0-1 are {:#04x} {:#04x}, expected 0x00 0x00)",
                    b[0], b[1]
                ),
            ));
        }
        if b[2] != 0x08 {
            return Err(Error::data(
                WHAT,
                format!(
                    "{name}: element type {:#04x} at offset 2; only unsigned bytes (0x08) are supported",
                    b[2]
                ),
            ));
        }
        let nd = b[3] as usize;
        if nd == 0 || nd > 4 {
            return Err(Error::data(
                WHAT,
                format!("{name}: {nd} dimensions at offset 3, expected 1 to 4"),
            ));
        }
        let header = 4 + 4 * nd;
        if b.len() < header {
            return Err(Error::data(
                WHAT,
                format!(
                    "{name}: file ends at byte {} inside the {header}-byte header",
                    b.len()
                ),
            ));
        }
        let dims: Vec<usize> = (0..nd)
            .map(|i| {
                u32::from_be_bytes([b[4 + 4 * i], b[5 + 4 * i], b[6 + 4 * i], b[7 + 4 * i]])
                    as usize
            })
            .collect();
        let n = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&n| n as u64 <= MAX_BYTES)
            .ok_or_else(|| Error::data(WHAT, format!("{name}: dims {dims:?} are too large")))?;
        let have = b.len() - header;
        if have != n {
            return Err(Error::data(
                WHAT,
                format!(
                    "{name}: header says {dims:?} = {n} bytes of data from offset {header}, the file has {have}"
                ),
            ));
        }
        Ok(IdxFile {
            dims,
            data: b[header..].to_vec(),
        })
    }
}

/// Images and labels from a pair of IDX files: examples `[image f32 [1, H, W] in [0, 1]
/// (or normalized), label i64 []]`.
#[derive(Clone, Debug)]
pub struct IdxDataset {
    images: IdxFile,
    labels: Vec<u8>,
    /// (mean, std) applied after scaling to [0, 1].
    normalize: Option<(f32, f32)>,
    classes: usize,
}

impl IdxDataset {
    pub fn open(images: &Path, labels: &Path) -> Result<IdxDataset> {
        for p in [images, labels] {
            if !p.exists() {
                return Err(missing(p));
            }
        }
        let img = IdxFile::open(images)?;
        let lab = IdxFile::open(labels)?;
        IdxDataset::from_files(
            img,
            lab,
            &images.display().to_string(),
            &labels.display().to_string(),
        )
    }

    /// Fashion-MNIST as Debian's `dataset-fashion-mnist` installs it
    /// (`/usr/share/datasets/fashion-mnist/{train,t10k}-*.gz`), or from `dir`.
    pub fn fashion_mnist(dir: Option<&Path>, train: bool) -> Result<IdxDataset> {
        let dir = dir
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/usr/share/datasets/fashion-mnist"));
        let split = if train { "train" } else { "t10k" };
        IdxDataset::open(
            &dir.join(format!("{split}-images-idx3-ubyte.gz")),
            &dir.join(format!("{split}-labels-idx1-ubyte.gz")),
        )
    }

    pub fn from_files(
        images: IdxFile,
        labels: IdxFile,
        img_name: &str,
        lab_name: &str,
    ) -> Result<IdxDataset> {
        if images.dims.len() != 3 {
            return Err(Error::data(
                WHAT,
                format!(
                    "{img_name}: images need 3 dims [n, rows, cols], the file has {:?}",
                    images.dims
                ),
            ));
        }
        if labels.dims.len() != 1 {
            return Err(Error::data(
                WHAT,
                format!(
                    "{lab_name}: labels need 1 dim [n], the file has {:?}",
                    labels.dims
                ),
            ));
        }
        if images.dims[0] != labels.dims[0] {
            return Err(Error::data(
                WHAT,
                format!(
                    "{img_name} holds {} images, {lab_name} {} labels",
                    images.dims[0], labels.dims[0]
                ),
            ));
        }
        let classes = labels
            .data
            .iter()
            .copied()
            .max()
            .map_or(0, |m| m as usize + 1);
        Ok(IdxDataset {
            images,
            labels: labels.data,
            normalize: None,
            classes,
        })
    }

    /// Normalizes pixels as `(x / 255 - mean) / std`.
    pub fn normalized(mut self, mean: f32, std: f32) -> Result<IdxDataset> {
        if !(mean.is_finite() && std.is_finite() && std > 0.0) {
            return Err(Error::config(
                WHAT,
                format!("normalize needs finite mean and std > 0, got {mean}, {std}"),
            ));
        }
        self.normalize = Some((mean, std));
        Ok(self)
    }

    /// Image height and width.
    pub fn image_size(&self) -> (usize, usize) {
        (self.images.dims[1], self.images.dims[2])
    }

    /// Largest label + 1.
    pub fn num_classes(&self) -> usize {
        self.classes
    }
}

fn missing(p: &Path) -> Error {
    Error::data(
        WHAT,
        format!(
            "{} does not exist; Fashion-MNIST comes with Debian's package `dataset-fashion-mnist` \
             (`apt-get install dataset-fashion-mnist`, into /usr/share/datasets/fashion-mnist/), \
             or pass the folder holding the IDX files",
            p.display()
        ),
    )
}

impl Dataset for IdxDataset {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize, _ctx: DrawContext) -> Result<Vec<HostTensor>> {
        let (h, w) = self.image_size();
        let px = self
            .images
            .data
            .get(index * h * w..(index + 1) * h * w)
            .ok_or_else(|| {
                Error::data(
                    WHAT,
                    format!("index {index} out of range for {} images", self.len()),
                )
            })?;
        let img: Vec<f32> = match self.normalize {
            Some((m, s)) => px.iter().map(|&p| (p as f32 / 255.0 - m) / s).collect(),
            None => px.iter().map(|&p| p as f32 / 255.0).collect(),
        };
        Ok(vec![
            HostTensor {
                data: HostBuffer::F32(img),
                shape: vec![1, h, w],
            },
            HostTensor::scalar(HostBuffer::I64(vec![self.labels[index] as i64])),
        ])
    }
}
