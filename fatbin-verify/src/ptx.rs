//! PTX text: `.version`, `.target`, `.address_size` and kernel entries (docs/fatbin-format.md
//! section 3). Comments and string literals are skipped so a `//` inside a `.file` path or an
//! `.entry` inside a comment cannot fool the reader.

use crate::target::{Target, Variant};

/// What the PTX header and entry directives say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PtxInfo {
    /// ISA version `(major, minor)` from `.version X.Y`.
    pub version: Option<(u32, u32)>,
    /// `compute_NN[a|f]` from `.target sm_NN[a|f]`.
    pub target: Option<Target>,
    /// `.target ..., debug`.
    pub debug: bool,
    pub address_size: Option<u32>,
    /// Kernel entry points (`.entry NAME(`) in order; `.extern` declarations left out.
    pub entries: Vec<String>,
}

/// The stable identity of a PTX image: its bytes up to the first NUL (what `cuobjdump -xptx` writes).
pub fn ptx_identity(bytes: &[u8]) -> &[u8] {
    crate::read::until_nul(bytes)
}

/// Whether the bytes read as PTX text: the first directive outside comments is `.version`.
pub fn looks_like_ptx(bytes: &[u8]) -> bool {
    Tokens::new(ptx_identity(bytes)).next() == Some(b".version".as_slice())
}

/// Reads the header directives and entries. Never fails: missing pieces are `None`/empty.
pub fn parse_ptx(bytes: &[u8]) -> PtxInfo {
    let mut info = PtxInfo::default();
    let mut tokens = Tokens::new(ptx_identity(bytes)).peekable();
    // Linkage directives seen since the last statement boundary, to drop `.extern .entry`.
    let mut saw_extern = false;
    while let Some(tok) = tokens.next() {
        match tok {
            b".version" => info.version = tokens.next().and_then(parse_version),
            b".target" => {
                let mut first = true;
                while let Some(&t) = tokens.peek() {
                    if t == b"," {
                        tokens.next();
                        continue;
                    }
                    if !first && !is_target_option(t) {
                        break;
                    }
                    tokens.next();
                    if first {
                        info.target = parse_target(t);
                        first = false;
                    } else if t == b"debug" {
                        info.debug = true;
                    }
                }
            }
            b".address_size" => {
                info.address_size = tokens
                    .next()
                    .and_then(|t| std::str::from_utf8(t).ok()?.parse().ok())
            }
            b".extern" => saw_extern = true,
            b".entry" => {
                if let Some(name) = tokens.next() {
                    if !saw_extern {
                        info.entries
                            .push(String::from_utf8_lossy(name).into_owned());
                    }
                }
                saw_extern = false;
            }
            b";" | b"{" | b"}" => saw_extern = false,
            _ => {}
        }
    }
    info
}

fn is_target_option(t: &[u8]) -> bool {
    matches!(
        t,
        b"debug" | b"texmode_unified" | b"texmode_independent" | b"map_f64_to_f32"
    ) || t.starts_with(b"sm_")
}

fn parse_version(tok: &[u8]) -> Option<(u32, u32)> {
    let text = std::str::from_utf8(tok).ok()?;
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `sm_80` -> `compute_80`: PTX is virtual-architecture code whatever its `.target` spells.
fn parse_target(tok: &[u8]) -> Option<Target> {
    let text = std::str::from_utf8(tok).ok()?;
    let sass: Target = text.parse().ok()?;
    let variant: Variant = sass.variant;
    Some(Target::ptx(sass.sm).with_variant(variant))
}

/// Splits PTX into word tokens (`.entry`, `sm_80`, `9.0`, `%r1`) and single punctuation bytes,
/// skipping whitespace, `//` and `/* */` comments and `"..."` strings.
struct Tokens<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a [u8]) -> Self {
        Tokens { text, at: 0 }
    }

    fn byte(&self, i: usize) -> Option<u8> {
        self.text.get(i).copied()
    }

    fn skip_to(&mut self, needle: &[u8]) {
        let rest = self.text.get(self.at..).unwrap_or_default();
        self.at = match rest.windows(needle.len()).position(|w| w == needle) {
            Some(p) => self.at + p + needle.len(),
            None => self.text.len(),
        };
    }
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$' | b'%')
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            let b = self.byte(self.at)?;
            match (b, self.byte(self.at + 1)) {
                (b'/', Some(b'/')) => self.skip_to(b"\n"),
                (b'/', Some(b'*')) => {
                    self.at += 2;
                    self.skip_to(b"*/");
                }
                (b'"', _) => {
                    self.at += 1;
                    self.skip_to(b"\"");
                }
                _ if b.is_ascii_whitespace() => self.at += 1,
                _ if is_word_byte(b) => {
                    let start = self.at;
                    while self.byte(self.at).is_some_and(is_word_byte) {
                        self.at += 1;
                    }
                    return self.text.get(start..self.at);
                }
                _ => {
                    self.at += 1;
                    return self.text.get(self.at - 1..self.at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &[u8] = b"//\n// Generated by NVIDIA NVVM Compiler\n// .entry fake(\n.version 9.0\n.target sm_90a, debug\n.address_size 64\n\n.file 1 \"/tmp//x.cu\"\n/* .entry also_fake( */\n.extern .entry declared(\n.param .u64 p\n);\n.visible .entry add_one(\n.param .u64 add_one_param_0\n)\n{\nret;\n}\n.entry scale(\n)\n{\nret;\n}\n\0garbage .entry after_nul(";

    #[test]
    fn reads_header_and_entries_ignoring_comments() {
        let info = parse_ptx(SAMPLE);
        assert_eq!(info.version, Some((9, 0)));
        assert_eq!(info.target, Some("compute_90a".parse().unwrap()));
        assert!(info.debug);
        assert_eq!(info.address_size, Some(64));
        assert_eq!(
            info.entries,
            vec!["add_one".to_string(), "scale".to_string()]
        );
    }

    #[test]
    fn identity_stops_at_nul_and_detection_needs_version_first() {
        assert!(ptx_identity(SAMPLE).ends_with(b"}\n"));
        assert!(looks_like_ptx(SAMPLE));
        assert!(!looks_like_ptx(b".target sm_80\n.version 9.0"));
        assert!(!looks_like_ptx(b"\x7fELF"));
        assert!(!looks_like_ptx(b""));
    }

    #[test]
    fn tolerates_garbage_and_unterminated_comments() {
        let info = parse_ptx(b".version x.y .target sm_ /* never closed .entry k(");
        assert_eq!(
            info,
            PtxInfo {
                version: None,
                target: None,
                ..PtxInfo::default()
            }
        );
        assert_eq!(
            parse_ptx(b".version 8.5 .target sm_80 \"unterminated").version,
            Some((8, 5))
        );
    }
}
