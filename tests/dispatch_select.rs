//! The selection table: which image every device/driver pair gets from a given image set.
//! Pure; runs without a GPU (CI).

use aot_kernels::dispatch::select::{max_ptx_isa_for_driver, min_driver_for_ptx_isa};
use aot_kernels::dispatch::{select_image, DeviceSpec, ImageCandidate, Policy, Reason, Version};
use fatbin_verify::Target;

const DRIVERS: [&str; 4] = ["12.4", "12.8", "13.0", "13.1"];

fn v(s: &str) -> Version {
    s.parse().unwrap()
}

fn dev(cap: &str, integrated: bool, driver: &str) -> DeviceSpec {
    DeviceSpec {
        capability: v(cap),
        integrated,
        driver: v(driver),
    }
}

/// `"sm_80 sm_90a compute_80@9.0"`: SASS by name, PTX with its `.version` after `@`.
fn images(spec: &str) -> Vec<ImageCandidate> {
    spec.split_whitespace()
        .map(|item| {
            let (name, isa) = match item.split_once('@') {
                Some((n, isa)) => {
                    let (a, b) = isa.split_once('.').unwrap();
                    (n, Some((a.parse().unwrap(), b.parse().unwrap())))
                }
                None => (item, None),
            };
            ImageCandidate {
                target: name.parse::<Target>().unwrap(),
                ptx_version: isa,
            }
        })
        .collect()
}

/// What the manifest builds today: ten SASS targets and compute_80 PTX from nvcc 13.0 (ISA 9.0).
const FULL: &str =
    "sm_80 sm_86 sm_87 sm_89 sm_90 sm_100 sm_103 sm_110 sm_120 sm_121 compute_80@9.0";

/// Expected outcome: `Ok(target)` or `Err(substring of the message)`.
type Want = Result<&'static str, &'static str>;

fn check(device: DeviceSpec, policy: Policy, imgs: &str, want: Want) {
    let cands = images(imgs);
    let got = select_image(&device, policy, &cands);
    match (&got, want) {
        (Ok(sel), Ok(t)) => {
            assert_eq!(sel.target.to_string(), t, "{device} {policy} [{imgs}]");
            assert_eq!(
                cands[sel.index].target, sel.target,
                "index points at the chosen image"
            );
        }
        (Err(e), Err(needle)) => {
            let msg = e.to_string();
            assert!(
                msg.contains(needle),
                "{device} {policy} [{imgs}]: `{msg}` lacks `{needle}`"
            );
        }
        _ => panic!("{device} {policy} [{imgs}]: got {got:?}, want {want:?}"),
    }
}

#[test]
fn full_registry_gives_exact_sass_everywhere_it_is_built_on_every_driver() {
    let rows: &[(&str, bool, &str)] = &[
        ("8.0", false, "sm_80"),
        ("8.6", false, "sm_86"),
        ("8.7", true, "sm_87"),
        ("8.9", false, "sm_89"),
        ("9.0", false, "sm_90"),
        ("10.0", false, "sm_100"),
        ("10.3", false, "sm_103"),
        ("11.0", true, "sm_110"),
        ("12.0", false, "sm_120"),
        ("12.1", false, "sm_121"),
    ];
    for &(cap, integrated, want) in rows {
        for driver in DRIVERS {
            let d = dev(cap, integrated, driver);
            check(d, Policy::Auto, FULL, Ok(want));
            check(d, Policy::SassOnly, FULL, Ok(want));
            let sel = select_image(&d, Policy::Auto, &images(FULL)).unwrap();
            assert_eq!(sel.reason, Reason::ExactSass);
        }
    }
}

#[test]
fn turing_is_below_every_image() {
    for driver in DRIVERS {
        // compute_80 PTX cannot run on 7.5, and there is no sm_75.
        check(
            dev("7.5", false, driver),
            Policy::Auto,
            FULL,
            Err("needs SASS sm_75"),
        );
    }
}

#[test]
fn future_gpu_takes_ptx_only_when_the_driver_knows_its_isa() {
    check(
        dev("13.0", false, "13.0"),
        Policy::Auto,
        FULL,
        Ok("compute_80"),
    );
    check(
        dev("13.0", false, "13.1"),
        Policy::Auto,
        FULL,
        Ok("compute_80"),
    );
    for driver in ["12.4", "12.8"] {
        check(
            dev("13.0", false, driver),
            Policy::Auto,
            FULL,
            Err("needs driver >= 13.0"),
        );
    }
    // Never SASS across a major: sm_121 does not run on 13.0.
    check(
        dev("13.0", false, "13.1"),
        Policy::SassOnly,
        FULL,
        Err("policy sass-only refuses PTX JIT"),
    );
}

#[test]
fn ptx_only_forces_the_fallback_and_sass_only_refuses_it() {
    let d = dev("9.0", false, "13.0");
    let sel = select_image(&d, Policy::PtxOnly, &images(FULL)).unwrap();
    assert_eq!(sel.target, Target::ptx(80));
    assert_eq!(
        sel.reason,
        Reason::PtxJit {
            isa: (9, 0),
            min_driver: v("13.0"),
            forced: true
        }
    );
    check(
        dev("9.0", false, "12.8"),
        Policy::PtxOnly,
        FULL,
        Err("ptx-only"),
    );
    check(
        d,
        Policy::SassOnly,
        "sm_80 compute_80@9.0",
        Err("needs SASS sm_90 (policy sass-only"),
    );
    let sel = select_image(&d, Policy::Auto, &images("sm_80 compute_80@9.0")).unwrap();
    assert_eq!(
        sel.reason,
        Reason::PtxJit {
            isa: (9, 0),
            min_driver: v("13.0"),
            forced: false
        }
    );
}

#[test]
fn registries_with_fewer_targets() {
    let rows: &[(&str, bool, &str, &str, Want)] = &[
        // Desktop minor-version compatibility: highest lower minor of the same major.
        ("8.6", false, "13.0", "sm_80 compute_80@9.0", Ok("sm_80")),
        (
            "8.9",
            false,
            "12.4",
            "sm_80 sm_86 compute_80@9.0",
            Ok("sm_86"),
        ),
        (
            "8.7",
            false,
            "12.8",
            "sm_80 sm_86 compute_80@9.0",
            Ok("sm_86"),
        ),
        ("10.3", false, "12.8", "sm_100 compute_80@9.0", Ok("sm_100")),
        ("12.1", false, "12.8", "sm_120 compute_80@9.0", Ok("sm_120")),
        // Never a higher minor.
        (
            "8.0",
            false,
            "13.0",
            "sm_86 compute_80@9.0",
            Ok("compute_80"),
        ),
        // Integrated: no minor-version cubin compatibility; PTX instead (Orin, Thor, Spark-like).
        (
            "8.7",
            true,
            "13.0",
            "sm_80 sm_86 compute_80@9.0",
            Ok("compute_80"),
        ),
        (
            "8.7",
            true,
            "12.8",
            "sm_80 sm_86 compute_80@9.0",
            Err("needs SASS for exactly sm_87"),
        ),
        (
            "12.1",
            true,
            "13.0",
            "sm_120 compute_80@9.0",
            Ok("compute_80"),
        ),
        // Never across a major, whatever the variant.
        (
            "11.0",
            true,
            "13.0",
            "sm_80 sm_90 sm_100 sm_103 sm_100f compute_80@9.0",
            Ok("compute_80"),
        ),
        (
            "11.0",
            true,
            "12.8",
            "sm_80 sm_90 sm_100 sm_103 compute_80@9.0",
            Err("needs driver >= 13.0"),
        ),
        (
            "9.0",
            false,
            "13.0",
            "sm_80 sm_86 sm_87 sm_89 compute_80@9.0",
            Ok("compute_80"),
        ),
        // H200 on a 12.8 driver with nvcc-13 PTX: nothing runs, and the message says what would.
        (
            "9.0",
            false,
            "12.8",
            "sm_80 compute_80@9.0",
            Err("needs SASS sm_90, or PTX compute_XY with XY <= 90 and .version <= 8.7"),
        ),
        (
            "9.0",
            false,
            "12.8",
            "sm_80 compute_80@9.0",
            Err("present [sm_80, compute_80 (PTX 9.0)]"),
        ),
        // Only PTX: 8.7 integrated without sm_87 takes PTX, never sm_80.
        (
            "8.7",
            true,
            "13.0",
            "sm_80 compute_80@9.0",
            Ok("compute_80"),
        ),
        ("9.0", false, "13.0", "compute_80@9.0", Ok("compute_80")),
        ("9.0", false, "13.0", "", Err("present [none]")),
    ];
    for &(cap, integrated, driver, imgs, want) in rows {
        check(dev(cap, integrated, driver), Policy::Auto, imgs, want);
    }
}

#[test]
fn arch_specific_and_family_variants() {
    let rows: &[(&str, bool, &str, Want)] = &[
        // `a`: exactly its capability, and preferred over the baseline there.
        ("9.0", false, "sm_90 sm_90a", Ok("sm_90a")),
        ("9.0", false, "sm_90a", Ok("sm_90a")),
        ("10.3", false, "sm_100a compute_80@9.0", Ok("compute_80")),
        // `f`: the family, same major and minor >= its own, integrated members included.
        ("10.0", false, "sm_100f", Ok("sm_100f")),
        ("10.3", false, "sm_100f", Ok("sm_100f")),
        ("10.3", false, "sm_100f sm_103", Ok("sm_103")),
        ("12.1", true, "sm_120f compute_80@9.0", Ok("sm_120f")),
        ("12.1", true, "sm_120 compute_80@9.0", Ok("compute_80")),
        (
            "11.0",
            true,
            "sm_100f",
            Err("needs SASS for exactly sm_110"),
        ),
        ("12.0", false, "sm_121f compute_80@9.0", Ok("compute_80")),
        // PTX `compute_XYa` only on exactly X.Y; highest virtual arch wins.
        (
            "9.0",
            false,
            "compute_80@9.0 compute_90a@9.0",
            Ok("compute_90a"),
        ),
        (
            "10.0",
            false,
            "compute_80@9.0 compute_90a@9.0",
            Ok("compute_80"),
        ),
        (
            "10.0",
            false,
            "compute_80@9.0 compute_90@9.0",
            Ok("compute_90"),
        ),
        (
            "10.3",
            false,
            "compute_80@9.0 compute_100f@9.0",
            Ok("compute_100f"),
        ),
        (
            "12.0",
            false,
            "compute_80@9.0 compute_100f@9.0",
            Ok("compute_80"),
        ),
    ];
    for &(cap, integrated, imgs, want) in rows {
        check(dev(cap, integrated, "13.0"), Policy::Auto, imgs, want);
    }
}

#[test]
fn ptx_isa_is_checked_against_the_driver() {
    let rows: &[(&str, &str, Want)] = &[
        // CUDA 12.6's ISA 8.5 needs 12.5: fine on 12.8, refused on 12.4.
        ("12.8", "compute_80@8.5", Ok("compute_80")),
        (
            "12.4",
            "compute_80@8.5",
            Err("compute_80 has PTX ISA 8.5, which needs driver >= 12.5"),
        ),
        // The highest arch whose ISA the driver knows, not the highest arch.
        ("12.8", "compute_80@8.5 compute_90@9.0", Ok("compute_80")),
        ("13.0", "compute_80@8.5 compute_90@9.0", Ok("compute_90")),
        ("13.0", "compute_80@9.1", Err("needs driver >= 13.1")),
        ("13.1", "compute_80@9.1", Ok("compute_80")),
        // An ISA newer than our table, or none recorded: refuse rather than guess.
        (
            "13.1",
            "compute_80@9.9",
            Err("PTX ISA 9.9, which this dispatcher does not know"),
        ),
        ("13.1", "compute_80", Err("no recorded .version")),
    ];
    for &(driver, imgs, want) in rows {
        check(dev("9.0", false, driver), Policy::Auto, imgs, want);
    }
}

#[test]
fn isa_driver_table_matches_the_doc() {
    let table = [
        ((8, 0), "12.0"),
        ((8, 4), "12.4"),
        ((8, 5), "12.5"),
        ((8, 6), "12.7"),
        ((8, 7), "12.8"),
        ((8, 8), "12.9"),
        ((9, 0), "13.0"),
        ((9, 1), "13.1"),
    ];
    for (isa, driver) in table {
        assert_eq!(min_driver_for_ptx_isa(isa), Some(v(driver)), "{isa:?}");
    }
    assert_eq!(min_driver_for_ptx_isa((9, 2)), None);
    assert_eq!(max_ptx_isa_for_driver(v("12.4")), Some((8, 4)));
    assert_eq!(max_ptx_isa_for_driver(v("12.6")), Some((8, 5)));
    assert_eq!(max_ptx_isa_for_driver(v("12.8")), Some((8, 7)));
    assert_eq!(max_ptx_isa_for_driver(v("13.0")), Some((9, 0)));
    assert_eq!(max_ptx_isa_for_driver(v("14.2")), Some((9, 1)));
    assert_eq!(max_ptx_isa_for_driver(v("10.2")), None);
}

#[test]
fn versions_parse_strictly() {
    assert_eq!(v("11.0"), Version::new(11, 0));
    assert_eq!(Version::from_driver_int(13000), v("13.0"));
    assert_eq!(Version::from_driver_int(12080), v("12.8"));
    assert_eq!(v("8.7").sm(), 87);
    for bad in ["11", "11.", ".0", "11.10", "x.0", "11.0.1", "", "-1.0"] {
        let err = bad.parse::<Version>().unwrap_err();
        assert!(
            err.to_string().contains("expected MAJOR.MINOR"),
            "{bad}: {err}"
        );
    }
}
