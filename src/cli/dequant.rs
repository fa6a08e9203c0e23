//! `lingtab dequant --type T --input blocks.bin --output out.f32`: dequantises a file of raw ggml blocks to
//! little-endian f32, so the CPU reference can be checked against gguf-py (tests/oracle/test_quant.py).

use std::path::Path;

use crate::quant::{self, GgmlType};

pub fn run(type_name: &str, input: &Path, output: &Path) -> Result<(), String> {
    let ty = GgmlType::from_name(type_name).ok_or_else(|| format!("unknown ggml type '{type_name}'"))?;
    let bytes = std::fs::read(input).map_err(|e| format!("cannot read {}: {e}", input.display()))?;
    let values = quant::dequantize_to_vec(ty, &bytes).map_err(|e| format!("{}: {e}", input.display()))?;
    let out: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(output, out).map_err(|e| format!("cannot write {}: {e}", output.display()))
}
