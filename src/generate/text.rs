//! From token bytes to text, incrementally (work per token proportional to the token, not the reply):
//! [`Utf8Decoder`] (holds back an incomplete trailing character), [`StopMatcher`] (holds back what could
//! start a stop string, cuts exactly before one) and [`ReasoningSplitter`] (`<think>` … `</think>`).

/// Bytes in, valid UTF-8 text out. An incomplete sequence at the end is held until later bytes complete it;
/// bytes that can no longer become valid become U+FFFD (one per maximal invalid part, as
/// `String::from_utf8_lossy`).
#[derive(Default, Debug)]
pub struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    pub fn new() -> Utf8Decoder {
        Utf8Decoder::default()
    }

    /// Appends to `out` the text that `bytes` complete.
    pub fn push(&mut self, bytes: &[u8], out: &mut String) {
        let buf: Vec<u8>;
        let mut rest: &[u8] = if self.pending.is_empty() {
            bytes
        } else {
            let mut b = std::mem::take(&mut self.pending);
            b.extend_from_slice(bytes);
            buf = b;
            &buf
        };
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    return;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).expect("valid prefix"));
                    match e.error_len() {
                        None => {
                            self.pending = after.to_vec();
                            return;
                        }
                        Some(len) => {
                            out.push('\u{FFFD}');
                            rest = &after[len..];
                        }
                    }
                }
            }
        }
    }

    /// Whether an incomplete character is held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// At the end of the stream: a held incomplete character becomes U+FFFD.
    pub fn finish(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            self.pending.clear();
            out.push('\u{FFFD}');
        }
    }
}

/// Cuts a text stream exactly before the first occurrence of any stop string. Text that could be the start
/// of a stop string is held back until it is known not to be one, so no part of a stop string is ever emitted.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Appends to `out` what of `text` is safe to show; true when a stop string was found (`out` then ends
    /// exactly before it, and the rest is dropped).
    pub fn push(&mut self, text: &str, out: &mut String) -> bool {
        if self.stops.is_empty() {
            out.push_str(text);
            return false;
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        // `held` is shorter than the longest stop string, so this scan is proportional to `text`
        if let Some(at) = self.stops.iter().filter_map(|s| buf.find(s.as_str())).min() {
            out.push_str(&buf[..at]);
            return true;
        }
        let hold = self
            .stops
            .iter()
            .map(|s| (1..s.len()).rev().find(|&k| s.is_char_boundary(k) && buf.ends_with(&s[..k])).unwrap_or(0))
            .max()
            .unwrap_or(0);
        let cut = buf.len() - hold;
        out.push_str(&buf[..cut]);
        self.held = buf[cut..].to_string();
        false
    }

    /// At the end of the stream: what was held back was no stop string after all.
    pub fn finish(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
    }
}

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// Splits generated text into reasoning (before `</think>`) and answer (after it). Line breaks at the start
/// of either part and at the end of the reasoning are dropped (the chat template trims them too).
#[derive(Debug)]
pub struct ReasoningSplitter {
    in_reasoning: bool,
    /// Reasoning text held back: trailing line breaks and a possible start of `</think>`.
    held: String,
    /// Nothing of the current part emitted yet (leading line breaks are dropped).
    at_start: bool,
}

impl ReasoningSplitter {
    /// `in_reasoning`: the prompt opened `<think>` without closing it.
    pub fn new(in_reasoning: bool) -> ReasoningSplitter {
        ReasoningSplitter { in_reasoning, held: String::new(), at_start: true }
    }

    /// Whether the prompt's text leaves generation inside the reasoning (an unclosed `<think>`).
    pub fn starts_in_reasoning(prompt_tail: &str) -> bool {
        match (prompt_tail.rfind(THINK_OPEN), prompt_tail.rfind(THINK_CLOSE)) {
            (Some(open), Some(close)) => open > close,
            (Some(_), None) => true,
            _ => false,
        }
    }

    pub fn in_reasoning(&self) -> bool {
        self.in_reasoning
    }

    /// Appends `text`'s reasoning and answer parts to `reasoning` and `answer`.
    pub fn push(&mut self, text: &str, reasoning: &mut String, answer: &mut String) {
        if !self.in_reasoning {
            self.push_part(text, answer);
            return;
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        if let Some(at) = buf.find(THINK_CLOSE) {
            self.push_part(buf[..at].trim_end_matches('\n'), reasoning);
            self.in_reasoning = false;
            self.at_start = true;
            self.push_part(&buf[at + THINK_CLOSE.len()..], answer);
            return;
        }
        let partial = (1..THINK_CLOSE.len()).rev().find(|&k| buf.ends_with(&THINK_CLOSE[..k])).unwrap_or(0);
        let cut = buf[..buf.len() - partial].trim_end_matches('\n').len();
        self.push_part(&buf[..cut], reasoning);
        self.held = buf[cut..].to_string();
    }

    fn push_part(&mut self, mut text: &str, out: &mut String) {
        if self.at_start {
            text = text.trim_start_matches('\n');
            if text.is_empty() {
                return;
            }
            self.at_start = false;
        }
        out.push_str(text);
    }

    /// At the end of the stream: held text that did not become `</think>` is reasoning (trailing line
    /// breaks dropped).
    pub fn finish(&mut self, reasoning: &mut String) {
        let held = std::mem::take(&mut self.held);
        self.push_part(held.trim_end_matches('\n'), reasoning);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(chunks: &[&[u8]]) -> Vec<String> {
        let mut d = Utf8Decoder::new();
        let mut outs: Vec<String> = chunks
            .iter()
            .map(|c| {
                let mut s = String::new();
                d.push(c, &mut s);
                s
            })
            .collect();
        let mut tail = String::new();
        d.finish(&mut tail);
        outs.push(tail);
        outs
    }

    #[test]
    fn multibyte_characters_split_across_tokens_are_emitted_whole() {
        let e = "😀".as_bytes(); // 4 bytes
        assert_eq!(decode_all(&[b"a", &e[..1], &e[1..], b"b"]), ["a", "", "😀", "b", ""]);
        assert_eq!(decode_all(&[&e[..2], &e[2..]]), ["", "😀", ""]);
        assert_eq!(decode_all(&[&e[..1], &e[1..2], &e[2..3], &e[3..]]), ["", "", "", "😀", ""]);
        let mut joined = [b"x".as_slice(), &e[..3]].concat();
        joined.extend_from_slice(b"");
        assert_eq!(decode_all(&[&joined, &[e[3], 0xC3], &[0xA9]]), ["x", "😀", "é", ""]);
        // every split of a mixed text gives back the text, and no output is ever a broken character
        let text = "héllo 😀 wörld 中文 🇩🇪";
        let b = text.as_bytes();
        for i in 0..b.len() {
            for j in i..b.len() {
                let outs = decode_all(&[&b[..i], &b[i..j], &b[j..]]);
                assert_eq!(outs.concat(), text);
                assert!(outs.iter().all(|o| !o.contains('\u{FFFD}')));
            }
        }
    }

    #[test]
    fn invalid_bytes_become_replacement_only_when_they_cannot_complete() {
        // a lone continuation byte is invalid at once
        assert_eq!(decode_all(&[b"a\x80b"]), ["a\u{FFFD}b", ""]);
        // a lead byte followed by a non-continuation: invalid once the next byte arrives
        assert_eq!(decode_all(&[b"\xE2", b"x"]), ["", "\u{FFFD}x", ""]);
        assert_eq!(decode_all(&[b"\xE2\x82", b"\xAC"]), ["", "€", ""]);
        // an unfinished character at the end of the stream
        assert_eq!(decode_all(&[b"ok\xF0\x9F"]), ["ok", "\u{FFFD}"]);
        let lossy = String::from_utf8_lossy(b"\xF0\x9F\x98x\xFF\xC3").to_string();
        assert_eq!(decode_all(&[b"\xF0\x9F", b"\x98x\xFF", b"\xC3"]).concat(), lossy);
    }

    fn stop_run(stops: &[&str], chunks: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut outs = Vec::new();
        for c in chunks {
            let mut s = String::new();
            let stopped = m.push(c, &mut s);
            outs.push(s);
            if stopped {
                return (outs, true);
            }
        }
        let mut s = String::new();
        m.finish(&mut s);
        outs.push(s);
        (outs, false)
    }

    #[test]
    fn stop_strings_split_across_tokens_are_cut_exactly_and_never_emitted() {
        assert_eq!(stop_run(&["STOP"], &["abc ST", "O", "P tail"]), (vec!["abc ".into(), "".into(), "".into()], true));
        assert_eq!(stop_run(&["STOP"], &["ST", "ART"]), (vec!["".into(), "START".into(), "".into()], false));
        assert_eq!(stop_run(&["\n\n"], &["a\n", "b\n", "\nc"]), (vec!["a".into(), "\nb".into(), "".into()], true));
        // earliest of several; a stop inside one token with text on both sides
        assert_eq!(stop_run(&["yz", "xy"], &["wxyz"]), (vec!["w".into()], true));
        assert_eq!(stop_run(&["end"], &["the end is"]), (vec!["the ".into()], true));
        // multi-byte stop strings hold back at character boundaries
        assert_eq!(stop_run(&["中文"], &["a中", "文b"]), (vec!["a".into(), "".into()], true));
        // every split of the text: the output is exactly the text before the stop, never a part of it
        let text = "Hello <|stop|> world";
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let (outs, stopped) = stop_run(&["<|stop|>"], &[&text[..i], &text[i..j], &text[j..]]);
                assert!(stopped);
                assert_eq!(outs.concat(), "Hello ");
                assert!(outs.iter().all(|o| !o.contains('<')));
            }
        }
    }

    fn split_run(in_reasoning: bool, chunks: &[&str]) -> (Vec<(String, String)>, String, String) {
        let mut sp = ReasoningSplitter::new(in_reasoning);
        let mut events = Vec::new();
        for c in chunks {
            let (mut r, mut a) = (String::new(), String::new());
            sp.push(c, &mut r, &mut a);
            events.push((r, a));
        }
        let mut r = String::new();
        sp.finish(&mut r);
        events.push((r, String::new()));
        let reasoning = events.iter().map(|e| e.0.as_str()).collect();
        let answer = events.iter().map(|e| e.1.as_str()).collect();
        (events, reasoning, answer)
    }

    #[test]
    fn reasoning_split_with_the_closing_tag_in_one_token_and_across_tokens() {
        let (ev, r, a) = split_run(true, &["\nthink", "ing\n", "</think>", "\n\nAnswer"]);
        assert_eq!((r.as_str(), a.as_str()), ("thinking", "Answer"));
        assert_eq!(ev[0], ("think".into(), "".into()));
        let (_, r, a) = split_run(true, &["a</think>b"]);
        assert_eq!((r.as_str(), a.as_str()), ("a", "b"));
        // every split of the raw text gives the same parts, and no part of the tag leaks
        let text = "\nstep 1\nstep 2\n</think>\nThe answer <is> 4";
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let (ev, r, a) = split_run(true, &[&text[..i], &text[i..j], &text[j..]]);
                assert_eq!(r, "step 1\nstep 2");
                assert_eq!(a, "The answer <is> 4");
                assert!(ev.iter().all(|e| !e.0.contains('<')));
            }
        }
        // not closed: everything is reasoning; a lone `</thi` at the end stays reasoning text
        let (_, r, a) = split_run(true, &["abc</thi"]);
        assert_eq!((r.as_str(), a.as_str()), ("abc</thi", ""));
        // generation that starts in the answer
        let (_, r, a) = split_run(false, &["\nHi", " </think> there"]);
        assert_eq!((r.as_str(), a.as_str()), ("", "Hi </think> there"));
        assert!(ReasoningSplitter::starts_in_reasoning("<role>ASSISTANT</role>\n<think>"));
        assert!(!ReasoningSplitter::starts_in_reasoning("<role>ASSISTANT</role>\n<think></think>"));
        assert!(!ReasoningSplitter::starts_in_reasoning("plain"));
    }
}
