//! Rules the CUDA sources keep that the compiler does not check.
//!
//! bf16 is widened to fp32 with `aot::to_f32` / `aot::to_f32x2` (kernels/include/aot_common.cuh),
//! never with cuda_bf16.h's own conversions: for sm_90 and later those compile to code with which
//! the decode step ran 1.3% slower at eight rows on the H200 than the same kernels' sm_80 PTX
//! compiled for sm_90 (README.md, "Results on the H200"). A text search cannot see every path (a
//! call split over lines, an implicit conversion of a bf16 to float): tests/kernel_sass.rs checks
//! the SASS the compilers made.

use std::path::{Path, PathBuf};

/// cuda_bf16.h's bf16 -> fp32 conversions, each with the helper that replaces it.
const BANNED: &[(&str, &str)] = &[
    ("__bfloat162float", "aot::to_f32"),
    ("__bfloat1622float2", "aot::to_f32x2"),
    ("__low2float", "aot::to_f32x2(v).x"),
    ("__high2float", "aot::to_f32x2(v).y"),
];

/// Every CUDA source and header under kernels/ (the Triton sources are Python, their PTX
/// generated).
fn cuda_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            cuda_sources(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("cu" | "cuh")
        ) {
            out.push(path);
        }
    }
}

/// `line` without a `//` comment (the sources use no `/* */` comments on code lines).
fn code_part(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

/// Every use of a banned conversion in `text`, as "file:line: name (use helper)".
fn banned_uses(file: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = code_part(line);
        for (name, helper) in BANNED {
            if code.contains(&format!("{name}(")) {
                found.push(format!("{file}:{}: {name} (use {helper})", n + 1));
            }
        }
    }
    found
}

#[test]
fn kernels_widen_bf16_with_the_aot_helpers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    cuda_sources(&root.join("kernels"), &mut files);
    assert!(
        files.len() >= 10,
        "found only {} CUDA sources under kernels/",
        files.len()
    );
    let mut found = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        found.extend(banned_uses(&rel, &text));
    }
    assert!(
        found.is_empty(),
        "bf16 widened with cuda_bf16.h's conversions (slower SASS on sm_90 and later; see \
         kernels/include/aot_common.cuh):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_rule_finds_code_and_skips_comments() {
    let text = "// __bfloat162float(x) in a comment\n\
                float a = __bfloat162float(x);  // widened\n\
                float2 b = __bfloat1622float2(p);\n\
                float c = aot::to_f32(x);\n\
                float d = __high2float(p) + __low2float(p);\n";
    assert_eq!(
        banned_uses("k.cu", text),
        vec![
            "k.cu:2: __bfloat162float (use aot::to_f32)",
            "k.cu:3: __bfloat1622float2 (use aot::to_f32x2)",
            "k.cu:5: __low2float (use aot::to_f32x2(v).x)",
            "k.cu:5: __high2float (use aot::to_f32x2(v).y)",
        ]
    );
}
