//! Compiles the kernels in aot-manifest.toml ahead of time for every target, checks each image
//! against aot-manifest.lock, and generates the registry `src/registry.rs` embeds.
//! The work is in build/ (shared with the tests); this file wires it to cargo.

#[path = "build/mod.rs"]
mod aot_build;

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for knob in aot_build::ENV_KNOBS {
        println!("cargo:rerun-if-env-changed={knob}");
    }
    println!("cargo:rerun-if-changed=build");
    let env = |k: &str| std::env::var(k).ok();
    let log = |line: &str| println!("aot-kernels: {line}");
    let started = std::time::Instant::now();
    let result = aot_build::Config::from_env(&crate_dir, &out_dir, &env).and_then(|config| {
        // Rerun on the manifest, lock and kernel sources even if the build fails part-way.
        println!("cargo:rerun-if-changed={}", config.manifest_path.display());
        println!("cargo:rerun-if-changed={}", config.lock_path.display());
        println!(
            "cargo:rerun-if-changed={}",
            config.project_root.join("kernels").display()
        );
        aot_build::run(&config, &env, &log)
    });
    match result {
        Ok(out) => {
            for input in &out.inputs {
                println!("cargo:rerun-if-changed={}", input.display());
            }
            log(&format!(
                "{} modules, {} images compiled, {} from cache, in {:.1} s",
                out.modules.len(),
                out.compiled,
                out.cached,
                started.elapsed().as_secs_f64()
            ));
            match &out.lock_status {
                aot_build::LockStatus::NotApplicable { .. } => {
                    println!("cargo:warning=aot-kernels: lock {}", out.lock_status)
                }
                // A deliberate choice, but the binary then lacks promised SASS: say so every build.
                aot_build::LockStatus::Verified { partial: true } => println!(
                    "cargo:warning=aot-kernels: AOT_TARGETS limits this build; it lacks SASS the manifest promises (unset AOT_TARGETS for a full build)"
                ),
                _ => {}
            }
            println!(
                "cargo:rustc-env=AOT_REGISTRY_RS={}",
                out.registry_rs.display()
            );
            println!(
                "cargo:rustc-env=AOT_TRITON_META_RS={}",
                out.triton_meta_rs.display()
            );
        }
        Err(e) => {
            eprintln!("\nerror: aot-kernels kernel build failed\n{e}\n");
            std::process::exit(1);
        }
    }
}
