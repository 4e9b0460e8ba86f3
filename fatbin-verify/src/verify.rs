//! Checking images against the manifest (which modules, entries, toolchains and targets) and the
//! lock (exact sha256 and size): every promised image present and exact, nothing unexpected.
//!
//! Each image's toolchain is read from the image itself ([`ImageInfo::cuda`]: the toolkit string,
//! else the cubin ELF ABI or PTX ISA major) and matched to the manifest's toolchains.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::fatbin::ImageKind;
use crate::image::{describe_source, sha256_hex, ImageInfo};
use crate::lock::Lock;
use crate::manifest::{Manifest, Module};
use crate::target::Target;
use crate::toolkit::CudaRelease;

/// One way the images differ from what the manifest and lock promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discrepancy {
    /// The module it concerns, when one could be named.
    pub module: Option<String>,
    pub target: Option<Target>,
    /// The toolchain (CUDA release) of the image, when one could be named.
    pub toolchain: Option<CudaRelease>,
    /// What is wrong, with the file and image it was found in.
    pub message: String,
}

impl fmt::Display for Discrepancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let toolchain = self
            .toolchain
            .map(|c| format!(" (CUDA {c})"))
            .unwrap_or_default();
        match (&self.module, &self.target) {
            (Some(m), Some(t)) => write!(f, "{m} {t}{toolchain}: {}", self.message),
            (Some(m), None) => write!(f, "{m}{toolchain}: {}", self.message),
            (None, Some(t)) => write!(f, "{t}{toolchain}: {}", self.message),
            (None, None) => write!(f, "{}", self.message),
        }
    }
}

/// The images of one input file.
#[derive(Debug, Clone)]
pub struct FileImages {
    pub name: String,
    pub images: Vec<ImageInfo>,
}

/// Every discrepancy between the images of `files` and the manifest (and lock, if given);
/// empty when everything holds.
///
/// Each file is checked on its own: it must carry every promised (module, target) image. A file
/// may hold identical copies of an image (an rlib keeps one in its metadata and one in its object
/// code); a copy that differs from the first is reported.
pub fn verify(manifest: &Manifest, lock: Option<&Lock>, files: &[FileImages]) -> Vec<Discrepancy> {
    let mut out = Vec::new();
    for file in files {
        // (module, target) -> where it was first seen in this file and its hash.
        let mut seen: Seen = BTreeMap::new();
        let owners = identify_modules(manifest, lock, &file.images);
        for (image, owner) in file.images.iter().zip(owners) {
            let place = format!("{} {}", file.name, describe_source(&image.source));
            let Some(module) = owner else {
                out.push(Discrepancy {
                    module: None,
                    target: image.target,
                    toolchain: image.cuda,
                    message: format!(
                        "unexpected {} image in {place} (kernels {:?}) belongs to no manifest module",
                        image.kind.name(),
                        image.kernels
                    ),
                });
                continue;
            };
            check_image(manifest, lock, module, image, &place, &mut seen, &mut out);
        }
        for module in &manifest.modules {
            for (toolchain, target) in manifest.module_images(module) {
                if !seen.contains_key(&(module.name.clone(), toolchain, target)) {
                    out.push(Discrepancy {
                        module: Some(module.name.clone()),
                        target: Some(target),
                        toolchain: Some(toolchain),
                        message: format!("missing: {} holds no such image", file.name),
                    });
                }
            }
        }
    }
    out
}

/// Images already seen in one file: (module, toolchain, target) -> (where, sha256).
type Seen = BTreeMap<(String, CudaRelease, Target), (String, [u8; 32])>;

/// The manifest toolchain an image belongs to: the one whose release it records, or the only
/// one of the major it implies (or of its release's major: a 13.1 build checked against a 13.0
/// manifest). An image that records nothing belongs to a manifest's only toolchain.
pub fn image_toolchain(manifest: &Manifest, image: &ImageInfo) -> Option<CudaRelease> {
    let toolchains = manifest.toolchains();
    let unique = |fits: &dyn Fn(&CudaRelease) -> bool| {
        let mut it = toolchains.iter().filter(|t| fits(&t.cuda));
        match (it.next(), it.next()) {
            (Some(t), None) => Some(t.cuda),
            _ => None,
        }
    };
    match image.cuda {
        None => unique(&|_| true),
        Some(c) => unique(&|t| c.matches(t)).or_else(|| unique(&|t| t.major == c.major)),
    }
}

fn check_image<'m>(
    manifest: &'m Manifest,
    lock: Option<&Lock>,
    module: &'m Module,
    image: &ImageInfo,
    place: &str,
    seen: &mut Seen,
    out: &mut Vec<Discrepancy>,
) {
    let toolchain = image_toolchain(manifest, image);
    let mut report = |target: Option<Target>, message: String| {
        out.push(Discrepancy {
            module: Some(module.name.clone()),
            target,
            toolchain: toolchain.or(image.cuda),
            message,
        });
    };
    let Some(target) = image.target else {
        report(
            None,
            format!(
                "unexpected {} image without a target in {place}",
                image.kind.name()
            ),
        );
        return;
    };
    // The manifest promises SASS as cubins and the virtual target as PTX, nothing else.
    let expected_kind = if target.virtual_arch {
        ImageKind::Ptx
    } else {
        ImageKind::Elf
    };
    if image.kind != expected_kind {
        report(
            Some(target),
            format!("unexpected {} image in {place}", image.kind.name()),
        );
        return;
    }
    let Some(toolchain) = toolchain else {
        let names: Vec<String> = manifest
            .toolchains()
            .iter()
            .map(|t| t.cuda.to_string())
            .collect();
        report(
            Some(target),
            format!(
                "unexpected image in {place}: made by CUDA {}, which is none of the manifest's toolchains ({})",
                image.cuda.map_or("unknown".to_string(), |c| c.to_string()),
                names.join(", ")
            ),
        );
        return;
    };
    let promised = manifest
        .toolchain_for(toolchain)
        .map(|tc| manifest.module_targets_for(module, &tc))
        .unwrap_or_default();
    if !promised.contains(&target) {
        report(
            Some(target),
            format!("unexpected image in {place}: the manifest does not list this target for this toolchain"),
        );
        return;
    }
    match seen.get(&(module.name.clone(), toolchain, target)) {
        // An identical copy says nothing new.
        Some((_, first_sha)) if *first_sha == image.sha256 => return,
        Some((first, _)) => report(
            Some(target),
            format!("the copy in {place} differs from the one in {first}"),
        ),
        None => {
            seen.insert(
                (module.name.clone(), toolchain, target),
                (place.to_string(), image.sha256),
            );
        }
    }

    let have: BTreeSet<&str> = image.kernels.iter().map(String::as_str).collect();
    let want: BTreeSet<&str> = module.entries.iter().map(String::as_str).collect();
    if have != want {
        let missing: Vec<&str> = want.difference(&have).copied().collect();
        let extra: Vec<&str> = have.difference(&want).copied().collect();
        report(
            Some(target),
            format!("entries differ in {place}: missing {missing:?}, unexpected {extra:?}"),
        );
    }
    if let Some(lock) = lock {
        let hash = sha256_hex(&image.sha256);
        match lock.image(&module.name, toolchain, target) {
            None => report(Some(target), format!("image in {place} is not in the lock; run `make lock` if this target was added on purpose")),
            Some(locked) if locked.sha256 != hash || locked.size != image.size as u64 => report(
                Some(target),
                format!("sha256 {hash} ({} bytes) in {place}, lock has {} ({} bytes)", image.size, locked.sha256, locked.size),
            ),
            Some(_) => {}
        }
    }
}

/// The module each image belongs to. An image names its module by an exact lock hash, else by
/// its kernel names; an image that does neither (a corrupted one) takes the module most other
/// images of its container name, so a flipped byte still reports the right module and target.
fn identify_modules<'m>(
    manifest: &'m Manifest,
    lock: Option<&Lock>,
    images: &[ImageInfo],
) -> Vec<Option<&'m Module>> {
    let own: Vec<Option<&Module>> = images
        .iter()
        .map(|img| identify_one(manifest, lock, img))
        .collect();
    let mut votes: BTreeMap<ContainerKey, BTreeMap<&str, usize>> = BTreeMap::new();
    for (img, module) in images.iter().zip(&own) {
        if let Some(m) = module {
            *votes
                .entry(container_key(img))
                .or_default()
                .entry(m.name.as_str())
                .or_default() += 1;
        }
    }
    images
        .iter()
        .zip(own)
        .map(|(img, module)| {
            module.or_else(|| {
                let counts = votes.get(&container_key(img))?;
                let (name, _) = counts
                    .iter()
                    .max_by_key(|(name, n)| (**n, std::cmp::Reverse(**name)))?;
                manifest.module(name)
            })
        })
        .collect()
}

/// A container: its offset and, in archives, its member.
type ContainerKey<'a> = (Option<usize>, Option<&'a str>);

fn container_key(img: &ImageInfo) -> ContainerKey<'_> {
    (img.source.container_offset, img.source.member.as_deref())
}

fn identify_one<'m>(
    manifest: &'m Manifest,
    lock: Option<&Lock>,
    img: &ImageInfo,
) -> Option<&'m Module> {
    if let (Some(lock), Some(target), Some(toolchain)) =
        (lock, img.target, image_toolchain(manifest, img))
    {
        let hash = sha256_hex(&img.sha256);
        if let Some(m) = manifest.modules.iter().find(|m| {
            lock.image(&m.name, toolchain, target)
                .is_some_and(|l| l.sha256 == hash)
        }) {
            return Some(m);
        }
    }
    let have: BTreeSet<&str> = img.kernels.iter().map(String::as_str).collect();
    if have.is_empty() {
        return None;
    }
    if let Some(m) = manifest.modules.iter().find(|m| entries(m) == have) {
        return Some(m);
    }
    // Some but not all names match (a renamed or corrupted symbol): accept only one candidate.
    let mut overlapping = manifest
        .modules
        .iter()
        .filter(|m| !entries(m).is_disjoint(&have));
    match (overlapping.next(), overlapping.next()) {
        (Some(m), None) => Some(m),
        _ => None,
    }
}

fn entries(m: &Module) -> BTreeSet<&str> {
    m.entries.iter().map(String::as_str).collect()
}
