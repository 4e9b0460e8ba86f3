//! Running NVIDIA's `cuobjdump` (a test oracle) and reading what it prints. Shared through
//! `#[path]` by `fatbin-verify/tests/oracle.rs` and `qwen-engine/tests/cuobjdump_images.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use fatbin_verify::{Target, Variant};
use sha2::{Digest, Sha256};

/// Runs cuobjdump (`tool`) with `args` on `file`, in `cwd` (where `-xelf`/`-xptx` write).
pub fn output(tool: &Path, args: &[&str], file: &Path, cwd: &Path) -> Output {
    Command::new(tool)
        .args(args)
        .arg(file)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tool.display()))
}

/// The same, which must succeed; its stdout.
pub fn stdout(tool: &Path, args: &[&str], file: &Path, cwd: &Path) -> String {
    let out = output(tool, args, file, cwd);
    assert!(
        out.status.success(),
        "cuobjdump {args:?} {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// cuobjdump's arch name in its listing: `sm_90a` for a cubin, `sm_100` for a family (`sm_100f`)
/// one, and `sm_NN` for PTX.
pub fn arch(t: Target) -> String {
    let suffix = if t.variant == Variant::ArchSpecific {
        "a"
    } else {
        ""
    };
    format!("sm_{}{suffix}", t.sm)
}

/// `(kind, arch)` pairs of `cuobjdump --list-elf --list-ptx` output (lines such as
/// `ELF file    1: app.1.sm_80.cubin`), sorted.
pub fn parse_list(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| {
            let (head, name) = line.split_once(": ")?;
            let kind = head.split_whitespace().next()?.to_string();
            let arch = name
                .split('.')
                .find(|part| part.starts_with("sm_"))?
                .to_string();
            Some((kind, arch))
        })
        .collect();
    out.sort();
    out
}

/// sha256 of every file `cuobjdump -xelf all` and `-xptx all` write for `file`, by kind (`ELF`,
/// `PTX`), each list sorted.
pub fn extracted(tool: &Path, file: &Path) -> BTreeMap<&'static str, Vec<String>> {
    let dir = tempfile::tempdir().expect("temp dir");
    let abs = file.canonicalize().expect("abs path");
    for flag in ["-xelf", "-xptx"] {
        // cuobjdump exits 0 with an info line when there is nothing of that kind.
        stdout(tool, &[flag, "all"], &abs, dir.path());
    }
    hashes_by_kind(dir.path())
}

/// sha256 of every file in `dir` by kind: `ELF` for `.cubin` files, `PTX` for the rest; each list
/// sorted.
pub fn hashes_by_kind(dir: &Path) -> BTreeMap<&'static str, Vec<String>> {
    let mut out: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let p = entry.expect("entry").path();
        let kind = if p.extension().is_some_and(|e| e == "cubin") {
            "ELF"
        } else {
            "PTX"
        };
        let bytes = std::fs::read(&p).expect("read extracted");
        out.entry(kind)
            .or_default()
            .push(format!("{:x}", Sha256::digest(&bytes)));
    }
    out.values_mut().for_each(|v| v.sort());
    out
}
