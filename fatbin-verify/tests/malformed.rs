//! Hand-built inputs for every error path: each must give the right `Error` (naming the
//! offset), never a panic, and never an allocation of a size a header merely claims.

use fatbin_verify::cubin::parse_cubin;
use fatbin_verify::fatbin::{parse_container, parse_fatbin, Flags};
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
    // Declared 1 TiB: refused by the default 1 GiB limit before any decoding.
    let frame = zstd_rle(1 << 20);
    let spec = EntrySpec {
        flags: Flags::ZSTD | 1,
        compressed_size: frame.len() as u32,
        uncompressed_size: 1 << 40,
        payload: frame.clone(),
        ..Default::default()
    };
    let err = list_images(&container(&[spec.bytes()])).unwrap_err();
    assert_eq!(
        err,
        Error::TooLarge {
            what: "fatbin entry payload",
            offset: 0x50,
            size: 1 << 40,
            limit: 1 << 30
        }
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
