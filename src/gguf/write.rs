//! GGUF v3 writer: one file, or N parts laid out like llama.cpp's gguf-split (all metadata in part 1, then
//! `split.no`, `split.count`, `split.tensors.count` in every part; each part its own header and data section).
//! Headers are planned first so tensor bytes can be streamed to disk one tensor at a time.

use super::split::{KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS};
use super::{align_up, GgufError, Value, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::quant::GgmlType;
use std::io::{self, Write};

#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order (row length first).
    pub dims: Vec<u64>,
}

impl TensorSpec {
    pub fn n_bytes(&self) -> u64 {
        self.ty.bytes_for(self.dims.iter().product()).expect("row length must be whole blocks")
    }
}

/// One output file: its header bytes and which tensors follow, at which offsets in its data section.
#[derive(Clone, Debug)]
pub struct PartPlan {
    pub header: Vec<u8>,
    pub tensors: Vec<usize>,
    pub offsets: Vec<u64>,
    /// Total length of the file.
    pub len: u64,
}

#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorSpec>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }
    pub fn set(&mut self, key: &str, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<(), GgufError> {
        if dims.is_empty() || dims.len() > super::MAX_DIMS || dims[0] % ty.block_elems() as u64 != 0 {
            return Err(GgufError::Invalid(format!("tensor {name:?}: dims {dims:?} do not fit type {ty}")));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::Invalid(format!("tensor {name:?} added twice")));
        }
        self.tensors.push(TensorSpec { name: name.to_string(), ty, dims: dims.to_vec() });
        Ok(())
    }
    fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) => *a as u64,
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// Plans `n_parts` files (1 = a plain file without split keys). Tensors stay in order and are cut where the
    /// running byte count crosses each 1/n of the total, so every part gets about the same size.
    pub fn plan(&self, n_parts: usize) -> Result<Vec<PartPlan>, GgufError> {
        let n_parts = n_parts.max(1);
        if n_parts > self.tensors.len().max(1) || n_parts > u16::MAX as usize {
            return Err(GgufError::Invalid(format!("cannot split {} tensors into {n_parts} parts", self.tensors.len())));
        }
        let alignment = self.alignment();
        let sizes: Vec<u64> = self.tensors.iter().map(|t| align_up(t.n_bytes(), alignment)).collect();
        let total: u64 = sizes.iter().sum();
        // cut k (1 ≤ k < n) is the first tensor starting at or after k/n of the bytes; every part keeps ≥ 1 tensor
        let mut starts = Vec::with_capacity(sizes.len());
        let mut running = 0u64;
        for size in &sizes {
            starts.push(running);
            running += size;
        }
        let n = self.tensors.len();
        let mut bounds = vec![0usize];
        for k in 1..n_parts {
            let target = (total as u128 * k as u128 / n_parts as u128) as u64;
            let cut = starts.iter().position(|&s| s >= target).unwrap_or(n);
            bounds.push(cut.max(bounds[k - 1] + 1).min(n - (n_parts - k)));
        }
        bounds.push(n);
        let groups: Vec<Vec<usize>> = bounds.windows(2).map(|w| (w[0]..w[1]).collect()).collect();
        let mut plans = Vec::with_capacity(n_parts);
        for (no, group) in groups.into_iter().enumerate() {
            let mut meta: Vec<(String, Value)> = if no == 0 { self.metadata.clone() } else { Vec::new() };
            if n_parts > 1 {
                meta.retain(|(k, _)| !k.starts_with("split."));
                meta.push((KEY_SPLIT_NO.into(), Value::U16(no as u16)));
                meta.push((KEY_SPLIT_COUNT.into(), Value::U16(n_parts as u16)));
                meta.push((KEY_SPLIT_TENSORS.into(), Value::I32(self.tensors.len() as i32)));
            }
            let mut offsets = Vec::with_capacity(group.len());
            let mut off = 0u64;
            for &i in &group {
                offsets.push(off);
                off += sizes[i];
            }
            let mut header = Vec::new();
            header.extend_from_slice(GGUF_MAGIC);
            header.extend_from_slice(&3u32.to_le_bytes());
            header.extend_from_slice(&(group.len() as u64).to_le_bytes());
            header.extend_from_slice(&(meta.len() as u64).to_le_bytes());
            for (k, v) in &meta {
                put_str(&mut header, k);
                header.extend_from_slice(&v.value_type().id().to_le_bytes());
                put_value(&mut header, v);
            }
            for (&i, &o) in group.iter().zip(&offsets) {
                let t = &self.tensors[i];
                put_str(&mut header, &t.name);
                header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
                for d in &t.dims {
                    header.extend_from_slice(&d.to_le_bytes());
                }
                header.extend_from_slice(&t.ty.id().to_le_bytes());
                header.extend_from_slice(&o.to_le_bytes());
            }
            header.resize(align_up(header.len() as u64, alignment) as usize, 0);
            let len = header.len() as u64 + off;
            plans.push(PartPlan { header, tensors: group, offsets, len });
        }
        Ok(plans)
    }

    /// Writes one planned part; `data(i)` gives tensor i's bytes (exactly its size), asked for in file order.
    pub fn write_part<W: Write>(&self, plan: &PartPlan, out: &mut W, mut data: impl FnMut(usize) -> Vec<u8>) -> io::Result<()> {
        out.write_all(&plan.header)?;
        let alignment = self.alignment();
        for &i in &plan.tensors {
            let bytes = data(i);
            let want = self.tensors[i].n_bytes();
            if bytes.len() as u64 != want {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("tensor {:?}: {} bytes given, {want} expected", self.tensors[i].name, bytes.len()),
                ));
            }
            out.write_all(&bytes)?;
            let pad = align_up(want, alignment) - want;
            out.write_all(&vec![0u8; pad as usize])?;
        }
        Ok(())
    }

    /// Every part in memory (for tests and small models).
    pub fn to_parts(&self, n_parts: usize, mut data: impl FnMut(usize) -> Vec<u8>) -> Result<Vec<Vec<u8>>, GgufError> {
        let plans = self.plan(n_parts)?;
        let mut files = Vec::with_capacity(plans.len());
        for plan in &plans {
            let mut buf = Vec::with_capacity(plan.len as usize);
            self.write_part(plan, &mut buf, &mut data).map_err(|e| GgufError::Invalid(e.to_string()))?;
            files.push(buf);
        }
        Ok(files)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(elem, items) => {
            out.extend_from_slice(&elem.id().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}
