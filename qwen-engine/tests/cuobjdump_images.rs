//! NVIDIA's `cuobjdump` on the built `qwen-decode` (a test oracle from PyPI, which
//! `bash scripts/setup-toolchain.sh` installs beside the pinned nvcc): it sees every image of
//! aot-manifest.lock, one for one and byte for byte, because the registry embeds the fatbins in
//! `.nv_fatbin` where nvcc puts its own; and `fatbin-verify` finds the same images there. Runs
//! without a GPU; without the oracle these tests fail, never skip. The C ABI's libraries get the
//! same checks in `aot-kernels-capi/tests/cuobjdump_libraries.rs`.

#[path = "../../fatbin-verify/tests/common/lock_oracle.rs"]
mod lock_oracle;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lock_oracle::Identity;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_qwen-decode"))
}

fn require_full_build() {
    assert!(
        aot_kernels::registry::build_info().target_filter.is_none(),
        "built with AOT_TARGETS: the binary cannot carry every locked image; rebuild without it"
    );
}

/// What cuobjdump extracts from `qwen-decode`; extracted once.
fn extracted() -> &'static [Identity] {
    static EXTRACTED: OnceLock<Vec<Identity>> = OnceLock::new();
    EXTRACTED.get_or_init(|| {
        lock_oracle::extracted(&lock_oracle::cuobjdump_path(&workspace()), binary())
    })
}

#[test]
fn cuobjdump_lists_every_locked_image_by_kind_and_arch() {
    require_full_build();
    lock_oracle::assert_lists_every_locked_image(
        &lock_oracle::cuobjdump_path(&workspace()),
        &lock_oracle::lock(&workspace()),
        binary(),
    );
}

#[test]
fn cuobjdump_extracts_every_locked_image_byte_for_byte() {
    require_full_build();
    lock_oracle::assert_extracts_every_locked_image(
        &lock_oracle::lock(&workspace()),
        binary(),
        extracted(),
    );
}

#[test]
fn fatbin_verify_finds_in_nv_fatbin_what_cuobjdump_extracts() {
    require_full_build();
    lock_oracle::assert_fatbin_verify_agrees(binary(), extracted());
}
