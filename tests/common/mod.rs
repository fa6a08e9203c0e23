//! Helpers shared by the native and browser test crates.

use lingtab::quant::GgmlType;

/// Random blocks of `ty` whose f16 scale fields are finite and moderate; the rest random bytes.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut bytes: Vec<u8> = (0..n_blocks * ty.block_bytes()).map(|_| next() as u8).collect();
    let scale_offsets: &[usize] = match ty {
        GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        _ => &[],
    };
    for b in 0..n_blocks {
        for &off in scale_offsets {
            let v = half::f16::from_f32(((next() % 2000) as f32 / 1000.0 - 1.0) * 0.05);
            bytes[b * ty.block_bytes() + off..][..2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

