//! NVRTC, NVIDIA's runtime compilation library, as a build-time compiler: CUDA C++ to PTX
//! (`-arch=compute_XY`) or to a cubin (`-arch=sm_XY`, through the ptxas built into it).
//!
//! Why a library and not nvcc: the CUDA 12 wheels on PyPI carry no nvcc driver, cicc or
//! fatbinary (`nvidia-cuda-nvcc-cu12` holds only ptxas, libnvvm and headers), but
//! `nvidia-cuda-nvrtc-cu12` carries the whole front end. NVRTC 12.9's cubin for `sm_90` is byte
//! for byte what ptxas 12.9 makes of its PTX, and repeated runs give identical output.
//!
//! The library is opened with `dlopen` (no link-time dependency); every call is checked.

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};

type NvrtcResult = c_int;
type Program = *mut c_void;

/// The NVRTC entry points the build uses, resolved once.
pub struct Nvrtc {
    path: PathBuf,
    _lib: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    num_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
}

// SAFETY: NVRTC is documented thread-safe for calls on distinct programs; the function pointers
// are plain data and the library stays loaded as long as `self`.
unsafe impl Send for Nvrtc {}
unsafe impl Sync for Nvrtc {}

/// What one compile produced, or why it did not.
#[derive(Debug)]
pub enum Output {
    /// The image and the compiler's log (warnings; empty when clean).
    Image { bytes: Vec<u8>, log: String },
    /// The compiler refused the source; the log says why.
    Failed { log: String },
}

impl Nvrtc {
    /// Opens `libnvrtc` at `path` and resolves every entry point the build uses.
    pub fn open(path: &Path) -> Result<Nvrtc, String> {
        // SAFETY: loading NVIDIA's NVRTC runs its initialisers, which have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: cannot load NVRTC: {e}", path.display()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is declared with the signature of NVRTC's public header (nvrtc.h).
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!(
                        "{}: no {}: {e}",
                        path.display(),
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        Ok(Nvrtc {
            path: path.to_path_buf(),
            version: sym!(b"nvrtcVersion\0"),
            num_archs: sym!(b"nvrtcGetNumSupportedArchs\0"),
            archs: sym!(b"nvrtcGetSupportedArchs\0"),
            error_string: sym!(b"nvrtcGetErrorString\0"),
            create: sym!(b"nvrtcCreateProgram\0"),
            destroy: sym!(b"nvrtcDestroyProgram\0"),
            compile: sym!(b"nvrtcCompileProgram\0"),
            log_size: sym!(b"nvrtcGetProgramLogSize\0"),
            log: sym!(b"nvrtcGetProgramLog\0"),
            ptx_size: sym!(b"nvrtcGetPTXSize\0"),
            ptx: sym!(b"nvrtcGetPTX\0"),
            cubin_size: sym!(b"nvrtcGetCUBINSize\0"),
            cubin: sym!(b"nvrtcGetCUBIN\0"),
            _lib: lib,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check(&self, what: &str, r: NvrtcResult) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe {
            let p = (self.error_string)(r);
            if p.is_null() {
                "unknown error".to_string()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(format!("{}: {what}: {text} ({r})", self.path.display()))
    }

    /// `(major, minor)` of the library, e.g. (12, 9).
    pub fn version(&self) -> Result<(u32, u32), String> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints through valid pointers.
        self.check("nvrtcVersion", unsafe {
            (self.version)(&mut major, &mut minor)
        })?;
        Ok((major.max(0) as u32, minor.max(0) as u32))
    }

    /// SM numbers it can compile for: 50 ... 121 for NVRTC 12.9 (no 110: Thor is `sm_101` there).
    pub fn supported_sms(&self) -> Result<Vec<u32>, String> {
        let mut n = 0;
        // SAFETY: writes one int; then fills exactly `n` ints of a buffer of that length.
        self.check("nvrtcGetNumSupportedArchs", unsafe {
            (self.num_archs)(&mut n)
        })?;
        let mut archs = vec![0 as c_int; n.max(0) as usize];
        self.check("nvrtcGetSupportedArchs", unsafe {
            (self.archs)(archs.as_mut_ptr())
        })?;
        Ok(archs.into_iter().map(|a| a.max(0) as u32).collect())
    }

    /// Compiles `source` (named `name` in messages) with `options`; `-arch=compute_XY` makes PTX
    /// (returned without its NUL), `-arch=sm_XY` a cubin.
    pub fn compile(&self, source: &str, name: &str, options: &[String]) -> Result<Output, String> {
        let cstr = |s: &str, what: &str| {
            CString::new(s).map_err(|_| format!("{what} `{s}` contains a NUL byte"))
        };
        let source = cstr(source, "kernel source")?;
        let name_c = cstr(name, "source name")?;
        let options = options
            .iter()
            .map(|o| cstr(o, "compiler option"))
            .collect::<Result<Vec<_>, _>>()?;
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let cubin = options
            .iter()
            .any(|o| o.to_bytes().starts_with(b"-arch=sm_"));

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string or an array of them of the given
        // length; no headers are passed in memory (include paths are options).
        self.check("nvrtcCreateProgram", unsafe {
            (self.create)(
                &mut prog,
                source.as_ptr(),
                name_c.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        })?;
        let result = self.compile_program(prog, &option_ptrs, cubin);
        // SAFETY: `prog` was created above and is destroyed once.
        unsafe { (self.destroy)(&mut prog) };
        result
    }

    fn compile_program(
        &self,
        prog: Program,
        options: &[*const c_char],
        cubin: bool,
    ) -> Result<Output, String> {
        // SAFETY (this function): `prog` is a live program; buffers are sized by the calls that
        // report their sizes, and NVRTC writes at most that many bytes.
        let compiled = unsafe { (self.compile)(prog, options.len() as c_int, options.as_ptr()) };
        let mut log_len = 0usize;
        self.check("nvrtcGetProgramLogSize", unsafe {
            (self.log_size)(prog, &mut log_len)
        })?;
        let mut log = vec![0u8; log_len.max(1)];
        self.check("nvrtcGetProgramLog", unsafe {
            (self.log)(prog, log.as_mut_ptr().cast())
        })?;
        let log = String::from_utf8_lossy(until_nul(&log)).trim().to_string();
        // NVRTC_ERROR_COMPILATION (6): the source is at fault and the log says how.
        if compiled == 6 {
            return Ok(Output::Failed { log });
        }
        self.check("nvrtcCompileProgram", compiled)?;
        let (size_fn, get_fn, what) = if cubin {
            (self.cubin_size, self.cubin, "CUBIN")
        } else {
            (self.ptx_size, self.ptx, "PTX")
        };
        let mut size = 0usize;
        self.check(&format!("nvrtcGet{what}Size"), unsafe {
            size_fn(prog, &mut size)
        })?;
        let mut bytes = vec![0u8; size];
        self.check(&format!("nvrtcGet{what}"), unsafe {
            get_fn(prog, bytes.as_mut_ptr().cast())
        })?;
        if !cubin {
            // PTX comes NUL-terminated; the image is the text.
            let len = until_nul(&bytes).len();
            bytes.truncate(len);
        }
        if bytes.is_empty() {
            return Err(format!(
                "{}: NVRTC reported success but returned an empty {what}",
                self.path.display()
            ));
        }
        Ok(Output::Image { bytes, log })
    }
}

fn until_nul(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}
