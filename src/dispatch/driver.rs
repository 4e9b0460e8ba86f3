//! The one thin layer over cudarc that the dispatcher needs: open the device, read what selection
//! needs, load an image from bytes, read a function's attributes. Everything unsafe is here.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DriverError};
use cudarc::nvrtc::Ptx;

use super::error::{translate, DispatchError};
use super::select::{DeviceSpec, Version};

/// The device and driver as the driver reports them.
#[derive(Debug, Clone)]
pub struct OpenDevice {
    pub ctx: Arc<CudaContext>,
    pub spec: DeviceSpec,
    pub name: String,
    /// Streaming multiprocessors (launch shapes are sized from it).
    pub sm_count: usize,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Whether libcuda can be opened at all (cudarc would panic on first use otherwise).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda under its known names; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// `cuDriverGetVersion`: the newest CUDA version the installed driver supports.
pub fn driver_version() -> Result<Version, DriverError> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: writes one int through a valid pointer; libcuda was found by `driver_present`.
    unsafe { sys::cuDriverGetVersion(&mut v).result()? };
    Ok(Version::from_driver_int(v))
}

/// Open device `ordinal` (its primary context) and read capability, integration and driver.
/// Returns an error, never panics, when no driver or device is there.
///
/// The context's per-buffer event tracking is turned off: the backend's own engine orders all its
/// work on one stream, where cudarc's events would only add driver calls to every launch and get in
/// the way of CUDA graph capture. An engine that makes its context itself passes it to
/// [`open_context`], which changes nothing of it and refuses a context that still tracks events
/// ([`DispatchError::EventTracking`]): turn tracking off on it first
/// (`CudaContext::disable_event_tracking`) and order work across streams with your own events.
pub fn open_device(ordinal: usize) -> Result<OpenDevice, DispatchError> {
    if !driver_present() {
        return Err(DispatchError::NoDriver);
    }
    let opened = catch_unwind(AssertUnwindSafe(|| {
        let ctx = CudaContext::new(ordinal).map_err(|e| DispatchError::Device {
            ordinal,
            failure: translate(e),
        })?;
        // SAFETY: this context is the backend's own: no buffer of it is used on another stream.
        unsafe { ctx.disable_event_tracking() };
        describe(ctx)
    }));
    opened.unwrap_or_else(|p| {
        Err(DispatchError::DriverPanic {
            during: "opening the device",
            message: panic_message(p),
        })
    })
}

/// The device of a context the caller made (any ordinal; one per device for several GPUs):
/// capability, integration, driver and SM count, read without changing the context. Load kernels
/// on it with [`super::load_available`] (or [`super::load_modules`]).
///
/// The context must not track buffer uses with events ([`DispatchError::EventTracking`]
/// otherwise): the launchers take buffers as views (`ops::launch::DevRef`), whose cudarc guard
/// is gone by the time the kernel is queued, so the events cudarc records would mark a point before
/// the kernel and another stream's wait on them would not cover it.
///
/// ```no_run
/// use aot_kernels::device::CudaContext;
/// use aot_kernels::dispatch::{load_available, open_context, ModuleSource, Policy};
///
/// let ctx = CudaContext::new(1)?; // the engine's own context, on its second GPU
/// // SAFETY: no buffer exists yet; the engine orders its streams itself.
/// unsafe { ctx.disable_event_tracking() };
/// let device = open_context(ctx)?;
/// let kernels = load_available(&device, Policy::Auto, &ModuleSource::registry())?;
/// println!("{}", kernels.report().to_table());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open_context(ctx: Arc<CudaContext>) -> Result<OpenDevice, DispatchError> {
    if !driver_present() {
        return Err(DispatchError::NoDriver);
    }
    if ctx.is_event_tracking() {
        return Err(DispatchError::EventTracking {
            ordinal: ctx.ordinal(),
        });
    }
    catch_unwind(AssertUnwindSafe(|| describe(ctx))).unwrap_or_else(|p| {
        Err(DispatchError::DriverPanic {
            during: "reading the device of a context",
            message: panic_message(p),
        })
    })
}

fn describe(ctx: Arc<CudaContext>) -> Result<OpenDevice, DispatchError> {
    let ordinal = ctx.ordinal();
    let device_err = |e: DriverError| DispatchError::Device {
        ordinal,
        failure: translate(e),
    };
    let sm_count = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(device_err)?
        .max(1) as usize;
    let (major, minor) = ctx.compute_capability().map_err(device_err)?;
    let integrated = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)
        .map_err(device_err)?
        != 0;
    let driver = driver_version().map_err(device_err)?;
    let name = ctx.name().unwrap_or_else(|_| "unknown".to_string());
    let capability = Version::new(major.max(0) as u32, minor.max(0) as u32);
    Ok(OpenDevice {
        ctx,
        spec: DeviceSpec {
            capability,
            integrated,
            driver,
        },
        name,
        sm_count,
    })
}

/// Load one image. `ptx` text gets the NUL terminator `cuModuleLoadData` needs; the caller has
/// checked it has no NUL inside.
pub fn load_image(
    ctx: &Arc<CudaContext>,
    bytes: &[u8],
    ptx: bool,
) -> Result<Arc<CudaModule>, DriverError> {
    let mut data = Vec::with_capacity(bytes.len() + 1);
    data.extend_from_slice(bytes);
    if ptx {
        data.push(0);
    }
    // `from_binary` hands the bytes to cuModuleLoadData as they are: cubin, fatbin or PTX text.
    ctx.load_module(Ptx::from_binary(data))
}

/// What the driver says about a loaded function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FunctionAttributes {
    pub registers: i32,
    pub shared_bytes: i32,
    pub local_bytes: i32,
    pub max_threads_per_block: i32,
    /// `CU_FUNC_ATTRIBUTE_BINARY_VERSION`: the SASS that runs (90 for sm_90, also after a JIT).
    pub binary_version: i32,
    /// `CU_FUNC_ATTRIBUTE_PTX_VERSION`: the virtual architecture it came from (80 for compute_80).
    pub ptx_version: i32,
}

pub fn function_attributes(f: &CudaFunction) -> Result<FunctionAttributes, DriverError> {
    let get = |a| f.get_attribute(a);
    Ok(FunctionAttributes {
        registers: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        shared_bytes: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        local_bytes: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        max_threads_per_block: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        binary_version: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
        ptx_version: get(CUfunction_attribute::CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
    })
}

/// The launch attribute that makes a launch thread-block clusters of `(x, y, z)` blocks.
fn cluster_attribute((x, y, z): (u32, u32, u32)) -> sys::CUlaunchAttribute {
    // SAFETY: a plain C struct and union of integers; zero is a valid value of each.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = x;
    attr.value.clusterDim.y = y;
    attr.value.clusterDim.z = z;
    attr
}

/// The driver's launch configuration of `cfg` on `stream` with `attrs` (which must outlive its use).
fn launch_config(
    cfg: &cudarc::driver::LaunchConfig,
    stream: &cudarc::driver::CudaStream,
    attrs: &mut [sys::CUlaunchAttribute],
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: if attrs.is_empty() {
            std::ptr::null_mut()
        } else {
            attrs.as_mut_ptr()
        },
        numAttrs: attrs.len() as u32,
    }
}

/// How many clusters of `cluster` blocks (x, y, z) of `f`, launched as `cfg` describes, the device
/// can hold at once (`cuOccupancyMaxActiveClusters`): 0 when such a cluster cannot be placed at all
/// (more blocks than a GPC's SMs can hold, given each block's registers and shared memory), and a
/// launch of it would fail. The function's dynamic shared-memory limit must already allow
/// `cfg.shared_mem_bytes`.
pub fn max_active_clusters(
    f: &CudaFunction,
    stream: &cudarc::driver::CudaStream,
    cfg: cudarc::driver::LaunchConfig,
    cluster: (u32, u32, u32),
) -> Result<u32, DriverError> {
    let mut attrs = [cluster_attribute(cluster)];
    let config = launch_config(&cfg, stream, &mut attrs);
    stream.context().bind_to_thread()?;
    let mut n: std::ffi::c_int = 0;
    // SAFETY: a query; the config and its attribute live on this frame for the call, and the
    // function and stream handles are alive (borrowed).
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f.cu_function(), &config).result()? };
    Ok(n.max(0) as u32)
}

/// Launches `f` with one by-value parameter block, optionally with programmatic stream
/// serialisation (programmatic dependent launch: the kernel may start while the previous one on
/// the stream drains, and waits for it with `griddepcontrol.wait`) and optionally as thread-block
/// clusters of `cluster` blocks (x, y, z; each dividing the grid's).
///
/// # Safety
/// `params` must point to a value laid out as the kernel's parameter list, every address in it
/// valid for what the kernel does; with `programmatic`, the kernel's code must wait for its
/// predecessor (griddepcontrol.wait) before reading what the predecessor wrote; with `cluster`,
/// the kernel must be built for sm_90+ and the device must have clusters (capability 9.0+).
pub unsafe fn launch_with_params(
    f: &CudaFunction,
    stream: &cudarc::driver::CudaStream,
    cfg: cudarc::driver::LaunchConfig,
    params: *mut std::ffi::c_void,
    programmatic: bool,
    cluster: Option<(u32, u32, u32)>,
) -> Result<(), DriverError> {
    launch_with_args(f, stream, cfg, &mut [params], programmatic, cluster)
}

/// [`launch_with_params`] for a kernel of several parameters: `args[i]` points to the value of
/// parameter `i` (the driver copies as many bytes as the parameter's size).
///
/// # Safety
/// As [`launch_with_params`], for every parameter.
pub unsafe fn launch_with_args(
    f: &CudaFunction,
    stream: &cudarc::driver::CudaStream,
    cfg: cudarc::driver::LaunchConfig,
    args: &mut [*mut std::ffi::c_void],
    programmatic: bool,
    cluster: Option<(u32, u32, u32)>,
) -> Result<(), DriverError> {
    let mut attrs: [sys::CUlaunchAttribute; 2] = std::mem::zeroed();
    let mut n = 0;
    if programmatic {
        attrs[n].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if let Some(dims) = cluster {
        attrs[n] = cluster_attribute(dims);
        n += 1;
    }
    let config = launch_config(&cfg, stream, &mut attrs[..n]);
    stream.context().bind_to_thread()?;
    sys::cuLaunchKernelEx(
        &config,
        f.cu_function(),
        args.as_mut_ptr(),
        std::ptr::null_mut(),
    )
    .result()
}

/// Encodes a tensor map of a row-major `rows x cols` bf16 matrix at device address `addr` (16-byte
/// aligned, `cols` a multiple of 8) for copies of `box_rows x box_cols` boxes, zero-filled past the
/// matrix: the 128 bytes the Tensor Memory Accelerator reads (a host-side encoding; the map is
/// then copied to device memory).
pub fn tensor_map_2d_bf16(
    addr: u64,
    rows: usize,
    cols: usize,
    box_rows: usize,
    box_cols: usize,
) -> Result<[u64; 16], DriverError> {
    let dims: [u64; 2] = [cols as u64, rows as u64];
    let strides: [u64; 1] = [(cols * 2) as u64];
    let boxes: [u32; 2] = [box_cols as u32, box_rows as u32];
    let elements: [u32; 2] = [1, 1];
    let mut map: sys::CUtensorMap = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer is to a live local array of the rank the call names; the driver only
    // writes the map.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elements.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()?
    };
    Ok(map.opaque)
}
