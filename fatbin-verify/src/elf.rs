//! A minimal ELF64 little-endian reader: header, section table, section names, symbols and
//! notes. Cubins and x86-64/aarch64 host binaries are all ELF64 LE; anything else is left to
//! the caller's fallback. Every table is checked against the buffer before it is read.

use crate::error::Error;
use crate::read::{bytes_at, u16_at, u32_at, u64_at};

pub(crate) const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EHDR_LEN: usize = 64;
const SHDR_LEN: u16 = 64;
const SYM_LEN: usize = 24;
pub(crate) const SHT_NOBITS: u32 = 8;
pub(crate) const SHT_SYMTAB: u32 = 2;
const WHAT: &str = "ELF header";

/// Whether the buffer starts like an ELF64 little-endian file.
pub(crate) fn is_elf64_le(buf: &[u8]) -> bool {
    buf.get(..4) == Some(&ELF_MAGIC[..])
        && buf.get(4) == Some(&ELFCLASS64)
        && buf.get(5) == Some(&ELFDATA2LSB)
}

#[derive(Debug, Clone)]
pub(crate) struct Section<'a> {
    pub name: &'a [u8],
    pub sh_type: u32,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    /// Where its header is in the file, for error messages.
    pub header_offset: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Elf<'a> {
    pub data: &'a [u8],
    pub abi_version: u8,
    pub e_type: u16,
    pub machine: u16,
    pub flags: u32,
    pub phoff: u64,
    pub phentsize: u16,
    pub phnum: u16,
    pub shoff: u64,
    pub shentsize: u16,
    pub shnum: u64,
    pub sections: Vec<Section<'a>>,
}

pub(crate) struct Symbol<'a> {
    pub name: &'a [u8],
    pub info: u8,
    pub other: u8,
}

impl<'a> Elf<'a> {
    /// Parses the header and the section table (names included).
    pub(crate) fn parse(data: &'a [u8]) -> Result<Self, Error> {
        bytes_at(data, 0, EHDR_LEN as u64, WHAT)?;
        if !is_elf64_le(data) {
            return Err(Error::malformed(
                WHAT,
                0,
                "expected an ELF64 little-endian file (7f 45 4c 46 02 01)",
            ));
        }
        let mut elf = Elf {
            data,
            abi_version: data.get(8).copied().unwrap_or(0),
            e_type: u16_at(data, 0x10, WHAT)?,
            machine: u16_at(data, 0x12, WHAT)?,
            flags: u32_at(data, 0x30, WHAT)?,
            phoff: u64_at(data, 0x20, WHAT)?,
            phentsize: u16_at(data, 0x36, WHAT)?,
            phnum: u16_at(data, 0x38, WHAT)?,
            shoff: u64_at(data, 0x28, WHAT)?,
            shentsize: u16_at(data, 0x3a, WHAT)?,
            shnum: u64::from(u16_at(data, 0x3c, WHAT)?),
            sections: Vec::new(),
        };
        let shstrndx = u16_at(data, 0x3e, WHAT)?;
        elf.read_sections(shstrndx)?;
        Ok(elf)
    }

    fn read_sections(&mut self, shstrndx: u16) -> Result<(), Error> {
        const SH: &str = "ELF section header table";
        if self.shoff == 0 {
            return Ok(());
        }
        if self.shentsize != SHDR_LEN {
            return Err(Error::malformed(
                WHAT,
                0x3a,
                format!(
                    "section header size is {:#x}, expected {SHDR_LEN:#x}",
                    self.shentsize
                ),
            ));
        }
        let shoff = usize::try_from(self.shoff).map_err(|_| {
            Error::malformed(
                WHAT,
                0x28,
                format!("section header offset {:#x} is past the input", self.shoff),
            )
        })?;
        // Extended numbering: with more than 0xff00 sections the count lives in section 0.
        if self.shnum == 0 {
            self.shnum = u64_at(self.data, shoff.saturating_add(0x20), SH)?;
        }
        let table_len = self.shnum.saturating_mul(u64::from(SHDR_LEN));
        let table = bytes_at(self.data, shoff, table_len, SH).map_err(|_| {
            Error::malformed(
                SH,
                shoff,
                format!("{} section headers of {SHDR_LEN:#x} bytes run past the end of the {:#x}-byte input", self.shnum, self.data.len()),
            )
        })?;
        let mut raw = Vec::with_capacity(table.len() / usize::from(SHDR_LEN));
        for (i, hdr) in table.chunks_exact(usize::from(SHDR_LEN)).enumerate() {
            let at = shoff + i * usize::from(SHDR_LEN);
            raw.push((
                u32_at(hdr, 0, SH)?,
                Section {
                    name: &[],
                    sh_type: u32_at(hdr, 4, SH)?,
                    offset: u64_at(hdr, 0x18, SH)?,
                    size: u64_at(hdr, 0x20, SH)?,
                    link: u32_at(hdr, 0x28, SH)?,
                    header_offset: at,
                },
            ));
        }
        let names: &[u8] = match raw.get(usize::from(shstrndx)) {
            Some((_, s)) if shstrndx != 0 => self.section_bytes(s)?,
            _ => &[],
        };
        self.sections = raw
            .into_iter()
            .map(|(name_off, mut s)| {
                s.name = names
                    .get(name_off as usize..)
                    .map(crate::read::until_nul)
                    .unwrap_or_default();
                s
            })
            .collect();
        Ok(())
    }

    /// The file bytes of a section; empty for NOBITS.
    pub(crate) fn section_bytes(&self, s: &Section<'a>) -> Result<&'a [u8], Error> {
        if s.sh_type == SHT_NOBITS {
            return Ok(&[]);
        }
        let offset = usize::try_from(s.offset).unwrap_or(usize::MAX);
        bytes_at(self.data, offset, s.size, "ELF section").map_err(|_| {
            Error::malformed(
                "ELF section header",
                s.header_offset,
                format!(
                    "section data {:#x}+{:#x} runs past the end of the {:#x}-byte input",
                    s.offset,
                    s.size,
                    self.data.len()
                ),
            )
        })
    }

    pub(crate) fn section(&self, name: &str) -> Option<&Section<'a>> {
        self.sections.iter().find(|s| s.name == name.as_bytes())
    }

    /// Where the file's tables end: `max(shoff + shnum*shentsize, phoff + phnum*phentsize)`.
    /// In 13.0 cubins the program headers come last, so both tables count.
    pub(crate) fn extent(&self) -> Result<usize, Error> {
        let table_end =
            |off: u64, num: u64, size: u16| off.checked_add(num.checked_mul(u64::from(size))?);
        let sh = if self.shoff == 0 {
            Some(0)
        } else {
            table_end(self.shoff, self.shnum, self.shentsize)
        };
        let ph = if self.phoff == 0 {
            Some(0)
        } else {
            table_end(self.phoff, u64::from(self.phnum), self.phentsize)
        };
        let end = sh
            .zip(ph)
            .map(|(a, b)| a.max(b).max(EHDR_LEN as u64))
            .ok_or_else(|| {
                Error::malformed(WHAT, 0x20, "section or program header table end overflows")
            })?;
        match usize::try_from(end) {
            Ok(end) if end <= self.data.len() => Ok(end),
            _ => Err(Error::malformed(
                WHAT,
                0x20,
                format!(
                    "header tables end at {end:#x}, past the end of the {:#x}-byte input",
                    self.data.len()
                ),
            )),
        }
    }

    /// Symbols of the first SHT_SYMTAB section, names resolved through its linked string table.
    pub(crate) fn symbols(&self) -> Result<Vec<Symbol<'a>>, Error> {
        let Some(symtab) = self.sections.iter().find(|s| s.sh_type == SHT_SYMTAB) else {
            return Ok(Vec::new());
        };
        let table = self.section_bytes(symtab)?;
        let strtab = match self.sections.get(symtab.link as usize) {
            Some(s) => self.section_bytes(s)?,
            None => &[],
        };
        let mut out = Vec::with_capacity(table.len() / SYM_LEN);
        for sym in table.chunks_exact(SYM_LEN) {
            let name_off = u32_at(sym, 0, "ELF symbol")? as usize;
            out.push(Symbol {
                name: strtab
                    .get(name_off..)
                    .map(crate::read::until_nul)
                    .unwrap_or_default(),
                info: sym.get(4).copied().unwrap_or(0),
                other: sym.get(5).copied().unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// The `desc` of every note in the named note section whose owner is `owner`.
    pub(crate) fn note_descs(
        &self,
        section: &str,
        owner: &[u8],
    ) -> Result<Vec<(u32, &'a [u8])>, Error> {
        let Some(s) = self.section(section) else {
            return Ok(Vec::new());
        };
        let data = self.section_bytes(s)?;
        let mut out = Vec::new();
        let mut at = 0usize;
        let align4 = |n: u64| n.checked_add(3).map(|v| v & !3);
        while at + 12 <= data.len() {
            let namesz = u64::from(u32_at(data, at, "ELF note")?);
            let descsz = u64::from(u32_at(data, at + 4, "ELF note")?);
            let kind = u32_at(data, at + 8, "ELF note")?;
            let bad = || {
                Error::malformed(
                    "ELF note",
                    at,
                    format!(
                        "name size {namesz:#x} and desc size {descsz:#x} run past the note section"
                    ),
                )
            };
            let name_at = at + 12;
            let name = bytes_at(data, name_at, namesz, "ELF note").map_err(|_| bad())?;
            let desc_at = align4(namesz)
                .and_then(|n| name_at.checked_add(usize::try_from(n).ok()?))
                .ok_or_else(bad)?;
            let desc = bytes_at(data, desc_at, descsz, "ELF note").map_err(|_| bad())?;
            if crate::read::until_nul(name) == owner {
                out.push((kind, desc));
            }
            at = align4(descsz)
                .and_then(|n| desc_at.checked_add(usize::try_from(n).ok()?))
                .ok_or_else(bad)?;
        }
        Ok(out)
    }
}
