//! The software GPU itself (`kernels_gpu::prim::cpu`): barriers order a block's threads, shared
//! memory starts poisoned, warp collectives exchange lanes, blocks run one after another, and a
//! launch that cannot finish (a deadlocked barrier, a panicking thread) fails instead of hanging.
use std::sync::atomic::{AtomicU32, Ordering};

use kernels_gpu::prim::{self, cpu};

/// Each thread writes its slot of shared memory, waits at the barrier, then reads its
/// neighbour's: every read sees the neighbour's write, never the poison, in every block.
#[test]
fn barrier_orders_shared_memory_across_threads() {
    let (grid, threads) = (3u32, 96u32);
    let out: Vec<AtomicU32> = (0..grid * threads).map(|_| AtomicU32::new(0)).collect();
    cpu::launch((grid, 1, 1), (threads, 1, 1), threads * 4, || {
        let t = prim::thread_idx_x();
        let b = prim::block_idx_x();
        let sm = prim::dyn_smem::<u32>();
        // SAFETY: one u32 per thread of the block's dynamic shared memory.
        unsafe {
            // Before its write the slot holds the poison (no other thread writes it).
            assert_eq!(*sm.add(t as usize), u32::MAX, "shared memory not poisoned");
            *sm.add(t as usize) = 1000 * b + t;
        }
        prim::sync_threads();
        let next = (t + 1) % threads;
        // SAFETY: as above.
        let seen = unsafe { *sm.add(next as usize) };
        out[(b * threads + t) as usize].store(seen, Ordering::Relaxed);
    });
    for b in 0..grid {
        for t in 0..threads {
            assert_eq!(out[(b * threads + t) as usize].load(Ordering::Relaxed), 1000 * b + (t + 1) % threads);
        }
    }
}

/// A warp sum reaches every lane of every warp.
#[test]
fn warp_sum_reaches_every_lane() {
    let threads = 96u32;
    let out: Vec<AtomicU32> = (0..threads).map(|_| AtomicU32::new(0)).collect();
    cpu::launch((1, 1, 1), (threads, 1, 1), 0, || {
        let t = prim::thread_idx_x();
        out[t as usize].store(prim::warp_sum_f32(t as f32) as u32, Ordering::Relaxed);
    });
    for t in 0..threads {
        let w = t / 32;
        assert_eq!(out[t as usize].load(Ordering::Relaxed), (32 * w..32 * w + 32).sum::<u32>(), "lane {t}");
    }
}

/// Thread 0 leaves the kernel before the barrier the others wait at: the launch panics with a
/// deadlock message (on a GPU this is undefined; here it must not hang the test run).
#[test]
#[should_panic(expected = "deadlocked")]
fn barrier_no_thread_can_leave_panics() {
    cpu::launch((1, 1, 1), (64, 1, 1), 0, || {
        if prim::thread_idx_x() != 0 {
            prim::sync_threads();
        }
    });
}

/// A thread that panics (a kernel's `trap`) ends the launch with its panic.
#[test]
#[should_panic(expected = "trap")]
fn a_trapping_thread_ends_the_launch() {
    cpu::launch((2, 1, 1), (64, 1, 1), 0, || {
        prim::sync_threads();
        if prim::block_idx_x() == 1 && prim::thread_idx_x() == 17 {
            prim::trap();
        }
        prim::sync_threads();
    });
}
