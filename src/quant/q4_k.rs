//! Q4_K: 256 values per 144-byte super-block: `d`, `dmin` (f16), 12 bytes packing eight 6-bit scales and
//! eight 6-bit mins, then 128 bytes of 4-bit quants. Sub-block s (32 values) is `y = d·sc(s)·q − dmin·m(s)`;
//! quants of sub-blocks 2c and 2c+1 share `qs[32c..32c+32]` (low and high nibble).

use half::f16;

use super::{f16_at, nearest_int, BlockFormat, GgmlType};

#[derive(Clone, Debug, PartialEq)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

impl BlockQ4K {
    /// The 6-bit (scale, min) of sub-block `s` (0..8), as ggml's `get_scale_min_k4` unpacks them.
    pub fn scale_min(&self, s: usize) -> (u8, u8) {
        let q = &self.scales;
        if s < 4 {
            (q[s] & 63, q[s + 4] & 63)
        } else {
            ((q[s + 4] & 15) | ((q[s - 4] >> 6) << 4), (q[s + 4] >> 4) | ((q[s] >> 6) << 4))
        }
    }

    /// Inverse of `scale_min`: bytes 0..4 hold scales 0..4, 4..8 mins 0..4, 8..12 the low nibbles of
    /// scales/mins 4..8; their high two bits go in the top bits of bytes 0..8.
    fn pack_scale_min(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
        let mut packed = [0; 12];
        for s in 0..4 {
            packed[s] = scales[s] | ((scales[s + 4] >> 4) << 6);
            packed[s + 4] = mins[s] | ((mins[s + 4] >> 4) << 6);
            packed[s + 8] = (scales[s + 4] & 15) | ((mins[s + 4] & 15) << 4);
        }
        packed
    }
}

impl BlockFormat for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const ELEMS: usize = 256;
    const BYTES: usize = 144;

    fn from_bytes(bytes: &[u8]) -> Self {
        let mut block = BlockQ4K { d: f16_at(bytes, 0), dmin: f16_at(bytes, 2), scales: [0; 12], qs: [0; 128] };
        block.scales.copy_from_slice(&bytes[4..16]);
        block.qs.copy_from_slice(&bytes[16..144]);
        block
    }

    fn write_bytes(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..144].copy_from_slice(&self.qs);
    }

    /// ggml's `dequantize_row_q4_K`: `d·sc` and `dmin·m` are rounded to f32 first, then `(d·sc)·q − dmin·m`.
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let dmin = self.dmin.to_f32();
        for (chunk, (qs, y)) in self.qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
            let (sc_low, m_low) = self.scale_min(2 * chunk);
            let (sc_high, m_high) = self.scale_min(2 * chunk + 1);
            let (d_low, min_low) = (d * f32::from(sc_low), dmin * f32::from(m_low));
            let (d_high, min_high) = (d * f32::from(sc_high), dmin * f32::from(m_high));
            let (y_low, y_high) = y.split_at_mut(32);
            for l in 0..32 {
                y_low[l] = d_low * f32::from(qs[l] & 15) - min_low;
                y_high[l] = d_high * f32::from(qs[l] >> 4) - min_high;
            }
        }
    }

    /// ggml's `quantize_row_q4_K_ref`: fit a scale and min per sub-block, quantise those to 6 bits against
    /// the block maxima, then requantise the values with the scales as stored.
    fn quantize(src: &[f32]) -> Option<Self> {
        let mut levels = [0u8; 256];
        let mut sub_scales = [0f32; 8];
        let mut sub_mins = [0f32; 8];
        for s in 0..8 {
            let x = &src[32 * s..32 * s + 32];
            let av_x = (x.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
            let weights: [f32; 32] = std::array::from_fn(|l| av_x + x[l].abs());
            (sub_scales[s], sub_mins[s]) = fit_scale_min(x, &weights, &mut levels[32 * s..32 * s + 32]);
        }
        let max_scale = sub_scales.iter().fold(0.0f32, |a, &b| a.max(b));
        let max_min = sub_mins.iter().fold(0.0f32, |a, &b| a.max(b));
        let to_6_bits = |values: &[f32; 8], max: f32| -> [u8; 8] {
            let inverse = if max > 0.0 { 63.0 / max } else { 0.0 };
            std::array::from_fn(|s| nearest_int(inverse * values[s]).clamp(0, 63) as u8)
        };
        let block = BlockQ4K {
            d: f16::from_f32(max_scale / 63.0),
            dmin: f16::from_f32(max_min / 63.0),
            scales: Self::pack_scale_min(&to_6_bits(&sub_scales, max_scale), &to_6_bits(&sub_mins, max_min)),
            qs: [0; 128],
        };
        if !block.d.is_finite() || !block.dmin.is_finite() {
            return None;
        }
        for s in 0..8 {
            let (sc, m) = block.scale_min(s);
            let step = block.d.to_f32() * f32::from(sc);
            if step == 0.0 {
                continue; // every value of the sub-block decodes to −dmin·m whatever its level
            }
            let offset = block.dmin.to_f32() * f32::from(m);
            for (level, &x) in levels[32 * s..32 * s + 32].iter_mut().zip(&src[32 * s..32 * s + 32]) {
                *level = nearest_int((x + offset) / step).clamp(0, 15) as u8;
            }
        }
        Some(BlockQ4K {
            qs: std::array::from_fn(|i| {
                let (chunk, l) = (i / 32, i % 32);
                levels[64 * chunk + l] | (levels[64 * chunk + 32 + l] << 4)
            }),
            ..block
        })
    }
}

/// ggml's `make_qkx2_quants` for 4-bit levels: fits `x ≈ scale·level − min` (min ≥ 0) by weighted least
/// squares, trying 21 candidate scales around (max − min)/15. Returns (scale, min) and fills `levels`.
fn fit_scale_min(x: &[f32], weights: &[f32; 32], levels: &mut [u8]) -> (f32, f32) {
    const NMAX: f32 = 15.0;
    // ggml's quantize_row_q4_K_ref search: iscale = (RMIN + RDELTA·step + NMAX)/(max − min), step 0..=STEPS.
    const RMIN: f32 = -1.0;
    const RDELTA: f32 = 0.1;
    const STEPS: u8 = 20;

    let mut min = x.iter().fold(x[0], |a, &b| a.min(b)).min(0.0);
    let max = x.iter().fold(x[0], |a, &b| a.max(b));
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let sum_w: f32 = weights.iter().sum();
    let sum_x: f32 = weights.iter().zip(x).map(|(w, x)| w * x).sum();
    let level_of = |iscale: f32, min: f32, x: f32| nearest_int(iscale * (x - min)).clamp(0, NMAX as i32) as u8;
    let weighted_error = |scale: f32, min: f32, levels: &[u8]| -> f32 {
        (0..32).map(|i| weights[i] * (scale * f32::from(levels[i]) + min - x[i]).powi(2)).sum()
    };

    let iscale = NMAX / (max - min);
    let mut scale = 1.0 / iscale;
    for (level, &v) in levels.iter_mut().zip(x) {
        *level = level_of(iscale, min, v);
    }
    let mut best_error = weighted_error(scale, min, levels);
    let mut candidate = [0u8; 32];
    for step in 0..=STEPS {
        let iscale = (RMIN + RDELTA * f32::from(step) + NMAX) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..32 {
            let l = level_of(iscale, min, x[i]);
            candidate[i] = l;
            let l = f32::from(l);
            sum_l += weights[i] * l;
            sum_l2 += weights[i] * l * l;
            sum_xl += weights[i] * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let error = weighted_error(this_scale, this_min, &candidate);
            if error < best_error {
                levels.copy_from_slice(&candidate);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_to_vec, quantize, test_support};

    #[test]
    fn scale_min_packing_round_trips() {
        for value in 0..64u8 {
            let scales: [u8; 8] = std::array::from_fn(|s| (value + 7 * s as u8) % 64);
            let mins: [u8; 8] = std::array::from_fn(|s| (value + 3 + 11 * s as u8) % 64);
            let block = BlockQ4K {
                d: f16::ONE,
                dmin: f16::ONE,
                scales: BlockQ4K::pack_scale_min(&scales, &mins),
                qs: [0; 128],
            };
            assert!((0..8).all(|s| block.scale_min(s) == (scales[s], mins[s])));
        }
    }

    #[test]
    fn hand_computed_block() {
        let mut bytes = vec![0x00, 0x38, 0x00, 0x34]; // d = 0.5, dmin = 0.25
                                                      // Sub-block 0: sc = 3, m = 2; sub-block 5: sc = 0b01_0110 = 22 (low nibble 6 in byte 9, high bits
                                                      // 01 atop byte 1), m = 0b10_0001 = 33 (high nibble 1 in byte 9, high bits 10 atop byte 5).
        bytes.extend([3, 0x40, 0, 0, 2, 0x80, 0, 0, 0, 0x16, 0, 0]);
        let mut qs = [0u8; 128];
        qs[0] = 0x0F; // y[0] has q = 15, y[32] (sub-block 1, sc = m = 0) has q = 0
        qs[64 + 5] = 0x90; // chunk 2: y[128+5] sub-block 4 q = 0, y[160+5] sub-block 5 q = 9
        bytes.extend(qs);
        let values = dequantize_to_vec(GgmlType::Q4_K, &bytes).unwrap();
        assert_eq!(values[0], 0.5 * 3.0 * 15.0 - 0.25 * 2.0);
        assert_eq!(values[1], -0.5);
        assert_eq!(values[32], 0.0);
        assert_eq!(values[165], 0.5 * 22.0 * 9.0 - 0.25 * 33.0);
        assert_eq!(values[164], -0.25 * 33.0);
    }

    #[test]
    fn constant_blocks_keep_their_value() {
        for value in [-3.0f32, 0.75] {
            let bytes = quantize(GgmlType::Q4_K, &[value; 256]).unwrap();
            let back = dequantize_to_vec(GgmlType::Q4_K, &bytes).unwrap();
            assert!(back.iter().all(|&v| (v - value).abs() < 1e-2 * value.abs()), "{value}: {:?}", &back[..4]);
        }
    }

    #[test]
    fn round_trip_error() {
        // Measured: 0.0703 relative rms.
        let err = test_support::round_trip_relative_rms(GgmlType::Q4_K);
        assert!(err < 0.08, "{err}");
    }
}
