//! `qwen-decode bench-report FILE.json`: check a stored bench bundle (or a peers file) and render
//! it: a summary, `--markdown` the matrix table, `--chart OUT.svg` the chart. No GPU needed.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use qwen_engine::bench::report::{BenchReport, Peers, PEERS_SOURCE};
use serde_json::Value;

/// A valid bundle that records a correctness failure (digests differ between policies, or a
/// first request differs from its single-request run).
const EXIT_CORRECTNESS: u8 = 4;

#[derive(clap::Args, Debug)]
pub struct BenchReportArgs {
    /// A bundle's bench.json, or the JSON of scripts/bench/peers.py.
    file: PathBuf,
    /// Print the matrix as a Markdown table (what the issue note carries).
    #[arg(long)]
    markdown: bool,
    /// Write the chart (SVG) to this new file.
    #[arg(long, value_name = "OUT.svg")]
    chart: Option<PathBuf>,
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(1)
}

pub fn bench_report(args: BenchReportArgs) -> ExitCode {
    let what = args.file.display().to_string();
    let text = match std::fs::read_to_string(&args.file) {
        Ok(t) => t,
        Err(e) => return fail(format!("{what}: cannot read: {e}")),
    };
    // A peers file has no schema id; tell it apart by its source.
    let is_peers = serde_json::from_str::<Value>(&text).is_ok_and(|v| {
        v.get("schema").is_none() && v.get("source").and_then(Value::as_str) == Some(PEERS_SOURCE)
    });
    if is_peers {
        return peers_report(&text, &what, &args);
    }
    let report = match BenchReport::from_json(&text, &what).and_then(|r| r.validate().map(|()| r)) {
        Ok(r) => r,
        Err(e) => return fail(format!("{what}: {e}")),
    };
    println!(
        "{what}: valid {} bundle{}: {} on {} (capability {}, CUDA {} driver), {} cells, streaming read {}, peers {}",
        report.schema,
        if report.sample { " (a SAMPLE: a test fixture, not a run to cite)" } else { "" },
        report.model.name,
        report.device.name,
        report.device.capability,
        report.device.driver,
        report.cells.len(),
        report.bandwidth.describe(),
        if report.peers.is_some() { "present" } else { "absent" },
    );
    if args.markdown {
        println!();
        print!("{}", report.markdown_table());
    }
    if let Some(out) = &args.chart {
        match report
            .chart_svg()
            .map_err(|e| e.to_string())
            .and_then(|svg| write_new(out, &svg))
        {
            Ok(()) => println!("chart written to {}", out.display()),
            Err(e) => return fail(e),
        }
    }
    let failures = report.correctness_failures();
    if failures.is_empty() {
        println!("correctness: every first request matches its single-request run; digests agree across policies");
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            eprintln!("correctness failure: {f}");
        }
        ExitCode::from(EXIT_CORRECTNESS)
    }
}

fn peers_report(text: &str, what: &str, args: &BenchReportArgs) -> ExitCode {
    let peers = match Peers::from_json(text, what).and_then(|p| p.validate().map(|()| p)) {
        Ok(p) => p,
        Err(e) => return fail(format!("{what}: {e}")),
    };
    if args.chart.is_some() {
        return fail(format!(
            "{what} is a peers file: the chart needs a bench bundle (give it to `qwen-decode bench --peers`)"
        ));
    }
    println!("{what}: valid peers ({} cells)", peers.cells.len());
    if args.markdown {
        println!();
        print!("{}", peers.markdown_table());
    }
    ExitCode::SUCCESS
}

/// Writes a file that must not exist yet (a chart beside a bundle never replaces the bundle's own).
fn write_new(path: &Path, text: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => format!(
                "{} exists: give --chart a new file (charts are never written over, so a bundle's own chart.svg stays as written)",
                path.display()
            ),
            _ => format!("{}: cannot write: {e}", path.display()),
        })
}
