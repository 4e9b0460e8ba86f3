//! The Triton modules through the kernel build (build/triton.rs) on temporary copies of the
//! project: the committed PTX is assembled into the cubins Triton itself made, and every way the
//! committed files can go stale or be tampered with fails naming the file and `make triton`.
//!
//! The copies keep only the Triton modules of the manifest (the CUDA modules go through the same
//! pipeline, which build_pipeline.rs tests on its own fixture modules), and its
//! `[[extra_toolchain]]`: that toolchain builds `kind = "cuda"` modules only, so the Triton
//! modules get CUDA 13 images alone.
//!
//! Needs the pinned toolchains (`bash scripts/setup-toolchain.sh`), like build_pipeline.rs.

#[path = "../build/mod.rs"]
#[allow(dead_code)]
mod aot_build;

use std::path::{Path, PathBuf};

use aot_build::{BuildError, Config, LockStatus};
use fatbin_verify::lock::Lock;
use fatbin_verify::CudaRelease;
use sha2::{Digest, Sha256};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A throw-away copy of the project's kernels, its manifest and lock cut to the Triton modules,
/// and a link to its `.toolchain/` (the extra toolchains are found there only), edited by `edit`.
fn project(edit: impl Fn(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&repo().join("kernels"), &dir.path().join("kernels"));
    let manifest = std::fs::read_to_string(repo().join("aot-manifest.toml")).unwrap();
    let (manifest, names) = triton_modules_only(&manifest);
    assert!(names.len() >= 8, "{names:?}");
    std::fs::write(dir.path().join("aot-manifest.toml"), manifest).unwrap();
    let mut lock = Lock::from_path(&repo().join("aot-manifest.lock")).unwrap();
    lock.modules.retain(|m| names.contains(&m.name));
    std::fs::write(dir.path().join("aot-manifest.lock"), lock.to_toml_string()).unwrap();
    std::os::unix::fs::symlink(repo().join(".toolchain"), dir.path().join(".toolchain")).unwrap();
    edit(dir.path());
    dir
}

/// The manifest text with every `[[module]]` but the `kind = "triton"` ones removed, and their names.
fn triton_modules_only(manifest: &str) -> (String, Vec<String>) {
    let mut parts = manifest.split("\n[[module]]");
    let mut out = parts.next().unwrap_or_default().to_string();
    let mut names = Vec::new();
    for block in parts {
        let field = |key: &str| {
            block
                .lines()
                .find_map(|l| l.trim().strip_prefix(key))
                .map(|v| v.trim_matches('"').to_string())
        };
        if field("kind = ").as_deref() == Some("triton") {
            names.extend(field("name = "));
            out.push_str("\n[[module]]");
            out.push_str(block);
        }
    }
    (out, names)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

fn build(dir: &Path, targets: &[&str]) -> Result<aot_build::BuildOutput, BuildError> {
    let home = repo().join(".toolchain/site/nvidia/cu13");
    assert!(
        home.join("bin/ptxas").is_file(),
        "the pinned CUDA toolchain is not installed at {}: run `bash scripts/setup-toolchain.sh`",
        home.display()
    );
    let none = |_: &str| None;
    let mut config = Config::from_env(dir, &dir.join("out"), &none).unwrap();
    config.target_filter = Some(targets.iter().map(|t| t.parse().unwrap()).collect());
    let home = home.display().to_string();
    let env = move |k: &str| (k == "AOT_CUDA_HOME").then(|| home.clone());
    aot_build::run(&config, &env, &|_| {})
}

fn err_text(result: Result<aot_build::BuildOutput, BuildError>) -> String {
    match result {
        Ok(_) => panic!("the build succeeded where it must fail"),
        Err(e) => e.to_string(),
    }
}

fn append(path: &Path, text: &str) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes.extend_from_slice(text.as_bytes());
    std::fs::write(path, bytes).unwrap();
}

const GENERATED: &str = "kernels/triton/generated";

#[test]
fn thor_build_assembles_tritons_own_cubins_and_matches_the_lock() {
    let p = project(|_| {});
    let out = build(p.path(), &["sm_110"]).unwrap();
    assert_eq!(out.lock_status, LockStatus::Verified { partial: true });
    // The manifest's CUDA 12.9 toolchain was found, and built nothing for these modules.
    assert_eq!(out.extra_toolchains.len(), 1);
    assert!(
        out.modules.len() >= 8,
        "{} Triton modules",
        out.modules.len()
    );
    for m in &out.modules {
        assert!(repo().join(GENERATED).join(&m.name).is_dir(), "{}", m.name);
        let targets: Vec<String> = m.images.iter().map(|i| i.target.to_string()).collect();
        // `sm_110` admits the arch-specific image Triton makes; the PTX fallback is always there.
        assert_eq!(targets, ["sm_110a", "compute_80"], "{}", m.name);
        assert!(
            m.images
                .iter()
                .all(|i| i.toolchain == CudaRelease::new(13, 0)),
            "{}: CUDA 13 images only",
            m.name
        );
        assert_eq!(m.images[1].ptx_version, Some((9, 0)), "{}", m.name);
        let listed = fatbin_verify::list_images(&std::fs::read(&m.fatbin).unwrap()).unwrap();
        assert!(
            listed.iter().all(|i| i.kernels == m.entries),
            "{}: {:?}",
            m.name,
            listed.iter().map(|i| &i.kernels).collect::<Vec<_>>()
        );
    }
}

#[test]
fn editing_a_triton_source_without_regenerating_fails_naming_make_triton() {
    let p = project(|d| append(&d.join("kernels/triton/moe.py"), "\n# edited\n"));
    let err = err_text(build(p.path(), &["sm_90"]));
    assert!(
        err.contains(
            "Triton module moe_router: kernels/triton/moe.py changed since its PTX was generated"
        ),
        "{err}"
    );
    assert!(err.contains("make triton"), "{err}");
}

#[test]
fn a_hand_edited_ptx_file_is_refused() {
    let p = project(|d| {
        append(
            &d.join(GENERATED).join("gdn_recurrent/sm_90a.ptx"),
            "\n// edited\n",
        )
    });
    let err = err_text(build(p.path(), &["sm_90"]));
    assert!(
        err.contains("gdn_recurrent/sm_90a.ptx does not match its recorded sha256"),
        "{err}"
    );
}

#[test]
fn a_baseline_target_triton_cannot_make_is_refused() {
    // Triton compiles capability 9.0 only as sm_90a: there is no sm_90 PTX to assemble.
    let p = project(|d| {
        let path = d.join("aot-manifest.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("\"sm_90a\"", "\"sm_90\"", 1)).unwrap();
    });
    let err = err_text(build(p.path(), &["sm_90"]));
    assert!(
        err.contains("Triton module gdn_conv1d: meta.json has no image for sm_90"),
        "{err}"
    );
}

#[test]
fn ptx_newer_than_the_toolchain_is_refused() {
    // A consistent record of a PTX fallback made by a newer toolkit: text, hash and version agree.
    let p = project(|d| {
        let dir = d.join(GENERATED).join("gdn_gated_norm");
        let ptx = dir.join("sm_80.ptx");
        let text =
            std::fs::read_to_string(&ptx)
                .unwrap()
                .replacen(".version 9.0", ".version 9.1", 1);
        std::fs::write(&ptx, &text).unwrap();
        let sha: String = Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let meta_path = dir.join("meta.json");
        let mut meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
        for target in ["sm_80", "compute_80"] {
            meta["images"][target]["ptx_sha256"] = sha.clone().into();
            meta["images"][target]["ptx_version"] = "9.1".into();
        }
        std::fs::write(&meta_path, serde_json::to_string_pretty(&meta).unwrap()).unwrap();
    });
    let err = err_text(build(p.path(), &["sm_90"]));
    assert!(
        err.contains("sm_80.ptx has PTX .version 9.1, newer than nvcc 13.0.88 writes (9.0)"),
        "{err}"
    );
}

#[test]
fn a_cubin_that_is_not_tritons_own_is_refused() {
    // Recorded cubin hash from another toolchain: the assembled cubin cannot match it.
    let p = project(|d| {
        let meta_path = d.join(GENERATED).join("moe_route/meta.json");
        let mut meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
        meta["images"]["sm_90a"]["cubin_sha256"] = "0".repeat(64).into();
        std::fs::write(&meta_path, serde_json::to_string_pretty(&meta).unwrap()).unwrap();
    });
    let err = err_text(build(p.path(), &["sm_90"]));
    assert!(
        err.contains("Triton module moe_route: ptxas 13.0.88")
            && err.contains("Triton's own was 0000"),
        "{err}"
    );
}

#[test]
fn the_manifest_and_the_lock_give_triton_modules_cuda13_images_only() {
    // The extra (CUDA 12.9) toolchain builds `cuda` modules only: the Triton PTX is ISA 9.0.
    let manifest =
        fatbin_verify::manifest::Manifest::from_path(&repo().join("aot-manifest.toml")).unwrap();
    assert!(!manifest.extra_toolchains.is_empty());
    let lock = Lock::from_path(&repo().join("aot-manifest.lock")).unwrap();
    let triton: Vec<_> = manifest
        .modules
        .iter()
        .filter(|m| m.kind == fatbin_verify::manifest::ModuleKind::Triton)
        .collect();
    assert!(triton.len() >= 8);
    for module in triton {
        let images = manifest.module_images(module);
        assert!(
            images
                .iter()
                .all(|(cuda, _)| *cuda == manifest.toolchain.cuda),
            "{}: {images:?}",
            module.name
        );
        let locked = lock
            .modules
            .iter()
            .find(|m| m.name == module.name)
            .unwrap_or_else(|| panic!("{} is not in the lock", module.name));
        // Every SASS target of the module plus the PTX fallback, all CUDA 13.0.
        assert_eq!(locked.images.len(), images.len(), "{}", module.name);
        assert!(
            locked
                .images
                .iter()
                .all(|i| i.toolchain == CudaRelease::new(13, 0)),
            "{}",
            module.name
        );
    }
}
