//! NVIDIA's `cuobjdump` on the built `qwen-decode` (a test oracle from PyPI, which
//! `bash scripts/setup-toolchain.sh` installs beside the pinned nvcc): it sees every image of
//! aot-manifest.lock, one for one and byte for byte, because the registry embeds the fatbins in
//! `.nv_fatbin` where nvcc puts its own; and `fatbin-verify` finds the same images there. Runs
//! without a GPU; without the oracle these tests fail, never skip.

/// Running cuobjdump and reading its output, shared with fatbin-verify's oracle tests.
#[path = "../../fatbin-verify/tests/common/cuobjdump.rs"]
#[allow(dead_code)]
mod cuobjdump_oracle;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fatbin_verify::lock::Lock;
use fatbin_verify::{list_images, sha256_hex, ImageKind, Target};

/// `(kind, sha256)` of one image: `ELF` or `PTX`, and the hash of the bytes cuobjdump writes.
type Identity = (&'static str, String);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_qwen-decode"))
}

fn lock() -> Lock {
    Lock::from_path(&workspace().join("aot-manifest.lock")).expect("aot-manifest.lock")
}

fn require_full_build() {
    assert!(
        aot_kernels::registry::build_info().target_filter.is_none(),
        "built with AOT_TARGETS: the binary cannot carry every locked image; rebuild without it"
    );
}

/// The pinned toolchain's cuobjdump (`AOT_CUDA_HOME` as the other oracle tests read it);
/// missing, the test fails with the command that installs it.
fn cuobjdump_path() -> PathBuf {
    let home = std::env::var_os("AOT_CUDA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".toolchain/site/nvidia/cu13"));
    let tool = home.join("bin/cuobjdump");
    assert!(
        tool.is_file(),
        "{} not found: this test needs NVIDIA's cuobjdump from aot-manifest.toml's \
         oracle_packages; run `bash scripts/setup-toolchain.sh` in {} (or set AOT_CUDA_HOME)",
        tool.display(),
        workspace().display()
    );
    tool
}

fn lock_kind(t: Target) -> &'static str {
    if t.virtual_arch {
        "PTX"
    } else {
        "ELF"
    }
}

/// How many images of each `(kind, arch)` the lock promises.
fn locked_counts() -> BTreeMap<(String, String), usize> {
    let mut counts = BTreeMap::new();
    for module in &lock().modules {
        for image in &module.images {
            *counts
                .entry((
                    lock_kind(image.target).to_string(),
                    cuobjdump_oracle::arch(image.target),
                ))
                .or_default() += 1;
        }
    }
    counts
}

/// Every image the lock promises, by identity, with a name for messages.
fn locked_identities() -> Vec<(Identity, String)> {
    let mut out = Vec::new();
    for module in &lock().modules {
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

/// What `cuobjdump -xelf all` and `-xptx all` write, hashed and sorted; extracted once.
fn extracted() -> &'static [Identity] {
    static EXTRACTED: OnceLock<Vec<Identity>> = OnceLock::new();
    EXTRACTED.get_or_init(|| {
        let mut out: Vec<Identity> = cuobjdump_oracle::extracted(&cuobjdump_path(), binary())
            .into_iter()
            .flat_map(|(kind, hashes)| hashes.into_iter().map(move |h| (kind, h)))
            .collect();
        out.sort();
        out
    })
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

#[test]
fn cuobjdump_lists_every_locked_image_by_kind_and_arch() {
    require_full_build();
    let text = cuobjdump_oracle::stdout(
        &cuobjdump_path(),
        &["--list-elf", "--list-ptx"],
        binary(),
        &std::env::temp_dir(),
    );
    let mut listed: BTreeMap<(String, String), usize> = BTreeMap::new();
    for pair in cuobjdump_oracle::parse_list(&text) {
        *listed.entry(pair).or_default() += 1;
    }
    let locked = locked_counts();
    let (n_listed, n_locked) = (
        listed.values().sum::<usize>(),
        locked.values().sum::<usize>(),
    );
    assert_eq!(
        listed, locked,
        "cuobjdump lists {n_listed} images of qwen-decode, the lock has {n_locked} \
         ((kind, arch) -> count on both sides)"
    );
}

#[test]
fn cuobjdump_extracts_every_locked_image_byte_for_byte() {
    require_full_build();
    let extracted = extracted();
    let locked = locked_identities();
    let keys: Vec<Identity> = locked.iter().map(|(id, _)| id.clone()).collect();
    let missing = missing_from(&locked, extracted);
    let unexpected: Vec<&Identity> = extracted.iter().filter(|id| !keys.contains(id)).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "cuobjdump extracts {} images of qwen-decode, the lock has {}; locked but not extracted: \
         {missing:#?}; extracted but not locked: {unexpected:#?}",
        extracted.len(),
        locked.len()
    );
    assert_eq!(extracted.len(), locked.len());
}

#[test]
fn fatbin_verify_finds_in_nv_fatbin_what_cuobjdump_extracts() {
    require_full_build();
    let bytes = std::fs::read(binary()).expect("read qwen-decode");
    let images = list_images(&bytes).expect("fatbin-verify lists qwen-decode");
    let outside: Vec<_> = images
        .iter()
        .filter(|i| i.source.section.as_deref() != Some(".nv_fatbin"))
        .map(|i| (i.target, i.source.section.clone()))
        .collect();
    assert!(outside.is_empty(), "images outside .nv_fatbin: {outside:?}");
    let mut ours: Vec<Identity> = images
        .iter()
        .map(|i| {
            let kind = match i.kind {
                ImageKind::Elf => "ELF",
                ImageKind::Ptx => "PTX",
                other => panic!("an image of kind {other:?} in qwen-decode"),
            };
            (kind, sha256_hex(&i.sha256))
        })
        .collect();
    ours.sort();
    assert_eq!(
        ours.as_slice(),
        extracted(),
        "fatbin-verify and cuobjdump differ on qwen-decode's images ({} vs {})",
        ours.len(),
        extracted().len()
    );
}
