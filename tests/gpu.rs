//! GPU kernels on the native backend (lavapipe in CI), each against a CPU reference on fresh random inputs.
//! The same cases run in the browser from `tests/web.rs`.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use lingtab::gpu::Gpu;

fn gpu() -> Gpu {
    let gpu = pollster::block_on(Gpu::new()).expect("a Vulkan adapter (lavapipe: apt-get install mesa-vulkan-drivers)");
    eprintln!("native adapter: {}", gpu.summary);
    gpu
}

#[test]
fn dequant_kernels_match_cpu_reference() {
    pollster::block_on(common::dequant::dequant_kernels_match_cpu_reference(&gpu()));
}
