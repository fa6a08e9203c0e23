//! Structure-aware: edits to real headers' metadata values and tensor dims, written back as a header and
//! read again, then the split model, config, tensor checks, store layout and tokenizer. A byte-level mutation
//! of a 10-100 kB header rarely turns one value into an exact other value of another type; here every input
//! is such edits, so the config's arithmetic and allocations meet extreme values at once.
//!
//! Input: `[base: u8][edits: (index: u16 LE, type: u8, value: u64 LE)...]` (at most 16 edits; see
//! `lingtab_fuzz::edit_header`). base % 3: 0 a one-part make-tiny model (300-token vocabulary), 1 the
//! fixture with part 1 edited, 2 the fixture with part 2 edited. The fixture's vocabulary arrays (7000
//! strings; the tokenizer built from them is the gguf_header and tokenizer targets' subject) are left out of
//! its base, which makes an input several times faster to run.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lingtab::gguf::{parse_header, Header, SplitModel};
use lingtab::model::Tokenizer;
use lingtab::tiny::{TinyModel, TinyOptions};
use lingtab_fuzz::{check_config, check_header, check_model, check_tokenizer, edit_header, Input};
use std::sync::OnceLock;

/// The base models: each part's header and file length.
fn bases() -> &'static [Vec<(Header, u64)>; 2] {
    static BASES: OnceLock<[Vec<(Header, u64)>; 2]> = OnceLock::new();
    BASES.get_or_init(|| {
        let tiny = TinyModel::plan(TinyOptions { vocab: 300, parts: 1, ..TinyOptions::tiny(7) }).expect("a tiny model");
        let tiny = tiny.part_plans().expect("its plan").into_iter().map(|p| (parse_header(&p.header, Some(p.len)).expect("its header"), p.len)).collect();
        let fixture = [1, 2]
            .map(|i| {
                let path = format!("{}/../fixtures/tiny-ling/tiny-ling-0000{i}-of-00002.gguf", env!("CARGO_MANIFEST_DIR"));
                let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                let mut h = parse_header(&bytes, Some(bytes.len() as u64)).expect("the fixture's header");
                let mut w = lingtab::gguf::GgufWriter::new();
                w.metadata = h.metadata.into_iter().filter(|(k, _)| !matches!(k.as_str(), "tokenizer.ggml.tokens" | "tokenizer.ggml.merges" | "tokenizer.ggml.token_type")).collect();
                w.tensors = h.tensors.iter().map(|t| lingtab::gguf::TensorSpec { name: t.name.clone(), ty: t.ty, dims: t.dims.clone() }).collect();
                let plan = w.plan(1).expect("the fixture's header, written back").remove(0);
                h = parse_header(&plan.header, Some(plan.len)).expect("read again");
                (h, plan.len)
            })
            .to_vec();
        [tiny, fixture]
    })
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let base = input.u8() % 3;
    let mut edits = Vec::new();
    while !input.0.is_empty() && edits.len() < 16 {
        edits.push((input.u16(), input.u8(), input.u64()));
    }
    let (model, edited) = match base {
        0 => (&bases()[0], 0),
        b => (&bases()[1], b as usize - 1),
    };
    let Some((header, len)) = edit_header(&model[edited].0, &edits) else { return };
    let Ok(h) = parse_header(&header, Some(len)) else { return };
    check_header(&h, Some(len));
    check_config(&h);
    // (the base tokenizers were checked by the tokenizer target: rebuild only one whose keys an edit changed)
    let tokenizer_edited = edited == 0
        && (h.metadata.len() != model[0].0.metadata.len()
            || h.metadata.iter().zip(&model[0].0.metadata).any(|(a, b)| a.0.starts_with("tokenizer.") && a != b));
    if tokenizer_edited {
        if let Ok(tok) = Tokenizer::from_header(&h) {
            check_tokenizer(&tok, "Hello, 世界! <|endoftext|><role>HUMAN</role> 123");
        }
    }
    let mut parts: Vec<_> = model.iter().enumerate().filter(|(i, _)| *i != edited).map(|(_, p)| p.clone()).collect();
    parts.insert(edited, (h, len));
    if let Ok(m) = SplitModel::new(parts) {
        check_model(&m);
    }
});
