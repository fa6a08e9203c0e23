//! RMSNorm (`shaders/norm.wgsl`) and the greedy pick (`shaders/argmax.wgsl`).

use super::{Gpu, Pass, P};

const NORM: &str = include_str!("../../shaders/norm.wgsl");
const ARGMAX: &str = include_str!("../../shaders/argmax.wgsl");

/// y[y_at + i] = x[x_at + i] / √(mean x² + ε) · w[i] for i < n.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, x_at: u32, w: &wgpu::Buffer, y: &wgpu::Buffer, y_at: u32, n: u32, eps: f32) {
    rms_norm_rows(gpu, pass, x, x_at, n, w, y, y_at, n, n, eps, 1);
}

/// [`rms_norm`] of `rows` rows: row t from `x[x_at + t·x_stride ..]` into `y[y_at + t·y_stride ..]`.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_rows(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, x_at: u32, x_stride: u32, w: &wgpu::Buffer, y: &wgpu::Buffer, y_at: u32, y_stride: u32, n: u32, eps: f32, rows: u32) {
    let kernel = gpu.kernel("norm.wgsl", NORM, "rms_norm");
    let params = [P::U(n), P::F(eps), P::U(x_at), P::U(y_at), P::U(rows), P::U(x_stride), P::U(y_stride)];
    pass.dispatch(gpu, &kernel, &[x, w, y], &params, rows);
}

/// The longest row [`moe_sum_norm`] takes (held in registers by one workgroup: `WG · HELD` in norm.wgsl).
pub const SUM_NORM_MAX: u32 = 4096;

/// A decode token's MoE residual add, then the next RMSNorm, in one dispatch: `x += (Σ_j w_j·expert_out[j·n ..])
/// + shared[shared_at ..]` as [`super::moe::accumulate`] adds it (the same sums, in the same order), then
/// `y = x / √(mean x² + ε) · w` as [`rms_norm`] computes it. `n` ≤ [`SUM_NORM_MAX`]. (`shared` may be
/// `expert_out`, the shared expert's output after the routed ones'.)
#[allow(clippy::too_many_arguments)]
pub fn moe_sum_norm(gpu: &Gpu, pass: &mut Pass, expert_out: &wgpu::Buffer, sel: &wgpu::Buffer, shared: &wgpu::Buffer, shared_at: u32, n_used: u32, x: &wgpu::Buffer, w: &wgpu::Buffer, y: &wgpu::Buffer, n: u32, eps: f32) {
    assert!(n <= SUM_NORM_MAX, "moe_sum_norm takes rows of at most {SUM_NORM_MAX} values, not {n}");
    // the row held in as few registers as it needs (the shader's HELD is for the longest row)
    let held = n.div_ceil(256).max(1);
    let kernel = gpu.kernel_built(&format!("norm.wgsl held{held}"), "moe_sum_norm", || {
        let mut s = NORM.to_string();
        super::kernel::replace_once(&mut s, "const HELD: u32 = 16u;", &format!("const HELD: u32 = {held}u;"));
        s
    });
    pass.dispatch(gpu, &kernel, &[x, w, y, expert_out, sel, shared], &[P::U(n), P::U(n_used), P::F(eps), P::U(shared_at)], 1);
}

/// Workgroups of the argmax's first stage at most (`PARTS` in the shader).
const ARGMAX_PARTS: u64 = 256;
/// Values per invocation the first stage's workgroups are counted for (below [`ARGMAX_PARTS`] of them).
const ARGMAX_VALUES_EACH: u32 = 4;
/// Bytes of the buffer [`argmax`] writes: the pick (2 words) and the first stage's partials.
pub const ARGMAX_BYTES: u64 = 8 + 8 * ARGMAX_PARTS;

/// out[0] = argmax of x[0..n) (lowest index on ties), out[1] = the maximum's f32 bits; `out` holds
/// [`ARGMAX_BYTES`] (the first stage's partials after the pick).
pub fn argmax(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, n: u32, out: &wgpu::Buffer) {
    assert!(out.size() >= ARGMAX_BYTES, "the argmax needs {ARGMAX_BYTES} bytes, not {}", out.size());
    let kernel = gpu.kernel("argmax.wgsl", ARGMAX, "argmax");
    let parts = n.div_ceil(256 * ARGMAX_VALUES_EACH).clamp(1, ARGMAX_PARTS as u32);
    pass.dispatch(gpu, &kernel, &[x, out], &[P::U(n), P::U(0), P::U(parts)], parts);
    pass.dispatch(gpu, &kernel, &[x, out], &[P::U(n), P::U(1), P::U(parts)], 1);
}
