//! The software GPU itself (`kernels_gpu::prim::cpu`): barriers order a block's threads, shared
//! memory starts poisoned, warp collectives exchange lanes, a cluster's blocks see each other's
//! shared memory (and, without a cluster barrier, not yet the others' writes), blocks run one
//! after another, a launch that cannot finish (a deadlocked barrier, a panicking thread) fails
//! instead of hanging, and a programmatic dependent launch sees the previous launch's writes
//! only after its `griddepcontrol.wait`.
use std::sync::atomic::{AtomicU32, Ordering};

use kernels_gpu::prim::{self, cpu};

/// Each thread writes its slot of shared memory, waits at the barrier, then reads both
/// neighbours': every read sees the neighbour's write, never the poison or another block's
/// value, in every block (a missing barrier fails whichever neighbour runs later).
#[test]
fn barrier_orders_shared_memory_across_threads() {
    let (grid, threads) = (3u32, 96u32);
    let out: Vec<AtomicU32> = (0..2 * grid * threads).map(|_| AtomicU32::new(0)).collect();
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
        let (next, prev) = ((t + 1) % threads, (t + threads - 1) % threads);
        // SAFETY: as above.
        let (n, p) = unsafe { (*sm.add(next as usize), *sm.add(prev as usize)) };
        out[(2 * (b * threads + t)) as usize].store(n, Ordering::Relaxed);
        out[(2 * (b * threads + t) + 1) as usize].store(p, Ordering::Relaxed);
    });
    for b in 0..grid {
        for t in 0..threads {
            let i = (2 * (b * threads + t)) as usize;
            assert_eq!(out[i].load(Ordering::Relaxed), 1000 * b + (t + 1) % threads, "block {b} thread {t}");
            assert_eq!(
                out[i + 1].load(Ordering::Relaxed),
                1000 * b + (t + threads - 1) % threads,
                "block {b} thread {t}"
            );
        }
    }
}

/// Two clusters of two 64-thread blocks: each thread writes its slot of its block's shared
/// memory (after a block barrier), then `order` (the barrier under test), then reads slot
/// `(t + 1) mod 64` of the other block's through `mapa`; the values read, by block and thread.
fn read_the_other_blocks_shared_memory(order: fn()) -> Vec<u32> {
    let (grid, threads) = (4u32, 64u32);
    let out: Vec<AtomicU32> = (0..grid * threads).map(|_| AtomicU32::new(0)).collect();
    cpu::launch_cluster((grid, 1, 1), (threads, 1, 1), 2, threads * 4, || {
        let t = prim::thread_idx_x();
        let b = prim::block_idx_x();
        let rank = prim::cluster_ctarank();
        assert_eq!((prim::cluster_nctarank(), rank), (2, b % 2));
        let sm = prim::dyn_smem::<u32>();
        prim::sync_threads();
        // SAFETY: one u32 per thread of the block's dynamic shared memory.
        unsafe { *sm.add(t as usize) = 1000 * b + t };
        order();
        let other = prim::mapa(sm as *const u32, 1 - rank);
        // SAFETY: the other block's buffer (written before `order`, or racing with the read).
        let v = unsafe { *other.add(((t + 1) % threads) as usize) };
        out[(b * threads + t) as usize].store(v, Ordering::Relaxed);
        // Neither block leaves while the other may still read its shared memory.
        prim::cluster_arrive();
        prim::cluster_wait();
    });
    out.into_iter().map(AtomicU32::into_inner).collect()
}

/// Thread-block clusters: each block writes its shared memory, the cluster barrier, then every
/// thread reads the other block's through `mapa`, over two clusters of two blocks.
#[test]
fn cluster_blocks_read_each_others_shared_memory() {
    let threads = 64;
    let out = read_the_other_blocks_shared_memory(|| {
        prim::cluster_arrive();
        prim::cluster_wait();
    });
    for b in 0..4 {
        for t in 0..threads {
            let other = b ^ 1;
            assert_eq!(out[(b * threads + t) as usize], 1000 * other + (t + 1) % threads);
        }
    }
}

/// In each cluster one block runs ahead of the others through its own barriers (the `k`-th
/// cluster's block `k mod 2`): its reads of the other block's shared memory after only a block
/// barrier (no cluster barrier) find writes not yet made (the poison), so a missing cluster
/// barrier fails, whichever block reads early.
#[test]
fn cluster_read_without_cluster_barrier_sees_the_poison() {
    let threads = 64;
    let out = read_the_other_blocks_shared_memory(prim::sync_threads);
    // Block 0 leads the first cluster, block 3 (rank 1) the second.
    for b in [0, 3] {
        let poisoned = (0..threads).filter(|&t| out[b * threads + t] == u32::MAX).count();
        assert!(poisoned > 0, "every read of block {b} saw the other block's write");
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

/// The global index of this thread in a one-dimensional launch.
fn global_id() -> usize {
    (prim::block_idx_x() * prim::block_dim_x() + prim::thread_idx_x()) as usize
}

/// A plain launch writes `src`; a dependent launch reads it before and after its
/// `griddepcontrol.wait`. Before the wait every block sees `src` as it was before the first
/// launch (the previous kernel may not have run yet), after it the first launch's values; and
/// the buffer holds them once the launch is over.
#[test]
fn a_dependent_launch_sees_the_previous_writes_only_after_its_wait() {
    let (grid, threads) = (3u32, 64u32);
    let n = (grid * threads) as usize;
    let mut src = sim::DevBuf::zeroed(4 * n);
    let mut seen = sim::DevBuf::zeroed(8 * n);
    let (s, o) = (src.addr() as usize, seen.addr() as usize);
    cpu::launch((grid, 1, 1), (threads, 1, 1), 0, || {
        let i = global_id();
        // SAFETY: `n` u32 of `src`.
        unsafe { *(s as *mut u32).add(i) = 7 + i as u32 };
    });
    cpu::launch_dependent((grid, 1, 1), (threads, 1, 1), 0, || {
        let i = global_id();
        // SAFETY: `n` u32 of `src`, `2n` of `seen`.
        unsafe {
            let before = *(s as *const u32).add(i);
            prim::grid_dependency_wait();
            let after = *(s as *const u32).add(i);
            *(o as *mut u32).add(2 * i) = before;
            *(o as *mut u32).add(2 * i + 1) = after;
        }
    });
    let v = seen.read::<u32>();
    for i in 0..n {
        assert_eq!((v[2 * i], v[2 * i + 1]), (0, 7 + i as u32), "thread {i}");
    }
    assert_eq!(src.read::<u32>(), (0..n as u32).map(|i| 7 + i).collect::<Vec<_>>());
}

/// A barrier that one thread reaches before its wait and the others after theirs: on the GPU
/// the previous kernel ends on its own and the block goes on; here too (no deadlock), and every
/// read after a wait sees the previous launch's writes. A dependent kernel without a wait sees
/// them in none of its blocks.
#[test]
fn a_dependent_launch_with_a_barrier_before_one_wait_completes() {
    let (grid, threads) = (2u32, 64u32);
    let n = (grid * threads) as usize;
    let mut src = sim::DevBuf::zeroed(4 * n);
    let mut seen = sim::DevBuf::zeroed(4 * n);
    let (s, o) = (src.addr() as usize, seen.addr() as usize);
    let write = || {
        let i = global_id();
        // SAFETY: `n` u32 of `src`.
        unsafe { *(s as *mut u32).add(i) = 100 + i as u32 };
    };
    cpu::launch((grid, 1, 1), (threads, 1, 1), 0, write);
    cpu::launch_dependent((grid, 1, 1), (threads, 1, 1), 0, || {
        if prim::thread_idx_x() == 0 {
            prim::sync_threads();
            prim::grid_dependency_wait();
        } else {
            prim::grid_dependency_wait();
            prim::sync_threads();
        }
        let i = global_id();
        // SAFETY: `n` u32 of `src` and of `seen`.
        unsafe { *(o as *mut u32).add(i) = *(s as *const u32).add(i) };
    });
    assert_eq!(seen.read::<u32>(), (0..n as u32).map(|i| 100 + i).collect::<Vec<_>>());
    // The same writes again (from a plain launch), then a dependent kernel that never waits.
    cpu::launch((grid, 1, 1), (threads, 1, 1), 0, || {
        let i = global_id();
        // SAFETY: as above.
        unsafe { *(s as *mut u32).add(i) = 300 + i as u32 };
    });
    cpu::launch_dependent((grid, 1, 1), (threads, 1, 1), 0, || {
        let i = global_id();
        // SAFETY: as above.
        unsafe { *(o as *mut u32).add(i) = *(s as *const u32).add(i) };
    });
    assert_eq!(seen.read::<u32>(), (0..n as u32).map(|i| 100 + i).collect::<Vec<_>>());
    assert_eq!(src.read::<u32>(), (0..n as u32).map(|i| 300 + i).collect::<Vec<_>>());
}

/// The bytes between two the previous launch wrote are the dependent launch's to write before
/// its wait, and stay written.
#[test]
fn a_dependent_launch_keeps_its_stores_between_the_previous_writes() {
    let mut buf = sim::DevBuf::zeroed(16);
    let b = buf.addr() as usize;
    cpu::launch((1, 1, 1), (1, 1, 1), 0, || {
        // SAFETY: 16 bytes of `buf`.
        unsafe {
            *(b as *mut u32) = 7;
            *(b as *mut u32).add(2) = 7;
        }
    });
    cpu::launch_dependent((1, 1, 1), (1, 1, 1), 0, || {
        // SAFETY: as above.
        unsafe { *(b as *mut u32).add(1) = 5 };
        prim::grid_dependency_wait();
    });
    assert_eq!(buf.read::<u32>(), vec![7, 5, 7, 0]);
}

/// A store before the wait to a byte the previous launch wrote races with it on the GPU.
#[test]
#[should_panic(expected = "before griddepcontrol.wait, to a byte the previous launch wrote")]
fn a_dependent_store_before_the_wait_to_the_previous_writes_panics() {
    let mut buf = sim::DevBuf::zeroed(16);
    let b = buf.addr() as usize;
    cpu::launch((1, 1, 1), (1, 1, 1), 0, || {
        // SAFETY: 16 bytes of `buf`.
        unsafe { *(b as *mut u32) = 7 };
    });
    cpu::launch_dependent((1, 1, 1), (1, 1, 1), 0, || {
        // SAFETY: as above.
        unsafe { *(b as *mut u32) = 9 };
        prim::grid_dependency_wait();
    });
}

/// In a chain plain → dependent → dependent, the third may start while the first still runs
/// (each kernel lets its dependents start before its own wait): before its wait it sees
/// neither launch's writes.
#[test]
fn a_dependent_chain_undoes_every_launch_back_to_the_plain_one() {
    let mut buf = sim::DevBuf::zeroed(8);
    let mut seen = sim::DevBuf::zeroed(16);
    let (b, o) = (buf.addr() as usize, seen.addr() as usize);
    cpu::launch((1, 1, 1), (1, 1, 1), 0, || {
        // SAFETY: 8 bytes of `buf`.
        unsafe { *(b as *mut u32) = 1 };
    });
    cpu::launch_dependent((1, 1, 1), (1, 1, 1), 0, || {
        prim::grid_dependency_wait();
        // SAFETY: as above.
        unsafe { *(b as *mut u32).add(1) = 2 };
    });
    cpu::launch_dependent((1, 1, 1), (1, 1, 1), 0, || {
        // SAFETY: 8 bytes of `buf`, 16 of `seen`.
        unsafe {
            let before = [*(b as *const u32), *(b as *const u32).add(1)];
            prim::grid_dependency_wait();
            let after = [*(b as *const u32), *(b as *const u32).add(1)];
            for (i, v) in before.into_iter().chain(after).enumerate() {
                *(o as *mut u32).add(i) = v;
            }
        }
    });
    assert_eq!(seen.read::<u32>(), vec![0, 0, 1, 2]);
}

/// A `cp.async` copy poisons its destination when issued: a thread that reads the old contents
/// there without a barrier before the copy sees the poison (the next round reverses the
/// threads' order, so one of the two orders shows it).
#[test]
fn a_read_racing_a_cp_async_copy_sees_the_poison() {
    let threads = 64u32;
    let mut src = sim::DevBuf::from_slice(&vec![3u32; threads as usize * 4]);
    let mut seen = sim::DevBuf::zeroed(4 * threads as usize);
    let (s, o) = (src.addr() as usize, seen.addr() as usize);
    cpu::launch((1, 1, 1), (threads, 1, 1), threads * 16, || {
        let t = prim::thread_idx_x() as usize;
        let sm = prim::dyn_smem::<u32>();
        // SAFETY: 16 bytes of shared memory and of `src` per thread, 4 of `seen`.
        unsafe {
            *sm.add(4 * t) = 1;
            prim::sync_threads();
            // Thread t overwrites its slot while its neighbour may still read it (no barrier).
            cpu::cp_async_16(sm.add(4 * t) as *mut u8, (s as *const u8).add(16 * t));
            let n = (t + 1) % threads as usize;
            *(o as *mut u32).add(t) = *sm.add(4 * n);
            prim::sync_threads();
            cpu::cp_async_wait_all();
        }
    });
    let v = seen.read::<u32>();
    assert!(v.contains(&u32::MAX), "no read saw the poison: {v:?}");
    assert!(v.iter().all(|&x| x == 1 || x == u32::MAX), "{v:?}");
}
