//! Finding fatbin containers in whatever file holds them (docs/fatbin-format.md section 4): ELF
//! executables, shared libraries and objects, `ar` archives (Rust rlibs included), and any
//! binary that carries a fatbin as plain data. Fatbin sections (`.nv_fatbin`, `__nv_relfatbin`)
//! are read whole, container after container, as NVIDIA's tools read them; every other section
//! is scanned for the container signature. Neither follows `.nvFatBinSegment` pointers, which
//! are relocations in `.o` files and absent when a fatbin is embedded as plain data.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

use memchr::memmem;

use crate::elf::Elf;
use crate::error::Error;
use crate::fatbin::{
    check_alignment_gap, is_container_at, parse_container, Container, Entry, CONTAINER_MAGIC,
    CONTAINER_SIGNATURE,
};
use crate::read::u32_at;

/// What kind of file a buffer holds, judged by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// Starts with a fatbin container.
    Fatbin,
    /// An ELF64 file for EM_CUDA.
    Cubin,
    /// PTX text.
    Ptx,
    /// An ELF64 little-endian host binary, object or shared library.
    Elf,
    /// An `ar` archive (static library, Rust rlib).
    Archive,
    /// Anything else: scanned whole for embedded containers.
    Other,
}

const AR_MAGIC: &[u8] = b"!<arch>\n";
const AR_THIN_MAGIC: &[u8] = b"!<thin>\n";

pub fn detect(bytes: &[u8]) -> InputFormat {
    if is_container_at(bytes, 0) {
        InputFormat::Fatbin
    } else if crate::cubin::is_cubin(bytes) {
        InputFormat::Cubin
    } else if crate::elf::is_elf64_le(bytes) {
        InputFormat::Elf
    } else if bytes.starts_with(AR_MAGIC) || bytes.starts_with(AR_THIN_MAGIC) {
        InputFormat::Archive
    } else if crate::ptx::looks_like_ptx(bytes) {
        InputFormat::Ptx
    } else {
        InputFormat::Other
    }
}

/// Where a found container lives: its archive member and section, when known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Place {
    pub member: Option<String>,
    pub section: Option<String>,
}

/// Sections that hold nothing but containers and zero padding: read whole by
/// [`fatbin_section_containers`], never scanned for chance matches.
const FATBIN_SECTIONS: [&str; 2] = [".nv_fatbin", "__nv_relfatbin"];

/// A byte range of the input and what it is.
#[derive(Debug, Clone)]
struct Region {
    range: Range<usize>,
    place: Place,
    /// An archive member that is a raw fatbin when it starts with a container.
    raw_member: bool,
}

/// One occurrence of the container signature in a host file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hit<'r> {
    pub offset: usize,
    /// The smallest section or member holding it (ties: the one starting first, then the one
    /// listed first); the default place when it lies outside all of them.
    pub place: &'r Place,
    /// In a fatbin section, which [`fatbin_section_containers`] reads whole: the hit starts one
    /// of the containers found there or lies inside one.
    pub in_fatbin_section: bool,
    /// At the start of a raw-fatbin archive member: it must parse. Elsewhere it may be a chance
    /// match and is a container only if it looks like one.
    pub strict: bool,
}

/// The sections and members of a host file (ELF, archive or unknown) that signature hits are
/// labelled with.
#[derive(Debug)]
pub(crate) struct Layout {
    /// Sorted by start.
    regions: Vec<Region>,
    outside: Place,
}

impl Layout {
    pub(crate) fn new(bytes: &[u8], format: InputFormat) -> Result<Self, Error> {
        let mut regions = match format {
            InputFormat::Elf => elf_regions(bytes, 0, None)?,
            InputFormat::Archive => archive_regions(bytes)?,
            _ => Vec::new(),
        };
        regions.sort_by_key(|r| r.range.start);
        Ok(Layout {
            regions,
            outside: Place::default(),
        })
    }

    /// The fatbin sections' byte ranges and places, in file order.
    pub(crate) fn fatbin_sections(&self) -> impl Iterator<Item = (Range<usize>, &Place)> {
        self.regions
            .iter()
            .filter(|r| is_fatbin_section(&r.place))
            .map(|r| (r.range.clone(), &r.place))
    }

    /// Every signature hit in file order. The file is scanned once, whatever the number of
    /// sections: a hostile ELF with thousands of sections all covering the whole file costs
    /// one pass plus a heap operation per section, not one pass per section.
    pub(crate) fn hits<'s>(&'s self, bytes: &'s [u8]) -> impl Iterator<Item = Hit<'s>> + 's {
        let regions = &self.regions;
        let mut pending = regions.iter().enumerate().peekable();
        // Regions that start at or before the current hit, smallest first; those that end
        // before it are dropped when they reach the top (hits only move forward).
        let mut open: BinaryHeap<Reverse<(usize, usize, usize)>> = BinaryHeap::new();
        memmem::find_iter(bytes, &CONTAINER_SIGNATURE).map(move |offset| {
            while let Some((index, region)) = pending.next_if(|(_, r)| r.range.start <= offset) {
                open.push(Reverse((region.range.len(), region.range.start, index)));
            }
            let mut holder = None;
            while let Some(&Reverse((_, _, index))) = open.peek() {
                match regions.get(index) {
                    Some(region) if region.range.end > offset => {
                        holder = Some(region);
                        break;
                    }
                    _ => {
                        open.pop();
                    }
                }
            }
            match holder {
                Some(region) => Hit {
                    offset,
                    place: &region.place,
                    in_fatbin_section: is_fatbin_section(&region.place),
                    strict: region.raw_member && offset == region.range.start,
                },
                None => Hit {
                    offset,
                    place: &self.outside,
                    in_fatbin_section: false,
                    strict: false,
                },
            }
        })
    }
}

fn is_fatbin_section(place: &Place) -> bool {
    place
        .section
        .as_deref()
        .is_some_and(|name| FATBIN_SECTIONS.contains(&name))
}

/// The containers of the fatbin section at `range`, read as NVIDIA's tools read it: from the
/// section's start in 8-byte steps, a word of zeros is padding and any other word must start a
/// container that ends within the section. `cuobjdump` 13.2 stops with "Invalid fatbin header"
/// at the first word that is neither (non-zero bytes between containers, a container off the
/// 8-byte grid); this stops there with an error naming the section and the bytes.
pub(crate) fn fatbin_section_containers<'a>(
    bytes: &'a [u8],
    range: Range<usize>,
    place: &Place,
) -> Result<Vec<(Container, Vec<Entry<'a>>)>, Error> {
    const WHAT: &str = "fatbin section";
    let (start, end) = (range.start, range.end);
    let name = describe_place(place);
    // Containers must end within the section: parse them in a buffer that ends where it does.
    let scope = bytes.get(..end).ok_or_else(|| {
        Error::malformed(
            WHAT,
            start,
            format!(
                "{name} ends at {end:#x}, past the end of the {:#x}-byte input",
                bytes.len()
            ),
        )
    })?;
    let mut containers = Vec::new();
    let mut cursor = start;
    while cursor < end {
        let word = scope.get(cursor..end.min(cursor + 8)).unwrap_or_default();
        if word.iter().all(|&b| b == 0) {
            cursor += word.len().max(1);
            continue;
        }
        if u32_at(scope, cursor, WHAT).ok() != Some(CONTAINER_MAGIC) {
            let hex: Vec<String> = word.iter().map(|b| format!("{b:02x}")).collect();
            return Err(Error::malformed(
                WHAT,
                cursor,
                format!(
                    "{name} ({start:#x}..{end:#x}) holds `{}` at +{:#x}, expected a fatbin container (`50 ed 55 ba`) or 8 zero bytes of padding: NVIDIA's tools read this section as containers one after another on an 8-byte grid",
                    hex.join(" "),
                    cursor - start
                ),
            ));
        }
        let (container, entries) = parse_container(scope, cursor)?;
        // `container.end <= end`, so the next grid point cannot overflow.
        let next = start + (container.end - start).div_ceil(8) * 8;
        check_alignment_gap(scope, &container, next)?;
        containers.push((container, entries));
        cursor = next;
    }
    Ok(containers)
}

/// `section .nv_fatbin of member foo.o`, for messages.
fn describe_place(place: &Place) -> String {
    let section = place.section.as_deref().unwrap_or("(no section)");
    match &place.member {
        Some(member) => format!("section `{section}` of member `{member}`"),
        None => format!("section `{section}`"),
    }
}

/// The file ranges of every section with contents, offsets made absolute by `base`.
fn elf_regions(bytes: &[u8], base: usize, member: Option<&str>) -> Result<Vec<Region>, Error> {
    let elf_bytes = bytes.get(base..).unwrap_or_default();
    let elf = Elf::parse(elf_bytes).map_err(|e| rebase(e, base))?;
    let mut regions = Vec::new();
    for section in &elf.sections {
        let data = elf.section_bytes(section).map_err(|e| rebase(e, base))?;
        if data.is_empty() {
            continue;
        }
        // section_bytes checked offset + size against the buffer, so these cannot overflow.
        let start = base + section.offset as usize;
        regions.push(Region {
            range: start..start + data.len(),
            place: Place {
                member: member.map(str::to_string),
                section: Some(String::from_utf8_lossy(section.name).into_owned()),
            },
            raw_member: false,
        });
    }
    Ok(regions)
}

/// Member data ranges of an archive; ELF members are split into their sections.
fn archive_regions(bytes: &[u8]) -> Result<Vec<Region>, Error> {
    const WHAT: &str = "ar archive";
    let archive = object::read::archive::ArchiveFile::parse(bytes)
        .map_err(|e| Error::malformed(WHAT, 0, e.to_string()))?;
    let mut regions = Vec::new();
    for member in archive.members() {
        let member = member.map_err(|e| Error::malformed(WHAT, 0, e.to_string()))?;
        let name = String::from_utf8_lossy(member.name()).into_owned();
        let (offset, size) = member.file_range();
        let bad = || {
            Error::malformed(
                WHAT,
                0,
                format!(
                    "member `{name}` at {offset:#x}+{size:#x} is outside the {:#x}-byte input",
                    bytes.len()
                ),
            )
        };
        if member.is_thin() {
            // A thin archive names files elsewhere; it holds nothing to scan.
            continue;
        }
        let start = usize::try_from(offset).map_err(|_| bad())?;
        let end = usize::try_from(size)
            .ok()
            .and_then(|s| start.checked_add(s))
            .filter(|&e| e <= bytes.len())
            .ok_or_else(bad)?;
        let data = bytes.get(start..end).ok_or_else(bad)?;
        let split = crate::elf::is_elf64_le(data) && !crate::cubin::is_cubin(data);
        if split {
            let sub = bytes.get(..end).unwrap_or(bytes);
            regions.extend(elf_regions(sub, start, Some(&name))?);
        }
        // The whole member too, so a hit outside its sections still names the member.
        regions.push(Region {
            range: start..end,
            place: Place {
                member: Some(name),
                section: None,
            },
            raw_member: !split,
        });
    }
    Ok(regions)
}

/// Moves an error's offset from a member-relative to a file-relative position.
fn rebase(err: Error, base: usize) -> Error {
    match err {
        Error::Truncated {
            what,
            offset,
            needed,
            available,
        } => Error::Truncated {
            what,
            offset: offset.saturating_add(base),
            needed,
            available,
        },
        Error::Malformed {
            what,
            offset,
            detail,
        } => Error::Malformed {
            what,
            offset: offset.saturating_add(base),
            detail,
        },
        other => other,
    }
}
