//! GGUF v3: the header reader (from a byte prefix), split models as one virtual file, and a writer.
//!
//! The reader never trusts a count: every length is checked against the bytes that can still exist
//! (the file length when known) before anything is allocated, so a hostile header cannot make it
//! allocate more than the input justifies.

mod read;
mod split;
mod write;

pub use read::{parse_header, Header, TensorInfo};
pub use split::{split_part_names, SplitModel, SplitTensor, MAX_MODEL_BYTES};
pub use write::{GgufWriter, PartPlan, TensorSpec};

use std::fmt;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;

/// The type tag of a metadata value, as stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8, 1 => I8, 2 => U16, 3 => I16, 4 => U32, 5 => I32, 6 => F32, 7 => Bool,
            8 => String, 9 => Array, 10 => U64, 11 => I64, 12 => F64,
            _ => return None,
        })
    }
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0, I8 => 1, U16 => 2, I16 => 3, U32 => 4, I32 => 5, F32 => 6, Bool => 7,
            String => 8, Array => 9, U64 => 10, I64 => 11, F64 => 12,
        }
    }
    /// Smallest number of bytes one value of this type occupies (a string is at least its length prefix).
    pub fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value. Arrays keep their element type so that an empty array round-trips.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }
    /// Any integer type as i128 (so u64 and i64 both fit); `None` for non-integers.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(|v| u64::try_from(v).ok())
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, items) => Some(items),
            _ => None,
        }
    }
    /// JSON form for `inspect --json` (long arrays are summarised by the caller, not here).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::Bool(b) => json!(b),
            Value::String(s) => json!(s),
            Value::F32(v) => json!(v),
            Value::F64(v) => json!(v),
            Value::Array(_, items) => serde_json::Value::Array(items.iter().map(Value::to_json).collect()),
            v => match v.as_u64() {
                Some(u) => json!(u),
                None => json!(v.as_int().unwrap_or(0) as i64),
            },
        }
    }
}

/// Everything that can be wrong with a GGUF file or a set of split parts.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufError {
    /// The prefix ended inside the header: at least `needed` bytes (from the start of the file) are required to go on.
    NeedMoreBytes { needed: u64 },
    BadMagic([u8; 4]),
    UnsupportedVersion(u32),
    /// A length or count that cannot fit in the file.
    TooLarge { what: String, count: u64, available: u64 },
    UnknownValueType { key: String, id: u32 },
    UnknownTensorType { tensor: String, id: u32 },
    InvalidUtf8 { what: String },
    Invalid(String),
    Split(String),
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufError::NeedMoreBytes { needed } => {
                write!(f, "GGUF header is longer than the bytes given: at least {needed} bytes are needed")
            }
            GgufError::BadMagic(m) => write!(f, "not a GGUF file: magic is {:?}, expected \"GGUF\"", String::from_utf8_lossy(m)),
            GgufError::UnsupportedVersion(v) => write!(f, "unsupported GGUF version {v} (lingtab reads version 3)"),
            GgufError::TooLarge { what, count, available } => {
                write!(f, "corrupt GGUF: {what} is {count}, but only {available} bytes can follow in the file")
            }
            GgufError::UnknownValueType { key, id } => write!(f, "corrupt GGUF: metadata key {key:?} has unknown value type {id}"),
            GgufError::UnknownTensorType { tensor, id } => write!(f, "tensor {tensor:?} has unknown ggml type {id}"),
            GgufError::InvalidUtf8 { what } => write!(f, "corrupt GGUF: {what} is not valid UTF-8"),
            GgufError::Invalid(msg) => write!(f, "invalid GGUF: {msg}"),
            GgufError::Split(msg) => write!(f, "split GGUF: {msg}"),
        }
    }
}

impl std::error::Error for GgufError {}

pub fn align_up(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment) * alignment
}
