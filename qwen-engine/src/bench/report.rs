//! The evidence bundle of `qwen-decode bench` (schema [`SCHEMA`]): what ran where, the matrix of
//! cells against the read-bandwidth limit and the transformers peers, and the checks a stored
//! bundle must pass before anyone cites it.
//!
//! A bundle is one folder under `bench/results/`, named `<created>-<device>-<model>`, holding
//! `bench.json` (a [`BenchReport`]) and `chart.svg` ([`BenchReport::chart_svg`]). It is written
//! once ([`BenchReport::write_bundle`] refuses an existing folder) and never rewritten.
//!
//! Derived columns are stored beside what they derive from, so that a reader can check them:
//! `limit_tok_s = bandwidth.read_gbs * 1e9 / bytes_per_step * concurrency`,
//! `limit_share = decode_tok_s / limit_tok_s`, `per_request_tok_s = decode_tok_s / concurrency`,
//! `peer_tok_s` = the faster transformers implementation of the same (input, concurrency) and
//! `peer_ratio = decode_tok_s / peer_tok_s`. [`BenchReport::validate`] recomputes each (the checks
//! are in [`super::validate`]).

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use aot_kernels::dispatch::Policy;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::model::ModelDesc;

/// The schema id every bundle carries; a reader refuses any other.
pub const SCHEMA: &str = "aot-kernels-bench/1";
/// File names inside a bundle folder.
pub const BUNDLE_JSON: &str = "bench.json";
pub const BUNDLE_CHART: &str = "chart.svg";
/// What the peers script writes as `peers.source`.
pub const PEERS_SOURCE: &str = "scripts/bench/peers.py";
/// Why vLLM has only a slot for published figures.
pub const VLLM_STATUS: &str = "not installable on the GPU machine (no network)";
/// The transformers implementations the peers script measures.
pub const PEER_IMPLEMENTATIONS: [&str; 2] = ["eager", "static-compiled"];

/// One benchmark run: device, build, dispatch, model, bandwidth, the matrix, the peers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchReport {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// A stored sample (tests, docs): a fixture, never a measurement to cite.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sample: bool,
    /// When the run started, UTC, RFC 3339 (`2026-11-30T09:40:47Z`).
    pub created: String,
    /// The command line (argv) that produced the bundle.
    pub command: Vec<String>,
    pub device: DeviceInfo,
    pub build: BuildInfo,
    /// The backend's load report (`LoadReport`: each module's image, toolchain and sha256), per policy.
    pub dispatch: Value,
    pub model: ModelInfo,
    pub bandwidth: Bandwidth,
    pub cells: Vec<Cell>,
    /// The transformers peers measured in the same session (`scripts/bench/peers.py`).
    pub peers: Option<Peers>,
    /// The largest prefill of the run (8 x 1024 tokens in the full matrix).
    pub prefill: Option<Prefill>,
    /// Per policy (`auto`, `ptx-only`): loading every kernel module, cold.
    pub cold_start: BTreeMap<String, ColdStart>,
    /// The profiler window (ncu command, kernel count, per-kernel table): free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Value>,
    /// Free text about the run (what changed, what was odd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    pub name: String,
    /// Compute capability, `MAJOR.MINOR` (`9.0`).
    pub capability: String,
    /// CUDA version of the driver, `MAJOR.MINOR` (`13.0`).
    pub driver: String,
    pub sm_count: u32,
    pub memory_bytes: u64,
    pub clocks_before: Clocks,
    pub clocks_after: Clocks,
}

/// GPU clocks as `nvidia-smi` reads them (current, not maximum).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clocks {
    pub sm_mhz: f64,
    pub mem_mhz: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildInfo {
    /// The primary toolchain the kernels were built with (nvcc version).
    pub toolchain: String,
    /// What the build did with `aot-manifest.lock`.
    pub lock_status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_commit: Option<String>,
}

impl BuildInfo {
    /// This binary's kernel build, as the embedded registry records it.
    pub fn current(git_commit: Option<String>) -> Self {
        let b = aot_kernels::registry::build_info();
        BuildInfo {
            toolchain: b.toolchain.to_string(),
            lock_status: b.lock_status.to_string(),
            git_commit,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    pub name: String,
    pub parameters: u64,
    /// bf16 bytes of every weight (a tied lm_head counted once).
    pub weight_bytes: u64,
    pub kv_bytes_per_token: u64,
    pub layers: u32,
    /// A MoE model: the weight bytes a decode step reads at least (every weight but the routed
    /// experts and the embedding table, plus `top_k` experts per layer). `None`: a dense model,
    /// which reads every weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_step_weight_bytes: Option<u64>,
}

impl ModelInfo {
    pub fn from_model(name: &str, model: &ModelDesc) -> Self {
        let parameters = model.parameter_count;
        ModelInfo {
            name: name.to_string(),
            parameters,
            weight_bytes: parameters * 2,
            kv_bytes_per_token: model.kv_bytes_per_token as u64,
            layers: model.layers.len() as u32,
            min_step_weight_bytes: None,
        }
    }
}

/// The streaming read measured in the same run by our own kernels: the read limit every cell is
/// measured against is the faster reader's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bandwidth {
    /// GB/s (1e9 bytes per second): the median of `runs`.
    pub read_gbs: f64,
    /// Bytes read per run.
    pub bytes: u64,
    /// GB/s of each timed run.
    pub runs: Vec<f64>,
    /// Every reader timed (`read_gbs` and `runs` are the fastest one's). Bundles written before
    /// the bulk reader existed have none: their limit is the loads reader's alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readers: Vec<ReaderRuns>,
}

/// One streaming-read kernel's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReaderRuns {
    /// The kernel's entry (`stream_read_u32`: loads; `stream_read_bulk_u32`: bulk copies).
    pub entry: String,
    /// GB/s: the median of `runs`.
    pub read_gbs: f64,
    pub runs: Vec<f64>,
}

impl Bandwidth {
    /// The figures of the readers in `readers` over `bytes`: the fastest median sets the limit.
    /// None without a reader.
    pub fn fastest(bytes: u64, readers: Vec<ReaderRuns>) -> Option<Self> {
        let best = readers
            .iter()
            .max_by(|a, b| a.read_gbs.total_cmp(&b.read_gbs))?
            .clone();
        Some(Bandwidth {
            read_gbs: best.read_gbs,
            bytes,
            runs: best.runs,
            readers,
        })
    }

    /// `read_gbs` with the reader behind it, e.g. `4562 GB/s (stream_read_bulk_u32; loads 4185)`.
    pub fn describe(&self) -> String {
        // The reader whose median is the limit (the nearest: a bundle may round it).
        let best = self
            .readers
            .iter()
            .min_by(|a, b| {
                (a.read_gbs - self.read_gbs)
                    .abs()
                    .total_cmp(&(b.read_gbs - self.read_gbs).abs())
            })
            .map(|r| r.entry.as_str());
        let others: Vec<String> = self
            .readers
            .iter()
            .filter(|r| Some(r.entry.as_str()) != best)
            .map(|r| format!("{} {:.0}", r.entry, r.read_gbs))
            .collect();
        match best {
            Some(b) if others.is_empty() => format!("{:.0} GB/s ({b})", self.read_gbs),
            Some(b) => format!("{:.0} GB/s ({b}; {})", self.read_gbs, others.join(", ")),
            None => format!("{:.0} GB/s", self.read_gbs),
        }
    }
}

/// One cell of the matrix: `concurrency` requests of `input` prompt tokens, `new_tokens` timed
/// decode steps, under one dispatch policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cell {
    pub input: usize,
    pub concurrency: usize,
    pub policy: Policy,
    /// How the decode passes ran: `launches` (one launch per op) or `persistent` (issue 32's
    /// step); records before the persistent step have none and ran the launches.
    #[serde(default = "launches")]
    pub step: String,
    pub new_tokens: usize,
    /// Tokens per second of all requests together.
    pub decode_tok_s: f64,
    pub per_request_tok_s: f64,
    pub tpot_ms_median: f64,
    pub tpot_ms_p90: f64,
    /// Prefill of the cell's requests (not part of the decode figures).
    pub prefill_ms: f64,
    /// Bytes a timed step moves: every weight once, each request's KV cache read and its new
    /// position written (averaged over the timed steps).
    pub bytes_per_step: f64,
    /// What the measured read bandwidth allows: `read_gbs * 1e9 / bytes_per_step * concurrency`.
    pub limit_tok_s: f64,
    pub limit_share: f64,
    /// The faster transformers implementation in this (input, concurrency); `null` without peers.
    pub peer_tok_s: Option<f64>,
    pub peer_ratio: Option<f64>,
    /// Which implementation `peer_tok_s` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_implementation: Option<String>,
    /// sha256 (hex) of every request's generated ids ([`ids_digest`]).
    pub digest: String,
    /// The greedy ids of the first request equal a single-request run of the same prompt.
    pub first_matches_single: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_tflops: Option<f64>,
    /// Decode passes replayed from CUDA graphs, and launched eagerly, in the timed window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_replays: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eager_passes: Option<u64>,
}

fn launches() -> String {
    "launches".into()
}

/// What a timed cell measured; [`Cell::from_timing`] derives the rest.
#[derive(Debug, Clone)]
pub struct CellTiming<'a> {
    pub input: usize,
    pub concurrency: usize,
    pub policy: Policy,
    /// The decode step kind ([`Cell::step`]).
    pub step: &'a str,
    /// Each timed step (CUDA events), milliseconds.
    pub step_ms: &'a [f64],
    /// The whole timed window, milliseconds (one event pair around every step).
    pub window_ms: f64,
    pub prefill_ms: f64,
    pub bytes_per_step: f64,
    /// The run's streaming read, GB/s.
    pub read_gbs: f64,
    /// Every request's generated ids.
    pub generated: &'a [Vec<u32>],
    pub first_matches_single: bool,
}

impl Cell {
    /// The cell's columns from its timing, with the definitions [`BenchReport::validate`] checks.
    pub fn from_timing(t: &CellTiming) -> Cell {
        let new_tokens = t.step_ms.len();
        let decode_tok_s = (new_tokens * t.concurrency) as f64 / (t.window_ms * 1e-3);
        let limit_tok_s = t.read_gbs * 1e9 / t.bytes_per_step * t.concurrency as f64;
        let (median, p90) = median_and_p90(t.step_ms).unwrap_or((f64::NAN, f64::NAN));
        Cell {
            input: t.input,
            concurrency: t.concurrency,
            policy: t.policy,
            step: t.step.to_string(),
            new_tokens,
            decode_tok_s,
            per_request_tok_s: decode_tok_s / t.concurrency as f64,
            tpot_ms_median: median,
            tpot_ms_p90: p90,
            prefill_ms: t.prefill_ms,
            bytes_per_step: t.bytes_per_step,
            limit_tok_s,
            limit_share: decode_tok_s / limit_tok_s,
            peer_tok_s: None,
            peer_ratio: None,
            peer_implementation: None,
            digest: ids_digest(t.generated),
            first_matches_single: t.first_matches_single,
            prefill_tflops: None,
            graph_replays: None,
            eager_passes: None,
        }
    }

    /// `i16 c1 auto`, or `i16 c1 auto persistent` off the launch path.
    pub fn label(&self) -> String {
        let step = if self.step == "launches" {
            String::new()
        } else {
            format!(" {}", self.step)
        };
        format!(
            "i{} c{} {}{step}",
            self.input, self.concurrency, self.policy
        )
    }

    /// Whether `other` is the same matrix cell under another policy (same step kind: the kinds
    /// sum in different orders, so only cells of one kind share digests).
    fn same_cell(&self, other: &Cell) -> bool {
        (self.input, self.concurrency, &self.step) == (other.input, other.concurrency, &other.step)
    }
}

/// The element at index `round((n - 1) * q)` of the sorted values, for q = 0.5 and 0.9 (the
/// peers script uses the same definition); `None` for no values.
pub fn median_and_p90(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Some((at(0.5), at(0.9)))
}

/// sha256 (hex) of generated ids: per request its length as a little-endian u64, then each id as
/// a little-endian u32.
pub fn ids_digest(ids: &[Vec<u32>]) -> String {
    let mut h = Sha256::new();
    for request in ids {
        h.update((request.len() as u64).to_le_bytes());
        for t in request {
            h.update(t.to_le_bytes());
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The transformers peers: the JSON object `scripts/bench/peers.py` prints. Fields this crate does
/// not name (timings, compile settings, per-cell digests) are kept as they came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peers {
    pub source: String,
    pub torch: String,
    pub transformers: String,
    pub device: String,
    pub cells: Vec<PeerCell>,
    pub torch_matmul_tflops: f64,
    pub vllm: Vllm,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerCell {
    pub input: usize,
    pub concurrency: usize,
    /// `eager` or `static-compiled`.
    pub implementation: String,
    pub decode_tok_s: f64,
    pub tpot_ms_median: f64,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vllm {
    /// [`VLLM_STATUS`] while it cannot run beside us.
    pub status: String,
    /// Figures vLLM's authors or others published, each with its source.
    pub published: Vec<PublishedFigure>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedFigure {
    /// Where the figure is published (https://...).
    pub source_url: String,
    pub model: String,
    pub device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_tok_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prefill {
    /// Prompt tokens of the prefill (all requests).
    pub tokens: u64,
    pub ms: f64,
    /// Effective TFLOP/s (projections and attention of those tokens over `ms`).
    pub tflops: f64,
    /// torch's bf16 matmul on the same GPU (from the peers), for scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_matmul_tflops: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColdStart {
    /// Loading every kernel module (hash check, `cuModuleLoadData`, JIT if any).
    pub load_ms: f64,
    /// Whether the driver JIT-compiled PTX.
    pub jit: bool,
}

/// One thing wrong with a bundle: where, which field, what.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// `cells[2] (i16 c8 auto)`, `bandwidth`, `peers.cells[0] (i16 c1 eager)`.
    pub place: String,
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: `{}` {}", self.place, self.field, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{what}: {message}")]
    Parse { what: String, message: String },
    #[error("{what}: schema `{found}`: this qwen-decode reads `{SCHEMA}` bundles; read it with the qwen-decode that wrote it")]
    Schema { what: String, found: String },
    #[error("invalid bundle ({} problem{}):\n{}", .0.len(), if .0.len() == 1 { "" } else { "s" }, list_problems(.0))]
    Invalid(Vec<Problem>),
    #[error("{path} already exists: a bundle is written once and never rewritten; start a new run (its folder is named after `created`)")]
    Exists { path: String },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("chart: {0}")]
    Chart(String),
}

fn list_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The current time, UTC, RFC 3339 to the second (`created`).
pub fn now_utc() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// Lower case, runs of anything but letters and digits as one `-`: `NVIDIA H200` -> `nvidia-h200`.
pub fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

impl BenchReport {
    /// Reads a bundle's JSON (`what` names it in errors). Checks the schema id first, then every
    /// field's type (errors name the field: `cells[2].tpot_ms_p90: invalid type: null, expected
    /// f64`). Values are checked by [`BenchReport::validate`].
    pub fn from_json(text: &str, what: &str) -> Result<BenchReport, ReportError> {
        let value: Value = serde_json::from_str(text).map_err(|e| ReportError::Parse {
            what: what.to_string(),
            message: format!("not valid JSON: {e}"),
        })?;
        match value.get("schema") {
            Some(Value::String(s)) if s == SCHEMA => {}
            Some(Value::String(s)) => {
                return Err(ReportError::Schema {
                    what: what.to_string(),
                    found: s.clone(),
                })
            }
            _ => {
                return Err(ReportError::Parse {
                    what: what.to_string(),
                    message: format!(
                    "no `schema` string: not a bench bundle (those carry \"schema\": \"{SCHEMA}\")"
                ),
                })
            }
        }
        serde_path_to_error::deserialize(value).map_err(|e| ReportError::Parse {
            what: what.to_string(),
            message: format!("{}: {}", e.path(), e.inner()),
        })
    }

    pub fn read(path: &Path) -> Result<BenchReport, ReportError> {
        let text = fs::read_to_string(path).map_err(|source| ReportError::Read {
            path: path.display().to_string(),
            source,
        })?;
        BenchReport::from_json(&text, &path.display().to_string())
    }

    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialising cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// The faster transformers implementation at (input, concurrency): its tok/s and name.
    pub fn faster_peer(&self, input: usize, concurrency: usize) -> Option<(f64, &str)> {
        self.peers.as_ref()?.faster(input, concurrency)
    }

    /// Puts the faster peer of each cell's (input, concurrency) into the cell, with the ratio
    /// ours / peer; clears the columns of cells the peers did not measure.
    pub fn fill_peer_columns(&mut self) {
        let faster: Vec<Option<(f64, String)>> = self
            .cells
            .iter()
            .map(|c| {
                self.faster_peer(c.input, c.concurrency)
                    .map(|(t, n)| (t, n.to_string()))
            })
            .collect();
        for (cell, peer) in self.cells.iter_mut().zip(faster) {
            cell.peer_ratio = peer.as_ref().map(|(t, _)| cell.decode_tok_s / t);
            cell.peer_tok_s = peer.as_ref().map(|(t, _)| *t);
            cell.peer_implementation = peer.map(|(_, n)| n);
        }
    }

    /// Puts the peers beside the matrix and fills the peer columns.
    pub fn attach_peers(&mut self, peers: Peers) {
        self.peers = Some(peers);
        self.fill_peer_columns();
    }

    /// Cells in reading order: policy (auto first), input, concurrency.
    pub fn sorted_cells(&self) -> Vec<&Cell> {
        let mut cells: Vec<&Cell> = self.cells.iter().collect();
        cells.sort_by_key(|c| {
            (
                c.step != "launches",
                policy_rank(c.policy),
                c.input,
                c.concurrency,
            )
        });
        cells
    }

    /// The correctness claims the cells carry that do not hold: a first request that differs
    /// from its single-request run, and digests that differ between policies.
    pub fn correctness_failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.sorted_cells() {
            if !c.first_matches_single {
                out.push(format!(
                    "{}: the first request's ids differ from its single-request run",
                    c.label()
                ));
            }
        }
        for (a, b) in self.policy_pairs() {
            if a.digest != b.digest {
                let step = if a.step == "launches" {
                    String::new()
                } else {
                    format!(" {}", a.step)
                };
                out.push(format!(
                    "i{} c{}{step}: the {} and {} digests differ",
                    a.input, a.concurrency, a.policy, b.policy
                ));
            }
        }
        out
    }

    /// Each cell paired with the `auto` cell of the same (input, concurrency), for other policies.
    fn policy_pairs(&self) -> Vec<(&Cell, &Cell)> {
        let autos: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|c| c.policy == Policy::Auto)
            .collect();
        self.cells
            .iter()
            .filter(|c| c.policy != Policy::Auto)
            .filter_map(|c| autos.iter().find(|a| a.same_cell(c)).map(|a| (*a, c)))
            .collect()
    }

    /// The matrix as a Markdown table: per cell its tok/s, the limit and our share of it, the
    /// faster peer and our ratio to it, TPOT median and p90, and whether the ids check out.
    pub fn markdown_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}{} on {} (CUDA {} driver), streaming read {}; {} new tokens per cell{}",
            if self.sample {
                "SAMPLE (a test fixture, not a run to cite): "
            } else {
                ""
            },
            self.model.name,
            self.device.name,
            self.device.driver,
            self.bandwidth.describe(),
            self.cells.first().map_or(0, |c| c.new_tokens),
            match &self.peers {
                Some(p) => format!("; peers: {}", p.summary()),
                None => String::new(),
            }
        );
        out.push('\n');
        out.push_str("| cell | tok/s | limit tok/s | share | peer tok/s | ours / peer | TPOT median ms | TPOT p90 ms | ids |\n");
        out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
        for c in self.sorted_cells() {
            let peer = match (c.peer_tok_s, &c.peer_implementation) {
                (Some(t), Some(name)) => format!("{t:.1} ({name})"),
                (Some(t), None) => format!("{t:.1}"),
                _ => "-".into(),
            };
            let ratio = c.peer_ratio.map_or("-".into(), |r| format!("{r:.2}x"));
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.1} | {:.1}% | {peer} | {ratio} | {:.3} | {:.3} | {} |",
                c.label(),
                c.decode_tok_s,
                c.limit_tok_s,
                100.0 * c.limit_share,
                c.tpot_ms_median,
                c.tpot_ms_p90,
                self.ids_note(c)
            );
        }
        if let Some(p) = &self.peers {
            out.push('\n');
            out.push_str(&p.vllm_lines());
        }
        out
    }

    /// `ok`, or what differs: the single-request run, or the `auto` digest.
    fn ids_note(&self, cell: &Cell) -> String {
        let mut notes = Vec::new();
        if !cell.first_matches_single {
            notes.push("first != single".to_string());
        }
        if cell.policy != Policy::Auto {
            match self
                .cells
                .iter()
                .find(|a| a.policy == Policy::Auto && a.same_cell(cell))
            {
                Some(a) if a.digest != cell.digest => notes.push("digest != auto".into()),
                Some(_) => notes.push("= auto".into()),
                None => {}
            }
        }
        if notes.iter().all(|n| n == "= auto") {
            notes.insert(0, "ok".into());
        }
        notes.join(", ")
    }

    /// The bundle folder's name: `<created as 20261130T094047Z>-<device slug>-<model slug>`.
    pub fn bundle_name(&self) -> Result<String, ReportError> {
        let created: jiff::Timestamp = self.created.parse().map_err(|e| {
            ReportError::Invalid(vec![Problem {
                place: "bundle".into(),
                field: "created".into(),
                message: format!("`{}` is not an RFC 3339 time: {e}", self.created),
            }])
        })?;
        Ok(format!(
            "{}-{}-{}",
            created.strftime("%Y%m%dT%H%M%SZ"),
            slug(&self.device.name),
            slug(&self.model.name)
        ))
    }

    /// Writes `bench.json` and `chart.svg` into a new folder `results_dir/<bundle_name>/` and
    /// returns it. Refuses an invalid bundle, and a folder that exists (nothing is overwritten).
    pub fn write_bundle(&self, results_dir: &Path) -> Result<PathBuf, ReportError> {
        self.validate()?;
        let chart = self.chart_svg()?;
        let json = self.to_json();
        let dir = results_dir.join(self.bundle_name()?);
        let write_err = |path: &Path| {
            let path = path.display().to_string();
            move |source| ReportError::Write { path, source }
        };
        fs::create_dir_all(results_dir).map_err(write_err(results_dir))?;
        match fs::create_dir(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(ReportError::Exists {
                    path: dir.display().to_string(),
                })
            }
            other => other.map_err(write_err(&dir))?,
        }
        for (name, text) in [(BUNDLE_JSON, json), (BUNDLE_CHART, chart)] {
            let path = dir.join(name);
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(write_err(&path))?;
        }
        Ok(dir)
    }
}

fn policy_rank(p: Policy) -> usize {
    match p {
        Policy::Auto => 0,
        Policy::SassOnly => 1,
        Policy::PtxOnly => 2,
    }
}

impl Peers {
    /// Reads the JSON `scripts/bench/peers.py` prints (`what` names it in errors).
    pub fn from_json(text: &str, what: &str) -> Result<Peers, ReportError> {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut de).map_err(|e| ReportError::Parse {
            what: what.to_string(),
            message: format!(
                "not a peers object (scripts/bench/peers.py's output): {}: {}",
                e.path(),
                e.inner()
            ),
        })
    }

    pub fn read(path: &Path) -> Result<Peers, ReportError> {
        let text = fs::read_to_string(path).map_err(|source| ReportError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Peers::from_json(&text, &path.display().to_string())
    }

    /// The faster implementation at (input, concurrency): its tok/s and name.
    pub fn faster(&self, input: usize, concurrency: usize) -> Option<(f64, &str)> {
        self.cells
            .iter()
            .filter(|c| {
                (c.input, c.concurrency) == (input, concurrency) && c.decode_tok_s.is_finite()
            })
            .max_by(|a, b| a.decode_tok_s.total_cmp(&b.decode_tok_s))
            .map(|c| (c.decode_tok_s, c.implementation.as_str()))
    }

    /// Whether the peers run finished: the script writes `"complete": false` into `--json-out`
    /// until its last cell (a peers object without the key counts as complete).
    pub fn is_complete(&self) -> bool {
        self.extra.get("complete") != Some(&Value::Bool(false))
    }

    /// `transformers 5.17.0 (torch 2.11.0)`, and a warning for a run cut short.
    pub fn summary(&self) -> String {
        format!(
            "transformers {} (torch {}){}",
            self.transformers,
            self.torch,
            if self.is_complete() {
                ""
            } else {
                ", INCOMPLETE run (cut short: cells missing)"
            }
        )
    }

    /// The peers alone as a Markdown table (for checking a peers run before the bench).
    pub fn markdown_table(&self) -> String {
        let mut out = format!(
            "{} on {}; torch matmul {:.1} TFLOP/s\n\n",
            self.summary(),
            self.device,
            self.torch_matmul_tflops
        );
        out.push_str("| cell | implementation | tok/s | TPOT median ms |\n|---|---|---:|---:|\n");
        let mut cells: Vec<&PeerCell> = self.cells.iter().collect();
        cells.sort_by(|a, b| {
            (a.input, a.concurrency, &a.implementation).cmp(&(
                b.input,
                b.concurrency,
                &b.implementation,
            ))
        });
        for c in cells {
            let _ = writeln!(
                out,
                "| i{} c{} | {} | {:.1} | {:.3} |",
                c.input, c.concurrency, c.implementation, c.decode_tok_s, c.tpot_ms_median
            );
        }
        out.push('\n');
        out.push_str(&self.vllm_lines());
        out
    }

    /// vLLM's line: why it was not measured, and each published figure with its source (shown
    /// beside the matrix, never in the peer columns).
    pub fn vllm_lines(&self) -> String {
        let mut out = format!("vLLM: {}", self.vllm.status);
        if self.vllm.published.is_empty() {
            out.push_str("; no published figures recorded\n");
            return out;
        }
        out.push_str("; published figures (not measured here):\n");
        for f in &self.vllm.published {
            let cell = match (f.input, f.concurrency) {
                (Some(i), Some(c)) => format!(" i{i} c{c}"),
                _ => String::new(),
            };
            let tok_s = f
                .decode_tok_s
                .map_or(String::new(), |t| format!(": {t:.1} tok/s"));
            let note = f
                .note
                .as_deref()
                .map_or(String::new(), |n| format!(" ({n})"));
            let _ = writeln!(
                out,
                "- {} on {}{cell}{tok_s}{note}: {}",
                f.model, f.device, f.source_url
            );
        }
        out
    }
}
