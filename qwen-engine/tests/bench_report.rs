//! The bench's evidence bundle without a GPU: the stored sample (a real H200 bundle kept as a fixture, marked
//! `"sample": true`) validates; its table, chart and peer columns say what its numbers say; a
//! bundle is written once; broken bundles are refused naming the cell and field; and
//! `qwen-decode bench-report` exits accordingly.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use aot_kernels::dispatch::Policy;
use qwen_engine::bench::chart::{policy_color, LIMIT, PEER_EAGER, PEER_STATIC};
use qwen_engine::bench::report::{
    ids_digest, median_and_p90, now_utc, slug, BenchReport, Cell, CellTiming, ModelInfo,
    ReportError, BUNDLE_CHART, BUNDLE_JSON,
};
use qwen_engine::model::{ModelConfig, Qwen3Config};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const SAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/bench/sample.json"
);

fn sample_text() -> String {
    std::fs::read_to_string(SAMPLE).expect("the stored sample bundle")
}

fn sample() -> BenchReport {
    BenchReport::read(Path::new(SAMPLE)).expect("the sample parses")
}

fn sample_value() -> Value {
    serde_json::from_str(&sample_text()).unwrap()
}

/// The error of a mutated sample, from parsing or from validation.
fn error_of(value: &Value) -> String {
    match BenchReport::from_json(&value.to_string(), "mutated.json") {
        Err(e) => e.to_string(),
        Ok(r) => match r.validate() {
            Err(e) => e.to_string(),
            Ok(()) => String::new(),
        },
    }
}

fn svg_color(c: plotters::style::RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// (x, y, width, height) of every `<rect>` filled with `color`.
fn rects(doc: &roxmltree::Document, color: &str) -> Vec<(f64, f64, f64, f64)> {
    let num = |n: &roxmltree::Node, a: &str| n.attribute(a).unwrap().parse::<f64>().unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some(color))
        .map(|n| {
            (
                num(&n, "x"),
                num(&n, "y"),
                num(&n, "width"),
                num(&n, "height"),
            )
        })
        .collect()
}

#[test]
fn the_stored_sample_is_a_valid_marked_sample_of_qwen3_4b() {
    let r = sample();
    assert!(r.sample, "the stored bundle must say it is a sample");
    assert!(r.notes.as_deref().unwrap_or("").contains("SAMPLE"));
    r.validate().unwrap();
    assert!(r.correctness_failures().is_empty());
    // Its model section is what the engine counts for Qwen3-4B.
    assert_eq!(
        r.model,
        ModelInfo::from_model(
            "qwen3-4b",
            &ModelConfig::Qwen3(Qwen3Config::qwen3_4b()).describe()
        )
    );
    assert_eq!(r.cells.len(), 12);
}

#[test]
fn a_bundle_round_trips_through_json_with_the_peers_extra_fields() {
    let r = sample();
    let again = BenchReport::from_json(&r.to_json(), "again").unwrap();
    assert_eq!(again, r);
    let peers = r.peers.as_ref().unwrap();
    assert_eq!(peers.extra["attn_implementation"], "sdpa");
    assert_eq!(peers.cells[0].extra["new_tokens"], 64);
}

#[test]
fn the_markdown_table_has_one_row_per_cell_with_its_numbers() {
    let r = sample();
    let table = r.markdown_table();
    assert!(
        table.starts_with("SAMPLE (a test fixture, not a run to cite)"),
        "{table}"
    );
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| i")).collect();
    assert_eq!(rows.len(), r.cells.len(), "{table}");
    for c in &r.cells {
        let row = rows
            .iter()
            .find(|l| l.starts_with(&format!("| {} |", c.label())))
            .unwrap_or_else(|| panic!("no row for {}", c.label()));
        let cols: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cols[2], format!("{:.1}", c.decode_tok_s), "{row}");
        assert_eq!(cols[3], format!("{:.1}", c.limit_tok_s), "{row}");
        assert_eq!(cols[4], format!("{:.1}%", 100.0 * c.limit_share), "{row}");
        assert!(
            cols[5].starts_with(&format!("{:.1}", c.peer_tok_s.unwrap())),
            "{row}"
        );
        assert_eq!(cols[6], format!("{:.2}x", c.peer_ratio.unwrap()), "{row}");
        assert_eq!(cols[7], format!("{:.3}", c.tpot_ms_median), "{row}");
        assert_eq!(cols[8], format!("{:.3}", c.tpot_ms_p90), "{row}");
        assert!(cols[9].starts_with("ok"), "{row}");
    }
    // auto rows first.
    assert!(rows[0].contains(" auto "), "{table}");
    assert!(rows.last().unwrap().contains(" ptx-only "), "{table}");
}

#[test]
fn the_chart_is_well_formed_svg_with_one_bar_and_one_limit_mark_per_cell() {
    let r = sample();
    let svg = r.chart_svg().unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    for policy in [Policy::Auto, Policy::PtxOnly] {
        // The bars in drawing order: the groups by (concurrency, input), then the legend's swatch.
        let mut cells: Vec<&Cell> = r.cells.iter().filter(|c| c.policy == policy).collect();
        cells.sort_by_key(|c| (c.concurrency, c.input));
        let mut bars = rects(&doc, &svg_color(policy_color(policy)));
        assert_eq!(
            bars.len(),
            cells.len() + 1,
            "{policy}: a bar per cell and the legend's swatch"
        );
        bars.pop();
        // On the log axis a bar's height is linear in log10(tok/s): the slowest and the fastest
        // cell fix the line, every other bar sits on it (to the pixel rounding).
        let pairs: Vec<(f64, f64)> = cells
            .iter()
            .zip(&bars)
            .map(|(c, b)| (c.decode_tok_s.log10(), b.3))
            .collect();
        let lo = pairs
            .iter()
            .copied()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap();
        let hi = pairs
            .iter()
            .copied()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap();
        let per_decade = (hi.1 - lo.1) / (hi.0 - lo.0);
        assert!(per_decade > 50.0, "{policy}: {per_decade} px per decade");
        for (c, (x, h)) in cells.iter().zip(&pairs) {
            let want = lo.1 + per_decade * (x - lo.0);
            assert!(
                (h - want).abs() <= 2.0,
                "{policy}: the bar of {} is {h} px high, its value needs {want}",
                c.label()
            );
        }
        // Each cell's share is printed above it.
        for c in &cells {
            let share = format!("{:.0}%", 100.0 * c.limit_share);
            assert!(
                doc.descendants()
                    .any(|n| n.has_tag_name("text")
                        && n.text().map(str::trim) == Some(share.as_str())),
                "no `{share}` label for {}",
                c.label()
            );
        }
    }
    let limit_marks = doc
        .descendants()
        .filter(|n| {
            n.has_tag_name("polyline") && n.attribute("stroke") == Some(svg_color(LIMIT).as_str())
        })
        .count();
    assert_eq!(
        limit_marks,
        r.cells.len() + 1,
        "a limit mark per cell plus the legend's"
    );
    let groups = 6;
    assert_eq!(rects(&doc, &svg_color(PEER_EAGER)).len(), groups + 1);
    assert_eq!(rects(&doc, &svg_color(PEER_STATIC)).len(), groups + 1);
    for label in [
        "i16 c1",
        "i1024 c8",
        "SAMPLE (a test fixture, not a run to cite)",
    ] {
        assert!(svg.contains(label), "the chart lacks `{label}`");
    }
}

#[test]
fn a_chart_without_peers_or_other_policies_draws_only_our_bars() {
    let mut r = sample();
    r.cells.retain(|c| c.policy == Policy::Auto);
    r.peers = None;
    r.fill_peer_columns();
    r.validate().unwrap();
    let svg = r.chart_svg().unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(
        rects(&doc, &svg_color(policy_color(Policy::Auto))).len(),
        r.cells.len() + 1
    );
    assert!(rects(&doc, &svg_color(policy_color(Policy::PtxOnly))).is_empty());
    assert!(rects(&doc, &svg_color(PEER_EAGER)).is_empty());
    assert!(rects(&doc, &svg_color(PEER_STATIC)).is_empty());
    assert!(!svg.contains("x peer"));
}

#[test]
fn peer_columns_join_the_faster_implementation_per_input_and_concurrency() {
    let mut r = sample();
    let stored: Vec<(Option<f64>, Option<f64>)> = r
        .cells
        .iter()
        .map(|c| (c.peer_tok_s, c.peer_ratio))
        .collect();
    for c in &mut r.cells {
        (c.peer_tok_s, c.peer_ratio, c.peer_implementation) = (None, None, None);
    }
    let err = r.validate().unwrap_err().to_string();
    assert!(
        err.contains(
            "cells[0] (i16 c1 auto): `peer_tok_s` is null, but the peers measured static-compiled"
        ),
        "{err}"
    );
    r.fill_peer_columns();
    r.validate().unwrap();
    for (c, (tok_s, ratio)) in r.cells.iter().zip(stored) {
        assert_eq!(c.peer_tok_s, tok_s, "{}", c.label());
        let (ours, theirs) = (c.peer_ratio.unwrap(), ratio.unwrap());
        assert!((ours - theirs).abs() <= 1e-12 * theirs, "{}", c.label());
    }
    // Make eager the faster one at i1024 c8: the join follows.
    let peers = r.peers.as_mut().unwrap();
    let eager = peers
        .cells
        .iter_mut()
        .find(|p| (p.input, p.concurrency, p.implementation.as_str()) == (1024, 8, "eager"))
        .unwrap();
    eager.decode_tok_s = 2000.0;
    r.fill_peer_columns();
    r.validate().unwrap();
    for c in r
        .cells
        .iter()
        .filter(|c| (c.input, c.concurrency) == (1024, 8))
    {
        assert_eq!(c.peer_tok_s, Some(2000.0));
        assert_eq!(c.peer_implementation.as_deref(), Some("eager"));
        assert_eq!(c.peer_ratio, Some(c.decode_tok_s / 2000.0));
    }
    // Without peers the columns empty out, and that is valid.
    r.peers = None;
    r.fill_peer_columns();
    assert!(r
        .cells
        .iter()
        .all(|c| c.peer_tok_s.is_none() && c.peer_ratio.is_none()));
    r.validate().unwrap();
}

#[test]
fn a_bundle_is_written_once_and_never_rewritten() {
    let tmp = tempfile::tempdir().unwrap();
    let results = tmp.path().join("bench").join("results");
    let r = sample();
    let dir = r.write_bundle(&results).unwrap();
    assert_eq!(dir, results.join("20261130T113029Z-nvidia-h200-qwen3-4b"));
    let json = std::fs::read_to_string(dir.join(BUNDLE_JSON)).unwrap();
    assert_eq!(BenchReport::from_json(&json, "written").unwrap(), r);
    let chart = std::fs::read_to_string(dir.join(BUNDLE_CHART)).unwrap();
    assert_eq!(chart, r.chart_svg().unwrap());

    // The same run again: refused, nothing touched.
    let mut changed = r.clone();
    changed.notes = Some("a rewrite".into());
    match changed.write_bundle(&results) {
        Err(ReportError::Exists { path }) => assert!(
            path.ends_with("20261130T113029Z-nvidia-h200-qwen3-4b"),
            "{path}"
        ),
        other => panic!("expected Exists, got {other:?}"),
    }
    let err = changed.write_bundle(&results).unwrap_err().to_string();
    assert!(err.contains("written once and never rewritten"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join(BUNDLE_JSON)).unwrap(),
        json
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);

    // A later run gets its own folder.
    let mut later = r.clone();
    later.created = "2026-11-30T12:00:01Z".into();
    assert_eq!(
        later.write_bundle(&results).unwrap(),
        results.join("20261130T120001Z-nvidia-h200-qwen3-4b")
    );
}

#[test]
fn an_invalid_bundle_is_not_written() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = sample();
    r.cells[0].decode_tok_s = f64::NAN;
    let err = r.write_bundle(tmp.path()).unwrap_err().to_string();
    assert!(
        err.contains("cells[0] (i16 c1 auto): `decode_tok_s` is NaN"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn broken_bundles_are_refused_naming_the_cell_and_field() {
    type Mutation = fn(&mut Value);
    let cases: Vec<(&str, Mutation, &[&str])> = vec![
        ("share off", |v| v["cells"][3]["limit_share"] = json!(0.5), &["cells[3] (i1024 c4 auto): `limit_share` is 0.5, but decode_tok_s / limit_tok_s"]),
        ("negative tok/s", |v| v["cells"][0]["decode_tok_s"] = json!(-1.0), &["cells[0] (i16 c1 auto): `decode_tok_s` is -1"]),
        ("null p90", |v| v["cells"][0]["tpot_ms_p90"] = Value::Null, &["cells[0].tpot_ms_p90: invalid type: null, expected f64"]),
        ("no digest", |v| { v["cells"][1].as_object_mut().unwrap().remove("digest"); }, &["cells[1]", "missing field `digest`"]),
        ("bad digest", |v| v["cells"][1]["digest"] = json!("XYZ"), &["cells[1] (i1024 c1 auto): `digest`"]),
        ("unknown field", |v| v["cells"][2]["decode_tok/s"] = json!(1.0), &["cells[2]", "unknown field `decode_tok/s`"]),
        ("ratio off", |v| v["cells"][2]["peer_ratio"] = json!(9.0), &["cells[2] (i16 c4 auto): `peer_ratio` is 9"]),
        ("peer off", |v| v["cells"][0]["peer_tok_s"] = json!(100.0), &["cells[0] (i16 c1 auto): `peer_tok_s` is 100, but the faster peer"]),
        ("per request off", |v| v["cells"][4]["per_request_tok_s"] = json!(1.0), &["cells[4] (i16 c8 auto): `per_request_tok_s`"]),
        ("p90 below median", |v| v["cells"][5]["tpot_ms_p90"] = json!(0.1), &["cells[5] (i1024 c8 auto): `tpot_ms_p90` is 0.1, below the median"]),
        ("median far from the throughput", |v| v["cells"][5]["tpot_ms_median"] = json!(0.5), &["cells[5] (i1024 c8 auto): `tpot_ms_median` is 0.5 ms"]),
        ("bytes too few", |v| v["cells"][6]["bytes_per_step"] = json!(1000.0), &["cells[6] (i16 c1 ptx-only): `bytes_per_step` is 1000, less than"]),
        ("limit off", |v| v["cells"][7]["limit_tok_s"] = json!(600.0), &["cells[7] (i1024 c1 ptx-only): `limit_tok_s` is 600, but bandwidth.read_gbs * 1e9 / bytes_per_step * concurrency"]),
        ("duplicate cell", |v| { let c = v["cells"][0].clone(); v["cells"].as_array_mut().unwrap().push(c); }, &["cells[12] (i16 c1 auto): `input` this cell is also cells[0]"]),
        ("unknown policy", |v| v["cells"][0]["policy"] = json!("fast"), &["cells[0].policy: unknown variant `fast`"]),
        ("TB/s for GB/s", |v| v["bandwidth"]["read_gbs"] = json!(4.15), &["bandwidth: `read_gbs` is 4.15: outside 10..50000 GB/s", "outside its runs"]),
        ("bandwidth outside its runs", |v| v["bandwidth"]["read_gbs"] = json!(3900.0), &["bandwidth: `read_gbs` is 3900, outside its runs"]),
        ("no runs", |v| v["bandwidth"]["runs"] = json!([]), &["bandwidth: `runs` is empty"]),
        ("a reader faster than the limit", |v| v["bandwidth"]["readers"] = json!([
            {"entry": "stream_read_u32", "read_gbs": 4234.532160713556, "runs": [4234.532160713556]},
            {"entry": "stream_read_bulk_u32", "read_gbs": 4560.0, "runs": [4560.0]}]),
            &["bandwidth: `read_gbs` is 4234.532160713556, slower than reader stream_read_bulk_u32 (4560)"]),
        ("the limit no reader's", |v| v["bandwidth"]["readers"] = json!([
            {"entry": "stream_read_u32", "read_gbs": 3000.0, "runs": [3000.0]}]),
            &["bandwidth: `read_gbs` is 4234.532160713556, not a reader's median with that reader's runs"]),
        ("the limit with another reader's runs", |v| v["bandwidth"]["readers"] = json!([
            {"entry": "stream_read_bulk_u32", "read_gbs": 4234.532160713556, "runs": [4234.532160713556, 4230.0]}]),
            &["bandwidth: `read_gbs` is 4234.532160713556, not a reader's median with that reader's runs"]),
        ("a reader outside its runs", |v| v["bandwidth"]["readers"] = json!([
            {"entry": "stream_read_u32", "read_gbs": 4000.0, "runs": [4100.0, 4200.0]}]),
            &["bandwidth: `readers[0].read_gbs` is 4000, outside its runs (4100 to 4200)"]),
        ("a reader without runs", |v| v["bandwidth"]["readers"] = json!([
            {"entry": "stream_read_bulk_u32", "read_gbs": 4234.532160713556, "runs": []}]),
            &["bandwidth: `readers[0].runs` is empty"]),
        ("not a time", |v| v["created"] = json!("yesterday"), &["bundle: `created` `yesterday` is not an RFC 3339 time"]),
        ("not UTC", |v| v["created"] = json!("2026-11-30T13:00:00+01:00"), &["bundle: `created`", "is not in UTC"]),
        ("capability", |v| v["device"]["capability"] = json!("sm_90"), &["device: `capability` `sm_90` is not MAJOR.MINOR"]),
        ("clocks", |v| v["device"]["clocks_after"]["sm_mhz"] = json!(0.0), &["device: `clocks_after.sm_mhz` is 0"]),
        ("no cold start", |v| { v["cold_start"].as_object_mut().unwrap().remove("ptx-only"); }, &["cold_start: `ptx-only` is missing"]),
        ("no cells", |v| v["cells"] = json!([]), &["bundle: `cells` is empty"]),
        ("no command", |v| v["command"] = json!([]), &["bundle: `command` is empty"]),
        ("dispatch", |v| v["dispatch"] = Value::Null, &["bundle: `dispatch` must be an object"]),
        ("peer implementation", |v| v["peers"]["cells"][0]["implementation"] = json!("vllm"), &["peers.cells[0] (i16 c1 vllm): `implementation` is `vllm`"]),
        ("peer tok/s", |v| v["peers"]["cells"][1]["decode_tok_s"] = json!(0.0), &["peers.cells[1] (i1024 c1 eager): `decode_tok_s` is 0"]),
        ("published without source", |v| v["peers"]["vllm"]["published"] = json!([{"source_url": "a blog", "model": "Qwen3-4B", "device": "H200"}]), &["peers: `vllm.published[0].source_url` `a blog` is not an http(s) address"]),
        ("git commit", |v| v["build"]["git_commit"] = json!("main"), &["build: `git_commit` `main` is not"]),
        ("schema", |v| v["schema"] = json!("aot-kernels-bench/2"), &["schema `aot-kernels-bench/2`: this qwen-decode reads `aot-kernels-bench/1` bundles"]),
        ("no schema", |v| { v.as_object_mut().unwrap().remove("schema"); }, &["no `schema` string"]),
    ];
    for (name, mutate, wanted) in cases {
        let mut v = sample_value();
        mutate(&mut v);
        let err = error_of(&v);
        assert!(!err.is_empty(), "{name}: the broken bundle was accepted");
        for w in wanted {
            assert!(err.contains(w), "{name}: `{w}` not in:\n{err}");
        }
    }
    assert_eq!(
        error_of(&sample_value()),
        "",
        "the unmutated sample is valid"
    );
    let err = BenchReport::from_json("{ not json", "x.json")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("x.json: not valid JSON"), "{err}");
}

#[test]
fn correctness_failures_are_reported_and_marked_in_the_table() {
    let mut r = sample();
    let i = r
        .cells
        .iter()
        .position(|c| c.label() == "i16 c4 ptx-only")
        .unwrap();
    r.cells[i].digest = ids_digest(&[vec![1, 2, 3]]);
    let j = r
        .cells
        .iter()
        .position(|c| c.label() == "i1024 c8 auto")
        .unwrap();
    r.cells[j].first_matches_single = false;
    r.validate().unwrap();
    let failures = r.correctness_failures();
    assert_eq!(
        failures,
        vec![
            "i1024 c8 auto: the first request's ids differ from its single-request run".to_string(),
            "i16 c4: the auto and ptx-only digests differ".to_string(),
        ]
    );
    let table = r.markdown_table();
    let row = |label: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {label} |")))
            .unwrap()
            .to_string()
    };
    assert!(
        row("i16 c4 ptx-only").ends_with("| digest != auto |"),
        "{table}"
    );
    assert!(
        row("i1024 c8 auto").ends_with("| first != single |"),
        "{table}"
    );
    assert!(
        row("i16 c8 ptx-only").ends_with("| ok, = auto |"),
        "{table}"
    );
}

#[test]
fn a_cell_from_its_timing_carries_the_definitions_validate_checks() {
    let mut r = sample();
    let base = r.cells[0].clone();
    let steps: Vec<f64> = (0..64)
        .map(|i| 2.2 + 0.001 * ((i * 37) % 64) as f64)
        .collect();
    let generated = vec![vec![5u32, 9, 1]];
    let cell = Cell::from_timing(&CellTiming {
        input: base.input,
        concurrency: base.concurrency,
        policy: base.policy,
        step: "launches",
        step_ms: &steps,
        window_ms: steps.iter().sum::<f64>() + 0.05,
        prefill_ms: 12.0,
        bytes_per_step: base.bytes_per_step,
        read_gbs: r.bandwidth.read_gbs,
        generated: &generated,
        first_matches_single: true,
    });
    assert_eq!(cell.new_tokens, 64);
    assert_eq!(cell.digest, ids_digest(&generated));
    assert_eq!(
        (cell.tpot_ms_median, cell.tpot_ms_p90),
        median_and_p90(&steps).unwrap()
    );
    // Same bytes and bandwidth as the sample's cell: the same limit.
    assert!((cell.limit_tok_s - base.limit_tok_s).abs() < 1e-9 * base.limit_tok_s);
    r.cells[0] = cell;
    r.fill_peer_columns();
    r.validate().unwrap();
}

#[test]
fn quantiles_digests_times_and_slugs() {
    let v: Vec<f64> = (1..=10).map(f64::from).rev().collect();
    // index round(9 * 0.5) = 5 (halves away from zero), round(9 * 0.9) = 8
    assert_eq!(median_and_p90(&v), Some((6.0, 9.0)));
    assert_eq!(median_and_p90(&[3.0]), Some((3.0, 3.0)));
    assert_eq!(median_and_p90(&[]), None);

    let mut bytes = Vec::new();
    for request in [vec![7u32, 300], vec![]] {
        bytes.extend_from_slice(&(request.len() as u64).to_le_bytes());
        for t in request {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    let want: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(ids_digest(&[vec![7, 300], vec![]]), want);
    assert_ne!(
        ids_digest(&[vec![7], vec![300]]),
        want,
        "request boundaries count"
    );

    let now = now_utc();
    assert!(now.ends_with('Z') && !now.contains('.'), "{now}");
    assert!(now.parse::<jiff::Timestamp>().is_ok(), "{now}");
    assert_eq!(slug("NVIDIA H200"), "nvidia-h200");
    assert_eq!(
        slug("  NVIDIA GH200 480GB (MIG 1g.10gb) "),
        "nvidia-gh200-480gb-mig-1g-10gb"
    );
    assert_eq!(slug("Qwen/Qwen3-4B"), "qwen-qwen3-4b");
}

// ---- the CLI ----

fn qwen_decode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen-decode"))
        .args(args)
        .output()
        .expect("qwen-decode runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_json(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

#[test]
fn bench_report_validates_renders_and_exits_by_what_it_found() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("chart.svg");
    let out = qwen_decode(&[
        "bench-report",
        SAMPLE,
        "--markdown",
        "--chart",
        svg.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(
            "valid aot-kernels-bench/1 bundle (a SAMPLE: a test fixture, not a run to cite)"
        ),
        "{stdout}"
    );
    assert!(stdout.contains(&sample().markdown_table()), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(&svg).unwrap(),
        sample().chart_svg().unwrap()
    );

    // The chart file exists now: not written over.
    std::fs::write(&svg, "keep me").unwrap();
    let out = qwen_decode(&["bench-report", SAMPLE, "--chart", svg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("exists: give --chart a new file"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&svg).unwrap(), "keep me");

    // Invalid: exit 1 with the reason.
    let mut v = sample_value();
    v["cells"][3]["limit_share"] = json!(0.5);
    let bad = write_json(tmp.path(), "bad.json", &v);
    let out = qwen_decode(&["bench-report", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("invalid bundle (1 problem)")
            && err.contains("cells[3] (i1024 c4 auto): `limit_share`"),
        "{err}"
    );

    // Valid, but the ids disagree between policies: exit 4.
    let mut v = sample_value();
    v["cells"][6]["digest"] = json!(ids_digest(&[vec![1]]));
    let wrong = write_json(tmp.path(), "wrong.json", &v);
    let out = qwen_decode(&["bench-report", wrong.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr)
        .contains("correctness failure: i16 c1: the auto and ptx-only digests differ"));

    // A peers file on its own.
    let peers = write_json(tmp.path(), "peers.json", &sample_value()["peers"]);
    let out = qwen_decode(&["bench-report", peers.to_str().unwrap(), "--markdown"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("valid peers (12 cells)"));
    assert!(text(&out.stdout).contains("| i1024 c8 | static-compiled | 1095.4 |"));
    assert!(!text(&out.stdout).contains("INCOMPLETE"));
    // One the script cut short says so.
    let mut partial = sample_value()["peers"].clone();
    partial["complete"] = json!(false);
    let partial = write_json(tmp.path(), "partial.json", &partial);
    let out = qwen_decode(&["bench-report", partial.to_str().unwrap(), "--markdown"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("INCOMPLETE run"),
        "{}",
        text(&out.stdout)
    );

    // Not there, not JSON.
    let out = qwen_decode(&[
        "bench-report",
        tmp.path().join("none.json").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read"));
    let junk = tmp.path().join("junk.json");
    std::fs::write(&junk, "[1, 2").unwrap();
    let out = qwen_decode(&["bench-report", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not valid JSON"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn every_committed_bundle_validates_and_is_a_measurement() {
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/results");
    let mut n = 0;
    for entry in std::fs::read_dir(&results).expect("bench/results holds the cited H200 bundles") {
        let json = entry.unwrap().path().join(BUNDLE_JSON);
        if !json.exists() {
            continue;
        }
        let r = BenchReport::read(&json).unwrap_or_else(|e| panic!("{}: {e}", json.display()));
        r.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", json.display()));
        assert!(
            !r.sample,
            "{}: a sample under bench/results",
            json.display()
        );
        assert!(r.correctness_failures().is_empty(), "{}", json.display());
        n += 1;
    }
    assert!(n > 0, "no bundle under {}", results.display());
}

#[test]
fn the_limit_is_the_fastest_readers() {
    use qwen_engine::bench::report::{Bandwidth, ReaderRuns};
    let reader = |entry: &str, runs: &[f64]| ReaderRuns {
        entry: entry.into(),
        read_gbs: median_and_p90(runs).unwrap().0,
        runs: runs.to_vec(),
    };
    let b = Bandwidth::fastest(
        1 << 30,
        vec![
            reader("stream_read_u32", &[4180.0, 4170.0, 4190.0]),
            reader("stream_read_bulk_u32", &[4550.0, 4560.0, 4540.0]),
        ],
    )
    .unwrap();
    assert_eq!(b.read_gbs, 4550.0);
    assert_eq!(b.runs, vec![4550.0, 4560.0, 4540.0]);
    assert_eq!(b.readers.len(), 2);
    assert_eq!(
        b.describe(),
        "4550 GB/s (stream_read_bulk_u32; stream_read_u32 4180)"
    );
    assert!(Bandwidth::fastest(1, Vec::new()).is_none());

    // Stored with its readers, a sample bundle still validates and reads back the same.
    let mut r = sample();
    let scale = b.read_gbs / r.bandwidth.read_gbs;
    r.bandwidth = Bandwidth {
        bytes: r.bandwidth.bytes,
        ..b
    };
    for c in &mut r.cells {
        c.limit_tok_s *= scale;
        c.limit_share = c.decode_tok_s / c.limit_tok_s;
    }
    r.validate().unwrap();
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains("\"readers\""), "{json}");
    let back: BenchReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back.bandwidth, r.bandwidth);
}

#[test]
fn persistent_cells_sit_beside_the_launch_cells_with_their_own_cold_start_and_digests() {
    let mut r = sample();
    let mut p = r.cells[0].clone();
    p.step = "persistent".into();
    p.digest = ids_digest(&[vec![7, 7, 7]]);
    r.cells.push(p.clone());
    let e = r.validate().unwrap_err().to_string();
    assert!(
        e.contains("`auto persistent` is missing"),
        "the persistent runner's cold start is required: {e}"
    );
    let cold = r.cold_start["auto"].clone();
    r.cold_start.insert("auto persistent".into(), cold);
    r.validate().unwrap();
    // Its digest differs from the launch cell's: the kinds sum in different orders, so that is
    // no correctness failure; only cells of one kind are compared.
    assert!(
        r.correctness_failures().is_empty(),
        "{:?}",
        r.correctness_failures()
    );
    assert!(r.markdown_table().contains(&format!("| {} |", p.label())));
    assert!(p.label().ends_with(" persistent"));
    // The same cell twice is refused, and so is an unknown step.
    r.cells.push(p.clone());
    assert!(r
        .validate()
        .unwrap_err()
        .to_string()
        .contains("policy, step) once"));
    r.cells.pop();
    r.cells.last_mut().unwrap().step = "fused".into();
    assert!(r
        .validate()
        .unwrap_err()
        .to_string()
        .contains("not a decode step"));
}
