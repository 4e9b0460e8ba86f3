//! Text to token ids and back: a model folder's `tokenizer.json` (the `tokenizers` crate), or the
//! byte-level tokenizer of the built-in tiny model (ids 0..=255 are the bytes).

use std::path::Path;

/// How a model turns text into ids.
pub enum Tokenizer {
    /// A Hugging Face `tokenizer.json`.
    Hf(Box<tokenizers::Tokenizer>),
    /// One id per byte (the tiny model): any text round-trips through ids 0..=255.
    Bytes,
    /// No tokenizer: prompts must be given as ids.
    None { reason: String },
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Hf(_) => f.write_str("Tokenizer::Hf"),
            Tokenizer::Bytes => f.write_str("Tokenizer::Bytes"),
            Tokenizer::None { reason } => write!(f, "Tokenizer::None({reason})"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: cannot load the tokenizer: {message}")]
    Load { path: String, message: String },
    #[error("cannot tokenize text: {0}")]
    Encode(String),
    #[error("this model has no tokenizer ({0}); give the prompt as ids with --prompt-ids 1,2,3")]
    Missing(String),
}

impl Tokenizer {
    /// `tokenizer.json` in `dir`, or [`Tokenizer::None`] when the folder has none.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Ok(Tokenizer::None {
                reason: format!("{} has no tokenizer.json", dir.display()),
            });
        }
        tokenizers::Tokenizer::from_file(&path)
            .map(|t| Tokenizer::Hf(Box::new(t)))
            .map_err(|e| TokenizerError::Load {
                path: path.display().to_string(),
                message: e.to_string(),
            })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match self {
            Tokenizer::Hf(t) => t
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizerError::Encode(e.to_string())),
            Tokenizer::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::None { reason } => Err(TokenizerError::Missing(reason.clone())),
        }
    }

    /// Text for `ids`; ids a tokenizer cannot show are written as `<id>`.
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            Tokenizer::Hf(t) => t
                .decode(ids, false)
                .unwrap_or_else(|_| ids.iter().map(|i| format!("<{i}>")).collect()),
            Tokenizer::Bytes => {
                let mut out = String::new();
                let mut bytes = Vec::new();
                for &id in ids {
                    if id < 256 {
                        bytes.push(id as u8);
                    } else {
                        push_bytes(&mut out, &bytes);
                        bytes.clear();
                        out.push_str(&format!("<{id}>"));
                    }
                }
                push_bytes(&mut out, &bytes);
                out
            }
            Tokenizer::None { .. } => ids.iter().map(|i| format!("<{i}>")).collect(),
        }
    }

    pub fn is_available(&self) -> bool {
        !matches!(self, Tokenizer::None { .. })
    }
}

/// Appends `bytes` as text: valid UTF-8 as it is, any other byte as `<0xNN>`.
fn push_bytes(out: &mut String, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                out.push_str(text);
                return;
            }
            Err(e) => {
                let (good, rest) = bytes.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                let bad = e.error_len().unwrap_or(rest.len()).max(1);
                for b in &rest[..bad] {
                    out.push_str(&format!("<0x{b:02X}>"));
                }
                bytes = &rest[bad..];
            }
        }
    }
}

/// The text of a growing token sequence, printed as it comes: [`TextStream::next`] takes the whole
/// sequence's decoded text after each token and gives what to print now. A character whose bytes
/// are split over tokens decodes to U+FFFD (Hugging Face byte-level decoders) or `<0xNN>` (the byte
/// tokenizer) until its last byte arrives; such a tail is held back rather than printed, so that
/// the finished character is printed once it is whole.
#[derive(Debug, Default)]
pub struct TextStream {
    shown: String,
}

impl TextStream {
    /// What `text` adds to what has been printed, its unfinished tail held back. Where `text` no
    /// longer starts with what was printed (a decoder that rewrites earlier text), the part after
    /// their common prefix is given again: text may repeat, none is lost.
    pub fn next(&mut self, text: &str) -> String {
        self.advance(stable_prefix(text))
    }

    /// The rest of `text`, tail included: call once the sequence is complete.
    pub fn finish(&mut self, text: &str) -> String {
        self.advance(text)
    }

    fn advance(&mut self, text: &str) -> String {
        let common = common_prefix(&self.shown, text);
        if common == text.len() {
            // Nothing past what was printed (the tail held back may be shorter than before).
            return String::new();
        }
        let new = text[common..].to_string();
        self.shown = text.to_string();
        new
    }
}

/// `text` without a trailing run of U+FFFD characters or `<0xNN>` byte marks.
fn stable_prefix(text: &str) -> &str {
    let mut end = text;
    loop {
        if let Some(rest) = end.strip_suffix('\u{FFFD}') {
            end = rest;
        } else if end.len() >= 6
            && end.is_char_boundary(end.len() - 6)
            && is_byte_mark(&end[end.len() - 6..])
        {
            end = &end[..end.len() - 6];
        } else {
            return end;
        }
    }
}

fn is_byte_mark(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 6
        && s.starts_with("<0x")
        && b[5] == b'>'
        && b[3].is_ascii_hexdigit()
        && b[4].is_ascii_hexdigit()
}

/// The length in bytes of the longest common prefix of `a` and `b` that ends on a char boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_missing_tokenizer_says_what_to_do() {
        let t = Tokenizer::Bytes;
        let ids = t.encode("héllo").unwrap();
        assert_eq!(ids.len(), 6);
        assert_eq!(t.decode(&ids), "héllo");
        assert_eq!(t.decode(&[104, 300, 105]), "h<300>i");
        assert_eq!(t.decode(&[104, 0xff, 105]), "h<0xFF>i");
        let none = Tokenizer::None {
            reason: "x has no tokenizer.json".into(),
        };
        let err = none.encode("hi").unwrap_err().to_string();
        assert!(err.contains("--prompt-ids"), "{err}");
    }

    #[test]
    fn a_character_split_over_tokens_is_printed_once_whole_and_nothing_after_it_is_lost() {
        // "é" is 0xC3 0xA9, "中" is 0xE4 0xB8 0xAD: each byte one token of the byte tokenizer.
        let t = Tokenizer::Bytes;
        let ids = t.encode("a中é b").unwrap();
        let mut stream = TextStream::default();
        let mut printed = Vec::new();
        for n in 1..=ids.len() {
            printed.push(stream.next(&t.decode(&ids[..n])));
        }
        assert_eq!(printed, ["a", "", "", "中", "", "é", " ", "b"]);
        assert_eq!(stream.finish(&t.decode(&ids)), "");

        // Hugging Face byte-level decoders show an unfinished character as U+FFFD.
        let mut stream = TextStream::default();
        assert_eq!(stream.next("x"), "x");
        assert_eq!(stream.next("x\u{FFFD}"), "");
        assert_eq!(stream.next("x\u{FFFD}\u{FFFD}"), "");
        assert_eq!(stream.next("x中"), "中");
        assert_eq!(stream.next("x中y"), "y");
        // A tail still unfinished when the sequence ends is printed as it decodes.
        assert_eq!(stream.next("x中y<0xE4>"), "");
        assert_eq!(stream.finish("x中y<0xE4>"), "<0xE4>");
    }

    #[test]
    fn a_decoder_that_rewrites_earlier_text_repeats_from_where_it_differs() {
        let mut stream = TextStream::default();
        assert_eq!(stream.next("ab c"), "ab c");
        assert_eq!(stream.next("ab  cd"), " cd");
        assert_eq!(stream.next("ab  cde"), "e");
        assert_eq!(common_prefix("中a", "中b"), "中".len());
        assert_eq!(stable_prefix("<0x"), "<0x");
        assert_eq!(stable_prefix("é<0xC3><0xA9>"), "é");
    }
}
