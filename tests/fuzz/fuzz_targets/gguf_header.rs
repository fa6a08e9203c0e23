//! One GGUF part → the header reader (bare prefix, known file length, and through a byte source as ingest
//! reads it), then everything derived from one header: the one-part split model, the config, the tensor
//! checks, the store layout and the tokenizer.
//!
//! Input: `[flags: u8][claimed file length: u64 LE][the file's first bytes]`; flags bit 0 set means the
//! file is the claimed length (at least the prefix), clear means the prefix is the whole file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lingtab::gguf::{parse_header, GgufError, SplitModel};
use lingtab::model::Tokenizer;
use lingtab::source::read_header;
use lingtab_fuzz::{assert_same_header, check_config, check_header, check_round_trip, check_model, check_tokenizer, tensors_fit, Input, Part, PrefixSource};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let flags = input.u8();
    let claimed = input.u64();
    let part = Part::new(input.rest(), flags & 1 != 0, claimed);
    let prefix_len = part.prefix.len() as u64;

    let bare = parse_header(part.prefix, None);
    match &bare {
        Ok(h) => check_header(h, None),
        Err(GgufError::NeedMoreBytes { needed }) => assert!(*needed > prefix_len, "asks for {needed} of {prefix_len} bytes given"),
        Err(_) => {}
    }
    let known = parse_header(part.prefix, Some(part.file_len));
    match &known {
        Ok(h) => {
            check_header(h, Some(part.file_len));
            check_round_trip(h, part.file_len);
            // a header that parses with a file length parses the same without one
            assert_same_header(h, bare.as_ref().expect("parses with a file length but not as a bare prefix"));
        }
        Err(GgufError::NeedMoreBytes { needed }) => {
            assert!(part.file_len > prefix_len, "NeedMoreBytes with the whole file given");
            assert!(*needed > prefix_len && *needed <= part.file_len, "asks for {needed} bytes of a {}-byte file", part.file_len);
        }
        Err(_) => {}
    }
    if let Ok(h) = &bare {
        if tensors_fit(h, part.file_len) {
            assert!(known.is_ok(), "a bare prefix parses and fits the file, but not with the file length: {:?}", known.err());
        }
    }

    // as ingest reads it: from a source, growing the prefix when the reader asks for more
    let source = PrefixSource::new(part);
    match (pollster::block_on(read_header(&source)), &known) {
        (Ok((h, total)), Ok(k)) => {
            assert_eq!(total, part.file_len);
            assert_same_header(&h, k);
        }
        (Ok(_), Err(e)) => panic!("read_header accepts what parse_header refuses ({e})"),
        // the header parses from the prefix, but its padding up to the tensor data lies past it: a source of
        // only the prefix cannot serve what a real file of the claimed length would (found by fuzzing)
        (Err(e), Ok(k)) if k.data_start > prefix_len && (e.contains("the source returned") || e.contains("longer than")) => {}
        (Err(e), Ok(_)) => panic!("read_header refuses what parse_header accepts: {e}"),
        (Err(e), Err(_)) => assert!(e.starts_with("fuzz input"), "the error names the source: {e}"),
    }

    if let Ok(h) = &known {
        match SplitModel::new(vec![(h.clone(), part.file_len)]) {
            Ok(model) => check_model(&model),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        check_config(h);
        if let Ok(tok) = Tokenizer::from_header(h) {
            check_tokenizer(&tok, "Hello, 世界! <|endoftext|><role>HUMAN</role> 123 \u{1F600}\n\n  x");
        }
    }
    // the split reader must also survive headers that were never checked against a file length
    if let Ok(h) = bare {
        if let Ok(model) = SplitModel::new(vec![(h, part.file_len)]) {
            check_model(&model);
        }
    }
});

