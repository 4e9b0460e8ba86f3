//! The images embedded in this crate, read back through fatbin-verify: every (module, target) the
//! manifest promises is there with the lock's hash, each cubin's architecture and each PTX's
//! `.target`/`.version` are what the manifest asked for, and every entry point is in every image.

use std::collections::BTreeSet;
use std::path::Path;

use aot_kernels::registry::{self, ImageFormat};
use fatbin_verify::lock::Lock;
use fatbin_verify::manifest::Manifest;
use fatbin_verify::{list_images, ImageKind, Target};
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

/// Targets the build was asked for: the manifest's, cut by AOT_TARGETS when the build was limited.
fn expected_targets(m: &Manifest, module: &fatbin_verify::manifest::Module) -> Vec<Target> {
    let filter: Option<Vec<Target>> = registry::build_info()
        .target_filter
        .map(|f| f.split_whitespace().map(|t| t.parse().unwrap()).collect());
    m.module_targets(module)
        .into_iter()
        .filter(|t| t.virtual_arch || filter.as_ref().is_none_or(|f| f.contains(t)))
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
    if registry::build_info().target_filter.is_none() {
        for module in &m.modules {
            assert_eq!(
                expected_targets(&m, module).len(),
                m.targets.sass.len() + 1,
                "{}",
                module.name
            );
        }
    }
}

#[test]
fn every_promised_image_is_present_with_the_lock_hash() {
    let (m, lock) = (manifest(), lock());
    assert_eq!(
        lock.toolchain, m.toolchain.nvcc_version,
        "the lock is made with the pinned toolchain"
    );
    for module in &m.modules {
        let record = registry::module(&module.name).unwrap();
        let built: Vec<Target> = record.images.iter().map(|i| i.target).collect();
        assert_eq!(built, expected_targets(&m, module), "{}", module.name);
        for image in record.images {
            let bytes = image.bytes();
            assert_eq!(bytes.len(), image.size);
            let sha = fatbin_verify::sha256_hex(&Sha256::digest(bytes).into());
            assert_eq!(
                sha, image.sha256,
                "{} {}: embedded bytes hash",
                module.name, image.target
            );
            if registry::build_info().toolchain == m.toolchain.nvcc_version {
                let locked = lock
                    .image(&module.name, image.target)
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
            let what = format!("{} {}", module.name, image.target);
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
                    assert!(
                        alone.toolkit.as_deref().unwrap_or("").contains("13.0"),
                        "{what}: {:?}",
                        alone.toolkit
                    );
                }
                ImageFormat::Ptx => {
                    assert_eq!(alone.kind, ImageKind::Ptx, "{what}");
                    assert_eq!(alone.target, Some(image.target), "{what}: .target");
                    // nvcc 13.0 emits PTX ISA 9.0.
                    assert_eq!(alone.ptx_version, Some((9, 0)), "{what}: .version");
                    assert_eq!(image.ptx_version, Some((9, 0)), "{what}");
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
    let launched: BTreeSet<(String, String)> = aot_kernels::ops::LAUNCHED_ENTRIES
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(in_manifest, launched);
}
