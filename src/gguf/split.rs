//! Split GGUF (llama.cpp's gguf-split): several parts read as one virtual file — part 1's bytes, then
//! part 2's, … — in which every tensor has an absolute offset.

use super::{GgufError, Header, TensorInfo};
use std::collections::HashMap;

pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS: &str = "split.tensors.count";
/// The most bytes a model's parts may add up to (1 EiB, far beyond any model): offsets in the virtual file
/// and in the store (headers, aligned records, the tail) then stay far from overflowing a u64.
pub const MAX_MODEL_BYTES: u64 = 1 << 60;

/// A tensor of a split model and where its bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitTensor {
    pub info: TensorInfo,
    /// Index of the part (0-based) holding the tensor.
    pub part: usize,
    /// Offset of the tensor's first byte within its part file.
    pub file_offset: u64,
    /// Offset in the virtual file (all parts concatenated in order).
    pub abs_offset: u64,
}

/// All parts of a model, validated against each other.
#[derive(Clone, Debug)]
pub struct SplitModel {
    /// Each part's header; metadata of the model is part 0's.
    pub parts: Vec<Header>,
    pub part_lens: Vec<u64>,
    pub tensors: Vec<SplitTensor>,
    by_name: HashMap<String, usize>,
}

impl SplitModel {
    /// Validates `split.no`, `split.count`, `split.tensors.count`, the order of the parts and that each part's
    /// tensors fit inside it. A file without split keys is a one-part model.
    pub fn new(parts: Vec<(Header, u64)>) -> Result<SplitModel, GgufError> {
        let first = &parts.first().ok_or_else(|| GgufError::Split("no parts given".into()))?.0;
        let split_key = |h: &Header, key: &str| -> Result<Option<u64>, GgufError> {
            match h.get(key) {
                None => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| GgufError::Split(format!("{key} is not a non-negative integer: {v:?}"))),
            }
        };
        let count = split_key(first, KEY_SPLIT_COUNT)?.unwrap_or(1);
        if count == 0 {
            return Err(GgufError::Split("split.count is 0".into()));
        }
        if (parts.len() as u64) != count {
            return Err(GgufError::Split(if (parts.len() as u64) < count {
                format!("the model has {count} parts (split.count) but {} were given: part {} is missing", parts.len(), parts.len() + 1)
            } else {
                format!("the model has {count} parts (split.count) but {} were given: extra parts", parts.len())
            }));
        }
        let expected_tensors = match split_key(first, KEY_SPLIT_TENSORS)? {
            Some(n) => n,
            None if count == 1 => first.tensors.len() as u64,
            None => return Err(GgufError::Split("part 1 has no split.tensors.count".into())),
        };
        for (i, (h, _)) in parts.iter().enumerate() {
            let no = split_key(h, KEY_SPLIT_NO)?.unwrap_or(0);
            if no != i as u64 {
                return Err(GgufError::Split(format!(
                    "parts are out of order: file number {} has split.no {no} (it is part {} of {count})",
                    i + 1,
                    no.saturating_add(1)
                )));
            }
            let c = split_key(h, KEY_SPLIT_COUNT)?.unwrap_or(1);
            if c != count {
                return Err(GgufError::Split(format!("part {} says split.count {c}, part 1 says {count}: parts of different models", i + 1)));
            }
        }
        let total = parts.iter().try_fold(0u64, |sum, (_, len)| sum.checked_add(*len)).filter(|&t| t <= MAX_MODEL_BYTES);
        if total.is_none() {
            let lens: Vec<u64> = parts.iter().map(|p| p.1).collect();
            return Err(GgufError::Split(format!("the parts are {lens:?} bytes long: more than 2^60 bytes in all cannot be a model")));
        }
        let mut tensors = Vec::new();
        let mut by_name = HashMap::new();
        let mut base = 0u64;
        for (part, (h, len)) in parts.iter().enumerate() {
            // (a header read without its file's length may claim tensors up to the end of u64)
            let end = h.data_start.checked_add(h.data_len()).unwrap_or(u64::MAX);
            if end > *len {
                return Err(GgufError::Split(format!("part {} is {len} bytes but its tensors end at byte {end}: truncated file", part + 1)));
            }
            for t in &h.tensors {
                let file_offset = h.data_start + t.offset;
                if by_name.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::Split(format!("tensor {:?} appears in more than one part", t.name)));
                }
                tensors.push(SplitTensor { info: t.clone(), part, file_offset, abs_offset: base + file_offset });
            }
            base += len;
        }
        if tensors.len() as u64 != expected_tensors {
            return Err(GgufError::Split(format!(
                "split.tensors.count is {expected_tensors} but the parts hold {} tensors",
                tensors.len()
            )));
        }
        let (parts, part_lens) = parts.into_iter().unzip();
        Ok(SplitModel { parts, part_lens, tensors, by_name })
    }

    /// The model's metadata (part 1's header).
    pub fn header(&self) -> &Header {
        &self.parts[0]
    }
    pub fn tensor(&self, name: &str) -> Option<&SplitTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
    pub fn total_len(&self) -> u64 {
        self.part_lens.iter().sum()
    }
    /// Offset of part `i`'s first byte in the virtual file.
    pub fn part_base(&self, i: usize) -> u64 {
        self.part_lens[..i].iter().sum()
    }
}

/// The names of every part from the first part's name, the way llama.cpp finds them:
/// `name-00001-of-00003.gguf` → `[name-00001-of-00003.gguf, name-00002-of-00003.gguf, name-00003-of-00003.gguf]`.
/// A name without that pattern is a one-part model. Works on paths and URLs (only the end is rewritten).
pub fn split_part_names(first: &str) -> Result<Vec<String>, GgufError> {
    let (query_start, query) = match first.find(['?', '#']) {
        Some(q) => (q, &first[q..]),
        None => (first.len(), ""),
    };
    let path = &first[..query_start];
    let Some(stem) = path.strip_suffix(".gguf") else { return Ok(vec![first.to_string()]) };
    // stem ends with "-NNNNN-of-MMMMM", N and M ASCII digits (compared as bytes: the name may be any text,
    // and u32's parser would also take "+0001")
    let b = stem.as_bytes();
    let n = b.len();
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    if n < 15 || b[n - 15] != b'-' || &b[n - 9..n - 5] != b"-of-" || !digits(&b[n - 14..n - 9]) || !digits(&b[n - 5..]) {
        return Ok(vec![first.to_string()]);
    }
    let (no, count): (u32, u32) = (stem[n - 14..n - 9].parse().expect("five digits"), stem[n - 5..].parse().expect("five digits"));
    if no != 1 {
        return Err(GgufError::Split(format!("{first:?} is part {no} of {count}; give the first part (-00001-of-{count:05})")));
    }
    if count == 0 {
        return Err(GgufError::Split(format!("{first:?}: a split of 0 parts")));
    }
    let prefix = &stem[..stem.len() - 15];
    Ok((1..=count).map(|i| format!("{prefix}-{i:05}-of-{count:05}.gguf{query}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn part_names_follow_llama_cpp_pattern() {
        let names = split_part_names("dir/Ling-3.0-flash-Q4_K_M-00001-of-00002.gguf").unwrap();
        assert_eq!(names, ["dir/Ling-3.0-flash-Q4_K_M-00001-of-00002.gguf", "dir/Ling-3.0-flash-Q4_K_M-00002-of-00002.gguf"]);
        let urls = split_part_names("http://h/r/resolve/abc/m-00001-of-00003.gguf?download=true").unwrap();
        assert_eq!(urls[2], "http://h/r/resolve/abc/m-00003-of-00003.gguf?download=true");
        assert_eq!(split_part_names("model.gguf").unwrap(), ["model.gguf"]);
        assert!(split_part_names("m-00002-of-00002.gguf").unwrap_err().to_string().contains("part 2 of 2"));
        // found while writing the gguf_split fuzz target (its check that the first name comes back as given),
        // each confirmed as its crash: a sign was taken for a digit, so the first name came back as another
        // file's; and a non-ASCII name panicked (slicing inside a character)
        assert_eq!(split_part_names("m-+0001-of-00002.gguf").unwrap(), ["m-+0001-of-00002.gguf"]);
        assert_eq!(split_part_names("m-00001-of-+0002.gguf").unwrap(), ["m-00001-of-+0002.gguf"]);
        assert_eq!(split_part_names("é-00001-ofé00002.gguf").unwrap(), ["é-00001-ofé00002.gguf"]);
        assert_eq!(split_part_names("éééééééé.gguf").unwrap(), ["éééééééé.gguf"]);
        assert_eq!(split_part_names("模型文件名称.gguf").unwrap(), ["模型文件名称.gguf"]); // panicked: not a char boundary
    }
}
