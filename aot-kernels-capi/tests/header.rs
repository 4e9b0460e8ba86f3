//! include/aot_kernels.h is what cbindgen makes of the crate: regenerated here and compared, so a
//! changed signature without a regenerated header fails CI.

use std::path::Path;

const FIX: &str = "AOT_KERNELS_CAPI_WRITE_HEADER=1 cargo test -p aot-kernels-capi --test header";

fn generate() -> String {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("aot-kernels-capi/cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

#[test]
fn the_committed_header_is_what_cbindgen_generates() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/aot_kernels.h");
    let fresh = generate();
    if std::env::var_os("AOT_KERNELS_CAPI_WRITE_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/aot_kernels.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != fresh {
        let first = committed
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(fresh.lines().count()));
        panic!(
            "{} is stale (first difference at line {}): regenerate it with `{FIX}` and commit it",
            path.display(),
            first + 1
        );
    }
}

#[test]
fn the_header_publishes_the_abi_version_and_the_status_values() {
    let h = generate();
    let version = format!(
        "#define AOT_KERNELS_ABI_VERSION_MAJOR {}",
        aot_kernels_capi::AOT_KERNELS_ABI_VERSION_MAJOR
    );
    assert!(h.contains(&version), "{version} missing from the header");
    assert!(h.contains("AOT_STATUS_OK = 0"), "AOT_STATUS_OK missing");
    assert!(
        h.contains("AOT_STATUS_INTERNAL = 13"),
        "AOT_STATUS_INTERNAL missing"
    );
    for f in [
        "aot_abi_version",
        "aot_backend_create_in_context",
        "aot_sample_tokens",
        "aot_last_error_message",
    ] {
        assert!(h.contains(&format!("{f}(")), "{f} missing from the header");
    }
}
