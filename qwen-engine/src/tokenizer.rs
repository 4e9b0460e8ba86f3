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
}
