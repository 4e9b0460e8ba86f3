//! Everything that can stop the dispatcher, each with what to do about it.

use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;
use fatbin_verify::Target;

use super::policy::{ParsePolicyError, ParseToolchainChoiceError};
use super::select::NoImageError;
use super::verify::HashMismatch;

/// A driver error code with what it means here and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFailure {
    /// `CUDA_ERROR_NO_BINARY_FOR_GPU` and so on.
    pub code: String,
    pub what: &'static str,
    pub fix: &'static str,
}

impl std::fmt::Display for DriverFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}. Fix: {}", self.code, self.what, self.fix)
    }
}

/// Name a driver error and say what it means when loading kernels.
pub fn translate(err: DriverError) -> DriverFailure {
    use CUresult::*;
    let (what, fix) = match err.0 {
        CUDA_ERROR_NO_BINARY_FOR_GPU => (
            "the image holds no code for this GPU (a cubin for another architecture, and no PTX the driver could compile)",
            "build the crate with this GPU's SASS target (aot-manifest.toml / AOT_TARGETS), or ship PTX and use policy auto or ptx-only",
        ),
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION => (
            "the PTX .version (ISA) is newer than this driver understands",
            "update the NVIDIA driver to one whose CUDA version supports that ISA (see docs/dispatch.md), or ship PTX from an older toolkit",
        ),
        CUDA_ERROR_INVALID_PTX => (
            "the driver's JIT rejected the PTX text",
            "check the PTX was not altered and targets an architecture not above this GPU",
        ),
        CUDA_ERROR_INVALID_IMAGE => ("the image is not a valid cubin, fatbin or PTX", "rebuild the crate; the embedded image is damaged"),
        CUDA_ERROR_JIT_COMPILER_NOT_FOUND | CUDA_ERROR_JIT_COMPILATION_DISABLED => (
            "the driver cannot JIT-compile PTX here",
            "install the full driver (libnvidia-ptxjitcompiler) or use SASS with policy sass-only",
        ),
        CUDA_ERROR_NO_DEVICE => ("the driver sees no CUDA device", "check the GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)"),
        CUDA_ERROR_INVALID_DEVICE => ("no CUDA device has this ordinal", "pick an ordinal below the device count"),
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH | CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => (
            "the installed driver is too old or mismatched for this program",
            "update the NVIDIA driver: this crate ships CUDA 12 images for 12.x drivers (r525+) and CUDA 13 images for 13.x (r580+); `qwen-decode kernels` shows which image each module needs",
        ),
        CUDA_ERROR_NOT_FOUND => ("the module has no function of that name", "rebuild: the registry and the image disagree on entry names"),
        _ => ("the driver call failed", "see the CUDA driver API documentation for this code"),
    };
    DriverFailure {
        code: format!("{:?}", err.0),
        what,
        fix,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("{module}::{entry} needs {bytes} bytes of shared memory per block; this GPU allows {limit} (sm_86/89/120-class GPUs 99 KiB, A100 163 KiB, Hopper 227 KiB)")]
    SharedMemory {
        module: String,
        entry: String,
        bytes: usize,
        limit: usize,
    },
    #[error("no CUDA driver found (libcuda could not be opened): this machine has no NVIDIA driver, or LD_LIBRARY_PATH misses it. Use `qwen-decode kernels --simulate X.Y --driver X.Y` to see another device's plan")]
    NoDriver,
    #[error("CUDA device {ordinal} unavailable: {failure}")]
    Device {
        ordinal: usize,
        failure: DriverFailure,
    },
    #[error("the context of CUDA device {ordinal} tracks buffer uses with events (cudarc's default), and the kernels' launches through buffer views record none, so cudarc's ordering across streams would not cover them. Call `unsafe {{ ctx.disable_event_tracking() }}` right after creating the context (before allocating), and order work across your streams yourself; or let `open_device` make the context")]
    EventTracking { ordinal: usize },
    #[error(
        "the CUDA driver library panicked while {during}: {message}. Update the NVIDIA driver"
    )]
    DriverPanic {
        during: &'static str,
        message: String,
    },
    #[error("module {module}: {source}")]
    NoImage {
        module: String,
        source: NoImageError,
    },
    #[error("module {module} is unavailable here: {why}. Load modules with load_available (or load_all), which leaves such modules out")]
    Unavailable { module: String, why: String },
    #[error(transparent)]
    Policy(#[from] ParsePolicyError),
    #[error(transparent)]
    ToolchainChoice(#[from] ParseToolchainChoiceError),
    #[error(transparent)]
    PdlMode(#[from] super::policy::ParsePdlModeError),
    #[error(transparent)]
    Tampered(#[from] HashMismatch),
    #[error("module {module}, image {target}: the recorded PTX .version {recorded} differs from the image's own `.version {found}`; refusing to load. Rebuild the crate")]
    PtxVersionMismatch {
        module: String,
        target: Target,
        recorded: String,
        found: String,
    },
    #[error("module {module}, image {target}: PTX text contains a NUL byte, so it cannot be handed to the driver; rebuild the crate")]
    PtxHasNul { module: String, target: Target },
    #[error("module {module}, image {target}: loading failed: {failure}")]
    Load {
        module: String,
        target: Target,
        failure: DriverFailure,
    },
    #[error("module {module}, image {target}: function {entry}: {failure}")]
    Function {
        module: String,
        target: Target,
        entry: String,
        failure: DriverFailure,
    },
    #[error("no module {module} is loaded (known: {known})")]
    UnknownModule { module: String, known: String },
    #[error("module {module} has no entry {entry} (entries: {known})")]
    UnknownEntry {
        module: String,
        entry: String,
        known: String,
    },
    #[error("the stream belongs to another context (device {stream}) than the kernels (device {kernels}): make the stream with the kernels' context (`kernels.context().new_stream()`), or load the kernels on the stream's context")]
    ForeignStream { kernels: usize, stream: usize },
}
