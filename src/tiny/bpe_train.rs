//! Byte-level BPE training for the tiny test model's vocabulary, and the GGUF vocabulary arrays made
//! from the learned merges.
//!
//! Training sees text the way the tokenizer will: split into pieces by the BAILINGMOE pre-tokenizer, each
//! piece a sequence of bytes. It then repeatedly merges the most frequent adjacent pair, counting each
//! distinct piece once per occurrence in the corpus; ties go to the pair of lowest symbol ids (bytes are
//! their own ids, merged symbols count up from 256 in the order they were learned), so the result depends
//! on nothing but the input. A pair whose merged string was already learned from another pair is skipped,
//! so that every merge adds exactly one token (`build_vocab` then has 256 + merges + specials tokens).
//!
//! Special-token texts in the corpus are trained as plain text. None of Ling's can become a token that
//! way: each spans several pre-tokenizer pieces (`<role>` is `<role` + `>`), and merges never cross pieces.

use crate::model::pretokenize::split_bailing;
use crate::model::tokenizer::byte_to_char;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

/// GGUF `token_type` of the learned tokens (llama.cpp's NORMAL; byte-level BPE has no BYTE tokens).
const NORMAL: i32 = 1;

/// Learns up to `n_merges` merges from `corpus` (fewer if the corpus runs out of pairs), each as (left,
/// right) in GPT-2-mapped characters, as in `tokenizer.ggml.merges`.
pub fn train_bpe(corpus: &[&str], n_merges: usize) -> Vec<(String, String)> {
    let mut piece_counts: HashMap<&str, i64> = HashMap::new();
    for text in corpus {
        for piece in split_bailing(text) {
            *piece_counts.entry(piece).or_insert(0) += 1;
        }
    }
    // Sorted, so that nothing below depends on hash order.
    let mut pieces: Vec<(&str, i64)> = piece_counts.into_iter().collect();
    pieces.sort_unstable();
    let counts: Vec<i64> = pieces.iter().map(|&(_, count)| count).collect();
    let mut words: Vec<Vec<u32>> = pieces.iter().map(|(piece, _)| piece.bytes().map(u32::from).collect()).collect();

    let mut pair_counts: HashMap<(u32, u32), i64> = HashMap::new();
    let mut pair_words: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
    for (index, word) in words.iter().enumerate() {
        for pair in word.windows(2).map(|w| (w[0], w[1])) {
            *pair_counts.entry(pair).or_insert(0) += counts[index];
            pair_words.entry(pair).or_default().push(index);
        }
    }
    // Max-heap on (count, lowest pair); entries whose count is outdated are skipped when popped.
    let mut queue: BinaryHeap<(i64, Reverse<(u32, u32)>)> =
        pair_counts.iter().map(|(&pair, &count)| (count, Reverse(pair))).collect();

    // Bytes of every symbol, and the symbol of every byte string.
    let mut symbol_bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut symbol_of: HashMap<Vec<u8>, u32> = (0..=255u8).map(|b| (vec![b], u32::from(b))).collect();
    let mut merges = Vec::with_capacity(n_merges);
    // Last merge step that touched each word, to visit a word listed twice only once.
    let mut visited_at = vec![usize::MAX; words.len()];

    while merges.len() < n_merges {
        let Some((count, Reverse(pair))) = queue.pop() else { break };
        if pair_counts.get(&pair) != Some(&count) {
            continue;
        }
        let (left, right) = pair;
        let merged_bytes = [symbol_bytes[left as usize].as_slice(), &symbol_bytes[right as usize]].concat();
        if symbol_of.contains_key(&merged_bytes) {
            continue;
        }
        let merged = symbol_bytes.len() as u32;
        symbol_of.insert(merged_bytes.clone(), merged);
        symbol_bytes.push(merged_bytes);
        merges.push((mapped(&symbol_bytes[left as usize]), mapped(&symbol_bytes[right as usize])));

        let step = merges.len();
        let mut deltas: HashMap<(u32, u32), i64> = HashMap::new();
        for index in pair_words.remove(&pair).unwrap_or_default() {
            if visited_at[index] == step {
                continue;
            }
            visited_at[index] = step;
            let old = &words[index];
            let mut new = Vec::with_capacity(old.len());
            let mut i = 0;
            while i < old.len() {
                if i + 1 < old.len() && (old[i], old[i + 1]) == pair {
                    new.push(merged);
                    i += 2;
                } else {
                    new.push(old[i]);
                    i += 1;
                }
            }
            if new.len() == old.len() {
                continue;
            }
            for p in old.windows(2) {
                *deltas.entry((p[0], p[1])).or_insert(0) -= counts[index];
            }
            for p in new.windows(2) {
                *deltas.entry((p[0], p[1])).or_insert(0) += counts[index];
                if p[0] == merged || p[1] == merged {
                    pair_words.entry((p[0], p[1])).or_default().push(index);
                }
            }
            words[index] = new;
        }
        let mut changed: Vec<((u32, u32), i64)> = deltas.into_iter().filter(|&(_, d)| d != 0).collect();
        changed.sort_unstable();
        for (p, delta) in changed {
            let count = pair_counts.entry(p).or_insert(0);
            *count += delta;
            if *count > 0 {
                queue.push((*count, Reverse(p)));
            } else {
                pair_counts.remove(&p);
            }
        }
    }
    merges
}

/// The GGUF vocabulary arrays for `merges`: `tokens` (ids 0..256 the byte characters in byte order,
/// then each merge result not seen before, in merge order, then `specials` with their given token
/// types), `token_types` and the merges as "left right" strings. Every merge result is a token, and so
/// is every byte (the newline "Ċ" included, which llama.cpp looks for).
pub fn build_vocab(merges: &[(String, String)], specials: &[(&str, i32)]) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let mut known: HashSet<String> = tokens.iter().cloned().collect();
    for (left, right) in merges {
        let merged = format!("{left}{right}");
        if known.insert(merged.clone()) {
            tokens.push(merged);
        }
    }
    let mut token_types = vec![NORMAL; tokens.len()];
    for &(text, token_type) in specials {
        tokens.push(text.to_string());
        token_types.push(token_type);
    }
    let merge_strings = merges.iter().map(|(left, right)| format!("{left} {right}")).collect();
    (tokens, token_types, merge_strings)
}

/// The GPT-2-mapped text of a byte string.
fn mapped(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tokenizer::{SpecialIds, Tokenizer};
    use crate::tiny::corpus::CORPUS;

    const CONTROL: i32 = 3;
    const USER_DEFINED: i32 = 4;
    const SPECIALS: &[(&str, i32)] = &[
        ("<|startoftext|>", CONTROL),
        ("<|endoftext|>", CONTROL),
        ("[CLS]", CONTROL),
        ("[gMASK]", CONTROL),
        ("<|role_end|>", CONTROL),
        ("<role>", CONTROL),
        ("</role>", CONTROL),
        ("<think>", USER_DEFINED),
        ("</think>", USER_DEFINED),
        ("<tool_call>", USER_DEFINED),
        ("</tool_call>", USER_DEFINED),
        ("<tool_response>", USER_DEFINED),
        ("</tool_response>", USER_DEFINED),
        ("<arg_key>", USER_DEFINED),
        ("</arg_key>", USER_DEFINED),
        ("<arg_value>", USER_DEFINED),
        ("</arg_value>", USER_DEFINED),
        ("<|reserved_token_0|>", CONTROL),
    ];

    fn pairs(merges: &[(&str, &str)]) -> Vec<(String, String)> {
        merges.iter().map(|&(l, r)| (l.to_string(), r.to_string())).collect()
    }

    #[test]
    fn learns_the_most_frequent_pair_first() {
        // Pieces "ab", " ab" x2, " abc" x2: a+b occurs 5 times, then Ġ+ab 4 times, then Ġab+c twice.
        assert_eq!(train_bpe(&["ab ab ab abc abc"], 10), pairs(&[("a", "b"), ("Ġ", "ab"), ("Ġab", "c")]));
    }

    #[test]
    fn ties_go_to_the_lowest_symbol_ids() {
        // All pairs occur once: (space, z) has the lowest ids, then (x, y), then the new symbol's pair.
        assert_eq!(train_bpe(&["xy zw"], 10), pairs(&[("Ġ", "z"), ("x", "y"), ("Ġz", "w")]));
    }

    #[test]
    fn overlapping_pairs_merge_left_to_right() {
        // "aaa" holds the pair (a, a) twice but merges once, into "aa" + "a"; then aa+a.
        assert_eq!(train_bpe(&["aaa"], 10), pairs(&[("a", "a"), ("aa", "a")]));
    }

    #[test]
    fn build_vocab_adds_each_string_once() {
        let merges = pairs(&[("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]);
        let (tokens, types, merge_strings) = build_vocab(&merges, &[("<s>", CONTROL)]);
        assert_eq!(&tokens[256..], ["ab", "bc", "abc", "<s>"]);
        assert_eq!(&types[256..], [1, 1, 1, CONTROL]);
        assert_eq!(merge_strings, ["a b", "b c", "ab c", "a bc"]);
    }

    #[test]
    fn stops_when_the_corpus_runs_out_of_pairs() {
        assert_eq!(train_bpe(&["ab", "a"], 10), pairs(&[("a", "b")]));
        assert!(train_bpe(&[], 10).is_empty());
        assert!(train_bpe(&["abc"], 0).is_empty());
    }

    #[test]
    fn corpus_training_is_deterministic_and_round_trips() {
        let merges = train_bpe(CORPUS, 3308);
        assert_eq!(merges.len(), 3308);
        assert_eq!(merges, train_bpe(CORPUS, 3308));

        let (tokens, token_types, merge_strings) = build_vocab(&merges, SPECIALS);
        assert_eq!(tokens.len(), 256 + merges.len() + SPECIALS.len(), "every merge adds one token");
        assert_eq!(tokens.len(), token_types.len());
        let texts: HashSet<&str> = tokens.iter().map(String::as_str).collect();
        assert_eq!(texts.len(), tokens.len(), "token texts must be unique");
        for (left, right) in &merges {
            for text in [left.clone(), right.clone(), format!("{left}{right}")] {
                assert!(texts.contains(text.as_str()), "{text:?} is not a token");
            }
        }
        assert!(texts.contains("Ċ"), "llama.cpp needs a newline token");

        let specials = SpecialIds { bos: Some(tokens.len() as u32 - SPECIALS.len() as u32), ..SpecialIds::default() };
        let tokenizer = Tokenizer::new(tokens, token_types, merge_strings, specials).unwrap();
        let mut total_bytes = 0;
        let mut total_tokens = 0;
        for text in CORPUS {
            let ids = tokenizer.encode(text, true);
            assert_eq!(tokenizer.decode(&ids), text.as_bytes());
            total_bytes += text.len();
            total_tokens += ids.len();
        }
        // A vocabulary learned from this very text compresses it well.
        assert!(total_tokens * 3 < total_bytes, "{total_tokens} tokens for {total_bytes} bytes");
        let chat = "<role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>\n<think></think>";
        let ids = tokenizer.encode(chat, true);
        assert_eq!(ids[0], tokenizer.token_id("<role>").unwrap());
        assert!(ids.contains(&tokenizer.token_id("<think>").unwrap()));
    }
}
