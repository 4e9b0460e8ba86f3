//! `aot-manifest.toml`: which kernel modules exist, their entry points, and the targets each is built for.
//!
//! The build script, the embedded registry, the runtime dispatcher and `fatbin-verify verify` all read
//! this one description. Parsing checks everything a build would otherwise trip over later (unknown
//! targets, duplicate modules, empty entry lists) and names the key and the fix.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::target::{Target, KNOWN_SM};
use crate::toolkit::CudaRelease;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub toolchain: Toolchain,
    pub targets: Targets,
    /// Toolchains whose images ship beside the primary one's, for drivers that cannot run the
    /// primary's output (`[[extra_toolchain]]`; CUDA 12.9 for drivers older than 13.0).
    #[serde(rename = "extra_toolchain", default)]
    pub extra_toolchains: Vec<ExtraToolchain>,
    #[serde(rename = "module", default)]
    pub modules: Vec<Module>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toolchain {
    /// CUDA release of the primary toolchain, e.g. "13.0"; images carry it as their toolchain.
    pub cuda: CudaRelease,
    /// Exact nvcc version (`V13.0.88` -> "13.0.88") the lock was made with.
    pub nvcc_version: String,
    /// PyPI requirements the set-up step installs.
    #[serde(default)]
    pub packages: Vec<String>,
    /// PyPI requirements for test oracles only.
    #[serde(default)]
    pub oracle_packages: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    /// Default SASS targets of every module.
    pub sass: Vec<Target>,
    /// The portable PTX fallback every module carries.
    pub ptx: Target,
}

/// A further toolchain: its release, compiler, pins and the targets it builds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraToolchain {
    /// CUDA release, e.g. "12.9": the toolchain every image it makes is keyed by.
    pub cuda: CudaRelease,
    /// The compiler front end the pinned packages provide.
    pub compiler: Compiler,
    /// Exact compiler version the lock was made with, e.g. "12.9.86".
    pub version: String,
    /// PyPI requirements the set-up step installs for it.
    #[serde(default)]
    pub packages: Vec<String>,
    /// SASS targets it builds for every `cuda` module (a module's own `targets` are cut to these SMs).
    pub sass: Vec<Target>,
    /// Its PTX fallback.
    pub ptx: Target,
}

/// How an extra toolchain compiles CUDA C++.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compiler {
    /// NVIDIA's runtime compilation library (`libnvrtc`), loaded by the build: the CUDA 12 wheels
    /// on PyPI carry it, but not the nvcc driver.
    Nvrtc,
}

/// One toolchain's share of the build, primary or extra.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolchainTargets<'a> {
    pub cuda: CudaRelease,
    /// Exact pinned compiler version.
    pub version: &'a str,
    pub sass: &'a [Target],
    pub ptx: Target,
    /// The `[toolchain]` (nvcc) rather than an `[[extra_toolchain]]`.
    pub primary: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModuleKind {
    /// CUDA C++ compiled by nvcc.
    Cuda,
    /// A kernel written in Triton, compiled ahead of time.
    Triton,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Module {
    pub name: String,
    pub kind: ModuleKind,
    /// Path of the kernel source, relative to the manifest's folder.
    pub source: PathBuf,
    /// Kernel entry points every image of the module must carry.
    pub entries: Vec<String>,
    /// Extra compiler flags for this module.
    #[serde(default)]
    pub flags: Vec<String>,
    /// SASS targets for this module instead of the default list (the PTX fallback is always added).
    #[serde(default)]
    pub targets: Option<Vec<Target>>,
    /// `false`: the module is a fast path for its own `targets` only (Hopper's wgmma, say). Its
    /// PTX, built like every module's, holds no working code, so where none of its SASS runs
    /// (another GPU, or the `ptx-only` policy) the dispatcher reports it unavailable and callers
    /// use a portable module. Needs `targets`.
    #[serde(default = "portable_default")]
    pub portable: bool,
}

fn portable_default() -> bool {
    true
}

/// A manifest that cannot be used, with the file, the key and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: cannot read the manifest: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

impl Manifest {
    pub fn from_path(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates manifest text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Self, ManifestError> {
        let manifest: Manifest = toml::from_str(text).map_err(|e| ManifestError::Syntax {
            path: origin.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        manifest.validate(origin)?;
        Ok(manifest)
    }

    fn validate(&self, origin: &Path) -> Result<(), ManifestError> {
        let invalid = |key: String, message: String| ManifestError::Invalid {
            path: origin.to_path_buf(),
            key,
            message,
        };
        check_targets("targets.sass", &self.targets.sass, false).map_err(|(k, m)| invalid(k, m))?;
        check_targets("targets.ptx", std::slice::from_ref(&self.targets.ptx), true)
            .map_err(|(k, m)| invalid(k, m))?;
        if self.modules.is_empty() {
            return Err(invalid(
                "module".into(),
                "no [[module]] entries; add at least one kernel module".into(),
            ));
        }
        let mut names = BTreeSet::new();
        for (i, module) in self.modules.iter().enumerate() {
            let key = |field: &str| format!("module[{i}] ({}).{field}", module.name);
            if !is_identifier(&module.name) {
                return Err(invalid(
                    format!("module[{i}].name"),
                    format!(
                        "`{}` is not a valid module name; use lowercase letters, digits and `_`",
                        module.name
                    ),
                ));
            }
            if !names.insert(module.name.as_str()) {
                return Err(invalid(
                    key("name"),
                    format!(
                        "duplicate module `{}`; each module name must appear once",
                        module.name
                    ),
                ));
            }
            if module.entries.is_empty() {
                return Err(invalid(
                    key("entries"),
                    "no entry points; list the kernels the module exports".into(),
                ));
            }
            let mut entries = BTreeSet::new();
            for entry in &module.entries {
                if !is_c_identifier(entry) {
                    return Err(invalid(
                        key("entries"),
                        format!("`{entry}` is not a C identifier"),
                    ));
                }
                if !entries.insert(entry) {
                    return Err(invalid(
                        key("entries"),
                        format!("entry `{entry}` is listed twice"),
                    ));
                }
            }
            if let Some(targets) = &module.targets {
                check_targets(&key("targets"), targets, false).map_err(|(k, m)| invalid(k, m))?;
            }
            if !module.portable && module.targets.is_none() {
                return Err(invalid(
                    key("portable"),
                    "`portable = false` needs the module's own `targets`: the SASS it runs as (everywhere else it is unavailable)".into(),
                ));
            }
        }
        let mut releases = BTreeSet::from([self.toolchain.cuda]);
        for (i, extra) in self.extra_toolchains.iter().enumerate() {
            let key = |field: &str| format!("extra_toolchain[{i}] ({}).{field}", extra.cuda);
            if !releases.insert(extra.cuda) {
                return Err(invalid(
                    key("cuda"),
                    format!(
                        "CUDA {} is named twice; each toolchain's release must differ from the others'",
                        extra.cuda
                    ),
                ));
            }
            if crate::toolkit::version_of_toolkit_string(&format!("V{}", extra.version)).is_none() {
                return Err(invalid(
                    key("version"),
                    format!(
                        "`{}` is not an exact version; write MAJOR.MINOR.PATCH, e.g. 12.9.86",
                        extra.version
                    ),
                ));
            }
            check_targets(&key("sass"), &extra.sass, false).map_err(|(k, m)| invalid(k, m))?;
            check_targets(&key("ptx"), std::slice::from_ref(&extra.ptx), true)
                .map_err(|(k, m)| invalid(k, m))?;
        }
        Ok(())
    }

    /// Every toolchain, the primary first.
    pub fn toolchains(&self) -> Vec<ToolchainTargets<'_>> {
        let primary = ToolchainTargets {
            cuda: self.toolchain.cuda,
            version: &self.toolchain.nvcc_version,
            sass: &self.targets.sass,
            ptx: self.targets.ptx,
            primary: true,
        };
        std::iter::once(primary)
            .chain(self.extra_toolchains.iter().map(|e| ToolchainTargets {
                cuda: e.cuda,
                version: &e.version,
                sass: &e.sass,
                ptx: e.ptx,
                primary: false,
            }))
            .collect()
    }

    /// The toolchain of this CUDA release, if the manifest names it.
    pub fn toolchain_for(&self, cuda: CudaRelease) -> Option<ToolchainTargets<'_>> {
        self.toolchains().into_iter().find(|t| t.cuda == cuda)
    }

    /// The targets `toolchain` builds the module for: the primary builds the module's SASS list
    /// (or the default) and its PTX; an extra toolchain builds `cuda` modules only, for the
    /// module's own targets whose SM its `sass` list holds (or its whole list), and its PTX.
    pub fn module_targets_for(&self, module: &Module, toolchain: &ToolchainTargets) -> Vec<Target> {
        if toolchain.primary {
            return self.module_targets(module);
        }
        if module.kind != ModuleKind::Cuda {
            return Vec::new();
        }
        let mut targets: Vec<Target> = match &module.targets {
            Some(own) => own
                .iter()
                .copied()
                .filter(|t| toolchain.sass.iter().any(|s| s.sm == t.sm))
                .collect(),
            None => toolchain.sass.to_vec(),
        };
        targets.push(toolchain.ptx);
        targets
    }

    /// Every image the module is built as, by (toolchain release, target), primary first.
    pub fn module_images(&self, module: &Module) -> Vec<(CudaRelease, Target)> {
        self.toolchains()
            .iter()
            .flat_map(|tc| {
                self.module_targets_for(module, tc)
                    .into_iter()
                    .map(|t| (tc.cuda, t))
            })
            .collect()
    }

    pub fn module(&self, name: &str) -> Option<&Module> {
        self.modules.iter().find(|m| m.name == name)
    }

    /// Every target the module is built for: its SASS list, then the PTX fallback.
    pub fn module_targets(&self, module: &Module) -> Vec<Target> {
        let mut targets = module
            .targets
            .clone()
            .unwrap_or_else(|| self.targets.sass.clone());
        targets.push(self.targets.ptx);
        targets
    }
}

fn check_targets(key: &str, targets: &[Target], want_ptx: bool) -> Result<(), (String, String)> {
    if targets.is_empty() {
        return Err((key.to_string(), "empty target list".into()));
    }
    let mut seen = BTreeSet::new();
    for t in targets {
        if !t.is_known() {
            let known: Vec<String> = KNOWN_SM.iter().map(|sm| format!("sm_{sm}")).collect();
            return Err((
                key.to_string(),
                format!(
                    "unknown target `{t}`: the pinned CUDA 13.0 toolchain builds {}; fix the name or pin a newer toolchain",
                    known.join(" ")
                ),
            ));
        }
        if t.virtual_arch != want_ptx {
            let want = if want_ptx {
                "a PTX target (`compute_NN`)"
            } else {
                "SASS targets (`sm_NN`)"
            };
            return Err((
                key.to_string(),
                format!("`{t}` is in the wrong list: this key takes {want}"),
            ));
        }
        if !seen.insert(*t) {
            return Err((key.to_string(), format!("target `{t}` is listed twice")));
        }
    }
    Ok(())
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && s.as_bytes()[0].is_ascii_lowercase()
}

fn is_c_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[toolchain]
cuda = "13.0"
nvcc_version = "13.0.88"

[targets]
sass = ["sm_80", "sm_110"]
ptx = "compute_80"

[[module]]
name = "rmsnorm"
kind = "cuda"
source = "kernels/norm/rmsnorm.cu"
entries = ["rmsnorm_bf16"]

[[module]]
name = "fast"
kind = "cuda"
source = "kernels/fast.cu"
entries = ["fast_kernel"]
targets = ["sm_90a"]
"#;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(text, Path::new("aot-manifest.toml"))
    }

    #[test]
    fn portable_defaults_to_true_and_false_needs_own_targets() {
        let m = parse(GOOD).unwrap();
        assert!(m.modules.iter().all(|m| m.portable));
        let fast = GOOD.replace(
            "targets = [\"sm_90a\"]",
            "targets = [\"sm_90a\"]\nportable = false",
        );
        let m = parse(&fast).unwrap();
        assert!(m.modules[0].portable && !m.modules[1].portable);
        // A fast path must say which SASS it runs as.
        let bad = GOOD.replace(
            "entries = [\"rmsnorm_bf16\"]",
            "entries = [\"rmsnorm_bf16\"]\nportable = false",
        );
        let err = parse(&bad).unwrap_err().to_string();
        assert!(
            err.contains("module[0] (rmsnorm).portable")
                && err.contains("needs the module's own `targets`"),
            "{err}"
        );
    }

    #[test]
    fn parses_modules_and_targets() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.modules.len(), 2);
        let names: Vec<String> = m
            .module_targets(&m.modules[0])
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(names, ["sm_80", "sm_110", "compute_80"]);
        let names: Vec<String> = m
            .module_targets(&m.modules[1])
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(names, ["sm_90a", "compute_80"]);
    }

    const EXTRA: &str = r#"
[[extra_toolchain]]
cuda = "12.9"
compiler = "nvrtc"
version = "12.9.86"
sass = ["sm_80", "sm_90"]
ptx = "compute_80"
"#;

    #[test]
    fn extra_toolchain_builds_its_own_list_and_cuts_module_lists_to_it() {
        let m = parse(&format!("{GOOD}{EXTRA}")).unwrap();
        let names = |v: Vec<(CudaRelease, Target)>| -> Vec<String> {
            v.iter().map(|(c, t)| format!("{c}:{t}")).collect()
        };
        assert_eq!(
            names(m.module_images(&m.modules[0])),
            [
                "13.0:sm_80",
                "13.0:sm_110",
                "13.0:compute_80",
                "12.9:sm_80",
                "12.9:sm_90",
                "12.9:compute_80"
            ]
        );
        // `fast` asks for sm_90a only: the extra toolchain builds it too (SM 90 is in its list).
        assert_eq!(
            names(m.module_images(&m.modules[1])),
            [
                "13.0:sm_90a",
                "13.0:compute_80",
                "12.9:sm_90a",
                "12.9:compute_80"
            ]
        );
        assert_eq!(m.toolchains().len(), 2);
        assert!(m.toolchain_for("12.9".parse().unwrap()).is_some());
    }

    #[test]
    fn extra_toolchain_mistakes_name_the_key() {
        let err = parse(&format!("{GOOD}{}", EXTRA.replace("\"12.9\"", "\"13.0\"")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("extra_toolchain[0] (13.0).cuda") && err.contains("named twice"),
            "{err}"
        );
        let err = parse(&format!("{GOOD}{}", EXTRA.replace("12.9.86", "12.9")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("(12.9).version") && err.contains("MAJOR.MINOR.PATCH"),
            "{err}"
        );
        let err = parse(&format!(
            "{GOOD}{}",
            EXTRA.replace("\"sm_90\"]", "\"sm_111\"]")
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("extra_toolchain[0] (12.9).sass: unknown target `sm_111`"),
            "{err}"
        );
        let err = parse(&format!("{GOOD}{}", EXTRA.replace("nvrtc", "clang")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("clang"), "{err}");
    }

    #[test]
    fn unknown_target_names_key_and_fix() {
        let err = parse(&GOOD.replace("\"sm_110\"", "\"sm_111\""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("targets.sass") && err.contains("sm_111") && err.contains("sm_110"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_module_is_rejected() {
        let err = parse(&GOOD.replace("name = \"fast\"", "name = \"rmsnorm\""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("module[1] (rmsnorm).name") && err.contains("duplicate module"),
            "{err}"
        );
    }

    #[test]
    fn ptx_in_sass_list_is_rejected() {
        let err = parse(&GOOD.replace("\"sm_80\", \"sm_110\"", "\"compute_80\""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("wrong list"), "{err}");
    }

    #[test]
    fn unknown_key_is_a_syntax_error() {
        let err = parse(&GOOD.replace(
            "kind = \"cuda\"\nsource = \"kernels/fast.cu\"",
            "kind = \"cuda\"\nsorce = \"x\"",
        ))
        .unwrap_err();
        assert!(matches!(err, ManifestError::Syntax { .. }), "{err}");
    }

    #[test]
    fn bad_entry_names_are_rejected() {
        let err = parse(&GOOD.replace("[\"fast_kernel\"]", "[\"fast kernel\"]"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a C identifier"), "{err}");
        let err = parse(&GOOD.replace("[\"fast_kernel\"]", "[]"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no entry points"), "{err}");
    }
}
