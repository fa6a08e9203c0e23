//! Two GGUF parts → the split-model reader, which checks them against each other (split.count, split.no,
//! split.tensors.count, tensors inside their part) and makes one virtual file of them; then the config and
//! store layout of the model; and the part-name pattern.
//!
//! Input: `[flags: u8][cut: u32 LE][claimed length 1: u64 LE][claimed length 2: u64 LE][bytes]`: the bytes
//! before `cut` (modulo their length) start part 1, the rest start part 2; flags bits 0 and 1 say whether
//! part 1 and part 2 are their claimed lengths (else each prefix is its whole file); bit 2 also hands the
//! split reader headers parsed without a file length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lingtab::gguf::{parse_header, split_part_names, SplitModel};
use lingtab_fuzz::{check_model, parse_parts, Input, Part};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let flags = input.u8();
    let cut = input.u32() as usize;
    let (claimed1, claimed2) = (input.u64(), input.u64());
    let bytes = input.rest();
    let cut = cut % (bytes.len() + 1);
    let parts = [Part::new(&bytes[..cut], flags & 1 != 0, claimed1), Part::new(&bytes[cut..], flags & 2 != 0, claimed2)];

    if let Some(headers) = parse_parts(&parts) {
        let model = SplitModel::new(headers.clone());
        if let Ok(model) = &model {
            check_model(model);
            assert_eq!(model.header().get_u64("split.count"), Some(2), "a two-part model that does not say so");
            let no = |i: usize| model.parts[i].get_u64("split.no").unwrap_or(0);
            assert_eq!((no(0), no(1)), (0, 1));
        }
        let reversed = SplitModel::new(headers.iter().rev().cloned().collect());
        for (i, (h, len)) in headers.iter().enumerate() {
            let alone = SplitModel::new(vec![(h.clone(), *len)]);
            if let Ok(m) = &alone {
                check_model(m);
            }
            if model.is_ok() {
                assert!(alone.is_err(), "part {} alone accepted as a whole model", i + 1);
            }
        }
        match reversed {
            Ok(m) => {
                check_model(&m);
                assert!(model.is_err(), "parts accepted in both orders");
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    if flags & 4 != 0 {
        let bare: Option<Vec<_>> = parts.iter().map(|p| parse_header(p.prefix, None).ok().map(|h| (h, p.file_len))).collect();
        if let Some(Ok(model)) = bare.map(SplitModel::new) {
            check_model(&model);
        }
    }

    // the names of the other parts from the first one's
    let name = String::from_utf8_lossy(&bytes[..bytes.len().min(96)]);
    if let Ok(names) = split_part_names(&name) {
        assert!(!names.is_empty());
        assert_eq!(names[0], name, "the first part's name is not the name given");
    }
});
