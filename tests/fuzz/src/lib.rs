//! What the fuzz targets share: how a fuzz input becomes GGUF parts, a byte source that holds only a
//! fuzzed prefix of a file, and the invariants that every header, split model, config and store layout the
//! crate accepts must satisfy (a target fails on a broken invariant as it does on a panic).

use lingtab::gguf::{parse_header, GgufError, GgufWriter, Header, SplitModel, TensorSpec};
use lingtab::model::layout::{check_tensors, expected_tensors, Totals};
use lingtab::model::{Config, Tokenizer};
use lingtab::source::RangeSource;
use lingtab::store::StoreLayout;
use std::cell::Cell;

/// Little-endian fields off the front of the fuzz input; bytes past its end read as zero.
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    pub fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    pub fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// One GGUF part as a source presents it: the first bytes of the file, and the file's length as the
/// source reports it (a file's size, an HTTP Content-Range total), which may be far beyond the prefix.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub prefix: &'a [u8],
    pub file_len: u64,
}

impl<'a> Part<'a> {
    /// With `claimed` false the prefix is the whole file; otherwise the file is `claimed` bytes long (at
    /// least the prefix).
    pub fn new(prefix: &'a [u8], claimed: bool, claimed_len: u64) -> Part<'a> {
        let file_len = if claimed { claimed_len.max(prefix.len() as u64) } else { prefix.len() as u64 };
        Part { prefix, file_len }
    }
}

/// What `read_header` reads first (src/source/mod.rs `FIRST_READ`); a larger request is only allowed once
/// as many bytes have been received.
pub const FIRST_READ: u64 = 1 << 20;

/// A source holding only the prefix of a file of `total` bytes: reads past the prefix come back short
/// (as from a server that claims a length it never serves). A real source allocates what it is asked for
/// (the HTTP source reserves the whole range), so this one fails any request longer than the bytes it has
/// already handed out (or `read_header`'s first read): the header reader's memory must follow the bytes it
/// was actually given, never a length the header claims.
pub struct PrefixSource<'a> {
    prefix: &'a [u8],
    total: u64,
    served: Cell<u64>,
}

impl<'a> PrefixSource<'a> {
    pub fn new(part: Part<'a>) -> PrefixSource<'a> {
        PrefixSource { prefix: part.prefix, total: part.file_len, served: Cell::new(0) }
    }
}

impl RangeSource for PrefixSource<'_> {
    fn describe(&self) -> String {
        "fuzz input".into()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let served = self.served.get();
        assert!(
            len <= served.max(FIRST_READ),
            "read_header asked for {len} bytes at {start} after receiving only {served}: an allocation the input does not justify"
        );
        if start > self.total {
            return Err(format!("fuzz input: offset {start} is past the end ({} bytes)", self.total));
        }
        let end = start.saturating_add(len).min(self.total).min(self.prefix.len() as u64);
        let bytes = if start < end { self.prefix[start as usize..end as usize].to_vec() } else { Vec::new() };
        self.served.set(served + bytes.len() as u64);
        Ok((bytes, self.total))
    }
}

/// Two headers describe the same file (compared through Debug, so NaN metadata values compare equal).
pub fn assert_same_header(a: &Header, b: &Header) {
    assert_eq!((a.version, a.alignment, a.data_start), (b.version, b.alignment, b.data_start));
    if a.metadata != b.metadata {
        assert_eq!(format!("{:?}", a.metadata), format!("{:?}", b.metadata));
    }
    assert_eq!(a.tensors, b.tensors);
}

/// Whether the tensors of `h` end within a file of `len` bytes.
pub fn tensors_fit(h: &Header, len: u64) -> bool {
    h.data_start.checked_add(h.data_len()).is_some_and(|end| end <= len)
}

/// What every header `parse_header` accepts must satisfy; `file_len` when it was parsed with one.
pub fn check_header(h: &Header, file_len: Option<u64>) {
    assert_eq!(h.version, 3);
    assert!(h.alignment.is_power_of_two(), "alignment {}", h.alignment);
    assert_eq!(h.data_start % h.alignment, 0);
    let mut keys = std::collections::HashSet::new();
    for (k, v) in &h.metadata {
        assert!(keys.insert(k.as_str()), "key {k:?} twice");
        assert!(std::ptr::eq(h.get(k).unwrap(), v), "lookup of {k:?}");
    }
    let mut names = std::collections::HashSet::new();
    let mut spans = Vec::new();
    for t in &h.tensors {
        assert!(names.insert(t.name.as_str()), "tensor {:?} twice", t.name);
        assert!((1..=lingtab::gguf::MAX_DIMS).contains(&t.dims.len()));
        let n = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).expect("element count fits");
        assert!(n > 0 && n == t.n_elements());
        assert_eq!(t.offset % h.alignment, 0);
        assert_eq!(Some(t.n_bytes()), t.ty.bytes_for(n));
        assert!(t.row_bytes() <= t.n_bytes());
        spans.push((t.offset, t.offset.checked_add(t.n_bytes()).expect("tensor end fits")));
    }
    spans.sort();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "overlapping tensors accepted");
    if let Some(len) = file_len {
        assert!(tensors_fit(h, len), "tensors end past the {len}-byte file");
    }
}

/// Writing a header back and reading it again gives the same metadata and tensors (for a file below 2^62
/// bytes, so the writer's aligned sizes fit).
pub fn check_round_trip(h: &Header, file_len: u64) {
    {
        if file_len < 1 << 62 {
            let mut w = GgufWriter::new();
            w.metadata = h.metadata.clone();
            w.tensors = h.tensors.iter().map(|t| TensorSpec { name: t.name.clone(), ty: t.ty, dims: t.dims.clone() }).collect();
            let plan = w.plan(1).expect("a parsed header can be written").remove(0);
            let again = parse_header(&plan.header, Some(plan.len)).expect("a written header parses");
            if again.metadata != h.metadata {
                assert_eq!(format!("{:?}", again.metadata), format!("{:?}", h.metadata));
            }
            let strip = |h: &Header| h.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty)).collect::<Vec<_>>();
            assert_eq!(strip(&again), strip(h));
        }
    }
}

/// Parses each part as a source would (with its file length), or `None` when any part is refused.
pub fn parse_parts(parts: &[Part]) -> Option<Vec<(Header, u64)>> {
    parts
        .iter()
        .map(|p| match parse_header(p.prefix, Some(p.file_len)) {
            Ok(h) => {
                check_header(&h, Some(p.file_len));
                check_round_trip(&h, p.file_len);
                Some((h, p.file_len))
            }
            Err(GgufError::NeedMoreBytes { needed }) => {
                assert!(p.file_len > p.prefix.len() as u64, "NeedMoreBytes ({needed}) with the whole file given");
                assert!(needed > p.prefix.len() as u64 && needed <= p.file_len, "asks for {needed} bytes of a {}-byte file", p.file_len);
                None
            }
            Err(_) => None,
        })
        .collect()
}

/// What every split model `SplitModel::new` accepts must satisfy.
pub fn check_model(model: &SplitModel) {
    assert_eq!(model.parts.len(), model.part_lens.len());
    let total = model.part_lens.iter().try_fold(0u64, |a, &l| a.checked_add(l)).expect("parts' total length fits");
    assert_eq!(model.total_len(), total);
    for (i, h) in model.parts.iter().enumerate() {
        assert!(tensors_fit(h, model.part_lens[i]), "part {i}'s tensors end past its length");
    }
    for t in &model.tensors {
        let h = &model.parts[t.part];
        assert_eq!(t.file_offset, h.data_start + t.info.offset);
        assert!(t.file_offset + t.info.n_bytes() <= model.part_lens[t.part]);
        assert_eq!(t.abs_offset, model.part_base(t.part) + t.file_offset);
        assert!(std::ptr::eq(model.tensor(&t.info.name).unwrap(), t));
    }
    if let Some(n) = model.header().get_u64("split.tensors.count") {
        assert_eq!(n, model.tensors.len() as u64);
    }
    check_config_and_layout(model);
}

/// The config derived from the model's metadata, the tensor checks, and the store layout: none may panic,
/// and a layout must place every byte of every part exactly once.
fn check_config_and_layout(model: &SplitModel) {
    let _ = lingtab::model::summary::summary(model, false);
    let Some(c) = check_config(model.header()) else {
        assert!(StoreLayout::from_model(model).is_err(), "a store layout without a config");
        return;
    };
    let totals = Totals::of(&c, model);
    assert!(totals.dense_bytes + totals.expert_bytes + totals.mtp_bytes <= model.total_len());
    let _ = check_tensors(&c, model);

    let Ok(layout) = StoreLayout::from_model(model) else { return };
    assert_eq!(layout.part_lens, model.part_lens);
    // every byte of every part, in file order, exactly once
    let mut cursor = (0usize, 0u64);
    let mut tail = layout.data_len;
    let mut kept = Vec::new();
    for p in &layout.pieces {
        while p.part > cursor.0 {
            assert_eq!(cursor.1, layout.part_lens[cursor.0], "part {} not covered to its end", cursor.0);
            cursor = (cursor.0 + 1, 0);
        }
        assert_eq!((p.part, p.file_offset), cursor, "gap or overlap in the pieces");
        assert!(p.len > 0, "an empty piece");
        cursor.1 += p.len;
        if p.store_offset >= layout.data_len {
            assert_eq!(p.store_offset, tail, "the tail is not in file order");
            tail += p.len;
        } else {
            assert!(p.store_offset + p.len <= layout.data_len);
            kept.push((p.store_offset, p.store_offset + p.len));
        }
    }
    while cursor.0 < layout.part_lens.len() {
        assert_eq!(cursor.1, layout.part_lens[cursor.0], "part {} not covered to its end", cursor.0);
        cursor = (cursor.0 + 1, 0);
    }
    assert_eq!(tail, layout.ingest_len);
    kept.sort();
    assert!(kept.windows(2).all(|w| w[0].1 <= w[1].0), "two pieces share store bytes");
    for part in 0..layout.part_lens.len() {
        let whole = layout.pieces_in(part, 0, layout.part_lens[part]);
        let mine: Vec<_> = layout.pieces.iter().filter(|p| p.part == part).copied().collect();
        assert_eq!(whole, mine);
    }
}

/// The config of a header's metadata, when it has one, with what every accepted config must satisfy.
pub fn check_config(h: &Header) -> Option<Config> {
    let c = Config::from_header(h).ok()?;
    assert!(c.n_layer >= 1 && c.n_layer + c.nextn_predict_layers == c.block_count);
    assert_eq!((c.attention.len(), c.clamp_exp.len(), c.clamp_shexp.len()), (c.n_layer, c.n_layer, c.n_layer));
    assert!(1 <= c.n_expert_used && c.n_expert_used <= c.n_expert);
    assert!(c.n_dense_lead <= c.n_layer && c.moe_layers().count() == c.n_layer - c.n_dense_lead);
    let _ = (c.d_nope(), c.kda_dim());
    let expected = expected_tensors(&c);
    assert_eq!(expected.len(), 2 + c.attention.iter().map(|a| if *a == lingtab::model::Attention::Kda { 15 } else { 9 }).sum::<usize>() + (0..c.n_layer).map(|l| if c.is_moe_layer(l) { 8 } else { 3 }).sum::<usize>());
    Some(c)
}

/// A tokenizer the crate accepts encodes to ids inside its vocabulary and decodes without panicking.
pub fn check_tokenizer(tok: &Tokenizer, text: &str) {
    for parse_special in [false, true] {
        let ids = tok.encode(text, parse_special);
        assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()), "an id outside the vocabulary");
        let _ = tok.decode(&ids);
    }
    for id in [tok.specials().bos, tok.specials().eos, tok.specials().eot, tok.specials().eom].into_iter().flatten() {
        assert!((id as usize) < tok.vocab_size());
    }
}

/// A metadata value of GGUF type `type_id` (mod 13) made from `bits`: how an edit rewrites one value.
fn edited_value(type_id: u8, bits: u64) -> lingtab::gguf::Value {
    use lingtab::gguf::{Value, ValueType};
    match type_id % 13 {
        0 => Value::U8(bits as u8),
        1 => Value::I8(bits as i8),
        2 => Value::U16(bits as u16),
        3 => Value::I16(bits as i16),
        4 => Value::U32(bits as u32),
        5 => Value::I32(bits as i32),
        6 => Value::F32(f32::from_bits(bits as u32)),
        7 => Value::Bool(bits & 1 != 0),
        8 => Value::String(["gpt2", "bailingmoe3", "bailingmoe2", "none", "linear", "yarn", ""][(bits % 7) as usize].into()),
        9 => Value::Array(ValueType::U32, (0..bits % 64).map(|_| Value::U32((bits >> 8) as u32)).collect()),
        10 => Value::U64(bits),
        11 => Value::I64(bits as i64),
        _ => Value::F64(f64::from_bits(bits)),
    }
}

/// Structure-aware mutation: applies `edits` (index, type, bits) to a parsed header, each replacing one
/// metadata value (or, past the metadata, one tensor dimension), and writes the result back as a header, so
/// that the config, layout and tokenizer see exact values a byte-level mutation of a large header rarely
/// hits. Returns the header bytes and the file length they describe.
pub fn edit_header(h: &Header, edits: &[(u16, u8, u64)]) -> Option<(Vec<u8>, u64)> {
    let mut w = GgufWriter::new();
    w.metadata = h.metadata.clone();
    w.tensors = h.tensors.iter().map(|t| TensorSpec { name: t.name.clone(), ty: t.ty, dims: t.dims.clone() }).collect();
    let slots = w.metadata.len() + w.tensors.len();
    for &(index, type_id, bits) in edits {
        if slots == 0 {
            break;
        }
        let i = index as usize % slots;
        if i < w.metadata.len() {
            w.metadata[i].1 = edited_value(type_id, bits);
        } else {
            let t = &mut w.tensors[i - w.metadata.len()];
            let d = type_id as usize % t.dims.len();
            let old = t.dims[d];
            t.dims[d] = bits % (1 << 20);
            // the writer expects whole blocks and sizes that fit; keep the edit only when they do
            let n = t.dims.iter().try_fold(1u64, |a, &x| a.checked_mul(x)).filter(|&n| n > 0 && n < 1 << 40);
            if n.and_then(|n| t.ty.bytes_for(n)).is_none() || t.dims[0] % t.ty.block_elems() as u64 != 0 {
                t.dims[d] = old;
            }
        }
    }
    if !matches!(w.metadata.iter().find(|(k, _)| k == "general.alignment"), None | Some((_, lingtab::gguf::Value::U32(1..)))) {
        return None; // the writer pads with it: only a power-of-two u32 makes a file (the reader checks the rest)
    }
    let plan = w.plan(1).ok()?.remove(0);
    Some((plan.header, plan.len))
}
