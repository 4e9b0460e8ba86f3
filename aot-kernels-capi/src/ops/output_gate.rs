//! The output gate of gated attention (`aot_kernels::ops::output_gate`): in place,
//! `x = bf16(x * bf16(sigmoid(gate)))`.

use std::ffi::c_void;

use aot_kernels::ops::output_gate::sigmoid_gate_mul;
use aot_kernels::ops::{dev, dev_mut};
use half::bf16;

use super::ALIGN_BF16;
use crate::args::{device_buffer, disjoint, positive, strided_need, AotDevicePtr};
use crate::backend::{backend_ref, span, AotBackend};
use crate::borrow::Borrowed;
use crate::last_error::boundary;
use crate::status::{AotStatus, CapiError};

/// Rows of one launch: one grid row each.
const MAX_ROWS: usize = 65535;

/// In place, per element: `x = bf16(x * bf16(sigmoid(gate)))` (Qwen3.5/3.6's gated attention,
/// the attention output times the sigmoid of the gate half of its q projection). `x` holds `rows`
/// rows (1..=65535) of `width` bf16 every `ld_x`, `gate` `rows` rows of `width` every `ld_gate`, so
/// that the gate can be a column range of a fused projection's output. `x` must not overlap
/// `gate`.
///
/// # Safety
/// As for `aot_rmsnorm_bf16`.
#[no_mangle]
pub unsafe extern "C" fn aot_sigmoid_gate_mul_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    x: AotDevicePtr,
    x_len: usize,
    ld_x: usize,
    gate: AotDevicePtr,
    gate_len: usize,
    ld_gate: usize,
    rows: usize,
    width: usize,
) -> AotStatus {
    boundary("aot_sigmoid_gate_mul_bf16", || {
        positive("width", width)?;
        if !(1..=MAX_ROWS).contains(&rows) {
            return Err(CapiError::invalid(format!(
                "`rows` {rows} must be 1..={MAX_ROWS} (one grid row each)"
            )));
        }
        for (name, value) in [("ld_x", ld_x), ("ld_gate", ld_gate)] {
            if value > i32::MAX as usize {
                return Err(CapiError::invalid(format!(
                    "`{name}` {value} must be below 2^31 (the kernel takes it as an int)"
                )));
            }
        }
        let x = device_buffer::<bf16>(
            "x",
            x,
            x_len,
            &strided_need(rows, ("width", width), ("ld_x", ld_x))?,
            ALIGN_BF16,
        )?;
        let gate = device_buffer::<bf16>(
            "gate",
            gate,
            gate_len,
            &strided_need(rows, ("width", width), ("ld_gate", ld_gate))?,
            ALIGN_BF16,
        )?;
        disjoint(&x, &gate)?;
        let b = backend_ref(backend)?;
        b.launch(stream, &[span(&x), span(&gate)], |k| {
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (mut x, gate) = unsafe {
                (
                    Borrowed::new(k.stream(), x),
                    Borrowed::new(k.stream(), gate),
                )
            };
            sigmoid_gate_mul(
                k,
                dev_mut(k, &mut *x),
                ld_x,
                dev(k, &*gate),
                ld_gate,
                rows,
                width,
            )
        })
    })
}
