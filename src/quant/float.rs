//! F32 and F16 tensors, as one-element "blocks" so they share the block-format plumbing.

use half::f16;

use super::{f16_at, BlockFormat, GgmlType};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockF32(pub f32);

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockF16(pub f16);

impl BlockFormat for BlockF32 {
    const TYPE: GgmlType = GgmlType::F32;
    const ELEMS: usize = 1;
    const BYTES: usize = 4;

    fn from_bytes(bytes: &[u8]) -> Self {
        BlockF32(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn write_bytes(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.0.to_le_bytes());
    }

    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.0;
    }

    fn quantize(src: &[f32]) -> Option<Self> {
        Some(BlockF32(src[0]))
    }
}

impl BlockFormat for BlockF16 {
    const TYPE: GgmlType = GgmlType::F16;
    const ELEMS: usize = 1;
    const BYTES: usize = 2;

    fn from_bytes(bytes: &[u8]) -> Self {
        BlockF16(f16_at(bytes, 0))
    }

    fn write_bytes(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.0.to_le_bytes());
    }

    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.0.to_f32();
    }

    /// Round to nearest even, as numpy's `astype(np.float16)`; `None` past ±65504.
    fn quantize(src: &[f32]) -> Option<Self> {
        Some(BlockF16(f16::from_f32(src[0]))).filter(|v| v.0.is_finite())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_to_vec, quantize, test_support};

    #[test]
    fn f16_known_values() {
        // 0x3C00 = 1.0, 0xC000 = -2.0, 0x7BFF = 65504 (largest finite), 0x0001 = 2^-24 (smallest subnormal).
        let bytes = [0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00, 0x00, 0x80];
        let values = dequantize_to_vec(GgmlType::F16, &bytes).unwrap();
        assert_eq!(values, [1.0, -2.0, 65504.0, 2f32.powi(-24), -0.0]);
        assert!(values[4].is_sign_negative());
        assert_eq!(quantize(GgmlType::F16, &values).unwrap(), bytes);
    }

    #[test]
    fn f16_special_values_survive() {
        let values = dequantize_to_vec(GgmlType::F16, &[0x00, 0x7C, 0x00, 0xFC, 0x00, 0x7E]).unwrap();
        assert_eq!(values[..2], [f32::INFINITY, f32::NEG_INFINITY]);
        assert!(values[2].is_nan());
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1.0 and the next f16 (1 + 2^-10): ties go to the even 1.0.
        let bytes = quantize(GgmlType::F16, &[1.0 + 2f32.powi(-11), 65519.0]).unwrap();
        assert_eq!(bytes, [0x00, 0x3C, 0xFF, 0x7B]);
    }

    #[test]
    fn f32_is_lossless() {
        let src = test_support::gaussian(100, 1);
        let bytes = quantize(GgmlType::F32, &src).unwrap();
        assert_eq!(bytes[..4], src[0].to_le_bytes());
        assert_eq!(dequantize_to_vec(GgmlType::F32, &bytes).unwrap(), src);
    }

    #[test]
    fn f16_round_trip_error() {
        // Measured: 1.6e-4 relative rms (f16 has an 11-bit significand).
        let err = test_support::round_trip_relative_rms(GgmlType::F16);
        assert!(err < 2e-4, "{err}");
    }
}
