//! Shapes and strided layouts.

use crate::{Error, Result};

/// The dimensions of a tensor, outermost first.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn elem_count(&self) -> usize {
        self.0.iter().product()
    }

    /// Like `elem_count`, but an error if the product overflows (shapes from user data).
    pub fn checked_elem_count(&self, op: &'static str) -> Result<usize> {
        self.0
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::shape(op, format!("element count of {self} overflows")))
    }

    /// Row-major strides of a contiguous tensor of this shape.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        let mut strides = vec![0; self.0.len()];
        let mut acc = 1;
        for i in (0..self.0.len()).rev() {
            strides[i] = acc;
            acc *= self.0[i];
        }
        strides
    }

    /// Resolves a possibly negative axis (`-1` is the last) against this rank.
    pub fn axis(&self, op: &'static str, axis: isize) -> Result<usize> {
        let rank = self.rank() as isize;
        let a = if axis < 0 { axis + rank } else { axis };
        if a < 0 || a >= rank {
            return Err(Error::Axis {
                op,
                axis,
                rank: self.rank(),
            });
        }
        Ok(a as usize)
    }

    /// NumPy broadcasting of two shapes.
    pub fn broadcast(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
        let rank = a.rank().max(b.rank());
        let mut out = vec![0; rank];
        for (i, o) in out.iter_mut().enumerate() {
            let da = dim_from_right(a, rank - 1 - i);
            let db = dim_from_right(b, rank - 1 - i);
            *o = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => {
                    return Err(Error::shape(
                        op,
                        format!("shapes {a} and {b} do not broadcast"),
                    ))
                }
            };
        }
        Ok(Shape(out))
    }
}

fn dim_from_right(s: &Shape, from_right: usize) -> usize {
    if from_right < s.rank() {
        s.0[s.rank() - 1 - from_right]
    } else {
        1
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Shape {
        Shape(d.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Shape {
        Shape(d.to_vec())
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(d: &[usize; N]) -> Shape {
        Shape(d.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Shape {
        Shape(d)
    }
}

impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Shape {
        s.clone()
    }
}

impl From<()> for Shape {
    fn from(_: ()) -> Shape {
        Shape(vec![])
    }
}

/// Where each element of a tensor lives in its storage: element `[i0, i1, ..]` is at
/// `offset + sum(ik * strides[k])` (in elements). Strides may be 0 (broadcast dims).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Shape,
    strides: Vec<usize>,
    offset: usize,
}

impl Layout {
    pub fn contiguous(shape: impl Into<Shape>) -> Layout {
        let shape = shape.into();
        let strides = shape.contiguous_strides();
        Layout {
            shape,
            strides,
            offset: 0,
        }
    }

    pub fn new(shape: Shape, strides: Vec<usize>, offset: usize) -> Layout {
        Layout {
            shape,
            strides,
            offset,
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Row-major contiguous, ignoring the strides of size-1 dims.
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1;
        for (&d, &s) in self.shape.dims().iter().zip(&self.strides).rev() {
            if d != 1 && s != acc {
                return false;
            }
            acc *= d;
        }
        true
    }

    /// One past the largest storage index this layout touches (0 when empty).
    pub fn storage_span(&self) -> usize {
        if self.shape.elem_count() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .dims()
                .iter()
                .zip(&self.strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// A view with dims permuted: new dim `i` is old dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let rank = self.shape.rank();
        let mut seen = vec![false; rank];
        if perm.len() != rank
            || perm
                .iter()
                .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::shape(
                "permute",
                format!(
                    "{perm:?} is not a permutation of the {rank} dims of {}",
                    self.shape
                ),
            ));
        }
        let dims = perm
            .iter()
            .map(|&p| self.shape.dims()[p])
            .collect::<Vec<_>>();
        let strides = perm.iter().map(|&p| self.strides[p]).collect();
        Ok(Layout {
            shape: Shape(dims),
            strides,
            offset: self.offset,
        })
    }

    /// A view of `len` entries of dim `axis` starting at `start`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Layout> {
        let dims = self.shape.dims();
        if axis >= dims.len() {
            return Err(Error::Axis {
                op: "narrow",
                axis: axis as isize,
                rank: dims.len(),
            });
        }
        if start.checked_add(len).is_none_or(|end| end > dims[axis]) {
            return Err(Error::shape(
                "narrow",
                format!(
                    "range {start}..{} out of bounds for axis {axis} of {}",
                    start.saturating_add(len),
                    self.shape
                ),
            ));
        }
        let mut d = dims.to_vec();
        d[axis] = len;
        let offset = if len == 0 {
            self.offset
        } else {
            self.offset + start * self.strides[axis]
        };
        Ok(Layout {
            shape: Shape(d),
            strides: self.strides.clone(),
            offset,
        })
    }

    /// A view broadcast to `shape` (NumPy rules: new leading dims, size-1 dims stretched).
    pub fn broadcast_as(&self, shape: &Shape) -> Result<Layout> {
        let err = || {
            Error::shape(
                "broadcast_to",
                format!("cannot broadcast {} to {shape}", self.shape),
            )
        };
        let (src, dst) = (self.shape.dims(), shape.dims());
        if dst.len() < src.len() {
            return Err(err());
        }
        let lead = dst.len() - src.len();
        let mut strides = vec![0; dst.len()];
        for i in 0..src.len() {
            if src[i] == dst[lead + i] {
                strides[lead + i] = self.strides[i];
            } else if src[i] == 1 {
                strides[lead + i] = 0;
            } else {
                return Err(err());
            }
        }
        Ok(Layout {
            shape: shape.clone(),
            strides,
            offset: self.offset,
        })
    }

    /// A view with a new shape of the same element count, when the strides allow it without a
    /// copy; `None` when a copy is needed.
    pub fn reshape(&self, shape: &Shape) -> Option<Layout> {
        if self.is_contiguous() {
            return Some(Layout {
                shape: shape.clone(),
                strides: shape.contiguous_strides(),
                offset: self.offset,
            });
        }
        // Non-contiguous: split/merge dims within runs of dims that are contiguous w.r.t. each
        // other (as NumPy's `_attempt_nocopy_reshape`).
        let old: Vec<(usize, usize)> = self
            .shape
            .dims()
            .iter()
            .zip(&self.strides)
            .filter(|(&d, _)| d != 1)
            .map(|(&d, &s)| (d, s))
            .collect();
        let new = shape.dims();
        let mut new_strides = vec![0; new.len()];
        let (mut oi, mut ni) = (0, 0);
        while oi < old.len() && ni < new.len() {
            if new[ni] == 1 {
                new_strides[ni] = 0;
                ni += 1;
                continue;
            }
            let (oj0, nj0) = (oi, ni);
            let (mut op, mut np) = (old[oi].0, new[ni]);
            while op != np {
                if op < np {
                    oi += 1;
                    op *= old.get(oi)?.0;
                } else {
                    ni += 1;
                    np *= *new.get(ni)?;
                }
            }
            for k in oj0..oi {
                if old[k].1 != old[k + 1].0 * old[k + 1].1 {
                    return None;
                }
            }
            let mut stride = old[oi].1;
            for k in (nj0..=ni).rev() {
                new_strides[k] = stride;
                stride *= new[k];
            }
            oi += 1;
            ni += 1;
        }
        while ni < new.len() {
            if new[ni] != 1 {
                return None;
            }
            ni += 1;
        }
        if oi != old.len() {
            return None;
        }
        Some(Layout {
            shape: shape.clone(),
            strides: new_strides,
            offset: self.offset,
        })
    }

    /// Storage index of every element, in row-major order of the view.
    pub fn indices(&self) -> StridedIndex<'_> {
        StridedIndex::new(self)
    }
}

/// Iterator over the storage indices of a layout, row-major.
pub struct StridedIndex<'a> {
    layout: &'a Layout,
    pos: Vec<usize>,
    next: Option<usize>,
}

impl<'a> StridedIndex<'a> {
    fn new(layout: &'a Layout) -> Self {
        let next = if layout.shape.elem_count() == 0 {
            None
        } else {
            Some(layout.offset)
        };
        StridedIndex {
            layout,
            pos: vec![0; layout.shape.rank()],
            next,
        }
    }
}

impl Iterator for StridedIndex<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let cur = self.next?;
        let dims = self.layout.shape.dims();
        let strides = &self.layout.strides;
        let mut idx = cur;
        let mut k = dims.len();
        loop {
            if k == 0 {
                self.next = None;
                break;
            }
            k -= 1;
            if self.pos[k] + 1 < dims[k] {
                self.pos[k] += 1;
                idx += strides[k];
                self.next = Some(idx);
                break;
            }
            idx -= self.pos[k] * strides[k];
            self.pos[k] = 0;
        }
        Some(cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_shapes() {
        let s = Shape::broadcast("t", &Shape::new([3, 1, 5]), &Shape::new([4, 1])).unwrap();
        assert_eq!(s.dims(), &[3, 4, 5]);
        assert!(Shape::broadcast("t", &Shape::new([3]), &Shape::new([4])).is_err());
    }

    #[test]
    fn strided_index_of_transpose() {
        let l = Layout::contiguous([2, 3]).permute(&[1, 0]).unwrap();
        assert_eq!(l.indices().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
        assert!(!l.is_contiguous());
    }

    #[test]
    fn reshape_without_copy() {
        let l = Layout::contiguous([4, 6]).narrow(1, 0, 4).unwrap(); // [4, 4] strides [6, 1]
                                                                     // Splitting the outer dim keeps the view.
        let r = l.reshape(&Shape::new([2, 2, 4])).unwrap();
        assert_eq!(r.strides(), &[12, 6, 1]);
        // Merging across the gap needs a copy.
        assert!(l.reshape(&Shape::new([16])).is_none());
        // Transposed then flattened needs a copy; transposed with unit dims added does not.
        let t = Layout::contiguous([3, 5]).permute(&[1, 0]).unwrap();
        assert!(t.reshape(&Shape::new([15])).is_none());
        let u = t.reshape(&Shape::new([5, 1, 3])).unwrap();
        assert_eq!(
            u.indices().collect::<Vec<_>>(),
            t.indices().collect::<Vec<_>>()
        );
    }
}
