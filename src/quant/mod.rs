//! Block formats of ggml tensors: sizes of every ggml type, and CPU dequantisation (plus quantisation, used by
//! `make-tiny`) for the formats lingtab computes with. The CPU code is the reference the GPU kernels are tested
//! against, so it follows ggml's arithmetic exactly (f16 scales widened to f32, products in f32).

use std::fmt;

mod float;
mod q4_k;
mod q5_0;
mod q6_k;
mod q8_0;

pub use float::{BlockF16, BlockF32};
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;

/// A ggml tensor type, numbered as in `ggml.h` and the GGUF tensor-info table.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, I8, I16, I32, I64, F64, IQ1_M, BF16,
    TQ1_0, TQ2_0, MXFP4,
}

/// (type, ggml id, gguf-py name, elements per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2_K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3_K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4_K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5_K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6_K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE.iter().find(|r| r.0 == self).expect("every GgmlType is in TABLE")
    }
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.2.eq_ignore_ascii_case(name)).map(|r| r.0)
    }
    pub fn id(self) -> u32 {
        self.row().1
    }
    /// The name as gguf-py spells it (`Q4_K`, `F32`, ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }
    pub fn block_elems(self) -> usize {
        self.row().3
    }
    pub fn block_bytes(self) -> usize {
        self.row().4
    }
    /// Bytes of `n` elements; `None` when `n` is not a whole number of blocks.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if n % be != 0 {
            return None;
        }
        (n / be).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One ggml block format: a block parsed from its little-endian bytes, converted to and from f32.
/// Slice arguments must have exactly `BYTES` bytes or `ELEMS` values (the functions below check that).
pub trait BlockFormat: Sized {
    const TYPE: GgmlType;
    const ELEMS: usize;
    const BYTES: usize;
    fn from_bytes(bytes: &[u8]) -> Self;
    fn write_bytes(&self, out: &mut [u8]);
    fn dequantize(&self, out: &mut [f32]);
    /// `None` when the finite `src` cannot be stored: a scale (or, for F16, a value) beyond the f16 range.
    fn quantize(src: &[f32]) -> Option<Self>;
}

/// Why `dequantize` or `quantize` refused its input.
#[derive(Clone, Debug, PartialEq)]
pub enum QuantError {
    /// lingtab has no CPU code for this type (see `is_supported`).
    Unsupported { ty: GgmlType },
    /// The input bytes end inside a block.
    BytesNotWholeBlocks { ty: GgmlType, bytes: usize },
    /// The values to quantise end inside a block.
    ValuesNotWholeBlocks { ty: GgmlType, values: usize },
    /// The output buffer's length is not the number of elements the input holds.
    OutputLength { ty: GgmlType, expected: usize, actual: usize },
    /// A value to quantise is NaN or infinite.
    NonFiniteInput { ty: GgmlType, index: usize, value: f32 },
    /// A block's values are too large for its f16 scale (or, for F16, for f16 itself).
    OutOfRange { ty: GgmlType, block: usize },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            QuantError::Unsupported { ty } => {
                write!(f, "ggml type {ty} is not supported (supported: ")?;
                let supported: Vec<&str> = TABLE.iter().filter(|r| is_supported(r.0)).map(|r| r.2).collect();
                write!(f, "{})", supported.join(", "))
            }
            QuantError::BytesNotWholeBlocks { ty, bytes } => {
                write!(f, "{ty} data of {bytes} bytes is not a whole number of {}-byte blocks", ty.block_bytes())
            }
            QuantError::ValuesNotWholeBlocks { ty, values } => {
                write!(f, "{values} values are not a whole number of {ty} blocks of {} elements", ty.block_elems())
            }
            QuantError::OutputLength { ty, expected, actual } => {
                write!(f, "{ty} data holds {expected} elements but the output buffer has {actual}")
            }
            QuantError::NonFiniteInput { ty, index, value } => {
                write!(f, "cannot quantize to {ty}: value {index} is {value}")
            }
            QuantError::OutOfRange { ty, block } => {
                write!(f, "cannot quantize to {ty}: the values of block {block} are too large for an f16 scale")
            }
        }
    }
}

impl std::error::Error for QuantError {}

/// The conversion routines of one supported type.
struct Kernels {
    dequantize: fn(&[u8], &mut [f32]),
    quantize: fn(&[f32], &mut [u8]) -> Result<(), usize>,
}

/// `None` for types without CPU code.
fn kernels(ty: GgmlType) -> Option<Kernels> {
    fn of<B: BlockFormat>() -> Kernels {
        Kernels { dequantize: dequantize_blocks::<B>, quantize: quantize_blocks::<B> }
    }
    Some(match ty {
        GgmlType::F32 => of::<BlockF32>(),
        GgmlType::F16 => of::<BlockF16>(),
        GgmlType::Q4_K => of::<BlockQ4K>(),
        GgmlType::Q6_K => of::<BlockQ6K>(),
        GgmlType::Q5_0 => of::<BlockQ5_0>(),
        GgmlType::Q8_0 => of::<BlockQ8_0>(),
        _ => return None,
    })
}

fn dequantize_blocks<B: BlockFormat>(bytes: &[u8], out: &mut [f32]) {
    for (block, values) in bytes.chunks_exact(B::BYTES).zip(out.chunks_exact_mut(B::ELEMS)) {
        B::from_bytes(block).dequantize(values);
    }
}

/// Blocks are independent, so large inputs are split over the machine's threads (one where there are none, as
/// in the browser); the bytes are the same either way. Err: the first block that could not be quantised.
fn quantize_blocks<B: BlockFormat>(src: &[f32], out: &mut [u8]) -> Result<(), usize> {
    let blocks = src.len() / B::ELEMS;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(blocks / 4096).max(1);
    if threads == 1 {
        return quantize_range::<B>(src, out, 0);
    }
    let per = blocks.div_ceil(threads);
    let firsts: Vec<Result<(), usize>> = std::thread::scope(|scope| {
        let runs: Vec<_> = src
            .chunks(per * B::ELEMS)
            .zip(out.chunks_mut(per * B::BYTES))
            .enumerate()
            .map(|(i, (src, out))| scope.spawn(move || quantize_range::<B>(src, out, i * per)))
            .collect();
        runs.into_iter().map(|r| r.join().expect("a quantising thread panicked")).collect()
    });
    firsts.into_iter().collect()
}

/// [`quantize_blocks`] of one range, whose first block is block `first` of the whole.
fn quantize_range<B: BlockFormat>(src: &[f32], out: &mut [u8], first: usize) -> Result<(), usize> {
    for (index, (values, block)) in src.chunks_exact(B::ELEMS).zip(out.chunks_exact_mut(B::BYTES)).enumerate() {
        B::quantize(values).ok_or(first + index)?.write_bytes(block);
    }
    Ok(())
}

/// Whether `dequantize` and `quantize` handle `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    kernels(ty).is_some()
}

/// Dequantises `bytes`, a whole number of `ty` blocks, into `out` (exactly blocks × block_elems values),
/// bit-identical to ggml's `dequantize_row_*` and gguf-py's `gguf.quants.dequantize`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let kernels = kernels(ty).ok_or(QuantError::Unsupported { ty })?;
    if bytes.len() % ty.block_bytes() != 0 {
        return Err(QuantError::BytesNotWholeBlocks { ty, bytes: bytes.len() });
    }
    let expected = bytes.len() / ty.block_bytes() * ty.block_elems();
    if out.len() != expected {
        return Err(QuantError::OutputLength { ty, expected, actual: out.len() });
    }
    (kernels.dequantize)(bytes, out);
    Ok(())
}

/// `dequantize` into a new vector sized from `bytes`.
pub fn dequantize_to_vec(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
    let mut out = vec![0.0; bytes.len() / ty.block_bytes() * ty.block_elems()];
    dequantize(ty, bytes, &mut out)?;
    Ok(out)
}

/// Quantises `src` (a whole number of blocks, all finite) to `ty` blocks. Deterministic; the K-quants
/// follow ggml's reference quantisers (`quantize_row_*_ref`); all-zero blocks decode to zeros.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let kernels = kernels(ty).ok_or(QuantError::Unsupported { ty })?;
    if src.len() % ty.block_elems() != 0 {
        return Err(QuantError::ValuesNotWholeBlocks { ty, values: src.len() });
    }
    if let Some((index, &value)) = src.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(QuantError::NonFiniteInput { ty, index, value });
    }
    let mut out = vec![0; src.len() / ty.block_elems() * ty.block_bytes()];
    (kernels.quantize)(src, &mut out).map_err(|block| QuantError::OutOfRange { ty, block })?;
    Ok(out)
}

/// ggml's `nearest_int`: round half to even by adding 1.5·2²³, whose sum's low mantissa bits are the rounded value
/// (for |value| < 2²², every value the quantisers round; `round_ties_even` past that). The same rounding as
/// `round_ties_even`, several times faster: that is a libm call on x86-64 without SSE4.1.
fn nearest_int(value: f32) -> i32 {
    if value.abs() < 4_194_303.0 {
        ((value + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
    } else {
        value.round_ties_even() as i32
    }
}

/// Reads the little-endian f16 at `offset`.
fn f16_at(bytes: &[u8], offset: usize) -> half::f16 {
    half::f16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::{dequantize_to_vec, quantize, GgmlType};

    /// Deterministic standard-normal samples (splitmix64 + Box–Muller), so tests need no RNG crate.
    pub fn gaussian(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        let mut uniform = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (u1, u2) = (uniform(), uniform());
                ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect()
    }

    /// ‖x − dequant(quant(x))‖ / ‖x‖ over 64 blocks' worth of Gaussian data.
    pub fn round_trip_relative_rms(ty: GgmlType) -> f64 {
        let src = gaussian(64 * ty.block_elems(), 42);
        let back = dequantize_to_vec(ty, &quantize(ty, &src).unwrap()).unwrap();
        let err: f64 = src.iter().zip(&back).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
        let norm: f64 = src.iter().map(|&a| (a as f64).powi(2)).sum();
        (err / norm).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUPPORTED: [GgmlType; 6] =
        [GgmlType::F32, GgmlType::F16, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q8_0];

    #[test]
    fn supported_types_are_exactly_the_six() {
        for row in TABLE {
            assert_eq!(is_supported(row.0), SUPPORTED.contains(&row.0), "{}", row.0);
        }
    }

    #[test]
    fn block_constants_match_the_table() {
        fn check<B: BlockFormat>() {
            assert_eq!((B::ELEMS, B::BYTES), (B::TYPE.block_elems(), B::TYPE.block_bytes()), "{}", B::TYPE);
        }
        check::<BlockF32>();
        check::<BlockF16>();
        check::<BlockQ4K>();
        check::<BlockQ6K>();
        check::<BlockQ5_0>();
        check::<BlockQ8_0>();
    }

    #[test]
    fn unsupported_types_are_errors() {
        let err = dequantize(GgmlType::Q4_0, &[0; 18], &mut [0.0; 32]).unwrap_err();
        assert_eq!(err, QuantError::Unsupported { ty: GgmlType::Q4_0 });
        assert!(err.to_string().contains("Q4_0 is not supported"), "{err}");
        assert!(err.to_string().contains("Q4_K"), "{err}");
        let err = quantize(GgmlType::IQ2_XS, &[0.0; 256]).unwrap_err();
        assert_eq!(err, QuantError::Unsupported { ty: GgmlType::IQ2_XS });
        assert!(dequantize_to_vec(GgmlType::BF16, &[0; 4]).is_err());
    }

    #[test]
    fn wrong_lengths_are_errors() {
        for ty in SUPPORTED {
            let whole = vec![0; 2 * ty.block_bytes()];
            let err = dequantize(ty, &whole[1..], &mut vec![0.0; ty.block_elems()]).unwrap_err();
            assert_eq!(err, QuantError::BytesNotWholeBlocks { ty, bytes: whole.len() - 1 });
            let err = dequantize(ty, &whole, &mut vec![0.0; 2 * ty.block_elems() + 1]).unwrap_err();
            assert_eq!(
                err,
                QuantError::OutputLength { ty, expected: 2 * ty.block_elems(), actual: 2 * ty.block_elems() + 1 }
            );
            if ty.block_elems() > 1 {
                let err = quantize(ty, &vec![0.0; ty.block_elems() + 1]).unwrap_err();
                assert_eq!(err, QuantError::ValuesNotWholeBlocks { ty, values: ty.block_elems() + 1 });
            }
            assert_eq!(dequantize_to_vec(ty, &[]).unwrap(), Vec::<f32>::new());
            assert_eq!(quantize(ty, &[]).unwrap(), Vec::<u8>::new());
        }
        let message = dequantize(GgmlType::Q4_K, &[0; 145], &mut []).unwrap_err().to_string();
        assert_eq!(message, "Q4_K data of 145 bytes is not a whole number of 144-byte blocks");
        let message = dequantize(GgmlType::Q8_0, &[0; 34], &mut [0.0; 31]).unwrap_err().to_string();
        assert_eq!(message, "Q8_0 data holds 32 elements but the output buffer has 31");
    }

    #[test]
    fn unrepresentable_input_is_an_error() {
        for ty in SUPPORTED {
            let mut src = vec![0.5; ty.block_elems() * 3];
            src[ty.block_elems() + 1] = f32::NAN;
            let err = quantize(ty, &src).unwrap_err();
            assert!(matches!(err, QuantError::NonFiniteInput { index, .. } if index == ty.block_elems() + 1), "{err}");
            if ty != GgmlType::F32 {
                src[ty.block_elems() + 1] = 0.5;
                src[2 * ty.block_elems()] = 3e9;
                assert_eq!(quantize(ty, &src).unwrap_err(), QuantError::OutOfRange { ty, block: 2 });
            }
        }
    }

    /// Inputs of many blocks are quantised on several threads: the bytes are those of one block at a time, and
    /// a block out of range is named by its place in the whole input, the first of several.
    #[test]
    fn threaded_quantising_gives_the_block_by_block_bytes() {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
            let blocks = 3 * 4096 + 5;
            let mut src = test_support::gaussian(blocks * ty.block_elems(), 7);
            let whole = quantize(ty, &src).unwrap();
            let one_by_one: Vec<u8> = src.chunks(ty.block_elems()).flat_map(|b| quantize(ty, b).unwrap()).collect();
            assert!(whole == one_by_one, "{ty}");
            for late in [blocks - 1, 2 * 4096 + 1] {
                src[late * ty.block_elems()] = 3e9;
            }
            assert_eq!(quantize(ty, &src).unwrap_err(), QuantError::OutOfRange { ty, block: 2 * 4096 + 1 });
        }
    }

    /// ggml's rounding trick against `round_ties_even`, ties and the edges of its range included.
    #[test]
    fn nearest_int_rounds_half_to_even() {
        for v in [0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 63.5, 64.5, -127.5, 4_194_302.5, -4_194_302.5, 4_194_303.0, 1e9, -1e9, 0.0, -0.0] {
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
        let mut state = 1u64;
        for _ in 0..100_000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = ((state >> 40) as f32 - 8_388_608.0) / 64.0;
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn zeros_round_trip_exactly() {
        for ty in SUPPORTED {
            let bytes = quantize(ty, &vec![0.0; 4 * ty.block_elems()]).unwrap();
            // Q6_K decodes a zero block as 0·(0 − 32) = −0.0, as ggml does; −0.0 == 0.0.
            assert!(dequantize_to_vec(ty, &bytes).unwrap().iter().all(|&v| v == 0.0), "{ty}");
        }
    }

    /// Relative rms round-trip error on N(0,1) data, per type, printed with `--nocapture`;
    /// each format's own test bounds its value.
    #[test]
    fn round_trip_errors_on_gaussian_data() {
        for ty in SUPPORTED {
            println!("{ty}: relative rms error {:.5}", test_support::round_trip_relative_rms(ty));
        }
    }
}
