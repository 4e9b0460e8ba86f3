//! Timing shared by the probes (`#[path]`-included: examples have no library of their own): CUDA
//! event medians, the streaming limit, a pass of persistent launches, a stamped launch.

use aot_kernels::dispatch::LoadedKernels;
use cudarc::driver::sys::CUevent_flags;

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median milliseconds of `runs` calls of `f` (after two warm-ups), each timed by CUDA events.
pub fn time(
    kernels: &LoadedKernels,
    runs: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let s = kernels.stream();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut ms = Vec::with_capacity(runs);
    for i in 0..runs + 2 {
        let a = s.record_event(flags).map_err(|e| e.to_string())?;
        f()?;
        let b = s.record_event(flags).map_err(|e| e.to_string())?;
        b.synchronize().map_err(|e| e.to_string())?;
        if i >= 2 {
            ms.push(f64::from(a.elapsed_ms(&b).map_err(|e| e.to_string())?));
        }
    }
    Ok(median(ms))
}

/// The limit over `bytes`: each streaming reader of the bench (`stream_read`) timed over that many
/// bytes (rounded down to whole 16-byte vectors), one line each; the faster one's GB/s.
pub fn limit_gbs(kernels: &LoadedKernels, bytes: usize, runs: usize) -> Result<f64, String> {
    use aot_kernels::ops::stream_read::{stream_read, Reader};
    use aot_kernels::ops::{dev, dev_mut};
    let s = kernels.stream();
    let words = bytes / 4 / 4 * 4;
    let data = s.alloc_zeros::<u32>(words).map_err(|e| e.to_string())?;
    let mut best = 0.0f64;
    for reader in Reader::ALL {
        let mut xor = s
            .alloc_zeros::<u32>(reader.blocks(kernels.sm_count()))
            .map_err(|e| e.to_string())?;
        let ms = time(kernels, runs, || {
            stream_read(
                kernels,
                reader,
                dev(kernels, &data),
                dev_mut(kernels, &mut xor),
            )
            .map_err(|e| e.to_string())
        })?;
        let gbs = (words * 4) as f64 / (ms * 1e-3) / 1e9;
        println!(
            "limit: {} reads {:.2} GB in {:.1} us = {gbs:.0} GB/s",
            reader.entry(),
            (words * 4) as f64 / 1e9,
            ms * 1e3
        );
        best = best.max(gbs);
    }
    Ok(best)
}

/// Median milliseconds of `runs` passes that launch each of `steps` once, in order.
pub fn time_launches(
    kernels: &LoadedKernels,
    runs: usize,
    steps: &mut [aot_kernels::ops::persistent::PersistentStep<'_>],
) -> Result<f64, String> {
    time(kernels, runs, || {
        steps
            .iter_mut()
            .try_for_each(|st| st.launch(kernels))
            .map_err(|e| e.to_string())
    })
}

/// One stamped launch of `step` (its stamps switched on for good): every run's stamps.
pub fn stamped_launch(
    kernels: &LoadedKernels,
    step: &mut aot_kernels::ops::persistent::PersistentStep<'_>,
) -> Result<Vec<aot_kernels::ops::persistent::RunStamp>, String> {
    let e = |e: aot_kernels::ops::OpsError| e.to_string();
    step.enable_stamps(kernels).map_err(e)?;
    step.launch(kernels).map_err(e)?;
    step.read_stamps(kernels).map_err(e)
}
