//! Launching Triton kernels with the facts their compilation recorded, never hand-copied numbers.
//!
//! `scripts/triton-gen.sh` writes, per Triton module, a `meta.json` (entry, signature, constexprs,
//! num_warps, and per target: shared memory, scratch sizes, PTX `.version`); the build turns it
//! into `TRITON_KERNELS`. A [`TritonKernel`] is one module as loaded on a device: the launch
//! uses `32 * num_warps` threads, the loaded image's `shared` bytes of dynamic shared memory, the
//! two scratch pointers Triton appends, and checks every argument against the signature. An image
//! compiled with grid dependency control (`launch_pdl`: the sm_90+ images of a spec with
//! `pdl=True`, see scripts/triton_gen.py) is launched programmatically where the GPU, the driver
//! and `AOT_KERNELS_PDL` allow ([`LoadedKernels::overlap_launch`]), so it starts while the kernel
//! before it drains.

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use fatbin_verify::{Target, Variant};
use half::bf16;
use serde::Serialize;

use super::launch::{check_aligned, DevMut, DevRef, OpsError};
use crate::dispatch::LoadedKernels;

/// One non-constexpr parameter of a Triton kernel, in order.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TritonParam {
    pub name: &'static str,
    /// Triton's type: `*bf16`, `*fp32`, `*i32` (pointers), `i32`, `fp32`.
    pub ty: &'static str,
    /// Compiled assuming a 16-byte aligned pointer (whole allocations are 256-byte aligned).
    pub aligned_16: bool,
}

/// Launch facts of one target's image (the PTX fallback has its own record).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TritonImageRecord {
    pub target: Target,
    pub ptx_version: &'static str,
    /// Dynamic shared memory in bytes.
    pub shared: u32,
    pub tmem_size: u32,
    /// Bytes of global scratch per program (0: the pointer may be null).
    pub global_scratch_size: u32,
    pub global_scratch_align: u32,
    pub profile_scratch_size: u32,
    pub profile_scratch_align: u32,
    pub launch_pdl: bool,
    pub launch_cooperative_grid: bool,
    /// ptxas' report for SASS images (registers per thread, spill stores in bytes).
    pub registers: Option<u32>,
    pub spill_store_bytes: Option<u32>,
    pub spill_load_bytes: Option<u32>,
}

/// One Triton module: its kernel and how it was compiled.
#[derive(Debug, Serialize)]
pub struct TritonKernelRecord {
    pub module: &'static str,
    pub entry: &'static str,
    pub source_sha256: &'static str,
    pub triton_version: &'static str,
    pub ptxas_version: &'static str,
    pub params: &'static [TritonParam],
    /// Appended after `params`: global scratch, profile scratch.
    pub scratch_params: &'static [&'static str],
    pub constexprs: &'static [(&'static str, i64)],
    pub num_warps: u32,
    pub num_ctas: u32,
    pub num_stages: u32,
    pub images: &'static [TritonImageRecord],
}

include!(env!("AOT_TRITON_META_RS"));

// `Variant` is named by the generated table.
#[allow(unused_imports)]
use Variant as _;

/// Every Triton module's record, in manifest order.
pub fn records() -> &'static [TritonKernelRecord] {
    TRITON_KERNELS
}

pub fn record(module: &str) -> Option<&'static TritonKernelRecord> {
    TRITON_KERNELS.iter().find(|r| r.module == module)
}

impl TritonKernelRecord {
    pub fn constexpr(&self, name: &str) -> Option<i64> {
        self.constexprs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, v)| v)
    }

    pub fn image(&self, target: Target) -> Option<&'static TritonImageRecord> {
        self.images.iter().find(|i| i.target == target)
    }

    /// Threads per program: Triton's `32 * num_warps` (the PTX's `.reqntid`).
    pub fn threads(&self) -> u32 {
        32 * self.num_warps
    }
}

/// A kernel argument, matched against the signature by type.
pub enum TritonArg<'a> {
    Bf16(&'a CudaSlice<bf16>),
    Bf16Mut(&'a mut CudaSlice<bf16>),
    F32(&'a CudaSlice<f32>),
    F32Mut(&'a mut CudaSlice<f32>),
    I32(&'a CudaSlice<i32>),
    I32Mut(&'a mut CudaSlice<i32>),
    /// A view (part of an allocation), read.
    I32View(DevRef<'a, i32>),
    /// A view, written.
    I32ViewMut(DevMut<'a, i32>),
    /// A view of bf16, read.
    Bf16View(DevRef<'a, bf16>),
    /// A view of bf16, written.
    Bf16ViewMut(DevMut<'a, bf16>),
    ScalarI32(i32),
    ScalarF32(f32),
}

impl TritonArg<'_> {
    /// The address a view of more than one element passes (an allocation's own start is aligned
    /// far past 16 bytes; a view may start anywhere in it). A view of one element is left out: it
    /// can only be read or written as a scalar, which no alignment constrains (the engine logs
    /// each layer's expert count through such views).
    fn view_addr(&self) -> Option<u64> {
        let (addr, len) = match self {
            TritonArg::I32View(v) => (v.addr(), v.len()),
            TritonArg::I32ViewMut(v) => (v.addr(), v.len()),
            TritonArg::Bf16View(v) => (v.addr(), v.len()),
            TritonArg::Bf16ViewMut(v) => (v.addr(), v.len()),
            _ => return None,
        };
        (len > 1).then_some(addr)
    }

    /// The parameter's bits as the kernel reads them: an address, or a scalar in the low bytes
    /// (the driver copies the parameter's size from the slot, little-endian).
    /// The addresses come without cudarc's event bookkeeping (the guard `device_ptr` returns is
    /// dropped at once): the kernels' contexts track no events (`driver::open_device` turns it
    /// off, `open_context` refuses a context that tracks), and the launch is ordered on the
    /// kernels' one stream.
    fn bits(&self, stream: &CudaStream) -> u64 {
        match self {
            TritonArg::Bf16(s) => s.device_ptr(stream).0,
            TritonArg::Bf16Mut(s) => s.device_ptr(stream).0,
            TritonArg::F32(s) => s.device_ptr(stream).0,
            TritonArg::F32Mut(s) => s.device_ptr(stream).0,
            TritonArg::I32(s) => s.device_ptr(stream).0,
            TritonArg::I32Mut(s) => s.device_ptr(stream).0,
            TritonArg::I32View(v) => v.addr(),
            TritonArg::I32ViewMut(v) => v.addr(),
            TritonArg::Bf16View(v) => v.addr(),
            TritonArg::Bf16ViewMut(v) => v.addr(),
            TritonArg::ScalarI32(v) => u64::from(*v as u32),
            TritonArg::ScalarF32(v) => u64::from(v.to_bits()),
        }
    }

    /// The Triton type this argument passes.
    pub fn triton_type(&self) -> &'static str {
        match self {
            TritonArg::Bf16(_)
            | TritonArg::Bf16Mut(_)
            | TritonArg::Bf16View(_)
            | TritonArg::Bf16ViewMut(_) => "*bf16",
            TritonArg::F32(_) | TritonArg::F32Mut(_) => "*fp32",
            TritonArg::I32(_)
            | TritonArg::I32Mut(_)
            | TritonArg::I32View(_)
            | TritonArg::I32ViewMut(_) => "*i32",
            TritonArg::ScalarI32(_) => "i32",
            TritonArg::ScalarF32(_) => "fp32",
        }
    }
}

/// Checks an argument list against a kernel's signature (count and each type, by position), and
/// that each view starts on a 16-byte boundary where the kernel was compiled assuming it (its
/// loads would fault otherwise, a sticky error for the whole context).
pub fn check_signature(
    op: &'static str,
    record: &TritonKernelRecord,
    args: &[TritonArg<'_>],
) -> Result<(), OpsError> {
    if args.len() != record.params.len() {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "{} takes {} arguments (before its scratch pointers), the launcher passes {}",
                record.entry,
                record.params.len(),
                args.len()
            ),
        });
    }
    for (i, (arg, param)) in args.iter().zip(record.params).enumerate() {
        if arg.triton_type() != param.ty {
            return Err(OpsError::Shape {
                op,
                message: format!(
                    "{} argument {i} `{}` is {} in the kernel, the launcher passes {}; regenerate the launcher's argument list from kernels/triton/generated/{}/meta.json",
                    record.entry,
                    param.name,
                    param.ty,
                    arg.triton_type(),
                    record.module
                ),
            });
        }
        if let Some(addr) = arg.view_addr().filter(|_| param.aligned_16) {
            check_aligned(op, param.name, addr, 16)?;
        }
    }
    Ok(())
}

/// A Triton module as loaded on this device: the record, the image the dispatcher chose, the function.
pub struct TritonKernel<'k> {
    pub record: &'static TritonKernelRecord,
    pub image: &'static TritonImageRecord,
    kernels: &'k LoadedKernels,
    function: CudaFunction,
}

impl<'k> TritonKernel<'k> {
    /// Looks up `module` among the loaded kernels and the launch facts of the image that runs.
    pub fn load(
        kernels: &'k LoadedKernels,
        op: &'static str,
        module: &str,
    ) -> Result<Self, OpsError> {
        let record = record(module).ok_or_else(|| OpsError::Shape {
            op,
            message: format!(
                "no Triton metadata for module `{module}`; is it a `kind = \"triton\"` module of aot-manifest.toml?"
            ),
        })?;
        let target = kernels
            .loaded_target(module)
            .ok_or_else(|| OpsError::Shape {
                op,
                message: format!(
                    "module `{module}` is not loaded: load it (load_all loads every module that \
                     has an image here; on a driver older than 13.0 the Triton modules have none, \
                     being built with CUDA 13 only: `qwen-decode kernels` shows what each needs)"
                ),
            })?;
        let image = record.image(target).ok_or_else(|| OpsError::Shape {
            op,
            message: format!(
                "module `{module}` runs its {target} image, for which the build recorded no launch facts"
            ),
        })?;
        let function = kernels.function(module, record.entry)?;
        Ok(TritonKernel {
            record,
            image,
            kernels,
            function,
        })
    }

    /// A compile-time constant of the kernel, as a size (block sizes, shapes it was built for).
    pub fn constexpr(&self, op: &'static str, name: &str) -> Result<usize, OpsError> {
        self.record
            .constexpr(name)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| OpsError::Shape {
                op,
                message: format!(
                    "{} was compiled without a non-negative constexpr `{name}`",
                    self.record.entry
                ),
            })
    }

    /// Checks that the kernel was compiled for `value` of `name`; the error names the fix.
    pub fn expect(&self, op: &'static str, name: &str, value: usize) -> Result<(), OpsError> {
        let compiled = self.constexpr(op, name)?;
        if compiled != value {
            return Err(OpsError::Shape {
                op,
                message: format!(
                    "{} is compiled for {name} = {compiled}, the call has {value}; add a specialisation to {}'s SPECS (kernels/triton/) and run `make triton`",
                    self.record.entry, self.record.module
                ),
            });
        }
        Ok(())
    }

    /// The launch configuration the metadata prescribes for `grid`.
    pub fn launch_config(&self, grid: (u32, u32, u32)) -> LaunchConfig {
        LaunchConfig {
            grid_dim: grid,
            block_dim: (self.record.threads(), 1, 1),
            shared_mem_bytes: self.image.shared,
        }
    }

    /// Launches on the kernels' stream with `args` in signature order (scratch pointers appended).
    pub fn launch(
        &self,
        op: &'static str,
        grid: (u32, u32, u32),
        args: &mut [TritonArg<'_>],
    ) -> Result<(), OpsError> {
        check_signature(op, self.record, args)?;
        let unsupported = |what: String| OpsError::Shape {
            op,
            message: format!(
                "{}: {what}; the launcher does not support it",
                self.record.entry
            ),
        };
        if self.record.num_ctas != 1 {
            return Err(unsupported(format!("num_ctas = {}", self.record.num_ctas)));
        }
        if self.image.launch_cooperative_grid || self.image.tmem_size != 0 {
            return Err(unsupported(
                "cooperative grid or tensor memory requested".into(),
            ));
        }
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Err(OpsError::Shape {
                op,
                message: format!("empty grid {grid:?}"),
            });
        }
        let driver = |source| OpsError::Driver { op, source };
        // Past 48 KiB the driver wants an opt-in (once per function and size; the dispatcher
        // checks the device's limit and names it in the error).
        if self.image.shared > 0 {
            self.kernels.allow_dynamic_smem(
                self.record.module,
                self.record.entry,
                self.image.shared as usize,
            )?;
        }
        let stream = self.kernels.stream();
        let programs = u64::from(grid.0) * u64::from(grid.1) * u64::from(grid.2);
        let scratch = |size: u32, align: u32| -> Result<Option<CudaSlice<u8>>, OpsError> {
            if size == 0 {
                return Ok(None);
            }
            let bytes = (programs * u64::from(size)).next_multiple_of(u64::from(align.max(1)));
            stream
                .alloc_zeros::<u8>(bytes as usize)
                .map(Some)
                .map_err(driver)
        };
        let global = scratch(
            self.image.global_scratch_size,
            self.image.global_scratch_align,
        )?;
        let profile = scratch(
            self.image.profile_scratch_size,
            self.image.profile_scratch_align,
        )?;
        // The arguments in signature order, then the scratch pointers (null where unused), each in
        // a slot the launch reads its parameter from.
        let scratch_addr =
            |s: &Option<CudaSlice<u8>>| s.as_ref().map_or(0, |s| s.device_ptr(stream).0);
        let mut values: Vec<u64> = args.iter().map(|a| a.bits(stream)).collect();
        values.push(scratch_addr(&global));
        values.push(scratch_addr(&profile));
        let mut params: Vec<*mut std::ffi::c_void> =
            values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        let programmatic = self.image.launch_pdl && self.kernels.overlap_launch(self.record.module);
        // SAFETY: the argument list matches the kernel's recorded signature (checked above), each
        // op checks its buffers against the shapes the kernel indexes, the block size and shared
        // memory are the compilation's own, and the scratch buffers live until the launch is
        // enqueued (their release is ordered after it on `stream`). Programmatic only for an image
        // compiled with `launch_pdl`, whose code waits (griddepcontrol.wait) before reading what
        // an earlier kernel wrote.
        unsafe {
            crate::dispatch::driver::launch_with_args(
                &self.function,
                stream,
                self.launch_config(grid),
                &mut params,
                programmatic,
                None,
            )
        }
        .map_err(driver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_off_the_16_byte_alignment_a_kernel_assumes_is_refused_by_name() {
        let r = record("moe_combine_norm").expect("moe_combine_norm is a Triton module");
        let (y, ids, w) = (
            DevRef::at(0x1000, 64),
            DevRef::at(0x2000, 8),
            DevRef::at(0x3000, 64),
        );
        let args = |residual| {
            vec![
                TritonArg::Bf16View(y),
                TritonArg::I32View(ids),
                TritonArg::Bf16ViewMut(DevMut::at(residual, 64)),
                TritonArg::Bf16View(w),
                TritonArg::Bf16ViewMut(DevMut::at(0x4000, 64)),
                TritonArg::ScalarI32(1),
                TritonArg::ScalarF32(1e-6),
                TritonArg::ScalarF32(1.0),
            ]
        };
        check_signature("test", r, &args(0x5010)).unwrap();
        // A one-element view is a scalar: any address.
        let mut one = args(0x5010);
        one[1] = TritonArg::I32View(DevRef::at(0x2004, 1));
        check_signature("test", r, &one).unwrap();
        let err = check_signature("test", r, &args(0x5008))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`residual_ptr` starts at 0x5008") && err.contains("16-byte boundary"),
            "{err}"
        );
    }

    #[test]
    fn every_triton_module_has_launch_facts_for_every_image() {
        for m in crate::registry::modules() {
            let Some(r) = record(m.name) else { continue };
            assert_eq!(m.entries, [r.entry], "{}", m.name);
            for image in m.images {
                let facts = r
                    .image(image.target)
                    .unwrap_or_else(|| panic!("{} {}", m.name, image.target));
                assert_eq!(
                    image.ptx_version.map(|(a, b)| format!("{a}.{b}")),
                    image.ptx_version.map(|_| facts.ptx_version.to_string()),
                    "{} {}",
                    m.name,
                    image.target
                );
            }
            assert!(r.num_warps.is_power_of_two() && r.threads() <= 1024);
            assert_eq!(r.scratch_params.len(), 2);
        }
    }
    /// The launcher makes an image's launch programmatic when it was compiled with `launch_pdl`
    /// and the dispatcher counts its module PDL-capable (a loaded image of sm_90 or later): both
    /// must describe the same images, so that no image without `griddepcontrol.wait` is ever
    /// launched programmatically, and the decode path's modules must keep it.
    #[test]
    fn grid_dependency_control_is_in_the_sm90_images_of_the_decode_modules_only() {
        for r in records() {
            let pdl = r.images.iter().any(|i| i.launch_pdl);
            for image in r.images {
                let expect = pdl && image.target.sm >= 90 && !image.target.virtual_arch;
                assert_eq!(image.launch_pdl, expect, "{} {}", r.module, image.target);
            }
        }
        for module in [
            "gdn_recurrent",
            "moe_router",
            "moe_route",
            "moe_gate_up",
            "moe_down",
            "moe_combine",
            "moe_combine_norm",
        ] {
            let r = record(module).expect("a Triton module");
            assert!(r.images.iter().any(|i| i.launch_pdl), "{module}");
        }
    }
}
