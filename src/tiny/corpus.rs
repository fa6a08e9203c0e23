//! The text the tiny model's BPE vocabulary is learned from (sources in `corpus/README.md`): English prose
//! and licence texts, source code, many scripts and emoji, and chat transcripts with special tokens.

pub const CORPUS: &[&str] = &[
    include_str!("corpus/prose.txt"),
    include_str!("corpus/apache-2.0.txt"),
    include_str!("corpus/mpl-2.0.txt"),
    include_str!("corpus/cc0-1.0.txt"),
    include_str!("corpus/code.txt"),
    include_str!("corpus/multilingual.txt"),
    include_str!("corpus/chat.txt"),
];
