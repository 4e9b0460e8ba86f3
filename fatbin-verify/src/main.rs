//! `fatbin-verify`: list, extract and verify the GPU images in fatbins, cubins, PTX files and
//! host binaries. A thin layer over the `fatbin_verify` library.
//!
//! Exit codes: 0 all good, 1 a verification mismatch, 2 an unreadable or unparsable input
//! (or a usage error).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fatbin_verify::lock::Lock;
use fatbin_verify::manifest::Manifest;
use fatbin_verify::verify::{verify, FileImages};
use fatbin_verify::{image_bytes, list_images, sha256_hex, ImageInfo, ImageKind};

const USAGE: &str = "usage:
  fatbin-verify list [--json] FILE...
  fatbin-verify extract --out DIR FILE...
  fatbin-verify verify --manifest aot-manifest.toml [--lock aot-manifest.lock] FILE...

FILE may be a fatbin, a cubin, a PTX file, an ELF executable, shared library or object, or an
ar archive (static library, Rust rlib); fatbins embedded anywhere in it are found.
Exit codes: 0 ok, 1 verification mismatch, 2 unreadable or unparsable input.";

/// A failure that ends the run with exit code 2, its message naming the file and the fix.
struct Fatal(String);

/// Dies quietly on a closed pipe (`fatbin-verify list x | head`), as Unix tools do, instead of
/// Rust's default of ignoring SIGPIPE and panicking in `println!`.
fn restore_sigpipe() {
    // SAFETY: sets the default disposition of one signal before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    restore_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("list") => cmd_list(&args[1..]),
        Some("extract") => cmd_extract(&args[1..]),
        Some("verify") => cmd_verify(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(Fatal(format!("expected a subcommand\n{USAGE}"))),
    };
    result.unwrap_or_else(|Fatal(message)| {
        eprintln!("fatbin-verify: {message}");
        ExitCode::from(2)
    })
}

/// Options and files of one subcommand; `takes_value` names the options that take a value.
struct Args {
    flags: Vec<(String, Option<String>)>,
    files: Vec<PathBuf>,
}

impl Args {
    fn parse(args: &[String], switches: &[&str], takes_value: &[&str]) -> Result<Args, Fatal> {
        let mut out = Args {
            flags: Vec::new(),
            files: Vec::new(),
        };
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            if takes_value.contains(&name) {
                let value = inline
                    .or_else(|| iter.next().cloned())
                    .ok_or_else(|| Fatal(format!("{name} needs a value\n{USAGE}")))?;
                out.flags.push((name.to_string(), Some(value)));
            } else if switches.contains(&name) {
                out.flags.push((name.to_string(), None));
            } else if name.starts_with('-') && name.len() > 1 {
                return Err(Fatal(format!("unknown option {name}\n{USAGE}")));
            } else {
                out.files.push(PathBuf::from(arg));
            }
        }
        if out.files.is_empty() {
            return Err(Fatal(format!("no input files given\n{USAGE}")));
        }
        Ok(out)
    }

    fn has(&self, name: &str) -> bool {
        self.flags.iter().any(|(n, _)| n == name)
    }

    fn value(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, Fatal> {
    std::fs::read(path).map_err(|e| {
        Fatal(format!(
            "{}: cannot read: {e}; check the path and its permissions",
            path.display()
        ))
    })
}

fn images_of(path: &Path, bytes: &[u8]) -> Result<Vec<ImageInfo>, Fatal> {
    list_images(bytes).map_err(|e| {
        Fatal(format!(
            "{}: {e}; the file is not a valid fatbin/cubin/PTX/host binary or is corrupt: rebuild it (nvcc -fatbin / cargo build) and retry",
            path.display()
        ))
    })
}

fn arch(info: &ImageInfo) -> String {
    info.target
        .map(|t| t.to_string())
        .unwrap_or_else(|| "-".into())
}

fn version(info: &ImageInfo) -> String {
    match (info.ptx_version, info.elf_abi) {
        (Some((major, minor)), _) => format!("ptx {major}.{minor}"),
        (None, Some(abi)) => format!("abi {abi}"),
        _ => "-".into(),
    }
}

/// The CUDA release that made the image, as the image itself says (see `fatbin_verify::toolkit`).
fn cuda(info: &ImageInfo) -> String {
    info.cuda
        .map(|c| c.to_string())
        .unwrap_or_else(|| "-".into())
}

fn compression(info: &ImageInfo) -> &'static str {
    match info.compression {
        fatbin_verify::Compression::None => "none",
        fatbin_verify::Compression::Zstd => "zstd",
        fatbin_verify::Compression::Lz4 => "lz4",
    }
}

fn where_found(info: &ImageInfo) -> String {
    let mut out = match info.source.container_offset {
        Some(off) => format!("{off:#x}/{}", info.source.entry_index),
        None => "bare".into(),
    };
    if let Some(member) = &info.source.member {
        out = format!("{member}:{out}");
    }
    out
}

fn cmd_list(args: &[String]) -> Result<ExitCode, Fatal> {
    let args = Args::parse(args, &["--json"], &[])?;
    let mut json = Vec::new();
    for path in &args.files {
        let bytes = read_file(path)?;
        let images = images_of(path, &bytes)?;
        if args.has("--json") {
            json.push(serde_json::json!({ "file": path.display().to_string(), "images": images }));
            continue;
        }
        println!("{}: {} image(s)", path.display(), images.len());
        println!(
            "  {:>3}  {:<14} {:<7} {:<10} {:<8} {:<5} {:<5} {:>9}  {:<16}  kernels",
            "#", "where", "kind", "arch", "version", "cuda", "comp", "size", "sha256"
        );
        for (i, info) in images.iter().enumerate() {
            let hex = sha256_hex(&info.sha256);
            println!(
                "  {:>3}  {:<14} {:<7} {:<10} {:<8} {:<5} {:<5} {:>9}  {:<16}  {}",
                i + 1,
                where_found(info),
                info.kind.name(),
                arch(info),
                version(info),
                cuda(info),
                compression(info),
                info.size,
                hex.get(..16).unwrap_or(&hex),
                info.kernels.join(",")
            );
        }
    }
    if args.has("--json") {
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| Fatal(format!("cannot write JSON: {e}")))?;
        println!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `app.3.sm_90a.cubin`: file stem, image number (from 1, like cuobjdump), arch, kind.
fn extract_name(stem: &str, number: usize, info: &ImageInfo) -> String {
    let ext = match info.kind {
        ImageKind::Elf => "cubin".to_string(),
        ImageKind::Ptx => "ptx".to_string(),
        ImageKind::RelocatablePtx => "rel.ptx".to_string(),
        ImageKind::LtoIr => "ltoir".to_string(),
        ImageKind::Unknown(code) => format!("kind{code:x}.bin"),
    };
    format!("{stem}.{number}.{}.{ext}", arch(info))
}

fn cmd_extract(args: &[String]) -> Result<ExitCode, Fatal> {
    let args = Args::parse(args, &[], &["--out"])?;
    let out_dir = PathBuf::from(
        args.value("--out")
            .ok_or_else(|| Fatal(format!("extract needs --out DIR\n{USAGE}")))?,
    );
    std::fs::create_dir_all(&out_dir).map_err(|e| {
        Fatal(format!(
            "{}: cannot create the output folder: {e}",
            out_dir.display()
        ))
    })?;
    for path in &args.files {
        let bytes = read_file(path)?;
        let images = images_of(path, &bytes)?;
        let stem = path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "input".into());
        for (i, info) in images.iter().enumerate() {
            let data =
                image_bytes(&bytes, info).map_err(|e| Fatal(format!("{}: {e}", path.display())))?;
            let dest = out_dir.join(extract_name(&stem, i + 1, info));
            std::fs::write(&dest, &data)
                .map_err(|e| Fatal(format!("{}: cannot write: {e}", dest.display())))?;
            println!("{}", dest.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_verify(args: &[String]) -> Result<ExitCode, Fatal> {
    let args = Args::parse(args, &[], &["--manifest", "--lock"])?;
    let manifest_path = args.value("--manifest").ok_or_else(|| {
        Fatal(format!(
            "verify needs --manifest aot-manifest.toml\n{USAGE}"
        ))
    })?;
    let manifest =
        Manifest::from_path(Path::new(manifest_path)).map_err(|e| Fatal(e.to_string()))?;
    let lock = match args.value("--lock") {
        Some(p) => Some(Lock::from_path(Path::new(p)).map_err(|e| Fatal(e.to_string()))?),
        None => None,
    };
    let mut files = Vec::new();
    for path in &args.files {
        let bytes = read_file(path)?;
        files.push(FileImages {
            name: path.display().to_string(),
            images: images_of(path, &bytes)?,
        });
    }
    let discrepancies = verify(&manifest, lock.as_ref(), &files);
    for d in &discrepancies {
        println!("{d}");
    }
    let images: usize = files.iter().map(|f| f.images.len()).sum();
    if discrepancies.is_empty() {
        println!(
            "ok: {images} image(s) in {} file(s) match the manifest{}",
            files.len(),
            if lock.is_some() { " and the lock" } else { "" }
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "fatbin-verify: {} discrepancy(ies) in {images} image(s)",
            discrepancies.len()
        );
        Ok(ExitCode::from(1))
    }
}
