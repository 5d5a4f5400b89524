//! Quantized matrices on the device: a `rows x cols` weight's GGUF block bytes in one buffer
//! (16-byte aligned, 16 bytes of slack for the kernels' aligned loads), as they are in the
//! file or with each row's blocks rearranged for the register kernels (`split_rows`); formats
//! without a kernel (Q2_K, Q3_K) as f16. The products over them are `matvec`'s.

use std::borrow::Cow;

use ferrite_core::{Error, Result};
use ferrite_gguf::GgmlType;

use crate::{Buffer, CudaDevice};

/// Weight formats with a GPU kernel (`FMT_*` in quant.cuh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Fmt {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    Q4_0 = 3,
    Q4_1 = 4,
    Q5_0 = 5,
    Q5_1 = 6,
    Q8_0 = 7,
    Q4_K = 8,
    Q5_K = 9,
    Q6_K = 10,
    /// Not a file format: Q4_K rows converted for the prefill's int8 tensor-core products
    /// (`FMT_Q4_KU` in quant.cuh, `GpuMatrix::q4k_units_view`).
    Q4_KU = 11,
    /// Not a file format: Q6_K rows converted for the same products (`FMT_Q6_KU`,
    /// `GpuMatrix::k_units_view`).
    Q6_KU = 12,
}

impl Fmt {
    /// The kernel format of a GGUF type, if there is one.
    pub fn of(ty: GgmlType) -> Option<Fmt> {
        Some(match ty {
            GgmlType::F32 => Fmt::F32,
            GgmlType::F16 => Fmt::F16,
            GgmlType::BF16 => Fmt::BF16,
            GgmlType::Q4_0 => Fmt::Q4_0,
            GgmlType::Q4_1 => Fmt::Q4_1,
            GgmlType::Q5_0 => Fmt::Q5_0,
            GgmlType::Q5_1 => Fmt::Q5_1,
            GgmlType::Q8_0 => Fmt::Q8_0,
            GgmlType::Q4_K => Fmt::Q4_K,
            GgmlType::Q5_K => Fmt::Q5_K,
            GgmlType::Q6_K => Fmt::Q6_K,
            _ => return None,
        })
    }

    /// Elements per block as the kernels read them (F32/F16/BF16: pseudo-blocks of 32).
    pub fn block_elems(self) -> usize {
        match self {
            Fmt::Q4_K | Fmt::Q5_K | Fmt::Q6_K => 256,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Fmt::F32 => 128,
            Fmt::F16 | Fmt::BF16 => 64,
            Fmt::Q4_0 => 18,
            Fmt::Q4_1 => 20,
            Fmt::Q5_0 => 22,
            Fmt::Q5_1 => 24,
            Fmt::Q8_0 => 34,
            Fmt::Q4_K => 144,
            Fmt::Q5_K => 176,
            Fmt::Q6_K => 210,
            Fmt::Q4_KU => 24,
            Fmt::Q6_KU => 40,
        }
    }

    /// Whether this is a kernel-only format of 32-element units converted from a K-quant
    /// (`Q4_KU`, `Q6_KU`).
    pub fn is_units(self) -> bool {
        matches!(self, Fmt::Q4_KU | Fmt::Q6_KU)
    }

    pub fn code(self) -> u32 {
        self as u32
    }
}

/// A `rows x cols` weight matrix on the device (row r: `row_bytes` bytes from byte
/// r * row_bytes), in GGUF block layout or, where `split`, each row's blocks rearranged so
/// that the decode products load them straight into registers (`split_rows`).
pub struct GpuMatrix {
    pub fmt: Fmt,
    /// The type in the file (differs from `fmt` where the weights were converted to f16).
    pub file_type: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// Rows read by the register kernels (`mvr*` in matvec.cu): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
    /// and Q6_K rearranged by `split_rows` (`FMT_SPLIT` in quant.cuh); Q4_K as in the file (its
    /// 144-byte blocks are 16-byte aligned already).
    pub split: bool,
    buf: Buffer,
}

/// Where the split layout takes each region of a row from a block of `fmt`: the byte ranges
/// of the block's quants, of its `qh` word (Q5_0, Q5_1; empty elsewhere) and of its scale
/// fields (d, or d and m; Q6_K: d), for the formats that have a split layout.
pub fn split_fields(fmt: Fmt) -> Option<[std::ops::Range<usize>; 3]> {
    Some(match fmt {
        Fmt::Q4_0 => [2..18, 0..0, 0..2],
        Fmt::Q4_1 => [4..20, 0..0, 0..4],
        Fmt::Q5_0 => [6..22, 2..6, 0..2],
        Fmt::Q5_1 => [8..24, 4..8, 0..4],
        Fmt::Q8_0 => [2..34, 0..0, 0..2],
        // ql, qh and scales stay together (208 bytes); d apart
        Fmt::Q6_K => [0..208, 0..0, 208..210],
        _ => return None,
    })
}

/// Rows of `n` blocks of `fmt` (GGUF bytes, `data`) in the split layout: each row as
/// [quants of every block][qh of every block (Q5_0, Q5_1)][scale fields of every block], each
/// field's bytes as in the block (`split_fields`).
pub fn split_rows(fmt: Fmt, n: usize, data: &[u8]) -> Option<Vec<u8>> {
    use rayon::prelude::*;
    let fields = split_fields(fmt)?;
    let ts = fmt.block_bytes();
    let row_bytes = n * ts;
    if row_bytes == 0 || !data.len().is_multiple_of(row_bytes) {
        return None;
    }
    let mut out = vec![0u8; data.len()];
    out.par_chunks_mut(row_bytes)
        .zip(data.par_chunks(row_bytes))
        .for_each(|(dst, src)| {
            let mut start = 0;
            for f in &fields {
                let len = f.len();
                for (b, blk) in src.chunks_exact(ts).enumerate() {
                    dst[start + b * len..start + (b + 1) * len].copy_from_slice(&blk[f.clone()]);
                }
                start += n * len;
            }
        });
    Some(out)
}

impl GpuMatrix {
    /// Bytes a `rows x cols` matrix of `ty` takes on the device (after any conversion).
    pub fn device_bytes(ty: GgmlType, rows: usize, cols: usize) -> usize {
        let f = Fmt::of(ty).unwrap_or(Fmt::F16);
        rows * (cols / f.block_elems()) * f.block_bytes() + 16
    }

    /// Whether rows of `cols` elements of `ty` can be read by the register kernels: Q4_K, or a
    /// format with a split layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K) in rows of a multiple
    /// of 16 bytes.
    pub fn splittable(ty: GgmlType, cols: usize) -> bool {
        Fmt::of(ty).is_some_and(|f| {
            (split_fields(f).is_some() || f == Fmt::Q4_K)
                && cols.is_multiple_of(f.block_elems())
                && (cols / f.block_elems() * f.block_bytes()).is_multiple_of(16)
        })
    }

    /// Uploads `data` (`rows x cols` of `ty`, GGUF block bytes) in GGUF layout. Types without a
    /// GPU kernel (Q2_K, Q3_K) are dequantized and stored as f16 (`GpuModel::load` prints a
    /// notice).
    pub fn upload(
        dev: &CudaDevice,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<GpuMatrix> {
        Self::upload_with(dev, name, ty, rows, cols, data, false)
    }

    /// `upload`, in the split layout if `split` (which needs `splittable(ty, cols)`).
    pub fn upload_with(
        dev: &CudaDevice,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
        split: bool,
    ) -> Result<GpuMatrix> {
        if split && !Self::splittable(ty, cols) {
            return Err(Error::backend(
                "GpuMatrix::upload",
                format!("tensor {name}: rows of {cols} {ty} elements have no split layout"),
            ));
        }
        if rows == 0 || cols == 0 || !cols.is_multiple_of(32) {
            return Err(Error::backend("GpuMatrix::upload", format!(
                "tensor {name}: {rows} rows of {cols} elements; the GPU kernels need rows of a multiple of 32 elements"
            )));
        }
        let (fmt, bytes): (Fmt, Cow<'_, [u8]>) = match Fmt::of(ty) {
            Some(f) => (f, Cow::Borrowed(data)),
            None => {
                let v = ferrite_gguf::quant::dequantize_to_vec(ty, data).map_err(|e| {
                    Error::backend("GpuMatrix::upload", format!("tensor {name}: {e}"))
                })?;
                let b: Vec<u8> = v
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect();
                (Fmt::F16, Cow::Owned(b))
            }
        };
        if !cols.is_multiple_of(fmt.block_elems()) {
            return Err(Error::backend(
                "GpuMatrix::upload",
                format!("tensor {name}: rows of {cols} elements are not whole {ty} blocks"),
            ));
        }
        let row_bytes = cols / fmt.block_elems() * fmt.block_bytes();
        if Some(bytes.len()) != rows.checked_mul(row_bytes) {
            return Err(Error::backend(
                "GpuMatrix::upload",
                format!(
                    "tensor {name}: {rows}x{cols} {ty} needs {} bytes, found {}",
                    rows.saturating_mul(row_bytes),
                    bytes.len()
                ),
            ));
        }
        if u32::try_from(rows).is_err() || u32::try_from(row_bytes).is_err() {
            return Err(Error::backend(
                "GpuMatrix::upload",
                format!("tensor {name}: {rows}x{cols} is too large for the GPU kernels"),
            ));
        }
        // Q4_K: read as in the file
        let bytes = match split && split_fields(fmt).is_some() {
            true => Cow::Owned(
                split_rows(fmt, cols / fmt.block_elems(), &bytes).ok_or_else(|| {
                    Error::backend(
                        "GpuMatrix::upload",
                        format!("tensor {name}: cannot split its rows"),
                    )
                })?,
            ),
            false => bytes,
        };
        let buf = dev.alloc_bytes(bytes.len() + 16, "llm weights")?;
        dev.write_bytes(&buf, 0, &bytes)?;
        Ok(GpuMatrix {
            fmt,
            file_type: ty,
            rows,
            cols,
            row_bytes,
            split,
            buf,
        })
    }

    /// The format code the kernels take (`FMT_*`, with `FMT_SPLIT` for rearranged rows).
    pub fn kernel_fmt(&self) -> u32 {
        let rearranged = self.split && (split_fields(self.fmt).is_some() || self.fmt.is_units());
        self.fmt.code() | if rearranged { 16 } else { 0 }
    }

    /// Bytes of the weights (what one product reads).
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    pub fn buffer(&self) -> &Buffer {
        &self.buf
    }

    /// This Q4_K or Q6_K matrix's shape over `buf`, which holds (or will hold) its rows as
    /// `Q4_KU` or `Q6_KU` units (the prefill's `pf_q4k_units` / `pf_q6k_units` write them).
    /// None for another format or a `buf` too small.
    pub fn k_units_view(&self, buf: Buffer) -> Option<GpuMatrix> {
        let fmt = match self.fmt {
            Fmt::Q4_K => Fmt::Q4_KU,
            Fmt::Q6_K => Fmt::Q6_KU,
            _ => return None,
        };
        self.view_as(fmt, self.cols / 32 * fmt.block_bytes(), buf)
    }

    /// Row bytes of this matrix's split copy (`split_view`): its rows padded to 16 bytes, so
    /// that every row of the copy starts 16-byte aligned.
    pub fn split_row_bytes(&self) -> usize {
        self.row_bytes.next_multiple_of(16)
    }

    /// This matrix's shape and format over `buf`, which holds (or will hold) its rows in the
    /// split layout (`split_rows`), `split_row_bytes` apart (the prefill's `pf_split` writes
    /// it). None where the format has no split layout or `buf` is too small.
    pub fn split_view(&self, buf: Buffer) -> Option<GpuMatrix> {
        split_fields(self.fmt)?;
        self.view_as(self.fmt, self.split_row_bytes(), buf)
    }

    /// This matrix's shape as split rows of `fmt`, `row_bytes` apart, over `buf` (None if
    /// `buf` is too small).
    fn view_as(&self, fmt: Fmt, row_bytes: usize, buf: Buffer) -> Option<GpuMatrix> {
        (buf.bytes() >= self.rows * row_bytes).then(|| GpuMatrix {
            fmt,
            file_type: self.file_type,
            rows: self.rows,
            cols: self.cols,
            row_bytes,
            split: true,
            buf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of every block lands where quant.cuh's `sp_load` / `q6s_load` read it.
    #[test]
    fn split_rows_places_every_field() {
        for fmt in [
            Fmt::Q4_0,
            Fmt::Q4_1,
            Fmt::Q5_0,
            Fmt::Q5_1,
            Fmt::Q8_0,
            Fmt::Q6_K,
        ] {
            let [q, qh, h] = split_fields(fmt).unwrap();
            let ts = fmt.block_bytes();
            assert_eq!(q.len() + qh.len() + h.len(), ts, "{fmt:?}");
            let (rows, n) = (3, 8);
            let data: Vec<u8> = (0..rows * n * ts).map(|i| (i * 7 % 251) as u8).collect();
            let out = split_rows(fmt, n, &data).unwrap();
            assert_eq!(out.len(), data.len());
            let (ql, qhl, hl) = (q.len(), qh.len(), h.len());
            for r in 0..rows {
                let row = &out[r * n * ts..(r + 1) * n * ts];
                for b in 0..n {
                    let blk = &data[(r * n + b) * ts..(r * n + b + 1) * ts];
                    assert_eq!(
                        &row[b * ql..(b + 1) * ql],
                        &blk[q.clone()],
                        "{fmt:?} quants"
                    );
                    let qs = n * ql + b * qhl;
                    assert_eq!(&row[qs..qs + qhl], &blk[qh.clone()], "{fmt:?} qh");
                    let hs = n * (ql + qhl) + b * hl;
                    assert_eq!(&row[hs..hs + hl], &blk[h.clone()], "{fmt:?} scales");
                }
            }
        }
        // Q6_K: ql, qh and scales of block 1 follow block 0's 208 bytes; d of block 1 at
        // n * 208 + 2.
        let data: Vec<u8> = (0..2 * 210).map(|i| (i % 256) as u8).collect();
        let out = split_rows(Fmt::Q6_K, 2, &data).unwrap();
        assert_eq!(&out[208..416], &data[210..418]);
        assert_eq!(&out[418..420], &data[418..420]);
        assert_eq!(&out[416..418], &data[208..210]);
        assert!(split_rows(Fmt::Q4_K, 1, &[0; 144]).is_none());
        assert!(split_rows(Fmt::Q4_0, 8, &[0; 100]).is_none());
    }

    #[test]
    fn splittable_needs_a_format_and_16_byte_rows() {
        assert!(GpuMatrix::splittable(GgmlType::Q4_0, 4096));
        assert!(GpuMatrix::splittable(GgmlType::Q8_0, 512));
        assert!(!GpuMatrix::splittable(GgmlType::Q8_0, 576)); // 18 blocks of 34 bytes
        assert!(!GpuMatrix::splittable(GgmlType::Q4_1, 576)); // 360 bytes
        assert!(GpuMatrix::splittable(GgmlType::Q4_K, 4096));
        assert!(GpuMatrix::splittable(GgmlType::Q6_K, 4096)); // 16 x 210 bytes
        assert!(!GpuMatrix::splittable(GgmlType::Q6_K, 768)); // 3 x 210 bytes
        assert!(!GpuMatrix::splittable(GgmlType::Q5_K, 4096));
        assert!(!GpuMatrix::splittable(GgmlType::F16, 4096));
    }
}
