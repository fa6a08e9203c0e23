//! Matrix-matrix products over ggml rows for a chunk of tokens (`shaders/matmul.wgsl` over `quant.wgsl`):
//! dense, batched per head, and over the experts a chunk's tokens selected (each expert's rows decoded once
//! per tile of up to 64 of its tokens, read from its pool slot). The prefill's counterpart of [`super::matvec`].

use super::matvec::{Matrix, PoolChunk};
use super::{Gpu, Pass, P};
use crate::quant::GgmlType;

const QUANT: &str = include_str!("../../shaders/quant.wgsl");
const MATMUL: &str = include_str!("../../shaders/matmul.wgsl");
const MATMUL_F16: &str = include_str!("../../shaders/matmul_f16.wgsl");
const LABEL: &str = "matmul.wgsl";

/// Rows and tokens of a wide tile (`TILE_ROWS`, `TILE_TOKENS` in the shader), for many tokens.
pub const TILE_ROWS: u32 = 64;
pub const TILE_TOKENS: u32 = 64;
/// Rows and tokens of a row tile (`ROW_TILE`, `ROW_TOKENS`), for a few tokens and for the experts.
pub const ROW_TILE: u32 = 128;
pub const ROW_TOKENS: u32 = 16;
/// Rows and tokens of a big tile (`BIG_ROWS`, `BIG_TOKENS`), for more than [`MANY_TOKENS`] tokens.
pub const BIG_ROWS: u32 = 128;
pub const BIG_TOKENS: u32 = 128;
pub const MANY_TOKENS: u32 = 64;
/// Off: products over many tokens take wide tiles too (`lingtab bench --no-big-tiles`, to compare the two).
static BIG_TILES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

pub fn set_big_tiles(on: bool) {
    BIG_TILES.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Workgroups below which [`matmul_split`] splits a product's columns (0: never; `lingtab bench --split-target`).
/// A product of few rows over a chunk (the β logits' 32 rows, the router's 512) is otherwise a handful of
/// workgroups each stepping through every column while most of a large GPU idles.
static SPLIT_TARGET: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(256);

pub fn set_split_target(workgroups: u32) {
    SPLIT_TARGET.store(workgroups, std::sync::atomic::Ordering::Relaxed);
}

/// Columns per unit of a split: a whole block of every type (256 values for the K-quants, 32 for the others).
const SPLIT_UNIT: u32 = 256;

/// The entry point and grid of a product on wide or big tiles (both read f32 matrices by columns too).
fn tiles_for(rows: u32, tokens: u32, batch: u32) -> (&'static str, (u32, u32, u32)) {
    if tokens > MANY_TOKENS && BIG_TILES.load(std::sync::atomic::Ordering::Relaxed) {
        ("matmul_big", (rows.div_ceil(BIG_ROWS), tokens.div_ceil(BIG_TOKENS), batch))
    } else {
        ("matmul", (rows.div_ceil(TILE_ROWS), tokens.div_ceil(TILE_TOKENS), batch))
    }
}

/// Whether a dense product of a `ty` matrix over `tokens` tokens multiplies in f16: on big tiles, for quantised
/// and f16 matrices, on a device with `shader-f16` (see `shaders/matmul_f16.wgsl` for its rounding). F32
/// matrices (the router, attention over its cache) stay in f32, as llama.cpp keeps them: routing and the softmax
/// magnify their rounding.
pub fn multiplies_in_f16(gpu: &Gpu, ty: GgmlType, tokens: u32) -> bool {
    in_f16(gpu, ty, grid(0, tokens, 1).0)
}

/// Whether [`kernel`] builds `entry` for `ty` matrices in f16.
fn in_f16(gpu: &Gpu, ty: GgmlType, entry: &str) -> bool {
    entry == "matmul_big" && ty != GgmlType::F32 && gpu.f16_products()
}

/// Token counts up to this use row tiles.
pub const FEW_TOKENS: u32 = 16;

/// How a chunk's expert products are tiled (the pairs of one tile-list entry and the kernel that runs them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertTiles {
    /// 128 rows × up to [`ROW_TOKENS`] pairs, each invocation a row, its weights decoded into registers.
    Rows,
    /// 64 rows × up to [`TILE_TOKENS`] pairs, the weights decoded into workgroup memory once per step.
    Wide,
    /// 64 rows × up to [`BLOCK_PAIRS`] pairs, 4 invocations a row over 128 columns a step, the weights decoded
    /// into registers and applied to every pair's inputs read from workgroup memory. A subgroup holds 32 rows'
    /// same columns, so its reads of the inputs are broadcasts.
    Blocks,
    /// Block tiles whose row's 4 invocations are neighbours: a subgroup reads 8 rows' neighbouring words at a time
    /// (`lingtab bench --expert-tiles blocks-near`, to compare).
    BlocksNear,
    /// Block tiles of [`TALL_ROWS`] rows, each invocation two rows at the same columns: an input read from
    /// workgroup memory serves both.
    BlocksTall,
    /// Tall block tiles whose invocations hold four rows at a quarter of the columns: an input read from
    /// workgroup memory serves four.
    BlocksQuad,
}

/// Pairs per entry of block tiles (`BLOCK_PAIRS` in the shader) and their rows (`BLOCK_ROWS`).
pub const BLOCK_PAIRS: u32 = 16;
pub const BLOCK_ROWS: u32 = 64;
/// Rows of tall block tiles (`TALL_ROWS` in the shader).
pub const TALL_ROWS: u32 = 128;

impl ExpertTiles {
    /// Pairs per entry of the tile list ([`super::moe::group`] and [`experts`] take the same).
    pub fn pairs(self) -> u32 {
        match self {
            ExpertTiles::Rows => ROW_TOKENS,
            ExpertTiles::Wide => TILE_TOKENS,
            ExpertTiles::Blocks | ExpertTiles::BlocksNear | ExpertTiles::BlocksTall | ExpertTiles::BlocksQuad => BLOCK_PAIRS,
        }
    }

    fn kernel(self) -> (&'static str, u32) {
        match self {
            ExpertTiles::Rows => ("matmul_experts_rows", ROW_TILE),
            ExpertTiles::Wide => ("matmul_experts", TILE_ROWS),
            ExpertTiles::Blocks => ("matmul_experts_blocks", BLOCK_ROWS),
            ExpertTiles::BlocksNear => ("matmul_experts_blocks_near", BLOCK_ROWS),
            ExpertTiles::BlocksTall => ("matmul_experts_blocks_tall", TALL_ROWS),
            ExpertTiles::BlocksQuad => ("matmul_experts_blocks_quad", TALL_ROWS),
        }
    }

    /// Every kind with its `lingtab bench --expert-tiles` name.
    pub const NAMED: [(ExpertTiles, &'static str); 6] = [
        (ExpertTiles::Rows, "rows"),
        (ExpertTiles::Wide, "wide"),
        (ExpertTiles::Blocks, "blocks"),
        (ExpertTiles::BlocksNear, "blocks-near"),
        (ExpertTiles::BlocksTall, "blocks-tall"),
        (ExpertTiles::BlocksQuad, "blocks-quad"),
    ];

    /// The kinds [`expert_tiles`] picks from (the others are `lingtab bench --expert-tiles` options).
    pub const ENGINE: [ExpertTiles; 3] = [ExpertTiles::Rows, ExpertTiles::BlocksTall, ExpertTiles::Wide];

    pub fn parse(name: &str) -> Result<ExpertTiles, String> {
        Self::NAMED.iter().find(|(_, n)| *n == name).map(|(t, _)| *t).ok_or_else(|| {
            let names: Vec<&str> = Self::NAMED.iter().map(|(_, n)| *n).collect();
            format!("expert tiles are one of {}, not {name:?}", names.join(", "))
        })
    }
}

/// The expert tiles of every chunk over [`FEW_TOKENS`] tokens when set (`lingtab bench --expert-tiles`, to
/// compare): 0 = the default, else 1 + the kind's index in [`ExpertTiles::NAMED`].
static EXPERT_TILES: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

pub fn set_expert_tiles(tiles: Option<ExpertTiles>) {
    let v = tiles.map_or(0, |t| 1 + ExpertTiles::NAMED.iter().position(|(k, _)| *k == t).unwrap() as u8);
    EXPERT_TILES.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The expert tiles of a chunk of `tokens` tokens whose `pairs` (token, expert) pairs spread over `n_expert`
/// experts: row tiles for a few tokens (no expert has more pairs than a row tile holds); tall block tiles while
/// the experts average at most two block tiles' pairs (each expert's weights are decoded once per entry, and
/// block tiles' entries hold fewer pairs); else wide tiles. On the H100 at Flash's widths, tall block tiles
/// prefilled a 512-token chunk (8 pairs an expert) 11 % faster than block tiles, which beat wide ones by 11 %,
/// and a 2048-token chunk (32 pairs an expert) 4 % faster than wide tiles; longer chunks were not measured.
pub fn expert_tiles(tokens: u32, pairs: u32, n_expert: u32) -> ExpertTiles {
    if tokens <= FEW_TOKENS {
        return ExpertTiles::Rows;
    }
    match EXPERT_TILES.load(std::sync::atomic::Ordering::Relaxed) {
        0 if pairs <= 2 * BLOCK_PAIRS * n_expert => ExpertTiles::BlocksTall,
        0 => ExpertTiles::Wide,
        v => ExpertTiles::NAMED[v as usize - 1].0,
    }
}

/// The kernel `entry` for matrices of type `ty`: each type's kernels are built apart, with the type the shader's
/// constant `TY`, so each keeps one type's code (as matvec.rs does). Big tiles of non-F32 matrices multiply in
/// f16 (`matmul_f16.wgsl`) where the device has it ([`multiplies_in_f16`]).
fn kernel(gpu: &Gpu, ty: GgmlType, entry: &str) -> std::rc::Rc<super::Kernel> {
    if in_f16(gpu, ty, entry) {
        return gpu.kernel_built(&format!("{LABEL} {ty:?} f16"), "matmul_big_f16", || format!("enable f16;\n{}{MATMUL_F16}", source(ty)));
    }
    gpu.kernel_built(&format!("{LABEL} {ty:?}"), entry, || source(ty))
}

fn source(ty: GgmlType) -> String {
    let mut s = format!("{QUANT}{MATMUL}");
    super::kernel::replace_once(&mut s, "const TY: u32 = 12u;", &format!("const TY: u32 = {}u;", ty.id()));
    s
}

/// Where token t's vector sits: element `offset + t·stride`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rows {
    pub offset: u32,
    pub stride: u32,
}

impl Rows {
    pub fn new(offset: u32, stride: u32) -> Rows {
        Rows { offset, stride }
    }
}

/// `y[y.offset + t·y.stride + r] = Σ_i W[r, i]·x[x.offset + t·x.stride + i]` for every row r and token t < `tokens`.
#[allow(clippy::too_many_arguments)]
pub fn matmul(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, tokens: u32, x: &wgpu::Buffer, x_at: Rows, y: &wgpu::Buffer, y_at: Rows) {
    batched(gpu, pass, w, m, 0, 1, tokens, x, x_at, 0, y, y_at, 0);
}

/// [`matmul`] with the columns split into slices when its tiles are too few to fill the GPU: each slice's
/// product goes to `partials` (slice-major, then token, then row), and a second dispatch adds the slices into
/// y. Slices are whole [`SPLIT_UNIT`]s, as many as bring the workgroups to the split target and `partials` holds.
/// The sums' order differs from one pass over the columns only in f32 rounding.
#[allow(clippy::too_many_arguments)]
pub fn matmul_split(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, tokens: u32, x: &wgpu::Buffer, x_at: Rows, y: &wgpu::Buffer, y_at: Rows, partials: &wgpu::Buffer) {
    let slices = split_slices(m, tokens, partials.size() / 4);
    if slices < 2 {
        return matmul(gpu, pass, w, m, tokens, x, x_at, y, y_at);
    }
    let cols = m.cols / slices;
    let slice_bytes = m.ty.bytes_for(cols as u64).expect("slices are whole blocks");
    // slice b: the columns b·cols .. of every row (rows still the whole rows' bytes apart) and of every input
    let rows_of_slice = Matrix { cols, ..m };
    batched_rows(gpu, pass, w, rows_of_slice, m.row_bytes(), slice_bytes, slices, tokens, x, x_at, cols, partials, Rows::new(0, m.rows), tokens * m.rows);
    sum_slices(gpu, pass, partials, m.rows, tokens, slices, y, y_at);
}

/// `y[y.offset + t·y.stride + r] = Σ_s partials[(s·tokens + t)·rows + r]` for r < `rows`, t < `tokens`: the
/// partial sums of a product's column slices, added in slice order.
#[allow(clippy::too_many_arguments)]
pub fn sum_slices(gpu: &Gpu, pass: &mut Pass, partials: &wgpu::Buffer, rows: u32, tokens: u32, slices: u32, y: &wgpu::Buffer, y_at: Rows) {
    let sum = kernel(gpu, GgmlType::F32, "matmul_sum_slices");
    pass.dispatch(gpu, &sum, &[partials, y], &[P::U(rows), P::U(tokens), P::U(slices), P::U(y_at.offset), P::U(y_at.stride)], (rows * tokens).div_ceil(256));
}

/// Slices for [`matmul_split`]: the fewest that bring the workgroups to the split target, else the most that
/// `capacity` floats of partial sums hold; 1 when the product fills the GPU as it is.
pub fn split_slices(m: Matrix, tokens: u32, capacity: u64) -> u32 {
    let target = SPLIT_TARGET.load(std::sync::atomic::Ordering::Relaxed);
    let (_, (gx, gy, _)) = grid(m.rows, tokens, 1);
    let workgroups = gx * gy;
    if target == 0 || workgroups >= target || !m.cols.is_multiple_of(SPLIT_UNIT) {
        return 1;
    }
    let units = m.cols / SPLIT_UNIT;
    let mut best = 1;
    for s in (2..=units).filter(|s| units.is_multiple_of(*s)) {
        if s as u64 * m.rows as u64 * tokens as u64 > capacity {
            break;
        }
        best = s;
        if workgroups * s >= target {
            break;
        }
    }
    best
}

/// The entry point and grid of a dense product: row tiles for a few tokens, else wide or big tiles.
fn grid(rows: u32, tokens: u32, batch: u32) -> (&'static str, (u32, u32, u32)) {
    if tokens <= FEW_TOKENS {
        ("matmul_rows", (rows.div_ceil(ROW_TILE), tokens.div_ceil(ROW_TOKENS), batch))
    } else {
        tiles_for(rows, tokens, batch)
    }
}

/// `batch` products over `tokens` tokens: matrix b at `m.byte_offset + b·w_stride` bytes; token t of batch b reads
/// `x[x.offset + b·x_batch + t·x.stride ..]` and writes `y[y.offset + b·y_batch + t·y.stride + r]`.
#[allow(clippy::too_many_arguments)]
pub fn batched(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, w_stride: u64, batch: u32, tokens: u32, x: &wgpu::Buffer, x_at: Rows, x_batch: u32, y: &wgpu::Buffer, y_at: Rows, y_batch: u32) {
    batched_rows(gpu, pass, w, m, m.row_bytes(), w_stride, batch, tokens, x, x_at, x_batch, y, y_at, y_batch);
}

/// [`batched`] over `m.cols` columns of rows `row_bytes` apart (a column slice of wider rows).
#[allow(clippy::too_many_arguments)]
fn batched_rows(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, m: Matrix, row_bytes: u32, w_stride: u64, batch: u32, tokens: u32, x: &wgpu::Buffer, x_at: Rows, x_batch: u32, y: &wgpu::Buffer, y_at: Rows, y_batch: u32) {
    assert!(m.cols % 32 == 0, "matmul rows must be whole 32-value sub-blocks");
    if tokens == 0 || batch == 0 || m.rows == 0 {
        return;
    }
    let params = params(m, row_bytes, m.byte_offset, w_stride, x_at, x_batch, y_at, y_batch, tokens, [0; 5], 0);
    let grid = grid(m.rows, tokens, batch);
    let kernel = kernel(gpu, m.ty, grid.0);
    pass.dispatch_3d(gpu, &kernel, &[w, x, y], &params, grid.1);
}

/// Entries the expert tile list may need for `pairs` (token, expert) pairs over `n_expert` experts: every
/// expert used gets ⌈its pairs / `tile_pairs`⌉ tiles.
pub fn max_tiles(pairs: u32, n_expert: u32, tile_pairs: u32) -> u32 {
    pairs.div_ceil(tile_pairs) + pairs.min(n_expert)
}

/// For every entry of the tile list in `groups` (written by [`super::moe::group`], `list_at` its list's word
/// offset, at most `max_tiles` entries): the product of matrix `m` (found `m.byte_offset` bytes into the entry's
/// pool slot) with the entry's pairs p, reading `x[x.offset + (p / x_div)·x.stride ..]` and writing
/// `y[y.offset + p·y.stride + r]`. Only entries whose slot lies in `chunk` run; call once per pool buffer.
/// `tiles` must be the tiles the list was grouped for (its pairs per entry).
#[allow(clippy::too_many_arguments)]
pub fn experts(gpu: &Gpu, pass: &mut Pass, chunk: PoolChunk, m: Matrix, tiles: ExpertTiles, groups: &wgpu::Buffer, list_at: u32, max_tiles: u32, x: &wgpu::Buffer, x_at: Rows, x_div: u32, y: &wgpu::Buffer, y_at: Rows) {
    assert!(m.cols % 32 == 0, "matmul rows must be whole 32-value sub-blocks");
    assert!(x_div >= 1);
    if max_tiles == 0 {
        return;
    }
    let (entry, rows_per_tile) = tiles.kernel();
    let kernel = kernel(gpu, m.ty, entry);
    let experts = [chunk.slot_bytes as u32, chunk.slots_per_chunk, chunk.index, x_div, list_at];
    let params = params(m, m.row_bytes(), m.byte_offset, 0, x_at, 0, y_at, 0, 0, experts, 0);
    pass.dispatch_3d(gpu, &kernel, &[chunk.buffer, x, y, groups], &params, (m.rows.div_ceil(rows_per_tile), max_tiles, 1));
}

#[allow(clippy::too_many_arguments)]
fn params(m: Matrix, row_bytes: u32, w_offset: u64, w_stride: u64, x_at: Rows, x_batch: u32, y_at: Rows, y_batch: u32, tokens: u32, experts: [u32; 5], col_stride: u32) -> Vec<P> {
    assert!(w_offset < u32::MAX as u64 && w_stride < u32::MAX as u64, "one binding is at most 4 GiB");
    let mut p = vec![
        P::U(m.rows),
        P::U(m.cols),
        P::U(row_bytes),
        P::U(m.ty.id()),
        P::U(w_offset as u32),
        P::U(w_stride as u32),
        P::U(x_at.offset),
        P::U(x_at.stride),
        P::U(x_batch),
        P::U(y_at.offset),
        P::U(y_at.stride),
        P::U(y_batch),
        P::U(tokens),
    ];
    p.extend(experts.iter().map(|&v| P::U(v)));
    p.push(P::U(col_stride));
    p
}

/// [`matmul`] for an f32 matrix of `rows` × `cols` stored by columns: `W[r, i] = w[w_offset + i·col_stride + r]`
/// (the transpose of rows `col_stride` floats apart, as attention's values are read from its cache rows).
#[allow(clippy::too_many_arguments)]
pub fn matmul_by_columns(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, w_offset: u32, rows: u32, cols: u32, col_stride: u32, tokens: u32, x: &wgpu::Buffer, x_at: Rows, y: &wgpu::Buffer, y_at: Rows) {
    matmul_by_column_slices(gpu, pass, w, w_offset, rows, cols, col_stride, 1, tokens, x, x_at, y, y_at, 0);
}

/// [`matmul_by_columns`] over `slices` consecutive slices of `cols` columns at once (the columns of a long
/// product split to fill the GPU): slice b multiplies columns `b·cols ..` with token inputs `b·cols ..` of each
/// token's `x` row and writes its partial products at `y[y.offset + b·y_slice + t·y.stride + r]`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_by_column_slices(gpu: &Gpu, pass: &mut Pass, w: &wgpu::Buffer, w_offset: u32, rows: u32, cols: u32, col_stride: u32, slices: u32, tokens: u32, x: &wgpu::Buffer, x_at: Rows, y: &wgpu::Buffer, y_at: Rows, y_slice: u32) {
    assert!(cols % 32 == 0, "matmul columns come 32 at a time");
    assert!(col_stride >= rows, "columns of {rows} rows cannot be {col_stride} floats apart");
    if tokens == 0 || rows == 0 || slices == 0 {
        return;
    }
    let m = Matrix { ty: GgmlType::F32, rows, cols, byte_offset: 4 * w_offset as u64 };
    let w_slice = 4 * cols as u64 * col_stride as u64;
    let params = params(m, 4, m.byte_offset, w_slice, x_at, cols, y_at, y_slice, tokens, [0; 5], col_stride);
    let (entry, grid) = tiles_for(rows, tokens, slices);
    pass.dispatch_3d(gpu, &kernel(gpu, m.ty, entry), &[w, x, y], &params, grid);
}
