//! Q5_0: 32 values per 22-byte block: `d` (f16), `qh` (u32, bit j = high bit of quant j), `qs[16]`
//! (low nibbles: quant j in `qs[j] & 15`, quant j+16 in `qs[j] >> 4`); `y = (q − 16)·d`.

use half::f16;

use super::{f16_at, BlockFormat, GgmlType};

#[derive(Clone, Debug, PartialEq)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: u32,
    pub qs: [u8; 16],
}

impl BlockQ5_0 {
    /// The 5-bit quant `j` (0..32), still offset by 16.
    pub fn quant(&self, j: usize) -> u8 {
        let nibble = if j < 16 { self.qs[j] & 15 } else { self.qs[j - 16] >> 4 };
        nibble | ((((self.qh >> j) & 1) as u8) << 4)
    }
}

impl BlockFormat for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ELEMS: usize = 32;
    const BYTES: usize = 22;

    fn from_bytes(bytes: &[u8]) -> Self {
        let mut qs = [0; 16];
        qs.copy_from_slice(&bytes[6..22]);
        BlockQ5_0 { d: f16_at(bytes, 0), qh: u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]), qs }
    }

    fn write_bytes(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..6].copy_from_slice(&self.qh.to_le_bytes());
        out[6..].copy_from_slice(&self.qs);
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, y) in out.iter_mut().enumerate() {
            *y = (i32::from(self.quant(j)) - 16) as f32 * d;
        }
    }

    /// ggml's `quantize_row_q5_0_ref`: the largest-magnitude value maps to −16, q = trunc(x/d + 16.5).
    fn quantize(src: &[f32]) -> Option<Self> {
        let signed_max = src.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = signed_max / -16.0;
        let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
        let quants: [u8; 32] = std::array::from_fn(|j| ((src[j] * inverse + 16.5) as i32).clamp(0, 31) as u8);
        let d = f16::from_f32(d);
        d.is_finite().then(|| BlockQ5_0 {
            d,
            qh: quants.iter().enumerate().fold(0, |qh, (j, &q)| qh | (u32::from(q >> 4) << j)),
            qs: std::array::from_fn(|j| (quants[j] & 15) | ((quants[j + 16] & 15) << 4)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_to_vec, quantize, test_support};

    #[test]
    fn hand_computed_block() {
        let mut bytes = vec![0x00, 0x40]; // d = 2.0
        bytes.extend(0x8000_0001u32.to_le_bytes()); // high bits of quants 0 and 31
        bytes.extend([0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xF0]);
        let values = dequantize_to_vec(GgmlType::Q5_0, &bytes).unwrap();
        assert_eq!(values[0], 2.0); // quant = low nibble 1 | high bit 16 = 17; (17 − 16)·2
        assert_eq!(values[1], -32.0);
        assert_eq!(values[16], ((2 - 16) * 2) as f32); // qs[0] >> 4 = 2, no high bit
        assert_eq!(values[31], ((31 - 16) * 2) as f32); // 15 | 16
    }

    #[test]
    fn quantize_packs_high_bits() {
        let src: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
        let block = BlockQ5_0::from_bytes(&quantize(GgmlType::Q5_0, &src).unwrap());
        assert_eq!(block.d.to_f32(), 1.0); // max magnitude −16 maps to quant 0
        assert!((0..32).all(|j| block.quant(j) == j as u8));
        assert_eq!(dequantize_to_vec(GgmlType::Q5_0, &quantize(GgmlType::Q5_0, &src).unwrap()).unwrap(), src);
    }

    #[test]
    fn round_trip_error() {
        // Measured: 0.0407 relative rms.
        let err = test_support::round_trip_relative_rms(GgmlType::Q5_0);
        assert!(err < 0.045, "{err}");
    }
}
