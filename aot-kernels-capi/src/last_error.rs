//! The per-thread last error, and the boundary every exported call goes through: arguments in,
//! a status out, the message kept for the calling thread, no panic crossing into C.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::status::{AotStatus, CapiError};

thread_local! {
    /// The message of this thread's most recent call: empty after a success.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A NUL inside a message would cut it short in C; show it instead.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Runs one exported call: clears the thread's last error, runs `body`, catches a panic (a bug:
/// [`AotStatus::Internal`] naming the call), and keeps the failure's message for this thread.
pub(crate) fn boundary(
    call: &'static str,
    body: impl FnOnce() -> Result<(), CapiError>,
) -> AotStatus {
    set_last_error("");
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        Err(CapiError::new(
            AotStatus::Internal,
            format!("internal error (a bug in aot-kernels, please report it): {what}"),
        ))
    });
    match outcome {
        Ok(()) => AotStatus::Ok,
        Err(e) => {
            set_last_error(&format!("{call}: {}", e.message));
            e.status
        }
    }
}

/// The message of the calling thread's most recent `aot_*` call that returned a status: empty
/// (never null) after a success. The text is owned by the library and stays valid until this
/// thread's next `aot_*` call; copy it to keep it.
#[no_mangle]
pub extern "C" fn aot_last_error_message() -> *const c_char {
    // Reading never fails and never clears, so it is not itself a boundary call.
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: the pointer is this thread's message, valid until its next call.
        unsafe { CStr::from_ptr(aot_last_error_message()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_an_internal_status_naming_the_call() {
        let status = boundary("aot_test_call", || panic!("index out of range"));
        assert_eq!(status, AotStatus::Internal);
        let message = last();
        assert!(
            message.starts_with("aot_test_call: internal error"),
            "{message}"
        );
        assert!(message.contains("index out of range"), "{message}");
    }

    #[test]
    fn a_success_clears_the_last_error() {
        let failed = boundary("aot_fail", || Err(CapiError::null("out")));
        assert_eq!(failed, AotStatus::NullArgument);
        assert!(
            last().starts_with("aot_fail: `out` is null: pass a valid pointer"),
            "{}",
            last()
        );
        assert_eq!(boundary("aot_pass", || Ok(())), AotStatus::Ok);
        assert_eq!(last(), "");
    }

    #[test]
    fn a_nul_inside_a_message_is_shown_not_cut() {
        boundary("aot_nul", || Err(CapiError::invalid("a\0b")));
        assert_eq!(last(), "aot_nul: a\\0b");
    }
}
