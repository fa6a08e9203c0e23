//! GPU dequantisation of ggml rows (`shaders/dequant.wgsl` over `shaders/quant.wgsl`): embedding lookups, and
//! the GPU's reading of every block format, checked against the CPU reference in [`crate::quant`].

use super::{Gpu, GpuError, Pass, P};
use crate::quant::GgmlType;

pub(crate) const SHADER: &str = concat!(include_str!("../../shaders/quant.wgsl"), include_str!("../../shaders/dequant.wgsl"));

/// The ggml types the GPU kernels read.
pub fn gpu_readable(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q5_0 | GgmlType::Q8_0)
}

/// Records the dequantisation of `n` values of type `ty` starting at `byte_offset` of `weights` into
/// `dst[dst_offset..]` (an embedding row lookup is one such call).
#[allow(clippy::too_many_arguments)]
pub fn record(gpu: &Gpu, pass: &mut Pass, weights: &wgpu::Buffer, ty: GgmlType, byte_offset: u64, n: u32, dst: &wgpu::Buffer, dst_offset: u32) {
    let kernel = gpu.kernel("dequant.wgsl", SHADER, "dequant");
    pass.dispatch(gpu, &kernel, &[weights, dst], &[P::U(n), P::U(byte_offset as u32), P::U(ty.id()), P::U(dst_offset)], n.div_ceil(256));
}

/// The embedding rows of `tokens` token ids (`ids`, u32) that lie in `weights`, a piece of a tensor holding rows
/// `first_row .. first_row + rows` of `row_bytes` bytes: token t's row of `n` values lands in
/// `dst[dst_offset + t·n ..]`. Call once per piece; each token is written by the piece that has its row.
#[allow(clippy::too_many_arguments)]
pub fn record_rows(gpu: &Gpu, pass: &mut Pass, weights: &wgpu::Buffer, ty: GgmlType, row_bytes: u64, first_row: u64, rows: u64, ids: &wgpu::Buffer, tokens: u32, n: u32, dst: &wgpu::Buffer, dst_offset: u32) {
    let kernel = gpu.kernel("dequant.wgsl", SHADER, "dequant_rows");
    let params = [P::U(n), P::U(row_bytes as u32), P::U(ty.id()), P::U(dst_offset), P::U(first_row as u32), P::U(rows as u32), P::U(tokens)];
    let (x, y) = gpu.grid(n.div_ceil(256));
    pass.dispatch_3d(gpu, &kernel, &[weights, dst, ids], &params, (x, y, tokens));
}

/// Dequantises whole blocks of `ty` on the GPU. The output buffer is poisoned with NaN first, so an element
/// the kernel fails to write shows up in the result.
pub async fn dequantize(gpu: &Gpu, ty: GgmlType, blocks: &[u8]) -> Result<Vec<f32>, GpuError> {
    if !gpu_readable(ty) {
        return Err(GpuError(format!("no GPU kernel reads {ty}")));
    }
    if blocks.len() % ty.block_bytes() != 0 {
        return Err(GpuError(format!("{} bytes are not whole {ty} blocks", blocks.len())));
    }
    let n = (blocks.len() / ty.block_bytes() * ty.block_elems()) as u32;
    let src = gpu.upload("blocks", blocks);
    let poison: Vec<u8> = std::iter::repeat_n(f32::NAN.to_le_bytes(), n as usize).flatten().collect();
    let dst = gpu.upload("dequantised", &poison);
    let mut pass = Pass::new();
    record(gpu, &mut pass, &src, ty, 0, n, &dst, 0);
    pass.submit(gpu);
    let bytes = gpu.read_back(&dst, n as u64 * 4).await?;
    Ok(bytemuck::pod_collect_to_vec(&bytes[..n as usize * 4]))
}
