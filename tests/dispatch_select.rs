//! The selection table: which image every device/driver pair gets from a given image set.
//! Pure; runs without a GPU (CI).

use aot_kernels::dispatch::select::{max_ptx_isa_for_driver, min_driver_for_ptx_isa};
use aot_kernels::dispatch::{
    min_driver_for_image, select_image, DeviceSpec, ImageCandidate, Policy, Reason, Version,
};
use fatbin_verify::{CudaRelease, Target};

const DRIVERS: [&str; 7] = ["12.0", "12.4", "12.6", "12.8", "12.9", "13.0", "13.1"];

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

/// `"sm_80 sm_90a compute_80@9.0 12.9/sm_87"`: SASS by name, PTX with its `.version` after `@`,
/// made by CUDA 13.0 unless a `RELEASE/` prefix names another toolchain.
fn images(spec: &str) -> Vec<ImageCandidate> {
    spec.split_whitespace()
        .map(|item| {
            let (toolchain, item) = match item.split_once('/') {
                Some((t, rest)) => (t.parse::<CudaRelease>().unwrap(), rest),
                None => (CudaRelease::new(13, 0), item),
            };
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
                toolchain,
            }
        })
        .collect()
}

/// What the manifest builds today: ten SASS targets and compute_80 PTX from nvcc 13.0 (ISA 9.0),
/// and the same but sm_110 from NVRTC 12.9 (ISA 8.8).
const FULL: &str = "sm_80 sm_86 sm_87 sm_89 sm_90 sm_100 sm_103 sm_110 sm_120 sm_121 compute_80@9.0 \
     12.9/sm_80 12.9/sm_86 12.9/sm_87 12.9/sm_89 12.9/sm_90 12.9/sm_100 12.9/sm_103 12.9/sm_120 12.9/sm_121 12.9/compute_80@8.8";

/// Expected outcome: `Ok(target)` (`12.9/` prefixed when not CUDA 13.0's) or `Err(substring of
/// the message)`.
type Want = Result<&'static str, &'static str>;

fn check(device: DeviceSpec, policy: Policy, imgs: &str, want: Want) {
    let cands = images(imgs);
    let got = select_image(&device, policy, &cands);
    match (&got, want) {
        (Ok(sel), Ok(t)) => {
            let name = if sel.toolchain == CudaRelease::new(13, 0) {
                sel.target.to_string()
            } else {
                format!("{}/{}", sel.toolchain, sel.target)
            };
            assert_eq!(name, t, "{device} {policy} [{imgs}]");
            let chosen = cands[sel.index];
            assert_eq!(
                (chosen.target, chosen.toolchain),
                (sel.target, sel.toolchain),
                "index points at the chosen image"
            );
            assert_eq!(Ok(sel.min_driver), min_driver_for_image(&chosen));
            assert!(sel.min_driver <= device.driver, "{device}: {sel:?}");
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
fn full_registry_on_every_driver_and_capability() {
    // Columns: drivers 12.0, 12.4, 12.6, 12.8, 12.9, 13.0, 13.1. A 12.x driver cannot run CUDA 13
    // output, so it gets CUDA 12.9's SASS; 13.x drivers get CUDA 13.0's. Thor (11.0) has no
    // CUDA 12 SASS: on 12.x only CUDA 12.9's PTX, which needs a 12.9 driver.
    const C12: &str = "CUDA 12 SASS";
    let rows: &[(&str, bool, [&str; 7])] = &[
        ("8.0", false, [C12, C12, C12, C12, C12, "sm_80", "sm_80"]),
        ("8.7", true, [C12, C12, C12, C12, C12, "sm_87", "sm_87"]),
        ("8.9", false, [C12, C12, C12, C12, C12, "sm_89", "sm_89"]),
        ("9.0", false, [C12, C12, C12, C12, C12, "sm_90", "sm_90"]),
        ("10.0", false, [C12, C12, C12, C12, C12, "sm_100", "sm_100"]),
        (
            "11.0",
            true,
            [
                "ERR",
                "ERR",
                "ERR",
                "ERR",
                "12.9/compute_80",
                "sm_110",
                "sm_110",
            ],
        ),
        ("12.0", false, [C12, C12, C12, C12, C12, "sm_120", "sm_120"]),
        ("12.1", false, [C12, C12, C12, C12, C12, "sm_121", "sm_121"]),
    ];
    for &(cap, integrated, wants) in rows {
        let exact_cu12 = format!("12.9/sm_{}", v(cap).sm());
        for (driver, want) in DRIVERS.iter().zip(wants) {
            let d = dev(cap, integrated, driver);
            let want: Want = match want {
                C12 => Ok(exact_cu12.clone().leak()),
                "ERR" => Err("needs driver >= 12.9. Update the NVIDIA driver"),
                t => Ok(t),
            };
            check(d, Policy::Auto, FULL, want);
            let sel = select_image(&d, Policy::Auto, &images(FULL));
            if let Ok(sel) = sel {
                if !sel.target.virtual_arch {
                    assert_eq!(sel.reason, Reason::ExactSass, "{d}");
                    check(d, Policy::SassOnly, FULL, want);
                    // SASS needs its toolkit's major: 12.0 for CUDA 12, 13.0 for CUDA 13.
                    assert_eq!(sel.min_driver, Version::new(sel.toolchain.major, 0));
                }
            }
        }
    }
}

#[test]
fn ptx_only_takes_the_newest_ptx_the_driver_knows() {
    for (driver, want) in [
        ("12.0", Err("needs driver >= 12.9")),
        (
            "12.8",
            Err("compute_80 (CUDA 12.9, PTX 8.8) has PTX ISA 8.8, which needs driver >= 12.9"),
        ),
        ("12.9", Ok("12.9/compute_80")),
        ("13.0", Ok("compute_80")),
        ("13.1", Ok("compute_80")),
    ] {
        check(dev("9.0", false, driver), Policy::PtxOnly, FULL, want);
    }
}

#[test]
fn the_newest_toolchain_the_driver_accepts_wins_among_equals() {
    let rows: &[(&str, &str, &str, Want)] = &[
        ("9.0", "13.0", "12.9/sm_90 sm_90", Ok("sm_90")),
        ("9.0", "12.9", "12.9/sm_90 sm_90", Ok("12.9/sm_90")),
        // Exact SASS of an older toolchain beats compatible SASS or PTX of a newer one.
        ("8.9", "13.0", "sm_86 12.9/sm_89", Ok("12.9/sm_89")),
        ("9.0", "13.0", "12.9/sm_90 compute_80@9.0", Ok("12.9/sm_90")),
        // Compatible SASS: the nearest minor first, then the newest toolchain.
        ("8.9", "13.0", "12.9/sm_86 sm_86 12.9/sm_80", Ok("sm_86")),
        (
            "8.9",
            "12.6",
            "12.9/sm_86 sm_86 12.9/sm_80",
            Ok("12.9/sm_86"),
        ),
        // PTX: the highest architecture the driver can load, then the newest toolchain.
        (
            "9.0",
            "13.0",
            "12.9/compute_80@8.8 compute_80@9.0",
            Ok("compute_80"),
        ),
        (
            "9.0",
            "12.9",
            "12.9/compute_80@8.8 compute_80@9.0",
            Ok("12.9/compute_80"),
        ),
        (
            "9.0",
            "12.9",
            "12.9/compute_80@8.8 compute_90@9.0",
            Ok("12.9/compute_80"),
        ),
        // CUDA 13 output needs a 13.x driver even where its PTX ISA alone would not.
        ("9.0", "12.9", "compute_80@8.8", Err("needs driver >= 13.0")),
        (
            "9.0",
            "12.9",
            "sm_90",
            Err("sm_90 (CUDA 13.0) needs driver >= 13.0"),
        ),
    ];
    for &(cap, driver, imgs, want) in rows {
        check(dev(cap, false, driver), Policy::Auto, imgs, want);
    }
}

#[test]
fn min_driver_per_image() {
    let rows: &[(&str, Result<&str, &str>)] = &[
        ("sm_90", Ok("13.0")),
        ("12.9/sm_90", Ok("12.0")),
        ("12.9/sm_90a", Ok("12.0")),
        ("12.9/compute_80@8.8", Ok("12.9")),
        ("12.6/compute_80@8.5", Ok("12.5")),
        ("compute_80@9.0", Ok("13.0")),
        ("compute_80@9.1", Ok("13.1")),
        ("compute_80", Err("no recorded .version")),
        ("compute_80@9.9", Err("does not know")),
    ];
    for &(img, want) in rows {
        let c = images(img)[0];
        match (min_driver_for_image(&c), want) {
            (Ok(got), Ok(w)) => assert_eq!(got, v(w), "{img}"),
            (Err(e), Err(needle)) => assert!(e.contains(needle), "{img}: {e}"),
            (got, want) => panic!("{img}: got {got:?}, want {want:?}"),
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
    // A 12.9 driver takes CUDA 12.9's PTX (ISA 8.8); older ones know neither ISA.
    check(
        dev("13.0", false, "12.9"),
        Policy::Auto,
        FULL,
        Ok("12.9/compute_80"),
    );
    for driver in ["12.4", "12.8"] {
        check(
            dev("13.0", false, driver),
            Policy::Auto,
            FULL,
            Err("needs driver >= 12.9"),
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
    assert_eq!(sel.toolchain, CudaRelease::new(13, 0));
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
            "12.9/sm_80 12.9/sm_86 12.9/compute_80@8.8",
            Ok("12.9/sm_86"),
        ),
        (
            "8.7",
            false,
            "12.8",
            "12.9/sm_80 12.9/sm_86 12.9/compute_80@8.8",
            Ok("12.9/sm_86"),
        ),
        (
            "10.3",
            false,
            "12.8",
            "12.9/sm_100 12.9/compute_80@8.8",
            Ok("12.9/sm_100"),
        ),
        ("12.1", false, "13.0", "sm_120 compute_80@9.0", Ok("sm_120")),
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
            Err("present [CUDA 13.0: sm_80, compute_80 (PTX 9.0)]"),
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
        ("12.8", "12.6/compute_80@8.5", Ok("12.6/compute_80")),
        (
            "12.4",
            "12.6/compute_80@8.5",
            Err("compute_80 (CUDA 12.6, PTX 8.5) has PTX ISA 8.5, which needs driver >= 12.5"),
        ),
        // The highest arch whose ISA the driver knows, not the highest arch.
        (
            "12.8",
            "12.6/compute_80@8.5 compute_90@9.0",
            Ok("12.6/compute_80"),
        ),
        (
            "13.0",
            "12.6/compute_80@8.5 compute_90@9.0",
            Ok("compute_90"),
        ),
        ("13.0", "13.1/compute_80@9.1", Err("needs driver >= 13.1")),
        ("13.1", "13.1/compute_80@9.1", Ok("13.1/compute_80")),
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
