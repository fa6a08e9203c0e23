//! Matrix-vector products over ggml rows (`shaders/matvec.wgsl`): dense, batched with strides (one matrix
//! per head), and over the experts the router selected, read from their slots of the expert pool.

use super::{Gpu, Pass, P};
use crate::quant::GgmlType;
use std::sync::OnceLock;

const QUANT: &str = include_str!("../../shaders/quant.wgsl");
const MATVEC: &str = include_str!("../../shaders/matvec.wgsl");
const EXPERTS: &str = include_str!("../../shaders/matvec_experts.wgsl");
const DENSE_MARKER: &str = "// ---- dense entry point";

fn dense_source() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| format!("{QUANT}{MATVEC}"))
}

fn experts_source() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| {
        let core = &MATVEC[..MATVEC.find(DENSE_MARKER).expect("matvec.wgsl has the dense-entry marker")];
        format!("{QUANT}{core}{EXPERTS}")
    })
}

/// A matrix of `rows` rows of `cols` values of type `ty`, starting at `byte_offset` of its buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matrix {
    pub ty: GgmlType,
    pub rows: u32,
    pub cols: u32,
    pub byte_offset: u64,
}

impl Matrix {
    pub fn row_bytes(&self) -> u32 {
        self.ty.bytes_for(self.cols as u64).expect("rows are whole blocks") as u32
    }
}

/// Where a batch's vectors sit: element offset of batch 0 and the stride between batches.
#[derive(Clone, Copy, Debug, Default)]
pub struct Strided {
    pub offset: u32,
    pub stride: u32,
}

impl Strided {
    pub fn at(offset: u32) -> Strided {
        Strided { offset, stride: 0 }
    }
}

/// y[y.offset + r] = Σ_i W[r, i]·x[x.offset + i] for every row r.
pub fn matvec(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, x: &wgpu::Buffer, x_at: u32, y: &wgpu::Buffer, y_at: u32) {
    batched(gpu, pass, w, m, 0, x, Strided::at(x_at), y, Strided::at(y_at), 1);
}

/// `n` products: matrix b at `m.byte_offset + b·w_stride` bytes, its x and y at their strided offsets.
#[allow(clippy::too_many_arguments)]
pub fn batched(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, w_stride: u64, x: &wgpu::Buffer, x_at: Strided, y: &wgpu::Buffer, y_at: Strided, n: u32) {
    assert!(m.cols % 32 == 0, "matvec rows must be whole 32-value sub-blocks");
    let kernel = gpu.kernel("matvec.wgsl", dense_source(), "matvec");
    let params = params(m, m.byte_offset, w_stride, x_at, y_at, [0, 0, 1, 0]);
    let (gx, gy) = gpu.grid(workgroups(m));
    pass.dispatch_3d(gpu, &kernel, &[w, x, y], &params, (gx, gy, n));
}

/// The expert pool as the expert kernels see one of its buffers.
#[derive(Clone, Copy, Debug)]
pub struct PoolChunk<'a> {
    pub buffer: &'a wgpu::Buffer,
    /// Index of this buffer among the pool's buffers.
    pub index: u32,
    pub slots_per_chunk: u32,
    pub slot_bytes: u64,
}

/// For each of the `k` selected experts j (`sel[j]`, looked up in `slots[slot_base + ·]`): a product with the
/// matrix `m` found `m.byte_offset` bytes into the expert's slot, x at `x_at` + j·stride, y likewise.
/// Only experts whose slot lies in `chunk` are computed; call once per pool buffer.
#[allow(clippy::too_many_arguments)]
pub fn experts(gpu: &Gpu, pass: &mut Pass, chunk: PoolChunk, m: Matrix, sel: &wgpu::Buffer, slots: &wgpu::Buffer, slot_base: u32, k: u32, x: &wgpu::Buffer, x_at: Strided, y: &wgpu::Buffer, y_at: Strided) {
    assert!(m.cols % 32 == 0, "matvec rows must be whole 32-value sub-blocks");
    let kernel = gpu.kernel("matvec_experts.wgsl", experts_source(), "matvec_experts");
    let params = params(m, m.byte_offset, 0, x_at, y_at, [chunk.slot_bytes as u32, slot_base, chunk.slots_per_chunk, chunk.index]);
    let (gx, gy) = gpu.grid(workgroups(m));
    pass.dispatch_3d(gpu, &kernel, &[chunk.buffer, x, y, sel, slots], &params, (gx, gy, k));
}

/// Invocations per row: about one per 32-value sub-block, a power of two, at most the workgroup (64).
fn lanes(m: Matrix) -> u32 {
    (m.cols / 32).clamp(1, 64).next_power_of_two().min(64)
}

fn workgroups(m: Matrix) -> u32 {
    m.rows.div_ceil(64 / lanes(m))
}

fn params(m: Matrix, w_offset: u64, w_stride: u64, x_at: Strided, y_at: Strided, experts: [u32; 4]) -> Vec<P> {
    assert!(w_offset < u32::MAX as u64 && w_stride < u32::MAX as u64, "one binding is at most 4 GiB");
    // the Q4_K and Q6_K paths read whole words: Q4_K rows must start on a word, Q6_K rows on an even byte
    let align = match m.ty {
        GgmlType::Q4_K => 4,
        GgmlType::Q6_K => 2,
        _ => 1,
    };
    let slot_bytes = experts[0] as u64;
    assert!(w_offset % align == 0 && w_stride % align == 0 && slot_bytes % align == 0, "{:?} rows must start {align}-byte aligned", m.ty);
    let mut p = vec![
        P::U(m.rows),
        P::U(m.cols),
        P::U(m.row_bytes()),
        P::U(m.ty.id()),
        P::U(w_offset as u32),
        P::U(w_stride as u32),
        P::U(x_at.offset),
        P::U(x_at.stride),
        P::U(y_at.offset),
        P::U(y_at.stride),
    ];
    p.extend(experts.iter().map(|&v| P::U(v)));
    p.push(P::U(lanes(m)));
    p
}
