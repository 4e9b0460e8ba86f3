//! NVIDIA's `cuobjdump` on the C ABI's static and shared libraries, as a C++ engine links them:
//! both carry every image of aot-manifest.lock in `.nv_fatbin`, one for one and byte for byte, and
//! `fatbin-verify` finds the same images (the checks `qwen-decode` gets in
//! `qwen-engine/tests/cuobjdump_images.rs`). The libraries are the ones cargo builds beside this
//! test (`deps/libaot_kernels_capi.{a,so}`). Runs without a GPU; without the oracle (`bash
//! scripts/setup-toolchain.sh`) these tests fail, never skip.

#[path = "../../fatbin-verify/tests/common/lock_oracle.rs"]
mod lock_oracle;

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The library cargo built with this test: `deps/` holds the test binary and the crate's
/// `staticlib` and `cdylib` outputs of the same build.
fn library(extension: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let lib = deps.join(format!("libaot_kernels_capi.{extension}"));
    assert!(
        lib.is_file(),
        "{} not found beside the test binary: cargo builds it with the crate's tests \
         (`cargo test --release -p aot-kernels-capi`)",
        lib.display()
    );
    lib
}

fn require_full_build() {
    assert!(
        aot_kernels::registry::build_info().target_filter.is_none(),
        "built with AOT_TARGETS: the libraries cannot carry every locked image; rebuild without it"
    );
}

fn check(extension: &str) {
    require_full_build();
    let (tool, lock, lib) = (
        lock_oracle::cuobjdump_path(&workspace()),
        lock_oracle::lock(&workspace()),
        library(extension),
    );
    lock_oracle::assert_lists_every_locked_image(&tool, &lock, &lib);
    let extracted = lock_oracle::extracted(&tool, &lib);
    lock_oracle::assert_extracts_every_locked_image(&lock, &lib, &extracted);
    lock_oracle::assert_fatbin_verify_agrees(&lib, &extracted);
}

#[test]
fn the_static_library_carries_every_locked_image_where_cuobjdump_sees_it() {
    check("a");
}

#[test]
fn the_shared_library_carries_every_locked_image_where_cuobjdump_sees_it() {
    check("so");
}
