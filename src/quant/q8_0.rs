//! Q8_0: 32 values per 34-byte block: `d` (f16), then 32 signed 8-bit quants; `y = q·d`.

use half::f16;

use super::{f16_at, BlockFormat, GgmlType};

#[derive(Clone, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}

impl BlockFormat for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ELEMS: usize = 32;
    const BYTES: usize = 34;

    fn from_bytes(bytes: &[u8]) -> Self {
        BlockQ8_0 { d: f16_at(bytes, 0), qs: std::array::from_fn(|i| bytes[2 + i] as i8) }
    }

    fn write_bytes(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        for (byte, &q) in out[2..].iter_mut().zip(&self.qs) {
            *byte = q as u8;
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, &q) in out.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }

    /// ggml's `quantize_row_q8_0_ref`: d = max|x|/127, q = round(x/d) (ties away from zero).
    fn quantize(src: &[f32]) -> Option<Self> {
        let amax = src.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
        let d = f16::from_f32(d);
        d.is_finite().then(|| BlockQ8_0 { d, qs: std::array::from_fn(|i| (src[i] * inverse).round() as i8) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_to_vec, quantize, test_support};

    #[test]
    fn hand_computed_block() {
        let mut bytes = vec![0x00, 0x38]; // d = 0.5
        bytes.extend((0..32).map(|i| (i as i8 - 16) as u8));
        bytes.extend([0x00, 0xB4, 0x7F]); // second block: d = -0.25, q0 = 127, rest 0
        bytes.extend([0; 31]);
        let values = dequantize_to_vec(GgmlType::Q8_0, &bytes).unwrap();
        assert_eq!(values[0], -8.0);
        assert_eq!(values[16], 0.0);
        assert_eq!(values[31], 7.5);
        assert_eq!(values[32], -31.75);
        assert!(values[33..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn quantize_rounds_ties_away_from_zero() {
        let mut src = [0.0f32; 32];
        src[..4].copy_from_slice(&[127.0, 63.5, -0.5, 2.5]); // d = 127/127 = 1
        let block = BlockQ8_0::from_bytes(&quantize(GgmlType::Q8_0, &src).unwrap());
        assert_eq!(block.d.to_f32(), 1.0);
        assert_eq!(block.qs[..5], [127, 64, -1, 3, 0]);
    }

    #[test]
    fn round_trip_error() {
        // Measured: 0.0051 relative rms (step max|x|/127 ≈ 0.018, uniform rounding error step/√12).
        let err = test_support::round_trip_relative_rms(GgmlType::Q8_0);
        assert!(err < 0.006, "{err}");
    }
}
