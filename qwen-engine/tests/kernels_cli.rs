//! `qwen-decode kernels --simulate`: the plans CI checks, and the usage errors; flags no request can hold. No GPU needed.

use std::process::{Command, Output};

fn qwen_decode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen-decode"))
        .args(args)
        .env_remove("AOT_KERNELS_POLICY")
        .output()
        .expect("qwen-decode runs")
}

fn plan_json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = vec!["kernels", "--json"];
    all.extend_from_slice(args);
    let out = qwen_decode(&all);
    let json = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    (out.status.code(), json)
}

fn chosen(json: &serde_json::Value) -> Vec<String> {
    json["plan"]["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            m["choice"]["target"]
                .as_str()
                .unwrap_or("ERROR")
                .to_string()
        })
        .collect()
}

/// Whether a plan module (JSON) is a Triton module: built with CUDA 13 only.
fn is_triton(m: &serde_json::Value) -> bool {
    aot_kernels::registry::module(m["module"].as_str().unwrap())
        .is_some_and(|r| r.kind == aot_kernels::registry::ModuleKind::Triton)
}

/// Whether a plan module (JSON) is a fast path built for some GPUs only (manifest `portable =
/// false`: the sm_90a wgmma GEMM).
fn is_fast_path(m: &serde_json::Value) -> bool {
    aot_kernels::registry::module(m["module"].as_str().unwrap()).is_some_and(|r| !r.portable)
}

/// The portable modules' choices (`chosen` less the fast paths).
fn chosen_portable(json: &serde_json::Value) -> Vec<String> {
    let modules = json["plan"]["modules"].as_array().unwrap();
    modules
        .iter()
        .zip(chosen(json))
        .filter(|(m, _)| !is_fast_path(m))
        .map(|(_, c)| c)
        .collect()
}

/// Every fast-path module chose `want` (`target toolchain min_driver`), or, with `None`, is
/// unavailable and says that the portable kernels serve; there is at least one.
fn assert_fast_paths(json: &serde_json::Value, want: Option<&str>) {
    let modules = json["plan"]["modules"].as_array().unwrap();
    let mut seen = 0;
    for (m, c) in modules.iter().zip(chosen_with_driver(json)) {
        if !is_fast_path(m) {
            continue;
        }
        seen += 1;
        match want {
            Some(w) => assert_eq!(c, w, "{m}"),
            None => {
                assert_eq!(c, "ERROR - -", "{m}");
                let why = m["unavailable"].as_str().unwrap();
                assert!(
                    why.contains("a fast path built as SASS for sm_90a only")
                        && why.contains("the portable kernels serve"),
                    "{why}"
                );
            }
        }
    }
    assert!(seen > 0, "the registry has a fast-path module");
}

/// Per module: `target toolchain min_driver` of the choice, e.g. `sm_87 12.9 12.0`.
fn chosen_with_driver(json: &serde_json::Value) -> Vec<String> {
    json["plan"]["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let c = &m["choice"];
            format!(
                "{} {} {}",
                c["target"].as_str().unwrap_or("ERROR"),
                c["toolchain"].as_str().unwrap_or("-"),
                c["min_driver"].as_str().unwrap_or("-")
            )
        })
        .collect()
}

/// Every portable CUDA module chose `want` (`target toolchain min_driver`); every Triton module
/// has no choice and says why it is unavailable, and so does every fast path (these plans are
/// none of an sm_90 GPU's under auto).
fn assert_cuda_modules_chose(json: &serde_json::Value, want: &str) {
    assert_fast_paths(json, None);
    let modules = json["plan"]["modules"].as_array().unwrap();
    for (m, c) in modules.iter().zip(chosen_with_driver(json)) {
        if is_fast_path(m) {
            continue;
        }
        if is_triton(m) {
            assert_eq!(c, "ERROR - -", "{m}");
            assert!(m["unavailable"].is_string(), "{m}");
        } else {
            assert_eq!(c, want, "{m}");
        }
    }
}

#[test]
fn orin_on_jetpack_6_h100_on_r550_and_thor_on_jetpack_7() {
    assert!(
        aot_kernels::registry::build_info().target_filter.is_none(),
        "exact-SASS plan checks need a build without AOT_TARGETS"
    );
    // Per case: the CUDA modules' choice, the Triton modules' (None: unavailable, CUDA 13 only)
    // and the fast paths' (None: unavailable, built for sm_90a only).
    for (args, want, want_triton, want_fast) in [
        (
            &["--simulate", "8.7", "--integrated", "--driver", "12.6"][..],
            "sm_87 12.9 12.0",
            None,
            None,
        ),
        (
            &["--simulate", "9.0", "--driver", "12.4"][..],
            "sm_90 12.9 12.0",
            None,
            Some("sm_90a 12.9 12.0"),
        ),
        (
            &["--simulate", "11.0", "--integrated", "--driver", "13.0"][..],
            "sm_110 13.0 13.0",
            Some("sm_110a 13.0 13.0"),
            None,
        ),
    ] {
        // Exit 0 either way: on a 12.x driver only the Triton modules lack an image.
        let (code, json) = plan_json(args);
        assert_eq!(code, Some(0), "{args:?}: {json}");
        let got = chosen_with_driver(&json);
        let modules = json["plan"]["modules"].as_array().unwrap();
        assert!(modules.iter().any(is_triton) && modules.iter().any(|m| !is_triton(m)));
        assert_fast_paths(&json, want_fast);
        for (m, got) in modules.iter().zip(&got) {
            if is_fast_path(m) {
                continue;
            }
            if !is_triton(m) {
                assert_eq!(got, want, "{args:?}: {m}");
                continue;
            }
            match want_triton {
                Some(w) => assert_eq!(got, w, "{args:?}: {m}"),
                None => {
                    assert_eq!(got, "ERROR - -", "{args:?}: {m}");
                    let why = m["unavailable"].as_str().unwrap();
                    assert!(
                        why.contains("built with CUDA 13.0 only")
                            && why.contains("compute_80 PTX ISA 9.0")
                            && why.contains("need driver >= 13.0"),
                        "{why}"
                    );
                }
            }
        }
        let unavailable = json["unavailable"].as_array().map_or(0, Vec::len);
        let triton = modules.iter().filter(|m| is_triton(m)).count();
        let fast = modules.iter().filter(|m| is_fast_path(m)).count();
        assert_eq!(
            unavailable,
            if want_triton.is_some() { 0 } else { triton }
                + if want_fast.is_some() { 0 } else { fast }
        );
    }
    // The table shows toolchain and required driver per module.
    let out = qwen_decode(&[
        "kernels",
        "--simulate",
        "8.7",
        "--integrated",
        "--driver",
        "12.6",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cuda  driver>="), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("rmsnorm ") && l.contains("sm_87        12.9  12.0")),
        "{stdout}"
    );
    // Each Triton module says, in its row, why it has no image on this driver.
    assert!(
        stdout.lines().any(|l| l.starts_with("gdn_conv1d ")
            && l.contains("UNAVAILABLE: built with CUDA 13.0 only; its CUDA 13.0 images for this GPU (sm_87, compute_80 PTX ISA 9.0) need driver >= 13.0; this driver is CUDA 12.6")),
        "{stdout}"
    );
    assert!(
        stdout.contains("gdn_conv1d [gdn_causal_conv1d] (triton):"),
        "{stdout}"
    );
    // Unavailable on a 12.6 driver: the sm_90a-only GEMM and every Triton module (CUDA 13 only).
    let triton = aot_kernels::dispatch::ModuleSource::registry_of_kind(
        aot_kernels::registry::ModuleKind::Triton,
    )
    .len();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "note: {} module(s) unavailable on this device: gemm_bf16_sm90, gdn_conv1d,",
            triton + 1
        )) && !stderr.contains("error:"),
        "{stderr}"
    );
}

#[test]
fn forcing_cuda12_images_and_a_driver_too_old_for_everything() {
    let (code, json) = plan_json(&[
        "--simulate",
        "9.0",
        "--driver",
        "13.0",
        "--toolchain",
        "cuda12",
    ]);
    // The Triton modules have no CUDA 12 images: unavailable under this choice, not an error.
    assert_eq!(code, Some(0));
    assert_eq!(json["toolchain_choice"], "cuda12");
    let modules = json["plan"]["modules"].as_array().unwrap();
    assert_fast_paths(&json, Some("sm_90a 12.9 12.0"));
    for (m, c) in modules.iter().zip(chosen_with_driver(&json)) {
        if is_fast_path(m) {
            continue;
        }
        if is_triton(m) {
            assert!(
                m["unavailable"]
                    .as_str()
                    .unwrap()
                    .contains("the toolchain choice leaves out its CUDA 13.0 images"),
                "{m}"
            );
        } else {
            assert_eq!(c, "sm_90 12.9 12.0", "{m}");
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_qwen-decode"))
        .args([
            "kernels",
            "--json",
            "--simulate",
            "9.0",
            "--driver",
            "13.0",
            "--policy",
            "ptx-only",
        ])
        .env("AOT_KERNELS_TOOLCHAIN", "cuda12")
        .env_remove("AOT_KERNELS_POLICY")
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_cuda_modules_chose(&json, "compute_80 12.9 12.9");

    let out = qwen_decode(&["kernels", "--simulate", "9.0", "--driver", "11.8"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the driver (CUDA 11.8) is too old for these kernels")
            && stderr.contains("supports CUDA 12.0 (CUDA 13.0 for every module")
            && stderr.contains("Update the NVIDIA driver"),
        "{stderr}"
    );
    let out = qwen_decode(&[
        "kernels",
        "--simulate",
        "9.0",
        "--driver",
        "13.0",
        "--toolchain",
        "cuda11",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "no CUDA 11 images: every module errs"
    );
    let out = qwen_decode(&[
        "kernels",
        "--simulate",
        "9.0",
        "--driver",
        "13.0",
        "--toolchain",
        "12",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cuda12"));
}

#[test]
fn simulated_thor_orin_and_future_plans() {
    assert!(
        aot_kernels::registry::build_info().target_filter.is_none(),
        "exact-SASS plan checks need a build without AOT_TARGETS"
    );
    let (code, json) = plan_json(&["--simulate", "11.0", "--integrated", "--driver", "13.0"]);
    assert_eq!(code, Some(0));
    assert_eq!(json["plan"]["simulated"], true);
    // Exact SASS for Thor in every portable module: `sm_110`, or `sm_110a` for the Triton
    // modules; the sm_90a fast path is unavailable.
    assert!(
        chosen_portable(&json)
            .iter()
            .all(|t| t == "sm_110" || t == "sm_110a"),
        "{json}"
    );
    assert_fast_paths(&json, None);
    // Orin on a 12.8 driver: the CUDA modules' CUDA 12.9 sm_87; the Triton modules (CUDA 13
    // only) unavailable, and the plan still exits 0.
    let (code, json) = plan_json(&["--simulate", "8.7", "--integrated", "--driver", "12.8"]);
    assert_eq!(code, Some(0));
    assert_cuda_modules_chose(&json, "sm_87 12.9 12.0");
    let (code, json) = plan_json(&["--simulate", "13.0", "--driver", "13.0"]);
    assert_eq!(code, Some(0));
    assert!(
        chosen_portable(&json).iter().all(|t| t == "compute_80"),
        "{json}"
    );
    assert_fast_paths(&json, None);
    let (code, json) = plan_json(&[
        "--simulate",
        "9.0",
        "--driver",
        "13.0",
        "--policy",
        "ptx-only",
    ]);
    assert_eq!(
        (code, json["plan"]["policy"].as_str()),
        (Some(0), Some("ptx-only"))
    );
    assert!(
        chosen_portable(&json).iter().all(|t| t == "compute_80"),
        "{json}"
    );
    assert_fast_paths(&json, None);
    // The same GPU under auto: the wgmma GEMM's sm_90a beside every other module's sm_90.
    let (code, json) = plan_json(&["--simulate", "9.0", "--driver", "13.0"]);
    assert_eq!(code, Some(0));
    assert_fast_paths(&json, Some("sm_90a 13.0 13.0"));
}

#[test]
fn a_plan_with_an_unservable_module_exits_1_and_says_why() {
    // A future GPU on a driver too old for either toolchain's PTX.
    let out = qwen_decode(&["kernels", "--simulate", "13.0", "--driver", "12.8"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ERROR: no usable image"), "{stdout}");
    assert!(stdout.contains("needs driver >= 13.0"), "{stdout}");
    assert!(stdout.contains("needs driver >= 12.9"), "{stdout}");
}

#[test]
fn usage_errors_exit_2_with_the_expected_form() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["kernels", "--simulate", "11", "--driver", "13.0"],
            "expected MAJOR.MINOR",
        ),
        (&["kernels", "--simulate", "11.0"], "--driver"),
        (&["kernels", "--integrated"], "--simulate"),
        (
            &[
                "kernels",
                "--simulate",
                "9.0",
                "--driver",
                "13.0",
                "--policy",
                "jit",
            ],
            "sass-only",
        ),
    ];
    for (args, needle) in cases {
        let out = qwen_decode(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_qwen-decode"))
        .args(["kernels", "--simulate", "9.0", "--driver", "13.0"])
        .env("AOT_KERNELS_POLICY", "bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("AOT_KERNELS_POLICY"));
}

#[test]
fn bench_and_run_refuse_counts_no_request_can_hold_before_any_work() {
    // The model path does not exist: the flags are refused before it is opened.
    for (flag, value) in [
        ("--concurrency", "1,0"),
        ("--inputs", "16,0"),
        ("--new-tokens", "0"),
    ] {
        let out = qwen_decode(&["bench", "--model", "/nonexistent-model", flag, value]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(flag) && !stderr.contains("nonexistent"),
            "{flag} {value}: {stderr}"
        );
    }
    // A count of new tokens past any context is too long, not a wrapped small request.
    let out = qwen_decode(&[
        "run",
        "--model",
        "tiny",
        "--prompt-ids",
        "1,2",
        "--max-new-tokens",
        &usize::MAX.to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("exceeds the context"), "{stderr}");
}
