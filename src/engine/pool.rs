//! The expert pool: GPU slots holding one routed expert each (its gate, up and down rows, one record), and
//! the table that maps (layer, expert) to a slot. The expert kernels only ever read "slot s of the pool";
//! which expert sits where is the cache's business ([`super::cache`]). The pool is split over several
//! buffers so no kernel binds more than the adapter allows.

use crate::gguf::SplitModel;
use crate::gpu::matvec::{Matrix, PoolChunk};
use crate::gpu::Gpu;
use crate::model::layout::EXPERT_TENSORS;
use crate::model::Config;
use crate::quant::GgmlType;
use crate::source::RangeSource;
use crate::store::StoreChecks;
use futures_util::future::LocalBoxFuture;

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

/// The routed-expert tensors of every MoE layer: their record layouts and where each expert's rows are.
#[derive(Clone, Debug)]
pub struct ExpertTensors {
    pub n_expert: u32,
    /// per trunk layer; None for dense layers
    pub layouts: Vec<Option<RecordLayout>>,
    /// per trunk layer: (part, file offset of expert 0, bytes per expert) of gate, up and down
    ranges: Vec<Option<[(usize, u64, u64); 3]>>,
    /// per trunk layer: whether its shared expert can ride with its routed experts (a slot of the pool, one batch
    /// more of their products): its three matrices have the routed experts' shapes and types, and whole words
    pub shared_rides: Vec<bool>,
}

impl ExpertTensors {
    pub fn of(config: &Config, model: &SplitModel) -> Result<ExpertTensors, String> {
        let n_expert = config.n_expert as u32;
        let mut layouts = vec![None; config.n_layer];
        let mut ranges = vec![None; config.n_layer];
        let mut shared_rides = vec![false; config.n_layer];
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
            let layout = RecordLayout::new(config, g.info.ty, u.info.ty, d.info.ty);
            let per = |t: &crate::gguf::SplitTensor| (t.part, t.file_offset, t.info.n_bytes() / n_expert as u64);
            let r = [per(g), per(u), per(d)];
            if r[0].2 + r[1].2 + r[2].2 != layout.bytes {
                return Err(format!("layer {l}: expert tensors of {} bytes per expert, expected {}", r[0].2 + r[1].2 + r[2].2, layout.bytes));
            }
            layouts[l] = Some(layout);
            ranges[l] = Some(r);
            shared_rides[l] = shared_fits(config, model, l, &layout);
        }
        Ok(ExpertTensors { n_expert, layouts, ranges, shared_rides })
    }

    /// Layers whose shared expert rides with the routed ones.
    pub fn riding_layers(&self) -> impl Iterator<Item = usize> + '_ {
        self.shared_rides.iter().enumerate().filter(|(_, &r)| r).map(|(l, _)| l)
    }

    /// No shared expert rides (each runs as products of its own).
    pub fn without_riders(mut self) -> ExpertTensors {
        self.shared_rides.iter_mut().for_each(|r| *r = false);
        self
    }

    /// One slot size for every layer: the largest record, rounded so records start on word boundaries.
    pub fn slot_bytes(&self) -> u64 {
        self.layouts.iter().flatten().map(|r| r.bytes).max().unwrap_or(4).next_multiple_of(256)
    }

    pub fn moe_layers(&self) -> impl Iterator<Item = usize> + '_ {
        self.layouts.iter().enumerate().filter(|(_, l)| l.is_some()).map(|(i, _)| i)
    }

    /// Experts of every MoE layer together.
    pub fn total(&self) -> u64 {
        self.moe_layers().count() as u64 * self.n_expert as u64
    }
}

/// The shared expert tensors of an MoE layer, in a record's order.
pub const SHARED_TENSORS: [&str; 3] = ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"];

/// Whether layer `l`'s shared expert fits a slot laid out as its routed experts' records: the same types and
/// shapes (a shared FFN as wide as an expert), whole words at every offset (it is copied into the slot on the
/// GPU), rows the down product takes as a SwiGLU's ([`crate::gpu::matvec::GLU_MAX_COLS`]: the clamp is per batch
/// there) and a hidden size the decode step's fused sum takes ([`crate::gpu::norm::SUM_NORM_MAX`]).
fn shared_fits(config: &Config, model: &SplitModel, l: usize, layout: &RecordLayout) -> bool {
    if config.ff_shared != config.ff_expert || config.ff_expert as u32 > crate::gpu::matvec::GLU_MAX_COLS || config.hidden as u32 > crate::gpu::norm::SUM_NORM_MAX {
        return false;
    }
    SHARED_TENSORS.iter().zip([layout.gate, layout.up, layout.down]).all(|(name, m)| {
        model.tensor(&format!("blk.{l}.{name}")).is_some_and(|t| {
            let bytes = m.rows as u64 * m.row_bytes() as u64;
            t.info.ty == m.ty && t.info.dims.len() == 2 && t.info.dims[0] == m.cols as u64 && t.info.dims[1] == m.rows as u64 && bytes % 4 == 0 && m.byte_offset % 4 == 0
        })
    })
}

/// Reads expert records (gate | up | down rows, as [`RecordLayout`] lays them out) for the cache.
/// Object-safe so the engine does not depend on where the bytes live (a store, a GGUF file, HTTP).
pub trait RecordReader {
    fn describe(&self) -> String;
    /// The records of `experts` of `layer`, in order; several are read at once where the source allows.
    fn read<'a>(&'a self, layer: usize, experts: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<Vec<u8>>, String>>;
}

/// Records read from the model's parts (a store's part views, local files, HTTP): three ranges per record,
/// each checked against the store's check values when there are some.
pub struct PartsReader<S> {
    pub parts: Vec<S>,
    pub tensors: ExpertTensors,
    pub checks: Option<std::rc::Rc<StoreChecks>>,
}

impl<S: RangeSource> PartsReader<S> {
    pub async fn read_one(&self, layer: usize, expert: u32) -> Result<Vec<u8>, String> {
        let ranges = self.tensors.ranges.get(layer).copied().flatten().ok_or_else(|| format!("layer {layer} has no routed experts"))?;
        if expert >= self.tensors.n_expert {
            return Err(format!("expert {expert} of layer {layer} does not exist ({} experts)", self.tensors.n_expert));
        }
        let total: u64 = ranges.iter().map(|r| r.2).sum();
        // the three matrices are read at once (a source that reads in parallel overlaps them)
        let reads = ranges.map(|(part, base, per)| self.parts[part].read_range(base + expert as u64 * per, per));
        let matrices = futures_util::future::try_join_all(reads).await?;
        let mut record = Vec::with_capacity(total as usize);
        for (which, ((part, _, per), (bytes, _))) in ranges.into_iter().zip(matrices).enumerate() {
            if bytes.len() as u64 != per {
                return Err(format!("{}: expert {expert} of layer {layer}: read {} of {per} bytes (truncated file?)", self.parts[part].describe(), bytes.len()));
            }
            if let Some(checks) = &self.checks {
                checks.verify_expert(layer, expert, which, &bytes).map_err(|e| format!("{}: {e}", self.parts[part].describe()))?;
            }
            record.extend_from_slice(&bytes);
        }
        Ok(record)
    }
}

impl<S: RangeSource> RecordReader for PartsReader<S> {
    fn describe(&self) -> String {
        self.parts.first().map(|p| p.describe()).unwrap_or_default()
    }
    fn read<'a>(&'a self, layer: usize, experts: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<Vec<u8>>, String>> {
        Box::pin(futures_util::future::try_join_all(experts.iter().map(move |&e| self.read_one(layer, e))))
    }
}

/// How records reach the pool's buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Upload {
    /// `queue.writeBuffer` per record (the implementation stages the bytes).
    #[default]
    WriteBuffer,
    /// A ring of mapped staging buffers: records are copied into mapped memory, then a copy command per
    /// record moves them into their slots (one submission per batch).
    StagingRing,
}

impl Upload {
    pub fn parse(s: &str) -> Result<Upload, String> {
        match s {
            "write" => Ok(Upload::WriteBuffer),
            "staging" => Ok(Upload::StagingRing),
            _ => Err(format!("unknown upload path {s:?}: write or staging")),
        }
    }
}

/// One buffer of the staging ring and its pending re-map.
struct Staging {
    buffer: wgpu::Buffer,
    remapped: Option<futures_channel::oneshot::Receiver<Result<(), wgpu::BufferAsyncError>>>,
}

/// Mapped staging buffers used in turn; a buffer is re-mapped once its copies are done.
struct StagingRing {
    buffers: Vec<Staging>,
    next: usize,
}

impl StagingRing {
    const BUFFERS: usize = 3;

    fn new(gpu: &Gpu, capacity: u64) -> StagingRing {
        // mapped with map_async rather than at creation (wgpu's WebGPU backend panics on a lost device there)
        let buffers = (0..Self::BUFFERS)
            .map(|_| {
                let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("expert staging"),
                    size: capacity,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                let (tx, rx) = futures_channel::oneshot::channel();
                buffer.map_async(wgpu::MapMode::Write, .., move |r| {
                    let _ = tx.send(r);
                });
                Staging { buffer, remapped: Some(rx) }
            })
            .collect();
        StagingRing { buffers, next: 0 }
    }

    /// Copies `records` (slot, bytes) into the next staging buffer and records their copies into the pool.
    async fn upload(&mut self, gpu: &Gpu, pool: &ExpertPool, records: &[(u32, &[u8])]) -> Result<(), String> {
        let i = self.next;
        self.next = (self.next + 1) % self.buffers.len();
        let staging = &mut self.buffers[i];
        if let Some(rx) = staging.remapped.take() {
            #[cfg(not(target_arch = "wasm32"))]
            gpu.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| format!("GPU poll failed: {e}"))?;
            rx.await.map_err(|_| "the GPU device was lost while mapping a staging buffer".to_string())?.map_err(|e| format!("mapping a staging buffer failed: {e}"))?;
        }
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        {
            let mut view = staging.buffer.get_mapped_range_mut(..).map_err(|e| format!("staging buffer: {e}"))?;
            let mut at = 0usize;
            for &(slot, record) in records {
                let len = record.len().next_multiple_of(4);
                if (at + len) as u64 > staging.buffer.size() {
                    return Err(format!("{} bytes of records do not fit a staging buffer of {}", at + len, staging.buffer.size()));
                }
                view.slice(at..at + record.len()).copy_from_slice(record);
                if len > record.len() {
                    view.slice(at + record.len()..at + len).copy_from_slice(&[0u8; 3][..len - record.len()]);
                }
                let (chunk, within) = pool.place(slot);
                encoder.copy_buffer_to_buffer(&staging.buffer, at as u64, &pool.chunks[chunk], within, len as u64);
                at += len;
            }
        }
        staging.buffer.unmap();
        gpu.queue.submit([encoder.finish()]);
        gpu.count_submit(0, 0.0);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.buffer.map_async(wgpu::MapMode::Write, .., move |r| {
            let _ = tx.send(r);
        });
        staging.remapped = Some(rx);
        Ok(())
    }
}

pub struct ExpertPool {
    pub chunks: Vec<wgpu::Buffer>,
    pub slots_per_chunk: u32,
    pub slot_bytes: u64,
    /// Slots in all; those for routed experts (the cache's, or every expert of a resident pool) are `routed_slots`.
    pub n_slots: u32,
    pub routed_slots: u32,
    /// slot of (layer, expert) at `layer · n_expert + expert`; u32::MAX when not resident
    pub table: wgpu::Buffer,
    /// The table as last written (what `table` will hold once the queued writes land).
    mapped: Vec<u32>,
    /// Experts of layer l mapped into pool buffer c (its riding shared expert too), at `l · chunks + c`: the expert
    /// kernels are dispatched over the buffers that hold some of the layer's experts, not over every buffer of the
    /// pool.
    held: Vec<u32>,
    /// record layout of each trunk layer (None for dense layers)
    pub layouts: Vec<Option<RecordLayout>>,
    /// per trunk layer: the slot holding its shared expert, when it rides with the routed ones (filled by
    /// [`ExpertPool::fill_shared`]; never the cache's)
    pub shared: Vec<Option<u32>>,
    pub n_expert: u32,
    staging: Option<StagingRing>,
}

impl ExpertPool {
    pub fn chunk(&self, i: usize) -> PoolChunk<'_> {
        PoolChunk { buffer: &self.chunks[i], index: i as u32, slots_per_chunk: self.slots_per_chunk, slot_bytes: self.slot_bytes }
    }

    /// An empty pool of `n_slots` slots for routed experts (the table maps nothing), and after them a slot for
    /// each riding shared expert ([`ExpertTensors::shared_rides`]); `max_binding` caps each buffer.
    pub fn new(gpu: &Gpu, tensors: &ExpertTensors, n_layer: usize, n_slots: u32, max_binding: u64) -> Result<ExpertPool, String> {
        let riding: Vec<usize> = tensors.riding_layers().collect();
        let mut pool = Self::with_slots(gpu, tensors, n_layer, n_slots + riding.len() as u32, n_slots, tensors.n_expert, max_binding)?;
        for (i, l) in riding.into_iter().enumerate() {
            pool.set_shared_slot(l, Some(n_slots + i as u32));
        }
        Ok(pool)
    }

    /// An empty pool of `n_slots` slots (`routed_slots` of them for routed experts), split into buffers of whole runs
    /// of `per_layer` slots where a run fits.
    fn with_slots(gpu: &Gpu, tensors: &ExpertTensors, n_layer: usize, n_slots: u32, routed_slots: u32, per_layer: u32, max_binding: u64) -> Result<ExpertPool, String> {
        let slot_bytes = tensors.slot_bytes();
        let max_chunk = max_binding.min(gpu.device.limits().max_buffer_size);
        if slot_bytes > max_chunk {
            return Err(format!("one expert record ({slot_bytes} bytes) is larger than the binding limit {max_chunk}"));
        }
        let mut slots_per_chunk = ((max_chunk / slot_bytes) as u32).min(n_slots.max(1));
        // whole layers per buffer where a layer fits: a resident layer's experts then lie in one buffer, and its
        // expert products are one dispatch each however large the pool
        let per_layer = per_layer.max(1);
        if slots_per_chunk >= per_layer && n_slots > slots_per_chunk {
            slots_per_chunk -= slots_per_chunk % per_layer;
        }
        let n_chunks = n_slots.div_ceil(slots_per_chunk).max(1);
        let chunks: Vec<wgpu::Buffer> = (0..n_chunks)
            .map(|c| {
                let slots = slots_per_chunk.min(n_slots - c * slots_per_chunk).max(1);
                gpu.storage_buffer("expert pool", slots as u64 * slot_bytes)
            })
            .collect();
        let mapped = vec![u32::MAX; (n_layer * tensors.n_expert as usize).max(1)];
        let table = gpu.upload("expert slot table", bytemuck::cast_slice(&mapped));
        let held = vec![0; n_layer * n_chunks as usize];
        let shared = vec![None; n_layer];
        Ok(ExpertPool { chunks, slots_per_chunk, slot_bytes, n_slots, routed_slots, table, mapped, held, layouts: tensors.layouts.clone(), shared, n_expert: tensors.n_expert, staging: None })
    }

    /// Gives layer `l`'s shared expert `slot` (or none), counted among the layer's buffers.
    fn set_shared_slot(&mut self, l: usize, slot: Option<u32>) {
        let n_chunks = self.chunks.len();
        if let Some(old) = std::mem::replace(&mut self.shared[l], slot) {
            let chunk = self.place(old).0;
            self.held[l * n_chunks + chunk] -= 1;
        }
        if let Some(new) = slot {
            let chunk = self.place(new).0;
            self.held[l * n_chunks + chunk] += 1;
        }
    }

    /// Copies each riding shared expert's matrices from the dense weights into its slot (on the GPU: queued
    /// before the next submission). A layer whose pieces a copy cannot take whole words of runs its shared expert
    /// apart instead.
    pub fn fill_shared(&mut self, gpu: &Gpu, weights: &super::weights::Weights) -> Result<(), String> {
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        for l in 0..self.shared.len() {
            let (Some(slot), Some(layout)) = (self.shared[l], self.layouts[l]) else { continue };
            let (chunk, within) = self.place(slot);
            let mut copies = Vec::new();
            for (name, m) in SHARED_TENSORS.iter().zip([layout.gate, layout.up, layout.down]) {
                let t = weights.get(&format!("blk.{l}.{name}"))?;
                let row_bytes = t.row_bytes();
                for piece in &t.pieces {
                    let (from, to, bytes) = (piece.byte_offset, within + m.byte_offset + piece.first_row * row_bytes, piece.rows * row_bytes);
                    copies.push((&piece.buffer, from, to, bytes));
                }
            }
            if copies.iter().all(|&(_, from, to, bytes)| from % 4 == 0 && to % 4 == 0 && bytes % 4 == 0) {
                for (buffer, from, to, bytes) in copies {
                    encoder.copy_buffer_to_buffer(buffer, from, &self.chunks[chunk], to, bytes);
                }
            } else {
                self.set_shared_slot(l, None);
            }
        }
        gpu.queue.submit([encoder.finish()]);
        Ok(())
    }

    /// Uploads records through a staging ring sized for `batch` records at a time, instead of `writeBuffer`.
    pub fn use_staging(&mut self, gpu: &Gpu, batch: u32) {
        self.staging = Some(StagingRing::new(gpu, batch as u64 * self.slot_bytes));
    }

    pub fn upload_path(&self) -> Upload {
        if self.staging.is_some() {
            Upload::StagingRing
        } else {
            Upload::WriteBuffer
        }
    }

    /// The pool buffer holding `slot` and the slot's byte offset in it.
    fn place(&self, slot: u32) -> (usize, u64) {
        ((slot / self.slots_per_chunk) as usize, (slot % self.slots_per_chunk) as u64 * self.slot_bytes)
    }

    /// Writes each (slot, record), by the pool's upload path; queued, so it lands after the work already
    /// submitted and before the next. Returns the bytes written.
    pub async fn fill_batch(&mut self, gpu: &Gpu, records: &[(u32, &[u8])]) -> Result<u64, String> {
        for &(slot, record) in records {
            if slot >= self.n_slots || record.len() as u64 > self.slot_bytes {
                return Err(format!("slot {slot} of {}, record of {} bytes (slots of {})", self.n_slots, record.len(), self.slot_bytes));
            }
        }
        let bytes = records.iter().map(|r| r.1.len() as u64).sum();
        match self.staging.take() {
            Some(mut ring) => {
                let result = ring.upload(gpu, self, records).await;
                self.staging = Some(ring);
                result?;
            }
            None => {
                for &(slot, record) in records {
                    self.fill(gpu, slot, record);
                }
            }
        }
        Ok(bytes)
    }

    /// GPU bytes of the pool (slots and table).
    pub fn gpu_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.size()).sum::<u64>() + self.table.size()
    }

    /// Writes `record` into `slot` (queued: it lands after the work already submitted, before the next).
    /// Returns the bytes written.
    pub fn fill(&self, gpu: &Gpu, slot: u32, record: &[u8]) -> u64 {
        assert!(slot < self.n_slots && record.len() as u64 <= self.slot_bytes, "slot {slot} of {}, record of {} bytes", self.n_slots, record.len());
        let (chunk, within) = self.place(slot);
        if record.len() % 4 == 0 {
            gpu.queue.write_buffer(&self.chunks[chunk], within, record);
        } else {
            let mut padded = record.to_vec();
            padded.resize(record.len().next_multiple_of(4), 0);
            gpu.queue.write_buffer(&self.chunks[chunk], within, &padded);
        }
        record.len() as u64
    }

    /// Points (layer, expert) at `slot` (or at nothing with u32::MAX).
    pub fn map(&mut self, gpu: &Gpu, layer: usize, expert: u32, slot: u32) {
        let at = layer * self.n_expert as usize + expert as usize;
        self.note_mapping(at, slot);
        gpu.queue.write_buffer(&self.table, at as u64 * 4, &slot.to_le_bytes());
    }

    /// Records that table entry `at` now holds `slot`, for [`ExpertPool::chunks_of`].
    fn note_mapping(&mut self, at: usize, slot: u32) {
        let layer = at / self.n_expert as usize;
        let n_chunks = self.chunks.len();
        let old = std::mem::replace(&mut self.mapped[at], slot);
        if old != u32::MAX {
            let chunk = self.place(old).0;
            self.held[layer * n_chunks + chunk] -= 1;
        }
        if slot != u32::MAX {
            let chunk = self.place(slot).0;
            self.held[layer * n_chunks + chunk] += 1;
        }
    }

    /// The pool buffers holding some expert of `layer`: the only ones its expert products need to visit.
    pub fn chunks_of(&self, layer: usize) -> impl Iterator<Item = PoolChunk<'_>> + '_ {
        let n_chunks = self.chunks.len();
        (0..n_chunks).filter(move |&c| self.held[layer * n_chunks + c] > 0).map(|c| self.chunk(c))
    }

    /// A pool that holds every expert of every MoE layer, filled from `reader`, layer by layer; a riding shared
    /// expert's slot comes right after its layer's, so that a buffer holds both.
    pub async fn load_resident(gpu: &Gpu, tensors: &ExpertTensors, n_layer: usize, max_binding: u64, reader: &dyn RecordReader) -> Result<ExpertPool, String> {
        let per_layer = tensors.n_expert + tensors.riding_layers().next().is_some() as u32;
        let n_slots = tensors.moe_layers().count() as u32 * per_layer;
        let mut pool = ExpertPool::with_slots(gpu, tensors, n_layer, n_slots, tensors.total() as u32, per_layer, max_binding)?;
        let all: Vec<u32> = (0..tensors.n_expert).collect();
        for (i, l) in tensors.moe_layers().enumerate() {
            let mut slot = i as u32 * per_layer;
            if tensors.shared_rides[l] {
                pool.set_shared_slot(l, Some(slot + tensors.n_expert));
            }
            // a few experts at a time, so a 512-expert layer does not sit in memory at once
            for batch in all.chunks(16) {
                for (record, &e) in reader.read(l, batch).await?.iter().zip(batch) {
                    pool.fill(gpu, slot, record);
                    pool.note_mapping(l * tensors.n_expert as usize + e as usize, slot);
                    slot += 1;
                }
            }
        }
        gpu.queue.write_buffer(&pool.table, 0, bytemuck::cast_slice(&pool.mapped));
        Ok(pool)
    }
}
