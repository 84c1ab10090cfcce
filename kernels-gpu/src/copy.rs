//! A plain device copy: the measured floor of a memory-bound op. The bench times a chain of
//! these over the same bytes as an FFT plan (one copy per pass, launched like the passes), so
//! "how close to the limit" is a number measured in the same run, not a datasheet figure.

use crate::prim::*;
use kernel_abi::DeviceCopyArgs;

/// 16-byte chunks each thread moves per round: all loads are issued before the first store.
/// Two, with 256-thread blocks and one round per thread, was the fastest copy on 8 of the ten
/// FFT rows' byte counts on the H200 and within 0.03 µs on a ninth (sweep of 2/4/8 chunks,
/// 128–1024 threads, one round or 4–8 persistent blocks per SM; 4 chunks: +0.1 µs at 4k, +0.2
/// at 64k, +2.2 at 1M c128, but −0.45 at 16k; 8 chunks or 512–1024 threads up to +1 µs;
/// docs/decisions/fft.md).
pub const COPY_UNROLL: usize = 2;

kernel_abi::device_copy_entry!(device_copy_16b, a => { copy_16b(a) });

/// `dst[i] = src[i]` for `chunks` 16-byte chunks (both 16-byte aligned, not overlapping).
///
/// Like every pass of a multi-pass FFT it lets its programmatic dependent start at entry and
/// waits for the grid it depends on (a no-op for an ordinary launch) before the first load.
#[inline(always)]
unsafe fn copy_16b(a: DeviceCopyArgs) {
    let DeviceCopyArgs { src, dst, chunks } = a;
    grid_launch_dependents();
    grid_dependency_wait();
    let threads = block_dim_x() as u64;
    let stride = grid_dim_x() as u64 * threads * COPY_UNROLL as u64;
    let mut base = block_idx_x() as u64 * threads * COPY_UNROLL as u64 + thread_idx_x() as u64;
    while base < chunks {
        let mut v = [[0u32; 4]; COPY_UNROLL];
        let mut k = 0;
        while k < COPY_UNROLL {
            let i = base + k as u64 * threads;
            if i < chunks {
                v[k] = ld_nc_v4(src.add(4 * i as usize));
            }
            k += 1;
        }
        let mut k = 0;
        while k < COPY_UNROLL {
            let i = base + k as u64 * threads;
            if i < chunks {
                st_v4(dst.add(4 * i as usize), v[k]);
            }
            k += 1;
        }
        base += stride;
    }
}
