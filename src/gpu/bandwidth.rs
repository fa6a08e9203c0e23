//! The memory-read ceiling of the adapter (`shaders/bandwidth.wgsl`), measured in the same run as what it is
//! compared with.

use super::{Gpu, Pass, P};

const SOURCE: &str = include_str!("../../shaders/bandwidth.wgsl");

/// Records one read of the first `bytes` of `data` (a multiple of 16) on `workgroups` workgroups.
pub fn read_all(gpu: &Gpu, pass: &mut Pass, data: &wgpu::Buffer, bytes: u64, out: &wgpu::Buffer, workgroups: u32) {
    assert!(bytes % 16 == 0 && bytes <= data.size() && bytes / 16 <= u32::MAX as u64);
    let kernel = gpu.kernel("bandwidth.wgsl", SOURCE, "read_all");
    pass.dispatch_3d(gpu, &kernel, &[data, out], &[P::U((bytes / 16) as u32)], (workgroups.min(gpu.device.limits().max_compute_workgroups_per_dimension), 1, 1));
}
