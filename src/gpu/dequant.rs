//! GPU dequantisation of ggml blocks (`shaders/dequant.wgsl`): the GPU's reading of every block format,
//! checked against the CPU reference in [`crate::quant`].

use super::{Gpu, GpuError};
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
    let device = &gpu.device;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("dequant.wgsl"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: None,
        module: &module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    });
    let src = gpu.upload("blocks", blocks);
    let poison: Vec<u8> = std::iter::repeat_n(f32::NAN.to_le_bytes(), n as usize).flatten().collect();
    let dst = gpu.upload("dequantised", &poison);
    let params = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    gpu.queue.write_buffer(&params, 0, bytemuck::cast_slice(&[n, 0, 0, 0]));
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: src.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: dst.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 2, resource: params.as_entire_binding() },
        ],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        let (x, y) = gpu.grid(n.div_ceil(256));
        pass.dispatch_workgroups(x, y, 1);
    }
    gpu.queue.submit([encoder.finish()]);
    let bytes = gpu.read_back(&dst, n as u64 * 4).await?;
    Ok(bytemuck::cast_slice::<u8, f32>(&bytes[..n as usize * 4]).to_vec())
}
