//! `fatbin-verify` on this crate's own output: the built `qwen-decode` binary carries exactly the
//! images the manifest and lock promise, and one flipped byte inside one embedded image makes
//! verification fail naming that module and target.

use std::path::Path;

use fatbin_verify::lock::Lock;
use fatbin_verify::manifest::Manifest;
use fatbin_verify::verify::{verify, FileImages};
use fatbin_verify::{list_images, Target};

fn manifest_and_lock() -> (Manifest, Lock) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    (
        Manifest::from_path(&root.join("aot-manifest.toml")).unwrap(),
        Lock::from_path(&root.join("aot-manifest.lock")).unwrap(),
    )
}

fn check(name: &str, bytes: &[u8]) -> Vec<String> {
    let (manifest, lock) = manifest_and_lock();
    let images = list_images(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    verify(
        &manifest,
        Some(&lock),
        &[FileImages {
            name: name.into(),
            images,
        }],
    )
    .iter()
    .map(|d| d.to_string())
    .collect()
}

fn require_full_build() {
    assert!(
        aot_kernels::registry::build_info().target_filter.is_none(),
        "built with AOT_TARGETS: the binary cannot carry every promised image; rebuild without it"
    );
}

#[test]
fn the_built_binary_carries_exactly_the_promised_images() {
    require_full_build();
    let bytes = std::fs::read(env!("CARGO_BIN_EXE_qwen-decode")).unwrap();
    let out = check("qwen-decode", &bytes);
    assert!(out.is_empty(), "{out:#?}");
}

#[test]
fn one_flipped_byte_in_one_image_names_its_module_and_target() {
    require_full_build();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("qwen-decode");
    std::fs::copy(env!("CARGO_BIN_EXE_qwen-decode"), &copy).unwrap();
    let mut bytes = std::fs::read(&copy).unwrap();

    // Thor's rotary image: flip one byte in the middle of its code.
    let target = Target::sass(110);
    let images = list_images(&bytes).unwrap();
    let image = images
        .iter()
        .find(|i| i.target == Some(target) && i.kernels.iter().any(|k| k == "rotary_neox_bf16"))
        .expect("the binary embeds rotary sm_110");
    let range = image.raw_range.clone().expect("embedded uncompressed");
    let at = range.start + range.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&copy, &bytes).unwrap();

    let out = check("qwen-decode (tampered)", &std::fs::read(&copy).unwrap());
    assert_eq!(out.len(), 1, "exactly one discrepancy: {out:#?}");
    assert!(
        out[0].starts_with("rotary sm_110 (CUDA 13.0): sha256 "),
        "{}",
        out[0]
    );
}

#[test]
fn one_flipped_byte_in_a_cuda12_image_names_its_toolchain() {
    require_full_build();
    let mut bytes = std::fs::read(env!("CARGO_BIN_EXE_qwen-decode")).unwrap();
    // Orin's CUDA 12 activation image (what JetPack 6 runs): ELF ABI 7, so CUDA 12.
    let images = list_images(&bytes).unwrap();
    let image = images
        .iter()
        .find(|i| {
            i.target == Some(Target::sass(87))
                && i.elf_abi == Some(7)
                && i.kernels.iter().any(|k| k == "silu_and_mul_bf16")
        })
        .expect("the binary embeds activation sm_87 of CUDA 12");
    let range = image.raw_range.clone().expect("embedded uncompressed");
    bytes[range.start + range.len() / 2] ^= 0x40;
    let out = check("qwen-decode (tampered)", &bytes);
    assert_eq!(out.len(), 1, "exactly one discrepancy: {out:#?}");
    assert!(
        out[0].starts_with("activation sm_87 (CUDA 12.9): sha256 "),
        "{}",
        out[0]
    );
}
