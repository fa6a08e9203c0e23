// The expert entry point of matvec.wgsl: it replaces the dense entry point there and shares the rest. Batch j of
// the grid is the j-th selected expert, or (j = shared_z) the layer's shared expert in its own slot of the pool.

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
// expert ids then weights, as moe_route writes them
@group(0) @binding(3) var<storage, read> sel: array<u32>;
// pool slot of every (layer, expert)
@group(0) @binding(4) var<storage, read> slots: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> selected_slot: u32;

// The pool slot of batch j: the j-th selected expert's, or the shared expert's.
fn expert_slot(j: u32) -> u32 {
    if (j == p.shared_z) { return p.shared_slot; }
    return slots[p.slot_base + sel[j]];
}

@compute @workgroup_size(256)
fn matvec_experts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let first = first_row(wg, n_wg);
    if (first >= p.rows) { return; }
    let j = wg.z;
    glu_limit = select(p.glu_limit, p.glu_limit_shared, j == p.shared_z);
    if (lid == 0u) { selected_slot = expert_slot(j); }
    // one load for the workgroup, and uniform control flow for the barriers in rows_dot
    let slot = workgroupUniformLoad(&selected_slot);
    if (slot / p.slots_per_chunk != p.chunk) { return; }
    let base = (slot % p.slots_per_chunk) * p.slot_bytes + p.w_offset;
    let xb = stage_x(p.x_offset + j * p.x_stride, lid, false);
    let sums = rows_dot(base, first, xb, lid);
    store_rows(first, lid, p.y_offset + j * p.y_stride, sums);
}
