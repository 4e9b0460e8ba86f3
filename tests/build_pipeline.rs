//! The kernel build (build/, the code build.rs runs) on temporary manifests: every bad input
//! fails with the file, the key and the fix; the cache and the lock behave as documented; two
//! builds in different folders give identical images.
//!
//! Needs the pinned toolchain (`bash scripts/setup-toolchain.sh`); without it these tests fail
//! and say so, they never pass silently.

#[path = "../build/mod.rs"]
#[allow(dead_code)]
mod aot_build;

use std::path::{Path, PathBuf};

use aot_build::{BuildError, Config, LockStatus};
use fatbin_verify::lock::Lock;
use fatbin_verify::{CudaRelease, Target};

const CU13: CudaRelease = CudaRelease::new(13, 0);
const CU12: CudaRelease = CudaRelease::new(12, 9);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn toolchain_home() -> PathBuf {
    let home = repo().join(".toolchain/site/nvidia/cu13");
    assert!(
        home.join("bin/nvcc").is_file(),
        "the pinned CUDA toolchain is not installed at {}: run `bash scripts/setup-toolchain.sh`",
        home.display()
    );
    home
}

/// A throw-away project: the repo's kernels and a manifest edited by `edit`; its `.toolchain/`
/// is the repo's (the extra toolchains are found there only).
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(edit: impl Fn(String) -> String) -> Project {
        let p = Project::without_toolchain(edit);
        std::os::unix::fs::symlink(repo().join(".toolchain"), p.path().join(".toolchain")).unwrap();
        p
    }

    fn without_toolchain(edit: impl Fn(String) -> String) -> Project {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&repo().join("kernels"), &dir.path().join("kernels"));
        let manifest = std::fs::read_to_string(repo().join("aot-manifest.toml")).unwrap();
        std::fs::write(
            dir.path().join("aot-manifest.toml"),
            edit(pipeline_modules_only(&manifest)),
        )
        .unwrap();
        let mut lock = Lock::from_path(&repo().join("aot-manifest.lock")).unwrap();
        lock.modules
            .retain(|m| PIPELINE_MODULES.contains(&m.name.as_str()));
        std::fs::write(dir.path().join("aot-manifest.lock"), lock.to_toml_string()).unwrap();
        Project { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self, targets: &[&str]) -> Config {
        let env = |_: &str| None;
        let mut config = Config::from_env(self.path(), &self.path().join("out"), &env).unwrap();
        config.target_filter =
            (!targets.is_empty()).then(|| targets.iter().map(|t| t.parse().unwrap()).collect());
        config
    }

    fn build_with(
        &self,
        config: &Config,
        home: Option<&Path>,
    ) -> Result<aot_build::BuildOutput, BuildError> {
        let home = home.map(|h| h.display().to_string());
        let env = move |k: &str| match k {
            "AOT_CUDA_HOME" => home.clone(),
            "PATH" => std::env::var("PATH").ok(),
            _ => None,
        };
        aot_build::run(config, &env, &|_| {})
    }

    fn build(&self, targets: &[&str]) -> Result<aot_build::BuildOutput, BuildError> {
        self.build_with(&self.config(targets), Some(&toolchain_home()))
    }
}

/// The modules these tests build: the pipeline is the same for every module, so the small
/// original three keep the tests fast however many kernels the crate grows.
const PIPELINE_MODULES: [&str; 3] = ["rmsnorm", "rotary", "activation"];

/// The manifest text with every `[[module]]` outside [`PIPELINE_MODULES`] removed.
fn pipeline_modules_only(manifest: &str) -> String {
    let mut parts = manifest.split("\n[[module]]");
    let mut out = parts.next().unwrap_or_default().to_string();
    for block in parts {
        let name = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|n| n.trim_matches('"'));
        if name.is_some_and(|n| PIPELINE_MODULES.contains(&n)) {
            out.push_str("\n[[module]]");
            out.push_str(block);
        }
    }
    out
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

fn err_text(result: Result<aot_build::BuildOutput, BuildError>) -> String {
    match result {
        Ok(_) => panic!("the build succeeded where it must fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_target_fails_with_key_and_fix() {
    let p = Project::new(|m| m.replace("\"sm_110\", \"sm_120\"", "\"sm_111\", \"sm_120\""));
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("aot-manifest.toml: targets.sass: unknown target `sm_111`"),
        "{err}"
    );
    assert!(
        err.contains("sm_110"),
        "the error lists the targets that exist: {err}"
    );
}

#[test]
fn duplicate_module_fails() {
    let p = Project::new(|m| m.replace("name = \"rotary\"", "name = \"rmsnorm\""));
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("module[1] (rmsnorm).name: duplicate module `rmsnorm`"),
        "{err}"
    );
}

#[test]
fn missing_source_names_module_and_path() {
    let p =
        Project::new(|m| m.replace("kernels/rotary/rotary_neox.cu", "kernels/rotary/missing.cu"));
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("module[1] (rotary).source: `kernels/rotary/missing.cu` does not exist"),
        "{err}"
    );
}

#[test]
fn entry_absent_from_the_image_fails() {
    let p = Project::new(|m| {
        m.replace(
            "entries = [\"rotary_neox_bf16\"]",
            "entries = [\"rotary_neox_bf16\", \"rotary_gptj_bf16\"]",
        )
    });
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("module rotary.entries: `rotary_gptj_bf16` is not in the sm_90 image"),
        "{err}"
    );
    assert!(err.contains("it has: rotary_neox_bf16"), "{err}");
}

#[test]
fn compile_error_shows_nvcc_message_and_module() {
    let p = Project::new(|m| m);
    let src = p.path().join("kernels/activation/silu_and_mul.cu");
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(
        &src,
        text.replace(
            "const int64_t row = blockIdx.y;",
            "const int64_t row = blockIdx.y; undeclared_name += 1;",
        ),
    )
    .unwrap();
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains(
            "module activation: kernels/activation/silu_and_mul.cu failed to compile for sm_90"
        ),
        "{err}"
    );
    assert!(
        err.contains("undeclared_name"),
        "nvcc's own message is shown: {err}"
    );
}

#[test]
fn warnings_are_errors() {
    let p = Project::new(|m| m);
    let src = p.path().join("kernels/activation/silu_and_mul.cu");
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(
        &src,
        text.replace(
            "const int64_t row = blockIdx.y;",
            "const int64_t row = blockIdx.y; int unused_variable = 3;",
        ),
    )
    .unwrap();
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("failed to compile for sm_90") && err.contains("unused_variable"),
        "{err}"
    );
}

#[test]
fn corrupt_lock_fails_with_the_fix() {
    let p = Project::new(|m| m);
    let lock = p.path().join("aot-manifest.lock");
    let text = std::fs::read_to_string(&lock).unwrap();
    std::fs::write(&lock, text.replacen("size = ", "size = \"", 1)).unwrap();
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("aot-manifest.lock: the lock is corrupt") && err.contains("make lock"),
        "{err}"
    );
}

#[test]
fn hand_edited_lock_hash_gives_a_readable_diff() {
    let p = Project::new(|m| m);
    let lock_path = p.path().join("aot-manifest.lock");
    let mut lock = fatbin_verify::lock::Lock::from_path(&lock_path).unwrap();
    // One image of each toolchain: the diff names module, target and toolchain.
    let mut real = Vec::new();
    for (module, toolchain) in [(1, CU13), (2, CU12)] {
        let image = lock.modules[module]
            .images
            .iter_mut()
            .find(|i| (i.toolchain, i.target) == (toolchain, Target::sass(90)))
            .unwrap();
        real.push(image.sha256.clone());
        image.sha256 = "0".repeat(64);
    }
    std::fs::write(&lock_path, lock.to_toml_string()).unwrap();
    let err = err_text(p.build(&["sm_90"]));
    assert!(err.contains("2 difference(s) from the lock"), "{err}");
    let zeros = "0".repeat(64);
    assert!(
        err.contains(&format!(
            "rotary sm_90 (CUDA 13.0): lock sha256 {zeros} (14"
        )) || err.contains(&format!("rotary sm_90 (CUDA 13.0): lock sha256 {zeros} ")),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "activation sm_90 (CUDA 12.9): lock sha256 {zeros} "
        )),
        "{err}"
    );
    for sha in real {
        assert!(err.contains(&format!("build sha256 {sha}")), "{err}");
    }
}

#[test]
fn no_lock_says_how_to_make_one() {
    let p = Project::new(|m| m);
    std::fs::remove_file(p.path().join("aot-manifest.lock")).unwrap();
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("no lock file") && err.contains("make lock"),
        "{err}"
    );
}

/// A fake nvcc of the given version and target list; with `delegate`, real compiles go to that toolkit.
fn fake_toolchain(dir: &Path, version: &str, gpu_codes: &str, delegate: Option<&Path>) -> PathBuf {
    let home = dir.join(format!("cuda-{version}"));
    std::fs::create_dir_all(home.join("bin")).unwrap();
    let fallthrough = match delegate {
        Some(real) => format!("exec {} \"$@\"", real.join("bin/nvcc").display()),
        None => "echo 'fake nvcc cannot compile' >&2; exit 1".into(),
    };
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in\n--version) echo 'Cuda compilation tools, release {short}, V{version}';;\n--list-gpu-code) printf '%s\\n' {gpu_codes};;\n*) {fallthrough};;\nesac\n",
        short = &version[..4]
    );
    let nvcc = home.join("bin/nvcc");
    std::fs::write(&nvcc, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
    if let Some(real) = delegate {
        std::os::unix::fs::symlink(real.join("bin/fatbinary"), home.join("bin/fatbinary")).unwrap();
        std::os::unix::fs::symlink(real.join("bin/ptxas"), home.join("bin/ptxas")).unwrap();
    }
    home
}

#[test]
fn toolchain_without_sm_110_is_rejected_naming_the_target() {
    let p = Project::new(|m| m);
    // CUDA 12.9's real list: Thor is still `sm_101` there, so `sm_110` is the one it lacks.
    let home = fake_toolchain(
        p.path(),
        "12.9.86",
        "sm_75 sm_80 sm_86 sm_87 sm_88 sm_89 sm_90 sm_100 sm_101 sm_103 sm_120 sm_121",
        None,
    );
    let err = err_text(p.build_with(&p.config(&[]), Some(&home)));
    assert!(
        err.contains("aot-manifest.toml: targets.sass: nvcc 12.9.86"),
        "{err}"
    );
    assert!(err.contains("cannot build `sm_110`"), "{err}");
    assert!(err.contains("bash scripts/setup-toolchain.sh"), "{err}");
}

#[test]
fn no_toolchain_says_the_install_command() {
    let p = Project::without_toolchain(|m| m);
    let config = p.config(&[]);
    let env = |k: &str| (k == "PATH").then(|| "/nonexistent".to_string());
    let err = aot_build::run(&config, &env, &|_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no CUDA compiler found") && err.contains("bash scripts/setup-toolchain.sh"),
        "{err}"
    );
    let env = |k: &str| (k == "AOT_CUDA_HOME").then(|| "/nonexistent/cuda".to_string());
    let err = aot_build::run(&config, &env, &|_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("AOT_CUDA_HOME=/nonexistent/cuda has no bin/nvcc"),
        "{err}"
    );
}

#[test]
fn other_toolchain_reports_the_lock_as_not_applicable_and_leaves_it() {
    let p = Project::new(|m| m);
    let home = fake_toolchain(
        p.path(),
        "13.0.99",
        "sm_80 sm_86 sm_87 sm_89 sm_90 sm_100 sm_103 sm_110 sm_120 sm_121",
        Some(&toolchain_home()),
    );
    let lock_before = std::fs::read(p.path().join("aot-manifest.lock")).unwrap();
    let out = p.build_with(&p.config(&["sm_90"]), Some(&home)).unwrap();
    assert_eq!(
        out.lock_status,
        LockStatus::NotApplicable {
            toolchain: "nvcc 13.0.99".into(),
            pinned: "13.0.88".into()
        }
    );
    assert_eq!(
        std::fs::read(p.path().join("aot-manifest.lock")).unwrap(),
        lock_before
    );
    let mut config = p.config(&[]);
    config.update_lock = true;
    let err = err_text(p.build_with(&config, Some(&home)));
    assert!(
        err.contains("refusing to write the lock: nvcc 13.0.99 is not the pinned 13.0.88"),
        "{err}"
    );
}

#[test]
fn cache_recompiles_only_the_changed_module() {
    let p = Project::new(|m| m);
    let first = p.build(&["sm_90"]).unwrap();
    assert_eq!(
        (first.compiled, first.cached),
        (12, 0),
        "3 modules x 2 toolchains x (sm_90 + compute_80)"
    );
    assert_eq!(first.lock_status, LockStatus::Verified { partial: true });
    let again = p.build(&["sm_90"]).unwrap();
    assert_eq!((again.compiled, again.cached), (0, 12));

    let src = p.path().join("kernels/rotary/rotary_neox.cu");
    let text = std::fs::read_to_string(&src).unwrap();
    std::fs::write(
        &src,
        format!("{text}\n// a comment changes the source hash\n"),
    )
    .unwrap();
    // The source hash changed, so the lock check fails, but only `rotary` was recompiled;
    // its stale cache entries were replaced, the other modules' entries kept.
    let cache = p.path().join("out/cache");
    let names = |m: &str| {
        let mut v: Vec<String> = std::fs::read_dir(cache.join(m))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = (names("rmsnorm"), names("rotary"), names("activation"));
    let err = err_text(p.build(&["sm_90"]));
    assert!(err.contains("module rotary: source sha256"), "{err}");
    let after = (names("rmsnorm"), names("rotary"), names("activation"));
    assert_eq!(before.0, after.0);
    assert_eq!(before.2, after.2);
    assert_eq!(after.1.len(), 4, "{after:?}");
    assert!(
        after.1.iter().all(|n| !before.1.contains(n)),
        "rotary was recompiled: {before:?} -> {after:?}"
    );
}

#[test]
fn two_builds_in_different_folders_give_identical_images_equal_to_the_lock() {
    let targets = ["sm_87", "sm_110"];
    let (pa, pb) = (Project::new(|m| m), Project::new(|m| m));
    let (a, b) = (pa.build(&targets).unwrap(), pb.build(&targets).unwrap());
    let lock = fatbin_verify::lock::Lock::from_path(&repo().join("aot-manifest.lock")).unwrap();
    for (ma, mb) in a.modules.iter().zip(&b.modules) {
        // CUDA 13.0: sm_87 sm_110 compute_80; CUDA 12.9 (no sm_110): sm_87 compute_80.
        let built: Vec<String> = ma
            .images
            .iter()
            .map(|i| format!("{}:{}", i.toolchain, i.target))
            .collect();
        assert_eq!(
            built,
            [
                "13.0:sm_87",
                "13.0:sm_110",
                "13.0:compute_80",
                "12.9:sm_87",
                "12.9:compute_80"
            ]
        );
        for (ia, ib) in ma.images.iter().zip(&mb.images) {
            assert_eq!(
                (ia.toolchain, ia.target, &ia.sha256),
                (ib.toolchain, ib.target, &ib.sha256),
                "{} differs between builds",
                ma.name
            );
            assert_eq!(
                lock.image(&ma.name, ia.toolchain, ia.target)
                    .unwrap()
                    .sha256,
                ia.sha256
            );
        }
        assert_eq!(
            std::fs::read(&ma.fatbin).unwrap(),
            std::fs::read(&mb.fatbin).unwrap()
        );
    }
}

#[test]
fn target_filter_rejects_ptx_and_garbage() {
    assert!(aot_build::parse_target_filter("sm_90, sm_110").is_ok());
    let err = aot_build::parse_target_filter("compute_80")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("PTX target") && err.contains("always built"),
        "{err}"
    );
    let err = aot_build::parse_target_filter("sm_9x")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("AOT_TARGETS") && err.contains("sm_9x"),
        "{err}"
    );
}

#[test]
fn per_module_arch_specific_and_family_targets_keep_the_ptx_fallback() {
    // A Hopper-only fast path (`sm_90a`) and a Blackwell family image (`sm_100f`) for one module.
    let p = Project::new(|m| {
        m.replace(
            "entries = [\"silu_and_mul_bf16\"]",
            "entries = [\"silu_and_mul_bf16\"]\ntargets = [\"sm_90a\", \"sm_100f\"]",
        )
    });
    let lock = p.path().join("none.lock");
    let mut config = p.config(&[]);
    config.lock_path = lock;
    config.update_lock = true;
    // The lock is written to a scratch path: this test is about the images, not the repo's lock.
    let out = p.build_with(&config, Some(&toolchain_home())).unwrap();
    let activation = out.modules.iter().find(|m| m.name == "activation").unwrap();
    let targets: Vec<String> = activation
        .images
        .iter()
        .map(|i| i.target.to_string())
        .collect();
    // CUDA 12.9 builds the module's own targets too (both SMs are in its list).
    assert_eq!(
        targets,
        [
            "sm_90a",
            "sm_100f",
            "compute_80",
            "sm_90a",
            "sm_100f",
            "compute_80"
        ]
    );
    // Read back from the fatbin: the variant comes from the entry's flags, the toolchain from
    // the image (ELF ABI 8 / 7, PTX ISA 9.0 / 8.8).
    let bytes = std::fs::read(&activation.fatbin).unwrap();
    let listed: Vec<String> = fatbin_verify::list_images(&bytes)
        .unwrap()
        .iter()
        .map(|i| format!("{}:{}", i.cuda.unwrap().major, i.target.unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            "13:sm_90a",
            "13:sm_100f",
            "13:compute_80",
            "12:sm_90a",
            "12:sm_100f",
            "12:compute_80"
        ]
    );
}

#[test]
fn nvcc_environment_flags_do_not_reach_the_compiler() {
    // nvcc appends NVCC_APPEND_FLAGS to every command line; the build clears it so the images
    // (and their cache keys) depend on the manifest alone. Set for this whole test process: any
    // build here that let it through would fail on the unknown flag.
    std::env::set_var("NVCC_APPEND_FLAGS", "--no-such-nvcc-flag");
    let out = Project::new(|m| m).build(&["sm_90"]).unwrap();
    assert_eq!(out.lock_status, LockStatus::Verified { partial: true });
}

#[test]
fn cuda12_images_read_back_as_cuda12_and_equal_the_lock() {
    let p = Project::new(|m| m);
    let out = p.build(&["sm_90"]).unwrap();
    assert_eq!(out.lock_status, LockStatus::Verified { partial: true });
    assert_eq!(out.extra_toolchains.len(), 1);
    assert_eq!(out.extra_toolchains[0].version, "12.9.86");
    assert!(!out.extra_toolchains[0].sm_list.contains(&110));
    for m in &out.modules {
        let bytes = std::fs::read(&m.fatbin).unwrap();
        let listed = fatbin_verify::list_images(&bytes).unwrap();
        // Two containers (one per toolchain) back to back in the module's file.
        let containers: std::collections::BTreeSet<_> =
            listed.iter().map(|i| i.source.container_offset).collect();
        assert_eq!(containers.len(), 2, "{}", m.name);
        for (built, info) in m.images.iter().zip(&listed) {
            assert_eq!(
                fatbin_verify::sha256_hex(&info.sha256),
                built.sha256,
                "{}",
                m.name
            );
            assert_eq!(info.raw_range.as_ref().unwrap().start, built.offset);
            let cuda = info.cuda.unwrap();
            assert!(cuda.matches(&built.toolchain), "{} {cuda}", m.name);
            if built.toolchain == CU12 {
                // ptxas 12.x writes ELF ABI 7; NVRTC 12.9 PTX is ISA 8.8. (fatbinary blanks the
                // PTX header comments that name the release, so the major is what is left.)
                // (sm_90 only here: ptxas 12.9 writes ABI 8 from sm_100 on.)
                match built.target.virtual_arch {
                    false => assert_eq!(info.elf_abi, Some(7), "{}", m.name),
                    true => assert_eq!(info.ptx_version, Some((8, 8))),
                }
                assert_eq!(info.cuda, Some(CudaRelease::major_only(12)));
            } else {
                match built.target.virtual_arch {
                    false => assert_eq!(info.elf_abi, Some(8), "{}", m.name),
                    true => assert_eq!(info.ptx_version, Some((9, 0))),
                }
            }
        }
    }
}

#[test]
fn cuda12_only_compile_errors_and_warnings_name_the_toolchain() {
    // NVRTC defines __CUDACC_VER_MAJOR__ 12: these lines reach CUDA 12.9 only.
    for (inject, needle) in [
        ("undeclared_name += 1;", "undeclared_name"),
        ("int unused_variable = 3;", "unused_variable"),
    ] {
        let p = Project::new(|m| m);
        let src = p.path().join("kernels/activation/silu_and_mul.cu");
        let text = std::fs::read_to_string(&src).unwrap();
        std::fs::write(
            &src,
            text.replace(
                "const int64_t row = blockIdx.y;",
                &format!("const int64_t row = blockIdx.y;\n#if __CUDACC_VER_MAJOR__ == 12\n{inject}\n#endif\n"),
            ),
        )
        .unwrap();
        let err = err_text(p.build(&["sm_90"]));
        assert!(
            err.contains("module activation: kernels/activation/silu_and_mul.cu failed to compile for sm_90 with CUDA 12.9"),
            "{err}"
        );
        assert!(err.contains(needle), "NVRTC's own message is shown: {err}");
    }
}

#[test]
fn missing_extra_toolchain_says_the_install_command() {
    let p = Project::without_toolchain(|m| m);
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("the CUDA 12.9 toolchain of") && err.contains("is not installed"),
        "{err}"
    );
    assert!(err.contains("bash scripts/setup-toolchain.sh"), "{err}");
}

#[test]
fn extra_toolchain_target_it_cannot_build_is_rejected_naming_the_key() {
    // NVRTC 12.9 has no sm_110 (Thor is sm_101 there).
    let p = Project::new(|m| {
        m.replace(
            "sass = [\"sm_80\", \"sm_86\", \"sm_87\", \"sm_89\", \"sm_90\", \"sm_100\", \"sm_103\", \"sm_120\", \"sm_121\"]",
            "sass = [\"sm_90\", \"sm_110\"]",
        )
    });
    let err = err_text(p.build(&["sm_90"]));
    assert!(
        err.contains("extra_toolchain[0] (12.9).sass: NVRTC 12.9.86")
            && err.contains("cannot build `sm_110`"),
        "{err}"
    );
}
