//! The high-level view: every GPU image in a file, with its architecture, versions, kernels
//! and the sha256 of its identity bytes (what `cuobjdump -xelf` / `-xptx` would write).
//! This is what the build script, the runtime dispatcher and the CLI call.

use std::borrow::Cow;
use std::ops::Range;

use serde::{Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::cubin;
use crate::decompress::{Budget, Limits};
use crate::error::Error;
use crate::fatbin::{self, Compression, Container, Entry, ImageKind};
use crate::host::{self, InputFormat, Place};
use crate::ptx;
use crate::target::{Target, Variant};
use crate::toolkit::{self, CudaRelease};

/// Where an image was found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ImageSource {
    /// Offset of its container in the input; `None` for a bare cubin or PTX file.
    pub container_offset: Option<usize>,
    /// Position of its entry within the container (0 for a bare cubin or PTX file).
    pub entry_index: usize,
    /// Offset of its entry header in the input.
    pub entry_offset: Option<usize>,
    /// Archive member it was found in.
    pub member: Option<String>,
    /// ELF section it was found in (`.nv_fatbin`, `__nv_relfatbin`, `.rodata` ...).
    pub section: Option<String>,
}

/// One GPU image and what it says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageInfo {
    pub source: ImageSource,
    pub kind: ImageKind,
    /// `sm_90`, `sm_90a`, `sm_100f` for cubins; `compute_80` for PTX, LTO-IR and relocatable PTX.
    pub target: Option<Target>,
    /// PTX ISA `(major, minor)` of PTX images.
    pub ptx_version: Option<(u32, u32)>,
    /// ELF ABI version of cubins (7: layout v1, 8: layout v2).
    pub elf_abi: Option<u32>,
    /// SM number of the PTX a cubin was compiled from.
    pub virtual_sm: Option<u32>,
    pub debug: bool,
    /// The fatbin entry flags (0 for bare cubin/PTX files).
    pub flags: u64,
    pub compression: Compression,
    /// Bytes of the identity: a cubin trimmed to its ELF extent, PTX up to its first NUL.
    pub size: usize,
    /// sha256 of the identity bytes.
    #[serde(serialize_with = "serialize_digest")]
    pub sha256: [u8; 32],
    /// Kernel entry points.
    pub kernels: Vec<String>,
    /// Toolkit that produced the image (`Cuda compilation tools, release 13.0, V13.0.88`): a
    /// cubin's `.note.nv.tkinfo`, a PTX file's header comment.
    pub toolkit: Option<String>,
    /// CUDA release that made the image: from `toolkit` when present, else only the major its
    /// format implies (cubin ELF ABI 7: 12, 8 below sm_100: 13; PTX ISA 9.x: 13, 8.x: 12).
    /// See [`crate::toolkit`].
    pub cuda: Option<CudaRelease>,
    /// The fatbin entry's identifier string (usually the source file name).
    pub identifier: Option<String>,
    /// The fatbin entry's options string (ptxas options of PTX).
    pub options: Option<String>,
    /// Range of the identity bytes in the input when stored uncompressed, for zero-copy slicing.
    pub raw_range: Option<Range<usize>>,
}

fn serialize_digest<S: Serializer>(digest: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&sha256_hex(digest))
}

/// Lowercase hex of a digest.
pub fn sha256_hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every image in `bytes` (fatbin, cubin, PTX, ELF host binary or archive), with the default
/// `Limits` on decompression.
pub fn list_images(bytes: &[u8]) -> Result<Vec<ImageInfo>, Error> {
    list_images_with_limits(bytes, &Limits::default())
}

/// `list_images` with an explicit cap on the bytes decompression may allocate in total.
pub fn list_images_with_limits(bytes: &[u8], limits: &Limits) -> Result<Vec<ImageInfo>, Error> {
    if bytes.is_empty() {
        return Err(Error::Empty);
    }
    let mut budget = Budget::new(limits);
    let format = host::detect(bytes);
    match format {
        InputFormat::Cubin => return Ok(vec![bare_cubin(bytes)?]),
        InputFormat::Ptx => return Ok(vec![bare_ptx(bytes)]),
        InputFormat::Fatbin => {
            let mut images = Vec::new();
            for (container, entries) in fatbin::parse_fatbin(bytes)? {
                for entry in &entries {
                    images.push(entry_info(
                        container.offset,
                        entry,
                        &Place::default(),
                        &mut budget,
                    )?);
                }
            }
            return Ok(images);
        }
        InputFormat::Elf | InputFormat::Archive | InputFormat::Other => {}
    }
    let layout = host::Layout::new(bytes, format)?;
    // First every container, so one that runs over the next is reported as such before any
    // of its entries is read. Fatbin sections are read whole (as NVIDIA's tools read them);
    // elsewhere a container is found by its signature.
    let mut walked: Vec<(Container, Vec<Entry<'_>>, &Place)> = Vec::new();
    for (range, place) in layout.fatbin_sections() {
        for (container, entries) in host::fatbin_section_containers(bytes, range, place)? {
            walked.push((container, entries, place));
        }
    }
    walked.sort_by_key(|(container, ..)| container.offset);
    // Two section headers naming the same bytes give the same containers twice.
    walked.dedup_by_key(|(container, ..)| container.offset);
    let mut scanned: Vec<(Container, Vec<Entry<'_>>, &Place)> = Vec::new();
    for hit in layout.hits(bytes) {
        let before = walked.partition_point(|(c, ..)| c.offset <= hit.offset);
        let walked_outer = before.checked_sub(1).and_then(|i| walked.get(i));
        if walked_outer.is_some_and(|(c, ..)| c.offset == hit.offset) {
            continue; // a container the section walk found
        }
        let outer = walked_outer
            .into_iter()
            .chain(scanned.last())
            .map(|(c, ..)| c)
            .find(|c| hit.offset < c.end);
        if let Some(outer) = outer {
            // A chance match inside a container's payload is its data; a real container
            // there means the outer one's sizes swallow it, hiding its images.
            if fatbin::is_plausible_container(bytes, hit.offset) {
                return Err(lies_inside(hit.offset, outer));
            }
            continue;
        }
        if hit.in_fatbin_section {
            continue; // the section walk found every container there
        }
        if !hit.strict && !fatbin::is_plausible_container(bytes, hit.offset) {
            continue;
        }
        let (container, entries) = fatbin::parse_container(bytes, hit.offset)?;
        scanned.push((container, entries, hit.place));
    }
    let mut containers = walked;
    containers.append(&mut scanned);
    containers.sort_by_key(|(container, ..)| container.offset);
    for pair in containers.windows(2) {
        if let [(outer, ..), (inner, ..)] = pair {
            if inner.offset < outer.end {
                return Err(lies_inside(inner.offset, outer));
            }
        }
    }
    if containers.is_empty() && format == InputFormat::Other {
        let head = bytes
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ");
        return Err(Error::UnknownFormat {
            len: bytes.len(),
            head,
        });
    }
    let mut images = Vec::new();
    for (container, entries, place) in &containers {
        for entry in entries {
            images.push(entry_info(container.offset, entry, place, &mut budget)?);
        }
    }
    Ok(images)
}

/// The identity bytes of an image that `list_images` reported for this same buffer:
/// borrowed when stored uncompressed, decompressed otherwise.
pub fn image_bytes<'a>(bytes: &'a [u8], info: &ImageInfo) -> Result<Cow<'a, [u8]>, Error> {
    image_bytes_with_limits(bytes, info, &Limits::default())
}

/// `image_bytes` with an explicit decompression cap.
pub fn image_bytes_with_limits<'a>(
    bytes: &'a [u8],
    info: &ImageInfo,
    limits: &Limits,
) -> Result<Cow<'a, [u8]>, Error> {
    let not_found = |detail: &str| Error::ImageNotFound {
        source_desc: describe_source(&info.source),
        detail: detail.to_string(),
    };
    if let Some(range) = &info.raw_range {
        return bytes
            .get(range.clone())
            .map(Cow::Borrowed)
            .ok_or_else(|| not_found("its byte range is outside this input"));
    }
    let container_offset = info
        .source
        .container_offset
        .ok_or_else(|| not_found("it has neither a byte range nor a container"))?;
    let (_, entries) = fatbin::parse_container(bytes, container_offset)?;
    let entry = entries
        .get(info.source.entry_index)
        .ok_or_else(|| not_found("its container has fewer entries"))?;
    let payload = entry.decompressed(&mut Budget::new(limits))?;
    let len = identity_len(entry.kind, &payload).map_err(|e| in_entry(entry, e))?;
    if len != info.size {
        return Err(not_found(
            "the entry there differs from the one listed (was the input changed?)",
        ));
    }
    Ok(match payload {
        Cow::Borrowed(b) => Cow::Borrowed(b.get(..len).unwrap_or(b)),
        Cow::Owned(mut v) => {
            v.truncate(len);
            Cow::Owned(v)
        }
    })
}

/// `container 0x1a0 entry 2 (member foo.o)`, for messages.
pub fn describe_source(source: &ImageSource) -> String {
    let mut out = match source.container_offset {
        Some(off) => format!("container {off:#x} entry {}", source.entry_index),
        None => "bare image".to_string(),
    };
    if let Some(member) = &source.member {
        out.push_str(&format!(" (member {member})"));
    }
    out
}

/// A container that starts at `inner` inside `outer`, whose sizes swallow it and hide its images.
fn lies_inside(inner: usize, outer: &Container) -> Error {
    Error::malformed(
        "fatbin container",
        inner,
        format!(
            "container at {inner:#x} lies inside the container at {:#x} (which declares {:#x} bytes of entries, ending at {:#x}); expected containers one after another",
            outer.offset, outer.body_size, outer.end
        ),
    )
}

/// How many leading bytes of a decompressed payload are the image itself.
fn identity_len(kind: ImageKind, payload: &[u8]) -> Result<usize, Error> {
    Ok(match kind {
        ImageKind::Elf => cubin::parse_cubin(payload)?.extent,
        k if k.is_ptx_text() => ptx::ptx_identity(payload).len(),
        _ => payload.len(),
    })
}

/// Wraps an error found inside an entry's image so it names the entry.
fn in_entry(entry: &Entry<'_>, inner: Error) -> Error {
    Error::malformed(
        "fatbin entry",
        entry.offset,
        format!(
            "its {} image is malformed (offsets below are within the image): {inner}",
            entry.kind.name()
        ),
    )
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn lossy(bytes: Option<&[u8]>) -> Option<String> {
    bytes.map(|b| String::from_utf8_lossy(b).into_owned())
}

fn entry_info(
    container_offset: usize,
    entry: &Entry<'_>,
    place: &Place,
    budget: &mut Budget,
) -> Result<ImageInfo, Error> {
    let payload = entry.decompressed(budget)?;
    let compression = entry.compression();
    let mut info = ImageInfo {
        source: ImageSource {
            container_offset: Some(container_offset),
            entry_index: entry.index,
            entry_offset: Some(entry.offset),
            member: place.member.clone(),
            section: place.section.clone(),
        },
        kind: entry.kind,
        target: entry.target(),
        ptx_version: None,
        elf_abi: None,
        virtual_sm: None,
        debug: entry.flags.debug(),
        flags: entry.flags.0,
        compression,
        size: 0,
        sha256: [0; 32],
        kernels: Vec::new(),
        toolkit: None,
        cuda: None,
        identifier: lossy(entry.identifier),
        options: lossy(entry.options),
        raw_range: None,
    };
    match entry.kind {
        ImageKind::Elf => {
            let cubin = cubin::parse_cubin(&payload).map_err(|e| in_entry(entry, e))?;
            // The entry header is not covered by the image hash; the cubin is.
            if entry.sm != 0 && entry.sm != cubin.target.sm {
                return Err(Error::malformed(
                    "fatbin entry",
                    entry.offset,
                    format!(
                        "header says sm_{} at +0x1c, but its cubin's e_flags {:#010x} say sm_{}",
                        entry.sm, cubin.e_flags, cubin.target.sm
                    ),
                ));
            }
            // The fatbin header carries `f`, which a cubin cannot; `a` may be in either.
            if cubin.compat_arch_specific == Some(true)
                || cubin.target.variant == Variant::ArchSpecific
            {
                info.target = info.target.map(|t| t.with_variant(Variant::ArchSpecific));
            }
            if info.target.is_none() {
                info.target = Some(cubin.target);
            }
            info.elf_abi = Some(u32::from(cubin.abi_version));
            info.virtual_sm = cubin.virtual_sm;
            info.kernels = cubin.kernels;
            info.toolkit = cubin.toolkit;
            info.size = cubin.extent;
        }
        kind if kind.is_ptx_text() => {
            let text = ptx::ptx_identity(&payload);
            let parsed = ptx::parse_ptx(text);
            let header_version =
                (entry.major != 0).then(|| (u32::from(entry.major), u32::from(entry.minor)));
            // The text is hashed, the header is not: the text's `.version` is the truth.
            info.ptx_version = match (parsed.version, header_version) {
                (Some(text), Some(header)) if text != header => {
                    return Err(Error::malformed(
                        "fatbin entry",
                        entry.offset,
                        format!(
                            "header says PTX ISA {}.{} at +0x1a/+0x18, but its text says `.version {}.{}`",
                            header.0, header.1, text.0, text.1
                        ),
                    ))
                }
                (text, header) => text.or(header),
            };
            if info.target.is_none() {
                info.target = parsed.target;
            }
            info.debug |= parsed.debug;
            info.kernels = parsed.entries;
            info.toolkit = toolkit::ptx_toolkit_string(text);
            info.size = text.len();
        }
        _ => info.size = payload.len(),
    }
    let abi_sm = info.elf_abi.zip(info.target.map(|t| t.sm));
    info.cuda = toolkit::image_release(info.toolkit.as_deref(), abi_sm, info.ptx_version);
    check_padding(entry, info.kind, info.size)?;
    let identity = payload.get(..info.size).unwrap_or(&payload);
    info.sha256 = digest(identity);
    if let Cow::Borrowed(_) = payload {
        info.raw_range = Some(entry.payload_offset..entry.payload_offset + info.size);
    }
    Ok(info)
}

/// Checks the stored bytes after an entry's data: the packer pads with zeros to the next
/// 8-byte boundary and no further (true of every nvcc/fatbinary output seen), so anything
/// else is bytes outside the hashed identity that something put there.
fn check_padding(entry: &Entry<'_>, kind: ImageKind, identity_len: usize) -> Result<(), Error> {
    // Where the stored data ends: the compressed stream, the cubin's ELF extent, or PTX text
    // with its NUL. Other kinds have no known end within their padded payload.
    let data_len = if entry.compression() != Compression::None {
        entry.compressed_size as usize
    } else if kind == ImageKind::Elf {
        identity_len
    } else if kind.is_ptx_text() && identity_len < entry.payload.len() {
        identity_len + 1
    } else {
        return Ok(());
    };
    let padding = entry.payload.get(data_len..).unwrap_or_default();
    if padding.len() > 7 {
        return Err(Error::malformed(
            "fatbin entry",
            entry.offset,
            format!(
                "padded payload size {:#x} at +0x08 leaves {:#x} bytes after its {:#x} bytes of {} data; expected at most 7 (padding to 8)",
                entry.padded_size,
                padding.len(),
                data_len,
                kind.name()
            ),
        ));
    }
    if let Some((at, byte)) = padding.iter().enumerate().find(|&(_, &b)| b != 0) {
        return Err(Error::malformed(
            "fatbin entry",
            entry.offset,
            format!(
                "padding byte at {:#x} (after its {data_len:#x} bytes of {} data) is {byte:#04x}, expected 0",
                entry.payload_offset + data_len + at,
                kind.name()
            ),
        ));
    }
    Ok(())
}

fn bare_cubin(bytes: &[u8]) -> Result<ImageInfo, Error> {
    let cubin = cubin::parse_cubin(bytes)?;
    let identity = bytes.get(..cubin.extent).unwrap_or(bytes);
    Ok(ImageInfo {
        source: ImageSource::default(),
        kind: ImageKind::Elf,
        target: Some(cubin.target),
        ptx_version: None,
        elf_abi: Some(u32::from(cubin.abi_version)),
        virtual_sm: cubin.virtual_sm,
        debug: false,
        flags: 0,
        compression: Compression::None,
        size: identity.len(),
        sha256: digest(identity),
        kernels: cubin.kernels,
        cuda: toolkit::image_release(
            cubin.toolkit.as_deref(),
            Some((u32::from(cubin.abi_version), cubin.target.sm)),
            None,
        ),
        toolkit: cubin.toolkit,
        identifier: None,
        options: None,
        raw_range: Some(0..identity.len()),
    })
}

fn bare_ptx(bytes: &[u8]) -> ImageInfo {
    let text = ptx::ptx_identity(bytes);
    let parsed = ptx::parse_ptx(text);
    ImageInfo {
        source: ImageSource::default(),
        kind: ImageKind::Ptx,
        target: parsed.target,
        ptx_version: parsed.version,
        elf_abi: None,
        virtual_sm: None,
        debug: parsed.debug,
        flags: 0,
        compression: Compression::None,
        size: text.len(),
        sha256: digest(text),
        kernels: parsed.entries,
        cuda: toolkit::image_release(
            toolkit::ptx_toolkit_string(text).as_deref(),
            None,
            parsed.version,
        ),
        toolkit: toolkit::ptx_toolkit_string(text),
        identifier: None,
        options: None,
        raw_range: Some(0..text.len()),
    }
}
