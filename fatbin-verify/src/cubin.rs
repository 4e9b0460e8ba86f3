//! CUDA ELF (cubin) reading: architecture from either e_flags layout, `a` from `.nv.compat`,
//! kernel entries, toolkit strings and the ELF extent (docs/fatbin-format.md section 2).

use crate::elf::Elf;
use crate::error::Error;
use crate::target::{Target, Variant};

/// `e_machine` of every CUDA ELF.
pub const EM_CUDA: u16 = 190;
/// `st_other` bit marking a kernel entry point.
const STO_CUDA_ENTRY: u8 = 0x10;
const STT_FUNC: u8 = 2;
/// Layout v1 (ptxas 12.x, sm < 100) marks `sm_XYa` with this e_flags bit.
const V1_ARCH_SPECIFIC: u32 = 0x800;
/// `.nv.compat` attribute that is 1 for an arch-specific (`a`) cubin.
const COMPAT_ATTR_ARCH_SPECIFIC: u8 = 9;

/// What a cubin says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinInfo {
    pub abi_version: u8,
    pub e_type: u16,
    pub e_flags: u32,
    /// The SASS architecture, `a` included when the cubin records it; a cubin cannot say `f`.
    pub target: Target,
    /// SM number of the PTX the SASS was compiled from.
    pub virtual_sm: Option<u32>,
    /// `.nv.compat` attribute 9, when the section has it.
    pub compat_arch_specific: Option<bool>,
    /// Kernel entry points in symbol-table order.
    pub kernels: Vec<String>,
    /// `Cuda compilation tools, release 13.0, V13.0.88` from `.note.nv.tkinfo`.
    pub toolkit: Option<String>,
    /// Bytes the ELF occupies; a padded fatbin payload is trimmed to this.
    pub extent: usize,
}

/// Whether the buffer is an ELF64 LE file for `EM_CUDA` (decided by e_machine, never OSABI).
pub fn is_cubin(buf: &[u8]) -> bool {
    crate::elf::is_elf64_le(buf) && buf.get(0x12..0x14) == Some(&EM_CUDA.to_le_bytes()[..])
}

/// Reads a cubin. `buf` may carry padding after the ELF; `extent` says where the ELF ends.
pub fn parse_cubin(buf: &[u8]) -> Result<CubinInfo, Error> {
    let elf = Elf::parse(buf)?;
    if elf.machine != EM_CUDA {
        return Err(Error::malformed(
            "ELF header",
            0x12,
            format!("e_machine is {}, expected {EM_CUDA} (EM_CUDA)", elf.machine),
        ));
    }
    let extent = elf.extent()?;
    let compat_arch_specific = compat_attribute(&elf, COMPAT_ATTR_ARCH_SPECIFIC)?.map(|v| v == 1);
    let (sm, virtual_sm, v1_arch_specific) = if elf.abi_version >= 8 {
        // Layout v2: SM in bits 8-15, the virtual SM only in the cuinfo note.
        ((elf.flags >> 8) & 0xff, cuinfo_virtual_sm(&elf)?, false)
    } else {
        (
            elf.flags & 0xff,
            Some((elf.flags >> 16) & 0xff).filter(|&v| v != 0),
            elf.flags & V1_ARCH_SPECIFIC != 0,
        )
    };
    let variant = if v1_arch_specific || compat_arch_specific == Some(true) {
        Variant::ArchSpecific
    } else {
        Variant::Baseline
    };
    let kernels = elf
        .symbols()?
        .into_iter()
        .filter(|s| s.info & 0xf == STT_FUNC && s.other & STO_CUDA_ENTRY != 0)
        .map(|s| String::from_utf8_lossy(s.name).into_owned())
        .collect();
    Ok(CubinInfo {
        abi_version: elf.abi_version,
        e_type: elf.e_type,
        e_flags: elf.flags,
        target: Target::sass(sm).with_variant(variant),
        virtual_sm,
        compat_arch_specific,
        kernels,
        toolkit: toolkit(&elf)?,
        extent,
    })
}

/// The virtual SM from `.note.nv.cuinfo`: desc `{u16 2, u16 virtual_sm, u32 ...}`.
fn cuinfo_virtual_sm(elf: &Elf<'_>) -> Result<Option<u32>, Error> {
    for (_, desc) in elf.note_descs(".note.nv.cuinfo", b"NVIDIA Corp")? {
        if let Some(&[2, 0, lo, hi]) = desc.get(0..4) {
            return Ok(Some(u32::from(u16::from_le_bytes([lo, hi]))));
        }
    }
    Ok(None)
}

/// The toolkit string of `.note.nv.tkinfo`. The note's own offsets have changed between
/// releases, so the string is found by content rather than by position.
fn toolkit(elf: &Elf<'_>) -> Result<Option<String>, Error> {
    for (_, desc) in elf.note_descs(".note.nv.tkinfo", b"NVIDIA Corp")? {
        if let Some(s) = desc
            .split(|&b| b == 0)
            .find(|s| s.windows(17).any(|w| w == b"compilation tools"))
        {
            return Ok(Some(String::from_utf8_lossy(s).into_owned()));
        }
    }
    Ok(None)
}

/// Value of a one-byte (format 2) attribute in `.nv.compat`. Records are `{u8 format, u8
/// attribute, u16 value-or-size}`; format 4 is followed by `size` bytes of data.
fn compat_attribute(elf: &Elf<'_>, attribute: u8) -> Result<Option<u8>, Error> {
    let Some(section) = elf.section(".nv.compat") else {
        return Ok(None);
    };
    let data = elf.section_bytes(section)?;
    let mut at = 0usize;
    while let Some(&[format, attr, lo, hi]) = at.checked_add(4).and_then(|end| data.get(at..end)) {
        if format == 2 && attr == attribute {
            return Ok(Some(lo));
        }
        let size = usize::from(u16::from_le_bytes([lo, hi]));
        at += 4;
        if format == 4 {
            at = at.saturating_add(size);
        }
    }
    Ok(None)
}
