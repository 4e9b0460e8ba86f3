//! `verify`: table-driven checks of the manifest/lock comparison on plain `ImageInfo` values.

use std::path::Path;

use fatbin_verify::lock::{Lock, LockedImage, LockedModule, LOCK_FORMAT};
use fatbin_verify::manifest::Manifest;
use fatbin_verify::verify::{verify, FileImages};
use fatbin_verify::{
    sha256_hex, Compression, CudaRelease, ImageInfo, ImageKind, ImageSource, Target,
};

const MANIFEST: &str = r#"
[toolchain]
cuda = "13.0"
nvcc_version = "13.0.88"

[targets]
sass = ["sm_80", "sm_90"]
ptx = "compute_80"

[[extra_toolchain]]
cuda = "12.9"
compiler = "nvrtc"
version = "12.9.86"
sass = ["sm_90"]
ptx = "compute_80"

[[module]]
name = "rmsnorm"
kind = "cuda"
source = "kernels/norm/rmsnorm.cu"
entries = ["rmsnorm_bf16", "fused_add_rmsnorm_bf16"]

[[module]]
name = "rotary"
kind = "cuda"
source = "kernels/rotary/rotary_neox.cu"
entries = ["rotary_neox_bf16"]
"#;

fn manifest() -> Manifest {
    Manifest::parse(MANIFEST, Path::new("aot-manifest.toml")).expect("test manifest")
}

const CU13: CudaRelease = CudaRelease::new(13, 0);
const CU12: CudaRelease = CudaRelease::new(12, 9);

/// A distinct fake digest per (module, toolchain, target).
fn digest(module: &str, toolchain: CudaRelease, target: Target) -> [u8; 32] {
    let mut d = [0u8; 32];
    for (i, b) in format!("{module}{toolchain}{target}")
        .bytes()
        .enumerate()
        .take(32)
    {
        d[i] = b;
    }
    d
}

/// A CUDA 13.0 image, as nvcc 13.0 records it (toolkit string).
fn image(container: usize, module: &str, target: &str, kernels: &[&str]) -> ImageInfo {
    image_of(CU13, container, module, target, kernels)
}

/// An image of `toolchain`. CUDA 12.9 images record only their major (NVRTC cubins carry no
/// toolkit string; ELF ABI 7 says CUDA 12).
fn image_of(
    toolchain: CudaRelease,
    container: usize,
    module: &str,
    target: &str,
    kernels: &[&str],
) -> ImageInfo {
    let target: Target = target.parse().expect("target");
    let cuda = if toolchain == CU13 {
        toolchain
    } else {
        CudaRelease::major_only(toolchain.major)
    };
    ImageInfo {
        source: ImageSource {
            container_offset: Some(container),
            ..Default::default()
        },
        kind: if target.virtual_arch {
            ImageKind::Ptx
        } else {
            ImageKind::Elf
        },
        target: Some(target),
        ptx_version: None,
        elf_abi: None,
        virtual_sm: None,
        debug: false,
        flags: 0,
        compression: Compression::None,
        size: 100,
        sha256: digest(module, toolchain, target),
        kernels: kernels.iter().map(|s| s.to_string()).collect(),
        toolkit: None,
        cuda: Some(cuda),
        identifier: None,
        options: None,
        raw_range: None,
    }
}

const RMS: &[&str] = &["rmsnorm_bf16", "fused_add_rmsnorm_bf16"];
const ROT: &[&str] = &["rotary_neox_bf16"];

/// One container per module and toolchain, every promised target.
fn good_build() -> Vec<ImageInfo> {
    let mut v = Vec::new();
    for t in ["sm_80", "sm_90", "compute_80"] {
        v.push(image(0, "rmsnorm", t, RMS));
    }
    for t in ["sm_80", "sm_90", "compute_80"] {
        v.push(image(0x1000, "rotary", t, ROT));
    }
    for t in ["sm_90", "compute_80"] {
        v.push(image_of(CU12, 0x5000, "rmsnorm", t, RMS));
    }
    for t in ["sm_90", "compute_80"] {
        v.push(image_of(CU12, 0x6000, "rotary", t, ROT));
    }
    v
}

const PROMISED: [(CudaRelease, &str); 5] = [
    (CU13, "sm_80"),
    (CU13, "sm_90"),
    (CU13, "compute_80"),
    (CU12, "sm_90"),
    (CU12, "compute_80"),
];

fn lock() -> Lock {
    let modules = [("rmsnorm", 0), ("rotary", 1)]
        .iter()
        .map(|(name, _)| LockedModule {
            name: name.to_string(),
            source_sha256: "0".repeat(64),
            images: PROMISED
                .iter()
                .map(|(toolchain, t)| {
                    let target: Target = t.parse().expect("target");
                    LockedImage {
                        toolchain: *toolchain,
                        target,
                        sha256: sha256_hex(&digest(name, *toolchain, target)),
                        size: 100,
                    }
                })
                .collect(),
        })
        .collect();
    Lock {
        format: LOCK_FORMAT,
        toolchains: [(CU13, "13.0.88".into()), (CU12, "12.9.86".into())].into(),
        modules,
    }
}

fn run(images: Vec<ImageInfo>, with_lock: bool) -> Vec<String> {
    let lock = lock();
    let files = [FileImages {
        name: "app".into(),
        images,
    }];
    verify(&manifest(), with_lock.then_some(&lock), &files)
        .iter()
        .map(|d| d.to_string())
        .collect()
}

#[test]
fn a_complete_exact_build_passes() {
    assert_eq!(run(good_build(), true), Vec::<String>::new());
    assert_eq!(run(good_build(), false), Vec::<String>::new());
}

#[test]
fn a_changed_image_names_module_and_target() {
    let mut images = good_build();
    images[1].sha256[31] ^= 1; // rmsnorm sm_90
    let out = run(images, true);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].starts_with("rmsnorm sm_90 (CUDA 13.0): sha256 "),
        "{}",
        out[0]
    );
    assert!(out[0].contains("lock has"), "{}", out[0]);
}

#[test]
fn a_changed_cuda12_image_names_its_toolchain() {
    let mut images = good_build();
    images[6].sha256[31] ^= 1; // rmsnorm sm_90 of CUDA 12.9
    let out = run(images, true);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].starts_with("rmsnorm sm_90 (CUDA 12.9): sha256 "),
        "{}",
        out[0]
    );
}

#[test]
fn images_of_a_toolchain_the_manifest_lacks_or_targets_it_does_not_build_are_unexpected() {
    let mut images = good_build();
    // CUDA 12.9 builds no sm_80 here; a CUDA 11 image belongs to no toolchain.
    images.push(image_of(CU12, 0x5000, "rmsnorm", "sm_80", RMS));
    images.push(image_of(
        CudaRelease::new(11, 8),
        0x4000,
        "rotary",
        "sm_90",
        ROT,
    ));
    images.remove(9); // rotary compute_80 of CUDA 12.9
    let out = run(images, false);
    assert_eq!(
        out,
        [
            "rmsnorm sm_80 (CUDA 12.9): unexpected image in app container 0x5000 entry 0: the manifest does not list this target for this toolchain",
            "rotary sm_90 (CUDA 11.x): unexpected image in app container 0x4000 entry 0: made by CUDA 11.x, which is none of the manifest's toolchains (13.0, 12.9)",
            "rotary compute_80 (CUDA 12.9): missing: app holds no such image",
        ]
    );
}

#[test]
fn a_corrupted_kernel_name_is_still_attributed_by_its_container() {
    let mut images = good_build();
    images[4].kernels = vec!["rotary_neox_bf17".into()]; // a flipped byte in the symbol name
    images[4].sha256[0] ^= 0xff;
    let out = run(images, true);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        out[0].starts_with("rotary sm_90 (CUDA 13.0): entries differ"),
        "{}",
        out[0]
    );
    assert!(
        out[0].contains(r#"missing ["rotary_neox_bf16"], unexpected ["rotary_neox_bf17"]"#),
        "{}",
        out[0]
    );
    assert!(
        out[1].starts_with("rotary sm_90 (CUDA 13.0): sha256 "),
        "{}",
        out[1]
    );
}

#[test]
fn missing_extra_duplicate_and_foreign_images() {
    let mut images = good_build();
    images.remove(2); // rmsnorm compute_80
    images.push(image(0x1000, "rotary", "sm_100", ROT)); // not in the manifest
    images.push(image(0x2000, "rotary", "sm_80", ROT)); // an identical second copy: fine
    let mut changed = image(0x2800, "rotary", "sm_80", ROT); // a second copy that differs
    changed.sha256[0] ^= 1;
    images.push(changed);
    images.push(image(0x3000, "other", "sm_80", &["mystery_kernel"])); // no module
    let out = run(images, false);
    assert_eq!(
        out,
        [
            "rotary sm_100 (CUDA 13.0): unexpected image in app container 0x1000 entry 0: the manifest does not list this target for this toolchain",
            "rotary sm_80 (CUDA 13.0): the copy in app container 0x2800 entry 0 differs from the one in app container 0x1000 entry 0",
            r#"sm_80 (CUDA 13.0): unexpected elf image in app container 0x3000 entry 0 (kernels ["mystery_kernel"]) belongs to no manifest module"#,
            "rmsnorm compute_80 (CUDA 13.0): missing: app holds no such image",
        ]
    );
}

#[test]
fn an_image_absent_from_the_lock_is_reported() {
    let mut lock = lock();
    lock.modules[0]
        .images
        .retain(|i| (i.toolchain, i.target) != (CU13, Target::sass(90)));
    let files = [FileImages {
        name: "app".into(),
        images: good_build(),
    }];
    let out: Vec<String> = verify(&manifest(), Some(&lock), &files)
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert_eq!(out.len(), 1);
    assert!(
        out[0].starts_with(
            "rmsnorm sm_90 (CUDA 13.0): image in app container 0x0 entry 0 is not in the lock"
        ),
        "{}",
        out[0]
    );
}
