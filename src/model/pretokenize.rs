//! The BAILINGMOE pre-tokenizer: splits raw text into the pieces that BPE then encodes one by one.
//!
//! llama.cpp (`LLAMA_VOCAB_PRE_TYPE_BAILINGMOE`) runs this regex with `std::regex`:
//!
//! ```text
//! '(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+
//! ```
//!
//! `std::regex` knows no Unicode classes, so llama.cpp first "collapses" the text: ASCII characters stay
//! as they are, every other code point becomes one byte standing for its class (non-ASCII whitespace
//! becomes `\v`), and `\p{L}` / `\p{N}` become `[A-Za-z<letter byte>]` / `[0-9<number byte>]`. Under that
//! scheme only four classes of character matter (see [`CharClass`]), and because the alternatives are
//! tried in order at each position (ECMAScript semantics) and together match every character, the
//! splitter below is a single left-to-right scan that decides each piece from at most the next few
//! characters plus one run of whitespace.

use crate::model::unicode::{self, Category};

/// What a character is to the collapsed regex.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CharClass {
    /// `\p{L}`: ASCII `A-Za-z`, or a non-ASCII letter per llama.cpp's tables.
    Letter,
    /// `\p{N}`: ASCII `0-9`, or a non-ASCII number (`²`, `½`, `٣`, `Ⅻ` included).
    Number,
    /// `\s`: ASCII `\t \n \v \f \r` and space (what `std::regex` matches in the "C" locale), or a
    /// non-ASCII code point in llama.cpp's whitespace set (U+0085, U+00A0, U+3000, ...).
    Space,
    /// Everything else: punctuation, symbols, marks, controls, unassigned (U+FEFF and U+200B too).
    Other,
}

/// The class of `c` under llama.cpp's collapsing.
pub fn char_class(c: char) -> CharClass {
    if c.is_ascii() {
        return match c {
            'A'..='Z' | 'a'..='z' => CharClass::Letter,
            '0'..='9' => CharClass::Number,
            '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r' | ' ' => CharClass::Space,
            _ => CharClass::Other,
        };
    }
    if unicode::is_whitespace(c) {
        return CharClass::Space;
    }
    match unicode::category(c) {
        Category::Letter => CharClass::Letter,
        Category::Number => CharClass::Number,
        _ => CharClass::Other,
    }
}

/// Splits `text` into pre-tokenizer pieces, exactly as llama.cpp's BAILINGMOE regex does. The pieces
/// are non-empty and concatenate back to `text`.
pub fn split_bailing(text: &str) -> Vec<&str> {
    let scan = Scan { chars: text.char_indices().map(|(at, c)| (at, c, char_class(c))).collect() };
    let n = scan.chars.len();
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < n {
        let end = scan.piece_end(start);
        let byte_end = if end < n { scan.chars[end].0 } else { text.len() };
        pieces.push(&text[scan.chars[start].0..byte_end]);
        start = end;
    }
    pieces
}

/// The text as (byte offset, char, class) triples; positions below are indices into it.
struct Scan {
    chars: Vec<(usize, char, CharClass)>,
}

impl Scan {
    fn class(&self, i: usize) -> Option<CharClass> {
        self.chars.get(i).map(|&(_, _, class)| class)
    }

    fn is_newline(&self, i: usize) -> bool {
        matches!(self.chars.get(i), Some((_, '\r' | '\n', _)))
    }

    /// End (exclusive) of the run of `wanted` characters that starts at `i`.
    fn run_end(&self, mut i: usize, wanted: CharClass) -> usize {
        while self.class(i) == Some(wanted) {
            i += 1;
        }
        i
    }

    /// End (exclusive) of the piece that starts at `i`: where the first regex alternative that matches
    /// there stops.
    fn piece_end(&self, i: usize) -> usize {
        let n = self.chars.len();
        let lower = |j: usize| self.chars.get(j).map(|&(_, c, _)| c.to_ascii_lowercase());

        // '(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])
        if self.chars[i].1 == '\'' {
            if matches!(lower(i + 1), Some('s' | 'd' | 'm' | 't')) {
                return i + 2;
            }
            if matches!((lower(i + 1), lower(i + 2)), (Some('l'), Some('l')) | (Some('v'), Some('e')) | (Some('r'), Some('e'))) {
                return i + 3;
            }
        }

        // [^\r\n\p{L}\p{N}]?\p{L}+ : a run of letters, with at most one leading character that is
        // neither a number nor a newline.
        let class = self.chars[i].2;
        if class == CharClass::Letter {
            return self.run_end(i, CharClass::Letter);
        }
        if class != CharClass::Number && !self.is_newline(i) && self.class(i + 1) == Some(CharClass::Letter) {
            return self.run_end(i + 1, CharClass::Letter);
        }

        // \p{N} : digits one at a time.
        if class == CharClass::Number {
            return i + 1;
        }

        // ` ?[^\s\p{L}\p{N}]+[\r\n]*` : a run of "other" characters, with at most one leading space
        // and all the newlines right after it.
        let others_from = if self.chars[i].1 == ' ' && self.class(i + 1) == Some(CharClass::Other) { i + 1 } else { i };
        if self.class(others_from) == Some(CharClass::Other) {
            let mut end = self.run_end(others_from, CharClass::Other);
            while self.is_newline(end) {
                end += 1;
            }
            return end;
        }

        // Only whitespace is left: `i` starts a run of `\s`.
        let space_end = self.run_end(i, CharClass::Space);
        // \s*[\r\n] : backtracks to the run's last newline.
        if let Some(last_newline) = (i..space_end).rev().find(|&j| self.is_newline(j)) {
            return last_newline + 1;
        }
        // \s+(?!\S) : the whole run at the end of the text, else all of it but its last character...
        if space_end == n {
            return n;
        }
        if space_end - i >= 2 {
            return space_end - 1;
        }
        // \s+ : ...or, when that would leave nothing, the single whitespace character.
        space_end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<&str> {
        let pieces = split_bailing(text);
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| !p.is_empty()));
        pieces
    }

    #[test]
    fn empty_text_has_no_pieces() {
        assert!(split("").is_empty());
    }

    #[test]
    fn contractions() {
        assert_eq!(split("I'll go."), ["I", "'ll", " go", "."]);
        assert_eq!(split("DON'T"), ["DON", "'T"]);
        assert_eq!(split("y'all'd've"), ["y", "'all", "'d", "'ve"]);
        assert_eq!(split("x'Re"), ["x", "'Re"]);
        assert_eq!(split("''"), ["''"]);
        assert_eq!(split(" 's"), [" '", "s"]);
        assert_eq!(split("it\u{2019}s"), ["it", "\u{2019}s"]);
        assert_eq!(split("'"), ["'"]);
    }

    #[test]
    fn digits_split_one_by_one() {
        assert_eq!(split("1234"), ["1", "2", "3", "4"]);
        assert_eq!(split("$100.50"), ["$", "1", "0", "0", ".", "5", "0"]);
        assert_eq!(split("a1b2"), ["a", "1", "b", "2"]);
        assert_eq!(split("²½٣"), ["²", "½", "٣"]);
        assert_eq!(split(" 7"), [" ", "7"]);
    }

    #[test]
    fn newlines_and_whitespace_runs() {
        assert_eq!(split("a\r\nb"), ["a", "\r\n", "b"]);
        assert_eq!(split("  \n  x"), ["  \n", " ", " x"]);
        assert_eq!(split("a    b"), ["a", "   ", " b"]);
        assert_eq!(split("trailing  "), ["trailing", "  "]);
        assert_eq!(split("a\t\tb"), ["a", "\t", "\tb"]);
        assert_eq!(split(" \t \n"), [" \t \n"]);
        assert_eq!(split("!\n\n x"), ["!\n\n", " x"]);
        assert_eq!(split("\n\n\n\nX"), ["\n\n\n\n", "X"]);
        assert_eq!(split(" ?!"), [" ?!"]);
        assert_eq!(split("\t!"), ["\t", "!"]);
        assert_eq!(split("x \u{A0} y"), ["x", " \u{A0}", " y"]);
    }

    #[test]
    fn non_ascii_whitespace_and_format_characters() {
        // U+0085 and U+00A0 are whitespace to llama.cpp (collapsed to \v), so they may prefix a word.
        assert_eq!(split("a\u{85}b"), ["a", "\u{85}b"]);
        assert_eq!(split("a\u{A0}b"), ["a", "\u{A0}b"]);
        assert_eq!(split("\u{3000}\u{3000}"), ["\u{3000}\u{3000}"]);
        assert_eq!(split("a\u{2028}\u{2028}b"), ["a", "\u{2028}", "\u{2028}b"]);
        // U+FEFF and U+200B are format characters, not whitespace.
        assert_eq!(split("\u{FEFF}BOM"), ["\u{FEFF}BOM"]);
        assert_eq!(split("a\u{200B}\u{200B}b"), ["a", "\u{200B}\u{200B}", "b"]);
    }

    #[test]
    fn marks_emoji_and_cjk() {
        // A combining mark is not a letter: it ends the word.
        assert_eq!(split("cafe\u{301}"), ["cafe", "\u{301}"]);
        assert_eq!(split("e\u{301}x"), ["e", "\u{301}x"]);
        assert_eq!(split("नमस्ते"), ["नमस", "्त", "े"]);
        assert_eq!(split("a😀b"), ["a", "😀b"]);
        assert_eq!(split("😀 😀"), ["😀", " 😀"]);
        assert_eq!(split("👨\u{200D}👩"), ["👨\u{200D}👩"]);
        assert_eq!(split("你好，世界！"), ["你好", "，世界", "！"]);
        assert_eq!(split("混合 mixed"), ["混合", " mixed"]);
        assert_eq!(split("Ⅻ"), ["Ⅻ"]);
    }
}
