//! Q6_K: 256 values per 210-byte super-block: `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), sixteen int8
//! scales (one per 16 values), then `d` (f16); `y = d·scale·(q − 32)`. Each 128-value half n uses
//! `ql[64n..64n+64]`, `qh[32n..32n+32]` and `scales[8n..8n+8]`.

use half::f16;

use super::{f16_at, nearest_int, BlockFormat, GgmlType};

#[derive(Clone, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: f16,
}

impl BlockFormat for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const ELEMS: usize = 256;
    const BYTES: usize = 210;

    fn from_bytes(bytes: &[u8]) -> Self {
        let mut block = BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: std::array::from_fn(|i| bytes[192 + i] as i8),
            d: f16_at(bytes, 208),
        };
        block.ql.copy_from_slice(&bytes[..128]);
        block.qh.copy_from_slice(&bytes[128..192]);
        block
    }

    fn write_bytes(&self, out: &mut [u8]) {
        out[..128].copy_from_slice(&self.ql);
        out[128..192].copy_from_slice(&self.qh);
        for (byte, &scale) in out[192..208].iter_mut().zip(&self.scales) {
            *byte = scale as u8;
        }
        out[208..210].copy_from_slice(&self.d.to_le_bytes());
    }

    /// ggml's `dequantize_row_q6_K`: `(d·scale)·q`, multiplied left to right in f32.
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for half in 0..2 {
            let ql = &self.ql[64 * half..64 * half + 64];
            let qh = &self.qh[32 * half..32 * half + 32];
            let scales = &self.scales[8 * half..8 * half + 8];
            let y = &mut out[128 * half..128 * half + 128];
            for l in 0..32 {
                let group = l / 16;
                let quants = [
                    (ql[l] & 15) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, q) in quants.into_iter().enumerate() {
                    y[l + 32 * k] = d * f32::from(scales[group + 2 * k]) * f32::from(q as i8 - 32);
                }
            }
        }
    }

    /// ggml's `quantize_row_q6_K_ref`: fit a signed scale per 16 values, quantise the scales to int8
    /// against the largest, then requantise the values with the scales as stored.
    fn quantize(src: &[f32]) -> Option<Self> {
        let mut levels = [0u8; 256];
        let mut sub_scales = [0f32; 16];
        for (g, scale) in sub_scales.iter_mut().enumerate() {
            *scale = fit_symmetric_scale(&src[16 * g..16 * g + 16], &mut levels[16 * g..16 * g + 16]);
        }
        let max_scale = sub_scales.iter().fold(0.0f32, |m, &s| if s.abs() > m.abs() { s } else { m });
        if max_scale.abs() < GROUP_MAX_EPS {
            return Some(BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO });
        }
        let iscale = -128.0 / max_scale;
        let d = f16::from_f32(1.0 / iscale);
        if !d.is_finite() {
            return None;
        }
        let scales: [i8; 16] = std::array::from_fn(|g| nearest_int(iscale * sub_scales[g]).clamp(-128, 127) as i8);
        for (g, &scale) in scales.iter().enumerate() {
            let step = d.to_f32() * f32::from(scale);
            if step == 0.0 {
                continue; // the whole group decodes to zero whatever its levels
            }
            for (level, &x) in levels[16 * g..16 * g + 16].iter_mut().zip(&src[16 * g..16 * g + 16]) {
                *level = (nearest_int(x / step).clamp(-32, 31) + 32) as u8;
            }
        }
        let mut block = BlockQ6K { ql: [0; 128], qh: [0; 64], scales, d };
        for half in 0..2 {
            let levels = &levels[128 * half..128 * half + 128];
            for l in 0..32 {
                let [q1, q2, q3, q4] = [levels[l], levels[l + 32], levels[l + 64], levels[l + 96]];
                block.ql[64 * half + l] = (q1 & 15) | ((q3 & 15) << 4);
                block.ql[64 * half + l + 32] = (q2 & 15) | ((q4 & 15) << 4);
                block.qh[32 * half + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
        Some(block)
    }
}

/// ggml's threshold below which a group counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `make_qx_quants` with 6-bit levels and weights x² (`rmse_type` 1): maps the largest-magnitude
/// value to level −32, tries 18 nearby scales and keeps the one with the least weighted squared error.
/// Returns the scale and fills `levels` with level + 32.
fn fit_symmetric_scale(x: &[f32], levels: &mut [u8]) -> f32 {
    const NMAX: f32 = 32.0;
    let signed_max = x.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if signed_max.abs() < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level_of = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-32, 31);
    // Least-squares fit for a given iscale: Σw·x·l and Σw·l² with w = x².
    let moments = |iscale: f32| {
        x.iter().fold((0.0f32, 0.0f32), |(sum_lx, sum_l2), &v| {
            let (w, l) = (v * v, level_of(iscale, v) as f32);
            (sum_lx + w * v * l, sum_l2 + w * l * l)
        })
    };
    let mut best_iscale = -NMAX / signed_max;
    let (sum_lx, sum_l2) = moments(best_iscale);
    let mut scale = if sum_l2 != 0.0 { sum_lx / sum_l2 } else { 0.0 };
    let mut best = scale * sum_lx;
    for step in (-9..=9).filter(|&s| s != 0) {
        let iscale = -(NMAX + 0.1 * step as f32) / signed_max;
        let (sum_lx, sum_l2) = moments(iscale);
        // Equivalent to comparing sum_lx²/sum_l2, the error reduction of the fitted scale.
        if sum_l2 > 0.0 && sum_lx * sum_lx > best * sum_l2 {
            best_iscale = iscale;
            scale = sum_lx / sum_l2;
            best = scale * sum_lx;
        }
    }
    for (level, &v) in levels.iter_mut().zip(x) {
        *level = (level_of(best_iscale, v) + 32) as u8;
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_to_vec, test_support};

    #[test]
    fn hand_computed_block() {
        let mut bytes = vec![0u8; 210];
        bytes[208..210].copy_from_slice(&[0x00, 0x38]); // d = 0.5
        for (g, scale) in [1i8, -2, 3, 4, 5, 6, 7, -8, 9, 10, 11, 12, 13, 14, 15, -16].into_iter().enumerate() {
            bytes[192 + g] = scale as u8;
        }
        bytes[0] = 0xA5; // half 0, l = 0: low nibble 5 → y[0]; high nibble 10 → y[64]
        bytes[128] = 0b11_10_01_00; // high bits of y[0] = 0, y[32] = 1, y[64] = 2, y[96] = 3
        bytes[64 + 32 + 17] = 0x3F; // half 1, l = 17: ql[l + 32] low 15 → y[128 + 17 + 32], high 3 → y[128 + 17 + 96]
        bytes[128 + 32 + 17] = 0b01_00_11_00; // y[177] high 3, y[241] high 1
        let values = dequantize_to_vec(GgmlType::Q6_K, &bytes).unwrap();
        assert_eq!(values[0], 0.5 * 1.0 * (5.0 - 32.0));
        assert_eq!(values[32], 0.5 * 3.0 * (16.0 - 32.0)); // group 2
        assert_eq!(values[64], 0.5 * 5.0 * ((10 + 32) as f32 - 32.0)); // group 4
        assert_eq!(values[96], 0.5 * 7.0 * (48.0 - 32.0)); // group 6
        assert_eq!(values[17], 0.5 * -2.0 * -32.0); // group 1, q = 0
        assert_eq!(values[177], 0.5 * 12.0 * ((15 + 48) as f32 - 32.0)); // half 1, group 8 + 1 + 2
        assert_eq!(values[241], 0.5 * -16.0 * ((3 + 16) as f32 - 32.0)); // half 1, group 8 + 1 + 6
    }

    #[test]
    fn round_trip_error() {
        // Measured: 0.0176 relative rms.
        let err = test_support::round_trip_relative_rms(GgmlType::Q6_K);
        assert!(err < 0.02, "{err}");
    }
}
