//! `scripts/bench/peers.py` without a GPU: it compiles with the plain python3 CI has, and, where
//! torch and transformers are installed (`PEERS_PYTHON`, else `python3`), its CPU self-tests run
//! the engine's tiny model (and the tiny model of the hybrid Qwen3.6-35B-A3B family) through both
//! implementations end to end and print a peers object this crate reads, validates and joins into
//! a bundle. CI installs no torch: there the self-tests say so on stderr and check nothing more.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;

use qwen_engine::bench::report::{BenchReport, Peers};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/bench/peers.py")
}

fn python() -> String {
    std::env::var("PEERS_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn the_peers_script_compiles() {
    // compile() without writing bytecode next to the script.
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')",
        ])
        .arg(script())
        .output()
        .expect("python3 runs (CI has it: make setup uses it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_peers_script_self_test_runs_the_tiny_model_on_the_cpu() {
    let py = python();
    let probe = Command::new(&py)
        .args([
            "-c",
            "import torch, transformers\n\
             from transformers import Qwen3ForCausalLM, StaticCache\n\
             assert int(transformers.__version__.split('.')[0]) >= 5, 'transformers 5.x'\n\
             print(torch.__version__, transformers.__version__)",
        ])
        .output();
    let Some(probe) = probe.ok().filter(|o| o.status.success()) else {
        // Written past the test harness's capture, so that CI's log shows the skip.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED the_peers_script_self_test_runs_the_tiny_model_on_the_cpu: {py} has no torch + transformers 5.x \
             (set PEERS_PYTHON to a python that has them, e.g. torch 2.11 + transformers 5.17)"
        );
        return;
    };
    let versions = String::from_utf8_lossy(&probe.stdout).trim().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let json_out = tmp.path().join("peers.json");
    let out = Command::new(&py)
        .arg(script())
        .args([
            "--device",
            "cpu",
            "--tiny",
            "--dtype",
            "float32",
            "--require-match",
            "--cells",
            "16x4",
            "--new-tokens",
            "4",
            "--compile-backend",
            "aot_eager",
            "--matmul-runs",
            "2",
            "--json-out",
        ])
        .arg(&json_out)
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .expect("the peers script runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "peers.py ({versions}) failed:\n{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let peers = Peers::from_json(&stdout, "stdout").unwrap();
    peers.validate().unwrap();
    assert_eq!(
        Peers::read(&json_out).unwrap(),
        peers,
        "--json-out holds what stdout printed"
    );
    assert_eq!(peers.source, "scripts/bench/peers.py");
    assert_eq!(peers.extra["complete"], true);
    assert_eq!(
        peers.vllm.status,
        "not installable on the GPU machine (no network)"
    );
    assert!(peers.vllm.published.is_empty());
    let mut cells: Vec<(usize, usize, &str)> = peers
        .cells
        .iter()
        .map(|c| (c.input, c.concurrency, c.implementation.as_str()))
        .collect();
    cells.sort();
    assert_eq!(cells, vec![(16, 4, "eager"), (16, 4, "static-compiled")]);
    for c in &peers.cells {
        assert_eq!(c.extra["new_tokens"], 4);
        // float32 on the CPU: the static-cache loop generates eager's ids exactly.
        if c.implementation == "static-compiled" {
            assert_eq!(
                c.extra["matches_eager"], true,
                "i{} c{}",
                c.input, c.concurrency
            );
        }
    }
    for s in peers
        .cells
        .iter()
        .filter(|c| c.implementation == "static-compiled")
    {
        let e = peers
            .cells
            .iter()
            .find(|c| {
                c.implementation == "eager" && (c.input, c.concurrency) == (s.input, s.concurrency)
            })
            .unwrap();
        assert_eq!(
            s.extra["digest"], e.extra["digest"],
            "i{} c{}",
            s.input, s.concurrency
        );
    }
    // Joined into the sample bundle: i16 c4 gets the faster of the two, the rest none.
    let mut r = BenchReport::read(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bench/sample.json"),
    )
    .unwrap();
    r.attach_peers(peers.clone());
    r.validate().unwrap();
    let (best, name) = peers.faster(16, 4).unwrap();
    for c in &r.cells {
        if (c.input, c.concurrency) == (16, 4) {
            assert_eq!(
                (c.peer_tok_s, c.peer_implementation.as_deref()),
                (Some(best), Some(name))
            );
        } else {
            assert_eq!(c.peer_tok_s, None, "{}", c.label());
        }
    }

    // Usage errors name the argument.
    let out = Command::new(&py)
        .arg(script())
        .args(["--cells", "16by1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`16by1` is not a cell"));
}

#[test]
fn the_peers_script_self_test_runs_the_tiny_hybrid_model_on_the_cpu() {
    let py = python();
    let probe = Command::new(&py)
        .args([
            "-c",
            "import torch, transformers\n\
             from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, StaticCache\n\
             print(torch.__version__, transformers.__version__)",
        ])
        .output();
    let Some(probe) = probe.ok().filter(|o| o.status.success()) else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED the_peers_script_self_test_runs_the_tiny_hybrid_model_on_the_cpu: {py} has no torch + \
             transformers with Qwen3_5MoeForCausalLM (set PEERS_PYTHON to a python that has them, e.g. \
             torch 2.11 + transformers 5.17)"
        );
        return;
    };
    let versions = String::from_utf8_lossy(&probe.stdout).trim().to_string();
    let out = Command::new(&py)
        .arg(script())
        .args([
            "--model",
            "qwen3.6-35b-a3b",
            "--device",
            "cpu",
            "--tiny",
            "--dtype",
            "float32",
            "--require-match",
            "--cells",
            "16x4",
            "--new-tokens",
            "4",
            "--warmup-steps",
            "2",
            "--implementations",
            "eager,static-compiled",
            "--compile-backend",
            "aot_eager",
            "--matmul-runs",
            "2",
        ])
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .expect("the peers script runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "peers.py ({versions}) failed:\n{stderr}"
    );
    let peers = Peers::from_json(&String::from_utf8_lossy(&out.stdout), "stdout").unwrap();
    peers.validate().unwrap();
    let x = &peers.extra;
    assert_eq!(x["model"], "tiny-hybrid");
    assert_eq!(x["model_class"], "Qwen3_5MoeForCausalLM");
    assert_eq!(x["model_type"], "qwen3_5_moe_text");
    assert_eq!(x["config"]["num_hidden_layers"], 4);
    assert_eq!(x["hybrid"]["layer_types"]["linear_attention"], 3);
    assert_eq!(x["hybrid"]["layer_types"]["full_attention"], 1);
    // The compiled step is one graph (no fallback without fullgraph).
    assert_eq!(x["compile"]["fullgraph"], true);
    let paths = x["hybrid"]["gdn_paths"].as_object().unwrap();
    assert_eq!(paths.len(), 4, "{paths:?}");
    let eager = peers
        .cells
        .iter()
        .find(|c| c.implementation == "eager")
        .unwrap();
    let compiled = peers
        .cells
        .iter()
        .find(|c| c.implementation == "static-compiled")
        .unwrap();
    // Prefill: the chunked rule and the conv once per linear layer; each of the 2 + 4 decode
    // steps: the recurrent rule and the conv update once per linear layer.
    let calls = &eager.extra["gdn_calls"];
    assert_eq!(calls["torch_chunk_gated_delta_rule"], 3);
    assert_eq!(calls["causal_conv1d_fn"], 3);
    assert_eq!(calls["torch_recurrent_gated_delta_rule"], 18);
    assert_eq!(calls["causal_conv1d_update"], 18);
    // float32 on the CPU: the static cache and the compiled step generate eager's ids exactly.
    assert_eq!(compiled.extra["matches_eager"], true);
    assert_eq!(compiled.extra["digest"], eager.extra["digest"]);
}
