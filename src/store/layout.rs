//! Where every byte of every part goes in the store's data file, from the headers alone.
//!
//! Data file: each part's header bytes, then the dense tensors (global and trunk, in GGUF order), then the
//! expert records (layer by layer, expert by expert: gate rows | up rows | down rows; one record size per
//! layer). Store offsets from `data_len` on number the tail: every other byte of the parts (MTP block,
//! alignment padding), kept in its own file only while ingesting so every downloaded byte can be hashed in
//! file order from the store; it is removed when the store is complete.

use super::StoreFile;
use crate::gguf::SplitModel;
use crate::model::layout::{role, Role, EXPERT_TENSORS};
use crate::model::Config;
use crate::source::RangeSource;
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Records and tensors start at multiples of this in the data file.
pub const ALIGN: u64 = 256;

/// A run of a part's bytes and where it lies in the data file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub part: usize,
    pub file_offset: u64,
    pub len: u64,
    pub store_offset: u64,
}

/// The records of one MoE layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertRecords {
    pub layer: usize,
    /// Offset of expert 0's record; expert e's is at `offset + e * stride`.
    pub offset: u64,
    /// Bytes of one record (gate + up + down rows).
    pub record_bytes: u64,
    /// Distance between records (`record_bytes` rounded up to [`ALIGN`]).
    pub stride: u64,
    /// Offsets of the gate, up and down rows inside a record.
    pub gate: u64,
    pub up: u64,
    pub down: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseTensor {
    pub name: String,
    pub offset: u64,
    pub len: u64,
}

#[derive(Clone, Debug)]
pub struct StoreLayout {
    pub part_lens: Vec<u64>,
    pub header_offsets: Vec<u64>,
    pub header_lens: Vec<u64>,
    pub dense: Vec<DenseTensor>,
    pub experts: Vec<ExpertRecords>,
    /// Length of the data file when complete (headers, dense tensors and records).
    pub data_len: u64,
    /// `data_len` plus the tail's length (the bytes the store does not keep; the tail file while ingesting).
    pub ingest_len: u64,
    /// Every byte of every part, sorted by (part, file_offset), covering each part exactly.
    pub pieces: Vec<Piece>,
    /// Trunk layers of the model (MoE or dense), the length of [`super::StoreChecks::experts`].
    pub n_layer: usize,
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

impl StoreLayout {
    pub fn from_model(model: &SplitModel) -> Result<StoreLayout, String> {
        let config = Config::from_header(model.header()).map_err(|e| e.to_string())?;
        let n_expert = config.n_expert as u64;
        let mut pieces = Vec::new();
        let mut at = 0u64;
        let (mut header_offsets, mut header_lens) = (Vec::new(), Vec::new());
        for (i, h) in model.parts.iter().enumerate() {
            header_offsets.push(at);
            header_lens.push(h.data_start);
            pieces.push(Piece { part: i, file_offset: 0, len: h.data_start, store_offset: at });
            at = align(at + h.data_start);
        }
        let mut dense = Vec::new();
        for t in &model.tensors {
            if matches!(role(&config, &t.info.name), Role::Global | Role::Dense { .. }) {
                let len = t.info.n_bytes();
                dense.push(DenseTensor { name: t.info.name.clone(), offset: at, len });
                pieces.push(Piece { part: t.part, file_offset: t.file_offset, len, store_offset: at });
                at = align(at + len);
            }
        }
        let mut experts = Vec::new();
        for layer in 0..config.n_layer {
            let names = EXPERT_TENSORS.map(|s| format!("blk.{layer}.{s}"));
            let ts: Vec<_> = names.iter().map(|n| model.tensor(n)).collect();
            if ts.iter().all(|t| t.is_none()) {
                continue;
            }
            let ts: Vec<_> = ts.into_iter().zip(&names).map(|(t, n)| t.ok_or_else(|| format!("layer {layer}: {n} is missing"))).collect::<Result<_, _>>()?;
            let mut sub = [0u64; 3];
            let mut record_bytes = 0;
            for (k, t) in ts.iter().enumerate() {
                let n = t.info.n_bytes();
                if n % n_expert != 0 {
                    return Err(format!("{}: {n} bytes do not split into {n_expert} experts", t.info.name));
                }
                sub[k] = record_bytes;
                record_bytes += n / n_expert;
            }
            let stride = align(record_bytes);
            let offset = at;
            for (k, t) in ts.iter().enumerate() {
                let per = t.info.n_bytes() / n_expert;
                for e in 0..n_expert {
                    pieces.push(Piece { part: t.part, file_offset: t.file_offset + e * per, len: per, store_offset: offset + e * stride + sub[k] });
                }
            }
            experts.push(ExpertRecords { layer, offset, record_bytes, stride, gate: sub[0], up: sub[1], down: sub[2] });
            at = offset + n_expert * stride;
        }
        let data_len = at;
        // the tail: every byte not placed yet (MTP tensors, padding), in file order
        pieces.sort_by_key(|p| (p.part, p.file_offset));
        let mut full = Vec::with_capacity(pieces.len() * 2);
        let mut cursor = (0usize, 0u64);
        let mut tail = data_len;
        let fill = |part: usize, from: u64, to: u64, full: &mut Vec<Piece>, tail: &mut u64| {
            if to > from {
                full.push(Piece { part, file_offset: from, len: to - from, store_offset: *tail });
                *tail += to - from;
            }
        };
        for p in pieces {
            while cursor.0 < p.part {
                fill(cursor.0, cursor.1, model.part_lens[cursor.0], &mut full, &mut tail);
                cursor = (cursor.0 + 1, 0);
            }
            if p.file_offset < cursor.1 {
                return Err(format!("part {}: bytes at {} belong to two tensors", p.part + 1, p.file_offset));
            }
            fill(p.part, cursor.1, p.file_offset, &mut full, &mut tail);
            full.push(p);
            cursor.1 = p.file_offset + p.len;
        }
        while cursor.0 < model.parts.len() {
            fill(cursor.0, cursor.1, model.part_lens[cursor.0], &mut full, &mut tail);
            cursor = (cursor.0 + 1, 0);
        }
        Ok(StoreLayout { part_lens: model.part_lens.clone(), header_offsets, header_lens, dense, experts, data_len, ingest_len: tail, pieces: full, n_layer: config.n_layer })
    }

    /// The pieces overlapping bytes [start, start+len) of `part`, clipped to that range.
    pub fn pieces_in(&self, part: usize, start: u64, len: u64) -> Vec<Piece> {
        let end = start + len;
        let first = self.pieces.partition_point(|p| (p.part, p.file_offset + p.len) <= (part, start));
        let mut out = Vec::new();
        for p in &self.pieces[first..] {
            if p.part != part || p.file_offset >= end {
                break;
            }
            let from = p.file_offset.max(start);
            let to = (p.file_offset + p.len).min(end);
            out.push(Piece { part, file_offset: from, len: to - from, store_offset: p.store_offset + (from - p.file_offset) });
        }
        out
    }
}

/// One part of the model as it is in a complete store: reads of the part's bytes become reads of the store.
/// Bytes the store does not keep (MTP block, padding) cannot be read.
pub struct StorePartView<F> {
    layout: Rc<StoreLayout>,
    part: usize,
    file: F,
    name: String,
}

impl<F> StorePartView<F> {
    pub fn new(layout: Rc<StoreLayout>, part: usize, file: F, store: String) -> Self {
        StorePartView { layout, part, file, name: format!("{store} (part {})", part + 1) }
    }

    /// The same part read through another way to the same data file (e.g. a pool of readers).
    pub fn map_file<G>(self, f: impl FnOnce(F) -> G) -> StorePartView<G> {
        StorePartView { layout: self.layout, part: self.part, file: f(self.file), name: self.name }
    }

    pub fn layout(&self) -> &StoreLayout {
        &self.layout
    }
}

impl<F: StoreFile> RangeSource for StorePartView<F> {
    fn describe(&self) -> String {
        self.name.clone()
    }
    async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
        let total = self.layout.part_lens[self.part];
        let len = len.min(total.saturating_sub(start));
        let mut out = vec![0u8; len as usize];
        for p in self.layout.pieces_in(self.part, start, len) {
            if p.store_offset + p.len > self.layout.data_len {
                return Err(format!("{}: bytes {}..{} are not kept in the store (MTP block or padding)", self.name, p.file_offset, p.file_offset + p.len));
            }
            let at = (p.file_offset - start) as usize;
            self.file.read_at(p.store_offset, &mut out[at..at + p.len as usize]).await?;
        }
        Ok((out, total))
    }
}
