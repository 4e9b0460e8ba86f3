//! Fatbin containers and their entries (layout: docs/fatbin-format.md section 1), and the two
//! facts an entry header gives every image: its kind and its compression.
//!
//! A container is a 16-byte header plus a run of entries; an entry is a header of at least
//! 0x40 bytes plus a padded payload. Nothing here copies the input: entries borrow their
//! payload, and only decompression allocates.

use std::borrow::Cow;

use serde::Serialize;

use crate::decompress::{self, Budget};
use crate::error::Error;
use crate::read::{bytes_at, offset_add, u16_at, u32_at, u64_at};
use crate::target::{Target, Variant};

/// First four bytes of every container (`50 ed 55 ba` in the file).
pub const CONTAINER_MAGIC: u32 = 0xBA55_ED50;
/// The only container version NVIDIA's tools write.
pub const CONTAINER_VERSION: u16 = 1;
/// Size of the container header.
pub const CONTAINER_HEADER_LEN: usize = 0x10;
/// The fields this parser reads end at 0x40; real headers are 0x40 to 0x80 bytes.
pub const ENTRY_HEADER_MIN: u32 = 0x40;

/// The 8 bytes a container starts with: magic, version 1, header size 0x10. Requiring all
/// three makes a false match in random data vanishingly unlikely when scanning host binaries.
pub const CONTAINER_SIGNATURE: [u8; 8] = [0x50, 0xed, 0x55, 0xba, 0x01, 0x00, 0x10, 0x00];

/// The entry header's flag word (offset 0x28).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flags(pub u64);

impl Flags {
    pub const BITS_64: u64 = 0x1;
    pub const DEBUG: u64 = 0x2;
    pub const CUDA_PRODUCER: u64 = 0x4;
    pub const OPENCL: u64 = 0x8;
    pub const HOST_LINUX: u64 = 0x10;
    pub const HOST_MAC: u64 = 0x20;
    pub const HOST_WINDOWS: u64 = 0x40;
    pub const LZ4: u64 = 0x2000;
    pub const ZSTD: u64 = 0x8000;
    pub const OBFUSCATED: u64 = 0x1_0000;
    pub const ARCH_SPECIFIC: u64 = 0x10_0000;
    pub const FAMILY: u64 = 0x20_0000;
    pub const COMPAT_COPY: u64 = 0x100_0000;

    fn has(self, bit: u64) -> bool {
        self.0 & bit != 0
    }
    pub fn is_64bit(self) -> bool {
        self.has(Self::BITS_64)
    }
    pub fn debug(self) -> bool {
        self.has(Self::DEBUG)
    }
    pub fn lz4(self) -> bool {
        self.has(Self::LZ4)
    }
    pub fn zstd(self) -> bool {
        self.has(Self::ZSTD)
    }
    pub fn obfuscated(self) -> bool {
        self.has(Self::OBFUSCATED)
    }
    pub fn arch_specific(self) -> bool {
        self.has(Self::ARCH_SPECIFIC)
    }
    pub fn family(self) -> bool {
        self.has(Self::FAMILY)
    }
    pub fn compat_copy(self) -> bool {
        self.has(Self::COMPAT_COPY)
    }
    pub fn cuda_producer(self) -> bool {
        self.has(Self::CUDA_PRODUCER)
    }
    pub fn opencl(self) -> bool {
        self.has(Self::OPENCL)
    }

    /// The host OS the entry was built for, if the flags name exactly one.
    pub fn host_os(self) -> Option<&'static str> {
        match (
            self.has(Self::HOST_LINUX),
            self.has(Self::HOST_MAC),
            self.has(Self::HOST_WINDOWS),
        ) {
            (true, false, false) => Some("linux"),
            (false, true, false) => Some("mac"),
            (false, false, true) => Some("windows"),
            _ => None,
        }
    }

    /// The target suffix the flags carry: `a` wins over `f` if a header sets both.
    pub fn variant(self) -> Variant {
        if self.arch_specific() {
            Variant::ArchSpecific
        } else if self.family() {
            Variant::Family
        } else {
            Variant::Baseline
        }
    }
}

/// A container header and where it sits in the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// Offset of the magic in the buffer that was parsed.
    pub offset: usize,
    pub version: u16,
    pub header_size: u16,
    /// Bytes after the header (all entries with their payloads).
    pub body_size: u64,
    /// One past the last byte of the container.
    pub end: usize,
}

/// What an image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageKind {
    Ptx,
    /// A cubin (SASS in a CUDA ELF).
    Elf,
    LtoIr,
    RelocatablePtx,
    /// A kind code this parser does not know, kept so nothing is silently dropped.
    Unknown(u16),
}

impl ImageKind {
    /// The fatbin entry kind code (offset 0x00 of the entry header).
    pub fn from_code(code: u16) -> Self {
        match code {
            1 => ImageKind::Ptx,
            2 => ImageKind::Elf,
            8 => ImageKind::LtoIr,
            0x40 => ImageKind::RelocatablePtx,
            other => ImageKind::Unknown(other),
        }
    }

    /// Short lowercase name: `ptx`, `elf`, `lto-ir`, `rel-ptx`, `kind-0x5`.
    pub fn name(&self) -> String {
        match self {
            ImageKind::Ptx => "ptx".into(),
            ImageKind::Elf => "elf".into(),
            ImageKind::LtoIr => "lto-ir".into(),
            ImageKind::RelocatablePtx => "rel-ptx".into(),
            ImageKind::Unknown(code) => format!("kind-{code:#x}"),
        }
    }

    /// PTX text (plain or relocatable), whose identity is the text up to its NUL.
    pub(crate) fn is_ptx_text(&self) -> bool {
        matches!(self, ImageKind::Ptx | ImageKind::RelocatablePtx)
    }
}

/// How an image's payload is stored in its fatbin entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    None,
    Zstd,
    Lz4,
}

/// One entry of a container, borrowing its payload from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Offset of the entry header in the buffer.
    pub offset: usize,
    /// Position within its container, from 0.
    pub index: usize,
    pub kind: ImageKind,
    pub header_size: u32,
    pub padded_size: u64,
    /// Exact compressed size, 0 when not compressed.
    pub compressed_size: u32,
    /// PTX ISA minor for PTX, ELF ABI version for cubins.
    pub minor: u16,
    /// PTX ISA major for PTX, 1 for cubins.
    pub major: u16,
    pub sm: u32,
    pub flags: Flags,
    /// Exact uncompressed size, 0 when not compressed.
    pub uncompressed_size: u64,
    /// Source identifier (usually the .cu file name), without its NUL.
    pub identifier: Option<&'a [u8]>,
    /// Options string (ptxas options for PTX), without its NUL.
    pub options: Option<&'a [u8]>,
    /// Offset of the first payload byte in the buffer.
    pub payload_offset: usize,
    /// The padded payload, compressed or not.
    pub payload: &'a [u8],
}

impl<'a> Entry<'a> {
    pub fn compression(&self) -> Compression {
        if self.flags.zstd() {
            Compression::Zstd
        } else if self.flags.lz4() {
            Compression::Lz4
        } else {
            Compression::None
        }
    }

    /// `sm_90a` for a cubin entry, `compute_80` for PTX, LTO-IR and relocatable PTX (all
    /// virtual-architecture code); `None` for unknown kinds or an SM of 0.
    pub fn target(&self) -> Option<Target> {
        if self.sm == 0 {
            return None;
        }
        let base = match self.kind {
            ImageKind::Elf => Target::sass(self.sm),
            ImageKind::Ptx | ImageKind::RelocatablePtx | ImageKind::LtoIr => Target::ptx(self.sm),
            ImageKind::Unknown(_) => return None,
        };
        Some(base.with_variant(self.flags.variant()))
    }

    /// The payload as the tools wrote it before packing: decompressed if needed (borrowed
    /// otherwise), still including any padding of an uncompressed payload.
    pub(crate) fn decompressed(&self, budget: &mut Budget) -> Result<Cow<'a, [u8]>, Error> {
        const WHAT: &str = "fatbin entry payload";
        let compression = self.compression();
        if compression == Compression::None {
            return Ok(Cow::Borrowed(self.payload));
        }
        if self.flags.obfuscated() {
            // Obfuscated (LTO-IR) payloads cannot be decoded without NVIDIA's key: the stored
            // bytes are the only identity there is.
            let stored = self
                .payload
                .get(..self.compressed_size as usize)
                .unwrap_or(self.payload);
            return Ok(Cow::Borrowed(stored));
        }
        if self.uncompressed_size == 0 {
            return Err(Error::malformed(
                "fatbin entry",
                self.offset,
                "payload is flagged compressed but the uncompressed size at +0x38 is 0",
            ));
        }
        let cap = decompress::max_uncompressed_for(u64::from(self.compressed_size));
        if self.uncompressed_size > cap {
            return Err(Error::malformed(
                "fatbin entry",
                self.offset,
                format!(
                    "uncompressed size {:#x} at +0x38 is over the cap of {cap:#x} bytes for the {:#x} compressed bytes at +0x10 (256 times the compressed size plus 1 MiB)",
                    self.uncompressed_size, self.compressed_size
                ),
            ));
        }
        let input =
            bytes_at(self.payload, 0, u64::from(self.compressed_size), WHAT).map_err(|_| {
                Error::malformed(
                    "fatbin entry",
                    self.offset,
                    format!(
                        "compressed size {:#x} at +0x10 is larger than the {:#x}-byte payload",
                        self.compressed_size,
                        self.payload.len()
                    ),
                )
            })?;
        let out = match compression {
            Compression::Zstd => decompress::zstd(
                input,
                self.uncompressed_size,
                budget,
                WHAT,
                self.payload_offset,
            )?,
            _ => decompress::lz4(
                input,
                self.uncompressed_size,
                budget,
                WHAT,
                self.payload_offset,
            )?,
        };
        Ok(Cow::Owned(out))
    }
}

/// Whether a container header that this parser would read starts at `offset`.
pub fn is_container_at(buf: &[u8], offset: usize) -> bool {
    offset
        .checked_add(CONTAINER_SIGNATURE.len())
        .and_then(|end| buf.get(offset..end))
        == Some(&CONTAINER_SIGNATURE[..])
}

/// Whether the bytes at `offset` look like a real container and not a chance match of the
/// signature (say, the signature constant in a host binary's `.rodata` or `.text`): the body
/// fits in the buffer and holds at least one entry whose header is consistent with it. Cheap:
/// reads the two headers only.
pub(crate) fn is_plausible_container(buf: &[u8], offset: usize) -> bool {
    plausible_container(buf, offset).is_some()
}

fn plausible_container(buf: &[u8], offset: usize) -> Option<()> {
    const ENTRY_MARKER: u16 = 0x0101;
    if !is_container_at(buf, offset) {
        return None;
    }
    let body_size = u64_at(buf, offset.checked_add(8)?, "").ok()?;
    let body_start = offset.checked_add(CONTAINER_HEADER_LEN)?;
    let end = offset_add(body_start, body_size, "").ok()?;
    if end > buf.len() || body_size < u64::from(ENTRY_HEADER_MIN) {
        return None;
    }
    let entry = bytes_at(buf, body_start, u64::from(ENTRY_HEADER_MIN), "").ok()?;
    let marker = u16_at(entry, 0x02, "").ok()?;
    let header_size = u32_at(entry, 0x04, "").ok()?;
    let padded_size = u64_at(entry, 0x08, "").ok()?;
    let compressed_size = u32_at(entry, 0x10, "").ok()?;
    let entry_len = padded_size.checked_add(u64::from(header_size))?;
    (marker == ENTRY_MARKER
        && header_size >= ENTRY_HEADER_MIN
        && entry_len <= body_size
        && u64::from(compressed_size) <= padded_size)
        .then_some(())
}

/// Parses the container whose header starts at `offset` and every entry in it.
pub fn parse_container(buf: &[u8], offset: usize) -> Result<(Container, Vec<Entry<'_>>), Error> {
    const WHAT: &str = "fatbin container";
    let magic = u32_at(buf, offset, WHAT)?;
    if magic != CONTAINER_MAGIC {
        return Err(Error::malformed(
            WHAT,
            offset,
            format!("magic is {magic:#010x}, expected {CONTAINER_MAGIC:#010x}"),
        ));
    }
    let version = u16_at(buf, offset + 4, WHAT)?;
    if version != CONTAINER_VERSION {
        return Err(Error::malformed(
            WHAT,
            offset,
            format!("version is {version}, expected {CONTAINER_VERSION}"),
        ));
    }
    let header_size = u16_at(buf, offset + 6, WHAT)?;
    if usize::from(header_size) < CONTAINER_HEADER_LEN {
        return Err(Error::malformed(WHAT, offset, format!("header size {header_size:#x} is smaller than the {CONTAINER_HEADER_LEN:#x}-byte container header")));
    }
    let body_size = u64_at(buf, offset + 8, WHAT)?;
    let body_start = offset + usize::from(header_size);
    let end = offset_add(body_start, body_size, WHAT)?;
    if end > buf.len() {
        return Err(Error::malformed(
            WHAT,
            offset,
            format!(
                "declares {body_size:#x} bytes of entries, but only {:#x} bytes follow its header",
                buf.len().saturating_sub(body_start)
            ),
        ));
    }
    let container = Container {
        offset,
        version,
        header_size,
        body_size,
        end,
    };

    let mut entries = Vec::new();
    let mut cursor = body_start;
    while cursor < end {
        let entry = parse_entry(buf, cursor, end, entries.len())?;
        // parse_entry guarantees the entry ends after it starts and within `end`.
        cursor = entry.payload_offset + entry.payload.len();
        entries.push(entry);
    }
    Ok((container, entries))
}

/// Parses the entry header at `offset`; the entry must end by `container_end`.
fn parse_entry(
    buf: &[u8],
    offset: usize,
    container_end: usize,
    index: usize,
) -> Result<Entry<'_>, Error> {
    const WHAT: &str = "fatbin entry";
    // Reads stay inside the container, so a lying entry cannot reach the next one's bytes.
    let scope = buf.get(..container_end).unwrap_or(buf);
    let header_min = bytes_at(scope, offset, u64::from(ENTRY_HEADER_MIN), WHAT)?;
    let kind = ImageKind::from_code(u16_at(header_min, 0, WHAT)?);
    let header_size = u32_at(header_min, 0x04, WHAT)?;
    if header_size < ENTRY_HEADER_MIN {
        return Err(Error::malformed(WHAT, offset, format!("header size {header_size:#x} is smaller than the {ENTRY_HEADER_MIN:#x}-byte entry header")));
    }
    let header = bytes_at(scope, offset, u64::from(header_size), WHAT)?;
    let padded_size = u64_at(header, 0x08, WHAT)?;
    let compressed_size = u32_at(header, 0x10, WHAT)?;
    let options_offset = u32_at(header, 0x14, WHAT)?;
    let minor = u16_at(header, 0x18, WHAT)?;
    let major = u16_at(header, 0x1a, WHAT)?;
    let sm = u32_at(header, 0x1c, WHAT)?;
    let id_offset = u32_at(header, 0x20, WHAT)?;
    let id_len = u32_at(header, 0x24, WHAT)?;
    let flags = Flags(u64_at(header, 0x28, WHAT)?);
    let uncompressed_size = u64_at(header, 0x38, WHAT)?;

    let payload_offset = offset + header.len();
    let payload_end = offset_add(payload_offset, padded_size, WHAT).ok().filter(|&e| e <= container_end).ok_or_else(|| {
        Error::malformed(
            WHAT,
            offset,
            format!("padded payload size {padded_size:#x} runs past the container end at {container_end:#x}"),
        )
    })?;
    let payload = buf
        .get(payload_offset..payload_end)
        .ok_or_else(|| Error::malformed(WHAT, offset, "payload is outside the input"))?;
    if flags.lz4() && flags.zstd() {
        return Err(Error::malformed(
            WHAT,
            offset,
            format!("flags {:#x} claim both LZ4 and zstd compression", flags.0),
        ));
    }

    let identifier = match id_offset {
        0 => None,
        rel => Some(string_in_header(
            header,
            rel,
            u64::from(id_len),
            offset,
            "fatbin entry identifier",
        )?),
    };
    let options = match options_offset {
        0 => None,
        rel => {
            let desc_at = rel as usize;
            let str_offset = u32_at(header, desc_at, "fatbin entry options descriptor")
                .map_err(|_| Error::malformed(WHAT, offset, format!("options descriptor offset {rel:#x} is outside the {header_size:#x}-byte header")))?;
            let str_len = u32_at(header, desc_at.saturating_add(4), "fatbin entry options descriptor")
                .map_err(|_| Error::malformed(WHAT, offset, format!("options descriptor offset {rel:#x} is outside the {header_size:#x}-byte header")))?;
            Some(string_in_header(
                header,
                str_offset,
                u64::from(str_len),
                offset,
                "fatbin entry options",
            )?)
        }
    };

    Ok(Entry {
        offset,
        index,
        kind,
        header_size,
        padded_size,
        compressed_size,
        minor,
        major,
        sm,
        flags,
        uncompressed_size,
        identifier,
        options,
        payload_offset,
        payload,
    })
}

/// A string stored inside the entry header, trimmed at its first NUL.
fn string_in_header<'a>(
    header: &'a [u8],
    rel: u32,
    len: u64,
    entry: usize,
    what: &'static str,
) -> Result<&'a [u8], Error> {
    let bytes = bytes_at(header, rel as usize, len, what).map_err(|_| {
        Error::malformed(
            what,
            entry,
            format!(
                "{len:#x} bytes at +{rel:#x} run past the {:#x}-byte entry header",
                header.len()
            ),
        )
    })?;
    Ok(crate::read::until_nul(bytes))
}

/// Parses a fatbin file: containers back to back, each 8-byte aligned with zero bytes in any
/// gap before it; zero padding after the last one is allowed, anything else is an error.
pub fn parse_fatbin(buf: &[u8]) -> Result<Vec<(Container, Vec<Entry<'_>>)>, Error> {
    if buf.is_empty() {
        return Err(Error::Empty);
    }
    let mut containers = Vec::new();
    let mut cursor = 0usize;
    while cursor < buf.len() {
        let rest = buf.get(cursor..).unwrap_or_default();
        if !containers.is_empty() && rest.iter().all(|&b| b == 0) {
            break;
        }
        let (container, entries) = parse_container(buf, cursor)?;
        // Round the end up to 8; `end <= buf.len()` so this cannot overflow past usize.
        cursor = container.end.saturating_add(7) & !7;
        check_alignment_gap(buf, &container, cursor)?;
        containers.push((container, entries));
    }
    Ok(containers)
}

/// The bytes from a container's end up to `boundary`, the 8-byte boundary where the next one may
/// start, must be zero.
pub(crate) fn check_alignment_gap(
    buf: &[u8],
    container: &Container,
    boundary: usize,
) -> Result<(), Error> {
    let gap = buf
        .get(container.end..boundary.min(buf.len()))
        .unwrap_or_default();
    match gap.iter().enumerate().find(|&(_, &b)| b != 0) {
        None => Ok(()),
        Some((bad, byte)) => Err(Error::malformed(
            "fatbin container",
            container.end + bad,
            format!(
                "byte {byte:#04x} in the alignment gap after the container at {:#x} (which ends at {:#x}); expected zero up to the next 8-byte boundary {boundary:#x}",
                container.offset, container.end
            ),
        )),
    }
}
