//! GPU dequantisation of ggml blocks (`shaders/dequant.wgsl`): the GPU's reading of every block format,
//! checked against the CPU reference in [`crate::quant`].

use super::{Gpu, GpuError, Pass, P};
use crate::quant::GgmlType;

const SHADER: &str = include_str!("../../shaders/dequant.wgsl");

fn entry_point(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::Q4_K => "dequant_q4_k",
        GgmlType::Q6_K => "dequant_q6_k",
        GgmlType::Q5_0 => "dequant_q5_0",
        GgmlType::Q8_0 => "dequant_q8_0",
        _ => return None,
    })
}

/// Dequantises whole blocks of `ty` on the GPU. The output buffer is poisoned with NaN first, so an element
/// the kernel fails to write shows up in the result.
pub async fn dequantize(gpu: &Gpu, ty: GgmlType, blocks: &[u8]) -> Result<Vec<f32>, GpuError> {
    let entry = entry_point(ty).ok_or_else(|| GpuError(format!("no GPU dequantisation kernel for {ty}")))?;
    if blocks.len() % ty.block_bytes() != 0 {
        return Err(GpuError(format!("{} bytes are not whole {ty} blocks", blocks.len())));
    }
    let n = (blocks.len() / ty.block_bytes() * ty.block_elems()) as u32;
    let kernel = gpu.kernel("dequant.wgsl", SHADER, entry);
    let src = gpu.upload("blocks", blocks);
    let poison: Vec<u8> = std::iter::repeat_n(f32::NAN.to_le_bytes(), n as usize).flatten().collect();
    let dst = gpu.upload("dequantised", &poison);
    let mut pass = Pass::new();
    pass.dispatch(gpu, &kernel, &[&src, &dst], &[P::U(n), P::U(0)], n.div_ceil(256));
    pass.submit(gpu);
    let bytes = gpu.read_back(&dst, n as u64 * 4).await?;
    Ok(bytemuck::cast_slice::<u8, f32>(&bytes[..n as usize * 4]).to_vec())
}
