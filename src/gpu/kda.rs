//! KDA (Kimi delta attention) kernels (`shaders/kda.wgsl`): a decode token's whole KDA core in one dispatch
//! ([`step`]: the conv on the q|k|v projections, the forget gate g and β, the gated delta rule on the per-head
//! state, llama.cpp's fused op, and the output norm), and the same steps over a prefill chunk's tokens. Each
//! wrapper records one dispatch into a [`Pass`]. All buffers hold f32; "D" below is `n_head · head_dim`.

use super::{Gpu, Pass, P};

const SHADER: &str = include_str!("../../shaders/kda.wgsl");
/// Invocations per workgroup in `kda.wgsl`; the per-head kernels run one workgroup per head, so this is also
/// the largest head dimension they take.
const WORKGROUP: u32 = 256;

/// Catches a buffer too small for the layout the kernel assumes (the kernel would silently skip the writes).
fn expect_floats(buffer: &wgpu::Buffer, floats: u32, what: &str) {
    assert!(buffer.size() >= floats as u64 * 4, "KDA {what}: {} bytes, need {floats} f32", buffer.size());
}

fn expect_head_dim(head_dim: u32) {
    assert!((1..=WORKGROUP).contains(&head_dim), "KDA head_dim {head_dim} is outside 1..={WORKGROUP}");
}

/// The forget gate and β of `tokens` tokens (safe-gate form), token t's inputs and outputs at t times their
/// width.
///
/// * `fa`: D per token, the forget-gate projection; `dt_bias`: D; `a`: `n_head` (ssm_a, already exp(A_log));
///   `beta_logits`: `n_head` per token.
/// * `gb`: D + `n_head` outputs per token: `g[c] = lower_bound · σ(a[c / head_dim] · (fa[c] + dt_bias[c]))` for
///   c < D, then `β[h] = σ(beta_logits[h])` at `D + h`. `lower_bound` (gate_lower_bound) is negative, so
///   g ∈ (λ, 0).
#[allow(clippy::too_many_arguments)]
pub fn gates_tokens(gpu: &Gpu, pass: &mut Pass, fa: &wgpu::Buffer, dt_bias: &wgpu::Buffer, a: &wgpu::Buffer, beta_logits: &wgpu::Buffer, gb: &wgpu::Buffer, n_head: u32, head_dim: u32, lower_bound: f32, tokens: u32) {
    let dim = n_head * head_dim;
    expect_floats(fa, tokens * dim, "forget-gate projection");
    expect_floats(dt_bias, dim, "dt bias");
    expect_floats(a, n_head, "ssm_a");
    expect_floats(beta_logits, tokens * n_head, "β logits");
    expect_floats(gb, tokens * (dim + n_head), "gates output");
    let kernel = gpu.kernel("kda.wgsl", SHADER, "kda_gates");
    let params = [P::U(n_head), P::U(head_dim), P::F(lower_bound), P::U(tokens)];
    pass.dispatch_3d(gpu, &kernel, &[fa, dt_bias, a, beta_logits, gb], &params, (dim.div_ceil(WORKGROUP), 1, tokens));
}

/// Per-head RMSNorm with the output gate: `y[h·d+j] = o_j / √(mean_j o_j² + eps) · norm_w[j] · σ(z[h·d+j])`.
///
/// * `o`: D, the delta rule's output; `norm_w`: `head_dim` (ssm_norm, shared by all heads); `z`: D, the output
///   gate projection; `y`: D outputs.
///
/// `head_dim` ≤ 256.
#[allow(clippy::too_many_arguments)]
pub fn head_norm_gate(gpu: &Gpu, pass: &mut Pass, o: &wgpu::Buffer, norm_w: &wgpu::Buffer, z: &wgpu::Buffer, y: &wgpu::Buffer, n_head: u32, head_dim: u32, eps: f32) {
    expect_head_dim(head_dim);
    let dim = n_head * head_dim;
    expect_floats(o, dim, "attention output");
    expect_floats(norm_w, head_dim, "ssm_norm");
    expect_floats(z, dim, "output gate");
    expect_floats(y, dim, "normed output");
    let kernel = gpu.kernel("kda.wgsl", SHADER, "kda_head_norm_gate");
    pass.dispatch(gpu, &kernel, &[o, norm_w, z, y], &[P::U(n_head), P::U(head_dim), P::F(eps)], n_head);
}

/// Where [`step`] finds its inputs and constants (offsets in floats).
#[derive(Clone, Copy, Debug)]
pub struct StepLayout {
    pub n_head: u32,
    pub head_dim: u32,
    pub kernel_size: u32,
    /// In the input: f_a, the β logits and the output gate z (q|k|v pre-conv are at 0).
    pub fa_at: u32,
    pub beta_at: u32,
    pub z_at: u32,
}

impl StepLayout {
    /// Floats of [`step`]'s constants: the conv taps (3·D·K), dt_bias (D), ssm_a (n_head), ssm_norm (head_dim).
    pub fn consts_floats(&self) -> u32 {
        let dim = self.n_head * self.head_dim;
        3 * dim * self.kernel_size + dim + self.n_head + self.head_dim
    }
    /// Offsets of dt_bias, ssm_a and ssm_norm in the constants.
    pub fn consts_at(&self) -> (u32, u32, u32) {
        let dim = self.n_head * self.head_dim;
        let dt = 3 * dim * self.kernel_size;
        (dt, dt + dim, dt + dim + self.n_head)
    }
}

/// A decode token's KDA core in one dispatch, one workgroup per head (each head's channels of the conv are its
/// own): the causal depthwise conv of q|k|v then SiLU (ggml `ssm_conv` + `silu`), the gates ([`gates_tokens`]'
/// g and β), the gated delta rule (ggml's fused `gated_delta_net`, KDA branch) and [`head_norm_gate`].
///
/// * `input`: q|k|v before the conv (3·D at 0, each head-major: head h at `h·head_dim`), f_a, the β logits and
///   z at the layout's offsets.
/// * `consts`: [`StepLayout::consts_floats`]: the conv taps (channel c's K taps at `K·c`, oldest first; tap K−1
///   multiplies the current input), then dt_bias, ssm_a (already exp(A_log)) and ssm_norm at
///   [`StepLayout::consts_at`].
/// * `conv_state`: (K − 1)·3·D, channel c's last K−1 inputs at `(K−1)·c`, oldest first (llama.cpp's conv state
///   row); shifted by one and appended with the input.
/// * `state`: `n_head · head_dim²`, stored transposed like llama.cpp: `state[h·d·d + j·d + i] = S_h[i][j]` (i the
///   key index, j the value index); updated in place. q and k are L2-normalised per head as `x / max(‖x‖₂, eps)`,
///   and `o_j = Σ_i S[i][j] q̂_i / √head_dim` after the update.
/// * `y`: D outputs, `o` through [`head_norm_gate`].
///
/// `head_dim` ≤ 256, K in 2..=8.
#[allow(clippy::too_many_arguments)]
pub fn step(gpu: &Gpu, pass: &mut Pass, input: &wgpu::Buffer, consts: &wgpu::Buffer, conv_state: &wgpu::Buffer, state: &wgpu::Buffer, y: &wgpu::Buffer, l: StepLayout, lower_bound: f32, eps: f32) {
    expect_head_dim(l.head_dim);
    assert!((2..=8).contains(&l.kernel_size), "KDA conv kernel size {} is outside 2..=8", l.kernel_size);
    let dim = l.n_head * l.head_dim;
    expect_floats(input, (3 * dim).max(l.fa_at + dim).max(l.beta_at + l.n_head).max(l.z_at + dim), "step input");
    expect_floats(consts, l.consts_floats(), "step constants");
    expect_floats(conv_state, 3 * dim * (l.kernel_size - 1), "conv state");
    expect_floats(state, dim * l.head_dim, "delta state");
    expect_floats(y, dim, "step output");
    let (dt_at, a_at, norm_at) = l.consts_at();
    let kernel = delta_rule_kernel(gpu, "kda_step", l.head_dim);
    let params = [
        P::U(l.n_head),
        P::U(l.head_dim),
        P::U(l.kernel_size),
        P::F(eps),
        P::F(lower_bound),
        P::U(l.fa_at),
        P::U(l.beta_at),
        P::U(l.z_at),
        P::U(dt_at),
        P::U(a_at),
        P::U(norm_at),
    ];
    pass.dispatch(gpu, &kernel, &[input, consts, conv_state, state, y], &params, l.n_head);
}

/// Tokens per invocation of the chunk's conv (`CONV_BLOCK` in kda.wgsl).
const CONV_BLOCK: u32 = 8;

/// [`step`]'s conv (then SiLU) over `channels` channels through `tokens` tokens in order: token t's inputs at
/// `x[t·channels ..]`, its outputs at `y[t·channels ..]`; `w` the taps and `state` the conv state as `step` has
/// them, carried in and out.
#[allow(clippy::too_many_arguments)]
pub fn conv_tokens(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, w: &wgpu::Buffer, state: &wgpu::Buffer, y: &wgpu::Buffer, channels: u32, kernel_size: u32, tokens: u32) {
    assert!((2..=8).contains(&kernel_size), "KDA conv kernel size {kernel_size} is outside 2..=8");
    expect_floats(x, tokens * channels, "conv input");
    expect_floats(w, kernel_size * channels, "conv weights");
    expect_floats(state, (kernel_size - 1) * channels, "conv state");
    expect_floats(y, tokens * channels, "conv output");
    let kernel = gpu.kernel("kda.wgsl", SHADER, "kda_conv_chunk");
    // grid (channel group, block of CONV_BLOCK tokens)
    let blocks = tokens.div_ceil(CONV_BLOCK);
    assert!(blocks <= gpu.device.limits().max_compute_workgroups_per_dimension, "{tokens} tokens are more than one conv dispatch takes");
    pass.dispatch_3d(gpu, &kernel, &[x, w, state, y], &[P::U(channels), P::U(kernel_size), P::U(tokens)], (channels.div_ceil(WORKGROUP), blocks, 1));
}

/// [`step`]'s L2 norm, in place: q and k of each head of each of `tokens` tokens (token t's `[q | k | v]`
/// at `qkv[t·3D ..]`) become `x / max(‖x‖₂, eps)`; v is left alone.
pub fn qk_norm_tokens(gpu: &Gpu, pass: &mut Pass, qkv: &wgpu::Buffer, n_head: u32, head_dim: u32, eps: f32, tokens: u32) {
    expect_head_dim(head_dim);
    expect_floats(qkv, tokens * 3 * n_head * head_dim, "q|k|v");
    let kernel = gpu.kernel("kda.wgsl", SHADER, "kda_qk_norm");
    pass.dispatch(gpu, &kernel, &[qkv], &[P::U(n_head), P::U(head_dim), P::F(eps), P::U(tokens)], n_head * tokens);
}

/// Value columns per workgroup of `kda_delta_chunk`.
const DELTA_COLUMNS: u32 = 32;

/// [`step`]'s delta rule through `tokens` tokens in order (equal to `tokens` steps), q and k already normalised by
/// [`qk_norm_tokens`]: token t's `[q̂ | k̂ | v]` at `qkv[t·3D ..]`, its gates at `gb[t·(D + n_head) ..]`, its output at
/// `o[t·D ..]`; `state` carries in and out. `head_dim` ≤ 256.
#[allow(clippy::too_many_arguments)]
pub fn delta_tokens(gpu: &Gpu, pass: &mut Pass, qkv: &wgpu::Buffer, gb: &wgpu::Buffer, state: &wgpu::Buffer, o: &wgpu::Buffer, n_head: u32, head_dim: u32, tokens: u32) {
    expect_head_dim(head_dim);
    let dim = n_head * head_dim;
    expect_floats(qkv, tokens * 3 * dim, "q|k|v");
    expect_floats(gb, tokens * (dim + n_head), "gates");
    expect_floats(state, dim * head_dim, "delta state");
    expect_floats(o, tokens * dim, "delta output");
    let kernel = delta_rule_kernel(gpu, "kda_delta_chunk", head_dim);
    pass.dispatch_3d(gpu, &kernel, &[qkv, gb, state, o], &[P::U(n_head), P::U(head_dim), P::U(tokens)], (head_dim.div_ceil(DELTA_COLUMNS), n_head, 1));
}

/// Lanes per value column of the delta rule (`DC_LANES` in the shader).
const DELTA_LANES: u32 = 8;

/// `entry` of kda.wgsl built with `DC_SPAN` (the key indices each lane of the delta rule holds in registers)
/// sized to `head_dim`: ⌈head_dim / DC_LANES⌉ rounded up to a power of two, rather than the shader's 32 (enough
/// for any head_dim up to 256), since a lane's loops run to DC_SPAN. On the H100 at Flash's head_dim of 128, a span
/// of 16 made a decode token 1.9 % faster and a 2048-token chunk 2.6 % (`kda_delta_chunk` 2.3 ms a layer).
/// On a device with subgroups of DC_LANES or more, a value column's sums shuffle across its lanes
/// ([`COLUMN_SUMS_SHUFFLED`]) instead of going through workgroup memory behind a barrier apiece: on the H100,
/// `kda_delta_chunk` then took 11 % less time (2.31 → 2.06 ms a layer over 2048 tokens), `kda_step` 5 % less,
/// and a 2048-token chunk prefilled 1.3 % faster (device run 16).
fn delta_rule_kernel(gpu: &Gpu, entry: &str, head_dim: u32) -> std::rc::Rc<super::Kernel> {
    let span = head_dim.div_ceil(DELTA_LANES).next_power_of_two();
    let shuffled = gpu.subgroup_lanes().is_some_and(|lanes| lanes >= DELTA_LANES);
    gpu.kernel_built(&format!("kda.wgsl span{span}{}", if shuffled { " sg" } else { "" }), entry, || {
        assert!(SHADER.contains(&format!("const DC_LANES: u32 = {DELTA_LANES}u;")), "kda.wgsl has {DELTA_LANES} DC_LANES");
        let mut s = SHADER.to_string();
        super::kernel::replace_once(&mut s, "const DC_SPAN: u32 = 32u;", &format!("const DC_SPAN: u32 = {span}u;"));
        if shuffled {
            super::kernel::replace_marked(&mut s, COLUMN_SUMS, COLUMN_SUMS_SHUFFLED);
        }
        s
    })
}

/// Where kda.wgsl's column sums (through workgroup memory) begin and end.
const COLUMN_SUMS: [&str; 2] = ["// column sums:", "// column sums end\n"];

/// The column sums by subgroup shuffles (a butterfly, so every lane of a column ends with the same total), with
/// no barrier: a column's DC_LANES lanes are aligned neighbours, inside one subgroup of at least as many.
const COLUMN_SUMS_SHUFFLED: &str = "fn column_sum_a(v: f32, lid: u32) -> f32 {
    var s = v;
    for (var m = DC_LANES / 2u; m > 0u; m >>= 1u) { s += subgroupShuffleXor(s, m); }
    return s;
}
fn column_sum_b(v: f32, lid: u32) -> f32 { return column_sum_a(v, lid); }
";
