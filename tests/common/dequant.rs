//! GPU dequantisation against the CPU reference (which is bit-exact with ggml and gguf-py).

use super::{random_blocks, Rand};
use lingtab::gpu::{dequant, Gpu};
use lingtab::quant::{self, GgmlType};

pub async fn dequant_kernels_match_cpu_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    for (ty, n_blocks) in [(GgmlType::Q4_K, 7), (GgmlType::Q6_K, 5), (GgmlType::Q5_0, 37), (GgmlType::Q8_0, 41)] {
        let blocks = random_blocks(ty, n_blocks, seed ^ ty.id() as u64);
        let want = quant::dequantize_to_vec(ty, &blocks).unwrap();
        let got = dequant::dequantize(gpu, ty, &blocks).await.unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "{ty} element {i}: GPU {g} vs CPU {w} (seed {seed})");
        }
    }
}
