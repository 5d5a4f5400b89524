//! Image folders (one sub-folder per class, PNG/JPEG through the `image` crate) with
//! transforms; examples `[image f32 [C, H, W], label i64 []]`.

use super::{Dataset, DrawContext, HostTensor};
use crate::{Error, Result};
use ferrite_core::{rng, HostBuffer};
use std::path::{Path, PathBuf};

const WHAT: &str = "ImageFolder";

/// A step applied to each image in order. Random steps draw from (seed, epoch, index), so an
/// example is augmented the same way in a resumed run.
#[derive(Clone, Debug, PartialEq)]
pub enum Transform {
    /// Bilinear resize to height × width.
    Resize { height: usize, width: usize },
    /// A random height × width window of the image zero-padded by `padding` on each side.
    RandomCrop {
        height: usize,
        width: usize,
        padding: usize,
    },
    /// Mirror left-right with probability `p`.
    RandomHorizontalFlip { p: f64 },
    /// Per channel `(x - mean) / std` (one value, or one per channel).
    Normalize { mean: Vec<f32>, std: Vec<f32> },
}

/// An image in CHW f32 layout, values in [0, 1] until normalized.
struct Chw {
    c: usize,
    h: usize,
    w: usize,
    v: Vec<f32>,
}

fn draw(ctx: DrawContext, index: usize, step: usize) -> [f64; 2] {
    let w = rng::words(
        ctx.seed ^ ctx.epoch.wrapping_mul(0xD1B5_4A32_D192_ED03),
        (index as u64) << 8 | step as u64,
    );
    [w[0] as f64 / 4294967296.0, w[1] as f64 / 4294967296.0]
}

impl Transform {
    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::config(WHAT, m));
        match self {
            Transform::Resize { height, width } | Transform::RandomCrop { height, width, .. }
                if *height == 0 || *width == 0 =>
            {
                bad(format!("{self:?}: sizes must be at least 1"))
            }
            Transform::RandomHorizontalFlip { p } if !(0.0..=1.0).contains(p) => bad(format!(
                "RandomHorizontalFlip: p must be in [0, 1], got {p}"
            )),
            Transform::Normalize { mean, std }
                if mean.is_empty()
                    || mean.len() != std.len()
                    || std.iter().any(|s| !(s.is_finite() && *s > 0.0))
                    || mean.iter().any(|m| !m.is_finite()) =>
            {
                bad(format!(
                    "Normalize: needs as many finite means as stds > 0, got {mean:?} and {std:?}"
                ))
            }
            _ => Ok(()),
        }
    }

    fn apply(&self, x: Chw, ctx: DrawContext, index: usize, step: usize) -> Result<Chw> {
        Ok(match self {
            Transform::Resize { height, width } => resize(&x, *height, *width),
            Transform::RandomCrop {
                height,
                width,
                padding,
            } => {
                let (ph, pw) = (x.h + 2 * padding, x.w + 2 * padding);
                if *height > ph || *width > pw {
                    return Err(Error::data(
                        WHAT,
                        format!(
                            "RandomCrop {height}x{width} is larger than the padded image {ph}x{pw}"
                        ),
                    ));
                }
                let [u, v] = draw(ctx, index, step);
                let top = ((u * (ph - height + 1) as f64) as usize).min(ph - height);
                let left = ((v * (pw - width + 1) as f64) as usize).min(pw - width);
                let mut out = vec![0f32; x.c * height * width];
                for c in 0..x.c {
                    for i in 0..*height {
                        let sy = (top + i) as isize - *padding as isize;
                        if sy < 0 || sy >= x.h as isize {
                            continue;
                        }
                        for j in 0..*width {
                            let sx = (left + j) as isize - *padding as isize;
                            if sx >= 0 && sx < x.w as isize {
                                out[(c * height + i) * width + j] =
                                    x.v[(c * x.h + sy as usize) * x.w + sx as usize];
                            }
                        }
                    }
                }
                Chw {
                    c: x.c,
                    h: *height,
                    w: *width,
                    v: out,
                }
            }
            Transform::RandomHorizontalFlip { p } => {
                if draw(ctx, index, step)[0] < *p {
                    let mut v = x.v;
                    for row in v.chunks_mut(x.w) {
                        row.reverse();
                    }
                    Chw { v, ..x }
                } else {
                    x
                }
            }
            Transform::Normalize { mean, std } => {
                if mean.len() != 1 && mean.len() != x.c {
                    return Err(Error::data(
                        WHAT,
                        format!(
                            "Normalize has {} channels of statistics, the image has {}",
                            mean.len(),
                            x.c
                        ),
                    ));
                }
                let mut v = x.v;
                let plane = x.h * x.w;
                for (c, ch) in v.chunks_mut(plane).enumerate() {
                    let k = if mean.len() == 1 { 0 } else { c };
                    for p in ch {
                        *p = (*p - mean[k]) / std[k];
                    }
                }
                Chw { v, ..x }
            }
        })
    }
}

/// `transforms` applied in order to example `index`'s image (step k draws its randomness
/// from (ctx, index, k)).
fn apply_all(transforms: &[Transform], mut x: Chw, ctx: DrawContext, index: usize) -> Result<Chw> {
    for (step, t) in transforms.iter().enumerate() {
        x = t.apply(x, ctx, index, step)?;
    }
    Ok(x)
}

/// Bilinear resize with half-pixel centres (align_corners = false).
fn resize(x: &Chw, h: usize, w: usize) -> Chw {
    let mut out = vec![0f32; x.c * h * w];
    let sy = x.h as f32 / h as f32;
    let sx = x.w as f32 / w as f32;
    for c in 0..x.c {
        let src = &x.v[c * x.h * x.w..(c + 1) * x.h * x.w];
        for i in 0..h {
            let fy = ((i as f32 + 0.5) * sy - 0.5).max(0.0);
            let y0 = (fy as usize).min(x.h - 1);
            let y1 = (y0 + 1).min(x.h - 1);
            let dy = fy - y0 as f32;
            for j in 0..w {
                let fx = ((j as f32 + 0.5) * sx - 0.5).max(0.0);
                let x0 = (fx as usize).min(x.w - 1);
                let x1 = (x0 + 1).min(x.w - 1);
                let dx = fx - x0 as f32;
                let top = src[y0 * x.w + x0] * (1.0 - dx) + src[y0 * x.w + x1] * dx;
                let bot = src[y1 * x.w + x0] * (1.0 - dx) + src[y1 * x.w + x1] * dx;
                out[(c * h + i) * w + j] = top * (1.0 - dy) + bot * dy;
            }
        }
    }
    Chw {
        c: x.c,
        h,
        w,
        v: out,
    }
}

/// `root/<class>/<image>.{png,jpg,jpeg}`; classes are the sub-folder names, sorted.
#[derive(Clone, Debug)]
pub struct ImageFolder {
    items: Vec<(PathBuf, usize)>,
    pub classes: Vec<String>,
    transforms: Vec<Transform>,
    /// Images are read as grayscale (1 channel) when true, RGB (3) otherwise.
    grayscale: bool,
}

impl ImageFolder {
    pub fn open(root: &Path, transforms: Vec<Transform>, grayscale: bool) -> Result<ImageFolder> {
        for t in &transforms {
            t.validate()?;
        }
        let shown = root.display();
        let rd = std::fs::read_dir(root)
            .map_err(|e| Error::data(WHAT, format!("cannot read the folder {shown}: {e}")))?;
        let mut classes: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect();
        classes.sort();
        if classes.is_empty() {
            return Err(Error::data(
                WHAT,
                format!("{shown} has no class sub-folders (expected {shown}/<class>/<image>.png)"),
            ));
        }
        let mut items = Vec::new();
        for (k, class) in classes.iter().enumerate() {
            let dir = root.join(class);
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|e| Error::data(WHAT, format!("cannot read {}: {e}", dir.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    matches!(
                        p.extension()
                            .and_then(|e| e.to_str())
                            .map(str::to_ascii_lowercase)
                            .as_deref(),
                        Some("png" | "jpg" | "jpeg")
                    )
                })
                .collect();
            files.sort();
            items.extend(files.into_iter().map(|p| (p, k)));
        }
        if items.is_empty() {
            return Err(Error::data(
                WHAT,
                format!("{shown}: no .png/.jpg/.jpeg images in its class folders"),
            ));
        }
        Ok(ImageFolder {
            items,
            classes,
            transforms,
            grayscale,
        })
    }
}

impl Dataset for ImageFolder {
    fn len(&self) -> usize {
        self.items.len()
    }

    fn get(&self, index: usize, ctx: DrawContext) -> Result<Vec<HostTensor>> {
        let (path, label) = self.items.get(index).ok_or_else(|| {
            Error::data(
                WHAT,
                format!("index {index} out of range for {} images", self.items.len()),
            )
        })?;
        let img = image::open(path)
            .map_err(|e| Error::data(WHAT, format!("{}: cannot decode: {e}", path.display())))?;
        let mut x = if self.grayscale {
            let g = img.to_luma8();
            let (w, h) = (g.width() as usize, g.height() as usize);
            Chw {
                c: 1,
                h,
                w,
                v: g.into_raw().into_iter().map(|p| p as f32 / 255.0).collect(),
            }
        } else {
            let rgb = img.to_rgb8();
            let (w, h) = (rgb.width() as usize, rgb.height() as usize);
            let raw = rgb.into_raw();
            let mut v = vec![0f32; 3 * h * w];
            for (p, px) in raw.chunks(3).enumerate() {
                for c in 0..3 {
                    v[c * h * w + p] = px[c] as f32 / 255.0;
                }
            }
            Chw { c: 3, h, w, v }
        };
        if x.h == 0 || x.w == 0 {
            return Err(Error::data(
                WHAT,
                format!("{}: empty image", path.display()),
            ));
        }
        x = apply_all(&self.transforms, x, ctx, index)?;
        Ok(vec![
            HostTensor {
                data: HostBuffer::F32(x.v),
                shape: vec![x.c, x.h, x.w],
            },
            HostTensor::scalar(HostBuffer::I64(vec![*label as i64])),
        ])
    }
}

/// Any dataset whose first field is an f32 image `[C, H, W]`, with `transforms` applied to
/// that image in order (augmentation for IDX files or MNIST digits, say); the other fields
/// pass through. Random steps draw from (seed, epoch, index) as in [`ImageFolder`].
pub struct Transformed<D> {
    inner: D,
    transforms: Vec<Transform>,
}

impl<D: Dataset> Transformed<D> {
    pub fn new(inner: D, transforms: Vec<Transform>) -> Result<Transformed<D>> {
        for t in &transforms {
            t.validate()?;
        }
        Ok(Transformed { inner, transforms })
    }
}

impl<D: Dataset> Dataset for Transformed<D> {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn get(&self, index: usize, ctx: DrawContext) -> Result<Vec<HostTensor>> {
        let what = "Transformed";
        let mut fields = self.inner.get(index, ctx)?;
        let Some(first) = fields.first_mut() else {
            return Err(Error::data(what, format!("example {index} has no fields")));
        };
        let (c, h, w) = match first.shape[..] {
            [c, h, w] if c * h * w > 0 => (c, h, w),
            _ => {
                return Err(Error::data(
                    what,
                    format!(
                        "example {index}: field 0 must be a non-empty image [C, H, W], got {:?}",
                        first.shape
                    ),
                ))
            }
        };
        let v = match std::mem::replace(&mut first.data, HostBuffer::F32(Vec::new())) {
            HostBuffer::F32(v) => v,
            other => {
                return Err(Error::data(
                    what,
                    format!(
                        "example {index}: field 0 must be f32, got {}",
                        other.dtype()
                    ),
                ))
            }
        };
        if v.len() != c * h * w {
            return Err(Error::data(
                what,
                format!(
                    "example {index}: field 0 holds {} values for shape [{c}, {h}, {w}]",
                    v.len()
                ),
            ));
        }
        let x = Chw { c, h, w, v };
        let x = apply_all(&self.transforms, x, ctx, index)?;
        *first = HostTensor {
            data: HostBuffer::F32(x.v),
            shape: vec![x.c, x.h, x.w],
        };
        Ok(fields)
    }
}
