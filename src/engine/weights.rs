//! Dense weights on the GPU, read straight from the GGUF bytes. A tensor larger than the adapter's binding
//! limit is split into row ranges, each its own buffer, so no kernel ever binds more than allowed.

use crate::gguf::{SplitModel, SplitTensor};
use crate::gpu::matmul::{self, Rows};
use crate::gpu::matvec::{self, Matrix};
use crate::gpu::{Gpu, Pass};
use crate::model::layout::{role, Role};
use crate::model::Config;
use crate::quant::GgmlType;
use crate::source::RangeSource;
use crate::store::StoreChecks;
use std::collections::HashMap;

/// Rows [first_row, first_row + rows) of a tensor, in their own buffer.
pub struct Piece {
    pub buffer: wgpu::Buffer,
    pub first_row: u64,
    pub rows: u64,
}

pub struct GpuTensor {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    pub pieces: Vec<Piece>,
}

impl GpuTensor {
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }
    pub fn n_rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }
    pub fn row_bytes(&self) -> u64 {
        self.ty.bytes_for(self.dims[0]).expect("whole blocks")
    }
    /// The buffer of a tensor that was not split (vectors, per-head matrices).
    pub fn whole(&self) -> &wgpu::Buffer {
        assert_eq!(self.pieces.len(), 1, "{} is split over {} buffers", self.name, self.pieces.len());
        &self.pieces[0].buffer
    }
    /// The piece holding `row`, and the row's byte offset inside it.
    pub fn row(&self, row: u64) -> (&Piece, u64) {
        let piece = self.pieces.iter().find(|p| row >= p.first_row && row < p.first_row + p.rows).expect("row in range");
        (piece, (row - piece.first_row) * self.row_bytes())
    }
    /// y[y_at + r] = (W·x)[r] for all rows, one dispatch per piece.
    pub fn matvec(&self, gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, x_at: u32, y: &wgpu::Buffer, y_at: u32) {
        self.per_piece(|p, m| matvec::matvec(gpu, pass, &p.buffer, m, x, x_at, y, y_at + p.first_row as u32));
    }
    /// y[y_at + r] += (W·x)[r] for all rows (a residual added by the product itself), one dispatch per piece.
    pub fn matvec_add(&self, gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, x_at: u32, y: &wgpu::Buffer, y_at: u32) {
        self.per_piece(|p, m| matvec::matvec_add(gpu, pass, &p.buffer, m, x, x_at, y, y_at + p.first_row as u32));
    }
    /// Each piece with its rows as a matrix from the piece's start.
    fn per_piece(&self, mut each: impl FnMut(&Piece, Matrix)) {
        for p in &self.pieces {
            each(p, Matrix { ty: self.ty, rows: p.rows as u32, cols: self.row_len() as u32, byte_offset: 0 });
        }
    }
    /// For each of `tokens` tokens t: `y[y_at.offset + t·y_at.stride + r] = (W·x_t)[r]`, x_t at `x_at`; one
    /// dispatch per piece.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(&self, gpu: &Gpu, pass: &mut Pass, tokens: u32, x: &wgpu::Buffer, x_at: Rows, y: &wgpu::Buffer, y_at: Rows) {
        self.per_piece(|p, m| matmul::matmul(gpu, pass, &p.buffer, m, tokens, x, x_at, y, Rows::new(y_at.offset + p.first_row as u32, y_at.stride)));
    }
}

/// Every dense tensor of the trunk (and the globals) on the GPU, by name.
pub struct Weights {
    pub tensors: HashMap<String, GpuTensor>,
    pub bytes: u64,
}

impl Weights {
    pub fn get(&self, name: &str) -> Result<&GpuTensor, String> {
        self.tensors.get(name).ok_or_else(|| format!("the model has no tensor {name:?}"))
    }

    /// Uploads every non-expert trunk tensor, read from `parts`; `max_binding` is the largest buffer a kernel
    /// may bind.
    pub async fn load<S: RangeSource>(gpu: &Gpu, config: &Config, model: &SplitModel, max_binding: u64, parts: &[S], checks: Option<&StoreChecks>) -> Result<Weights, String> {
        let mut tensors = HashMap::new();
        let mut total = 0u64;
        for t in &model.tensors {
            if !matches!(role(config, &t.info.name), Role::Global | Role::Dense { .. }) {
                continue;
            }
            if !crate::gpu::dequant::gpu_readable(t.info.ty) {
                return Err(format!("tensor {}: type {} is not supported by lingtab's kernels", t.info.name, t.info.ty));
            }
            let bytes = read_tensor(parts, t).await?;
            if let Some(checks) = checks {
                checks.verify_dense(&t.info.name, &bytes).map_err(|e| format!("{}: {e}", parts[t.part].describe()))?;
            }
            let row_bytes = t.info.row_bytes();
            let n_rows = t.info.n_elements() / t.info.dims[0];
            let rows_per_piece = (max_binding / row_bytes).max(1);
            if row_bytes > max_binding {
                return Err(format!("tensor {}: one row ({row_bytes} bytes) exceeds the binding limit {max_binding}", t.info.name));
            }
            let mut pieces = Vec::new();
            let mut first = 0u64;
            while first < n_rows {
                let rows = rows_per_piece.min(n_rows - first);
                let slice = &bytes[(first * row_bytes) as usize..((first + rows) * row_bytes) as usize];
                pieces.push(Piece { buffer: gpu.upload(&t.info.name, slice), first_row: first, rows });
                first += rows;
            }
            total += bytes.len() as u64;
            tensors.insert(t.info.name.clone(), GpuTensor { name: t.info.name.clone(), ty: t.info.ty, dims: t.info.dims.clone(), pieces });
        }
        Ok(Weights { tensors, bytes: total })
    }
}

/// Reads a tensor's bytes from the part that holds it.
pub async fn read_tensor<S: RangeSource>(parts: &[S], t: &SplitTensor) -> Result<Vec<u8>, String> {
    let n = t.info.n_bytes();
    let (bytes, _) = parts[t.part].read_range(t.file_offset, n).await?;
    if bytes.len() as u64 != n {
        return Err(format!("tensor {}: read {} of {n} bytes (truncated file?)", t.info.name, bytes.len()));
    }
    Ok(bytes)
}
