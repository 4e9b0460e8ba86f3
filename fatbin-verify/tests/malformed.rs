//! Hand-built inputs for every error path: each must give the right `Error` (naming the
//! offset), never a panic, and never an allocation of a size a header merely claims.

use fatbin_verify::cubin::parse_cubin;
use fatbin_verify::fatbin::{parse_container, parse_fatbin, Flags, CONTAINER_SIGNATURE};
use fatbin_verify::{
    image_bytes, list_images, list_images_with_limits, Compression, Error, ImageKind, Limits,
    Target, Variant,
};

/// An entry header (0x40 bytes, or `header_size` if larger) followed by `payload`, padded to 8.
struct EntrySpec {
    kind: u16,
    header_size: u32,
    padded_size: Option<u64>,
    compressed_size: u32,
    minor: u16,
    major: u16,
    sm: u32,
    flags: u64,
    uncompressed_size: u64,
    payload: Vec<u8>,
}

impl Default for EntrySpec {
    fn default() -> Self {
        EntrySpec {
            kind: 1,
            header_size: 0x40,
            padded_size: None,
            compressed_size: 0,
            minor: 0,
            major: 9,
            sm: 80,
            flags: Flags::BITS_64 | Flags::HOST_LINUX,
            uncompressed_size: 0,
            payload: b".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k(\n)\n{\nret;\n}\n\0".to_vec(),
        }
    }
}

impl EntrySpec {
    fn bytes(&self) -> Vec<u8> {
        let mut payload = self.payload.clone();
        payload.resize(payload.len().div_ceil(8) * 8, 0);
        let mut h = Vec::new();
        h.extend_from_slice(&self.kind.to_le_bytes());
        h.extend_from_slice(&0x0101u16.to_le_bytes());
        h.extend_from_slice(&self.header_size.to_le_bytes());
        h.extend_from_slice(
            &self
                .padded_size
                .unwrap_or(payload.len() as u64)
                .to_le_bytes(),
        );
        h.extend_from_slice(&self.compressed_size.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes()); // options offset
        h.extend_from_slice(&self.minor.to_le_bytes());
        h.extend_from_slice(&self.major.to_le_bytes());
        h.extend_from_slice(&self.sm.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes()); // identifier offset
        h.extend_from_slice(&0u32.to_le_bytes()); // identifier length
        h.extend_from_slice(&self.flags.to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes());
        h.extend_from_slice(&self.uncompressed_size.to_le_bytes());
        assert_eq!(h.len(), 0x40);
        h.resize((self.header_size as usize).max(0x40), 0);
        h.extend_from_slice(&payload);
        h
    }
}

fn container(entries: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = entries.concat();
    let mut c = vec![0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0];
    c.extend_from_slice(&(body.len() as u64).to_le_bytes());
    c.extend_from_slice(&body);
    c
}

fn set_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn set_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A minimal ELF64 LE header: no sections, no program headers.
fn elf_header(machine: u16, abi: u8, flags: u32) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..8].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0x41]);
    h[8] = abi;
    h[0x10..0x12].copy_from_slice(&2u16.to_le_bytes());
    h[0x12..0x14].copy_from_slice(&machine.to_le_bytes());
    h[0x30..0x34].copy_from_slice(&flags.to_le_bytes());
    h[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
    h[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    h
}

/// An ELF64 with a NULL section, `.shstrtab` and one `name` section holding `data`.
fn elf_with_section(machine: u16, name: &str, data: &[u8]) -> Vec<u8> {
    let mut f = elf_header(machine, 0, 0);
    let strtab = format!("\0.shstrtab\0{name}\0").into_bytes();
    let strtab_off = f.len();
    f.extend_from_slice(&strtab);
    let data_off = f.len();
    f.extend_from_slice(data);
    f.resize(f.len().div_ceil(8) * 8, 0);
    let shoff = f.len();
    let section = |name: u32, ty: u32, off: usize, size: usize| {
        let mut s = vec![0u8; 64];
        s[0..4].copy_from_slice(&name.to_le_bytes());
        s[4..8].copy_from_slice(&ty.to_le_bytes());
        s[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
        s[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
        s
    };
    f.extend(section(0, 0, 0, 0));
    f.extend(section(1, 3, strtab_off, strtab.len()));
    f.extend(section(11, 1, data_off, data.len()));
    set_u64(&mut f, 0x28, shoff as u64);
    f[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    f[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
    f
}

fn malformed_detail(err: &Error) -> (&'static str, usize, String) {
    match err {
        Error::Malformed {
            what,
            offset,
            detail,
        } => (what, *offset, detail.clone()),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[test]
fn empty_and_garbage_inputs_are_named() {
    assert_eq!(list_images(&[]), Err(Error::Empty));
    let err = list_images(b"hello, not a GPU file").unwrap_err();
    assert_eq!(
        err,
        Error::UnknownFormat {
            len: 21,
            head: "68 65 6c 6c 6f 2c 20 6e".into()
        }
    );
    assert!(err.to_string().contains("is not a fatbin, cubin, PTX file"));
}

#[test]
fn a_well_formed_hand_built_fatbin_lists() {
    let bytes = container(&[EntrySpec::default().bytes()]);
    let images = list_images(&bytes).unwrap();
    assert_eq!(images.len(), 1);
    let i = &images[0];
    assert_eq!(
        (i.kind, i.target, i.ptx_version, i.compression),
        (
            ImageKind::Ptx,
            Some(Target::ptx(80)),
            Some((9, 0)),
            Compression::None
        )
    );
    assert_eq!(i.kernels, ["k"]);
    assert_eq!(i.raw_range, Some(0x50..0x50 + i.size));
    assert_eq!(
        &*image_bytes(&bytes, i).unwrap(),
        &bytes[0x50..0x50 + i.size]
    );
}

#[test]
fn truncated_container_header() {
    let bytes = container(&[EntrySpec::default().bytes()]);
    assert_eq!(
        list_images(&bytes[..12]),
        Err(Error::Truncated {
            what: "fatbin container",
            offset: 8,
            needed: 8,
            available: 4
        })
    );
    assert_eq!(
        list_images(&bytes[..12]).unwrap_err().to_string(),
        "fatbin container at 0x8: needs 0x8 bytes but only 0x4 remain in the input"
    );
}

#[test]
fn container_body_size_past_the_end() {
    let mut bytes = container(&[EntrySpec::default().bytes()]);
    set_u64(&mut bytes, 8, 0x10_0000);
    let err = list_images(&bytes).unwrap_err();
    let (what, offset, detail) = malformed_detail(&err);
    assert_eq!((what, offset), ("fatbin container", 0));
    assert!(
        detail.starts_with("declares 0x100000 bytes of entries"),
        "{detail}"
    );
    // u64 near max must not overflow.
    set_u64(&mut bytes, 8, u64::MAX - 4);
    assert!(matches!(
        list_images(&bytes),
        Err(Error::Malformed {
            what: "fatbin container",
            ..
        })
    ));
}

#[test]
fn entry_header_smaller_than_0x40() {
    let mut bytes = container(&[EntrySpec::default().bytes()]);
    set_u32(&mut bytes, 0x10 + 4, 0x20);
    assert_eq!(
        list_images(&bytes).unwrap_err().to_string(),
        "fatbin entry at 0x10: header size 0x20 is smaller than the 0x40-byte entry header"
    );
}

#[test]
fn entry_header_size_past_the_container() {
    let mut bytes = container(&[EntrySpec::default().bytes()]);
    set_u32(&mut bytes, 0x10 + 4, 0xffff_fff0);
    assert!(matches!(
        list_images(&bytes),
        Err(Error::Truncated {
            what: "fatbin entry",
            offset: 0x10,
            needed: 0xffff_fff0,
            ..
        })
    ));
}

#[test]
fn padded_size_overflow_and_lies() {
    for padded in [u64::MAX, u64::MAX - 7, 1 << 40, 0x1000] {
        let bytes = container(&[EntrySpec {
            padded_size: Some(padded),
            ..Default::default()
        }
        .bytes()]);
        let err = list_images(&bytes).unwrap_err();
        let (what, offset, detail) = malformed_detail(&err);
        assert_eq!((what, offset), ("fatbin entry", 0x10), "{padded:#x}");
        assert!(detail.contains("runs past the container end"), "{detail}");
    }
}

#[test]
fn truncated_entry_header_inside_container() {
    let entry = EntrySpec::default().bytes();
    // Container declares only 0x20 bytes of entries: the entry header cannot fit.
    let mut bytes = container(&[entry]);
    set_u64(&mut bytes, 8, 0x20);
    assert_eq!(
        list_images(&bytes),
        Err(Error::Truncated {
            what: "fatbin entry",
            offset: 0x10,
            needed: 0x40,
            available: 0x20
        })
    );
}

#[test]
fn compressed_size_larger_than_payload() {
    let bytes = container(&[EntrySpec {
        flags: Flags::ZSTD | 1,
        compressed_size: 0x1000,
        uncompressed_size: 10,
        ..Default::default()
    }
    .bytes()]);
    let (_, offset, detail) = malformed_detail(&list_images(&bytes).unwrap_err());
    assert_eq!(offset, 0x10);
    assert!(
        detail.contains("compressed size 0x1000 at +0x10 is larger than"),
        "{detail}"
    );
}

#[test]
fn compressed_without_uncompressed_size_and_both_codecs() {
    let bytes = container(&[EntrySpec {
        flags: Flags::ZSTD,
        compressed_size: 8,
        ..Default::default()
    }
    .bytes()]);
    assert!(malformed_detail(&list_images(&bytes).unwrap_err())
        .2
        .contains("uncompressed size at +0x38 is 0"));
    let bytes = container(&[EntrySpec {
        flags: Flags::ZSTD | Flags::LZ4,
        ..Default::default()
    }
    .bytes()]);
    assert!(malformed_detail(&list_images(&bytes).unwrap_err())
        .2
        .contains("both LZ4 and zstd"));
}

/// A zstd frame of RLE blocks: `n` bytes of b'.' from a few bytes of input.
fn zstd_rle(n: u32) -> Vec<u8> {
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0b1010_0000];
    f.extend_from_slice(&n.to_le_bytes());
    let mut left = n;
    loop {
        let size = left.min(128 << 10);
        left -= size;
        f.extend_from_slice(&(u32::from(left == 0) | (1 << 1) | (size << 3)).to_le_bytes()[..3]);
        f.push(b'.');
        if left == 0 {
            return f;
        }
    }
}

#[test]
fn zstd_bomb_errors_instead_of_allocating() {
    // Declared 1 TiB from 41 bytes: refused by the ratio cap before any decoding.
    let frame = zstd_rle(1 << 20);
    let spec = EntrySpec {
        flags: Flags::ZSTD | 1,
        compressed_size: frame.len() as u32,
        uncompressed_size: 1 << 40,
        payload: frame.clone(),
        ..Default::default()
    };
    let err = list_images(&container(&[spec.bytes()])).unwrap_err();
    let (what, offset, detail) = malformed_detail(&err);
    assert_eq!((what, offset), ("fatbin entry", 0x10));
    assert!(
        detail.starts_with("uncompressed size 0x10000000000 at +0x38 is over the cap of 0x102900 bytes for the 0x29 compressed bytes"),
        "{detail}"
    );
    // Declared small but the frame really holds 1 MiB: output is cut at the declared size.
    let spec = EntrySpec {
        uncompressed_size: 4096,
        ..spec
    };
    let err = list_images(&container(&[spec.bytes()])).unwrap_err();
    assert!(
        err.to_string()
            .contains("decompressed to more than 4096 bytes"),
        "{err}"
    );
    // Honest 1 MiB, but the caller's limit is 64 KiB.
    let spec = EntrySpec {
        uncompressed_size: 1 << 20,
        ..spec
    };
    let err = list_images_with_limits(
        &container(&[spec.bytes()]),
        &Limits {
            max_decompressed_total: 64 << 10,
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                size: 0x10_0000,
                limit: 0x1_0000,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn lz4_bomb_errors_instead_of_allocating() {
    let block = vec![0x1f, b'a', 0, 0, 0, 0, 0, 0];
    let spec = EntrySpec {
        flags: Flags::LZ4 | 1,
        compressed_size: block.len() as u32,
        uncompressed_size: u64::MAX,
        payload: block,
        ..Default::default()
    };
    let err = list_images(&container(&[spec.bytes()])).unwrap_err();
    assert!(
        malformed_detail(&err)
            .2
            .contains("is over the cap of 0x100800 bytes for the 0x8 compressed bytes"),
        "{err}"
    );
    // Under the ratio cap but over what LZ4 can expand 8 bytes to.
    let spec = EntrySpec {
        uncompressed_size: 8 * 255 + 17,
        ..spec
    };
    let err = list_images(&container(&[spec.bytes()])).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decompress {
                codec: "lz4",
                offset: 0x50,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("more than LZ4 can expand"));
}

#[test]
fn non_elf_payload_in_an_elf_entry() {
    let bytes = container(&[EntrySpec {
        kind: 2,
        payload: b"definitely not an ELF file".to_vec(),
        ..Default::default()
    }
    .bytes()]);
    let (what, offset, detail) = malformed_detail(&list_images(&bytes).unwrap_err());
    assert_eq!((what, offset), ("fatbin entry", 0x10));
    assert!(detail.contains("its elf image is malformed"), "{detail}");
}

#[test]
fn unknown_kinds_are_kept_and_obfuscated_payloads_are_opaque() {
    let bytes = container(&[
        EntrySpec {
            kind: 5,
            payload: vec![1, 2, 3],
            ..Default::default()
        }
        .bytes(),
        EntrySpec {
            kind: 8,
            flags: Flags::ZSTD | Flags::OBFUSCATED | 1,
            compressed_size: 6,
            uncompressed_size: 999,
            payload: vec![9; 6],
            ..Default::default()
        }
        .bytes(),
    ]);
    let images = list_images(&bytes).unwrap();
    assert_eq!(images[0].kind, ImageKind::Unknown(5));
    assert_eq!(images[0].target, None);
    assert_eq!(images[0].size, 8); // the padded payload: no way to know its true end
    assert_eq!(images[1].kind, ImageKind::LtoIr);
    assert_eq!(images[1].size, 6);
    assert_eq!(&*image_bytes(&bytes, &images[1]).unwrap(), &[9u8; 6][..]);
}

#[test]
fn header_strings_outside_the_header() {
    let mut bytes = container(&[EntrySpec::default().bytes()]);
    set_u32(&mut bytes, 0x10 + 0x20, 0x38); // identifier at +0x38 ...
    set_u32(&mut bytes, 0x10 + 0x24, 0x100); // ... 0x100 bytes long
    assert!(malformed_detail(&list_images(&bytes).unwrap_err())
        .2
        .contains("run past the 0x40-byte entry header"));
    let mut bytes = container(&[EntrySpec::default().bytes()]);
    set_u32(&mut bytes, 0x10 + 0x14, 0x3e); // options descriptor straddles the header end
    assert!(malformed_detail(&list_images(&bytes).unwrap_err())
        .2
        .contains("options descriptor offset 0x3e"));
}

#[test]
fn trailing_bytes_after_a_raw_fatbin() {
    let mut bytes = container(&[EntrySpec::default().bytes()]);
    bytes.extend_from_slice(&[0; 16]);
    assert_eq!(parse_fatbin(&bytes).unwrap().len(), 1);
    bytes.extend_from_slice(b"junk!!!!");
    let (what, offset, _) = malformed_detail(&list_images(&bytes).unwrap_err());
    assert_eq!((what, offset), ("fatbin container", bytes.len() - 24));
    assert!(parse_container(&bytes, bytes.len()).is_err());
}

#[test]
fn cubin_e_flags_in_both_layouts() {
    // Layout v1 (ABI 7): sm_90a from 12.9 ptxas, virtual SM in bits 16-23.
    let v1 = parse_cubin(&elf_header(190, 7, 0x005a_0d5a)).unwrap();
    assert_eq!(
        (v1.target, v1.virtual_sm),
        (
            Target::sass(90).with_variant(Variant::ArchSpecific),
            Some(90)
        )
    );
    // Layout v2 (ABI 8): SM in bits 8-15, virtual SM only in the cuinfo note.
    let v2 = parse_cubin(&elf_header(190, 8, 0x0600_5a04)).unwrap();
    assert_eq!(
        (v2.target, v2.virtual_sm, v2.extent),
        (Target::sass(90), None, 64)
    );
    let v2 = parse_cubin(&elf_header(190, 8, 0x0600_6402)).unwrap();
    assert_eq!(v2.target, Target::sass(100));
    // OSABI 0x41 alone does not make a cubin: e_machine decides.
    let err = parse_cubin(&elf_header(62, 8, 0)).unwrap_err();
    assert_eq!(
        malformed_detail(&err).2,
        "e_machine is 62, expected 190 (EM_CUDA)"
    );
}

#[test]
fn elf_with_a_bad_section_table() {
    // Section table past the end of the file.
    let mut cubin = elf_header(190, 8, 0x0600_5a04);
    set_u64(&mut cubin, 0x28, 0x1000);
    cubin[0x3c] = 3;
    let (what, offset, detail) = malformed_detail(&list_images(&cubin).unwrap_err());
    assert_eq!((what, offset), ("ELF section header table", 0x1000));
    assert!(detail.contains("3 section headers"), "{detail}");
    // Wrong section header size.
    cubin[0x3a] = 40;
    assert!(malformed_detail(&list_images(&cubin).unwrap_err())
        .2
        .contains("section header size is 0x28"));
    // A host ELF whose section data points outside the file.
    let mut host = elf_with_section(62, ".rodata", b"plain data");
    let shoff = u64::from_le_bytes(host[0x28..0x30].try_into().unwrap()) as usize;
    set_u64(&mut host, shoff + 2 * 64 + 0x20, u64::MAX);
    let (what, _, detail) = malformed_detail(&list_images(&host).unwrap_err());
    assert_eq!(what, "ELF section header");
    assert!(detail.contains("runs past the end"), "{detail}");
    // Truncated ELF header.
    assert!(matches!(
        list_images(&cubin[..40]),
        Err(Error::Truncated {
            what: "ELF header",
            ..
        })
    ));
}

#[test]
fn fatbin_embedded_as_plain_data_at_any_alignment() {
    let fatbin = container(&[EntrySpec::default().bytes()]);
    let mut data = b"xyz".to_vec(); // unaligned, as include_bytes! may place it
    data.extend_from_slice(&fatbin);
    let host = elf_with_section(62, ".rodata", &data);
    let images = list_images(&host).unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].source.section.as_deref(), Some(".rodata"));
    assert_eq!(images[0].kernels, ["k"]);
    let at = images[0].source.container_offset.unwrap();
    assert_eq!(&host[at..at + 4], &[0x50, 0xed, 0x55, 0xba]);
    // Appended after the ELF, outside every section: still found, with no section name.
    let mut appended = host.clone();
    appended.resize(appended.len().div_ceil(8) * 8, 0);
    let at = appended.len();
    appended.extend_from_slice(&fatbin);
    let images = list_images(&appended).unwrap();
    assert_eq!(images.len(), 2);
    assert_eq!(
        (
            images[1].source.container_offset,
            images[1].source.section.as_deref()
        ),
        (Some(at), None)
    );
    // A host ELF with no fatbin lists nothing, without error.
    assert_eq!(
        list_images(&elf_with_section(62, ".text", &[0x90; 32])).unwrap(),
        vec![]
    );
}

#[test]
fn archive_members_are_named() {
    let fatbin = container(&[EntrySpec::default().bytes()]);
    let mut ar = b"!<arch>\n".to_vec();
    for (name, data) in [
        ("a.o/", elf_with_section(62, ".nv_fatbin", &fatbin)),
        ("blob.bin/", fatbin.clone()),
    ] {
        ar.extend_from_slice(
            format!(
                "{name:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n",
                0,
                0,
                0,
                644,
                data.len()
            )
            .as_bytes(),
        );
        ar.extend_from_slice(&data);
        if ar.len() % 2 == 1 {
            ar.push(b'\n');
        }
    }
    let images = list_images(&ar).unwrap();
    let members: Vec<_> = images
        .iter()
        .map(|i| (i.source.member.as_deref(), i.source.section.as_deref()))
        .collect();
    assert_eq!(
        members,
        [(Some("a.o"), Some(".nv_fatbin")), (Some("blob.bin"), None)]
    );
    for i in &images {
        assert_eq!(image_bytes(&ar, i).unwrap().len(), i.size);
    }
    // A member that claims more bytes than the archive has.
    let mut bad = b"!<arch>\n".to_vec();
    bad.extend_from_slice(
        format!(
            "{:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n",
            "x/", 0, 0, 0, 644, 99999
        )
        .as_bytes(),
    );
    assert!(matches!(
        list_images(&bad),
        Err(Error::Malformed {
            what: "ar archive",
            ..
        })
    ));
}

#[test]
fn image_bytes_refuses_a_foreign_image_info() {
    let bytes = container(&[EntrySpec::default().bytes()]);
    let mut info = list_images(&bytes).unwrap().remove(0);
    info.raw_range = Some(0..1 << 20);
    assert!(matches!(
        image_bytes(&bytes, &info),
        Err(Error::ImageNotFound { .. })
    ));
    info.raw_range = None;
    info.source.entry_index = 7;
    assert!(matches!(
        image_bytes(&bytes, &info),
        Err(Error::ImageNotFound { .. })
    ));
}

// ---- Regressions from the parser review ----

/// An ELF64 (x86-64) whose section table follows `data`; each section is `(name, offset, size)`
/// with names resolved through a `.shstrtab` added as section 1. A size of `usize::MAX` means
/// "the whole file".
fn elf_with_sections(data: &[u8], sections: &[(&str, usize, usize)]) -> Vec<u8> {
    let mut names = b"\0.shstrtab\0".to_vec();
    let mut name_offsets = std::collections::HashMap::new();
    for (name, ..) in sections {
        name_offsets.entry(*name).or_insert_with(|| {
            let at = names.len();
            names.extend_from_slice(name.as_bytes());
            names.push(0);
            at
        });
    }
    let mut f = elf_header(62, 0, 0);
    let names_off = f.len();
    f.extend_from_slice(&names);
    let data_off = f.len();
    f.extend_from_slice(data);
    f.resize(f.len().div_ceil(8) * 8, 0);
    let shoff = f.len();
    let count = sections.len() + 2;
    let file_len = shoff + count * 64;
    let header = |name: usize, ty: u32, off: usize, size: usize| {
        let mut s = vec![0u8; 64];
        s[0..4].copy_from_slice(&(name as u32).to_le_bytes());
        s[4..8].copy_from_slice(&ty.to_le_bytes());
        s[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
        s[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
        s
    };
    f.extend(header(0, 0, 0, 0));
    f.extend(header(1, 3, names_off, names.len()));
    for (name, off, size) in sections {
        let (off, size) = if *size == usize::MAX {
            (0, file_len)
        } else {
            (data_off + off, *size)
        };
        f.extend(header(name_offsets[name], 1, off, size));
    }
    assert_eq!(f.len(), file_len);
    set_u64(&mut f, 0x28, shoff as u64);
    f[0x3c..0x3e].copy_from_slice(&(count as u16).to_le_bytes());
    f[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
    f
}

/// Offset of the first container signature in `bytes`.
fn signature_at(bytes: &[u8]) -> usize {
    bytes
        .windows(8)
        .position(|w| w == CONTAINER_SIGNATURE)
        .expect("a signature")
}

#[test]
fn many_sections_over_the_whole_file_are_one_scan_and_the_smallest_names_a_hit() {
    // 16,000 sections all covering the 1 MiB file, listed before the one small section that
    // really holds the fatbin, plus 2,000 chance signatures outside any container. Scanning
    // each section's range took N x file size; one scan labels each hit by its smallest section.
    let fatbin = container(&[EntrySpec::default().bytes()]);
    let mut data = Vec::new();
    for _ in 0..2000 {
        data.extend_from_slice(&CONTAINER_SIGNATURE);
        data.extend_from_slice(&[0xff; 8]);
    }
    let fatbin_at = data.len();
    data.extend_from_slice(&fatbin);
    let mut sections = vec![(".big", 0, usize::MAX); 16_000];
    sections.push((".rodata", fatbin_at, fatbin.len()));
    let elf = elf_with_sections(&data, &sections);
    assert!(elf.len() > 1 << 20);
    let images = list_images(&elf).unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].source.section.as_deref(), Some(".rodata"));
    assert_eq!(images[0].kernels, ["k"]);
    // Equal ranges: the section listed first wins, whatever the order of the others.
    let elf = elf_with_sections(&fatbin, &[(".b", 0, fatbin.len()), (".a", 0, fatbin.len())]);
    assert_eq!(
        list_images(&elf).unwrap()[0].source.section.as_deref(),
        Some(".b")
    );
}

#[test]
fn chance_signatures_outside_fatbin_sections_are_not_containers() {
    // The signature as a constant in .rodata, followed by unrelated data: 0 images, no error.
    let mut data = b"some constant data".to_vec();
    data.extend_from_slice(&CONTAINER_SIGNATURE);
    data.extend_from_slice(&[0, 0, 0, 0, 0, 0x3c, 0, 0]); // "declares" 0x3c0000000000 bytes
    data.extend_from_slice(b"more constants follow here, not entries at all ......");
    assert_eq!(
        list_images(&elf_with_section(62, ".rodata", &data)).unwrap(),
        vec![]
    );
    // A size that fits, but no entry header after it.
    let mut small = CONTAINER_SIGNATURE.to_vec();
    small.extend_from_slice(&0x40u64.to_le_bytes());
    small.extend_from_slice(&[0x11; 0x40]);
    assert_eq!(
        list_images(&elf_with_section(62, ".text", &small)).unwrap(),
        vec![]
    );
    // In .nv_fatbin a signature must be a container: the parse failure is reported.
    let at = signature_at(&data);
    let host = elf_with_section(62, ".nv_fatbin", &data[at..]);
    let (what, offset, detail) = malformed_detail(&list_images(&host).unwrap_err());
    assert_eq!((what, offset), ("fatbin container", signature_at(&host)));
    assert!(
        detail.starts_with("declares 0x3c0000000000 bytes of entries"),
        "{detail}"
    );
    // A raw fatbin file stays strict too.
    let mut raw = CONTAINER_SIGNATURE.to_vec();
    raw.extend_from_slice(&[0, 0, 0, 0, 0, 0x3c, 0, 0]);
    assert!(malformed_detail(&list_images(&raw).unwrap_err())
        .2
        .starts_with("declares 0x3c0000000000 bytes"));
}

#[test]
fn the_built_cli_binary_lists_no_images() {
    // It carries the signature in .rodata and as an instruction immediate, never a container.
    let exe = std::fs::read(env!("CARGO_BIN_EXE_fatbin-verify")).unwrap();
    assert!(exe.windows(8).any(|w| w == CONTAINER_SIGNATURE));
    assert_eq!(list_images(&exe).unwrap(), vec![]);
}

/// Container A with one PTX entry `k`, then container B with one PTX entry `hidden`, with A's
/// body size and its entry's padded size enlarged so that A swallows B.
fn swallowing_pair() -> (Vec<u8>, usize) {
    let a = container(&[EntrySpec::default().bytes()]);
    let b = container(&[EntrySpec {
        payload: b".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry hidden(\n)\n{\nret;\n}\n\0".to_vec(),
        ..Default::default()
    }
    .bytes()]);
    let mut both = [a.clone(), b.clone()].concat();
    assert_eq!(list_images(&both).unwrap().len(), 2);
    let body = u64::from_le_bytes(both[8..16].try_into().unwrap());
    let padded = u64::from_le_bytes(both[0x18..0x20].try_into().unwrap());
    set_u64(&mut both, 8, body + b.len() as u64);
    set_u64(&mut both, 0x18, padded + b.len() as u64);
    (both, a.len())
}

#[test]
fn a_container_that_swallows_the_next_is_an_error() {
    let (both, b_at) = swallowing_pair();
    // Embedded in a host binary: named by both offsets.
    let host = elf_with_section(62, ".nv_fatbin", &both);
    let a_at = signature_at(&host);
    let (what, offset, detail) = malformed_detail(&list_images(&host).unwrap_err());
    assert_eq!((what, offset), ("fatbin container", a_at + b_at));
    assert_eq!(
        detail,
        format!(
            "container at {:#x} lies inside the container at {a_at:#x} (which declares {:#x} bytes of entries, ending at {:#x}); expected containers one after another",
            a_at + b_at,
            both.len() - 0x10,
            a_at + both.len()
        )
    );
    // The same in .rodata (plain data): B is plausible, so still an error, not a skip.
    let host = elf_with_section(62, ".rodata", &both);
    assert!(malformed_detail(&list_images(&host).unwrap_err())
        .2
        .contains("lies inside the container at"));
    // As a raw fatbin: B is the padding of A's last entry, and padding must be zeros.
    let (what, offset, detail) = malformed_detail(&list_images(&both).unwrap_err());
    assert_eq!((what, offset), ("fatbin entry", 0x10));
    assert!(
        detail.starts_with("padded payload size 0xf0 at +0x08 leaves 0xa5 bytes after its 0x4b bytes of ptx data; expected at most 7"),
        "{detail}"
    );
}

#[test]
fn a_chance_signature_inside_a_container_is_its_data() {
    // An entry payload holding the signature (PTX text cannot: the signature has a NUL) is
    // part of that entry, not a second container.
    let mut payload = b"opaque ".to_vec();
    payload.extend_from_slice(&CONTAINER_SIGNATURE);
    payload.extend_from_slice(b" then more opaque bytes");
    let fatbin = container(&[EntrySpec {
        kind: 5,
        payload,
        ..Default::default()
    }
    .bytes()]);
    let images = list_images(&elf_with_section(62, ".nv_fatbin", &fatbin)).unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].kind, ImageKind::Unknown(5));
}

#[test]
fn padding_after_an_image_must_be_short_and_zero() {
    // PTX: 74 bytes of text, its NUL, 5 zero bytes to 0x50. One more padding block is too much.
    let mut long = EntrySpec::default();
    long.payload.extend_from_slice(&[0; 8]);
    let err = list_images(&container(&[long.bytes()])).unwrap_err();
    assert_eq!(
        malformed_detail(&err).2,
        "padded payload size 0x58 at +0x08 leaves 0xd bytes after its 0x4b bytes of ptx data; expected at most 7 (padding to 8)"
    );
    // A non-zero byte in the padding, after the NUL.
    let mut bytes = container(&[EntrySpec::default().bytes()]);
    bytes[0x50 + 0x4d] = b'x';
    assert_eq!(
        malformed_detail(&list_images(&bytes).unwrap_err()),
        (
            "fatbin entry",
            0x10,
            "padding byte at 0x9d (after its 0x4b bytes of ptx data) is 0x78, expected 0".into()
        )
    );
    // A cubin: nothing may follow its ELF extent but padding to 8.
    let mut cubin = elf_header(190, 8, 0x0600_5004);
    cubin.extend_from_slice(&[0; 8]);
    let spec = EntrySpec {
        kind: 2,
        minor: 8,
        major: 1,
        payload: cubin,
        ..Default::default()
    };
    assert!(
        malformed_detail(&list_images(&container(&[spec.bytes()])).unwrap_err())
            .2
            .contains("leaves 0x8 bytes after its 0x40 bytes of elf data")
    );
    // Compressed: padding after the compressed stream only.
    let frame = zstd_rle(100);
    let mut payload = frame.clone();
    payload.resize(frame.len().div_ceil(8) * 8 + 8, 0);
    let spec = EntrySpec {
        kind: 8,
        flags: Flags::ZSTD | 1,
        compressed_size: frame.len() as u32,
        uncompressed_size: 100,
        payload,
        ..Default::default()
    };
    assert!(
        malformed_detail(&list_images(&container(&[spec.bytes()])).unwrap_err())
            .2
            .contains("bytes of lto-ir data; expected at most 7")
    );
}

#[test]
fn ptx_version_comes_from_the_hashed_text() {
    // Header 8.0, text `.version 9.0`: the header is not covered by the hash, so it may not
    // contradict the text.
    let spec = EntrySpec {
        major: 8,
        minor: 0,
        ..Default::default()
    };
    assert_eq!(
        malformed_detail(&list_images(&container(&[spec.bytes()])).unwrap_err()),
        (
            "fatbin entry",
            0x10,
            "header says PTX ISA 8.0 at +0x1a/+0x18, but its text says `.version 9.0`".into()
        )
    );
    // No version in the header: the text's.
    let spec = EntrySpec {
        major: 0,
        minor: 0,
        ..Default::default()
    };
    let images = list_images(&container(&[spec.bytes()])).unwrap();
    assert_eq!(images[0].ptx_version, Some((9, 0)));
    // No `.version` in the text (not real PTX): the header's.
    let spec = EntrySpec {
        major: 7,
        minor: 8,
        payload: b".target sm_80\n\0".to_vec(),
        ..Default::default()
    };
    let images = list_images(&container(&[spec.bytes()])).unwrap();
    assert_eq!(images[0].ptx_version, Some((7, 8)));
}

#[test]
fn cubin_sm_must_match_the_entry_header() {
    // 13.0 layout sm_90 cubin (e_flags 0x06005a04) in an entry whose header says sm_80.
    let spec = EntrySpec {
        kind: 2,
        minor: 8,
        major: 1,
        sm: 80,
        payload: elf_header(190, 8, 0x0600_5a04),
        ..Default::default()
    };
    assert_eq!(
        malformed_detail(&list_images(&container(&[spec.bytes()])).unwrap_err()),
        (
            "fatbin entry",
            0x10,
            "header says sm_80 at +0x1c, but its cubin's e_flags 0x06005a04 say sm_90".into()
        )
    );
    let spec = EntrySpec { sm: 90, ..spec };
    let images = list_images(&container(&[spec.bytes()])).unwrap();
    assert_eq!(images[0].target, Some(Target::sass(90)));
}

#[test]
fn zstd_ratio_over_256_is_refused_before_decoding() {
    // 32 KiB of RLE blocks that really expand to 1 GiB, declared as such: under the old 1 GiB
    // budget this allocated and decoded all of it.
    let frame = zstd_rle(1 << 30);
    let spec = EntrySpec {
        flags: Flags::ZSTD | 1,
        compressed_size: frame.len() as u32,
        uncompressed_size: 1 << 30,
        payload: frame.clone(),
        ..Default::default()
    };
    let bytes = container(&[spec.bytes()]);
    assert_eq!(bytes.len(), 32_864);
    let cap = frame.len() as u64 * 256 + (1 << 20);
    assert_eq!(
        malformed_detail(&list_images(&bytes).unwrap_err()),
        (
            "fatbin entry",
            0x10,
            format!(
                "uncompressed size 0x40000000 at +0x38 is over the cap of {cap:#x} bytes for the {:#x} compressed bytes at +0x10 (256 times the compressed size plus 1 MiB)",
                frame.len()
            )
        )
    );
}

#[test]
fn default_budget_is_512_mib() {
    assert_eq!(Limits::default().max_decompressed_total, 512 << 20);
    // 513 MiB declared for 2.1 MB stored: within the ratio cap, over the default budget;
    // refused before decoding.
    let frame = zstd_rle(1 << 20);
    let mut payload = frame.clone();
    payload.resize(2_100_000, 0);
    let spec = EntrySpec {
        flags: Flags::ZSTD | 1,
        compressed_size: payload.len() as u32,
        uncompressed_size: 513 << 20,
        payload,
        ..Default::default()
    };
    assert_eq!(
        list_images(&container(&[spec.bytes()])).unwrap_err(),
        Error::TooLarge {
            what: "fatbin entry payload",
            offset: 0x50,
            size: 513 << 20,
            limit: 512 << 20
        }
    );
}

#[test]
fn the_gap_before_the_next_container_must_be_zero() {
    // An entry header of 0x44 bytes leaves the first container 4 bytes short of alignment.
    let first = container(&[EntrySpec {
        header_size: 0x44,
        ..Default::default()
    }
    .bytes()]);
    assert_eq!(first.len() % 8, 4);
    let second = container(&[EntrySpec::default().bytes()]);
    let with_gap = |gap: &[u8]| [first.clone(), gap.to_vec(), second.clone()].concat();
    assert_eq!(list_images(&with_gap(&[0; 4])).unwrap().len(), 2);
    let bytes = with_gap(b"\0\0j\0");
    assert_eq!(
        malformed_detail(&list_images(&bytes).unwrap_err()),
        (
            "fatbin container",
            first.len() + 2,
            format!(
                "byte 0x6a in the alignment gap after the container at 0x0 (which ends at {:#x}); expected zero up to the next 8-byte boundary {:#x}",
                first.len(),
                first.len() + 4
            )
        )
    );
}

// ---- Fatbin sections are read whole, as cuobjdump reads them ----

/// Two one-entry containers, `k` and `hidden`, each a multiple of 8 bytes long.
fn two_containers() -> (Vec<u8>, Vec<u8>) {
    let a = container(&[EntrySpec::default().bytes()]);
    let b = container(&[EntrySpec {
        payload: b".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry hidden(\n)\n{\nret;\n}\n\0".to_vec(),
        ..Default::default()
    }
    .bytes()]);
    assert_eq!((a.len() % 8, b.len() % 8), (0, 0));
    (a, b)
}

/// Where the (only) `.nv_fatbin` section's data starts in a file `elf_with_section` made.
fn section_start(host: &[u8], data: &[u8]) -> usize {
    host.windows(data.len())
        .position(|w| w == data)
        .expect("section data")
}

#[test]
fn words_of_zeros_in_a_fatbin_section_are_padding() {
    let (a, b) = two_containers();
    // Leading zeros, a gap of two words, trailing zeros: cuobjdump lists both containers.
    let data = [vec![0; 8], a.clone(), vec![0; 16], b.clone(), vec![0; 8]].concat();
    let host = elf_with_section(62, ".nv_fatbin", &data);
    let start = section_start(&host, &data);
    let images = list_images(&host).unwrap();
    let found: Vec<_> = images
        .iter()
        .map(|i| {
            (
                i.source.container_offset,
                i.source.section.as_deref(),
                i.kernels.clone(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            (Some(start + 8), Some(".nv_fatbin"), vec!["k".to_string()]),
            (
                Some(start + 8 + a.len() + 16),
                Some(".nv_fatbin"),
                vec!["hidden".to_string()]
            ),
        ]
    );
}

#[test]
fn other_bytes_between_containers_in_a_fatbin_section_are_an_error() {
    // cuobjdump lists the first container, then stops: "Invalid fatbin header". So does this,
    // naming the section and the bytes, instead of skipping to the next signature.
    let (a, b) = two_containers();
    let data = [a.clone(), vec![0x11; 8], b.clone()].concat();
    let host = elf_with_section(62, ".nv_fatbin", &data);
    let start = section_start(&host, &data);
    let (what, offset, detail) = malformed_detail(&list_images(&host).unwrap_err());
    assert_eq!((what, offset), ("fatbin section", start + a.len()));
    assert_eq!(
        detail,
        format!(
            "section `.nv_fatbin` ({start:#x}..{:#x}) holds `11 11 11 11 11 11 11 11` at +{:#x}, expected a fatbin container (`50 ed 55 ba`) or 8 zero bytes of padding: NVIDIA's tools read this section as containers one after another on an 8-byte grid",
            start + data.len(),
            a.len()
        )
    );
    // The same bytes in .rodata are plain data around two containers.
    assert_eq!(
        list_images(&elf_with_section(62, ".rodata", &data))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_container_off_the_8_byte_grid_of_its_section_is_an_error() {
    // cuobjdump does not find a container 4 bytes past a grid point either.
    let (a, b) = two_containers();
    let data = [a.clone(), vec![0; 4], b].concat();
    let host = elf_with_section(62, ".nv_fatbin", &data);
    let start = section_start(&host, &data);
    let (what, offset, detail) = malformed_detail(&list_images(&host).unwrap_err());
    assert_eq!((what, offset), ("fatbin section", start + a.len()));
    assert!(
        detail.contains("holds `00 00 00 00 50 ed 55 ba`"),
        "{detail}"
    );
}

#[test]
fn a_damaged_container_header_in_a_fatbin_section_is_an_error_not_a_gap() {
    // A scan for the signature would skip the damaged container and lose its images silently.
    let (a, b) = two_containers();
    let mut data = [a.clone(), b].concat();
    data[a.len()] ^= 0xff;
    let host = elf_with_section(62, ".nv_fatbin", &data);
    let start = section_start(&host, &data);
    let (what, offset, _) = malformed_detail(&list_images(&host).unwrap_err());
    assert_eq!((what, offset), ("fatbin section", start + a.len()));
}

#[test]
fn a_container_must_end_within_its_fatbin_section() {
    // The section is cut short in the middle of the container; the bytes after it are still
    // in the file, but belong to no section.
    let (a, _) = two_containers();
    let host = elf_with_sections(&a, &[(".nv_fatbin", 0, a.len() - 8)]);
    let start = section_start(&host, &a);
    let (what, offset, detail) = malformed_detail(&list_images(&host).unwrap_err());
    assert_eq!((what, offset), ("fatbin container", start));
    assert!(
        detail.starts_with(&format!(
            "declares {:#x} bytes of entries, but only {:#x} bytes follow its header",
            a.len() - 16,
            a.len() - 24
        )),
        "{detail}"
    );
}
