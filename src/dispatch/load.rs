//! Select, verify and load every module's image on a device; hand out functions by name; report
//! what really runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use fatbin_verify::{CudaRelease, Target};
use serde::Serialize;

use super::driver::{self, function_attributes, FunctionAttributes, OpenDevice};
use super::error::{translate, DispatchError};
use super::plan::select_for_module;
use super::policy::{PdlMode, Policy, ToolchainChoice, PDL_ENV};
use super::select::{DeviceSpec, Reason, Selection, Version};
use super::source::{parse_ptx_version, ImageBytes, ModuleSource};
use super::verify::{verify_image, verify_static_image, HashCheck};

/// One entry point as the driver sees it after loading.
#[derive(Debug, Clone, Serialize)]
pub struct EntryReport {
    pub entry: String,
    #[serde(flatten)]
    pub attributes: FunctionAttributes,
}

/// What was loaded for one module, why, and what it cost.
#[derive(Debug, Clone, Serialize)]
pub struct ModuleReport {
    pub module: String,
    pub target: Target,
    /// CUDA release of the toolchain that made the image.
    pub toolchain: CudaRelease,
    /// The oldest driver that loads it.
    pub min_driver: Version,
    pub reason: Reason,
    pub why: String,
    /// The driver compiled PTX at load.
    pub jit: bool,
    pub image_bytes: usize,
    pub sha256: String,
    /// Hashing cost in this load (0 when this process had already checked the image).
    pub hash_us: u64,
    pub hash_cached: bool,
    /// `cuModuleLoadData` wall time: a JIT when `jit` (cold unless the driver's cache has it).
    pub load_us: u64,
    pub entries: Vec<EntryReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub device_name: String,
    pub ordinal: usize,
    pub device: DeviceSpec,
    pub policy: Policy,
    /// The programmatic-launch mode asked for (`AOT_KERNELS_PDL`, or `with_pdl_mode`). It touches
    /// only modules whose image is sm_90+ on a GPU of capability 9.0 or later; `ptx-only`'s
    /// compute_80 PTX, for one, never launches programmatically whatever the mode.
    pub pdl: PdlMode,
    /// The modules whose launches may be programmatic under `pdl` here (where a launcher asks
    /// under `auto`, every launch under `all`): empty off Hopper, on an older driver, under
    /// `off`, or for images without `griddepcontrol` (`ptx-only`'s compute_80 PTX).
    pub pdl_modules: Vec<String>,
    pub modules: Vec<ModuleReport>,
}

impl LoadReport {
    /// The report of `module` (the image chosen and why, its load cost, its entries), if this
    /// load loaded it. [`LoadedKernels::module`] is the loaded module's driver handle.
    pub fn module(&self, module: &str) -> Option<&ModuleReport> {
        self.modules.iter().find(|m| m.module == module)
    }

    pub fn total_load_us(&self) -> u64 {
        self.modules.iter().map(|m| m.load_us).sum()
    }

    pub fn total_hash_us(&self) -> u64 {
        self.modules.iter().map(|m| m.hash_us).sum()
    }

    /// One row per entry point: the image chosen, load cost, and the driver's view of the code.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "loaded on device {} \"{}\": {}, policy {}",
            self.ordinal, self.device_name, self.device, self.policy
        );
        let _ = writeln!(
            out,
            "{:<12} {:<26} {:<11} {:<5} {:<8} {:<4} {:>9} {:>8} {:>4} {:>6} {:>4} {:>4}  why",
            "module",
            "entry",
            "image",
            "cuda",
            "driver>=",
            "jit",
            "load_us",
            "hash_us",
            "regs",
            "smem",
            "bin",
            "ptx"
        );
        for m in &self.modules {
            for e in &m.entries {
                let a = &e.attributes;
                let hash = if m.hash_cached {
                    "cached".to_string()
                } else {
                    m.hash_us.to_string()
                };
                let _ = writeln!(
                    out,
                    "{:<12} {:<26} {:<11} {:<5} {:<8} {:<4} {:>9} {:>8} {:>4} {:>6} {:>4} {:>4}  {}",
                    m.module,
                    e.entry,
                    m.target.to_string(),
                    m.toolchain.to_string(),
                    m.min_driver.to_string(),
                    if m.jit { "yes" } else { "no" },
                    m.load_us,
                    hash,
                    a.registers,
                    a.shared_bytes,
                    a.binary_version,
                    a.ptx_version,
                    m.why
                );
            }
        }
        let _ = writeln!(
            out,
            "total: load {} us, hash {} us (bin/ptx: CU_FUNC_ATTRIBUTE_BINARY_VERSION / PTX_VERSION)",
            self.total_load_us(),
            self.total_hash_us()
        );
        let _ = writeln!(
            out,
            "programmatic launch ({}={}): {}",
            PDL_ENV,
            self.pdl.as_str(),
            if self.pdl_modules.is_empty() {
                "none here".to_string()
            } else {
                self.pdl_modules.join(", ")
            }
        );
        out
    }
}

struct LoadedModule {
    module: Arc<CudaModule>,
    functions: BTreeMap<String, CudaFunction>,
}

/// Every module's chosen image, loaded into one context, and the stream this handle launches on:
/// what the typed launchers (`crate::ops`) take. Every launcher launches on its handle's stream;
/// [`LoadedKernels::on_stream`] gives a handle on another stream of the same context that shares
/// the loaded modules (as a cuBLAS handle takes `cublasSetStream`), so an engine launches on its
/// own streams without loading anything twice. `Send + Sync`: handles may move to other threads
/// and be shared; launches on one stream are ordered, across streams the engine orders them.
pub struct LoadedKernels {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Arc<BTreeMap<String, LoadedModule>>,
    report: LoadReport,
    sm_count: usize,
    /// Modules whose loaded image holds `griddepcontrol.wait` on a GPU that has it; the mode
    /// (`report.pdl`) says which of their launches are programmatic.
    pdl_capable: std::collections::BTreeSet<String>,
    /// Modules whose loaded image is sm_90+ code on a GPU with thread-block clusters.
    cluster_capable: std::collections::BTreeSet<String>,
    smem_limits: SmemLimits,
    /// Dynamic shared memory each function has been allowed (beyond the default), by entry
    /// (shared by every handle of these modules: the attribute belongs to the function).
    smem_allowed: Arc<Mutex<BTreeMap<(String, String), usize>>>,
    /// Whether a cluster launch of an entry can be placed, by (module, entry, threads, shared
    /// memory, cluster size): [`LoadedKernels::cluster_fits`].
    cluster_fit: Arc<Mutex<ClusterFits>>,
}

/// Whether a cluster launch fits, by (module, entry, threads a block, shared memory bytes,
/// cluster size).
type ClusterFits = BTreeMap<(String, String, u32, u32, u32), bool>;

// The handles cross threads: checked at compile time.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<LoadedKernels>();
};

impl std::fmt::Debug for LoadedKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedKernels")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl LoadedKernels {
    /// The function `entry` of `module`, as loaded for this device.
    pub fn function(&self, module: &str, entry: &str) -> Result<CudaFunction, DispatchError> {
        let m = self
            .modules
            .get(module)
            .ok_or_else(|| DispatchError::UnknownModule {
                module: module.to_string(),
                known: self.modules.keys().cloned().collect::<Vec<_>>().join(", "),
            })?;
        m.functions
            .get(entry)
            .cloned()
            .ok_or_else(|| DispatchError::UnknownEntry {
                module: module.to_string(),
                entry: entry.to_string(),
                known: m.functions.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// The loaded module handle (for globals), if `module` is loaded; [`LoadReport::module`] is
    /// its report.
    pub fn module(&self, module: &str) -> Option<&Arc<CudaModule>> {
        self.modules.get(module).map(|m| &m.module)
    }

    /// The target of the image `module` runs from (an exact or compatible SASS, or PTX the driver
    /// compiled), if `module` is loaded: what a launcher asks before taking a path that only some
    /// images hold (an sm_90 one, say), and what its errors name.
    pub fn loaded_target(&self, module: &str) -> Option<fatbin_verify::Target> {
        self.report.module(module).map(|m| m.target)
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream this handle's launches go to: the backend's own (created with the kernels,
    /// non-blocking), or the one given to [`Self::on_stream`].
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A handle on `stream` sharing these loaded modules: every launcher given it launches on
    /// `stream`. The stream must belong to the context the kernels were loaded in (an error names
    /// both devices otherwise). Nothing is loaded again; the handle costs a few small copies.
    ///
    /// ```no_run
    /// use aot_kernels::dispatch::{load_all, Policy};
    ///
    /// let kernels = load_all(Policy::Auto)?;
    /// let mine = kernels.context().new_stream()?; // the engine's own stream
    /// let on_mine = kernels.on_stream(mine.clone())?;
    /// assert!(std::sync::Arc::ptr_eq(on_mine.stream(), &mine));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_stream(&self, stream: Arc<CudaStream>) -> Result<LoadedKernels, DispatchError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(DispatchError::ForeignStream {
                kernels: self.ctx.ordinal(),
                stream: stream.context().ordinal(),
            });
        }
        Ok(LoadedKernels {
            ctx: self.ctx.clone(),
            stream,
            modules: self.modules.clone(),
            report: self.report.clone(),
            sm_count: self.sm_count,
            pdl_capable: self.pdl_capable.clone(),
            cluster_capable: self.cluster_capable.clone(),
            smem_limits: self.smem_limits,
            smem_allowed: self.smem_allowed.clone(),
            cluster_fit: self.cluster_fit.clone(),
        })
    }

    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    pub fn device(&self) -> &DeviceSpec {
        &self.report.device
    }

    /// Streaming multiprocessors of the device.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// Whether every launch of `module` is programmatic (`PdlMode::All`): the GPU is Hopper or
    /// later with a driver of [`PDL_MIN_DRIVER`] or later, and the loaded image was compiled for
    /// sm_90 or later (its code then holds the `griddepcontrol.wait` the attribute requires; the
    /// compute_80 PTX does not).
    pub fn programmatic_launch(&self, module: &str) -> bool {
        self.report.pdl == PdlMode::All && self.pdl_capable.contains(module)
    }

    /// Whether a launcher may launch kernels of `module` programmatically where it asks for it
    /// (the launches that read something before `griddepcontrol.wait`:
    /// [`crate::ops::gemv::gemv_with`] and [`crate::ops::attention::attention_decode`] with
    /// `overlap_previous`, and every launch of a Triton image compiled with `launch_pdl`,
    /// [`crate::ops::triton::TritonKernel::launch`]): the same image condition as
    /// [`Self::programmatic_launch`], under the default `AOT_KERNELS_PDL=auto` or `all`.
    pub fn overlap_launch(&self, module: &str) -> bool {
        self.report.pdl != PdlMode::Off && self.pdl_capable.contains(module)
    }

    /// Whether kernels of `module` may be launched as thread-block clusters (and use distributed
    /// shared memory): the GPU is Hopper or later and the loaded image was compiled for sm_90 or
    /// later (the compute_80 PTX that `ptx-only` loads has no cluster code).
    pub fn cluster_launch(&self, module: &str) -> bool {
        self.cluster_capable.contains(module)
    }

    /// Whether `entry` of `module`, blocks of `threads` threads with `smem` bytes of dynamic shared
    /// memory, can run as clusters of `size` blocks here: [`Self::cluster_launch`], and the driver
    /// places at least one such cluster (`cuOccupancyMaxActiveClusters`; a GPU whose GPCs hold
    /// fewer free SMs than a cluster needs, a small Jetson or a MIG slice, cannot, and a launch would
    /// fail). A failed query counts as no. Asked of the driver once per (module, entry, threads, smem,
    /// size).
    pub fn cluster_fits(
        &self,
        module: &str,
        entry: &str,
        threads: u32,
        smem: usize,
        size: u32,
    ) -> bool {
        if !self.cluster_launch(module) {
            return false;
        }
        // Occupancy, hence whether the cluster can be placed, depends on the block size too.
        let key = (
            module.to_string(),
            entry.to_string(),
            threads,
            smem as u32,
            size,
        );
        if let Some(&fits) = self
            .cluster_fit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return fits;
        }
        let fits = self.allow_dynamic_smem(module, entry, smem).is_ok()
            && self.function(module, entry).is_ok_and(|f| {
                let cfg = cudarc::driver::LaunchConfig {
                    grid_dim: (1, 1, size),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: smem as u32,
                };
                match driver::max_active_clusters(&f, &self.stream, cfg, (1, 1, size)) {
                    Ok(n) => n > 0,
                    Err(e) => {
                        log::warn!(
                            "{module}/{entry}: cluster occupancy query failed ({e}); no clusters"
                        );
                        false
                    }
                }
            });
        if !fits {
            log::info!(
                "{module}/{entry}: a cluster of {size} blocks does not fit this GPU; no clusters"
            );
        }
        self.cluster_fit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, fits);
        fits
    }

    /// The same kernels under another programmatic-launch mode than `AOT_KERNELS_PDL` gave at load
    /// (an engine's own setting, or a test's).
    pub fn with_pdl_mode(mut self, mode: PdlMode) -> Self {
        self.report.pdl = mode;
        self.report.pdl_modules = pdl_modules(mode, &self.pdl_capable);
        self
    }

    /// The device's shared-memory limits, as read at load.
    pub fn smem_limits(&self) -> SmemLimits {
        self.smem_limits
    }

    /// Whether `blocks` blocks of `entry` (its static shared memory as loaded) with `dynamic`
    /// bytes of dynamic shared memory each fit one SM together, and one fits the per-block limit.
    /// False for an unknown entry.
    pub fn blocks_fit_smem(
        &self,
        module: &str,
        entry: &str,
        dynamic: usize,
        blocks: usize,
    ) -> bool {
        let static_bytes = self
            .report
            .module(module)
            .and_then(|m| m.entries.iter().find(|e| e.entry == entry))
            .map(|e| e.attributes.shared_bytes.max(0) as usize);
        static_bytes.is_some_and(|s| self.smem_limits.fits(s, dynamic, blocks))
    }

    /// Lets `entry` launch with `bytes` of dynamic shared memory: past 48 KiB (static included)
    /// the driver needs an explicit opt-in. Done once per function and size, so that launches
    /// inside a CUDA graph capture make no driver calls besides the launch.
    pub fn allow_dynamic_smem(
        &self,
        module: &str,
        entry: &str,
        bytes: usize,
    ) -> Result<(), DispatchError> {
        let key = (module.to_string(), entry.to_string());
        let mut allowed = self.smem_allowed.lock().unwrap_or_else(|p| p.into_inner());
        if allowed.get(&key).is_some_and(|&b| b >= bytes) {
            return Ok(());
        }
        let f = self.function(module, entry)?;
        let fail = |e| DispatchError::Function {
            module: module.to_string(),
            target: self
                .loaded_target(module)
                .unwrap_or(fatbin_verify::Target::ptx(80)),
            entry: entry.to_string(),
            failure: translate(e),
        };
        let static_bytes = f
            .get_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            )
            .map_err(fail)? as usize;
        let limit = self
            .ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(fail)?
            .max(0) as usize;
        if static_bytes + bytes > limit {
            return Err(DispatchError::SharedMemory {
                module: module.to_string(),
                entry: entry.to_string(),
                bytes: static_bytes + bytes,
                limit,
            });
        }
        if static_bytes + bytes > 48 * 1024 {
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(fail)?;
        }
        allowed.insert(key, bytes);
        Ok(())
    }
}

/// A device's shared memory, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SmemLimits {
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR`.
    pub per_sm: usize,
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`: static plus dynamic, one block.
    pub per_block: usize,
    /// `CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK`: what the system takes per block.
    pub reserved_per_block: usize,
}

impl SmemLimits {
    /// Whether `blocks` blocks of `static_bytes + dynamic` bytes each fit one SM together, and one
    /// fits the per-block limit. (H200: 233,472 a SM, 232,448 a block, 1,024 reserved; sm_120:
    /// 102,400, 101,376, 1,024.)
    pub fn fits(&self, static_bytes: usize, dynamic: usize, blocks: usize) -> bool {
        let block = static_bytes + dynamic;
        block <= self.per_block && blocks * (block + self.reserved_per_block) <= self.per_sm
    }
}

/// Whether the GPU and driver can run programmatic launches as the engine uses them.
pub fn pdl_device(device: &DeviceSpec) -> bool {
    device.capability.major >= 9 && device.driver >= PDL_MIN_DRIVER
}

/// `LoadReport::pdl_modules` under `mode`: the `capable` modules unless it is `off`.
fn pdl_modules(mode: PdlMode, capable: &std::collections::BTreeSet<String>) -> Vec<String> {
    match mode {
        PdlMode::Off => Vec::new(),
        PdlMode::Auto | PdlMode::All => capable.iter().cloned().collect(),
    }
}

/// Whether the GPU has thread-block clusters (Hopper and later; every driver our images need has
/// them: they came with CUDA 12.0).
pub fn cluster_device(device: &DeviceSpec) -> bool {
    device.capability.major >= 9
}

/// The modules whose loaded image is sm_90+ code (cluster instructions) on a GPU of capability 9.0
/// or later (thread-block clusters).
fn cluster_capable(
    device: &DeviceSpec,
    modules: &[ModuleReport],
) -> std::collections::BTreeSet<String> {
    sm90_modules(cluster_device(device), modules)
}

/// The oldest driver programmatic launch is used with: programmatic edges in CUDA graphs (the
/// decode step is captured into graphs) came with CUDA 12.3; older drivers are left out rather
/// than trusted (not measured on one).
pub const PDL_MIN_DRIVER: Version = Version::new(12, 3);

/// The modules whose loaded image holds `griddepcontrol.wait` (built for sm_90 or later) on a GPU
/// that has it (capability 9.0 or later) and a driver of [`PDL_MIN_DRIVER`] or later: the ones
/// programmatic launch may touch at all.
fn pdl_capable(
    device: &DeviceSpec,
    modules: &[ModuleReport],
) -> std::collections::BTreeSet<String> {
    sm90_modules(pdl_device(device), modules)
}

/// The modules whose loaded image was built for sm_90 or later, where `device_ok`; else none.
fn sm90_modules(device_ok: bool, modules: &[ModuleReport]) -> std::collections::BTreeSet<String> {
    if !device_ok {
        return Default::default();
    }
    modules
        .iter()
        .filter(|m| m.target.sm >= 90)
        .map(|m| m.module.clone())
        .collect()
}

/// Load every registry module on device 0 under `policy`, but those unavailable here by design
/// (see [`super::plan::plan`]: the CUDA-13-only Triton modules on a 12.x driver), which are logged and
/// left out; asking for one later names the module.
pub fn load_all(policy: Policy) -> Result<LoadedKernels, DispatchError> {
    let device = driver::open_device(0)?;
    load_available(&device, policy, &ModuleSource::registry())
}

/// Load the policy from `AOT_KERNELS_POLICY` (default auto) and the toolchain choice from
/// `AOT_KERNELS_TOOLCHAIN` (default newest), and every registry module on device 0 as
/// [`load_all`] does.
pub fn load_all_from_env() -> Result<LoadedKernels, DispatchError> {
    let policy = Policy::from_env()?;
    let choice = ToolchainChoice::from_env()?;
    let device = driver::open_device(0)?;
    load_available(&device, policy, &ModuleSource::registry_with(choice))
}

/// `modules` less those the plan finds unavailable by design, loaded on device 0.
pub fn load_available(
    device: &OpenDevice,
    policy: Policy,
    modules: &[ModuleSource],
) -> Result<LoadedKernels, DispatchError> {
    let plan = super::plan::plan(device.spec, policy, false, modules);
    let mut keep = Vec::with_capacity(modules.len());
    for (m, p) in modules.iter().zip(&plan.modules) {
        match &p.unavailable {
            // A fast path built for other GPUs is expected to be absent: its launcher runs the
            // portable kernel. A portable module missing is worth a warning.
            Some(why) => log::log!(
                if m.portable {
                    log::Level::Warn
                } else {
                    log::Level::Info
                },
                "aot-kernels: {} not loaded, unavailable here: {why}",
                m.name
            ),
            None => keep.push(m.clone()),
        }
    }
    load_modules(device, device.ctx.ordinal(), policy, &keep)
}

/// Select, verify and load one image per module on an open device. `modules` may be a subset
/// of the registry or carry altered images (tests): selection and checks are the same.
pub fn load_modules(
    device: &OpenDevice,
    ordinal: usize,
    policy: Policy,
    modules: &[ModuleSource],
) -> Result<LoadedKernels, DispatchError> {
    let pdl_mode = PdlMode::from_env()?;
    let mut loaded = BTreeMap::new();
    let mut reports = Vec::with_capacity(modules.len());
    for m in modules {
        let (lm, report) = load_module(device, policy, m)?;
        log::info!(
            "aot-kernels: {} -> {} of CUDA {} ({}), load {} us, hash {} us{}",
            report.module,
            report.target,
            report.toolchain,
            report.why,
            report.load_us,
            report.hash_us,
            if report.hash_cached { " (cached)" } else { "" }
        );
        loaded.insert(m.name.clone(), lm);
        reports.push(report);
    }
    let pdl_capable = pdl_capable(&device.spec, &reports);
    let cluster_capable = cluster_capable(&device.spec, &reports);
    let report = LoadReport {
        device_name: device.name.clone(),
        ordinal,
        device: device.spec,
        policy,
        pdl: pdl_mode,
        pdl_modules: pdl_modules(pdl_mode, &pdl_capable),
        modules: reports,
    };
    // A stream of our own rather than the legacy default stream: CUDA graphs cannot be captured
    // from the legacy stream, and ours does not synchronise with other work on the device.
    let stream = device.ctx.new_stream().map_err(|e| DispatchError::Device {
        ordinal,
        failure: translate(e),
    })?;
    let attribute = |a| {
        device
            .ctx
            .attribute(a)
            .map(|v| v.max(0) as usize)
            .map_err(|e| DispatchError::Device {
                ordinal,
                failure: translate(e),
            })
    };
    use cudarc::driver::sys::CUdevice_attribute as A;
    let smem_limits = SmemLimits {
        per_sm: attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
        per_block: attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        reserved_per_block: attribute(A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)?,
    };
    Ok(LoadedKernels {
        pdl_capable,
        cluster_capable,
        smem_limits,
        ctx: device.ctx.clone(),
        stream,
        modules: Arc::new(loaded),
        report,
        sm_count: device.sm_count,
        smem_allowed: Default::default(),
        cluster_fit: Default::default(),
    })
}

/// Everything that happens before the driver sees an image: selection, hash, PTX checks.
/// Returns the selection and the hash check's cost.
pub fn check_module(
    device: &DeviceSpec,
    policy: Policy,
    m: &ModuleSource,
) -> Result<(Selection, HashCheck), DispatchError> {
    if let Some(why) = super::plan::fast_path_unavailable(device, policy, m) {
        return Err(DispatchError::Unavailable {
            module: m.name.clone(),
            why,
        });
    }
    let sel = select_for_module(device, policy, m).map_err(|source| DispatchError::NoImage {
        module: m.name.clone(),
        source,
    })?;
    let img = &m.images[sel.index];
    let hash = match &img.bytes {
        ImageBytes::Static(b) => verify_static_image(&m.name, img.target, b, &img.sha256)?,
        ImageBytes::Owned(b) => verify_image(&m.name, img.target, b, &img.sha256)?,
    };
    if img.is_ptx() {
        let bytes = img.bytes.as_slice();
        // Selection trusted the recorded .version; make sure the text says the same.
        let found = parse_ptx_version(bytes);
        if found != img.ptx_version {
            let show =
                |v: Option<(u32, u32)>| v.map_or("none".to_string(), |(a, b)| format!("{a}.{b}"));
            return Err(DispatchError::PtxVersionMismatch {
                module: m.name.clone(),
                target: img.target,
                recorded: show(img.ptx_version),
                found: show(found),
            });
        }
        if bytes.contains(&0) {
            return Err(DispatchError::PtxHasNul {
                module: m.name.clone(),
                target: img.target,
            });
        }
    }
    Ok((sel, hash))
}

fn load_module(
    device: &OpenDevice,
    policy: Policy,
    m: &ModuleSource,
) -> Result<(LoadedModule, ModuleReport), DispatchError> {
    let (sel, hash) = check_module(&device.spec, policy, m)?;
    let (reason, img) = (sel.reason, &m.images[sel.index]);
    let start = Instant::now();
    let module =
        driver::load_image(&device.ctx, img.bytes.as_slice(), img.is_ptx()).map_err(|e| {
            DispatchError::Load {
                module: m.name.clone(),
                target: img.target,
                failure: translate(e),
            }
        })?;
    let load_us = start.elapsed().as_micros() as u64;

    let mut functions = BTreeMap::new();
    let mut entries = Vec::with_capacity(m.entries.len());
    for entry in &m.entries {
        let fn_err = |e| DispatchError::Function {
            module: m.name.clone(),
            target: img.target,
            entry: entry.clone(),
            failure: translate(e),
        };
        // cudarc would panic on a name with a NUL; the driver has no such function anyway.
        if entry.contains('\0') {
            return Err(fn_err(DriverError(CUresult::CUDA_ERROR_NOT_FOUND)));
        }
        let f = module.load_function(entry).map_err(fn_err)?;
        let attributes = function_attributes(&f).map_err(fn_err)?;
        entries.push(EntryReport {
            entry: entry.clone(),
            attributes,
        });
        functions.insert(entry.clone(), f);
    }
    let report = ModuleReport {
        module: m.name.clone(),
        target: img.target,
        toolchain: sel.toolchain,
        min_driver: sel.min_driver,
        reason,
        why: reason.to_string(),
        jit: img.is_ptx(),
        image_bytes: img.bytes.as_slice().len(),
        sha256: img.sha256.clone(),
        hash_us: hash.micros,
        hash_cached: hash.cached,
        load_us,
        entries,
    };
    Ok((LoadedModule { module, functions }, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programmatic_launch_needs_hopper_and_a_12_3_driver() {
        let spec = |cap: (u32, u32), driver: (u32, u32)| DeviceSpec {
            capability: Version::new(cap.0, cap.1),
            integrated: false,
            driver: Version::new(driver.0, driver.1),
        };
        assert!(pdl_device(&spec((9, 0), (13, 0))));
        assert!(pdl_device(&spec((11, 0), (13, 0))), "Thor");
        assert!(pdl_device(&spec((9, 0), (12, 3))));
        assert!(!pdl_device(&spec((9, 0), (12, 2))), "H100 on r535");
        assert!(!pdl_device(&spec((8, 7), (12, 6))), "Orin");
        assert!(!pdl_device(&spec((8, 9), (13, 0))));
    }

    #[test]
    fn clusters_need_hopper() {
        let spec = |major, minor| DeviceSpec {
            capability: Version::new(major, minor),
            integrated: false,
            driver: Version::new(12, 4),
        };
        assert!(cluster_device(&spec(9, 0)));
        assert!(cluster_device(&spec(11, 0)), "Thor");
        assert!(cluster_device(&spec(12, 1)), "Spark");
        assert!(!cluster_device(&spec(8, 7)), "Orin");
        assert!(!cluster_device(&spec(8, 9)));
    }

    #[test]
    fn the_load_table_says_where_launches_may_be_programmatic() {
        let report = |pdl, modules: &[&str]| LoadReport {
            device_name: "test".into(),
            ordinal: 0,
            device: DeviceSpec {
                capability: Version::new(9, 0),
                integrated: false,
                driver: Version::new(13, 0),
            },
            policy: Policy::Auto,
            pdl,
            pdl_modules: modules.iter().map(|m| m.to_string()).collect(),
            modules: Vec::new(),
        };
        let t = report(PdlMode::Auto, &["attention", "gemv"]).to_table();
        assert!(
            t.contains("programmatic launch (AOT_KERNELS_PDL=auto): attention, gemv"),
            "{t}"
        );
        let t = report(PdlMode::Off, &[]).to_table();
        assert!(
            t.contains("programmatic launch (AOT_KERNELS_PDL=off): none here"),
            "{t}"
        );
    }

    #[test]
    fn shared_memory_fits_per_block_and_per_sm() {
        let h200 = SmemLimits {
            per_sm: 233_472,
            per_block: 232_448,
            reserved_per_block: 1024,
        };
        let sm120 = SmemLimits {
            per_sm: 102_400,
            per_block: 101_376,
            reserved_per_block: 1024,
        };
        // Two blocks of 8,224 static + 107,712 dynamic bytes: 2 x 116,960 = 233,920 > 233,472.
        assert!(h200.fits(8224, 107_712 - 448, 2));
        assert!(!h200.fits(8224, 107_712, 2));
        assert!(h200.fits(8224, 107_712, 1));
        assert!(
            !h200.fits(8224, 232_448 - 8224 + 1, 1),
            "past the per-block limit"
        );
        // On a 100 KiB SM two 64 KiB stages never fit, one block of 74,760 bytes does.
        assert!(!sm120.fits(8224, 65_536, 2));
        assert!(sm120.fits(8224, 65_536, 1));
        assert!(!sm120.fits(8224, 101_376 - 8224 + 1, 1));
    }
}
