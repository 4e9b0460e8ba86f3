//! What makes a bundle valid: every field present with a sane value, each derived column equal to
//! its definition, the peer columns equal to what the peers measured. Problems are collected, not
//! stopped at, so that one reading names everything wrong with a bundle.

use std::collections::BTreeMap;

use aot_kernels::dispatch::Policy;

use super::report::{BenchReport, Cell, Peers, Problem, ReportError, PEER_IMPLEMENTATIONS, SCHEMA};

/// Relative tolerance of a stored derived column against its recomputation: a bundle written by
/// the bench holds full precision; this leaves room for numbers rounded to four digits by hand.
const DERIVED_RTOL: f64 = 1e-3;
/// A streaming read outside this range is a unit mistake (GB/s is 1e9 bytes/s; a Jetson Orin Nano
/// reads about 60 GB/s, an H200 about 4,200).
const READ_GBS_RANGE: (f64, f64) = (10.0, 50_000.0);

fn verdict(problems: Vec<Problem>) -> Result<(), ReportError> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ReportError::Invalid(problems))
    }
}

fn close(stored: f64, computed: f64) -> bool {
    (stored - computed).abs() <= DERIVED_RTOL * computed.abs().max(stored.abs())
}

fn is_version(text: &str) -> bool {
    let mut parts = text.split('.');
    let ok =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

fn is_hex(text: &str, len: std::ops::RangeInclusive<usize>) -> bool {
    len.contains(&text.len()) && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Collects problems for one place.
struct Checker<'a> {
    place: String,
    problems: &'a mut Vec<Problem>,
}

impl Checker<'_> {
    fn fail(&mut self, field: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            place: self.place.clone(),
            field: field.to_string(),
            message: message.into(),
        });
    }

    /// A finite number above zero.
    fn positive(&mut self, field: &str, v: f64) -> bool {
        if v.is_finite() && v > 0.0 {
            return true;
        }
        self.fail(field, format!("is {v}: must be a finite number above 0"));
        false
    }

    fn at_least_one(&mut self, field: &str, v: u64) {
        if v == 0 {
            self.fail(field, "is 0: must be at least 1");
        }
    }

    fn non_empty(&mut self, field: &str, v: &str) {
        if v.trim().is_empty() {
            self.fail(field, "is empty");
        }
    }

    /// A streaming read's GB/s (`{prefix}read_gbs`, the median of `{prefix}runs`): in range, and
    /// within its runs, each a positive figure.
    fn reading(&mut self, prefix: &str, read_gbs: f64, runs: &[f64]) {
        let field = format!("{prefix}read_gbs");
        if self.positive(&field, read_gbs)
            && !(READ_GBS_RANGE.0..=READ_GBS_RANGE.1).contains(&read_gbs)
        {
            self.fail(
                &field,
                format!(
                    "is {read_gbs}: outside {}..{} GB/s (GB/s is 1e9 bytes per second, not TB/s or GiB/s)",
                    READ_GBS_RANGE.0, READ_GBS_RANGE.1
                ),
            );
        }
        if runs.is_empty() {
            self.fail(
                &format!("{prefix}runs"),
                "is empty: store each timed run's GB/s",
            );
        }
        for (i, &r) in runs.iter().enumerate() {
            self.positive(&format!("{prefix}runs[{i}]"), r);
        }
        let (lo, hi) = runs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| {
                (lo.min(r), hi.max(r))
            });
        if !runs.is_empty()
            && read_gbs.is_finite()
            && !(lo * (1.0 - DERIVED_RTOL)..=hi * (1.0 + DERIVED_RTOL)).contains(&read_gbs)
        {
            self.fail(
                &field,
                format!("is {read_gbs}, outside its runs ({lo} to {hi})"),
            );
        }
    }

    /// `stored` against its definition.
    fn derived(&mut self, field: &str, stored: f64, computed: f64, definition: &str) {
        if stored.is_finite() && computed.is_finite() && !close(stored, computed) {
            self.fail(
                field,
                format!("is {stored}, but {definition} = {computed} (tolerance {DERIVED_RTOL} relative)"),
            );
        }
    }
}

impl BenchReport {
    /// Every problem of the bundle, or `Ok`: required fields with sane values (finite, positive,
    /// well-formed), each derived column equal to its definition, the peer columns equal to what
    /// the peers say, no cell twice, a cold start for every policy the cells ran.
    pub fn validate(&self) -> Result<(), ReportError> {
        verdict(self.problems())
    }

    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut top = Checker {
            place: "bundle".into(),
            problems: &mut problems,
        };
        if self.schema != SCHEMA {
            top.fail(
                "schema",
                format!("is `{}`, expected `{SCHEMA}`", self.schema),
            );
        }
        match self.created.parse::<jiff::Timestamp>() {
            Ok(_) if self.created.ends_with('Z') => {}
            Ok(_) => top.fail(
                "created",
                format!(
                    "`{}` is not in UTC: write it with a `Z` offset",
                    self.created
                ),
            ),
            Err(e) => top.fail(
                "created",
                format!("`{}` is not an RFC 3339 time: {e}", self.created),
            ),
        }
        if self.command.is_empty() {
            top.fail("command", "is empty: store the argv of the run");
        }
        if !self.dispatch.is_object() {
            top.fail("dispatch", "must be an object (the backend's load report)");
        }
        if self.cells.is_empty() {
            top.fail(
                "cells",
                "is empty: a bundle holds at least one measured cell",
            );
        }
        self.check_device(&mut problems);
        self.check_build_model_bandwidth(&mut problems);
        self.check_peers(&mut problems);
        self.check_cells(&mut problems);
        self.check_prefill_cold_start(&mut problems);
        problems
    }

    fn check_device(&self, problems: &mut Vec<Problem>) {
        let d = &self.device;
        let mut c = Checker {
            place: "device".into(),
            problems,
        };
        c.non_empty("name", &d.name);
        if !is_version(&d.capability) {
            c.fail(
                "capability",
                format!("`{}` is not MAJOR.MINOR (e.g. 9.0)", d.capability),
            );
        }
        if !is_version(&d.driver) {
            c.fail(
                "driver",
                format!("`{}` is not MAJOR.MINOR (e.g. 13.0)", d.driver),
            );
        }
        c.at_least_one("sm_count", u64::from(d.sm_count));
        c.at_least_one("memory_bytes", d.memory_bytes);
        for (field, clocks) in [
            ("clocks_before", &d.clocks_before),
            ("clocks_after", &d.clocks_after),
        ] {
            c.positive(&format!("{field}.sm_mhz"), clocks.sm_mhz);
            c.positive(&format!("{field}.mem_mhz"), clocks.mem_mhz);
        }
    }

    fn check_build_model_bandwidth(&self, problems: &mut Vec<Problem>) {
        let mut c = Checker {
            place: "build".into(),
            problems,
        };
        c.non_empty("toolchain", &self.build.toolchain);
        c.non_empty("lock_status", &self.build.lock_status);
        if let Some(commit) = &self.build.git_commit {
            if !is_hex(commit, 7..=40) {
                c.fail(
                    "git_commit",
                    format!("`{commit}` is not a lower-case hex commit id (7 to 40 digits)"),
                );
            }
        }
        c.place = "model".into();
        let m = &self.model;
        c.non_empty("name", &m.name);
        c.at_least_one("parameters", m.parameters);
        c.at_least_one("weight_bytes", m.weight_bytes);
        c.at_least_one("kv_bytes_per_token", m.kv_bytes_per_token);
        c.at_least_one("layers", u64::from(m.layers));
        if m.parameters > 0 && m.weight_bytes < m.parameters {
            c.fail(
                "weight_bytes",
                format!(
                    "is {} for {} parameters: fewer than one byte each",
                    m.weight_bytes, m.parameters
                ),
            );
        }
        c.place = "bandwidth".into();
        let b = &self.bandwidth;
        c.reading("", b.read_gbs, &b.runs);
        c.at_least_one("bytes", b.bytes);
        for (i, r) in b.readers.iter().enumerate() {
            if r.entry.is_empty() {
                c.fail(&format!("readers[{i}].entry"), "is empty: name the kernel");
            }
            c.reading(&format!("readers[{i}]."), r.read_gbs, &r.runs);
            if r.read_gbs > b.read_gbs * (1.0 + DERIVED_RTOL) {
                c.fail(
                    "read_gbs",
                    format!(
                        "is {}, slower than reader {} ({}): the limit is the fastest reader's",
                        b.read_gbs, r.entry, r.read_gbs
                    ),
                );
            }
        }
        // The limit is one reader's median, stored with that reader's runs.
        if !b.readers.is_empty()
            && !b.readers.iter().any(|r| {
                (r.read_gbs - b.read_gbs).abs() <= b.read_gbs.abs() * DERIVED_RTOL
                    && r.runs == b.runs
            })
        {
            c.fail(
                "read_gbs",
                format!(
                    "is {}, not a reader's median with that reader's runs",
                    b.read_gbs
                ),
            );
        }
    }

    fn check_cells(&self, problems: &mut Vec<Problem>) {
        let mut seen: BTreeMap<(usize, usize, &str, &str), usize> = BTreeMap::new();
        let read_gbs = self.bandwidth.read_gbs;
        for (i, cell) in self.cells.iter().enumerate() {
            let mut c = Checker {
                place: format!("cells[{i}] ({})", cell.label()),
                problems,
            };
            if let Some(first) = seen.insert(
                (
                    cell.input,
                    cell.concurrency,
                    cell.policy.as_str(),
                    cell.step.as_str(),
                ),
                i,
            ) {
                c.fail(
                    "input",
                    format!(
                        "this cell is also cells[{first}]: each (input, concurrency, policy, step) once"
                    ),
                );
            }
            if !["launches", "persistent"].contains(&cell.step.as_str()) {
                c.fail(
                    "step",
                    format!(
                        "`{}` is not a decode step (launches, persistent)",
                        cell.step
                    ),
                );
            }
            c.at_least_one("input", cell.input as u64);
            c.at_least_one("concurrency", cell.concurrency as u64);
            c.at_least_one("new_tokens", cell.new_tokens as u64);
            let decode = c.positive("decode_tok_s", cell.decode_tok_s);
            c.positive("per_request_tok_s", cell.per_request_tok_s);
            let median = c.positive("tpot_ms_median", cell.tpot_ms_median);
            let p90 = c.positive("tpot_ms_p90", cell.tpot_ms_p90);
            c.positive("prefill_ms", cell.prefill_ms);
            let bytes = c.positive("bytes_per_step", cell.bytes_per_step);
            let limit = c.positive("limit_tok_s", cell.limit_tok_s);
            c.positive("limit_share", cell.limit_share);
            if median && p90 && cell.tpot_ms_p90 < cell.tpot_ms_median * (1.0 - DERIVED_RTOL) {
                c.fail(
                    "tpot_ms_p90",
                    format!(
                        "is {}, below the median {}",
                        cell.tpot_ms_p90, cell.tpot_ms_median
                    ),
                );
            }
            let n = cell.concurrency.max(1) as f64;
            if decode {
                c.derived(
                    "per_request_tok_s",
                    cell.per_request_tok_s,
                    cell.decode_tok_s / n,
                    "decode_tok_s / concurrency",
                );
            }
            if decode && median {
                // The mean step (from the throughput) and the median step describe the same steps.
                let mean_ms = 1e3 * n / cell.decode_tok_s;
                if !(0.5..=2.0).contains(&(mean_ms / cell.tpot_ms_median)) {
                    c.fail(
                        "tpot_ms_median",
                        format!(
                            "is {} ms, but decode_tok_s gives a mean step of {mean_ms} ms: more than 2x apart",
                            cell.tpot_ms_median
                        ),
                    );
                }
            }
            if bytes && limit && read_gbs.is_finite() && read_gbs > 0.0 {
                let computed = read_gbs * 1e9 / cell.bytes_per_step * n;
                c.derived(
                    "limit_tok_s",
                    cell.limit_tok_s,
                    computed,
                    "bandwidth.read_gbs * 1e9 / bytes_per_step * concurrency",
                );
            }
            if decode && limit {
                c.derived(
                    "limit_share",
                    cell.limit_share,
                    cell.decode_tok_s / cell.limit_tok_s,
                    "decode_tok_s / limit_tok_s",
                );
            }
            if bytes {
                // Each step reads at least the live contexts; and the weights, of which an untied
                // embedding table is read one row per token, hence only half counted here (a MoE
                // model: the weights every step reads, the embedding table left out).
                let kv_floor =
                    (cell.concurrency * cell.input) as f64 * self.model.kv_bytes_per_token as f64;
                let weights_floor = self
                    .model
                    .min_step_weight_bytes
                    .map_or(self.model.weight_bytes as f64 / 2.0, |b| b as f64);
                let floor = kv_floor + weights_floor;
                if cell.bytes_per_step < floor {
                    c.fail(
                        "bytes_per_step",
                        format!(
                            "is {}, less than the weights a step reads at least plus the prompts' KV cache ({floor})",
                            cell.bytes_per_step
                        ),
                    );
                }
            }
            if !is_hex(&cell.digest, 64..=64) {
                c.fail(
                    "digest",
                    format!("`{}` is not a sha256 in lower-case hex", cell.digest),
                );
            }
            self.check_peer_columns(cell, &mut c);
        }
    }

    fn check_peer_columns(&self, cell: &Cell, c: &mut Checker) {
        let expected = self.faster_peer(cell.input, cell.concurrency);
        match (cell.peer_tok_s, expected) {
            (None, None) => {}
            (Some(_), None) => c.fail(
                "peer_tok_s",
                "is set, but the peers have no cell of this input and concurrency",
            ),
            (None, Some((tok_s, implementation))) => c.fail(
                "peer_tok_s",
                format!("is null, but the peers measured {implementation} at {tok_s} tok/s here: fill the peer columns"),
            ),
            (Some(stored), Some((tok_s, implementation))) => {
                c.derived("peer_tok_s", stored, tok_s, "the faster peer");
                if let Some(name) = &cell.peer_implementation {
                    if name != implementation {
                        c.fail("peer_implementation", format!("is `{name}`, but the faster peer here is `{implementation}`"));
                    }
                }
            }
        }
        match (cell.peer_ratio, cell.peer_tok_s) {
            (None, None) => {}
            (Some(_), None) => c.fail("peer_ratio", "is set without peer_tok_s"),
            (None, Some(_)) => c.fail("peer_ratio", "is null while peer_tok_s is set"),
            (Some(ratio), Some(peer)) => {
                if c.positive("peer_ratio", ratio) && c.positive("peer_tok_s", peer) {
                    c.derived(
                        "peer_ratio",
                        ratio,
                        cell.decode_tok_s / peer,
                        "decode_tok_s / peer_tok_s",
                    );
                }
            }
        }
    }

    fn check_peers(&self, problems: &mut Vec<Problem>) {
        if let Some(peers) = &self.peers {
            problems.extend(peers.problems("peers"));
        }
    }

    fn check_prefill_cold_start(&self, problems: &mut Vec<Problem>) {
        let mut c = Checker {
            place: "prefill".into(),
            problems,
        };
        if let Some(p) = &self.prefill {
            c.at_least_one("tokens", p.tokens);
            c.positive("ms", p.ms);
            c.positive("tflops", p.tflops);
            if let Some(t) = p.torch_matmul_tflops {
                c.positive("torch_matmul_tflops", t);
            }
        }
        c.place = "cold_start".into();
        // Keyed by policy, or `<policy> persistent` for the persistent step's runner.
        for (key, cold) in &self.cold_start {
            let policy = key.strip_suffix(" persistent").unwrap_or(key);
            if policy.parse::<Policy>().is_err() {
                c.fail(
                    key,
                    "is not a dispatch policy (auto, sass-only, ptx-only), alone or followed by ` persistent`",
                );
            }
            c.positive(&format!("{key}.load_ms"), cold.load_ms);
        }
        let policies: std::collections::BTreeSet<String> = self
            .cells
            .iter()
            .map(|c| {
                if c.step == "launches" {
                    c.policy.as_str().to_string()
                } else {
                    format!("{} {}", c.policy.as_str(), c.step)
                }
            })
            .collect();
        for policy in &policies {
            if !self.cold_start.contains_key(policy) {
                c.fail(
                    policy,
                    "is missing: every policy the cells ran needs its cold start",
                );
            }
        }
    }
}

impl Peers {
    pub fn validate(&self) -> Result<(), ReportError> {
        verdict(self.problems("peers"))
    }

    /// Problems of the peers, placed under `prefix` (`peers` inside a bundle).
    pub fn problems(&self, prefix: &str) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut c = Checker {
            place: prefix.to_string(),
            problems: &mut problems,
        };
        c.non_empty("source", &self.source);
        c.non_empty("torch", &self.torch);
        c.non_empty("transformers", &self.transformers);
        c.non_empty("device", &self.device);
        c.positive("torch_matmul_tflops", self.torch_matmul_tflops);
        c.non_empty("vllm.status", &self.vllm.status);
        for (i, f) in self.vllm.published.iter().enumerate() {
            let field = format!("vllm.published[{i}]");
            if !(f.source_url.starts_with("https://") || f.source_url.starts_with("http://")) {
                c.fail(
                    &format!("{field}.source_url"),
                    format!(
                        "`{}` is not an http(s) address: a published figure needs its source",
                        f.source_url
                    ),
                );
            }
            if let Some(t) = f.decode_tok_s {
                c.positive(&format!("{field}.decode_tok_s"), t);
            }
        }
        let mut seen: BTreeMap<(usize, usize, &str), usize> = BTreeMap::new();
        for (i, cell) in self.cells.iter().enumerate() {
            c.place = format!(
                "{prefix}.cells[{i}] (i{} c{} {})",
                cell.input, cell.concurrency, cell.implementation
            );
            if !PEER_IMPLEMENTATIONS.contains(&cell.implementation.as_str()) {
                c.fail(
                    "implementation",
                    format!(
                        "is `{}`: expected one of {}",
                        cell.implementation,
                        PEER_IMPLEMENTATIONS.join(", ")
                    ),
                );
            }
            if let Some(first) = seen.insert(
                (cell.input, cell.concurrency, cell.implementation.as_str()),
                i,
            ) {
                c.fail(
                    "implementation",
                    format!("this cell is also cells[{first}]"),
                );
            }
            c.at_least_one("input", cell.input as u64);
            c.at_least_one("concurrency", cell.concurrency as u64);
            c.positive("decode_tok_s", cell.decode_tok_s);
            c.positive("tpot_ms_median", cell.tpot_ms_median);
        }
        problems
    }
}
