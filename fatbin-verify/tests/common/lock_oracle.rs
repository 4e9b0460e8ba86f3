//! The lock against NVIDIA's `cuobjdump` on a built file (an executable, a static or a shared
//! library): cuobjdump lists and extracts every locked image, one for one and byte for byte, and
//! `fatbin-verify` finds the same images in `.nv_fatbin`. Shared through `#[path]` by
//! `qwen-engine/tests/cuobjdump_images.rs` (`qwen-decode`) and
//! `aot-kernels-capi/tests/cuobjdump_libraries.rs` (the C ABI's `.a` and `.so`).

#[path = "cuobjdump.rs"]
#[allow(dead_code)]
pub mod cuobjdump;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fatbin_verify::lock::Lock;
use fatbin_verify::{list_images, sha256_hex, ImageKind, Target};

/// `(kind, sha256)` of one image: `ELF` or `PTX`, and the hash of the bytes cuobjdump writes.
pub type Identity = (&'static str, String);

/// The pinned toolchain's cuobjdump under `workspace` (`AOT_CUDA_HOME` as the other oracle tests
/// read it); missing, the test fails with the command that installs it.
pub fn cuobjdump_path(workspace: &Path) -> PathBuf {
    let home = std::env::var_os("AOT_CUDA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join(".toolchain/site/nvidia/cu13"));
    let tool = home.join("bin/cuobjdump");
    assert!(
        tool.is_file(),
        "{} not found: this test needs NVIDIA's cuobjdump from aot-manifest.toml's \
         oracle_packages; run `bash scripts/setup-toolchain.sh` in {} (or set AOT_CUDA_HOME)",
        tool.display(),
        workspace.display()
    );
    tool
}

pub fn lock(workspace: &Path) -> Lock {
    Lock::from_path(&workspace.join("aot-manifest.lock")).expect("aot-manifest.lock")
}

fn lock_kind(t: Target) -> &'static str {
    if t.virtual_arch {
        "PTX"
    } else {
        "ELF"
    }
}

/// How many images of each `(kind, arch)` the lock promises.
fn locked_counts(lock: &Lock) -> BTreeMap<(String, String), usize> {
    let mut counts = BTreeMap::new();
    for module in &lock.modules {
        for image in &module.images {
            *counts
                .entry((
                    lock_kind(image.target).to_string(),
                    cuobjdump::arch(image.target),
                ))
                .or_default() += 1;
        }
    }
    counts
}

/// Every image the lock promises, by identity, with a name for messages.
fn locked_identities(lock: &Lock) -> Vec<(Identity, String)> {
    let mut out = Vec::new();
    for module in &lock.modules {
        for image in &module.images {
            out.push((
                (lock_kind(image.target), image.sha256.clone()),
                format!(
                    "{} {} (CUDA {})",
                    module.name, image.target, image.toolchain
                ),
            ));
        }
    }
    out
}

/// What `cuobjdump -xelf all` and `-xptx all` write for `file`, hashed and sorted.
pub fn extracted(tool: &Path, file: &Path) -> Vec<Identity> {
    let mut out: Vec<Identity> = cuobjdump::extracted(tool, file)
        .into_iter()
        .flat_map(|(kind, hashes)| hashes.into_iter().map(move |h| (kind, h)))
        .collect();
    out.sort();
    out
}

/// `a` minus `b`, counting duplicates.
fn missing_from<'a, T: Ord + Clone>(a: &'a [(T, String)], b: &[T]) -> Vec<&'a str> {
    let mut left: BTreeMap<T, usize> = BTreeMap::new();
    for x in b {
        *left.entry(x.clone()).or_default() += 1;
    }
    a.iter()
        .filter(|(x, _)| match left.get_mut(x) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .map(|(_, name)| name.as_str())
        .collect()
}

fn name(file: &Path) -> String {
    file.file_name().map_or_else(
        || file.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// `cuobjdump --list-elf --list-ptx file` lists as many images of each (kind, arch) as the lock.
pub fn assert_lists_every_locked_image(tool: &Path, lock: &Lock, file: &Path) {
    let text = cuobjdump::stdout(
        tool,
        &["--list-elf", "--list-ptx"],
        file,
        &std::env::temp_dir(),
    );
    let mut listed: BTreeMap<(String, String), usize> = BTreeMap::new();
    for pair in cuobjdump::parse_list(&text) {
        *listed.entry(pair).or_default() += 1;
    }
    let locked = locked_counts(lock);
    let (n_listed, n_locked) = (
        listed.values().sum::<usize>(),
        locked.values().sum::<usize>(),
    );
    assert_eq!(
        listed,
        locked,
        "cuobjdump lists {n_listed} images of {}, the lock has {n_locked} \
         ((kind, arch) -> count on both sides)",
        name(file)
    );
}

/// The images cuobjdump extracts from `file` are the lock's, byte for byte (`extracted` is
/// [`extracted`] of the file).
pub fn assert_extracts_every_locked_image(lock: &Lock, file: &Path, extracted: &[Identity]) {
    let locked = locked_identities(lock);
    let keys: Vec<Identity> = locked.iter().map(|(id, _)| id.clone()).collect();
    let missing = missing_from(&locked, extracted);
    let unexpected: Vec<&Identity> = extracted.iter().filter(|id| !keys.contains(id)).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "cuobjdump extracts {} images of {}, the lock has {}; locked but not extracted: \
         {missing:#?}; extracted but not locked: {unexpected:#?}",
        extracted.len(),
        name(file),
        locked.len()
    );
    assert_eq!(extracted.len(), locked.len());
}

/// fatbin-verify finds every image of `file` in `.nv_fatbin`, and the same images cuobjdump
/// extracts.
pub fn assert_fatbin_verify_agrees(file: &Path, extracted: &[Identity]) {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let images = list_images(&bytes)
        .unwrap_or_else(|e| panic!("fatbin-verify lists {}: {e}", file.display()));
    let outside: Vec<_> = images
        .iter()
        .filter(|i| i.source.section.as_deref() != Some(".nv_fatbin"))
        .map(|i| (i.target, i.source.section.clone()))
        .collect();
    assert!(
        outside.is_empty(),
        "images of {} outside .nv_fatbin: {outside:?}",
        name(file)
    );
    let mut ours: Vec<Identity> = images
        .iter()
        .map(|i| {
            let kind = match i.kind {
                ImageKind::Elf => "ELF",
                ImageKind::Ptx => "PTX",
                other => panic!("an image of kind {other:?} in {}", name(file)),
            };
            (kind, sha256_hex(&i.sha256))
        })
        .collect();
    ours.sort();
    assert_eq!(
        ours.as_slice(),
        extracted,
        "fatbin-verify and cuobjdump differ on the images of {} ({} vs {})",
        name(file),
        ours.len(),
        extracted.len()
    );
}
