//! A timeline of the dispatches as the engine runs them (native, where the adapter has timestamps inside compute
//! passes): every submission writes a GPU timestamp before its first dispatch and after each one, so a dispatch's
//! time is how much later it finished than the one before it, in the pipelined stream itself (its barrier, launch
//! and work), and the time between one submission's end and the next one's start is the GPU waiting for the CPU.
//! [`super::Gpu::start_profile`] times each dispatch alone instead, which shows its work but not what it costs
//! in the stream.

use super::kernel::KernelTime;
use super::Gpu;
use std::collections::HashMap;

/// The timestamps of one submission, on their way back.
pub(super) struct Stamps {
    /// `1 + dispatches.len()` timestamps: before the first dispatch, then after each.
    pub(super) read: wgpu::Buffer,
    /// Each dispatch's kernel label and workgroup grid.
    pub(super) dispatches: Vec<(String, (u32, u32, u32))>,
}

/// Where a stretch's GPU time went: per kernel, and the time the GPU sat between submissions.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    /// Milliseconds from each submission's start to its last dispatch's end, summed.
    pub busy_ms: f64,
    /// Milliseconds between one submission's end and the next one's start: the GPU waiting for the CPU, or running
    /// work submitted outside the engine's passes (uploads, readback copies).
    pub idle_ms: f64,
    /// Each kernel's dispatches and their time in the stream, slowest first.
    pub kernels: Vec<KernelTime>,
    /// The same by kernel and workgroup grid (`label [x×y×z]`): the products of different shapes apart.
    pub grids: Vec<KernelTime>,
}

impl Gpu {
    /// Whether the device records timelines ([`Gpu::start_timeline`]).
    pub fn has_timeline(&self) -> bool {
        self.device.features().contains(wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    }

    /// Starts recording a timeline of every submission (until [`Gpu::take_timeline`]).
    pub fn start_timeline(&self) -> Result<(), String> {
        if !self.has_timeline() {
            return Err(format!("{}: no GPU timestamps inside compute passes here, so no timeline", self.summary.name));
        }
        self.timeline.replace(Some(Vec::new()));
        Ok(())
    }

    /// Drops the timestamps recorded so far (what ran before a stretch is not the stretch's).
    pub fn discard_timeline(&self) {
        if let Some(pending) = self.timeline.borrow_mut().as_mut() {
            pending.clear();
        }
    }

    pub(super) fn is_recording_timeline(&self) -> bool {
        self.timeline.borrow().is_some()
    }

    /// Query sets and buffers for a submission of `dispatches` dispatches: stamp `i` goes to query `i`.
    pub(super) fn timeline_queries(&self, dispatches: usize) -> (wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer) {
        let count = dispatches as u32 + 1;
        let queries = self.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("timeline"), ty: wgpu::QueryType::Timestamp, count });
        let bytes = count as u64 * 8;
        let resolved = self.device.create_buffer(&wgpu::BufferDescriptor { label: Some("timeline resolved"), size: bytes, usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, mapped_at_creation: false });
        let read = self.device.create_buffer(&wgpu::BufferDescriptor { label: Some("timeline read"), size: bytes, usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false });
        (queries, resolved, read)
    }

    pub(super) fn keep_stamps(&self, stamps: Stamps) {
        if let Some(pending) = self.timeline.borrow_mut().as_mut() {
            pending.push(stamps);
        }
    }

    /// The timeline since [`Gpu::start_timeline`] (or the last take), once the GPU has finished it; recording
    /// goes on. None when no timeline is being recorded.
    pub async fn take_timeline(&self) -> Result<Option<Timeline>, String> {
        let Some(pending) = self.timeline.borrow_mut().as_mut().map(std::mem::take) else { return Ok(None) };
        let tick_ns = self.queue.get_timestamp_period() as f64;
        let mut by_kernel: HashMap<String, (u64, f64)> = HashMap::new();
        let mut by_grid: HashMap<String, (u64, f64)> = HashMap::new();
        let (mut busy, mut idle) = (0.0, 0.0);
        let mut last_end: Option<u64> = None;
        for stamps in pending {
            let bytes = self.map_read(&stamps.read).await?;
            let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
            let (start, end) = (ticks[0], ticks[ticks.len() - 1]);
            busy += end.saturating_sub(start) as f64 * tick_ns;
            if let Some(previous) = last_end {
                idle += start.saturating_sub(previous) as f64 * tick_ns;
            }
            last_end = Some(end);
            for ((label, grid), pair) in stamps.dispatches.iter().zip(ticks.windows(2)) {
                let ns = pair[1].saturating_sub(pair[0]) as f64 * tick_ns;
                for (map, key) in [(&mut by_kernel, label.clone()), (&mut by_grid, format!("{label} [{}×{}×{}]", grid.0, grid.1, grid.2))] {
                    let e = map.entry(key).or_default();
                    e.0 += 1;
                    e.1 += ns;
                }
            }
        }
        let slowest_first = |map: HashMap<String, (u64, f64)>| {
            let mut times: Vec<KernelTime> = map.into_iter().map(|(kernel, (dispatches, ns))| KernelTime { kernel, dispatches, ms: ns / 1e6 }).collect();
            times.sort_by(|a, b| b.ms.total_cmp(&a.ms));
            times
        };
        Ok(Some(Timeline { busy_ms: busy / 1e6, idle_ms: idle / 1e6, kernels: slowest_first(by_kernel), grids: slowest_first(by_grid) }))
    }

    /// The contents of a MAP_READ buffer, once the GPU has written it.
    async fn map_read(&self, buffer: &wgpu::Buffer) -> Result<Vec<u8>, String> {
        let (tx, rx) = futures_channel::oneshot::channel();
        buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        #[cfg(not(target_arch = "wasm32"))]
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| format!("GPU poll failed: {e}"))?;
        rx.await.map_err(|_| "the GPU device was lost reading a timeline".to_string())?.map_err(|e| format!("reading a timeline: {e}"))?;
        let bytes = buffer.slice(..).get_mapped_range().map_err(|e| format!("reading a timeline: {e}"))?.to_vec();
        buffer.unmap();
        Ok(bytes)
    }
}
