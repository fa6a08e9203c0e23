//! Parsing a GGUF header out of a byte prefix.

use super::{align_up, GgufError, Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::quant::GgmlType;
use std::collections::HashMap;

/// One tensor-info entry. `offset` is relative to the data section of the file it sits in.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub offset: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    pub fn n_bytes(&self) -> u64 {
        self.ty.bytes_for(self.n_elements()).expect("validated when the header was parsed")
    }
    /// Bytes of one row (`dims[0]` elements).
    pub fn row_bytes(&self) -> u64 {
        self.ty.bytes_for(self.dims[0]).expect("validated when the header was parsed")
    }
}

/// A parsed GGUF header: metadata in file order, tensor infos, and where the data section starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section in this file.
    pub data_start: u64,
    index: HashMap<String, usize>,
}

impl Header {
    pub(crate) fn new(version: u32, metadata: Vec<(String, Value)>, tensors: Vec<TensorInfo>, alignment: u64, data_start: u64) -> Header {
        let index = metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        Header { version, metadata, tensors, alignment, data_start, index }
    }
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }
    /// Bytes from the start of the data section to the end of the last tensor.
    pub fn data_len(&self) -> u64 {
        self.tensors.iter().map(|t| t.offset + t.n_bytes()).max().unwrap_or(0)
    }
}

/// Parses the header at the start of `prefix`. `file_len` is the whole file's length when known (HTTP
/// Content-Range total, file size); pass `None` for a bare prefix. When the prefix ends inside the header the
/// error is `NeedMoreBytes` with the length to fetch; when the file is known, tensors must also fit in it.
pub fn parse_header(prefix: &[u8], file_len: Option<u64>) -> Result<Header, GgufError> {
    let limit = file_len.unwrap_or(u64::MAX);
    let mut r = Reader { buf: prefix, pos: 0, limit };
    let magic: [u8; 4] = r.bytes(4)?.try_into().unwrap();
    if &magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = r.u32()?;
    if version != 3 {
        // v1 used 32-bit counts and v2 is otherwise identical to v3, but lingtab only claims v3.
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = r.u64()?;
    let n_kv = r.u64()?;
    r.check_count(|| "metadata count".into(), n_kv, 8 + 4 + 1)?;
    r.check_count(|| "tensor count".into(), n_tensors, 8 + 1 + 4 + 8 + 8)?;

    let mut metadata = Vec::with_capacity(r.capacity_for(n_kv, 13));
    let mut seen = HashMap::new();
    for _ in 0..n_kv {
        let key = r.string(|| "metadata key".into())?;
        let type_id = r.u32()?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType { key: key.clone(), id: type_id })?;
        let value = r.value(ty, &key, 0)?;
        if seen.insert(key.clone(), ()).is_some() {
            return Err(GgufError::Invalid(format!("metadata key {key:?} appears twice")));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => match v {
            Value::U32(a) if *a > 0 && a.is_power_of_two() => *a as u64,
            other => return Err(GgufError::Invalid(format!("general.alignment must be a power-of-two u32, got {other:?}"))),
        },
    };

    let mut tensors = Vec::with_capacity(r.capacity_for(n_tensors, 29));
    let mut names = HashMap::new();
    for _ in 0..n_tensors {
        let name = r.string(|| "tensor name".into())?;
        let n_dims = r.u32()?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufError::Invalid(format!("tensor {name:?} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64()?);
        }
        let type_id = r.u32()?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType { tensor: name.clone(), id: type_id })?;
        let offset = r.u64()?;
        let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).filter(|&n| n > 0 && n < 1 << 60);
        let Some(n_elements) = n_elements else {
            return Err(GgufError::Invalid(format!("tensor {name:?} has impossible dimensions {dims:?}")));
        };
        if dims[0] % ty.block_elems() as u64 != 0 {
            return Err(GgufError::Invalid(format!(
                "tensor {name:?}: row length {} is not a multiple of the {} block size {}",
                dims[0], ty, ty.block_elems()
            )));
        }
        let n_bytes = ty.bytes_for(n_elements).expect("row length checked above");
        if offset % alignment != 0 {
            return Err(GgufError::Invalid(format!("tensor {name:?}: offset {offset} is not aligned to {alignment}")));
        }
        if offset.checked_add(n_bytes).is_none_or(|end| end > limit) {
            return Err(GgufError::TooLarge { what: format!("tensor {name:?} end offset"), count: offset.saturating_add(n_bytes), available: limit });
        }
        if names.insert(name.clone(), ()).is_some() {
            return Err(GgufError::Invalid(format!("tensor {name:?} appears twice")));
        }
        tensors.push(TensorInfo { name, dims, ty, offset });
    }
    let data_start = align_up(r.pos, alignment);

    // Tensors must not overlap: a file that claims they do is corrupt (and a store would double-write).
    let mut spans: Vec<(u64, u64, &str)> = tensors.iter().map(|t| (t.offset, t.offset + t.n_bytes(), t.name.as_str())).collect();
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(GgufError::Invalid(format!("tensors {:?} and {:?} overlap", w[0].2, w[1].2)));
        }
    }
    if let Some(len) = file_len {
        let end = data_start.checked_add(spans.last().map_or(0, |s| s.1));
        if end.is_none_or(|end| end > len) {
            return Err(GgufError::TooLarge { what: "end of tensor data".into(), count: end.unwrap_or(u64::MAX), available: len });
        }
    }
    Ok(Header::new(version, metadata, tensors, alignment, data_start))
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: u64,
    /// The file length (or u64::MAX when unknown): nothing can be longer than what remains before it.
    limit: u64,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).ok_or(GgufError::TooLarge { what: "a length".into(), count: n, available: 0 })?;
        if end > self.limit {
            return Err(GgufError::TooLarge { what: "a field".into(), count: n, available: self.limit.saturating_sub(self.pos) });
        }
        if end > self.buf.len() as u64 {
            return Err(GgufError::NeedMoreBytes { needed: end });
        }
        let s = &self.buf[self.pos as usize..end as usize];
        self.pos = end;
        Ok(s)
    }
    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.pos)
    }
    /// Refuses a count whose smallest encoding cannot fit in what remains of the file. (`what` names the
    /// field in the error; it is only formatted when there is one, since a vocabulary has 100k+ strings.)
    fn check_count(&self, what: impl FnOnce() -> String, count: u64, min_each: u64) -> Result<(), GgufError> {
        if count.checked_mul(min_each).is_none_or(|b| b > self.remaining()) {
            return Err(GgufError::TooLarge { what: what(), count, available: self.remaining() });
        }
        Ok(())
    }
    /// Capacity to reserve for `count` items: never more than the bytes actually at hand could hold.
    fn capacity_for(&self, count: u64, min_each: u64) -> usize {
        let at_hand = (self.buf.len() as u64).saturating_sub(self.pos) / min_each.max(1);
        count.min(at_hand).min(1 << 20) as usize
    }
    fn u8(&mut self) -> Result<u8, GgufError> {
        Ok(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().unwrap()))
    }
    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64()?;
        self.check_count(|| format!("{} length", what()), len, 1)?;
        let raw = self.bytes(len)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what: what() })
    }
    fn value(&mut self, ty: ValueType, key: &str, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8()?),
            ValueType::I8 => Value::I8(self.u8()? as i8),
            ValueType::U16 => Value::U16(self.u16()?),
            ValueType::I16 => Value::I16(self.u16()? as i16),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(self.u32()? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32()?)),
            ValueType::Bool => match self.u8()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(GgufError::Invalid(format!("metadata key {key:?}: bool byte {b}"))),
            },
            ValueType::String => Value::String(self.string(|| format!("value of {key:?}"))?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(self.u64()? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64()?)),
            ValueType::Array => {
                if depth >= 8 {
                    return Err(GgufError::Invalid(format!("metadata key {key:?}: arrays nested deeper than 8")));
                }
                let elem_id = self.u32()?;
                let elem = ValueType::from_id(elem_id).ok_or(GgufError::UnknownValueType { key: key.to_string(), id: elem_id })?;
                let count = self.u64()?;
                self.check_count(|| format!("array length of {key:?}"), count, elem.min_bytes())?;
                let mut items = Vec::with_capacity(self.capacity_for(count, elem.min_bytes()));
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}
