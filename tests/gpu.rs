//! GPU kernels on the native backend (lavapipe in CI), each against a CPU reference on fresh random inputs.
//! The same cases run in the browser from `tests/web.rs`.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use lingtab::gpu::matmul::ExpertTiles;
use lingtab::gpu::matvec::Variant;
use lingtab::gpu::Gpu;
use lingtab::quant::GgmlType;

fn gpu() -> Gpu {
    let gpu = pollster::block_on(Gpu::new()).expect("a Vulkan adapter (lavapipe: apt-get install mesa-vulkan-drivers)");
    eprintln!("native adapter: {}", gpu.summary);
    gpu
}

#[test]
fn dequant_kernels_match_cpu_reference() {
    pollster::block_on(common::dequant::dequant_kernels_match_cpu_reference(&gpu()));
}

#[test]
fn matvec_every_type_matches_reference() {
    pollster::block_on(common::matvec::matvec_every_type_matches_reference(&gpu(), &Variant::ALL));
}

#[test]
fn matvec_add_adds_the_product_to_y() {
    pollster::block_on(common::matvec::matvec_add_adds_the_product_to_y(&gpu()));
}

/// The products with their reductions through workgroup memory only, as on a device without subgroups (the
/// browser's, through wgpu), on this one that has them.
#[test]
fn matvec_without_subgroups_matches_reference() {
    let gpu = gpu();
    gpu.set_subgroups(false);
    pollster::block_on(common::matvec::matvec_every_type_matches_reference(&gpu, &Variant::ALL));
}

#[test]
fn stacked_matvec_matches_each_product() {
    pollster::block_on(common::matvec::stacked_matvec_matches_each_product(&gpu()));
}

#[test]
fn swiglu_products_match_activation_then_product() {
    pollster::block_on(common::matvec::swiglu_products_match_activation_then_product(&gpu()));
}

#[test]
fn batched_matvec_matches_reference() {
    pollster::block_on(common::matvec::batched_matvec_matches_reference(&gpu()));
}

#[test]
fn sliced_and_gated_products_match_the_three_dispatches() {
    pollster::block_on(common::matvec::sliced_and_gated_products_match_the_three_dispatches(&gpu(), &Variant::ENGINE));
}

#[test]
fn expert_matvec_reads_selected_slots() {
    pollster::block_on(common::matvec::expert_matvec_reads_selected_slots(&gpu()));
}


#[test]
fn matmul_every_type_matches_reference() {
    pollster::block_on(common::matmul::matmul_every_type_matches_reference(&gpu()));
}

/// The plain path on a device with `shader-f16`: big tiles multiply in f32 (held to f32 rounding).
#[test]
fn matmul_without_f16_matches_reference() {
    let gpu = gpu();
    gpu.set_f16(false);
    assert!(!lingtab::gpu::matmul::multiplies_in_f16(&gpu, GgmlType::Q4_K, 70));
    pollster::block_on(common::matmul::matmul_every_type_matches_reference(&gpu));
    pollster::block_on(common::matmul::split_matmul_matches_reference(&gpu));
    pollster::block_on(common::matmul::batched_matmul_matches_reference(&gpu));
}

/// lavapipe has `shader-f16`, so the tests above run big tiles (over 64 tokens) of non-F32 matrices in f16 here,
/// and only those.
#[test]
fn big_tiles_multiply_in_f16_where_the_device_has_it() {
    use lingtab::gpu::matmul::multiplies_in_f16;
    let gpu = gpu();
    assert!(gpu.summary.shader_f16, "this adapter has no shader-f16: the f16 big tiles go untested here");
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::F16] {
        assert!(multiplies_in_f16(&gpu, ty, 65) && multiplies_in_f16(&gpu, ty, 2048), "{ty}");
        assert!(!multiplies_in_f16(&gpu, ty, 64) && !multiplies_in_f16(&gpu, ty, 16) && !multiplies_in_f16(&gpu, ty, 1), "{ty}");
    }
    assert!(!multiplies_in_f16(&gpu, GgmlType::F32, 2048));
}

#[test]
fn split_matmul_matches_reference() {
    pollster::block_on(common::matmul::split_matmul_matches_reference(&gpu()));
}

#[test]
fn batched_matmul_matches_reference() {
    pollster::block_on(common::matmul::batched_matmul_matches_reference(&gpu()));
}

#[test]
fn grouped_expert_matmul_reads_each_pairs_expert() {
    pollster::block_on(common::matmul::grouped_expert_matmul_reads_each_pairs_expert(&gpu(), &ExpertTiles::NAMED.map(|(t, _)| t)));
}

#[test]
fn norm_products_match_norm_then_product() {
    pollster::block_on(common::matvec::norm_products_match_norm_then_product(&gpu()));
}

#[test]
fn rms_norm_and_argmax_match_reference() {
    pollster::block_on(common::matvec::rms_norm_and_argmax_match_reference(&gpu()));
}

#[test]
fn kda_step_matches_the_four_references() {
    pollster::block_on(common::kda::kda_step_matches_the_four_references(&gpu()));
}

#[test]
fn kda_delta_chunk_matches_the_reference() {
    pollster::block_on(common::kda::kda_delta_chunk_matches_the_reference(&gpu()));
}

/// The delta rule's column sums through workgroup memory, as on a device without subgroups (the browser's,
/// through wgpu), on this one that has them (the two tests above shuffle).
#[test]
fn kda_without_subgroups_matches_the_references() {
    let gpu = gpu();
    gpu.set_subgroups(false);
    pollster::block_on(common::kda::kda_step_matches_the_four_references(&gpu));
    pollster::block_on(common::kda::kda_delta_chunk_matches_the_reference(&gpu));
}

#[test]
fn kda_gates_match_cpu_reference() {
    pollster::block_on(common::kda::kda_gates_match_cpu_reference(&gpu()));
}

#[test]
fn kda_head_norm_gate_matches_cpu_reference() {
    pollster::block_on(common::kda::kda_head_norm_gate_matches_cpu_reference(&gpu()));
}

#[test]
fn mla_kv_row_matches_reference() {
    pollster::block_on(common::mla_moe::mla_kv_row_matches_reference(&gpu()));
}

#[test]
fn mla_rope_q_matches_reference() {
    pollster::block_on(common::mla_moe::mla_rope_q_matches_reference(&gpu()));
}

#[test]
fn mla_kv_row_and_rope_q_match_the_two_kernels() {
    pollster::block_on(common::mla_moe::mla_kv_row_and_rope_q_match_the_two_kernels(&gpu()));
}

#[test]
fn mla_attention_matches_reference() {
    pollster::block_on(common::mla_moe::mla_attention_matches_reference(&gpu()));
}

#[test]
fn mla_attention_by_products_matches_reference() {
    pollster::block_on(common::mla_moe::mla_attention_by_products_matches_reference(&gpu()));
}

#[test]
fn mla_head_gate_matches_reference() {
    pollster::block_on(common::mla_moe::mla_head_gate_matches_reference(&gpu()));
}

#[test]
fn moe_route_matches_reference() {
    pollster::block_on(common::mla_moe::moe_route_matches_reference(&gpu()));
}

#[test]
fn moe_route_ties_pick_lower_index() {
    pollster::block_on(common::mla_moe::moe_route_ties_pick_lower_index(&gpu()));
}

#[test]
fn swiglu_matches_reference() {
    pollster::block_on(common::mla_moe::swiglu_matches_reference(&gpu()));
}

#[test]
fn moe_sum_norm_is_accumulate_then_rms_norm() {
    pollster::block_on(common::mla_moe::moe_sum_norm_is_accumulate_then_rms_norm(&gpu()));
}

#[test]
fn moe_accumulate_matches_reference() {
    pollster::block_on(common::mla_moe::moe_accumulate_matches_reference(&gpu()));
}

#[test]
fn add_matches_reference() {
    pollster::block_on(common::mla_moe::add_matches_reference(&gpu()));
}
