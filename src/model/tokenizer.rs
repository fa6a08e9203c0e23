//! llama.cpp's byte-level BPE tokenizer (`tokenizer.ggml.model` = gpt2) with the BAILINGMOE pre-tokenizer
//! (ling-architecture.md §10), built from the GGUF vocabulary arrays.
//!
//! Encoding follows `llama_tokenize(add_special = false)`: special tokens are cut out of the text first
//! (`tokenizer_st_partition`), each remaining fragment is split by [`split_bailing`], every piece's bytes
//! are mapped to GPT-2's printable characters, and the piece is merged pair by pair in merge-rank order.

use crate::model::pretokenize::split_bailing;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// llama.cpp's token types (the values of `tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    /// The type a GGUF `token_type` value stands for (unknown values are `Undefined`, as in llama.cpp).
    pub fn from_gguf(value: i32) -> TokenType {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Special token ids and flags, from the GGUF keys `tokenizer.ggml.{bos,eos,eot,eom}_token_id` and
/// `tokenizer.ggml.add_{bos,eos}_token`. A key absent from the file is `None` / `false` here; note that
/// llama.cpp falls back to id 11 for bos and eos of a gpt2 vocabulary without those keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    /// Whether a prompt should start with `bos` (llama.cpp's `add_special`); `encode` never adds it.
    pub add_bos: bool,
    /// Whether a prompt should end with `eos`; `encode` never adds it.
    pub add_eos: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerError {
    EmptyVocab,
    /// Token ids are `u32` here and `int32_t` in llama.cpp.
    TooManyTokens(usize),
    /// `token_types` must be empty (every token NORMAL) or cover every token.
    TooFewTokenTypes { tokens: usize, types: usize },
    SpecialOutOfRange { name: &'static str, id: u32, vocab_size: usize },
    /// `tokenizer.ggml.model` is absent or not `gpt2` (byte-level BPE is the only one implemented).
    UnsupportedModel(Option<String>),
    /// `tokenizer.ggml.pre` is absent or names a pre-tokenizer other than BAILINGMOE's.
    UnsupportedPre(Option<String>),
    /// A required GGUF key is absent.
    MissingKey(&'static str),
    /// A GGUF key has the wrong type (e.g. not an array of strings).
    BadKey(&'static str),
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::EmptyVocab => write!(f, "the vocabulary has no tokens"),
            TokenizerError::TooManyTokens(n) => write!(f, "{n} tokens do not fit 32-bit token ids"),
            TokenizerError::TooFewTokenTypes { tokens, types } => {
                write!(f, "{types} token types for {tokens} tokens")
            }
            TokenizerError::SpecialOutOfRange { name, id, vocab_size } => {
                write!(f, "special token {name} = {id} is outside the vocabulary of {vocab_size} tokens")
            }
            TokenizerError::UnsupportedModel(None) => write!(f, "the GGUF has no tokenizer.ggml.model (only gpt2 is supported)"),
            TokenizerError::UnsupportedModel(Some(m)) => {
                write!(f, "tokenizer.ggml.model is '{m}'; only 'gpt2' (byte-level BPE) is supported")
            }
            TokenizerError::UnsupportedPre(None) => {
                write!(f, "the GGUF has no tokenizer.ggml.pre (only bailingmoe, bailingmoe2 and llada-moe are supported)")
            }
            TokenizerError::UnsupportedPre(Some(p)) => write!(
                f,
                "tokenizer.ggml.pre is '{p}'; only bailingmoe, bailingmoe2 and llada-moe (BAILINGMOE splitting) are supported"
            ),
            TokenizerError::MissingKey(key) => write!(f, "the GGUF has no {key}"),
            TokenizerError::BadKey(key) => write!(f, "{key} has the wrong type"),
        }
    }
}

impl std::error::Error for TokenizerError {}

/// Token texts llama.cpp treats as end of generation whatever the metadata says (its EOT/EOG lists in
/// `llama_vocab::impl::load`, plus the FIM pad/repo/separator tokens, which it also adds to that set).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
];

/// Other token texts llama.cpp turns into CONTROL tokens whatever their type (FIM prefix/suffix/middle).
const FIM_TEXTS: &[&str] = &[
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
    "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
    "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>",
];

/// GPT-2's byte → printable character map: bytes `!`..`~`, `¡`..`¬` and `®`..`ÿ` stand for themselves,
/// the other 68 bytes map to U+0100.. in increasing byte order.
pub fn byte_to_char(byte: u8) -> char {
    BYTE_CHARS[byte as usize]
}

/// The inverse of [`byte_to_char`].
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && keeps_itself(cp as u8) {
        return Some(cp as u8);
    }
    SHIFTED_BYTES.get(cp.checked_sub(0x100)? as usize).copied()
}

const fn keeps_itself(byte: u8) -> bool {
    matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const BYTE_CHARS: [char; 256] = {
    let mut chars = ['\0'; 256];
    let mut shifted = 0;
    let mut byte = 0;
    while byte < 256 {
        chars[byte] = if keeps_itself(byte as u8) {
            byte as u8 as char
        } else {
            shifted += 1;
            match char::from_u32(0x100 + shifted - 1) {
                Some(c) => c,
                None => panic!("U+0100..U+0143 are chars"),
            }
        };
        byte += 1;
    }
    chars
};

/// The bytes mapped to U+0100, U+0101, ... in that order.
const SHIFTED_BYTES: [u8; 68] = {
    let mut bytes = [0; 68];
    let mut shifted = 0;
    let mut byte = 0;
    while byte < 256 {
        if !keeps_itself(byte as u8) {
            bytes[shifted] = byte as u8;
            shifted += 1;
        }
        byte += 1;
    }
    bytes
};

/// A text fragment after the special-token partition.
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

pub struct Tokenizer {
    texts: Vec<String>,
    types: Vec<TokenType>,
    /// Text → id; for duplicate texts the last id wins, as in llama.cpp's `token_to_id`.
    ids_by_text: HashMap<String, u32>,
    specials: SpecialIds,
    /// CONTROL, USER_DEFINED and UNKNOWN tokens in partition order: longest text first.
    partition_order: Vec<u32>,
    eog: HashSet<u32>,
    bpe: Bpe,
    /// What each token decodes to, concatenated; token `i` is `pieces[piece_ends[i - 1]..piece_ends[i]]`.
    pieces: Vec<u8>,
    piece_ends: Vec<usize>,
}

/// Token texts llama.cpp takes as the eot token when `tokenizer.ggml.eot_token_id` is absent or bad.
const EOT_FALLBACK_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
];

impl Tokenizer {
    /// Builds the tokenizer from a GGUF header's `tokenizer.ggml.*` keys, as llama.cpp's `llama_vocab::load`
    /// does for a `gpt2` model: `tokens` and `merges` are required, `token_type` optional (all NORMAL).
    /// Special ids: bos and eos default to 11 (disabled when outside the vocabulary); a key inside the
    /// vocabulary replaces the default, one outside it is ignored. eot and eom default to none, then, when
    /// still none, to the token with a known end-of-turn text (`<|endoftext|>`, `<|im_end|>`, ...; the
    /// lowest such id, where llama.cpp takes whichever its hash map yields first) or `<|eom_id|>`.
    /// `add_bos`/`add_eos` are false unless `tokenizer.ggml.add_{bos,eos}_token` say otherwise.
    pub fn from_header(h: &crate::gguf::Header) -> Result<Tokenizer, TokenizerError> {
        use crate::gguf::Value;
        const MODEL: &str = "tokenizer.ggml.model";
        const PRE: &str = "tokenizer.ggml.pre";
        const TOKENS: &str = "tokenizer.ggml.tokens";
        const TYPES: &str = "tokenizer.ggml.token_type";
        const MERGES: &str = "tokenizer.ggml.merges";

        match h.get(MODEL) {
            None => return Err(TokenizerError::UnsupportedModel(None)),
            Some(v) => match v.as_str() {
                Some("gpt2") => {}
                Some(other) => return Err(TokenizerError::UnsupportedModel(Some(other.to_string()))),
                None => return Err(TokenizerError::BadKey(MODEL)),
            },
        }
        match h.get(PRE).map(|v| v.as_str().ok_or(TokenizerError::BadKey(PRE))).transpose()? {
            Some("bailingmoe" | "bailingmoe2" | "llada-moe") => {}
            other => return Err(TokenizerError::UnsupportedPre(other.map(str::to_string))),
        }
        let strings = |key: &'static str| -> Result<Vec<String>, TokenizerError> {
            let items = h.get(key).ok_or(TokenizerError::MissingKey(key))?.as_array().ok_or(TokenizerError::BadKey(key))?;
            items.iter().map(|v| v.as_str().map(str::to_string).ok_or(TokenizerError::BadKey(key))).collect()
        };
        let tokens = strings(TOKENS)?;
        let merges = strings(MERGES)?;
        let token_types: Vec<i32> = match h.get(TYPES) {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .ok_or(TokenizerError::BadKey(TYPES))?
                .iter()
                .map(|t| t.as_int().and_then(|t| i32::try_from(t).ok()).ok_or(TokenizerError::BadKey(TYPES)))
                .collect::<Result<_, _>>()?,
        };

        let n = tokens.len();
        let special = |name: &str, default: Option<u32>| -> Option<u32> {
            let default = default.filter(|&id| (id as usize) < n);
            match h.get(&format!("tokenizer.ggml.{name}_token_id")).and_then(Value::as_u64) {
                Some(id) if (id as usize) < n => Some(id as u32),
                _ => default,
            }
        };
        let by_text = |texts: &[&str]| -> Option<u32> {
            tokens.iter().position(|t| texts.contains(&t.as_str())).map(|i| i as u32)
        };
        let flag = |name: &str| h.get(&format!("tokenizer.ggml.add_{name}_token")).and_then(Value::as_bool).unwrap_or(false);
        let specials = SpecialIds {
            bos: special("bos", Some(11)),
            eos: special("eos", Some(11)),
            eot: special("eot", None).or_else(|| by_text(EOT_FALLBACK_TEXTS)),
            eom: special("eom", None).or_else(|| by_text(&["<|eom_id|>"])),
            add_bos: flag("bos"),
            add_eos: flag("eos"),
        };
        Tokenizer::new(tokens, token_types, merges, specials)
    }

    /// Builds the tokenizer from `tokenizer.ggml.tokens`, `.token_type` (empty: all NORMAL) and `.merges`.
    pub fn new(
        tokens: Vec<String>,
        token_types: Vec<i32>,
        merges: Vec<String>,
        specials: SpecialIds,
    ) -> Result<Tokenizer, TokenizerError> {
        if tokens.is_empty() {
            return Err(TokenizerError::EmptyVocab);
        }
        if tokens.len() > i32::MAX as usize {
            return Err(TokenizerError::TooManyTokens(tokens.len()));
        }
        if !token_types.is_empty() && token_types.len() < tokens.len() {
            return Err(TokenizerError::TooFewTokenTypes { tokens: tokens.len(), types: token_types.len() });
        }
        let vocab_size = tokens.len();
        for (name, id) in [("bos", specials.bos), ("eos", specials.eos), ("eot", specials.eot), ("eom", specials.eom)] {
            if let Some(id) = id.filter(|&id| id as usize >= vocab_size) {
                return Err(TokenizerError::SpecialOutOfRange { name, id, vocab_size });
            }
        }

        // llama.cpp renames empty tokens so that every token has a findable, non-empty text.
        let texts: Vec<String> = tokens
            .into_iter()
            .enumerate()
            .map(|(i, text)| if text.is_empty() { format!("[EMPTY_{i}]") } else { text })
            .collect();
        let mut types: Vec<TokenType> = (0..vocab_size)
            .map(|i| token_types.get(i).map_or(TokenType::Normal, |&t| TokenType::from_gguf(t)))
            .collect();
        let ids_by_text: HashMap<String, u32> = texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();

        let mut eog: HashSet<u32> = [specials.eos, specials.eot, specials.eom].into_iter().flatten().collect();
        for (text, &id) in &ids_by_text {
            let is_eog_text = EOG_TEXTS.contains(&text.as_str());
            if is_eog_text {
                eog.insert(id);
            }
            if is_eog_text || FIM_TEXTS.contains(&text.as_str()) {
                types[id as usize] = TokenType::Control;
            }
        }

        let mut partition_order: Vec<u32> = (0..vocab_size as u32)
            .filter(|&id| matches!(types[id as usize], TokenType::Control | TokenType::UserDefined | TokenType::Unknown))
            .collect();
        // llama.cpp sorts by length with the unstable std::sort; ties keep id order here.
        partition_order.sort_by_key(|&id| Reverse(texts[id as usize].len()));

        let mut pieces = Vec::new();
        let mut piece_ends = Vec::with_capacity(vocab_size);
        for (text, &token_type) in texts.iter().zip(&types) {
            append_piece(text, token_type, &mut pieces);
            piece_ends.push(pieces.len());
        }

        let bpe = Bpe::new(&merges, &ids_by_text);
        Ok(Tokenizer { texts, types, ids_by_text, specials, partition_order, eog, bpe, pieces, piece_ends })
    }

    /// The token ids of `text`, as `llama_tokenize(text, add_special = false, parse_special)`: with
    /// `parse_special` false only USER_DEFINED tokens are recognised in the text, with it true CONTROL and
    /// UNKNOWN tokens too.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut ids = Vec::new();
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(text) => {
                    for piece in split_bailing(text) {
                        self.bpe.encode_piece(piece.as_bytes(), &mut ids);
                    }
                }
            }
        }
        ids
    }

    /// The bytes token `id` stands for (`llama_token_to_piece` with `special` = true: CONTROL and
    /// USER_DEFINED tokens render as their text); empty for ids outside the vocabulary.
    pub fn decode_piece(&self, id: u32) -> &[u8] {
        let id = id as usize;
        if id >= self.piece_ends.len() {
            return &[];
        }
        let start = if id == 0 { 0 } else { self.piece_ends[id - 1] };
        &self.pieces[start..self.piece_ends[id]]
    }

    /// The concatenated pieces of `ids` (may be invalid UTF-8 when a character is split across tokens).
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().flat_map(|&id| self.decode_piece(id)).copied().collect()
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids_by_text.get(text).copied()
    }

    /// The token's text as stored in the vocabulary (GPT-2-mapped for normal tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The token's type after llama.cpp's overrides (end-of-generation and FIM texts become CONTROL).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Whether generation stops at `id`: eos, eot, eom and the tokens llama.cpp recognises by text
    /// (`<|endoftext|>`, `<|im_end|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    pub fn specials(&self) -> &SpecialIds {
        &self.specials
    }

    /// llama.cpp's `tokenizer_st_partition`: each special token in turn (longest first) is cut out of
    /// every text fragment left by the previous ones, left to right.
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut fragments = Vec::new();
        if !text.is_empty() {
            fragments.push(Fragment::Text(text));
        }
        for &id in &self.partition_order {
            if !parse_special && matches!(self.types[id as usize], TokenType::Control | TokenType::Unknown) {
                continue;
            }
            let special = self.texts[id as usize].as_str();
            // Cheap rejection: a special absent from the whole text is absent from every fragment.
            if !text.contains(special) {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    split.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(special) {
                    if at > 0 {
                        split.push(Fragment::Text(&rest[..at]));
                    }
                    split.push(Fragment::Token(id));
                    rest = &rest[at + special.len()..];
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        fragments
    }
}

/// Appends what a token of this text and type decodes to (llama.cpp's `token_to_piece`, BPE case).
fn append_piece(text: &str, token_type: TokenType, out: &mut Vec<u8>) {
    match token_type {
        TokenType::Control | TokenType::Unknown | TokenType::UserDefined => out.extend_from_slice(text.as_bytes()),
        TokenType::Normal => {
            for c in text.chars() {
                match char_to_byte(c) {
                    Some(byte) => out.push(byte),
                    // llama.cpp's `llama_decode_text` marks characters outside the byte map this way.
                    None => {
                        out.extend_from_slice(b"[UNK_BYTE_0x");
                        let mut utf8 = [0; 4];
                        for byte in c.encode_utf8(&mut utf8).bytes() {
                            out.extend_from_slice(format!("{byte:02x}").as_bytes());
                        }
                        out.extend_from_slice(text.as_bytes());
                        out.push(b']');
                    }
                }
            }
        }
        // A BYTE token's text is "<0xXX>"; llama.cpp reads the two characters after "<0x" as hex.
        TokenType::Byte => {
            let hex: String = text.chars().skip(3).take(2).take_while(char::is_ascii_hexdigit).collect();
            out.push(u8::from_str_radix(&hex, 16).unwrap_or(0));
        }
        TokenType::Unused | TokenType::Undefined => {}
    }
}

/// The merge table, over interned symbols: every text that occurs in a merge (as left part, right part
/// or result) and every single byte character gets a symbol id.
struct Bpe {
    /// Symbol of the GPT-2 character of each byte.
    byte_symbols: [u32; 256],
    /// (left, right) → (rank, merged symbol); for a pair listed twice the first rank counts.
    merges: HashMap<(u32, u32), (u32, u32), BuildHasherDefault<PairHasher>>,
    /// Token ids each symbol encodes to: its own token, or when its text is not a token, the tokens of
    /// its single bytes that are (llama.cpp's fallback; other bytes are dropped).
    outputs: Vec<u32>,
    output_ends: Vec<usize>,
}

/// A fast hash for the merge table's symbol pairs, looked up once or twice per byte of input. (The
/// keys come from the vocabulary, not from the text, so no collision attack can target it.)
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(26) ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// One symbol of a piece being merged, in a doubly linked list over the piece's bytes (kept small:
/// a long piece has one per byte).
#[derive(Clone, Copy)]
struct Symbol {
    /// `MERGED_AWAY` once merged into its left neighbour.
    id: u32,
    /// Neighbours, `NO_SYMBOL` at the ends.
    prev: usize,
    next: usize,
}

const MERGED_AWAY: u32 = u32::MAX;
const NO_SYMBOL: usize = usize::MAX;

impl Bpe {
    fn new(merges: &[String], ids_by_text: &HashMap<String, u32>) -> Bpe {
        let mut symbol_ids: HashMap<String, u32> = HashMap::new();
        let mut symbol_texts: Vec<String> = Vec::new();
        let mut intern = |text: &str| -> u32 {
            if let Some(&id) = symbol_ids.get(text) {
                return id;
            }
            let id = symbol_texts.len() as u32;
            symbol_ids.insert(text.to_owned(), id);
            symbol_texts.push(text.to_owned());
            id
        };

        let mut merge_table = HashMap::default();
        for (rank, merge) in merges.iter().enumerate() {
            // Split at the first space after the first byte, like llama.cpp (`word.find(' ', 1)`); an
            // entry without one can never apply.
            let Some(space) = merge.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&merge[..space], &merge[space + 1..]);
            if left.is_empty() || right.is_empty() {
                continue;
            }
            let pair = (intern(left), intern(right));
            let merged = intern(&format!("{left}{right}"));
            merge_table.entry(pair).or_insert((rank as u32, merged));
        }
        let byte_symbols: [u32; 256] = std::array::from_fn(|b| intern(byte_to_char(b as u8).encode_utf8(&mut [0; 4])));

        let mut outputs = Vec::new();
        let mut output_ends = Vec::with_capacity(symbol_texts.len());
        for text in &symbol_texts {
            match ids_by_text.get(text) {
                Some(&id) => outputs.push(id),
                None => {
                    let single_byte_tokens = text.bytes().filter_map(|b| {
                        let single: &str = std::str::from_utf8(std::slice::from_ref(&b)).ok()?;
                        ids_by_text.get(single).copied()
                    });
                    outputs.extend(single_byte_tokens);
                }
            }
            output_ends.push(outputs.len());
        }
        Bpe { byte_symbols, merges: merge_table, outputs, output_ends }
    }

    fn symbol_output(&self, symbol: u32) -> &[u32] {
        let symbol = symbol as usize;
        let start = if symbol == 0 { 0 } else { self.output_ends[symbol - 1] };
        &self.outputs[start..self.output_ends[symbol]]
    }

    /// Encodes one pre-tokenizer piece: repeatedly merges the adjacent pair of lowest rank, the leftmost
    /// of equal ranks (llama.cpp's `llm_bigram_bpe` queue), then emits each remaining symbol's tokens.
    fn encode_piece(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let n = bytes.len();
        let mut symbols: Vec<Symbol> = bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| Symbol {
                id: self.byte_symbols[b as usize],
                prev: i.checked_sub(1).unwrap_or(NO_SYMBOL),
                next: if i + 1 < n { i + 1 } else { NO_SYMBOL },
            })
            .collect();

        // Candidates ordered by (rank, left position); an entry is stale once either symbol changed.
        let mut queue: BinaryHeap<Reverse<(u32, usize, u32, u32)>> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>, symbols: &[Symbol], left: usize| {
            let right = symbols[left].next;
            if right == NO_SYMBOL {
                return;
            }
            let pair = (symbols[left].id, symbols[right].id);
            if let Some(&(rank, _)) = self.merges.get(&pair) {
                queue.push(Reverse((rank, left, pair.0, pair.1)));
            }
        };
        for left in 0..n {
            push(&mut queue, &symbols, left);
        }

        while let Some(Reverse((_, left, left_id, right_id))) = queue.pop() {
            let right = symbols[left].next;
            if symbols[left].id != left_id || right == NO_SYMBOL || symbols[right].id != right_id {
                continue;
            }
            let (_, merged) = self.merges[&(left_id, right_id)];
            let after = symbols[right].next;
            symbols[left].id = merged;
            symbols[left].next = after;
            symbols[right].id = MERGED_AWAY;
            if after != NO_SYMBOL {
                symbols[after].prev = left;
            }
            let before = symbols[left].prev;
            if before != NO_SYMBOL {
                push(&mut queue, &symbols, before);
            }
            push(&mut queue, &symbols, left);
        }

        let mut at = if n > 0 { 0 } else { NO_SYMBOL };
        while at != NO_SYMBOL {
            out.extend_from_slice(self.symbol_output(symbols[at].id));
            at = symbols[at].next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: bytes of "abc \n", merges a+b → ab, ab+c → abc, plus two specials.
    fn toy() -> Tokenizer {
        let tokens: Vec<String> =
            ["a", "b", "c", "Ġ", "Ċ", "ab", "abc", "<s>", "<u>", "<|endoftext|>"].map(String::from).to_vec();
        let types = vec![1, 1, 1, 1, 1, 1, 1, 3, 4, 1];
        let merges = vec!["a b".to_string(), "ab c".to_string(), "nomerge".to_string()];
        let specials = SpecialIds { eos: Some(7), ..SpecialIds::default() };
        Tokenizer::new(tokens, types, merges, specials).unwrap()
    }

    #[test]
    fn gpt2_byte_map() {
        assert_eq!(byte_to_char(b'!'), '!');
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(0), '\u{100}');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }

    #[test]
    fn merges_and_specials() {
        let tok = toy();
        assert_eq!(tok.encode("abc", false), [6]);
        assert_eq!(tok.encode("ab ca", false), [5, 3, 2, 0]);
        // CONTROL only with parse_special; USER_DEFINED always.
        assert_eq!(tok.encode("a<s>b<u>", true), [0, 7, 1, 8]);
        assert_eq!(tok.encode("a<s>b<u>", false), [0, 1, 8]); // '<', 's', '>' are not tokens: dropped
        // `<|endoftext|>` is forced to CONTROL and ends generation, like eos.
        assert_eq!(tok.token_type(9), Some(TokenType::Control));
        assert!(tok.is_eog(9) && tok.is_eog(7) && !tok.is_eog(8));
        assert_eq!(tok.decode(&[6, 3, 7, 4]), b"abc <s>\n");
        assert_eq!(tok.decode_piece(1000), b"");
    }

    #[test]
    fn rejects_bad_input_without_panicking() {
        assert_eq!(Tokenizer::new(vec![], vec![], vec![], SpecialIds::default()).err(), Some(TokenizerError::EmptyVocab));
        let err = Tokenizer::new(vec!["a".into(), "b".into()], vec![1], vec![], SpecialIds::default()).err();
        assert_eq!(err, Some(TokenizerError::TooFewTokenTypes { tokens: 2, types: 1 }));
        let specials = SpecialIds { bos: Some(2), ..SpecialIds::default() };
        let err = Tokenizer::new(vec!["a".into(), "b".into()], vec![], vec![], specials).err();
        assert!(matches!(err, Some(TokenizerError::SpecialOutOfRange { name: "bos", id: 2, .. })));
        // Empty token texts and broken merges are tolerated like llama.cpp does.
        let tok = Tokenizer::new(vec!["".into(), "a".into()], vec![], vec![" ".into(), "".into(), "a".into()], SpecialIds::default())
            .unwrap();
        assert_eq!(tok.token_text(0), Some("[EMPTY_0]"));
        assert_eq!(tok.encode("aa\u{0}😀", true), [1, 1]);
    }

    /// A GGUF header holding `keys` (and no tensors), through the writer and the parser.
    fn header(keys: Vec<(&str, crate::gguf::Value)>) -> crate::gguf::Header {
        let mut w = crate::gguf::GgufWriter::new();
        for (k, v) in keys {
            w.set(k, v);
        }
        let bytes = w.to_parts(1, |_| Vec::new()).unwrap().remove(0);
        crate::gguf::parse_header(&bytes, Some(bytes.len() as u64)).unwrap()
    }

    #[test]
    fn from_header_reads_keys_and_applies_llama_cpp_fallbacks() {
        use crate::gguf::{Value, ValueType};
        let strs = |v: &[&str]| Value::Array(ValueType::String, v.iter().map(|s| Value::String(s.to_string())).collect());
        let tokens: Vec<String> = (0..12).map(|i| format!("t{i}")).chain(["<|endoftext|>".into(), "a".into(), "b".into()]).collect();
        let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let base = || {
            vec![
                ("tokenizer.ggml.model", Value::String("gpt2".into())),
                ("tokenizer.ggml.pre", Value::String("bailingmoe2".into())),
                ("tokenizer.ggml.tokens", strs(&token_refs)),
                ("tokenizer.ggml.merges", strs(&["a b"])),
            ]
        };
        // No special keys: bos = eos = 11, eot found by text, no types (all NORMAL), flags false.
        let tok = Tokenizer::from_header(&header(base())).unwrap();
        assert_eq!(tok.specials(), &SpecialIds { bos: Some(11), eos: Some(11), eot: Some(12), ..SpecialIds::default() });
        assert_eq!(tok.encode("ab", false), tok.token_id("ab").map_or(vec![13, 14], |id| vec![id]));
        // Keys win when inside the vocabulary; out-of-range keys keep the default.
        let mut keys = base();
        keys.push(("tokenizer.ggml.bos_token_id", Value::U32(3)));
        keys.push(("tokenizer.ggml.eos_token_id", Value::U32(99)));
        keys.push(("tokenizer.ggml.eot_token_id", Value::U32(5)));
        keys.push(("tokenizer.ggml.add_bos_token", Value::Bool(true)));
        keys.push(("tokenizer.ggml.token_type", Value::Array(ValueType::I32, (0..15).map(|i| Value::I32(if i == 4 { 3 } else { 1 })).collect())));
        let tok = Tokenizer::from_header(&header(keys)).unwrap();
        let want = SpecialIds { bos: Some(3), eos: Some(11), eot: Some(5), eom: None, add_bos: true, add_eos: false };
        assert_eq!(tok.specials(), &want);
        assert_eq!(tok.token_type(4), Some(TokenType::Control));
        assert_eq!(tok.encode("t4", true), [4]);

        // Errors: another tokenizer model, another pre-tokenizer, missing merges.
        let mut keys = base();
        keys[0].1 = Value::String("llama".into());
        let err = Tokenizer::from_header(&header(keys)).err().unwrap();
        assert_eq!(err, TokenizerError::UnsupportedModel(Some("llama".into())));
        assert!(err.to_string().contains("only 'gpt2'"), "{err}");
        let mut keys = base();
        keys.remove(0);
        assert_eq!(Tokenizer::from_header(&header(keys)).err(), Some(TokenizerError::UnsupportedModel(None)));
        let mut keys = base();
        keys[1].1 = Value::String("qwen2".into());
        assert_eq!(Tokenizer::from_header(&header(keys)).err(), Some(TokenizerError::UnsupportedPre(Some("qwen2".into()))));
        let mut keys = base();
        keys.pop();
        assert_eq!(Tokenizer::from_header(&header(keys)).err(), Some(TokenizerError::MissingKey("tokenizer.ggml.merges")));
    }

    #[test]
    fn long_inputs_stay_fast_and_exact() {
        let tok = toy();
        let letters = "abc".repeat(100_000);
        assert_eq!(tok.encode(&letters, false), vec![6; 100_000]);
        let spaces = " ".repeat(300_000);
        assert_eq!(tok.encode(&spaces, false), vec![3; 300_000]);
        let mixed: String = (0..200_000u32).filter_map(|i| char::from_u32(i * 5 % 0x11_0000)).collect();
        let ids = tok.encode(&mixed, true);
        assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
    }
}

/// The fixture's vocabulary against llama.cpp's own token ids for 275 strings.
#[cfg(all(test, not(target_arch = "wasm32")))]
mod fixture_tests {
    use super::*;
    use serde_json::Value;
    use std::path::PathBuf;

    fn fixture_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-ling")
    }

    fn read_json(name: &str) -> Value {
        let path = fixture_dir().join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    fn ids(value: &Value) -> Vec<u32> {
        value.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
    }

    /// The fixture tokenizer, assembled like its GGUF: HF vocabulary and added tokens by id, merges as
    /// "left right", token types and special ids from `model_manifest.json`.
    fn fixture_tokenizer() -> Tokenizer {
        let hf = read_json("tokenizer.json");
        let manifest = read_json("model_manifest.json");
        let mut by_id: Vec<(u64, String)> =
            hf["model"]["vocab"].as_object().unwrap().iter().map(|(text, id)| (id.as_u64().unwrap(), text.clone())).collect();
        for added in hf["added_tokens"].as_array().unwrap() {
            by_id.push((added["id"].as_u64().unwrap(), added["content"].as_str().unwrap().to_string()));
        }
        by_id.sort();
        assert!(by_id.iter().enumerate().all(|(i, (id, _))| *id == i as u64), "ids must be 0..n");
        let tokens: Vec<String> = by_id.into_iter().map(|(_, text)| text).collect();

        let mut types = vec![1; tokens.len()];
        for special in manifest["special_tokens"].as_array().unwrap() {
            let id = special["id"].as_u64().unwrap() as usize;
            assert_eq!(tokens[id], special["text"].as_str().unwrap());
            types[id] = match special["type"].as_str().unwrap() {
                "CONTROL" => 3,
                "USER_DEFINED" => 4,
                other => panic!("unexpected special token type {other}"),
            };
        }
        let merges: Vec<String> = hf["model"]["merges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| match m {
                Value::String(s) => s.clone(),
                pair => format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()),
            })
            .collect();
        let id = |key: &str| manifest[key].as_u64().map(|v| v as u32);
        let specials = SpecialIds { bos: id("bos_id"), eos: id("eos_id"), ..SpecialIds::default() };
        Tokenizer::new(tokens, types, merges, specials).unwrap()
    }

    #[test]
    fn matches_llama_cpp_on_fixture_cases() {
        let tok = fixture_tokenizer();
        let golden = read_json("golden/tokenize_cases.json");
        let cases = golden["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 275);
        let mut failures = Vec::new();
        for case in cases {
            let name = case["id"].as_str().unwrap();
            let text = case["text"].as_str().unwrap();
            for (parse_special, key) in [(true, "llama_parse_special"), (false, "llama_no_parse_special")] {
                let got = tok.encode(text, parse_special);
                if got != ids(&case[key]) {
                    failures.push(format!("{name} parse_special={parse_special}: got {got:?}, want {:?}", ids(&case[key])));
                }
                if tok.decode(&got) != text.as_bytes() {
                    failures.push(format!("{name} parse_special={parse_special}: decode does not round-trip"));
                }
            }
            let pieces: Vec<String> = ids(&case["llama_parse_special"])
                .iter()
                .map(|&id| tok.decode_piece(id).iter().map(|b| format!("{b:02x}")).collect())
                .collect();
            let want_pieces: Vec<String> =
                case["llama_pieces_hex"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
            if pieces != want_pieces {
                failures.push(format!("{name}: pieces {pieces:?}, want {want_pieces:?}"));
            }
        }
        assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    }

    #[test]
    fn from_header_equals_the_fixture_tokenizer() {
        let path = fixture_dir().join("tiny-ling-00001-of-00002.gguf");
        let bytes = std::fs::read(&path).unwrap();
        let h = crate::gguf::parse_header(&bytes, Some(bytes.len() as u64)).unwrap();
        let tok = Tokenizer::from_header(&h).unwrap();
        let reference = fixture_tokenizer();
        assert_eq!(tok.vocab_size(), reference.vocab_size());
        assert_eq!(tok.specials().bos, reference.specials().bos);
        assert_eq!(tok.specials().eos, reference.specials().eos);
        assert!(!tok.specials().add_bos && !tok.specials().add_eos);
        for id in 0..tok.vocab_size() as u32 {
            assert_eq!(tok.token_text(id), reference.token_text(id));
            assert_eq!(tok.token_type(id), reference.token_type(id), "token {id}");
            assert_eq!(tok.is_eog(id), reference.is_eog(id), "token {id}");
        }
        let golden = read_json("golden/tokenize_cases.json");
        for case in golden["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(tok.encode(text, true), ids(&case["llama_parse_special"]));
            assert_eq!(tok.encode(text, false), ids(&case["llama_no_parse_special"]));
        }
    }

    #[test]
    fn end_of_generation_tokens_match_llama_cpp() {
        let tok = fixture_tokenizer();
        let golden = read_json("golden/tokenize_cases.json");
        for special in golden["special_tokens"].as_array().unwrap() {
            let id = special["id"].as_u64().unwrap() as u32;
            assert_eq!(tok.is_eog(id), special["is_eog"].as_bool().unwrap(), "token {id}");
            assert_eq!(tok.token_id(special["text"].as_str().unwrap()), Some(id));
        }
        assert_eq!(tok.vocab_size(), 3584);
    }
}
