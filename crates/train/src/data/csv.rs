//! CSV/TSV tables (the `csv` crate): numeric feature columns and one target column, for
//! classification (labels mapped to class indices) or regression.

use super::{Dataset, DrawContext, HostTensor};
use crate::{Error, Result};
use ferrite_core::HostBuffer;
use std::path::Path;

const WHAT: &str = "CsvDataset";

/// How the target column is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsvTarget {
    /// Any text; the distinct values, sorted, become classes 0..k (i64 targets).
    Class,
    /// A number (f32 targets of shape [1]).
    Regression,
}

/// Which columns to read and how.
#[derive(Clone, Debug)]
pub struct CsvOptions {
    /// Name (with a header) or 0-based index of the target column.
    pub target: String,
    pub target_kind: CsvTarget,
    /// Feature columns by name or index; `None` takes every column but the target.
    pub features: Option<Vec<String>>,
    /// `None`: tab for `.tsv`/`.tab` files, comma otherwise.
    pub delimiter: Option<u8>,
    pub has_header: bool,
}

impl CsvOptions {
    pub fn new(target: &str, target_kind: CsvTarget) -> CsvOptions {
        CsvOptions {
            target: target.to_string(),
            target_kind,
            features: None,
            delimiter: None,
            has_header: true,
        }
    }
}

/// A table held in memory: `[features f32 [F], target]` examples.
#[derive(Clone, Debug)]
pub struct CsvDataset {
    features: Vec<f32>,
    nfeat: usize,
    targets: HostBuffer,
    /// Feature column names (or their indices as text without a header).
    pub feature_names: Vec<String>,
    /// Class names in class-index order (empty for regression).
    pub classes: Vec<String>,
}

fn column(
    spec: &str,
    header: Option<&csv::StringRecord>,
    ncols: usize,
    file: &str,
) -> Result<usize> {
    if let Some(h) = header {
        if let Some(i) = h.iter().position(|c| c.trim() == spec) {
            return Ok(i);
        }
    }
    match spec.parse::<usize>() {
        Ok(i) if i < ncols => Ok(i),
        _ => {
            let known = header
                .map(|h| {
                    h.iter()
                        .map(|c| c.trim().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_else(|| format!("indices 0..{ncols}"));
            Err(Error::data(
                WHAT,
                format!("{file}: no column `{spec}` (columns: {known})"),
            ))
        }
    }
}

impl CsvDataset {
    pub fn open(path: &Path, opts: &CsvOptions) -> Result<CsvDataset> {
        let file = path.display().to_string();
        let delim =
            opts.delimiter
                .unwrap_or_else(|| match path.extension().and_then(|e| e.to_str()) {
                    Some("tsv") | Some("tab") => b'\t',
                    _ => b',',
                });
        let mut rdr = csv::ReaderBuilder::new()
            .delimiter(delim)
            .has_headers(opts.has_header)
            .flexible(false)
            .from_path(path)
            .map_err(|e| Error::data(WHAT, format!("cannot read {file}: {e}")))?;
        let header = if opts.has_header {
            Some(
                rdr.headers()
                    .map_err(|e| Error::data(WHAT, format!("{file}: header: {e}")))?
                    .clone(),
            )
        } else {
            None
        };
        let mut rows = rdr.records();
        let first = match rows.next() {
            Some(r) => r.map_err(|e| row_error(&file, e))?,
            None => return Err(Error::data(WHAT, format!("{file}: no data rows"))),
        };
        let ncols = first.len();
        let t = column(&opts.target, header.as_ref(), ncols, &file)?;
        let fcols: Vec<usize> = match &opts.features {
            Some(fs) => fs
                .iter()
                .map(|f| column(f, header.as_ref(), ncols, &file))
                .collect::<Result<_>>()?,
            None => (0..ncols).filter(|&c| c != t).collect(),
        };
        if fcols.is_empty() {
            return Err(Error::data(WHAT, format!("{file}: no feature columns")));
        }
        if fcols.contains(&t) {
            return Err(Error::data(
                WHAT,
                format!(
                    "{file}: the target column `{}` is also a feature",
                    opts.target
                ),
            ));
        }
        let feature_names = fcols
            .iter()
            .map(|&c| {
                header
                    .as_ref()
                    .and_then(|h| h.get(c))
                    .map_or(c.to_string(), |s| s.trim().to_string())
            })
            .collect();
        let mut features = Vec::new();
        let mut raw_targets: Vec<String> = Vec::new();
        let mut reg_targets: Vec<f32> = Vec::new();
        let mut push = |rec: &csv::StringRecord| -> Result<()> {
            let line = rec.position().map_or(0, |p| p.line());
            for &c in &fcols {
                let cell = rec.get(c).unwrap_or("").trim();
                let v: f32 = cell.parse().map_err(|_| {
                    Error::data(
                        WHAT,
                        format!(
                            "{file}, line {line}, column {}: `{cell}` is not a number",
                            c + 1
                        ),
                    )
                })?;
                if !v.is_finite() {
                    return Err(Error::data(
                        WHAT,
                        format!(
                            "{file}, line {line}, column {}: `{cell}` is not finite",
                            c + 1
                        ),
                    ));
                }
                features.push(v);
            }
            let cell = rec.get(t).unwrap_or("").trim();
            match opts.target_kind {
                CsvTarget::Class => {
                    if cell.is_empty() {
                        return Err(Error::data(
                            WHAT,
                            format!("{file}, line {line}: empty target in column {}", t + 1),
                        ));
                    }
                    raw_targets.push(cell.to_string())
                }
                CsvTarget::Regression => {
                    let v: f32 = cell.parse().ok().filter(|v: &f32| v.is_finite()).ok_or_else(|| {
                        Error::data(
                            WHAT,
                            format!("{file}, line {line}, column {}: target `{cell}` is not a finite number", t + 1),
                        )
                    })?;
                    reg_targets.push(v);
                }
            }
            Ok(())
        };
        push(&first)?;
        for r in rows {
            push(&r.map_err(|e| row_error(&file, e))?)?;
        }
        let (targets, classes) = match opts.target_kind {
            CsvTarget::Regression => (HostBuffer::F32(reg_targets), Vec::new()),
            CsvTarget::Class => {
                let mut classes = raw_targets.clone();
                classes.sort();
                classes.dedup();
                let ids = raw_targets
                    .iter()
                    .map(|c| classes.binary_search(c).map_or(0, |i| i as i64))
                    .collect();
                (HostBuffer::I64(ids), classes)
            }
        };
        Ok(CsvDataset {
            nfeat: fcols.len(),
            features,
            targets,
            feature_names,
            classes,
        })
    }

    pub fn num_features(&self) -> usize {
        self.nfeat
    }

    /// Per-feature mean and standard deviation (population), for standardizing.
    pub fn feature_stats(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.len().max(1) as f64;
        let mut mean = vec![0f64; self.nfeat];
        let mut sq = vec![0f64; self.nfeat];
        for row in self.features.chunks(self.nfeat) {
            for (j, &v) in row.iter().enumerate() {
                mean[j] += v as f64;
                sq[j] += v as f64 * v as f64;
            }
        }
        let mean: Vec<f64> = mean.iter().map(|m| m / n).collect();
        let std = sq
            .iter()
            .zip(&mean)
            .map(|(s, m)| ((s / n - m * m).max(0.0).sqrt()) as f32)
            .collect();
        (mean.into_iter().map(|m| m as f32).collect(), std)
    }

    /// Features as `(x - mean) / std` (a zero std leaves the column centred only).
    pub fn standardize(&mut self, mean: &[f32], std: &[f32]) -> Result<()> {
        if mean.len() != self.nfeat || std.len() != self.nfeat {
            return Err(Error::config(
                WHAT,
                format!(
                    "standardize: {} features, got {} means and {} stds",
                    self.nfeat,
                    mean.len(),
                    std.len()
                ),
            ));
        }
        for row in self.features.chunks_mut(self.nfeat) {
            for (j, v) in row.iter_mut().enumerate() {
                let s = if std[j] > 0.0 { std[j] } else { 1.0 };
                *v = (*v - mean[j]) / s;
            }
        }
        Ok(())
    }
}

fn row_error(file: &str, e: csv::Error) -> Error {
    let at = e
        .position()
        .map(|p| format!(", line {}", p.line()))
        .unwrap_or_default();
    Error::data(WHAT, format!("{file}{at}: malformed row: {e}"))
}

impl Dataset for CsvDataset {
    fn len(&self) -> usize {
        self.targets.len()
    }

    fn get(&self, index: usize, _ctx: DrawContext) -> Result<Vec<HostTensor>> {
        if index >= self.len() {
            return Err(Error::data(
                WHAT,
                format!("index {index} out of range for {} rows", self.len()),
            ));
        }
        let f = self.features[index * self.nfeat..(index + 1) * self.nfeat].to_vec();
        let target = match &self.targets {
            HostBuffer::I64(v) => HostTensor::scalar(HostBuffer::I64(vec![v[index]])),
            HostBuffer::F32(v) => HostTensor {
                data: HostBuffer::F32(vec![v[index]]),
                shape: vec![1],
            },
            other => {
                return Err(Error::data(
                    WHAT,
                    format!("unexpected target dtype {}", other.dtype()),
                ))
            }
        };
        Ok(vec![
            HostTensor {
                data: HostBuffer::F32(f),
                shape: vec![self.nfeat],
            },
            target,
        ])
    }
}
