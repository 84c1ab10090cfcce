//! Device time from CUPTI kernel activity records (docs/ops.md "How time is measured").
//!
//! Only `CONCURRENT_KERNEL` records are collected (memcpy/memset records are not counted). Each
//! timed call is isolated: L2 flush (a memset, not a kernel), synchronize, the call, synchronize,
//! then a forced CUPTI flush delivers exactly that call's kernel records.
use std::sync::Mutex;

use cudarc::cupti::{result::activity, sys};

/// One kernel's execution interval, in ns of the GPU clock.
#[derive(Clone, Debug)]
pub struct KernelRecord {
    pub start: u64,
    pub end: u64,
    pub name: String,
}

static RECORDS: Mutex<Vec<KernelRecord>> = Mutex::new(Vec::new());
const BUFFER_BYTES: usize = 4 << 20;

unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let layout = std::alloc::Layout::from_size_align(BUFFER_BYTES, 8).unwrap();
    *buffer = std::alloc::alloc(layout);
    *size = if (*buffer).is_null() { 0 } else { BUFFER_BYTES };
    *max_records = 0;
}

unsafe extern "C" fn buffer_completed(
    _ctx: cudarc::driver::sys::CUcontext,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    let mut out = RECORDS.lock().unwrap();
    let mut rec: *mut sys::CUpti_Activity = std::ptr::null_mut();
    while activity::get_next_record(buffer, valid, &mut rec).is_ok() {
        if (*rec).kind == sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
            || (*rec).kind == sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL
        {
            // start/end sit at the same offsets in every kernel record version since 4.
            let k = rec as *const sys::CUpti_ActivityKernel10;
            let name = if (*k).name.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr((*k).name).to_string_lossy().into_owned()
            };
            out.push(KernelRecord { start: (*k).start, end: (*k).end, name });
        }
    }
    if !buffer.is_null() {
        std::alloc::dealloc(buffer, std::alloc::Layout::from_size_align(BUFFER_BYTES, 8).unwrap());
    }
}

/// Whether libcupti can be loaded (CUPTI ships in `/usr/local/cuda/lib64`; put it on
/// `LD_LIBRARY_PATH`).
pub fn available() -> bool {
    unsafe { sys::is_culib_present() }
}

/// Starts collecting kernel records. Call once, before the first timed call.
pub fn start() -> Result<(), String> {
    activity::register_callbacks(Some(buffer_requested), Some(buffer_completed))
        .map_err(|e| format!("cuptiActivityRegisterCallbacks: {e:?}"))?;
    activity::enable(sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
        .map_err(|e| format!("cuptiActivityEnable(CONCURRENT_KERNEL): {e:?}"))?;
    Ok(())
}

/// Delivers every pending record and returns those collected since the last call.
pub fn drain() -> Result<Vec<KernelRecord>, String> {
    activity::flush_all(1).map_err(|e| format!("cuptiActivityFlushAll: {e:?}"))?;
    Ok(std::mem::take(&mut *RECORDS.lock().unwrap()))
}

/// The union of the kernels' `[start, end)` intervals, in ns.
pub fn union_ns(records: &[KernelRecord]) -> u64 {
    let mut iv: Vec<(u64, u64)> = records.iter().map(|r| (r.start, r.end.max(r.start))).collect();
    iv.sort_unstable();
    let (mut total, mut cur) = (0u64, None::<(u64, u64)>);
    for (s, e) in iv {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    total + cur.map_or(0, |(s, e)| e - s)
}

#[cfg(test)]
mod tests {
    use super::*;
    fn r(start: u64, end: u64) -> KernelRecord {
        KernelRecord { start, end, name: String::new() }
    }
    #[test]
    fn union_merges_overlaps_and_keeps_gaps_out() {
        assert_eq!(union_ns(&[]), 0);
        assert_eq!(union_ns(&[r(10, 20)]), 10);
        assert_eq!(union_ns(&[r(10, 20), r(15, 30)]), 20);
        assert_eq!(union_ns(&[r(40, 50), r(10, 20)]), 20);
        assert_eq!(union_ns(&[r(10, 20), r(12, 14), r(20, 25)]), 15);
    }
}
