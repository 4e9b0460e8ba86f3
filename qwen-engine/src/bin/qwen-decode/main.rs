//! `qwen-decode`: Qwen decode on the aot-kernels backend.
//!
//! - `qwen-decode run --model DIR|tiny-en|tiny|qwen3-4b --prompt TEXT ...` decodes, streaming
//!   tokens as they are made (on the GPU if there is one, else on the CPU reference engine).
//! - `qwen-decode kernels` shows the embedded kernel registry and the dispatch plan of this
//!   machine (and loads it, reporting what the driver runs); `--simulate X.Y [--integrated]
//!   --driver X.Y` shows the plan of any other device without a GPU.
//! - `qwen-decode bench` runs the decode benchmark matrix on the GPU and writes an evidence bundle.
//! - `qwen-decode bench-report FILE.json [--markdown] [--chart OUT.svg]` checks a stored bench
//!   bundle (or a peers file) and renders its matrix table and chart; no GPU needed.
//!
//! Exit status: 0 fine, 1 a failure (kernels: a module has no usable image or failed to load;
//! bench-report: an unreadable or invalid bundle), 2 usage error, 3 no CUDA device here (kernels;
//! use --simulate), 4 a valid bundle that records a correctness failure (bench-report).
//!
//! `kernels` and modules unavailable by design: the Triton modules (Gated DeltaNet, MoE) are built
//! with CUDA 13 only, so a 12.x driver (or `--toolchain cuda12`) has no image for them. The plan
//! marks each UNAVAILABLE with the driver it needs, a note names them, and on a GPU the other
//! modules are still loaded and reported; the exit status stays 0 when every other module has an
//! image, since the Qwen3 engine launches none of them (it loads the `cuda` modules only). A
//! module that should run here and cannot (a `cuda` module, or a Triton module on a 13.x driver)
//! still exits 1.

mod bench;
mod bench_report;
mod run;

use std::fmt::Write as _;
use std::process::ExitCode;

use aot_kernels::dispatch::{
    self, DeviceSpec, LoadReport, ModuleSource, Plan, Policy, ToolchainChoice, Version,
};
use aot_kernels::registry;
use clap::{Parser, Subcommand};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "qwen-decode",
    version,
    about = "Qwen decode on ahead-of-time compiled CUDA kernels"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode with a model: a Hugging Face folder, the trained `tiny-en`, or `tiny` / `qwen3-4b` (synthetic weights).
    Run(run::RunArgs),
    /// Benchmark decode on the GPU: inputs x concurrency, against the measured bandwidth limit.
    Bench(bench::BenchArgs),
    /// Check a stored bench bundle (or peers file) and print its matrix table / write its chart.
    BenchReport(bench_report::BenchReportArgs),
    /// Show the embedded kernel registry and the dispatch plan (this machine's, or a simulated device's).
    Kernels(KernelsArgs),
}

#[derive(clap::Args)]
struct KernelsArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// auto (SASS, then PTX), sass-only or ptx-only; default from AOT_KERNELS_POLICY, else auto.
    #[arg(long, value_name = "POLICY")]
    policy: Option<Policy>,
    /// newest (the newest toolchain the driver accepts), cuda12 or cuda13 (only that toolchain's
    /// images); default from AOT_KERNELS_TOOLCHAIN, else newest.
    #[arg(long, value_name = "CHOICE")]
    toolchain: Option<ToolchainChoice>,
    /// Plan for a device with this compute capability (MAJOR.MINOR, e.g. 11.0) instead of this machine's GPU.
    #[arg(long, value_name = "X.Y", requires = "driver")]
    simulate: Option<Version>,
    /// The simulated device is integrated (Jetson/Tegra): no minor-version cubin compatibility.
    #[arg(long, requires = "simulate")]
    integrated: bool,
    /// CUDA version of the simulated driver (MAJOR.MINOR, e.g. 13.0).
    #[arg(long, value_name = "X.Y", requires = "simulate")]
    driver: Option<Version>,
}

#[derive(Serialize)]
struct KernelsJson<'a> {
    build: &'static registry::BuildInfo,
    /// Bytes of embedded fatbins, every module and toolchain.
    registry_bytes: usize,
    toolchain_choice: ToolchainChoice,
    plan: &'a Plan,
    /// Modules without an image here by design (see the module docs); not an error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unavailable: Vec<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    load: Option<&'a LoadReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

const EXIT_PLAN_ERROR: u8 = 1;
const EXIT_NO_DEVICE: u8 = 3;

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`qwen-decode kernels | head`) instead of panicking in println!.
    // SAFETY: sets the default disposition of one signal before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Kernels(args) => kernels(args),
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::bench(args),
        Command::BenchReport(args) => bench_report::bench_report(args),
    }
}

/// The toolchains, then per module and toolchain its images (sizes and hashes are in `--json`).
fn registry_table() -> String {
    let b = registry::build_info();
    let mut out = String::new();
    let filter = b
        .target_filter
        .map(|f| format!(", limited to AOT_TARGETS={f}"))
        .unwrap_or_default();
    let toolchains: Vec<String> = b
        .toolchains
        .iter()
        .map(|t| format!("CUDA {} ({} {})", t.cuda, t.compiler, t.version))
        .collect();
    let _ = writeln!(
        out,
        "kernel registry: {}{filter}; {} KiB embedded; lock {}",
        toolchains.join(", "),
        registry::embedded_bytes().div_ceil(1024),
        b.lock_status
    );
    for m in registry::modules() {
        let kind = match m.kind {
            registry::ModuleKind::Cuda => "",
            registry::ModuleKind::Triton => " (triton)",
        };
        let _ = writeln!(out, "  {} [{}]{kind}:", m.name, m.entries.join(", "));
        for t in b.toolchains {
            let mine: Vec<_> = m.images.iter().filter(|i| i.toolchain == t.cuda).collect();
            if mine.is_empty() {
                continue;
            }
            let images: Vec<String> = mine
                .iter()
                .map(|i| match i.ptx_version {
                    Some((a, b)) => format!("{} (PTX {a}.{b})", i.target),
                    None => i.target.to_string(),
                })
                .collect();
            let bytes: usize = mine.iter().map(|i| i.size).sum();
            let _ = writeln!(
                out,
                "    CUDA {}: {}; {} KiB",
                t.cuda,
                images.join(" "),
                bytes.div_ceil(1024)
            );
        }
    }
    out
}

fn kernels(args: KernelsArgs) -> ExitCode {
    let policy = match args.policy.map(Ok).unwrap_or_else(Policy::from_env) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let choice = match args
        .toolchain
        .map(Ok)
        .unwrap_or_else(ToolchainChoice::from_env)
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let modules = ModuleSource::registry_with(choice);

    // A simulated device needs no driver; otherwise open GPU 0 and read what it is.
    let (device, opened, device_error) = match (args.simulate, args.driver) {
        (Some(capability), Some(driver)) => (
            Some(DeviceSpec {
                capability,
                integrated: args.integrated,
                driver,
            }),
            None,
            None,
        ),
        _ => match dispatch::open_device(0) {
            Ok(d) => (Some(d.spec), Some(d), None),
            Err(e) => (None, None, Some(e.to_string())),
        },
    };

    let Some(device) = device else {
        let msg = device_error.unwrap_or_default();
        if args.json {
            let out = serde_json::json!({ "build": registry::build_info(), "registry_bytes": registry::embedded_bytes(), "registry": registry::modules(), "error": msg });
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        } else {
            print!("{}", registry_table());
            eprintln!("\nno CUDA device here, so no dispatch plan: {msg}");
        }
        return ExitCode::from(EXIT_NO_DEVICE);
    };

    let plan = dispatch::plan(device, policy, args.simulate.is_some(), &modules);
    let mut error = plan.has_errors().then(|| {
        match dispatch::oldest_driver_for_plan(device, policy, &modules) {
            Some(needed) if needed > device.driver => {
                let all = dispatch::oldest_driver_for_all(device, policy, &modules)
                    .filter(|&v| v > needed)
                    .map(|v| format!(" (CUDA {v} for every module, those built with CUDA 13 only included)"))
                    .unwrap_or_default();
                format!(
                    "the driver (CUDA {}) is too old for these kernels: the oldest driver that runs them here supports CUDA {needed}{all}. Update the NVIDIA driver (CUDA 12.x: r525 or later; CUDA 13.x: r580 or later)",
                    device.driver
                )
            }
            _ => "a module has no usable image on this device; see the plan".to_string(),
        }
    });
    let unavailable: Vec<&str> = plan.unavailable().map(|m| m.module.as_str()).collect();
    let note = (!unavailable.is_empty() && error.is_none()).then(|| {
        format!(
            "{} module(s) unavailable on this device: {}. The plan says why for each. The Triton modules are built with CUDA 13 only, which a 12.x driver or a toolchain choice cannot serve (the Qwen3 engine does not use them). A fast path (gemm_bf16_sm90: sm_90a SASS only) runs only where its SASS fits and the policy loads SASS; elsewhere its portable kernel serves. Every other module has an image.",
            unavailable.len(),
            unavailable.join(", ")
        )
    });

    // On a real device, load what the plan chose so the driver's own view is reported (the
    // modules unavailable here aside).
    let servable: Vec<ModuleSource> = modules
        .iter()
        .filter(|m| plan.choice(&m.name).is_some())
        .cloned()
        .collect();
    let loaded = match (&opened, error.is_none()) {
        (Some(d), true) => match dispatch::load_modules(d, 0, policy, &servable) {
            Ok(k) => Some(k),
            Err(e) => {
                error = Some(e.to_string());
                None
            }
        },
        _ => None,
    };
    let load = loaded.as_ref().map(|k| k.report());

    if args.json {
        let out = KernelsJson {
            build: registry::build_info(),
            registry_bytes: registry::embedded_bytes(),
            toolchain_choice: choice,
            plan: &plan,
            unavailable,
            load,
            error: error.clone(),
        };
        match serde_json::to_string_pretty(&out) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("error: cannot write JSON: {e}"),
        }
    } else {
        print!("{}", registry_table());
        println!();
        if choice != ToolchainChoice::Newest {
            println!("images limited to {choice} (--toolchain / AOT_KERNELS_TOOLCHAIN)");
        }
        print!("{}", plan.to_table());
        if let Some(r) = load {
            println!();
            print!("{}", r.to_table());
        }
        if let Some(n) = &note {
            eprintln!("\nnote: {n}");
        }
        if let Some(e) = &error {
            eprintln!("\nerror: {e}");
        }
    }
    if error.is_some() {
        ExitCode::from(EXIT_PLAN_ERROR)
    } else {
        ExitCode::SUCCESS
    }
}
