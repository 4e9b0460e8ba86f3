//! Runtime dispatcher: pick, verify and load the best image of every kernel module for this GPU
//! and driver (the newest toolchain the driver accepts: CUDA 13 images on 13.x drivers, CUDA 12
//! ones on older drivers), with a forced-PTX policy and a toolchain choice for testing the
//! fallbacks.
//!
//! - [`select`]: the pure decision (capability, integrated, driver, images -> image or error).
//! - [`mod@plan`]: that decision for every module, printable and serializable; works for a simulated
//!   device, so any device's plan can be checked without a GPU.
//! - [`verify`]: sha256 of an image against the build's record, once per process.
//! - [`load`]: open the device, load the chosen images, hand out functions, report what runs.
//! - [`driver`]: the one thin layer over cudarc (libcuda is opened at run time).

pub mod driver;
pub mod error;
pub mod load;
pub mod plan;
pub mod policy;
pub mod select;
pub mod source;
pub mod verify;

pub use driver::{open_context, open_device, FunctionAttributes, OpenDevice};
pub use error::{translate, DispatchError, DriverFailure};
pub use load::{
    check_module, cluster_device, load_all, load_all_from_env, load_available, load_modules,
    pdl_device, LoadReport, LoadedKernels, ModuleReport, SmemLimits, PDL_MIN_DRIVER,
};
pub use plan::{
    fast_path_unavailable, oldest_driver_for_all, oldest_driver_for_plan, plan, ModulePlan, Plan,
};
pub use policy::{
    ParsePdlModeError, PdlMode, Policy, ToolchainChoice, PDL_ENV, POLICY_ENV, TOOLCHAIN_ENV,
};
pub use select::{
    min_driver_for_image, select_image, DeviceSpec, ImageCandidate, NoImageError, Reason,
    Selection, Version,
};
pub use source::{ImageBytes, ImageSource, ModuleSource};
pub use verify::{verify_image, HashMismatch};
