//! GPU kernels on the native backend (lavapipe in CI): each against the CPU reference on fresh random inputs.
#![cfg(not(target_arch = "wasm32"))]

use lingtab::gpu::{dequant, Gpu};
use lingtab::quant::{self, GgmlType};

mod common;
use common::random_blocks;

#[test]
fn dequant_kernels_match_cpu_reference() {
    let gpu = pollster::block_on(Gpu::new()).expect("a Vulkan adapter (lavapipe: apt-get install mesa-vulkan-drivers)");
    println!("adapter: {}", gpu.summary);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    for (ty, n_blocks) in [(GgmlType::Q4_K, 7), (GgmlType::Q6_K, 5), (GgmlType::Q5_0, 37), (GgmlType::Q8_0, 41)] {
        let blocks = random_blocks(ty, n_blocks, seed ^ ty.id() as u64);
        let want = quant::dequantize_to_vec(ty, &blocks).unwrap();
        let got = pollster::block_on(dequant::dequantize(&gpu, ty, &blocks)).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "{ty} element {i}: GPU {g} vs CPU {w} (seed {seed})");
        }
    }
}
