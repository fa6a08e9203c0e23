//! RMSNorm (`shaders/norm.wgsl`) and the greedy pick (`shaders/argmax.wgsl`).

use super::{Gpu, Pass, P};

const NORM: &str = include_str!("../../shaders/norm.wgsl");
const ARGMAX: &str = include_str!("../../shaders/argmax.wgsl");

/// y[y_at + i] = x[x_at + i] / √(mean x² + ε) · w[i] for i < n.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, x_at: u32, w: &wgpu::Buffer, y: &wgpu::Buffer, y_at: u32, n: u32, eps: f32) {
    let kernel = gpu.kernel("norm.wgsl", NORM, "rms_norm");
    pass.dispatch(gpu, &kernel, &[x, w, y], &[P::U(n), P::F(eps), P::U(x_at), P::U(y_at)], 1);
}

/// out[0] = argmax of x[0..n) (lowest index on ties), out[1] = the maximum's f32 bits.
pub fn argmax(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, n: u32, out: &wgpu::Buffer) {
    let kernel = gpu.kernel("argmax.wgsl", ARGMAX, "argmax");
    pass.dispatch(gpu, &kernel, &[x, out], &[P::U(n)], 1);
}
