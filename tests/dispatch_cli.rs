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

#[test]
fn simulated_thor_orin_and_future_plans() {
    assert!(
        aot_kernels::registry::build_info().target_filter.is_none(),
        "exact-SASS plan checks need a build without AOT_TARGETS"
    );
    let (code, json) = plan_json(&["--simulate", "11.0", "--integrated", "--driver", "13.0"]);
    assert_eq!(code, Some(0));
    assert_eq!(json["plan"]["simulated"], true);
    // Exact SASS for Thor in every module: `sm_110`, or `sm_110a` for the Triton modules.
    assert!(
        chosen(&json)
            .iter()
            .all(|t| t == "sm_110" || t == "sm_110a"),
        "{json}"
    );
    let (_, json) = plan_json(&["--simulate", "8.7", "--integrated", "--driver", "12.8"]);
    assert!(chosen(&json).iter().all(|t| t == "sm_87"), "{json}");
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
    // A future GPU on a driver too old for nvcc 13's PTX.
    let out = qwen_decode(&["kernels", "--simulate", "13.0", "--driver", "12.8"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ERROR: no usable image"), "{stdout}");
    assert!(stdout.contains("needs driver >= 13.0"), "{stdout}");
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
