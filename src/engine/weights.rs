//! Dense weights on the GPU, read straight from the GGUF bytes. A tensor larger than the adapter's binding
//! limit is split into row ranges, each its own buffer, so no kernel ever binds more than allowed. The matrices
//! of a layer that read the same input (a KDA layer's six projections, an MLA layer's three, a SwiGLU's gate
//! and up) are uploaded into one buffer per type, rows back to back: a decode step computes each such stack in
//! one dispatch ([`Weights::products`]), where a dispatch costs more than most of these products' reads. Which
//! members go into which stack is decided once, at load.

use crate::gguf::{SplitModel, SplitTensor};
use crate::gpu::matmul::{self, Rows};
use crate::gpu::matvec::{self, Matrix};
use crate::gpu::{Gpu, Pass};
use crate::model::layout::{role, Role};
use crate::model::Config;
use crate::quant::GgmlType;
use crate::source::RangeSource;
use crate::store::StoreChecks;
use std::collections::HashMap;

/// Rows [first_row, first_row + rows) of a tensor, in their own buffer from `byte_offset` on (0 but for a
/// matrix uploaded into a stack).
pub struct Piece {
    pub buffer: wgpu::Buffer,
    pub byte_offset: u64,
    pub first_row: u64,
    pub rows: u64,
}

pub struct GpuTensor {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    pub pieces: Vec<Piece>,
}

impl GpuTensor {
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }
    pub fn n_rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }
    pub fn row_bytes(&self) -> u64 {
        self.ty.bytes_for(self.dims[0]).expect("whole blocks")
    }
    /// The buffer of a tensor that was not split (vectors, per-head matrices).
    pub fn whole(&self) -> &wgpu::Buffer {
        assert_eq!(self.pieces.len(), 1, "{} is split over {} buffers", self.name, self.pieces.len());
        assert_eq!(self.pieces[0].byte_offset, 0, "{} is part of a stack", self.name);
        &self.pieces[0].buffer
    }
    /// The piece holding `row`, and the row's byte offset inside its buffer.
    pub fn row(&self, row: u64) -> (&Piece, u64) {
        let piece = self.pieces.iter().find(|p| row >= p.first_row && row < p.first_row + p.rows).expect("row in range");
        (piece, piece.byte_offset + (row - piece.first_row) * self.row_bytes())
    }
    /// y[y_at + r] = (W·x)[r] for all rows, one dispatch per piece.
    pub fn matvec(&self, gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, x_at: u32, y: &wgpu::Buffer, y_at: u32) {
        self.per_piece(|p, m| matvec::matvec(gpu, pass, &p.buffer, m, x, x_at, y, y_at + p.first_row as u32));
    }
    /// y[y_at + r] += (W·x)[r] for all rows (a residual added by the product itself), one dispatch per piece.
    pub fn matvec_add(&self, gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, x_at: u32, y: &wgpu::Buffer, y_at: u32) {
        self.per_piece(|p, m| matvec::matvec_add(gpu, pass, &p.buffer, m, x, x_at, y, y_at + p.first_row as u32));
    }
    /// y[y_at + r] = (W·rms_norm(x))[r] for all rows, the norm ([`matvec::Norm`]) computed by the product, which
    /// also leaves it in `norm.out`; one dispatch per piece.
    pub fn matvec_norm(&self, gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, norm: matvec::Norm, y: &wgpu::Buffer, y_at: u32) {
        self.per_piece(|p, m| matvec::matvec_norm(gpu, pass, &p.buffer, m, x, 0, norm, y, y_at + p.first_row as u32));
    }
    /// y[r] (+)= (W·a(gu))[r] for all rows, `a` a SwiGLU's activation of `gu` ([`matvec::matvec_glu`]).
    pub fn matvec_glu(&self, gpu: &Gpu, pass: &mut Pass, gu: &wgpu::Buffer, glu: matvec::Glu, y: &wgpu::Buffer, accumulate: bool) {
        self.per_piece(|p, m| matvec::matvec_glu(gpu, pass, &p.buffer, m, gu, 0, glu, y, p.first_row as u32, accumulate));
    }
    /// Each piece with its rows as a matrix from the piece's start.
    fn per_piece(&self, mut each: impl FnMut(&Piece, Matrix)) {
        for p in &self.pieces {
            each(p, Matrix { ty: self.ty, rows: p.rows as u32, cols: self.row_len() as u32, byte_offset: p.byte_offset });
        }
    }
    /// For each of `tokens` tokens t: `y[y_at.offset + t·y_at.stride + r] = (W·x_t)[r]`, x_t at `x_at`; per
    /// piece one dispatch, or two with its columns split into `partials` ([`matmul::matmul_split`]).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(&self, gpu: &Gpu, pass: &mut Pass, tokens: u32, x: &wgpu::Buffer, x_at: Rows, y: &wgpu::Buffer, y_at: Rows, partials: &wgpu::Buffer) {
        self.per_piece(|p, m| matmul::matmul_split(gpu, pass, &p.buffer, m, tokens, x, x_at, y, Rows::new(y_at.offset + p.first_row as u32, y_at.stride), partials));
    }
}

/// The input groups of a layer: matrices that read the same input, each one's rows going to its own offset
/// of one output vector. A decode step computes each with [`Weights::products`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Inputs {
    /// The attention's projections of h: [`kda_inputs_floats`] for a KDA layer, [`mla_inputs_floats`] for MLA.
    Attention,
    /// A SwiGLU's gate and up into one `2·ff` vector, gate first: the dense FFN, or a MoE layer's shared expert.
    Swiglu,
}

/// Floats of a KDA layer's projections of h: q|k|v (3·D, the conv's input), the forget-gate projection (D), the
/// β logits (n_head), the output gate (D).
pub fn kda_inputs_floats(c: &Config) -> usize {
    5 * c.kda_dim() + c.n_head
}

/// Where f_a, the β logits and the output gate g_a start among a KDA layer's projections (after q|k|v).
pub fn kda_input_offsets(c: &Config) -> (u32, u32, u32) {
    let d = c.kda_dim() as u32;
    (3 * d, 4 * d, 4 * d + c.n_head as u32)
}

/// Floats of an MLA layer's projections of h: the query (n_head·d_qk), the latent kv (rank + rope_dim), the
/// head gate's logits (n_head).
pub fn mla_inputs_floats(c: &Config) -> usize {
    c.n_head * c.key_length_mla + c.kv_lora_rank + c.rope_dim + c.n_head
}

/// Where the latent kv and the head gate's logits start among an MLA layer's projections (after the query).
pub fn mla_input_offsets(c: &Config) -> (u32, u32) {
    let q = (c.n_head * c.key_length_mla) as u32;
    (q, q + (c.kv_lora_rank + c.rope_dim) as u32)
}

/// The members of layer `l`'s group `inputs`: tensor names and the output offset (in floats) of each one's rows.
fn members(c: &Config, l: usize, inputs: Inputs) -> Vec<(String, u32)> {
    let at: Vec<(&str, u32)> = match (inputs, c.attention[l]) {
        (Inputs::Attention, crate::model::Attention::Kda) => {
            let d = c.kda_dim() as u32;
            let (fa, beta, z) = kda_input_offsets(c);
            vec![("attn_q", 0), ("attn_k", d), ("attn_v", 2 * d), ("ssm_f_a", fa), ("ssm_beta", beta), ("ssm_g_a", z)]
        }
        (Inputs::Attention, crate::model::Attention::Mla) => {
            let (kv, gate) = mla_input_offsets(c);
            vec![("attn_q", 0), ("attn_kv_a_mqa", kv), ("attn_gate", gate)]
        }
        (Inputs::Swiglu, _) if c.is_moe_layer(l) => vec![("ffn_gate_shexp", 0), ("ffn_up_shexp", c.ff_shared as u32)],
        (Inputs::Swiglu, _) => vec![("ffn_gate", 0), ("ffn_up", c.ff_dense as u32)],
    };
    at.into_iter().map(|(name, y)| (format!("blk.{l}.{name}.weight"), y)).collect()
}

/// Stacked matrices of one type in one buffer ([`matvec::stacked`]).
pub struct Stack {
    pub buffer: wgpu::Buffer,
    pub matrix: Matrix,
    pub segments: Vec<matvec::Segment>,
}

/// How a decode step computes one input group: one product per stack, then one per member left out of them.
#[derive(Default)]
pub struct GroupProducts {
    pub stacks: Vec<Stack>,
    /// Members computed on their own: tensor name and output offset.
    pub loose: Vec<(String, u32)>,
}

/// A stack to be made: its matrix, size, and each member's (tensor name, byte offset in the stack).
struct StackPlan {
    matrix: Matrix,
    bytes: u64,
    members: Vec<(String, u64)>,
    segments: Vec<matvec::Segment>,
}

/// The stacks of layer `l`'s group `inputs` (with `stack` on), and the members left out of them: the members
/// split by type (all must exist, read `hidden` values and be whole words), each type's members in one stack if
/// it fits `max_binding`.
fn plan_group(config: &Config, infos: &HashMap<&str, &crate::gguf::TensorInfo>, l: usize, inputs: Inputs, max_binding: u64, stack: bool) -> (Vec<StackPlan>, Vec<(String, u32)>) {
    let all = members(config, l, inputs);
    let found: Option<Vec<_>> = all.iter().map(|(name, y)| infos.get(name.as_str()).map(|i| (*i, *y))).collect();
    // each member whole words (the next one's rows start where it ends), rows of `hidden` whole sub-blocks
    let stackable = |i: &crate::gguf::TensorInfo| i.dims.len() == 2 && i.dims[0] == config.hidden as u64 && i.dims[0] % 32 == 0 && i.n_bytes() % 4 == 0;
    let Some(found) = found.filter(|f| stack && f.iter().all(|(i, _)| stackable(i))) else { return (Vec::new(), all) };
    let mut types: Vec<GgmlType> = found.iter().map(|(i, _)| i.ty).collect();
    types.sort_by_key(|t| t.id());
    types.dedup();
    let (mut stacks, mut loose) = (Vec::new(), Vec::new());
    for ty in types {
        let of_type: Vec<_> = found.iter().filter(|(i, _)| i.ty == ty).collect();
        let mut plan = StackPlan { matrix: Matrix { ty, rows: 0, cols: config.hidden as u32, byte_offset: 0 }, bytes: 0, members: Vec::new(), segments: Vec::new() };
        for (info, y) in &of_type {
            plan.segments.push(matvec::Segment { first_row: plan.matrix.rows, y_at: *y });
            plan.members.push((info.name.clone(), plan.bytes));
            plan.matrix.rows += info.dims[1] as u32;
            plan.bytes += info.n_bytes();
        }
        // members are whole rows and whole words, so each starts as aligned as its rows do
        if plan.bytes <= max_binding && plan.segments.len() <= matvec::MAX_SEGMENTS {
            stacks.push(plan);
        } else {
            loose.extend(of_type.iter().map(|(info, y)| (info.name.clone(), *y)));
        }
    }
    (stacks, loose)
}

/// Every dense tensor of the trunk (and the globals) on the GPU, by name.
pub struct Weights {
    pub tensors: HashMap<String, GpuTensor>,
    /// How each layer's input groups are computed (decided at load).
    pub groups: HashMap<(usize, Inputs), GroupProducts>,
    pub bytes: u64,
}

impl Weights {
    pub fn get(&self, name: &str) -> Result<&GpuTensor, String> {
        self.tensors.get(name).ok_or_else(|| format!("the model has no tensor {name:?}"))
    }

    /// How many stacks the input groups were uploaded as (0 when stacking is off).
    pub fn stack_count(&self) -> usize {
        self.groups.values().map(|g| g.stacks.len()).sum()
    }

    /// y[y_at + i] = (W·x)[i] for every member W of layer `l`'s group `inputs`, each at its own `y_at`: one
    /// dispatch per stack (the members of one type), and one per tensor for members not stacked.
    pub fn products(&self, gpu: &Gpu, pass: &mut Pass, l: usize, inputs: Inputs, x: &wgpu::Buffer, y: &wgpu::Buffer) -> Result<(), String> {
        let group = self.groups.get(&(l, inputs)).ok_or_else(|| format!("layer {l} has no {inputs:?} products"))?;
        for s in &group.stacks {
            matvec::stacked(gpu, pass, &s.buffer, s.matrix, &s.segments, x, 0, y);
        }
        for (name, y_at) in &group.loose {
            self.get(name)?.matvec(gpu, pass, x, 0, y, *y_at);
        }
        Ok(())
    }

    /// Uploads every non-expert trunk tensor, read from `parts`; `max_binding` is the largest buffer a kernel
    /// may bind; `stack`: the input groups' matrices into stacks (see the module's doc).
    pub async fn load<S: RangeSource>(gpu: &Gpu, config: &Config, model: &SplitModel, max_binding: u64, stack: bool, parts: &[S], checks: Option<&StoreChecks>) -> Result<Weights, String> {
        let mut tensors = HashMap::new();
        let mut total = 0u64;
        // the stacks' buffers first; their members are written into them as they are read
        let infos: HashMap<&str, &crate::gguf::TensorInfo> = model.tensors.iter().map(|t| (t.info.name.as_str(), &t.info)).collect();
        let mut groups = HashMap::new();
        let mut stacked: HashMap<String, (wgpu::Buffer, u64)> = HashMap::new();
        for l in 0..config.n_layer {
            for inputs in [Inputs::Attention, Inputs::Swiglu] {
                let (plans, loose) = plan_group(config, &infos, l, inputs, max_binding, stack);
                let mut group = GroupProducts { stacks: Vec::new(), loose };
                for plan in plans {
                    let buffer = gpu.storage_buffer(&format!("blk.{l} {inputs:?} stack"), plan.bytes);
                    for (name, offset) in &plan.members {
                        stacked.insert(name.clone(), (buffer.clone(), *offset));
                    }
                    group.stacks.push(Stack { buffer, matrix: plan.matrix, segments: plan.segments });
                }
                groups.insert((l, inputs), group);
            }
        }
        for t in &model.tensors {
            if !matches!(role(config, &t.info.name), Role::Global | Role::Dense { .. }) {
                continue;
            }
            if !crate::gpu::dequant::gpu_readable(t.info.ty) {
                return Err(format!("tensor {}: type {} is not supported by lingtab's kernels", t.info.name, t.info.ty));
            }
            let bytes = read_tensor(parts, t).await?;
            if let Some(checks) = checks {
                checks.verify_dense(&t.info.name, &bytes).map_err(|e| format!("{}: {e}", parts[t.part].describe()))?;
            }
            let row_bytes = t.info.row_bytes();
            let n_rows = t.info.n_elements() / t.info.dims[0];
            let rows_per_piece = (max_binding / row_bytes).max(1);
            if row_bytes > max_binding {
                return Err(format!("tensor {}: one row ({row_bytes} bytes) exceeds the binding limit {max_binding}", t.info.name));
            }
            let mut pieces = Vec::new();
            if let Some((buffer, offset)) = stacked.get(&t.info.name) {
                gpu.queue.write_buffer(buffer, *offset, &bytes);
                pieces.push(Piece { buffer: buffer.clone(), byte_offset: *offset, first_row: 0, rows: n_rows });
            } else {
                let mut first = 0u64;
                while first < n_rows {
                    let rows = rows_per_piece.min(n_rows - first);
                    let slice = &bytes[(first * row_bytes) as usize..((first + rows) * row_bytes) as usize];
                    pieces.push(Piece { buffer: gpu.upload(&t.info.name, slice), byte_offset: 0, first_row: first, rows });
                    first += rows;
                }
            }
            total += bytes.len() as u64;
            tensors.insert(t.info.name.clone(), GpuTensor { name: t.info.name.clone(), ty: t.info.ty, dims: t.info.dims.clone(), pieces });
        }
        Ok(Weights { tensors, groups, bytes: total })
    }
}

/// Reads a tensor's bytes from the part that holds it.
pub async fn read_tensor<S: RangeSource>(parts: &[S], t: &SplitTensor) -> Result<Vec<u8>, String> {
    let n = t.info.n_bytes();
    let (bytes, _) = parts[t.part].read_range(t.file_offset, n).await?;
    if bytes.len() as u64 != n {
        return Err(format!("tensor {}: read {} of {n} bytes (truncated file?)", t.info.name, bytes.len()));
    }
    Ok(bytes)
}
