//! The GGUF reader, split handling and writer: the fixture read back against gguf-py's table (tensors.tsv),
//! writer round trips, and every kind of bad input giving a clear error (never a panic or a huge allocation).
#![cfg(not(target_arch = "wasm32"))]

use lingtab::gguf::{parse_header, GgufError, GgufWriter, SplitModel, Value, ValueType};
use lingtab::model::Config;
use lingtab::quant::GgmlType;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-ling").join(name)
}

fn read_parts() -> Vec<Vec<u8>> {
    ["tiny-ling-00001-of-00002.gguf", "tiny-ling-00002-of-00002.gguf"].iter().map(|n| std::fs::read(fixture(n)).unwrap()).collect()
}

fn open(parts: &[Vec<u8>]) -> Result<SplitModel, GgufError> {
    let headers = parts.iter().map(|p| parse_header(p, Some(p.len() as u64)).map(|h| (h, p.len() as u64))).collect::<Result<Vec<_>, _>>()?;
    SplitModel::new(headers)
}

#[test]
fn fixture_matches_gguf_py_tensor_table() {
    let model = open(&read_parts()).unwrap();
    // tensors.tsv was written by gguf-py when the fixture was made: name, type, dims, part, offset, bytes
    let tsv = std::fs::read_to_string(fixture("tensors.tsv")).unwrap();
    let rows: Vec<Vec<&str>> = tsv.lines().skip(1).map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), model.tensors.len());
    for (row, t) in rows.iter().zip(&model.tensors) {
        assert_eq!(row[0], t.info.name);
        assert_eq!(row[1], t.info.ty.name());
        let dims: Vec<u64> = row[2].trim_matches(['[', ']']).split(", ").map(|d| d.parse().unwrap()).collect();
        assert_eq!(dims, t.info.dims, "{}", t.info.name);
        assert_eq!(row[3].parse::<usize>().unwrap(), t.part + 1, "{}", t.info.name);
        assert_eq!(row[4].parse::<u64>().unwrap(), t.file_offset, "{}", t.info.name);
        assert_eq!(row[5].parse::<u64>().unwrap(), t.info.n_bytes(), "{}", t.info.name);
    }
    let config = Config::from_header(model.header()).unwrap();
    assert_eq!((config.n_layer, config.hidden, config.n_expert, config.vocab_size), (7, 256, 32, 3584));
    assert_eq!(config.clamp_shexp, vec![0.0, 0.0, 0.0, 0.0, 1.75, 1.75, 2.5]);
}

#[test]
fn prefix_too_short_says_how_many_bytes_are_needed() {
    let parts = read_parts();
    let full = parse_header(&parts[0], None).unwrap();
    let mut prefix_len = 64usize;
    let mut rounds = 0;
    loop {
        match parse_header(&parts[0][..prefix_len], None) {
            Ok(h) => {
                assert_eq!(h, full);
                break;
            }
            Err(GgufError::NeedMoreBytes { needed }) => {
                assert!(needed as usize > prefix_len, "needed {needed} must exceed the {prefix_len} bytes given");
                // follow the reader's request exactly for a while, then grow faster (as an HTTP caller would)
                prefix_len = if rounds < 200 { needed as usize } else { (needed as usize).max(prefix_len * 2) };
                rounds += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(rounds > 10, "the header grows field by field ({rounds} rounds)");
}

fn writer_with_every_value_type() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("test".into()));
    w.set("u8", Value::U8(200));
    w.set("i8", Value::I8(-100));
    w.set("u16", Value::U16(60000));
    w.set("i16", Value::I16(-30000));
    w.set("u32", Value::U32(4_000_000_000));
    w.set("i32", Value::I32(-2_000_000_000));
    w.set("f32", Value::F32(1.5e-6));
    w.set("bool", Value::Bool(true));
    w.set("string", Value::String("héllo ✓".into()));
    w.set("u64", Value::U64(u64::MAX));
    w.set("i64", Value::I64(i64::MIN));
    w.set("f64", Value::F64(-2.25));
    w.set("empty", Value::Array(ValueType::U32, vec![]));
    w.set(
        "nested",
        Value::Array(ValueType::Array, vec![
            Value::Array(ValueType::String, vec![Value::String("a".into()), Value::String("bc".into())]),
            Value::Array(ValueType::I16, vec![Value::I16(-1)]),
        ]),
    );
    w.add_tensor("a", GgmlType::F32, &[3, 2]).unwrap();
    w.add_tensor("b", GgmlType::Q4_K, &[256, 2]).unwrap();
    w.add_tensor("c", GgmlType::Q5_0, &[128, 3, 2]).unwrap();
    w.add_tensor("d", GgmlType::F16, &[7]).unwrap();
    w
}

fn data_for(w: &GgufWriter, i: usize) -> Vec<u8> {
    (0..w.tensors[i].n_bytes()).map(|b| (b as usize * 7 + i) as u8).collect()
}

#[test]
fn writer_round_trips_single_and_split() {
    let w = writer_with_every_value_type();
    for n_parts in [1, 2, 3, 4] {
        let parts = w.to_parts(n_parts, |i| data_for(&w, i)).unwrap();
        assert_eq!(parts.len(), n_parts);
        let model = open(&parts).unwrap();
        let h = model.header();
        for (k, v) in &w.metadata {
            assert_eq!(h.get(k), Some(v), "key {k} with {n_parts} parts");
        }
        if n_parts > 1 {
            assert_eq!(h.get("split.count"), Some(&Value::U16(n_parts as u16)));
            // later parts carry only the split keys, like gguf-split
            assert_eq!(model.parts[1].metadata.len(), 3);
        }
        assert_eq!(model.tensors.len(), 4);
        for (i, spec) in w.tensors.iter().enumerate() {
            let t = model.tensor(&spec.name).unwrap();
            assert_eq!((&t.info.dims, t.info.ty), (&spec.dims, spec.ty));
            let bytes = &parts[t.part][t.file_offset as usize..(t.file_offset + t.info.n_bytes()) as usize];
            assert_eq!(bytes, data_for(&w, i).as_slice(), "tensor {} data", spec.name);
            // the virtual file is the parts concatenated
            let concat: Vec<u8> = parts.concat();
            assert_eq!(&concat[t.abs_offset as usize..(t.abs_offset + t.info.n_bytes()) as usize], bytes);
        }
    }
}

fn err_of(bytes: &[u8]) -> String {
    parse_header(bytes, Some(bytes.len() as u64)).unwrap_err().to_string()
}

/// A minimal header with one metadata key, built by hand so single fields can be corrupted.
fn header_bytes(version: u32, n_tensors: u64, n_kv: u64, kv: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b.extend_from_slice(kv);
    b
}

fn kv_string(key: &str, declared_len: u64, value: &str) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&declared_len.to_le_bytes());
    b.extend_from_slice(value.as_bytes());
    b
}

#[test]
fn bad_headers_give_clear_errors() {
    let wrong_lengths = writer_with_every_value_type().to_parts(1, |_| vec![]);
    assert!(wrong_lengths.is_err(), "tensor data of the wrong length is refused by the writer");

    assert!(err_of(b"GGML\x03\0\0\0").contains("not a GGUF file"));
    assert!(err_of(&header_bytes(2, 0, 0, &[])).contains("unsupported GGUF version 2"));
    assert!(err_of(&header_bytes(99, 0, 0, &[])).contains("version 99"));
    // counts far beyond the file: refused before anything is allocated
    assert!(err_of(&header_bytes(3, 0, u64::MAX / 2, &[])).contains("metadata count"));
    assert!(err_of(&header_bytes(3, 1 << 40, 0, &[])).contains("tensor count"));
    assert!(err_of(&header_bytes(3, 0, 1, &kv_string("k", 1 << 50, "x"))).contains("length"));
    // unknown value type
    let mut kv = kv_string("k", 1, "x");
    kv[8 + 1..8 + 1 + 4].copy_from_slice(&77u32.to_le_bytes());
    assert!(err_of(&header_bytes(3, 0, 1, &kv)).contains("unknown value type 77"));
    // array length larger than the file
    let mut arr = 1u64.to_le_bytes().to_vec();
    arr.extend_from_slice(b"a");
    arr.extend_from_slice(&9u32.to_le_bytes());
    arr.extend_from_slice(&4u32.to_le_bytes());
    arr.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(err_of(&header_bytes(3, 0, 1, &arr)).contains("array length"));
    // invalid UTF-8 in a key
    let mut bad_key = kv_string("k", 1, "x");
    bad_key[8] = 0xFF;
    assert!(err_of(&header_bytes(3, 0, 1, &bad_key)).contains("UTF-8"));
    // a truncated header without a known file length asks for more
    let truncated = &header_bytes(3, 0, 1, &kv_string("key", 5, "value"))[..30];
    assert!(matches!(parse_header(truncated, None), Err(GgufError::NeedMoreBytes { .. })));
    // …and with a known length it is a clear truncation error
    assert!(parse_header(truncated, Some(30)).unwrap_err().to_string().contains("only"));
}

#[test]
fn unknown_tensor_type_and_truncated_data_are_refused() {
    let w = writer_with_every_value_type();
    let mut file = w.to_parts(1, |i| data_for(&w, i)).unwrap().remove(0);
    let h = parse_header(&file, Some(file.len() as u64)).unwrap();
    // truncate the tensor data: the header is fine but the tensors no longer fit
    let short = &file[..(h.data_start + h.data_len() - 1) as usize];
    assert!(parse_header(short, Some(short.len() as u64)).unwrap_err().to_string().contains("end of tensor data"));
    // patch tensor "a"'s type id (the u32 before its offset) to an unknown ggml type
    let name_pos = file.windows(9).rposition(|w| w == b"\x01\0\0\0\0\0\0\0a").unwrap() + 9;
    let type_pos = name_pos + 4 + 2 * 8;
    file[type_pos..type_pos + 4].copy_from_slice(&1234u32.to_le_bytes());
    assert!(err_of(&file).contains("unknown ggml type 1234"));
    assert_eq!(h.tensors.len(), 4);
}

#[test]
fn split_parts_missing_extra_or_out_of_order_are_refused() {
    let parts = read_parts();
    let err = |p: Vec<Vec<u8>>| open(&p).unwrap_err().to_string();
    assert!(err(vec![parts[0].clone()]).contains("part 2 is missing"));
    assert!(err(vec![parts[0].clone(), parts[1].clone(), parts[1].clone()]).contains("extra"));
    assert!(err(vec![parts[1].clone(), parts[0].clone()]).contains("out of order"));
    // found by the gguf_metadata fuzz target: split.no u64::MAX overflowed as the message counted it from 1
    let mut first = parse_header(&parts[0], None).unwrap();
    first.metadata.iter_mut().find(|(k, _)| k == "split.no").expect("part 1 has split.no").1 = Value::U64(u64::MAX);
    let second = parse_header(&parts[1], None).unwrap();
    let e = SplitModel::new(vec![(first, parts[0].len() as u64), (second, parts[1].len() as u64)]).unwrap_err().to_string();
    assert!(e.contains("file number 1 has split.no 18446744073709551615 (it is part 18446744073709551615 of 2)"), "{e}");
    // a part cut short on disk
    let short = parts[1][..parts[1].len() - 1000].to_vec();
    let h = parse_header(&short, None).unwrap();
    let e = SplitModel::new(vec![(parse_header(&parts[0], None).unwrap(), parts[0].len() as u64), (h, short.len() as u64)]).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    // a part of another model (different split.count)
    let w = writer_with_every_value_type();
    let other = w.to_parts(3, |i| data_for(&w, i)).unwrap();
    assert!(err(vec![parts[0].clone(), other[1].clone()]).contains("different models"));
}

#[test]
fn config_refuses_variants_it_does_not_implement() {
    let parts = read_parts();
    let base = parse_header(&parts[0], None).unwrap();
    let with = |key: &str, value: Option<Value>| {
        let mut metadata = base.metadata.clone();
        metadata.retain(|(k, _)| k != key);
        if let Some(v) = value {
            metadata.push((key.to_string(), v));
        }
        let mut w = GgufWriter::new();
        w.metadata = metadata;
        let bytes = w.to_parts(1, |_| vec![]).unwrap().remove(0);
        Config::from_header(&parse_header(&bytes, None).unwrap()).map_err(|e| e.to_string())
    };
    assert!(with("bailingmoe3.attention.q_lora_rank", Some(Value::U32(1536))).unwrap_err().contains("q LoRA"));
    assert!(with("bailingmoe3.rope.dimension_sections", Some(Value::Array(ValueType::I32, vec![Value::I32(16)]))).unwrap_err().contains("M-RoPE"));
    assert!(with("bailingmoe3.expert_gating_func", Some(Value::U32(1))).unwrap_err().contains("sigmoid"));
    assert!(with("bailingmoe3.rope.scaling.type", Some(Value::String("yarn".into()))).unwrap_err().contains("RoPE scaling"));
    assert!(with("general.architecture", Some(Value::String("llama".into()))).unwrap_err().contains("\"llama\" model"));
    assert!(with("bailingmoe3.expert_count", None).unwrap_err().contains("missing metadata key bailingmoe3.expert_count"));
    // scalar clamp keys mean "every layer"; a missing shared-FFN length falls back to expert ff × shared count
    let c = with("bailingmoe3.swiglu_clamp_exp", Some(Value::F32(4.0))).unwrap();
    assert_eq!(c.clamp_exp, vec![4.0; 7]);
    let c = with("bailingmoe3.expert_shared_feed_forward_length", None).unwrap();
    assert_eq!(c.ff_shared, 256);
}

/// A file that claims `total` bytes but holds only `bytes` (reads past them come back empty), recording the
/// longest request: real sources allocate what they are asked for (the HTTP source reserves the whole range).
struct ClaimedSource {
    bytes: Vec<u8>,
    total: u64,
    longest_request: std::cell::Cell<u64>,
}

impl lingtab::source::RangeSource for ClaimedSource {
    fn describe(&self) -> String {
        "claimed.gguf".into()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        self.longest_request.set(self.longest_request.get().max(len));
        let (start, end) = (start.min(self.bytes.len() as u64) as usize, start.saturating_add(len).min(self.bytes.len() as u64) as usize);
        Ok((self.bytes[start..end].to_vec(), self.total))
    }
}

fn read_claimed(bytes: Vec<u8>, total: u64) -> (String, u64) {
    let source = ClaimedSource { bytes, total, longest_request: Default::default() };
    let err = pollster::block_on(lingtab::source::read_header(&source)).unwrap_err();
    (err, source.longest_request.get())
}

/// Found by the gguf_header fuzz target: a string length in the header made `read_header` ask the source for
/// that many bytes at once (1.2 MB after 2.6 kB received there; a hostile server claiming a large file could
/// have it reserve gigabytes). Requests now only double what was received, and a header claiming more than
/// 256 MiB is refused outright.
#[test]
fn read_header_requests_follow_the_bytes_received_not_the_lengths_claimed() {
    let header = header_bytes(3, 0, 1, &kv_string("general.name", 100 << 20, "x"));
    let (err, longest) = read_claimed(header, 1 << 40);
    assert!(longest <= 1 << 20, "asked for {longest} bytes at once");
    assert!(err.contains("claimed.gguf") && err.contains("returned no bytes"), "{err}");

    let header = header_bytes(3, 0, 1, &kv_string("general.name", 1 << 31, "x"));
    let (err, longest) = read_claimed(header, 1 << 40);
    assert!(longest <= 1 << 20, "asked for {longest} bytes");
    assert!(err.contains("corrupt GGUF: the header claims to be longer than 256 MiB"), "{err}");

    // found by the gguf_header fuzz target: the padding up to the tensor data was read in one request, and an
    // alignment may be 2^31; now it is read like the header (doubling) and refused past the header limit
    let kv_alignment = |a: u32| {
        let mut b = (17u64).to_le_bytes().to_vec();
        b.extend_from_slice(b"general.alignment");
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&a.to_le_bytes());
        b
    };
    let (err, longest) = read_claimed(header_bytes(3, 0, 1, &kv_alignment(1 << 30)), 1 << 40);
    assert!(longest <= 1 << 20, "asked for {longest} bytes");
    assert!(err.contains("corrupt GGUF: the header claims to be longer than 256 MiB") && err.contains("1073741824"), "{err}");
    let (err, longest) = read_claimed(header_bytes(3, 0, 1, &kv_alignment(1 << 26)), 1 << 40);
    assert!(longest <= 1 << 20, "asked for {longest} bytes");
    assert!(err.contains("the source returned 0 of"), "{err}");

    // a real header still reads in full through short reads
    let parts = read_parts();
    let head_len = parse_header(&parts[0], None).unwrap().data_start as usize;
    let source = ClaimedSource { bytes: parts[0].clone(), total: parts[0].len() as u64, longest_request: Default::default() };
    let (h, total) = pollster::block_on(lingtab::source::read_header(&source)).unwrap();
    assert_eq!((h.data_start as usize, total), (head_len, parts[0].len() as u64));
}

/// The fixture's first part with metadata keys replaced (`None` removes the key), written back and read.
fn fixture_config_with(edits: &[(&str, Option<Value>)]) -> Result<Config, String> {
    let parts = read_parts();
    let mut metadata = parse_header(&parts[0], None).unwrap().metadata;
    for (key, value) in edits {
        metadata.retain(|(k, _)| k != key);
        if let Some(v) = value {
            metadata.push((key.to_string(), v.clone()));
        }
    }
    let mut w = GgufWriter::new();
    w.metadata = metadata;
    let bytes = w.to_parts(1, |_| vec![]).unwrap().remove(0);
    Config::from_header(&parse_header(&bytes, None).unwrap()).map_err(|e| e.to_string())
}

/// The first found by the gguf_metadata fuzz target, the rest by reading Config::from_header while writing
/// the targets (the overflows and the allocation then confirmed as crashes of a target): sizes whose
/// products overflowed (a panic with overflow checks, a wrapped, plausible-looking value without), a block
/// count that sized vectors before anything else was checked (2^40 blocks: a 4 TiB allocation), and counts
/// beyond what the MoE routing kernel takes (they reached an assert in gpu::moe, far from the file).
#[test]
fn config_refuses_sizes_that_overflow_or_that_the_engine_cannot_hold() {
    let key = |k: &str| format!("bailingmoe3.{k}");
    let err = |edits: &[(&str, Option<Value>)]| fixture_config_with(edits).unwrap_err();
    let one = |k: &str, v: Value| err(&[(&key(k), Some(v))]);
    assert!(fixture_config_with(&[]).is_ok());

    // expert_group_used_count × experts per group overflowed before the group count bound was looked at
    let e = one("expert_group_used_count", Value::U64(u64::MAX));
    assert!(e.contains("expert_group_used_count 18446744073709551615 must be in 1..="), "{e}");
    // heads × KDA head dim (the KDA width)
    let e = one("kda.head_dim", Value::U64(u64::MAX));
    assert!(e.contains("heads of widths 18446744073709551615") && e.contains("overflow"), "{e}");
    // the shared FFN's default width: expert ff × shared count
    let (ff, shared) = (key("expert_feed_forward_length"), key("expert_shared_count"));
    let e = err(&[(&ff, Some(Value::U64(1 << 63))), (&shared, Some(Value::U32(3))), (&key("expert_shared_feed_forward_length"), None)]);
    assert!(e.contains("expert_feed_forward_length 9223372036854775808 × expert_shared_count 3 overflows"), "{e}");
    // 2^40 blocks with a scalar head_count_kv: refused before vec![_; block_count]
    let e = err(&[(&key("block_count"), Some(Value::U64(1 << 40))), (&key("attention.head_count_kv"), Some(Value::U32(1)))]);
    assert!(e.contains("block_count is 1099511627776; at most 512 blocks"), "{e}");
    // beyond the routing kernel's workgroup arrays
    let e = one("expert_count", Value::U32(1024));
    assert!(e.contains("expert_count 1024 must be in 1..=512"), "{e}");
    let e = one("expert_used_count", Value::U32(33));
    assert!(e.contains("expert_used_count 33 must be in 1..=32"), "{e}");
    let e = one("vocab_size", Value::U64(1 << 32));
    assert!(e.contains("vocab size 4294967296 does not fit 32-bit token ids"), "{e}");
}

/// Found by reading SplitModel::new while writing the gguf_split target, then confirmed as its crash: part
/// lengths as a source reports them (a server's Content-Range total) added up past u64 (an overflow panic,
/// or wrapped offsets without overflow checks). Such parts are refused, as is a tensor whose end in the file
/// overflows (a header parsed with a claimed length of u64::MAX).
#[test]
fn lengths_beyond_what_a_model_can_be_are_refused() {
    let parts = read_parts();
    let claimed = |p: &Vec<u8>, len: u64| (parse_header(p, Some(len)).unwrap(), len);
    let e = SplitModel::new(vec![claimed(&parts[0], 1 << 63), claimed(&parts[1], 1 << 63)]).unwrap_err().to_string();
    assert!(e.contains("more than 2^60 bytes in all cannot be a model"), "{e}");
    let e = SplitModel::new(vec![claimed(&parts[0], u64::MAX), claimed(&parts[1], u64::MAX)]).unwrap_err().to_string();
    assert!(e.contains("[18446744073709551615, 18446744073709551615] bytes long"), "{e}");

    // one tensor ending 32 bytes before 2^64: its end in the file (data section start + end) overflows
    let mut tensor = 1u64.to_le_bytes().to_vec();
    tensor.extend_from_slice(b"t");
    tensor.extend_from_slice(&1u32.to_le_bytes());
    tensor.extend_from_slice(&8u64.to_le_bytes());
    tensor.extend_from_slice(&0u32.to_le_bytes()); // F32
    tensor.extend_from_slice(&0xFFFF_FFFF_FFFF_FFC0u64.to_le_bytes());
    let bytes = header_bytes(3, 1, 0, &tensor);
    let e = parse_header(&bytes, Some(u64::MAX)).unwrap_err().to_string();
    assert!(e.contains("end of tensor data is 18446744073709551615"), "{e}");
}
