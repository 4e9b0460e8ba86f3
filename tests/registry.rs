//! The images embedded in this crate, read back through fatbin-verify: every (module, toolchain,
//! target) the manifest promises is there with the lock's hash, each cubin's architecture and ELF
//! ABI and each PTX's `.target`/`.version` are what its toolchain makes, and every entry point is
//! in every image.

use std::collections::BTreeSet;
use std::path::Path;

use aot_kernels::registry::{self, ImageFormat};
use fatbin_verify::lock::Lock;
use fatbin_verify::manifest::Manifest;
use fatbin_verify::{list_images, CudaRelease, ImageKind, Target};
use sha2::{Digest, Sha256};

fn manifest() -> Manifest {
    Manifest::parse(
        registry::build_info().manifest_toml,
        Path::new("aot-manifest.toml"),
    )
    .unwrap()
}

fn lock() -> Lock {
    Lock::parse(
        registry::build_info().lock_toml,
        Path::new("aot-manifest.lock"),
    )
    .unwrap()
}

/// Images the build was asked for: the manifest's, SASS cut by AOT_TARGETS when the build was limited.
fn expected_images(
    m: &Manifest,
    module: &fatbin_verify::manifest::Module,
) -> Vec<(CudaRelease, Target)> {
    let filter: Option<Vec<Target>> = registry::build_info()
        .target_filter
        .map(|f| f.split_whitespace().map(|t| t.parse().unwrap()).collect());
    m.module_images(module)
        .into_iter()
        .filter(|(_, t)| t.virtual_arch || filter.as_ref().is_none_or(|f| f.contains(t)))
        .collect()
}

#[test]
fn embedded_registry_is_the_manifest() {
    let m = manifest();
    let names: Vec<&str> = registry::modules().iter().map(|r| r.name).collect();
    let want: Vec<&str> = m.modules.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, want);
    eprintln!(
        "build: nvcc {} ({}), lock {}",
        registry::build_info().toolchain,
        registry::build_info().toolchain_source,
        registry::build_info().lock_status
    );
    let toolchains: Vec<CudaRelease> = registry::build_info()
        .toolchains
        .iter()
        .map(|t| t.cuda)
        .collect();
    let want: Vec<CudaRelease> = m.toolchains().iter().map(|t| t.cuda).collect();
    assert_eq!(
        toolchains, want,
        "one registry toolchain per manifest toolchain"
    );
    if registry::build_info().target_filter.is_none() {
        for module in &m.modules {
            let per_toolchain: usize = m
                .toolchains()
                .iter()
                .map(|t| m.module_targets_for(module, t).len())
                .sum();
            assert_eq!(
                expected_images(&m, module).len(),
                per_toolchain,
                "{}",
                module.name
            );
        }
    }
    eprintln!(
        "registry: {} bytes of embedded fatbins",
        registry::embedded_bytes()
    );
}

#[test]
fn every_promised_image_is_present_with_the_lock_hash() {
    let (m, lock) = (manifest(), lock());
    for tc in m.toolchains() {
        assert_eq!(
            lock.toolchains.get(&tc.cuda).map(String::as_str),
            Some(tc.version),
            "the lock is made with the pinned toolchains"
        );
    }
    let pinned = registry::build_info().toolchains.iter().all(|t| {
        m.toolchain_for(t.cuda)
            .is_some_and(|tc| tc.version == t.version)
    });
    for module in &m.modules {
        let record = registry::module(&module.name).unwrap();
        let built: Vec<(CudaRelease, Target)> = record
            .images
            .iter()
            .map(|i| (i.toolchain, i.target))
            .collect();
        assert_eq!(built, expected_images(&m, module), "{}", module.name);
        for image in record.images {
            let bytes = image.bytes();
            assert_eq!(bytes.len(), image.size);
            let sha = fatbin_verify::sha256_hex(&Sha256::digest(bytes).into());
            assert_eq!(
                sha, image.sha256,
                "{} {}: embedded bytes hash",
                module.name, image.target
            );
            if pinned {
                let locked = lock
                    .image(&module.name, image.toolchain, image.target)
                    .unwrap_or_else(|| panic!("{} {} not in the lock", module.name, image.target));
                assert_eq!(
                    (locked.sha256.as_str(), locked.size),
                    (image.sha256, image.size as u64),
                    "{} {}",
                    module.name,
                    image.target
                );
            }
        }
    }
}

#[test]
fn architectures_versions_and_entries_read_back_as_intended() {
    let m = manifest();
    for module in &m.modules {
        let record = registry::module(&module.name).unwrap();
        // The whole embedded fatbin, parsed as a user's tool would see it.
        let listed = list_images(record.fatbin).unwrap();
        assert_eq!(listed.len(), record.images.len(), "{}", module.name);
        let want_entries: BTreeSet<&str> = module.entries.iter().map(String::as_str).collect();
        for (image, info) in record.images.iter().zip(&listed) {
            let what = format!(
                "{} {} (CUDA {})",
                module.name, image.target, image.toolchain
            );
            let primary = image.toolchain == m.toolchain.cuda;
            assert_eq!(info.target, Some(image.target), "{what}");
            assert_eq!(
                fatbin_verify::sha256_hex(&info.sha256),
                image.sha256,
                "{what}"
            );
            let entries: BTreeSet<&str> = info.kernels.iter().map(String::as_str).collect();
            assert!(
                want_entries.is_subset(&entries),
                "{what}: entries {entries:?}"
            );
            // Each image alone, as the dispatcher hands it to the driver.
            let alone = list_images(image.bytes()).unwrap();
            assert_eq!(alone.len(), 1, "{what}");
            let alone = &alone[0];
            match image.format {
                ImageFormat::Cubin => {
                    assert_eq!(alone.kind, ImageKind::Elf, "{what}");
                    assert_eq!(
                        alone.target.map(|t| t.sm),
                        Some(image.target.sm),
                        "{what}: e_flags architecture"
                    );
                    // ptxas 13.x writes ELF ABI 8 and its toolkit string. NVRTC 12.9 writes ABI 7
                    // (CUDA 12) without a toolkit string below sm_100, and ABI 8 with its
                    // toolkit string from sm_100 on.
                    if primary {
                        assert_eq!(alone.elf_abi, Some(8), "{what}");
                        assert!(
                            alone.toolkit.as_deref().unwrap_or("").contains("13.0"),
                            "{what}: {:?}",
                            alone.toolkit
                        );
                    } else if image.target.sm < 100 {
                        assert_eq!(alone.elf_abi, Some(7), "{what}");
                    } else {
                        assert_eq!(alone.elf_abi, Some(8), "{what}");
                        assert!(
                            alone
                                .toolkit
                                .as_deref()
                                .unwrap_or("")
                                .contains("release 12.9"),
                            "{what}: {:?}",
                            alone.toolkit
                        );
                    }
                    assert!(
                        alone.cuda.is_some_and(|c| c.matches(&image.toolchain)),
                        "{what}: {:?}",
                        alone.cuda
                    );
                }
                ImageFormat::Ptx => {
                    assert_eq!(alone.kind, ImageKind::Ptx, "{what}");
                    assert_eq!(alone.target, Some(image.target), "{what}: .target");
                    // nvcc 13.0 emits PTX ISA 9.0, NVRTC 12.9 ISA 8.8: the major says which.
                    let isa = if primary { (9, 0) } else { (8, 8) };
                    assert_eq!(alone.ptx_version, Some(isa), "{what}: .version");
                    assert_eq!(image.ptx_version, Some(isa), "{what}");
                    assert_eq!(
                        alone.cuda,
                        Some(CudaRelease::major_only(image.toolchain.major)),
                        "{what}"
                    );
                }
            }
            let entries: BTreeSet<&str> = alone.kernels.iter().map(String::as_str).collect();
            assert!(
                want_entries.is_subset(&entries),
                "{what}: entries {entries:?}"
            );
        }
    }
}

#[test]
fn every_manifest_entry_has_a_typed_launcher() {
    let m = manifest();
    let in_manifest: BTreeSet<(String, String)> = m
        .modules
        .iter()
        .flat_map(|x| x.entries.iter().map(|e| (x.name.clone(), e.clone())))
        .collect();
    let launched: BTreeSet<(String, String)> = aot_kernels::ops::launched_entries()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(in_manifest, launched);
}
