//! A weight matrix packed once, at load, into the layout [`matmul`](super::matmul)
//! streams: panels of 16 rows, in f32, f16 or bf16, on 64-byte lines (a panel's 16 f32
//! weights at one position are exactly one cache line).

use candle_core::{DType, Tensor};

use super::error::{ModelError, Result};
use super::huge_pages::prefer_huge_pages;
use super::matmul::{matmul_xwt_to_vec, pack_panels, panel_len, Panels};
use super::ops::with_slice;
use super::simd::Elem;

/// One cache line of storage; a `Vec` of them is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The element type of a [`PanelMatrix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PanelType {
    F32,
    F16,
    BF16,
}

/// A `(rows, cols)` matrix in the panel layout, owned.
pub struct PanelMatrix {
    rows: usize,
    cols: usize,
    kind: PanelType,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PanelMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PanelMatrix({}, {}, {:?})", self.rows, self.cols, self.kind)
    }
}

impl PanelMatrix {
    /// A 2-D tensor, packed. f16 and bf16 stay as they are; every other type becomes f32.
    pub fn from_tensor(t: &Tensor) -> Result<Self> {
        let (rows, cols) = t.dims2()?;
        let t = t.contiguous()?;
        let packed = match t.dtype() {
            DType::F16 => with_slice::<half::f16, _>(&t, |s| Self::pack(s, rows, cols, PanelType::F16))?,
            DType::BF16 => with_slice::<half::bf16, _>(&t, |s| Self::pack(s, rows, cols, PanelType::BF16))?,
            DType::F32 => with_slice::<f32, _>(&t, |s| Self::pack(s, rows, cols, PanelType::F32))?,
            _ => {
                let t = t.to_dtype(DType::F32)?;
                with_slice::<f32, _>(&t, |s| Self::pack(s, rows, cols, PanelType::F32))?
            }
        };
        Ok(packed)
    }

    fn pack<W: Copy + Send + Sync>(values: &[W], rows: usize, cols: usize, kind: PanelType) -> Self {
        let len = panel_len(rows, cols);
        let mut lines = vec![Line([0; 64]); (len * std::mem::size_of::<W>()).div_ceil(64)];
        // Safety: the lines hold at least `len` elements of W (2 or 4 bytes, which divide
        // the lines' alignment); zero bytes are zero in every element type.
        let dst = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut W, len) };
        pack_panels(values, rows, cols, dst);
        PanelMatrix { rows, cols, kind, lines }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn kind(&self) -> PanelType {
        self.kind
    }

    /// The elements as `W`, which must be this matrix's type.
    fn panels<W: Elem>(&self) -> Panels<'_, W> {
        let len = panel_len(self.rows, self.cols);
        assert!(len * std::mem::size_of::<W>() <= self.lines.len() * 64);
        // Safety: the lines hold `len` elements of the matrix's type, which the callers
        // below name by matching on `kind`.
        let data = unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const W, len) };
        Panels::new(data, self.rows, self.cols)
    }

    /// `x · selfᵀ` for the row-major `(m, cols)` rows `x`: a row-major `(m, rows)` vector.
    pub fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        if x.len() != m * self.cols {
            return Err(ModelError::Unsupported(format!("{m} rows of {} values into {self:?}", x.len() / m.max(1))));
        }
        Ok(match self.kind {
            PanelType::F32 => matmul_xwt_to_vec(x, self.panels::<f32>(), m),
            PanelType::F16 => matmul_xwt_to_vec(x, self.panels::<half::f16>(), m),
            PanelType::BF16 => matmul_xwt_to_vec(x, self.panels::<half::bf16>(), m),
        })
    }

    /// Rows `ids`, widened to f32, one after another (an embedding lookup from a table
    /// tied to the output head).
    pub fn gather_rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.rows) {
            return Err(ModelError::Unsupported(format!("row {bad} of a {}-row table", self.rows)));
        }
        fn gather<W: Elem>(p: Panels<W>, ids: &[u32]) -> Vec<f32> {
            let cols = p.cols();
            ids.iter().flat_map(|&id| (0..cols).map(move |c| p.at(id as usize, c).to_f32())).collect()
        }
        Ok(match self.kind {
            PanelType::F32 => gather(self.panels::<f32>(), ids),
            PanelType::F16 => gather(self.panels::<half::f16>(), ids),
            PanelType::BF16 => gather(self.panels::<half::bf16>(), ids),
        })
    }

    /// Moves the matrix onto huge pages where the kernel allows; returns the bytes moved.
    pub fn prefer_huge_pages(&self) -> usize {
        prefer_huge_pages(&self.lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn packed_tensors_multiply_and_gather_like_the_tensor() {
        let (rows, cols) = (21, 37);
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 13 % 29) as f32 - 14.0) / 8.0).collect();
        let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
        let x = Tensor::from_vec(
            (0..3 * cols).map(|i| (i % 7) as f32 - 3.0).collect::<Vec<f32>>(),
            (3, cols),
            &Device::Cpu,
        )
        .unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let w = t.to_dtype(dtype).unwrap();
            let packed = PanelMatrix::from_tensor(&w).unwrap();
            let want_kind = match dtype {
                DType::F16 => PanelType::F16,
                DType::BF16 => PanelType::BF16,
                _ => PanelType::F32,
            };
            assert_eq!(packed.kind(), want_kind);
            let w32 = w.to_dtype(DType::F32).unwrap();
            let got = packed.matmul(&x.flatten_all().unwrap().to_vec1().unwrap(), 3).unwrap();
            let want: Vec<f32> = x.matmul(&w32.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "{dtype:?}: {a} vs {b}");
            }
            let ids = [20u32, 0, 7];
            let gathered = packed.gather_rows(&ids).unwrap();
            let table: Vec<Vec<f32>> = w32.to_vec2().unwrap();
            let want: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize].clone()).collect();
            assert_eq!(gathered, want, "{dtype:?}");
            assert!(packed.gather_rows(&[21]).is_err());
        }
        assert!(PanelMatrix::from_tensor(&t).unwrap().matmul(&[1.0; 5], 1).is_err());
    }
}
