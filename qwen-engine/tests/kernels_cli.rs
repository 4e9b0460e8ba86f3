//! `qwen-decode kernels --simulate`: the plans CI checks, and the usage errors. No GPU needed.

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

#[test]
fn orin_on_jetpack_6_h100_on_r550_and_thor_on_jetpack_7() {
    assert!(
        aot_kernels::registry::build_info().target_filter.is_none(),
        "exact-SASS plan checks need a build without AOT_TARGETS"
    );
    for (args, want) in [
        (
            &["--simulate", "8.7", "--integrated", "--driver", "12.6"][..],
            "sm_87 12.9 12.0",
        ),
        (
            &["--simulate", "9.0", "--driver", "12.4"][..],
            "sm_90 12.9 12.0",
        ),
        (
            &["--simulate", "11.0", "--integrated", "--driver", "13.0"][..],
            "sm_110 13.0 13.0",
        ),
    ] {
        let (code, json) = plan_json(args);
        assert_eq!(code, Some(0), "{args:?}: {json}");
        let got = chosen_with_driver(&json);
        assert!(!got.is_empty());
        assert!(got.iter().all(|c| c == want), "{args:?}: {got:?}");
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cuda  driver>="), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("rmsnorm ") && l.contains("sm_87        12.9  12.0")),
        "{stdout}"
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
    assert_eq!(code, Some(0));
    assert_eq!(json["toolchain_choice"], "cuda12");
    assert!(
        chosen_with_driver(&json)
            .iter()
            .all(|c| c == "sm_90 12.9 12.0"),
        "{json}"
    );
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
    assert!(
        chosen_with_driver(&json)
            .iter()
            .all(|c| c == "compute_80 12.9 12.9"),
        "{json}"
    );

    let out = qwen_decode(&["kernels", "--simulate", "9.0", "--driver", "11.8"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the driver (CUDA 11.8) is too old for these kernels")
            && stderr.contains("supports CUDA 12.0")
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
    assert!(chosen(&json).iter().all(|t| t == "sm_110"), "{json}");
    let (_, json) = plan_json(&["--simulate", "8.7", "--integrated", "--driver", "12.8"]);
    assert!(chosen(&json).iter().all(|t| t == "sm_87"), "{json}");
    assert!(
        chosen_with_driver(&json)
            .iter()
            .all(|c| c == "sm_87 12.9 12.0"),
        "{json}"
    );
    let (code, json) = plan_json(&["--simulate", "13.0", "--driver", "13.0"]);
    assert_eq!(code, Some(0));
    assert!(chosen(&json).iter().all(|t| t == "compute_80"), "{json}");
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
    assert!(chosen(&json).iter().all(|t| t == "compute_80"), "{json}");
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
