//! `lingtab tokenize` and `lingtab detokenize`: the model's own tokenizer (from part 1's `tokenizer.ggml.*`
//! keys) on text, as llama.cpp's `llama_tokenize(add_special = false)` / `llama_detokenize`.

use crate::cli::inspect::open_model;
use crate::model::Tokenizer;
use std::io::Write;
use std::path::Path;

/// Where `tokenize` takes its text from.
pub enum TextInput<'a> {
    /// The text itself (one JSON array of ids out).
    Text(&'a str),
    /// A file, read as raw bytes that must be UTF-8 (one JSON array of ids out).
    File(&'a Path),
    /// A file holding one JSON array of strings (one line with a JSON array of ids out per string).
    Batch(&'a Path),
}

fn load(gguf: &Path) -> Result<Tokenizer, String> {
    let model = open_model(gguf)?;
    Tokenizer::from_header(model.header()).map_err(|e| format!("{}: {e}", gguf.display()))
}

fn ids_json(ids: &[u32]) -> String {
    serde_json::to_string(ids).unwrap()
}

fn read_batch<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<Vec<T>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: expected one JSON array of {what}: {e}", path.display()))
}

pub fn tokenize(gguf: &Path, input: TextInput, parse_special: bool) -> Result<(), String> {
    // Read the input first: a bad input file is reported without loading the model.
    let texts: Vec<String> = match input {
        TextInput::Text(text) => vec![text.to_string()],
        TextInput::File(path) => {
            let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let text = String::from_utf8(bytes).map_err(|e| {
                format!("{}: not valid UTF-8 (first bad byte at offset {})", path.display(), e.utf8_error().valid_up_to())
            })?;
            vec![text]
        }
        TextInput::Batch(path) => read_batch(path, "strings")?,
    };
    let tokenizer = load(gguf)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for text in &texts {
        writeln!(out, "{}", ids_json(&tokenizer.encode(text, parse_special))).map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())
}

/// Parses a JSON array of token ids.
fn parse_ids(json: &str) -> Result<Vec<u32>, String> {
    serde_json::from_str(json).map_err(|e| format!("--ids: expected a JSON array of token ids: {e}"))
}

fn check_ids(tokenizer: &Tokenizer, ids: &[u32]) -> Result<(), String> {
    match ids.iter().find(|&&id| id as usize >= tokenizer.vocab_size()) {
        Some(id) => Err(format!("token id {id} is outside the vocabulary of {} tokens", tokenizer.vocab_size())),
        None => Ok(()),
    }
}

/// `ids`: a JSON array of ids (the decoded bytes are written to stdout as they are), or `batch`: a file
/// holding a JSON array of such arrays (one line of lowercase hex per array, since a decoded sequence
/// need not be UTF-8).
pub fn detokenize(gguf: &Path, ids: Option<&str>, batch: Option<&Path>) -> Result<(), String> {
    let (sequences, as_hex) = match (ids, batch) {
        (Some(ids), None) => (vec![parse_ids(ids)?], false),
        (None, Some(path)) => (read_batch::<Vec<u32>>(path, "arrays of token ids")?, true),
        _ => return Err("give exactly one of --ids and --batch".into()),
    };
    let tokenizer = load(gguf)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for ids in &sequences {
        check_ids(&tokenizer, ids)?;
        let bytes = tokenizer.decode(ids);
        let written = if as_hex {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            writeln!(out, "{hex}")
        } else {
            out.write_all(&bytes)
        };
        written.map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())
}
