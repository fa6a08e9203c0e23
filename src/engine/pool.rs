//! The expert pool: GPU slots holding one routed expert each (its gate, up and down rows, one record), and
//! the table that maps (layer, expert) to a slot. The expert kernels only ever read "slot s of the pool";
//! filling slots is the cache's business (here: every expert resident).

use super::weights::read_tensor;
use crate::gguf::SplitModel;
use crate::source::RangeSource;
use crate::gpu::matvec::{Matrix, PoolChunk};
use crate::gpu::Gpu;
use crate::model::layout::EXPERT_TENSORS;
use crate::model::Config;
use crate::quant::GgmlType;

/// Where an expert's three matrices sit inside its record (byte offsets) and their types.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecordLayout {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    pub bytes: u64,
}

impl RecordLayout {
    /// gate rows, then up rows, then down rows; the types come from the layer's tensors.
    pub fn new(config: &Config, gate_ty: GgmlType, up_ty: GgmlType, down_ty: GgmlType) -> RecordLayout {
        let (h, f) = (config.hidden as u32, config.ff_expert as u32);
        let gate = Matrix { ty: gate_ty, rows: f, cols: h, byte_offset: 0 };
        let up = Matrix { ty: up_ty, rows: f, cols: h, byte_offset: f as u64 * gate.row_bytes() as u64 };
        let down = Matrix { ty: down_ty, rows: h, cols: f, byte_offset: up.byte_offset + f as u64 * up.row_bytes() as u64 };
        let bytes = down.byte_offset + h as u64 * down.row_bytes() as u64;
        RecordLayout { gate, up, down, bytes }
    }
    /// True when gate and up can run as one product of 2F rows (same type, adjacent).
    pub fn gate_up_fused(&self) -> Option<Matrix> {
        (self.gate.ty == self.up.ty).then_some(Matrix { rows: self.gate.rows * 2, ..self.gate })
    }
}

pub struct ExpertPool {
    pub chunks: Vec<wgpu::Buffer>,
    pub slots_per_chunk: u32,
    pub slot_bytes: u64,
    pub n_slots: u32,
    /// slot of (layer, expert) at `layer · n_expert + expert`; u32::MAX when not resident
    pub table: wgpu::Buffer,
    /// record layout of each trunk layer (None for dense layers)
    pub layouts: Vec<Option<RecordLayout>>,
    pub n_expert: u32,
}

impl ExpertPool {
    pub fn chunk(&self, i: usize) -> PoolChunk<'_> {
        PoolChunk { buffer: &self.chunks[i], index: i as u32, slots_per_chunk: self.slots_per_chunk, slot_bytes: self.slot_bytes }
    }

    /// A pool that holds every expert of every MoE layer, filled from the model.
    pub async fn load_resident<S: RangeSource>(gpu: &Gpu, config: &Config, model: &SplitModel, max_binding: u64, parts: &[S]) -> Result<ExpertPool, String> {
        let n_expert = config.n_expert as u32;
        let mut layouts = vec![None; config.n_layer];
        let mut stacks = Vec::new();
        for l in config.moe_layers() {
            let find = |suffix: &str| {
                let name = format!("blk.{l}.{suffix}");
                model.tensor(&name).ok_or_else(|| format!("the model has no tensor {name:?}"))
            };
            let [g, u, d] = [find(EXPERT_TENSORS[0])?, find(EXPERT_TENSORS[1])?, find(EXPERT_TENSORS[2])?];
            for t in [g, u, d] {
                if !crate::gpu::dequant::gpu_readable(t.info.ty) || t.info.dims.len() != 3 || t.info.dims[2] != n_expert as u64 {
                    return Err(format!("tensor {}: expected {} experts of a supported type, got {:?} {}", t.info.name, n_expert, t.info.dims, t.info.ty));
                }
            }
            layouts[l] = Some(RecordLayout::new(config, g.info.ty, u.info.ty, d.info.ty));
            stacks.push((l, [g, u, d]));
        }
        // one slot size for every layer (the largest record), aligned so records start on word boundaries
        let slot_bytes = layouts.iter().flatten().map(|r| r.bytes).max().unwrap_or(4).next_multiple_of(256);
        let n_slots = (stacks.len() as u64 * n_expert as u64) as u32;
        let max_chunk = max_binding.min(gpu.device.limits().max_buffer_size);
        if slot_bytes > max_chunk {
            return Err(format!("one expert record ({slot_bytes} bytes) is larger than the binding limit {max_chunk}"));
        }
        let slots_per_chunk = ((max_chunk / slot_bytes) as u32).min(n_slots.max(1));
        let n_chunks = n_slots.div_ceil(slots_per_chunk).max(1);
        let chunks: Vec<wgpu::Buffer> = (0..n_chunks)
            .map(|c| {
                let slots = slots_per_chunk.min(n_slots - c * slots_per_chunk).max(1);
                gpu.storage_buffer("expert pool", slots as u64 * slot_bytes)
            })
            .collect();
        let mut table = vec![u32::MAX; config.n_layer * n_expert as usize];
        let mut slot = 0u32;
        for (l, tensors) in &stacks {
            let layout = layouts[*l].unwrap();
            let offsets = [layout.gate.byte_offset, layout.up.byte_offset, layout.down.byte_offset];
            let data = [read_tensor(parts, tensors[0]).await?, read_tensor(parts, tensors[1]).await?, read_tensor(parts, tensors[2]).await?];
            for e in 0..n_expert {
                let (chunk, within) = ((slot / slots_per_chunk) as usize, (slot % slots_per_chunk) as u64 * slot_bytes);
                for (bytes, part) in data.iter().zip(offsets) {
                    let per_expert = bytes.len() / n_expert as usize;
                    let mut record_part = bytes[e as usize * per_expert..(e as usize + 1) * per_expert].to_vec();
                    record_part.resize(per_expert.next_multiple_of(4), 0);
                    gpu.queue.write_buffer(&chunks[chunk], within + part, &record_part);
                }
                table[*l * n_expert as usize + e as usize] = slot;
                slot += 1;
            }
        }
        let table = gpu.upload("expert slot table", bytemuck::cast_slice(&table));
        Ok(ExpertPool { chunks, slots_per_chunk, slot_bytes, n_slots, table, layouts, n_expert })
    }
}
