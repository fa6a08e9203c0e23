//! Helpers and kernel test cases shared by the native test crates (run on lavapipe) and the browser test
//! crates (`tests/web*.rs`, run in headless Chromium on WebGPU). A case is an `async fn(&Gpu)` so both
//! harnesses run the very same check.
#![allow(dead_code)]

pub mod dequant;
#[cfg(not(target_arch = "wasm32"))]
pub mod fixture;
pub mod forward;
pub mod kda;
pub mod matmul;
pub mod matvec;
pub mod mla_moe;

use lingtab::gpu::Gpu;
use lingtab::quant::GgmlType;

/// A small deterministic generator for test inputs. Each test draws its seed from [`Rand::test_seed`]: fixed per
/// call site, so CI runs are repeatable, and varied on demand to sweep many inputs (the seed goes into failure
/// messages, and setting it reproduces a failure).
pub struct Rand(u64);

impl Rand {
    pub fn new(seed: u64) -> Rand {
        Rand(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The seed for the calling test: a hash of its file and line, mixed with `LINGTAB_TEST_SEED` when that is
    /// set (a number, or `clock` for a fresh one each run). Native tests read the variable at run time, browser
    /// tests when they are compiled.
    #[track_caller]
    pub fn test_seed() -> u64 {
        let at = std::panic::Location::caller();
        let mut seed = 0xcbf2_9ce4_8422_2325u64; // FNV-1a over "file:line"
        for b in format!("{}:{}", at.file(), at.line()).bytes() {
            seed = (seed ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        #[cfg(target_arch = "wasm32")]
        let sweep = option_env!("LINGTAB_TEST_SEED").map(str::to_owned);
        #[cfg(not(target_arch = "wasm32"))]
        let sweep = std::env::var("LINGTAB_TEST_SEED").ok();
        match sweep.as_deref() {
            None | Some("") => seed,
            Some(sweep) => {
                let n = match sweep {
                    "clock" => Self::clock(),
                    n => n.parse::<u64>().expect("LINGTAB_TEST_SEED is a number or `clock`"),
                };
                #[cfg(not(target_arch = "wasm32"))]
                eprintln!("{}:{}: LINGTAB_TEST_SEED={n}", at.file(), at.line());
                seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            }
        }
    }
    fn clock() -> u64 {
        #[cfg(target_arch = "wasm32")]
        return js_sys::Date::now() as u64;
        #[cfg(not(target_arch = "wasm32"))]
        return std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    /// Approximately standard normal (sum of uniforms), never exactly zero in practice.
    pub fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.uniform(-1.0, 1.0)).sum::<f32>() * 0.866
    }
    pub fn normals(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * std).collect()
    }
}

/// Random blocks of `ty` whose f16 scale fields are finite and moderate; the rest random bytes.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rand::new(seed);
    let mut bytes: Vec<u8> = (0..n_blocks * ty.block_bytes()).map(|_| rng.next_u64() as u8).collect();
    let scale_offsets: &[usize] = match ty {
        GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        _ => &[],
    };
    for b in 0..n_blocks {
        for &off in scale_offsets {
            let v = half::f16::from_f32(rng.uniform(-0.05, 0.05));
            bytes[b * ty.block_bytes() + off..][..2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

/// f32 values as bytes, for uploads.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// A storage buffer of `n` f32 filled with NaN, so any element a kernel fails to write is caught.
pub fn poisoned(gpu: &Gpu, label: &str, n: usize) -> wgpu::Buffer {
    gpu.upload(label, &f32_bytes(&vec![f32::NAN; n]))
}

pub async fn read_f32(gpu: &Gpu, buffer: &wgpu::Buffer, n: usize) -> Vec<f32> {
    let bytes = gpu.read_back(buffer, n as u64 * 4).await.unwrap();
    bytemuck::pod_collect_to_vec(&bytes[..n * 4])
}

/// Asserts |got − want| ≤ atol + rtol·|want| element-wise (want from an f64 reference), naming the first miss.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(err <= atol + rtol * w.abs(), "{what}[{i}]: GPU {g} vs reference {w} (|Δ| {err:.3e})");
    }
}
