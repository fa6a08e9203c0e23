//! Matrix-vector products over ggml rows (`shaders/matvec.wgsl`): dense, batched with strides (one matrix
//! per head), and over the experts the router selected, read from their slots of the expert pool.

use super::{Gpu, Pass, P};
use crate::quant::GgmlType;

const QUANT: &str = include_str!("../../shaders/quant.wgsl");
const MATVEC: &str = include_str!("../../shaders/matvec.wgsl");
const EXPERTS: &str = include_str!("../../shaders/matvec_experts.wgsl");
const DENSE_MARKER: &str = "// ---- dense entry point";

/// How the kernel is specialised (compile-time constants of matvec.wgsl): rows per lane group, whether quants
/// become f32 through exponent bits (`magic`) or an integer conversion, Q4_K/Q6_K rows one block at a time
/// (`narrow`) or two side by side, x read as f32 only (`scalar_x`) even where it could be read as vec4, each
/// row by one invocation with no barrier (`whole_rows`, for CPU adapters) instead of a group of lanes, and Q6_K
/// blocks by 8 lanes of 32 values instead of 16 of 16 (`octets`: a lane's scale and d words then serve twice the
/// values), Q4_K blocks likewise (`q4k_octets`: 8 lanes of 32 values, four words of quants each, not two), rows
/// of 8 blocks or more four blocks side by side (`four_sides`: a lane then walks its row in fewer steps), and,
/// with blocks by 8 lanes, each lane's next block's words loaded before it works through this one (`prefetch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub rows: u32,
    pub magic: bool,
    pub narrow: bool,
    pub scalar_x: bool,
    pub whole_rows: bool,
    pub octets: bool,
    pub q4k_octets: bool,
    pub four_sides: bool,
    pub prefetch: bool,
}

const fn v(rows: u32, magic: bool, narrow: bool, scalar_x: bool) -> Variant {
    Variant { rows, magic, narrow, scalar_x, whole_rows: false, octets: false, q4k_octets: false, four_sides: false, prefetch: false }
}

const fn octets(rows: u32) -> Variant {
    Variant { octets: true, ..v(rows, false, false, false) }
}

/// Q6_K and Q4_K blocks both by 8 lanes, two or four blocks side by side.
const fn all_octets(rows: u32, four_sides: bool) -> Variant {
    Variant { q4k_octets: true, four_sides, ..octets(rows) }
}

/// [`all_octets`], each lane's next block loaded ahead.
const fn prefetched(rows: u32, four_sides: bool) -> Variant {
    Variant { prefetch: true, ..all_octets(rows, four_sides) }
}

const fn whole(rows: u32) -> Variant {
    Variant { rows, magic: false, narrow: false, scalar_x: false, whole_rows: true, octets: false, q4k_octets: false, four_sides: false, prefetch: false }
}

impl Variant {
    pub const ALL: [Variant; 24] = [
        v(1, false, false, false),
        v(2, false, false, false),
        v(4, false, false, false),
        v(1, true, false, false),
        v(2, true, false, false),
        v(4, true, false, false),
        v(2, false, true, false),
        v(4, false, true, false),
        octets(1),
        octets(2),
        all_octets(1, false),
        all_octets(2, false),
        all_octets(1, true),
        all_octets(2, true),
        Variant { four_sides: true, ..octets(1) },
        Variant { four_sides: true, ..octets(2) },
        octets(4),
        Variant { four_sides: true, ..octets(4) },
        prefetched(1, false),
        prefetched(2, false),
        prefetched(1, true),
        prefetched(2, true),
        v(4, false, false, true),
        whole(1),
    ];

    /// The variant [`matvec`], [`batched`] and [`experts`] use for a matrix: the fastest measured on the H100
    /// (bench-kernels --variants all): Q6_K blocks by 8 lanes, 2 rows a lane group only for a head-sized matrix
    /// (the head: 156 µs against 177 for 4 rows a group of 16 lanes a block, one block at a time, the best
    /// before; 68–69 % of the read rate against 60 %); one row a group for the rest (a KDA layer's stacked
    /// projections, 20,512 rows, ran 20 % faster than with 4; the experts' Q6_K down products by 8 lanes a block
    /// took 16 µs against 17–18 by 16). `octets` changes nothing for the other types.
    /// On a CPU adapter (SwiftShader, lavapipe) every matrix takes whole rows: there a kernel without barriers
    /// runs its invocations straight through, and the tiny model's decode step took SwiftShader about a third
    /// of the time (0.8 s → 0.22–0.28 s, native bench on Chromium's SwiftShader).
    pub fn for_matrix(gpu: &Gpu, m: Matrix) -> Variant {
        if gpu.cpu_kernels() {
            return Self::ENGINE[2];
        }
        let v = if m.rows >= 65536 { Self::ENGINE[1] } else { Self::ENGINE[0] };
        let trial = ENGINE_TRIAL.load(std::sync::atomic::Ordering::Relaxed);
        Variant { q4k_octets: v.q4k_octets || trial & 1 != 0, four_sides: v.four_sides || trial & 2 != 0, prefetch: v.prefetch || trial & 4 != 0, ..v }
    }

    /// The variants [`Variant::for_matrix`] picks from (the others are `lingtab bench-kernels` options).
    pub const ENGINE: [Variant; 3] = [octets(1), octets(2), whole(1)];

    pub fn name(self) -> String {
        format!(
            "r{}{}{}{}{}{}{}{}{}",
            self.rows,
            if self.magic { "m" } else { "i" },
            if self.narrow { "n" } else { "" },
            if self.scalar_x { "s" } else { "" },
            if self.whole_rows { "w" } else { "" },
            if self.octets { "8" } else { "" },
            if self.q4k_octets { "q" } else { "" },
            if self.four_sides { "x4" } else { "" },
            if self.prefetch { "p" } else { "" }
        )
    }

    /// This variant with a group of lanes a row: what an RMSNorm product takes (its norm is staged by the
    /// workgroup, behind barriers).
    fn in_lanes(self) -> Variant {
        Variant { whole_rows: false, ..self }
    }

    pub fn parse(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s)
    }
}

/// What the engine's products take beyond their variants on a GPU ([`set_engine_trial`]): bit 0 `q4k_octets`, bit
/// 1 `four_sides`, bit 2 `prefetch`.
static ENGINE_TRIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Q4_K blocks by 8 lanes, rows four blocks side by side and/or the next block loaded ahead in the engine's
/// products on a GPU (`lingtab bench --q4k-octets --four-sides --prefetch`, to compare with the variants
/// [`Variant::for_matrix`] picks).
pub fn set_engine_trial(q4k_octets: bool, four_sides: bool, prefetch: bool) {
    ENGINE_TRIAL.store(q4k_octets as u32 | (four_sides as u32) << 1 | (prefetch as u32) << 2, std::sync::atomic::Ordering::Relaxed);
}

const X_SCALAR: [&str; 3] = [
    "var<storage, read> x: array<f32>;",
    "fn x1(i: u32) -> f32 { return x[i]; }",
    "fn x4(i: u32) -> vec4<f32> { return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]); }",
];
const X_VEC4: [&str; 3] = [
    "var<storage, read> x: array<vec4<f32>>;",
    "fn x1(i: u32) -> f32 { return x[i >> 2u][i & 3u]; }",
    "fn x4(i: u32) -> vec4<f32> { return x[i >> 2u]; }",
];

/// How a product reads its x: as f32, as vec4 (every offset a multiple of 4), as the SwiGLU activation of
/// [gate | up] pairs ([`GLU_MAX_COLS`] at most), as its RMSNorm ([`NORM_MAX_COLS`] at most), or as the sum of
/// a split product's partial outputs ([`SLICES_MAX_COLS`] at most), the last three staged in workgroup memory of the given length (the product's columns rounded up to a whole workgroup's: a
/// kernel holds no more than its matrices need, which on SwiftShader, the browser tests' CPU WebGPU, made the
/// tiny model's SwiGLU products compile about 4× and run 2× faster than with room for the longest rows; 0 for
/// the whole-rows variants, which stage nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum XRead {
    Scalar,
    Vec4,
    Glu(u32),
    Norm(u32),
    Slices(u32),
}

/// Floats of workgroup memory a product of `cols` columns stages its input in.
fn staged_len(cols: u32) -> u32 {
    cols.next_multiple_of(WORKGROUP)
}

/// The longest row a SwiGLU product takes (its activations staged in 8 KiB of workgroup memory at most).
pub const GLU_MAX_COLS: u32 = 2048;

/// The longest row a summed-slices product takes (its sums staged in 8 KiB of workgroup memory at most), and the
/// most slices it adds.
pub const SLICES_MAX_COLS: u32 = 2048;
pub const MAX_SLICES: u32 = 16;

/// The WGSL of a variant's dense or expert entry point, with x read as `x_read` says, reductions shuffling across
/// `subgroup` lanes (1: workgroup memory only) and (dense, `gated`) each batch's outputs gated, for matrices of
/// type `ty`.
fn source(v: Variant, x_read: XRead, subgroup: u32, experts: bool, gated: bool, ty: GgmlType) -> String {
    let core = &MATVEC[..MATVEC.find(DENSE_MARKER).expect("matvec.wgsl has the dense-entry marker")];
    let mut s = if experts { format!("{QUANT}{core}{EXPERTS}") } else { format!("{QUANT}{MATVEC}") };
    if v.whole_rows {
        super::kernel::replace_marked(&mut s, LANES_SUM, "");
    }
    let mut swap = |from: &str, to: &str| super::kernel::replace_once(&mut s, from, to);
    swap("const ROWS: u32 = 2u;", &format!("const ROWS: u32 = {}u;", v.rows));
    swap("const MAGIC: bool = true;", &format!("const MAGIC: bool = {};", v.magic));
    swap("const TY: u32 = 12u;", &format!("const TY: u32 = {}u;", ty.id()));
    if v.octets && !v.whole_rows {
        swap("const Q6K_LANES: u32 = 16u;", "const Q6K_LANES: u32 = 8u;");
    }
    if v.q4k_octets && !v.whole_rows {
        swap("const Q4K_LANES: u32 = 16u;", "const Q4K_LANES: u32 = 8u;");
    }
    if v.prefetch && !v.whole_rows {
        swap("const PREFETCH: bool = false;", "const PREFETCH: bool = true;");
    }
    if subgroup > 1 {
        swap(SUBGROUP_SUM[0], &format!("const SUBGROUP: u32 = {subgroup}u;"));
        swap(SUBGROUP_SUM[1], SUBGROUP_SUM[2]);
    }
    if v.whole_rows {
        swap(BLOCK_LOOP[0], BLOCK_LOOP[1]);
        if experts {
            swap(EXPERT_SLOT, "let slot = expert_slot(j);");
        }
    }
    match x_read {
        XRead::Scalar => {}
        XRead::Vec4 => {
            for (from, to) in X_SCALAR.iter().zip(X_VEC4) {
                swap(from, to);
            }
        }
        XRead::Glu(_) if v.whole_rows => {
            for (from, to) in X_SCALAR[1..].iter().zip(X_GLU_DIRECT) {
                swap(from, to);
            }
        }
        XRead::Glu(len) => {
            for (from, to) in X_SCALAR[1..].iter().zip(X_GLU) {
                swap(from, to);
            }
            swap(STAGE_X, STAGE_GLU);
            swap("const GLU_LEN: u32 = 2048u;", &format!("const GLU_LEN: u32 = {len}u;"));
        }
        XRead::Norm(len) => {
            assert!(!experts, "the RMSNorm variant is a dense product's");
            for (from, to) in X_SCALAR[1..].iter().zip(X_NORMED) {
                swap(from, to);
            }
            swap(STAGE_X, STAGE_NORM);
            swap("const NORM_LEN: u32 = 3072u;", &format!("const NORM_LEN: u32 = {len}u;"));
            swap(DENSE_PARAMS, NORM_BINDINGS);
        }
        XRead::Slices(_) if v.whole_rows => {
            for (from, to) in X_SCALAR[1..].iter().zip(X_SLICES_DIRECT) {
                swap(from, to);
            }
        }
        XRead::Slices(len) => {
            for (from, to) in X_SCALAR[1..].iter().zip(X_SLICES) {
                swap(from, to);
            }
            swap(STAGE_X, STAGE_SLICES);
            swap("const SLICES_LEN: u32 = 2048u;", &format!("const SLICES_LEN: u32 = {len}u;"));
        }
    }
    if gated {
        assert!(!experts && !matches!(x_read, XRead::Norm(_)), "a gated product is a dense one without a norm");
        swap(SCALED, SCALED_BY_GATE);
        swap(DENSE_PARAMS, GATE_BINDINGS);
    }
    s
}

/// x1/x4 of a SwiGLU variant: the staged activations.
const X_GLU: [&str; 2] = [
    "fn x1(i: u32) -> f32 { return x_glu[i]; }",
    "fn x4(i: u32) -> vec4<f32> { return vec4<f32>(x_glu[i], x_glu[i + 1u], x_glu[i + 2u], x_glu[i + 3u]); }",
];

/// x1/x4 of a whole-rows SwiGLU variant: the activations computed as read (STAGE_GLU's, in its order), each
/// invocation reading its whole row's.
const X_GLU_DIRECT: [&str; 2] = [
    "fn glu_act(g: f32, u: f32) -> f32 {
    var up = u;
    var silu = g / (1.0 + exp(-g));
    if (glu_limit > 1e-6) {
        silu = min(silu, glu_limit);
        up = clamp(up, -glu_limit, glu_limit);
    }
    return silu * up;
}
fn x1(i: u32) -> f32 { return glu_act(x[i], x[i + p.glu_ff]); }",
    "fn x4(i: u32) -> vec4<f32> { return vec4<f32>(x1(i), x1(i + 1u), x1(i + 2u), x1(i + 3u)); }",
];

const STAGE_X: &str = "fn stage_x(xb: u32, lid: u32, first: bool) -> u32 { return xb; }";

/// Where matvec.wgsl's sum of a row's lanes begins and ends: the whole-rows variants (one invocation a row:
/// nothing to add) leave it out. On SwiftShader, the browser tests' CPU WebGPU, a kernel with any barrier runs its
/// invocations as coroutines, and the tiny model's products ran 3 to 4 times slower for it. (Left out as text:
/// with the sum moved into a function for both, the head's product took 234 µs instead of 182 on the H100.)
const LANES_SUM: [&str; 2] = ["    // lanes sum:", "    // lanes sum end\n"];

/// The Q4_K/Q6_K loop of matvec.wgsl (lane t of 16 or 32 on one block's part t at a time) and the whole-rows
/// variants' (one invocation through every part of every block). The lanes' loop kept apart: with a loop over
/// parts for both, the head's product took 216 µs instead of 182 on the H100.
const BLOCK_LOOP: [&str; 2] = [
    "let per_block = select(Q4K_LANES, Q6K_LANES, TY == 14u);
            let t = lane % per_block;
            let side = max(p.lanes / per_block, 1u); // never 0: every loop must end (kernel.rs)
            let block_bytes = select(144u, 210u, TY == 14u);
            for (var blk = lane / per_block; blk < p.cols / 256u; blk += side) {",
    "let block_bytes = select(144u, 210u, TY == 14u);
            for (var part = 0u; part < 16u * (p.cols / 256u); part++) {
                let blk = part / 16u;
                let t = part % 16u;",
];

/// How matvec_experts.wgsl reads the selected expert's slot: once for the workgroup (uniform for rows_dot's
/// barriers); the whole-rows variant, without barriers, reads it in every invocation.
const EXPERT_SLOT: &str = "if (lid == 0u) { selected_slot = expert_slot(j); }
    // one load for the workgroup, and uniform control flow for the barriers in rows_dot
    let slot = workgroupUniformLoad(&selected_slot);";

/// x1/x4 of a summed-slices variant: the staged sums.
const X_SLICES: [&str; 2] = [
    "fn x1(i: u32) -> f32 { return x_sum[i]; }",
    "fn x4(i: u32) -> vec4<f32> { return vec4<f32>(x_sum[i], x_sum[i + 1u], x_sum[i + 2u], x_sum[i + 3u]); }",
];

/// x1/x4 of a whole-rows summed-slices variant: the sums added as read (STAGE_SLICES', in its order).
const X_SLICES_DIRECT: [&str; 2] = [
    "fn x1(i: u32) -> f32 {
    var total = 0.0;
    for (var s = 0u; s < min(p.slices, 16u); s++) { total += x[i + s * p.slice_stride]; }
    return total;
}",
    "fn x4(i: u32) -> vec4<f32> { return vec4<f32>(x1(i), x1(i + 1u), x1(i + 2u), x1(i + 3u)); }",
];

/// The sum of the slices' partial outputs at xb, as matmul_sum_slices adds them (from 0, in slice order), staged
/// in workgroup memory (SLICES_LEN: the staged length, [`XRead::Slices`]'). Every slice's value is loaded before
/// any is added, the index clamped to the last slice: loads behind a branch would be issued one latency apart.
const STAGE_SLICES: &str = "const SLICES_LEN: u32 = 2048u;
var<workgroup> x_sum: array<f32, SLICES_LEN>;
fn stage_x(xb: u32, lid: u32, first: bool) -> u32 {
    let last = max(p.slices, 1u) - 1u;
    for (var i = lid; i < min(p.cols, SLICES_LEN); i += WG) {
        var parts: array<f32, 16>;
        for (var s = 0u; s < 16u; s++) { parts[s] = x[xb + min(s, last) * p.slice_stride + i]; }
        var total = 0.0;
        for (var s = 0u; s < 16u; s++) {
            if (s < p.slices) { total += parts[s]; }
        }
        x_sum[i] = total;
    }
    workgroupBarrier();
    return 0u;
}";

/// matvec.wgsl's batch outputs as stored, and the gated variants' ([`Gate`]): times σ of the batch's logit,
/// computed as mla_head_gate computes it.
const SCALED: &str = "fn scaled(sums: array<f32, ROWS>, b: u32) -> array<f32, ROWS> { return sums; }";
const SCALED_BY_GATE: &str = "fn scaled(sums: array<f32, ROWS>, b: u32) -> array<f32, ROWS> {
    let gate = 1.0 / (1.0 + exp(-gate_logits[p.gate_offset + b]));
    var out = sums;
    for (var r = 0u; r < ROWS; r++) { out[r] *= gate; }
    return out;
}";
/// A gated variant's bindings: the gate logits, then Params.
const GATE_BINDINGS: &str = "@group(0) @binding(3) var<storage, read> gate_logits: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;";

/// x1/x4 of an RMSNorm variant: the staged norm.
const X_NORMED: [&str; 2] = [
    "fn x1(i: u32) -> f32 { return x_normed[i]; }",
    "fn x4(i: u32) -> vec4<f32> { return vec4<f32>(x_normed[i], x_normed[i + 1u], x_normed[i + 2u], x_normed[i + 3u]); }",
];

const DENSE_PARAMS: &str = "@group(0) @binding(3) var<uniform> p: Params;";
/// An RMSNorm variant's bindings: the norm's weights, where the first workgroup writes the norm, then Params.
const NORM_BINDINGS: &str = "@group(0) @binding(3) var<storage, read> norm_w: array<f32>;
@group(0) @binding(4) var<storage, read_write> norm_out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;";

/// The longest row an RMSNorm product takes (its norm staged in 12 KiB of workgroup memory at most, beside a
/// reduction of up to 4 KiB).
pub const NORM_MAX_COLS: u32 = 3072;

/// rms_norm(x)·norm_w of the row at xb, computed as norm.wgsl's rms_norm computes it (each invocation's sum of
/// squares over values lid + k·WG in order, then the same tree), staged in workgroup memory (NORM_LEN: the staged
/// length, [`XRead::Norm`]'s); the first workgroup writes it to norm_out as well.
const STAGE_NORM: &str = "const NORM_LEN: u32 = 3072u;
const NORM_HELD: u32 = NORM_LEN / WG;
var<workgroup> x_normed: array<f32, NORM_LEN>;
fn stage_x(xb: u32, lid: u32, first: bool) -> u32 {
    let n = min(p.cols, NORM_LEN);
    var acc = 0.0;
    for (var k = 0u; k < NORM_HELD; k++) {
        let i = lid + k * WG;
        if (i < n) {
            let v = x[xb + i];
            x_normed[i] = v;
            acc += v * v;
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { partial[lid] += partial[lid + s]; }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(partial[0] / f32(n) + p.norm_eps);
    for (var k = 0u; k < NORM_HELD; k++) {
        let i = lid + k * WG;
        if (i < n) {
            let v = (x_normed[i] * scale) * norm_w[i];
            x_normed[i] = v;
            if (first && i < arrayLength(&norm_out)) { norm_out[i] = v; }
        }
    }
    workgroupBarrier();
    return 0u;
}";
/// The activations of the row's inputs, each computed once per workgroup as moe.wgsl's swiglu computes it (GLU_LEN:
/// the staged length, [`XRead::Glu`]'s).
const STAGE_GLU: &str = "const GLU_LEN: u32 = 2048u;
var<workgroup> x_glu: array<f32, GLU_LEN>;
fn stage_x(xb: u32, lid: u32, first: bool) -> u32 {
    for (var i = lid; i < min(p.cols, GLU_LEN); i += WG) {
        let g = x[xb + i];
        var up = x[xb + p.glu_ff + i];
        var silu = g / (1.0 + exp(-g));
        if (glu_limit > 1e-6) {
            silu = min(silu, glu_limit);
            up = clamp(up, -glu_limit, glu_limit);
        }
        x_glu[i] = silu * up;
    }
    workgroupBarrier();
    return 0u;
}";

/// matvec.wgsl's reduction without subgroups, and the shuffling one put in its place on a device with them.
const SUBGROUP_SUM: [&str; 3] = [
    "const SUBGROUP: u32 = 1u;",
    "fn subgroup_sum(v: f32, width: u32) -> f32 { return v; }",
    "fn subgroup_sum(v: f32, width: u32) -> f32 {
    var s = v;
    for (var m = width / 2u; m > 0u; m >>= 1u) { s += subgroupShuffleXor(s, m); }
    return s;
}",
];

/// The kernel of a variant on this GPU.
fn kernel(gpu: &Gpu, v: Variant, x_read: XRead, experts: bool, gated: bool, ty: GgmlType) -> std::rc::Rc<super::Kernel> {
    // the narrow variants reduce through workgroup memory: with subgroup shuffles the head ran 30 % slower on the
    // H100 (221 → 305 µs, two runs of bench-kernels) and 3 % faster on the H200
    let subgroup = if v.narrow { 1 } else { gpu.subgroup_lanes().unwrap_or(1) };
    let name = if experts { "matvec_experts" } else { "matvec" };
    // (the label is the kernel's key in the GPU's cache: it names everything the source depends on)
    let read = match x_read {
        XRead::Scalar => String::new(),
        XRead::Vec4 => " x4".into(),
        XRead::Glu(len) => format!(" glu{len}"),
        XRead::Norm(len) => format!(" norm{len}"),
        XRead::Slices(len) => format!(" slices{len}"),
    };
    let label = format!("{name}.wgsl {ty:?} {}{read}{}{}", v.name(), if gated { " gated" } else { "" }, if subgroup > 1 { format!(" sg{subgroup}") } else { String::new() });
    gpu.kernel_built(&label, name, || source(v, x_read, subgroup, experts, gated, ty))
}

/// How the product reads x: the SwiGLU activation of [gate | up] pairs, the RMSNorm of x, the sum of slices, else
/// as vec4 where
/// every offset is a multiple of 4 floats and the buffer whole vec4s, else as f32; for a product of `cols`
/// columns.
fn x_read(v: Variant, x: &wgpu::Buffer, at: Strided, input: Input, cols: u32) -> XRead {
    if matches!(input, Input::Glu(_)) {
        // whole rows compute the activations as they read them: nothing staged, one kernel for every length
        XRead::Glu(if v.whole_rows { 0 } else { staged_len(cols) })
    } else if matches!(input, Input::Norm(_)) {
        XRead::Norm(staged_len(cols))
    } else if matches!(input, Input::Slices(_)) {
        XRead::Slices(if v.whole_rows { 0 } else { staged_len(cols) })
    } else if !v.scalar_x && at.offset % 4 == 0 && at.stride % 4 == 0 && x.size() % 16 == 0 {
        XRead::Vec4
    } else {
        XRead::Scalar
    }
}

/// A product whose input is a SwiGLU's activation: x holds each batch's gate then, `ff` floats on, its up
/// values; with `limit > 1e-6` the clamps of swiglu_clamp_exp/_shexp ([`super::moe::swiglu`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Glu {
    pub ff: u32,
    pub limit: f32,
}

/// A product whose input is the RMSNorm of x: `x / √(mean x² + ε) · w`, computed as [`super::norm::rms_norm`]
/// computes it, by each workgroup as it reads x; the first workgroup also writes it to `out` (x's length), for
/// the products after this one. The norm's dispatch before the product is not needed.
#[derive(Clone, Copy, Debug)]
pub struct Norm<'a> {
    pub w: &'a wgpu::Buffer,
    pub eps: f32,
    pub out: &'a wgpu::Buffer,
}

/// A product whose x is the sum of `count` vectors `stride` floats apart (from x's offset on): the partial
/// outputs of a product split by columns ([`super::matmul::sum_slices`]'s sum, in its order), so that the sum
/// needs no dispatch of its own. At most [`MAX_SLICES`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slices {
    pub count: u32,
    pub stride: u32,
}

/// Batch b's outputs times `σ(logits[at + b])` ([`super::mla::head_gate`]'s arithmetic): an MLA layer's head-wise
/// gate applied by its value product.
#[derive(Clone, Copy, Debug)]
pub struct Gate<'a> {
    pub logits: &'a wgpu::Buffer,
    pub at: u32,
}

/// What a product's x is: the vector itself, a SwiGLU's [gate | up] ([`Glu`]), a vector to normalise
/// ([`Norm`]), or a sum of slices ([`Slices`]).
#[derive(Clone, Copy, Debug)]
enum Input<'a> {
    Plain,
    Glu(Glu),
    Norm(Norm<'a>),
    Slices(Slices),
}

/// A matrix of `rows` rows of `cols` values of type `ty`, starting at `byte_offset` of its buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matrix {
    pub ty: GgmlType,
    pub rows: u32,
    pub cols: u32,
    pub byte_offset: u64,
}

impl Matrix {
    pub fn row_bytes(&self) -> u32 {
        self.ty.bytes_for(self.cols as u64).expect("rows are whole blocks") as u32
    }
}

/// Where a batch's vectors sit: element offset of batch 0 and the stride between batches.
#[derive(Clone, Copy, Debug, Default)]
pub struct Strided {
    pub offset: u32,
    pub stride: u32,
}

impl Strided {
    pub fn at(offset: u32) -> Strided {
        Strided { offset, stride: 0 }
    }
}

/// y[y.offset + r] = Σ_i W[r, i]·x[x.offset + i] for every row r.
pub fn matvec(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, x: &wgpu::Buffer, x_at: u32, y: &wgpu::Buffer, y_at: u32) {
    batched(gpu, pass, w, m, 0, x, Strided::at(x_at), y, Strided::at(y_at), 1);
}

/// y[y.offset + r] += Σ_i W[r, i]·x[x.offset + i] for every row r: a product and the residual add after it in
/// one dispatch (y must not overlap x).
#[allow(clippy::too_many_arguments)]
pub fn matvec_add(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, x: &wgpu::Buffer, x_at: u32, y: &wgpu::Buffer, y_at: u32) {
    dense(Variant::for_matrix(gpu, m), gpu, pass, w, m, 0, x, Strided::at(x_at), y, Strided::at(y_at), 1, true);
}

/// `n` products: matrix b at `m.byte_offset + b·w_stride` bytes, its x and y at their strided offsets.
#[allow(clippy::too_many_arguments)]
pub fn batched(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, w_stride: u64, x: &wgpu::Buffer, x_at: Strided, y: &wgpu::Buffer, y_at: Strided, n: u32) {
    batched_as(Variant::for_matrix(gpu, m), gpu, pass, w, m, w_stride, x, x_at, y, y_at, n);
}

/// [`batched`] whose x is a sum of slices ([`Slices`], or x itself with None) and whose outputs are gated ([`Gate`],
/// or not with None): an MLA decode step's value product, the sum of its attention's column slices before it
/// and its head-wise gate after it in one dispatch.
#[allow(clippy::too_many_arguments)]
pub fn batched_with(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, w_stride: u64, x: &wgpu::Buffer, x_at: Strided, slices: Option<Slices>, gate: Option<Gate>, y: &wgpu::Buffer, y_at: Strided, n: u32) {
    batched_with_as(Variant::for_matrix(gpu, m), gpu, pass, w, m, w_stride, x, x_at, slices, gate, y, y_at, n);
}

/// [`batched_with`] with a given kernel variant.
#[allow(clippy::too_many_arguments)]
pub fn batched_with_as(v: Variant, gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, w_stride: u64, x: &wgpu::Buffer, x_at: Strided, slices: Option<Slices>, gate: Option<Gate>, y: &wgpu::Buffer, y_at: Strided, n: u32) {
    let input = slices.map_or(Input::Plain, Input::Slices);
    dense_segments(v, gpu, pass, w, m, w_stride, x, x_at, y, y_at, n, false, &[], input, gate);
}

/// [`batched`] with a given kernel variant.
#[allow(clippy::too_many_arguments)]
pub fn batched_as(v: Variant, gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, w_stride: u64, x: &wgpu::Buffer, x_at: Strided, y: &wgpu::Buffer, y_at: Strided, n: u32) {
    dense(v, gpu, pass, w, m, w_stride, x, x_at, y, y_at, n, false);
}

#[allow(clippy::too_many_arguments)]
fn dense(v: Variant, gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, w_stride: u64, x: &wgpu::Buffer, x_at: Strided, y: &wgpu::Buffer, y_at: Strided, n: u32, accumulate: bool) {
    dense_segments(v, gpu, pass, w, m, w_stride, x, x_at, y, y_at, n, accumulate, &[], Input::Plain, None);
}

/// [`matvec`] (`accumulate`: [`matvec_add`]) of a SwiGLU's activation: x at `x_at` holds the gate, `glu.ff`
/// floats on the up values ([`Glu`]); the down product of an FFN without a swiglu dispatch before it.
/// `m.cols` ≤ [`GLU_MAX_COLS`].
#[allow(clippy::too_many_arguments)]
pub fn matvec_glu(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, x: &wgpu::Buffer, x_at: u32, glu: Glu, y: &wgpu::Buffer, y_at: u32, accumulate: bool) {
    dense_segments(Variant::for_matrix(gpu, m), gpu, pass, w, m, 0, x, Strided::at(x_at), y, Strided::at(y_at), 1, accumulate, &[], Input::Glu(glu), None);
}

/// [`matvec`] of x's RMSNorm ([`Norm`]), which the product also leaves in `norm.out`. `m.cols` ≤
/// [`NORM_MAX_COLS`].
#[allow(clippy::too_many_arguments)]
pub fn matvec_norm(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, x: &wgpu::Buffer, x_at: u32, norm: Norm, y: &wgpu::Buffer, y_at: u32) {
    dense_segments(Variant::for_matrix(gpu, m), gpu, pass, w, m, 0, x, Strided::at(x_at), y, Strided::at(y_at), 1, false, &[], Input::Norm(norm), None);
}

#[allow(clippy::too_many_arguments)]
fn dense_segments(v: Variant, gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, w_stride: u64, x: &wgpu::Buffer, x_at: Strided, y: &wgpu::Buffer, y_at: Strided, n: u32, accumulate: bool, segments: &[Segment], input: Input, gate: Option<Gate>) {
    assert!(m.cols % 32 == 0, "matvec rows must be whole 32-value sub-blocks");
    let v = if matches!(input, Input::Norm(_)) { v.in_lanes() } else { v };
    check_input(m, input);
    let kernel = kernel(gpu, v, x_read(v, x, x_at, input, m.cols), false, gate.is_some(), m.ty);
    let mut params = params(m, v, m.byte_offset, w_stride, x_at, y_at, [0, 0, 1, 0], accumulate);
    set_segments(&mut params, segments);
    set_input(&mut params, input);
    let (gx, gy) = gpu.grid(workgroups(m, v));
    match (input, gate) {
        (Input::Norm(norm), None) => {
            assert!(n == 1, "an RMSNorm product has one x");
            pass.dispatch_3d(gpu, &kernel, &[w, x, y, norm.w, norm.out], &params, (gx, gy, n));
        }
        (Input::Norm(_), Some(_)) => unreachable!("a gated product is a dense one without a norm"),
        (_, Some(gate)) => {
            params[GATE_AT] = P::U(gate.at);
            pass.dispatch_3d(gpu, &kernel, &[w, x, y, gate.logits], &params, (gx, gy, n));
        }
        (_, None) => pass.dispatch_3d(gpu, &kernel, &[w, x, y], &params, (gx, gy, n)),
    }
}

fn check_input(m: Matrix, input: Input) {
    match input {
        Input::Plain => {}
        Input::Glu(_) => assert!(m.cols <= GLU_MAX_COLS, "a SwiGLU product's rows are at most {GLU_MAX_COLS} values"),
        Input::Norm(_) => assert!(m.cols <= NORM_MAX_COLS, "an RMSNorm product's rows are at most {NORM_MAX_COLS} values"),
        Input::Slices(s) => assert!(m.cols <= SLICES_MAX_COLS && (1..=MAX_SLICES).contains(&s.count), "a summed-slices product's rows are at most {SLICES_MAX_COLS} values, of 1..={MAX_SLICES} slices"),
    }
}

/// Where the rows of one of several stacked matrices go: rows `first_row..` of the stack (up to the next
/// segment's) are written to y from `y_at` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub first_row: u32,
    pub y_at: u32,
}

/// The most matrices one stacked product takes (matvec.wgsl's segment table).
pub const MAX_SEGMENTS: usize = 8;

/// Stacked matrices that read the same x, one dispatch for all: `m` is the stack (every matrix's rows back to
/// back, one type and row length), and the rows of `segments[s]` go to `y[segments[s].y_at + i]` (segments in
/// ascending `first_row`, the first at row 0). The same as one [`matvec`] per matrix.
#[allow(clippy::too_many_arguments)]
pub fn stacked(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, segments: &[Segment], x: &wgpu::Buffer, x_at: u32, y: &wgpu::Buffer) {
    assert!(!segments.is_empty() && segments.len() <= MAX_SEGMENTS, "a stack holds 1..={MAX_SEGMENTS} matrices");
    assert!(segments[0].first_row == 0 && segments.windows(2).all(|s| s[0].first_row < s[1].first_row) && segments.last().unwrap().first_row < m.rows, "segments ascend from row 0 within the stack");
    dense_segments(Variant::for_matrix(gpu, m), gpu, pass, w, m, 0, x, Strided::at(x_at), y, Strided::at(0), 1, false, segments, Input::Plain, None);
}

/// The segment words of matvec.wgsl's Params (count, then 8 starts and 8 y offsets); none for a plain product.
fn set_segments(params: &mut [P], segments: &[Segment]) {
    let at = SEGMENTS_AT;
    params[at] = P::U(segments.len() as u32);
    for (i, s) in segments.iter().enumerate() {
        params[at + 4 + i] = P::U(s.first_row);
        params[at + 4 + MAX_SEGMENTS + i] = P::U(s.y_at);
    }
}

/// Words of Params from `segments` on: the count padded to 16 bytes, then the two tables.
const SEGMENT_WORDS: usize = 4 + 2 * MAX_SEGMENTS;
/// Where `segments` is among Params' words, and after the tables `glu_ff`, `glu_limit` and `norm_eps`, then the
/// shared expert's `shared_z`, `shared_slot` and `glu_limit_shared` (padded to 16 bytes).
const SEGMENTS_AT: usize = 16;
const GLU_AT: usize = SEGMENTS_AT + SEGMENT_WORDS;
const SHARED_AT: usize = GLU_AT + 3;
const SLICES_AT: usize = SHARED_AT + 3;
const GATE_AT: usize = SLICES_AT + 2;
/// Words of Params after the segment tables.
const TAIL_WORDS: usize = 12;

/// The SwiGLU words (glu_ff, glu_limit) or the RMSNorm's (norm_eps) after the segment tables.
fn set_input(params: &mut [P], input: Input) {
    match input {
        Input::Plain => {}
        Input::Glu(g) => {
            params[GLU_AT] = P::U(g.ff);
            params[GLU_AT + 1] = P::F(g.limit);
        }
        Input::Norm(n) => params[GLU_AT + 2] = P::F(n.eps),
        Input::Slices(s) => {
            params[SLICES_AT] = P::U(s.count);
            params[SLICES_AT + 1] = P::U(s.stride);
        }
    }
}

/// The expert pool as the expert kernels see one of its buffers.
#[derive(Clone, Copy, Debug)]
pub struct PoolChunk<'a> {
    pub buffer: &'a wgpu::Buffer,
    /// Index of this buffer among the pool's buffers.
    pub index: u32,
    pub slots_per_chunk: u32,
    pub slot_bytes: u64,
}

/// A layer's shared expert run with its routed experts, as one more batch of their products (after the `k`
/// selected): its record sits in pool slot `slot`, laid out as theirs; `glu_limit` is its SwiGLU's clamp
/// ([`Glu::limit`]) where the product reads one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharedExpert {
    pub slot: u32,
    pub glu_limit: f32,
}

/// For each of the `k` selected experts j (`sel[j]`, looked up in `slots[slot_base + ·]`): a product with the
/// matrix `m` found `m.byte_offset` bytes into the expert's slot, x at `x_at` + j·stride, y likewise.
/// Only experts whose slot lies in `chunk` are computed; call once per pool buffer.
#[allow(clippy::too_many_arguments)]
pub fn experts(gpu: &Gpu, pass: &mut Pass, chunk: PoolChunk, m: Matrix, sel: &wgpu::Buffer, slots: &wgpu::Buffer, slot_base: u32, k: u32, x: &wgpu::Buffer, x_at: Strided, y: &wgpu::Buffer, y_at: Strided) {
    experts_as(Variant::for_matrix(gpu, m), gpu, pass, chunk, m, sel, slots, slot_base, k, x, x_at, y, y_at);
}

/// [`experts`] with a given kernel variant.
#[allow(clippy::too_many_arguments)]
pub fn experts_as(v: Variant, gpu: &Gpu, pass: &mut Pass, chunk: PoolChunk, m: Matrix, sel: &wgpu::Buffer, slots: &wgpu::Buffer, slot_base: u32, k: u32, x: &wgpu::Buffer, x_at: Strided, y: &wgpu::Buffer, y_at: Strided) {
    experts_with(v, gpu, pass, chunk, m, sel, slots, slot_base, k, None, x, x_at, None, y, y_at);
}

/// [`experts`] of the experts' SwiGLU activations: expert j's gate at `x_at` + j·stride, its up values
/// `glu.ff` floats on ([`Glu`]); the experts' down products without a swiglu dispatch before them.
#[allow(clippy::too_many_arguments)]
pub fn experts_glu(gpu: &Gpu, pass: &mut Pass, chunk: PoolChunk, m: Matrix, sel: &wgpu::Buffer, slots: &wgpu::Buffer, slot_base: u32, k: u32, x: &wgpu::Buffer, x_at: Strided, glu: Glu, y: &wgpu::Buffer, y_at: Strided) {
    experts_with(Variant::for_matrix(gpu, m), gpu, pass, chunk, m, sel, slots, slot_base, k, None, x, x_at, Some(glu), y, y_at);
}

/// [`experts`] (`glu`: [`experts_glu`]), with the layer's shared expert, where it rides, as batch `k` after the
/// selected ones (x at `x_at` + k·stride, y likewise): the routed and shared products of an MoE layer in one
/// dispatch.
#[allow(clippy::too_many_arguments)]
pub fn experts_and_shared(gpu: &Gpu, pass: &mut Pass, chunk: PoolChunk, m: Matrix, sel: &wgpu::Buffer, slots: &wgpu::Buffer, slot_base: u32, k: u32, shared: Option<SharedExpert>, x: &wgpu::Buffer, x_at: Strided, glu: Option<Glu>, y: &wgpu::Buffer, y_at: Strided) {
    experts_with(Variant::for_matrix(gpu, m), gpu, pass, chunk, m, sel, slots, slot_base, k, shared, x, x_at, glu, y, y_at);
}

#[allow(clippy::too_many_arguments)]
fn experts_with(v: Variant, gpu: &Gpu, pass: &mut Pass, chunk: PoolChunk, m: Matrix, sel: &wgpu::Buffer, slots: &wgpu::Buffer, slot_base: u32, k: u32, shared: Option<SharedExpert>, x: &wgpu::Buffer, x_at: Strided, glu: Option<Glu>, y: &wgpu::Buffer, y_at: Strided) {
    assert!(m.cols % 32 == 0, "matvec rows must be whole 32-value sub-blocks");
    let input = glu.map_or(Input::Plain, Input::Glu);
    check_input(m, input);
    let kernel = kernel(gpu, v, x_read(v, x, x_at, input, m.cols), true, false, m.ty);
    let mut params = params(m, v, m.byte_offset, 0, x_at, y_at, [chunk.slot_bytes as u32, slot_base, chunk.slots_per_chunk, chunk.index], false);
    set_input(&mut params, input);
    let mut batches = k;
    if let Some(shared) = shared {
        params[SHARED_AT] = P::U(k);
        params[SHARED_AT + 1] = P::U(shared.slot);
        params[SHARED_AT + 2] = P::F(shared.glu_limit);
        batches += 1;
    }
    let (gx, gy) = gpu.grid(workgroups(m, v));
    pass.dispatch_3d(gpu, &kernel, &[chunk.buffer, x, y, sel, slots], &params, (gx, gy, batches));
}

/// Invocations per row: for Q4_K and Q6_K 16 per block (8 per Q6_K block with `octets`, per Q4_K block with
/// `q4k_octets`), two blocks side by side when the row has an even number of them or at least 4 (so the lanes
/// finish together), four with `four_sides` when it has at least 8; otherwise one per 32-value sub-block (4..32).
fn lanes(m: Matrix, v: Variant) -> u32 {
    if v.whole_rows {
        return 1;
    }
    match m.ty {
        GgmlType::Q4_K | GgmlType::Q6_K => {
            let blocks = m.cols / 256;
            let per_block = match m.ty {
                GgmlType::Q6_K if v.octets => 8,
                GgmlType::Q4_K if v.q4k_octets => 8,
                _ => 16,
            };
            let sides = if v.narrow {
                1
            } else if v.four_sides && blocks >= 8 {
                4
            } else if blocks >= 4 || blocks == 2 {
                2
            } else {
                1
            };
            sides * per_block
        }
        _ => (m.cols / 32).next_power_of_two().clamp(4, 32),
    }
}

const WORKGROUP: u32 = 256;

fn workgroups(m: Matrix, v: Variant) -> u32 {
    m.rows.div_ceil(WORKGROUP / lanes(m, v) * v.rows)
}

#[allow(clippy::too_many_arguments)]
fn params(m: Matrix, v: Variant, w_offset: u64, w_stride: u64, x_at: Strided, y_at: Strided, experts: [u32; 4], accumulate: bool) -> Vec<P> {
    assert!(w_offset < u32::MAX as u64 && w_stride < u32::MAX as u64, "one binding is at most 4 GiB");
    // the Q4_K and Q6_K paths read whole words: Q4_K rows must start on a word, Q6_K rows on an even byte
    let align = match m.ty {
        GgmlType::Q4_K => 4,
        GgmlType::Q6_K => 2,
        _ => 1,
    };
    let slot_bytes = experts[0] as u64;
    assert!(w_offset % align == 0 && w_stride % align == 0 && slot_bytes % align == 0, "{:?} rows must start {align}-byte aligned", m.ty);
    let mut p = vec![
        P::U(m.rows),
        P::U(m.cols),
        P::U(m.row_bytes()),
        P::U(m.ty.id()),
        P::U(w_offset as u32),
        P::U(w_stride as u32),
        P::U(x_at.offset),
        P::U(x_at.stride),
        P::U(y_at.offset),
        P::U(y_at.stride),
    ];
    p.extend(experts.iter().map(|&v| P::U(v)));
    p.push(P::U(lanes(m, v)));
    p.push(P::U(accumulate as u32));
    assert_eq!(p.len(), SEGMENTS_AT);
    // no segments (set_segments fills them for a stack), no SwiGLU (set_glu)
    p.extend(std::iter::repeat_n(P::U(0), SEGMENT_WORDS + TAIL_WORDS));
    // no shared expert: a batch past any grid
    p[SHARED_AT] = P::U(u32::MAX);
    p
}
