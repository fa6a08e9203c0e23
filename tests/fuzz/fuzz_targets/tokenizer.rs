//! Text → the fixture's real tokenizer (tiny-ling's vocabulary and merges, read from its GGUF once), the
//! BAILINGMOE pre-tokenizer and the chat template; and tokenizers built from fuzzed vocabularies.
//!
//! The fixture's vocabulary is byte-level lossless: every one of the 256 byte characters is a token and
//! every merge result is a token, so for any UTF-8 text `decode(encode(text)) == text`, with special
//! tokens parsed or not (a special token decodes to its text). A fuzzed vocabulary promises no such thing,
//! so for it only ids inside the vocabulary and no panic are checked.
//!
//! Input: `[mode: u8][text bytes]`; invalid UTF-8 is replaced (the tokenizer takes `&str`).
//! mode % 4: 0 encode/decode, 1 pre-tokenizer pieces, 2 chat template, 3 fuzzed vocabulary.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lingtab::gguf::parse_header;
use lingtab::model::chat::{render, Message, Role, ToolCall};
use lingtab::model::pretokenize::split_bailing;
use lingtab::model::{SpecialIds, Tokenizer};
use std::sync::OnceLock;

fn fixture() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/tiny-ling/tiny-ling-00001-of-00002.gguf");
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let header = parse_header(&bytes, Some(bytes.len() as u64)).expect("the fixture's header");
        Tokenizer::from_header(&header).expect("the fixture's tokenizer")
    })
}

fn round_trip(tok: &Tokenizer, text: &str, parse_special: bool) {
    let ids = tok.encode(text, parse_special);
    assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()), "an id outside the vocabulary");
    let decoded = tok.decode(&ids);
    assert!(decoded == text.as_bytes(), "decode(encode({text:?}, {parse_special})) = {:?}", String::from_utf8_lossy(&decoded));
}

fn messages(text: &str, role_shift: usize) -> Vec<Message> {
    const ROLES: [Role; 4] = [Role::User, Role::Assistant, Role::Tool, Role::System];
    text.split('\u{1}')
        .enumerate()
        .map(|(i, segment)| {
            let (content, call) = segment.split_once('\u{3}').unwrap_or((segment, ""));
            let (content, reasoning) = content.split_once('\u{2}').map_or((content, None), |(c, r)| (c, Some(r)));
            let mut m = Message::new(ROLES[(i + role_shift) % 4], content);
            if let Some(r) = reasoning {
                m = m.with_reasoning(r);
            }
            if !call.is_empty() {
                let (name, arg) = call.split_once('\u{4}').unwrap_or((call, ""));
                let (key, value) = arg.split_once('\u{5}').unwrap_or((arg, ""));
                m = m.with_tool_call(ToolCall { name: name.into(), arguments: vec![(key.into(), value.into())] });
            }
            m
        })
        .collect()
}

/// `[type digit ':']text` lines up to a blank line, merges up to the next blank line, then text to encode.
fn fuzzed_vocabulary(text: &str, flags: u8) {
    let mut sections = text.splitn(3, "\n\n");
    let (vocab, merges, sample) = (sections.next().unwrap_or(""), sections.next().unwrap_or(""), sections.next().unwrap_or(""));
    let mut tokens = Vec::new();
    let mut types = Vec::new();
    for line in vocab.split('\n') {
        match line.as_bytes() {
            [d @ b'0'..=b'9', b':', ..] => {
                types.push((d - b'0') as i32);
                tokens.push(line[2..].to_string());
            }
            _ => {
                types.push(1);
                tokens.push(line.to_string());
            }
        }
    }
    if flags & 0x10 != 0 {
        types.truncate(types.len() / 2); // too few types: refused, or none at all
    }
    let n = tokens.len() as u32;
    let special = |bit: u8, id: u32| (flags & bit != 0).then_some(id);
    let specials = SpecialIds { bos: special(0x20, 0), eos: special(0x40, n / 2), eot: special(0x80, n.saturating_sub(1)), ..SpecialIds::default() };
    let merges = merges.split('\n').map(str::to_string).collect();
    if let Ok(tok) = Tokenizer::new(tokens, types, merges, specials) {
        lingtab_fuzz::check_tokenizer(&tok, sample);
        for id in 0..tok.vocab_size() as u32 + 2 {
            let _ = (tok.decode_piece(id), tok.token_text(id), tok.token_type(id), tok.is_eog(id));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    match mode % 4 {
        0 => {
            round_trip(fixture(), &text, false);
            round_trip(fixture(), &text, true);
        }
        1 => {
            let pieces = split_bailing(&text);
            assert!(pieces.iter().all(|p| !p.is_empty()), "an empty piece");
            assert_eq!(pieces.concat(), *text, "the pieces do not concatenate to the text");
        }
        2 => {
            let prompt = render(&messages(&text, (mode >> 3) as usize), mode & 4 != 0);
            assert!(prompt.starts_with("<role>SYSTEM</role>") && (prompt.ends_with("<think>") || prompt.ends_with("</think>")));
            round_trip(fixture(), &prompt, true);
        }
        _ => fuzzed_vocabulary(&text, mode),
    }
});
