//! The CPU backend: a software GPU that runs the kernels' own code on the host.
//!
//! [`launch`] runs a grid: every thread of a block (of a cluster's blocks) is a coroutine with a
//! stack of its own, all of them switched on the launching OS thread, the blocks (clusters) one
//! after another. A thread runs until it waits at a barrier (`sync_threads`, a warp collective,
//! the cluster barrier), then the next one runs (ascending order of thread in one round,
//! descending in the next; in a cluster launch every other round runs one block only),
//! so `sync_threads` is a real barrier, warp collectives meet in a per-warp exchange area
//! behind a per-warp barrier, and a last-block-done pattern sees every earlier block finished.
//! (One OS thread per GPU thread, parked at each barrier, spent most of the tests' time
//! switching threads in the kernel.) A barrier that no thread can leave stops the launch with a
//! panic instead of hanging. Shared memory is a per-block buffer filled with
//! 0xFF bytes (NaN in every float format) before each block, so a read before a write shows.
//!
//! Arithmetic is IEEE with the rounding of the PTX instruction. The `.approx` instructions
//! (`ex2`, `rcp`, `rsqrt`) are computed correctly rounded here; the GPU's approximations differ
//! from that by up to 2 ulp, so CPU results are compared to the f64 references with the GPU
//! tests' tolerances, not bitwise to the GPU. `mma` sums its products in f64 (exact for the
//! 16-bit inputs) and rounds once; the tensor cores' internal order differs likewise.
//! Loads and stores are plain memory accesses, atomics host atomics, prefetches no-ops.
//!
//! A programmatic dependent launch ([`launch_dependent`]) runs each block (cluster) with the
//! writes of the launches before it (back to the last plain launch) to the registered device
//! buffers undone until every thread of it has reached its `griddepcontrol.wait` or its end:
//! the timing in which those kernels finish as late as the dependent one allows, so a read of
//! their outputs before the wait sees what was there before they ran, and a store before the
//! wait to a byte they wrote panics.
//!
//! A `cp.async` copy reads its source at issue, poisons its destination (0xFF) and writes it
//! only when one of its thread's waits covers its group (`cp.async.wait_group` / `wait_all`,
//! with PTX's group accounting), so a shared read that a missing or miscounted wait leaves
//! uncovered, or one of the old contents that a missing barrier leaves after the issue, sees
//! the poison; copies no wait covered are dropped at the end of the block.
#![allow(clippy::missing_safety_doc)]

use core::cell::{Cell, RefCell};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::collections::VecDeque;
use std::vec::Vec;

// ---------------------------------------------------------------- launch

/// A barrier of `n` emulated threads. They all run on the launching OS thread, so plain cells
/// suffice: an arrival that does not complete the barrier yields to the next thread until the
/// last arrival opens it (a new generation).
struct Barrier {
    n: usize,
    arrived: Cell<usize>,
    generation: Cell<u64>,
}

impl Barrier {
    fn new(n: usize) -> Self {
        Barrier { n, arrived: Cell::new(0), generation: Cell::new(0) }
    }
    fn wait(&self) {
        let generation = self.generation.get();
        ARRIVALS.with(|a| a.set(a.get() + 1));
        let arrived = self.arrived.get() + 1;
        if arrived == self.n {
            self.arrived.set(0);
            self.generation.set(generation + 1);
            return;
        }
        self.arrived.set(arrived);
        while self.generation.get() == generation {
            yield_now();
        }
    }
}

/// The values a warp's lanes exchange in one collective (an `mma` fragment is the largest).
const XCH_WORDS: usize = 10;

struct Warp {
    bar: Barrier,
    xch: Vec<AtomicU64>,
}

/// One block slot of a cluster: its barrier, warps and shared memory. Consecutive blocks
/// alternate between two shared-memory buffers, so one barrier between blocks suffices: the
/// next block's buffer is poisoned while the current one runs.
struct BlockSlot {
    bar: Barrier,
    warps: Vec<Warp>,
    smem: [Vec<u128>; 2],
}

/// The state the threads of one cluster (one block without clusters) share.
struct Cluster {
    bar: Barrier,
    slots: Vec<BlockSlot>,
    smem_bytes: usize,
    /// In a dependent launch, the earlier launches' writes and the block round's phase.
    dep: Option<DependentPhase>,
    /// The rank of the block that runs ahead in this block round (the `k`-th cluster's block
    /// `k mod cluster_x`; see `launch_any`), set by the round's first thread, and that round.
    lead: Cell<u32>,
    lead_set_in: Cell<u64>,
}

/// One run of bytes that the launches since the dependent chain's first changed in a
/// registered buffer (every byte of it changed): `[at, at + before.len())` before they ran
/// (`before`) and after (`after`).
struct ChangedSpan {
    at: usize,
    before: Vec<u8>,
    after: Vec<u8>,
}

/// A dependent launch's view of the launches before it, back to the last plain one (see the
/// module doc): their writes, undone at the start of each block round and redone once every
/// thread of the round has reached its wait or its end (or every thread left waits: those
/// kernels may end at any time).
struct DependentPhase {
    spans: RefCell<Vec<ChangedSpan>>,
    round: Cell<u64>,
    /// Threads of the round not yet at their wait or their end.
    pending: Cell<usize>,
    undone: Cell<bool>,
    threads: usize,
    /// The launch's block rounds, and whether each is emulated (else only the first
    /// [`SAMPLED_ROUNDS`] and the last: the undo and redo copy every changed byte per round).
    rounds: u64,
    every_round: bool,
}

/// With more than [`UNDO_BYTES`] of undo and redo copies over the launch, a dependent launch
/// emulates only its first rounds and its last; the others run after the previous kernel's end
/// (a timing the GPU allows too).
const SAMPLED_ROUNDS: u64 = 4;
const UNDO_BYTES: usize = 1 << 30;

impl DependentPhase {
    fn new(spans: Vec<ChangedSpan>, threads: usize, rounds: u64) -> Self {
        let bytes: usize = spans.iter().map(|s| s.before.len()).sum();
        DependentPhase {
            spans: RefCell::new(spans),
            round: Cell::new(0),
            pending: Cell::new(0),
            undone: Cell::new(false),
            threads,
            rounds,
            every_round: bytes.saturating_mul(rounds as usize) <= UNDO_BYTES,
        }
    }
    /// The first thread of block round `round` undoes the previous launch's writes (every
    /// thread of the round before has passed the cluster barrier: none is in kernel code).
    fn enter(&self, round: u64) {
        if self.round.get() != round {
            self.round.set(round);
            self.pending.set(self.threads);
            if !(self.every_round || round <= SAMPLED_ROUNDS || round == self.rounds) {
                return;
            }
            for sp in self.spans.borrow_mut().iter_mut() {
                // SAFETY: `at` addresses `before.len()` bytes of a registered buffer, live for
                // the launch.
                unsafe {
                    core::ptr::copy_nonoverlapping(sp.at as *const u8, sp.after.as_mut_ptr(), sp.after.len());
                    core::ptr::copy_nonoverlapping(sp.before.as_ptr(), sp.at as *mut u8, sp.before.len());
                }
            }
            self.undone.set(true);
        }
    }
    /// Puts the previous launch's writes (and the dependent's own since) back. A byte they
    /// wrote that no longer holds its undone value was stored to before a wait: a race with the
    /// previous kernel on the GPU.
    fn redo(&self) {
        if self.undone.get() {
            for sp in self.spans.borrow().iter() {
                // SAFETY: as in `enter`.
                let now = unsafe { core::slice::from_raw_parts(sp.at as *const u8, sp.before.len()) };
                if now != &sp.before[..] {
                    let i = (0..now.len()).find(|&i| now[i] != sp.before[i]).unwrap_or(0);
                    panic!(
                        "a store at {:#x} before griddepcontrol.wait, to a byte the previous launch wrote",
                        sp.at + i
                    );
                }
                // SAFETY: as in `enter`.
                unsafe { core::ptr::copy_nonoverlapping(sp.after.as_ptr(), sp.at as *mut u8, sp.after.len()) };
            }
            self.undone.set(false);
        }
    }
    /// One thread of the round reached its wait or its end.
    fn arrive(&self) {
        ARRIVALS.with(|a| a.set(a.get() + 1));
        let left = self.pending.get() - 1;
        self.pending.set(left);
        if left == 0 {
            self.redo();
        }
    }
}

/// What one emulated thread knows about itself.
struct Thread {
    tid: (u32, u32),
    bdim: (u32, u32),
    gdim: (u32, u32, u32),
    bid: Cell<(u32, u32, u32)>,
    /// The slot's shared-memory buffer of the current block.
    buf: Cell<usize>,
    rank: u32,
    cluster: *const Cluster,
    /// Its `cp.async` copies in flight.
    cp_async: RefCell<CpAsync>,
    /// In a dependent launch: whether it has reached its wait (or end) in this block round.
    dep_arrived: Cell<bool>,
}

/// One thread's `cp.async` copies not yet written: those issued since its last commit, and the
/// committed groups, oldest first.
#[derive(Default)]
struct CpAsync {
    open: Vec<PendingCopy>,
    groups: VecDeque<Vec<PendingCopy>>,
}

/// A copy's source bytes (read at issue) and its shared-memory destination.
struct PendingCopy {
    dst: *mut u8,
    bytes: [u8; 16],
    len: usize,
}

impl CpAsync {
    /// Writes every committed group but the newest `keep`.
    fn complete_all_but(&mut self, keep: usize) {
        while self.groups.len() > keep {
            for c in self.groups.pop_front().unwrap_or_default() {
                // SAFETY: `dst` addresses `len` bytes of the block's shared memory (checked at
                // issue); the block is still running (pending copies are dropped at its end).
                unsafe { core::ptr::copy_nonoverlapping(c.bytes.as_ptr(), c.dst, c.len) };
            }
        }
    }
}

/// An emulated thread's coroutine: resumed with nothing, yields nothing (it only hands over).
type GpuThread = Coroutine<(), (), ()>;

std::thread_local! {
    /// The emulated thread running on this OS thread, set by the thread itself whenever it runs.
    static THREAD: Cell<*const Thread> = const { Cell::new(core::ptr::null()) };
    /// Its coroutine's handle back to the launch's scheduler.
    static YIELDER: Cell<*const Yielder<(), ()>> = const { Cell::new(core::ptr::null()) };
    /// Barrier arrivals on this OS thread: a scheduling round without one is a deadlock.
    static ARRIVALS: Cell<u64> = const { Cell::new(0) };
}

/// Sets this OS thread's [`THREAD`] and [`YIELDER`] when dropped: after a suspend returns, and
/// also when it unwinds (a launch dropping its suspended threads after a panic), so code that
/// runs on a thread's stack always sees that thread's own pointers.
struct Current(*const Thread, *const Yielder<(), ()>);

impl Drop for Current {
    fn drop(&mut self) {
        THREAD.with(|t| t.set(self.0));
        YIELDER.with(|t| t.set(self.1));
    }
}

/// Hands the OS thread to the next emulated thread; returns when the scheduler resumes this one.
fn yield_now() {
    let (me, y) = (THREAD.with(|t| t.get()), YIELDER.with(|t| t.get()));
    assert!(!y.is_null(), "a GPU barrier outside prim::cpu::launch");
    let _restore = Current(me, y);
    // SAFETY: set by this coroutine from the yielder its body received, which lives as long as
    // the coroutine.
    unsafe { (*y).suspend(()) };
}

fn thread() -> &'static Thread {
    let p = THREAD.with(|t| t.get());
    assert!(!p.is_null(), "a GPU primitive called outside prim::cpu::launch");
    // SAFETY: set by `launch` for the lifetime of the emulated thread, cleared before the
    // `Thread` is dropped.
    unsafe { &*p }
}

fn cluster() -> &'static Cluster {
    // SAFETY: the cluster outlives every thread of the launch.
    unsafe { &*thread().cluster }
}

fn linear_tid() -> u32 {
    let t = thread();
    t.tid.1 * t.bdim.0 + t.tid.0
}

fn slot() -> &'static BlockSlot {
    &cluster().slots[thread().rank as usize]
}

fn warp() -> &'static Warp {
    &slot().warps[(linear_tid() / 32) as usize]
}

/// Runs `f` as a kernel: `grid` blocks of `block` threads (z of the block must be 1), each
/// block with `smem_bytes` of dynamic shared memory.
pub fn launch(grid: (u32, u32, u32), block: (u32, u32, u32), smem_bytes: u32, f: impl Fn()) {
    launch_cluster(grid, block, 1, smem_bytes, f)
}

/// [`launch`] as a programmatic dependent of the previous launch on this OS thread (see the
/// module doc).
pub fn launch_dependent(grid: (u32, u32, u32), block: (u32, u32, u32), smem_bytes: u32, f: impl Fn()) {
    launch_any(grid, block, 1, smem_bytes, true, f)
}

/// [`launch`] with thread-block clusters of `cluster_x` blocks along x: a cluster's blocks run
/// at once (their cluster barriers and `mapa` accesses meet), the clusters one after another.
pub fn launch_cluster(grid: (u32, u32, u32), block: (u32, u32, u32), cluster_x: u32, smem_bytes: u32, f: impl Fn()) {
    launch_any(grid, block, cluster_x, smem_bytes, false, f)
}

fn launch_any(
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    cluster_x: u32,
    smem_bytes: u32,
    dependent: bool,
    f: impl Fn(),
) {
    assert_eq!(block.2, 1, "three-dimensional blocks are not emulated");
    // A dependent launch may start while every launch back to the chain's first (the last
    // plain launch) still runs: each passes `griddepcontrol.launch_dependents` before its own
    // wait. So it undoes what they all changed since that launch's start snapshot.
    let spans = if dependent { Some(changed_since_snapshot()) } else { None };
    if !dependent {
        snapshot_globals();
    }
    assert!(
        cluster_x >= 1 && grid.0.is_multiple_of(cluster_x),
        "grid.x {} not a multiple of the cluster {cluster_x}",
        grid.0
    );
    let nthreads = (block.0 * block.1) as usize;
    assert!((1..=1024).contains(&nthreads), "{nthreads} threads per block");
    let smem_bytes = smem_bytes as usize;
    let slot = |_| BlockSlot {
        bar: Barrier::new(nthreads),
        warps: (0..nthreads.div_ceil(32))
            .map(|w| Warp {
                bar: Barrier::new((nthreads - 32 * w).min(32)),
                xch: (0..32 * XCH_WORDS).map(|_| AtomicU64::new(0)).collect(),
            })
            .collect(),
        smem: [(); 2].map(|_| std::vec![u128::MAX; smem_bytes.div_ceil(16).max(1)]),
    };
    let cl = Cluster {
        bar: Barrier::new(nthreads * cluster_x as usize),
        slots: (0..cluster_x).map(slot).collect(),
        smem_bytes,
        dep: spans.map(|spans| {
            let rounds = (grid.0 / cluster_x) as u64 * grid.1 as u64 * grid.2 as u64;
            DependentPhase::new(spans, nthreads * cluster_x as usize, rounds)
        }),
        lead: Cell::new(0),
        lead_set_in: Cell::new(0),
    };
    let (f, cl) = (&f, &cl);
    let body = move |rank: u32, t: u32| {
        move |y: &Yielder<(), ()>, ()| {
            let me = Thread {
                tid: (t % block.0, t / block.0),
                bdim: (block.0, block.1),
                gdim: grid,
                bid: Cell::new((0, 0, 0)),
                buf: Cell::new(0),
                rank,
                cluster: cl,
                cp_async: RefCell::new(CpAsync::default()),
                dep_arrived: Cell::new(false),
            };
            THREAD.with(|c| c.set(&me));
            YIELDER.with(|c| c.set(y));
            // Whichever way the body ends, nothing on this OS thread points at it afterwards.
            let _leave = Current(core::ptr::null(), core::ptr::null());
            let mut round = 0u64;
            for z in 0..grid.2 {
                for yb in 0..grid.1 {
                    for x0 in (0..grid.0).step_by(cluster_x as usize) {
                        round += 1;
                        if let Some(d) = &cl.dep {
                            d.enter(round);
                            me.dep_arrived.set(false);
                        }
                        me.bid.set((x0 + rank, yb, z));
                        if cl.lead_set_in.replace(round) != round {
                            cl.lead.set((round - 1) as u32 % cluster_x);
                        }
                        let buf = me.buf.get();
                        if t == 0 {
                            // The other buffer: the previous block's, which every thread has
                            // left (the barrier below), and the next block's.
                            let p = cl.slots[rank as usize].smem[1 - buf].as_ptr() as *mut u8;
                            // SAFETY: the slot's buffer, no thread accessing it.
                            unsafe { core::ptr::write_bytes(p, 0xFF, cl.smem_bytes) };
                        }
                        f();
                        // Copies no wait covered would land in the next block's buffer.
                        *me.cp_async.borrow_mut() = CpAsync::default();
                        if let Some(d) = &cl.dep {
                            if !me.dep_arrived.replace(true) {
                                d.arrive();
                            }
                        }
                        cl.bar.wait();
                        me.buf.set(1 - buf);
                    }
                }
            }
        }
    };
    // Clears this OS thread's pointers to the launch's threads however the launch ends (declared
    // before `threads`, so dropped after them: a panic force-unwinds the suspended ones first).
    let _reset = Current(core::ptr::null(), core::ptr::null());
    let mut threads: Vec<GpuThread> = Vec::with_capacity(nthreads * cluster_x as usize);
    for rank in 0..cluster_x {
        for t in 0..nthreads as u32 {
            let stack = DefaultStack::new(STACK_BYTES).expect("allocating an emulated GPU thread's stack");
            // SAFETY: the body borrows `f` and `cl`, which outlive `threads` (dropped, or run to
            // completion, before this function returns).
            threads.push(unsafe { Coroutine::with_stack_unchecked(stack, body(rank, t)) });
        }
    }
    // Rounds: each live thread runs to its next barrier wait (or its end), in ascending order of
    // thread in one round and descending in the next, so a read of another thread's write that
    // lacks a barrier sees the poison or a stale value whichever of the two threads comes first.
    // In a cluster launch every other round resumes only one block's threads (block `k mod
    // cluster_x` of the `k`-th cluster), so that block runs ahead of the others through its own
    // barriers until a cluster barrier holds it: its read of another block's shared memory that
    // no cluster barrier orders after that block's writes sees the poison or stale data.
    let mut live: Vec<usize> = (0..threads.len()).collect();
    let mut lead_only = true;
    while !live.is_empty() {
        let before = ARRIVALS.with(|a| a.get());
        lead_only = cluster_x > 1 && !lead_only;
        let lead = cl.lead.get() as usize;
        live.retain(|&i| {
            (lead_only && i / nthreads != lead) || matches!(threads[i].resume(()), CoroutineResult::Yield(()))
        });
        live.reverse();
        if lead_only {
            // Idleness (a deadlock, a dependency wait to release) is judged on full rounds.
            continue;
        }
        let idle = ARRIVALS.with(|a| a.get()) == before;
        // Threads held at their dependency wait while others cannot move (a barrier before
        // some thread's wait): the previous kernel may end now, as on the GPU.
        if let Some(d) = cl.dep.as_ref().filter(|d| idle && !live.is_empty() && d.undone.get()) {
            d.redo();
            continue;
        }
        assert!(
            live.is_empty() || !idle,
            "emulated GPU threads deadlocked: {} of {} wait at barriers no other thread will reach",
            live.len(),
            threads.len()
        );
    }
}

/// Stack of one emulated thread (a mapping of its own, read-write, committed as its pages are
/// touched): the largest kernel frame at the host's opt-level 2 is under 2 KB. The guard page
/// below it turns an overflow into a fault (a bare SIGSEGV of the test process), not a
/// corruption.
const STACK_BYTES: usize = 4 << 20;

/// Runs `kernel(args)` as [`launch`] does, or with `dependent` as [`launch_dependent`] does.
pub fn launch_kernel<A: Copy>(
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem_bytes: u32,
    dependent: bool,
    kernel: unsafe fn(A),
    args: A,
) {
    // SAFETY: the caller's buffers back every address in `args` (the property under test).
    launch_any(grid, block, 1, smem_bytes, dependent, || unsafe { kernel(args) })
}

/// [`launch_kernel`] with clusters of `cluster_x` blocks (see [`launch_cluster`]).
pub fn launch_kernel_cluster<A: Copy>(
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    cluster_x: u32,
    smem_bytes: u32,
    kernel: unsafe fn(A),
    args: A,
) {
    // SAFETY: as in `launch_kernel`.
    launch_cluster(grid, block, cluster_x, smem_bytes, || unsafe { kernel(args) })
}

// ---------------------------------------------------------------- indices

pub fn thread_idx_x() -> u32 {
    thread().tid.0
}
pub fn thread_idx_y() -> u32 {
    thread().tid.1
}
pub fn block_idx_x() -> u32 {
    thread().bid.get().0
}
pub fn block_idx_y() -> u32 {
    thread().bid.get().1
}
pub fn block_idx_z() -> u32 {
    thread().bid.get().2
}
pub fn block_dim_x() -> u32 {
    thread().bdim.0
}
pub fn block_dim_y() -> u32 {
    thread().bdim.1
}
pub fn grid_dim_x() -> u32 {
    thread().gdim.0
}
pub fn grid_dim_y() -> u32 {
    thread().gdim.1
}
pub fn lane_id() -> u32 {
    linear_tid() % 32
}

// ---------------------------------------------------------------- control

pub fn sync_threads() {
    slot().bar.wait()
}
pub fn trap() -> ! {
    panic!("trap")
}
pub fn fence_gpu() {
    core::sync::atomic::fence(Ordering::SeqCst)
}
pub fn grid_launch_dependents() {}
/// `griddepcontrol.wait`: in a dependent launch, holds the thread until the previous launch's
/// writes are back (see the module doc); otherwise nothing is pending.
pub fn grid_dependency_wait() {
    let me = thread();
    let Some(d) = cluster().dep.as_ref() else { return };
    if !me.dep_arrived.replace(true) {
        d.arrive();
    }
    while d.undone.get() {
        yield_now();
    }
}
pub fn opaque_u32(v: u32) -> u32 {
    core::hint::black_box(v)
}

// ---------------------------------------------------------------- warp

/// Every lane of the warp publishes `vals`; `f` then reads any lane's (`get(lane, i)`); the
/// area is reused only after every lane has read.
fn exchange<R>(vals: &[u64], f: impl FnOnce(&dyn Fn(u32, usize) -> u64) -> R) -> R {
    let w = warp();
    let lane = lane_id() as usize;
    for (i, &v) in vals.iter().enumerate() {
        w.xch[lane * XCH_WORDS + i].store(v, Ordering::Relaxed);
    }
    w.bar.wait();
    let r = f(&|l, i| w.xch[l as usize * XCH_WORDS + i].load(Ordering::Relaxed));
    w.bar.wait();
    r
}

pub fn sync_warp() {
    warp().bar.wait()
}
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    let src = (lane_id() ^ lane_mask) & 31;
    f32::from_bits(exchange(&[v.to_bits() as u64], |get| get(src, 0)) as u32)
}
pub fn shfl_idx_f32(v: f32, src: u32) -> f32 {
    f32::from_bits(exchange(&[v.to_bits() as u64], |get| get(src & 31, 0)) as u32)
}

/// `mma.sync.m16n8k16` with the PTX ISA fragment layout (see the nvptx backend's doc), the
/// 16-bit inputs decoded by `cvt`.
fn mma_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4], cvt: fn(u16) -> f32) -> [f32; 4] {
    let mut v = [0u64; XCH_WORDS];
    for i in 0..4 {
        v[i] = a[i] as u64;
        v[6 + i] = c[i].to_bits() as u64;
    }
    v[4] = b[0] as u64;
    v[5] = b[1] as u64;
    let lane = lane_id();
    let (g, t) = (lane / 4, lane % 4);
    exchange(&v, |get| {
        let half = |w: u64, k: u32| cvt((w as u32 >> (16 * (k % 2))) as u16) as f64;
        // A[r][k]: lane (r%8)*4 + (k%8)/2, register (r/8) + 2(k/8), half k%2.
        let a_at = |r: u32, k: u32| half(get((r % 8) * 4 + (k % 8) / 2, ((r / 8) + 2 * (k / 8)) as usize), k);
        // B[k][n]: lane n*4 + (k%8)/2, register k/8.
        let b_at = |k: u32, n: u32| half(get(n * 4 + (k % 8) / 2, 4 + (k / 8) as usize), k);
        let mut d = [0f32; 4];
        for (i, di) in d.iter_mut().enumerate() {
            let (r, n) = (g + 8 * (i as u32 / 2), 2 * t + (i as u32 % 2));
            let mut s = c[i] as f64;
            for k in 0..16 {
                s += a_at(r, k) * b_at(k, n);
            }
            *di = s as f32;
        }
        d
    })
}

pub unsafe fn mma_m16n8k16_f16_f32(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    mma_m16n8k16(a, b, c, f16_to_f32)
}
pub unsafe fn mma_m16n8k16_bf16_f32(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    mma_m16n8k16(a, b, c, super::bf16_to_f32)
}

// ---------------------------------------------------------------- math

pub fn sqrt_rn(v: f32) -> f32 {
    v.sqrt()
}
pub fn div_rn(a: f32, b: f32) -> f32 {
    a / b
}
pub fn rcp_rn(v: f32) -> f32 {
    1.0 / v
}
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    a.mul_add(b, c)
}
pub fn sqrt_rn_f64(v: f64) -> f64 {
    v.sqrt()
}
pub fn ex2_approx(v: f32) -> f32 {
    v.exp2()
}
pub fn rcp_approx(v: f32) -> f32 {
    1.0 / v
}
pub fn rsqrt_approx(v: f32) -> f32 {
    1.0 / v.sqrt()
}

/// `.ftz`: subnormal inputs and results are signed zeros.
fn ftz(v: f32) -> f32 {
    if v.is_subnormal() {
        0.0f32.copysign(v)
    } else {
        v
    }
}
pub fn ex2_approx_ftz(v: f32) -> f32 {
    ftz(ftz(v).exp2())
}
pub fn rcp_approx_ftz(v: f32) -> f32 {
    ftz(1.0 / ftz(v))
}
pub fn rsqrt_approx_ftz(v: f32) -> f32 {
    ftz(1.0 / ftz(v).sqrt())
}
fn ftz64(v: f64) -> f64 {
    if v.is_subnormal() {
        0.0f64.copysign(v)
    } else {
        v
    }
}
pub fn rsqrt_approx_f64(v: f64) -> f64 {
    ftz64(1.0 / ftz64(v).sqrt())
}
pub fn rcp_approx_f64(v: f64) -> f64 {
    ftz64(1.0 / ftz64(v))
}

// ---------------------------------------------------------------- conversions

/// Round to nearest even; NaN → the canonical NaN `0x7FFF`, as `cvt.rn.bf16.f32`.
pub fn f32_to_bf16(v: f32) -> u16 {
    if v.is_nan() {
        return 0x7FFF;
    }
    let x = v.to_bits();
    ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) as u16
}
pub fn f32_to_bf16x2(a: f32, b: f32) -> u32 {
    f32_to_bf16(a) as u32 | (f32_to_bf16(b) as u32) << 16
}
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let (e, m) = ((h >> 10) & 0x1F, (h & 0x3FF) as u32);
    match e {
        0 => sign * m as f32 * (1.0 / 16_777_216.0),
        31 if m == 0 => sign * f32::INFINITY,
        31 => f32::from_bits(((h as u32 & 0x8000) << 16) | 0x7F80_0000 | (m << 13)),
        _ => f32::from_bits(((h as u32 & 0x8000) << 16) | ((e as u32 + 112) << 23) | (m << 13)),
    }
}
/// Round to nearest even (overflow to ±inf, gradual underflow); NaN → `0x7FFF`.
pub fn f32_to_f16(v: f32) -> u16 {
    if v.is_nan() {
        return 0x7FFF;
    }
    let x = v.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let e = ((x >> 23) & 0xFF) as i32 - 127 + 15;
    let m = x & 0x7F_FFFF;
    if e >= 31 {
        return sign | 0x7C00;
    }
    // The magnitude as an integer count of `2^(e - 25)` units with the implicit bit, shifted
    // down to half's 10 fraction bits (more for subnormal halves), rounded to nearest even.
    let (full, shift) = if e > 0 { ((e as u32) << 23 | m, 13) } else { (m | 0x80_0000, (14 - e) as u32) };
    if shift > 24 {
        return sign;
    }
    let (q, rem, halfway) = if e > 0 {
        // Exponent and fraction together: a carry out of the fraction bumps the exponent.
        (full >> 13, full & 0x1FFF, 0x1000)
    } else {
        (full >> shift, full & ((1 << shift) - 1), 1 << (shift - 1))
    };
    let q = if rem > halfway || (rem == halfway && q & 1 == 1) { q + 1 } else { q };
    sign | q.min(0x7C00) as u16
}
pub fn prmt_b32(a: u32, b: u32, sel: u32) -> u32 {
    let bytes = (b as u64) << 32 | a as u64;
    let mut r = 0u32;
    for i in 0..4 {
        let s = (sel >> (4 * i)) & 0xF;
        let mut byte = (bytes >> (8 * (s & 7))) as u8;
        if s & 8 != 0 {
            // Sign-replicate mode: the byte's top bit, everywhere.
            byte = if byte & 0x80 != 0 { 0xFF } else { 0 };
        }
        r |= (byte as u32) << (8 * i);
    }
    r
}

// ---------------------------------------------------------------- global memory

std::thread_local! {
    /// The device buffers the caller registered ([`register_global`]): `[start, end)` byte
    /// ranges. While any is registered, every access of the global-memory functions below (the
    /// `.global` loads, stores, atomics and `cp.async` sources) must lie inside one, as on the
    /// GPU, where compute-sanitizer's memcheck reports it; the kernels run on the launching OS
    /// thread, so a thread-local list is the launch's.
    static GLOBAL: core::cell::RefCell<Vec<(usize, usize)>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// Registers `bytes` bytes at `start` as device memory of this thread's launches (see
/// [`GLOBAL`]); [`unregister_global`] ends it.
pub fn register_global(start: usize, bytes: usize) {
    GLOBAL.with(|g| g.borrow_mut().push((start, start + bytes)));
}

/// Ends the registration of the buffer at `start` ([`register_global`]).
pub fn unregister_global(start: usize) {
    GLOBAL.with(|g| g.borrow_mut().retain(|&(s, _)| s != start));
}

/// Panics unless `bytes` bytes at `p` lie inside one registered buffer (none registered: no
/// check). Kernel code calls it beside a plain global store (on the CPU only).
pub fn global<T>(p: *const T, bytes: usize) {
    let (a, b) = (p as usize, p as usize + bytes);
    GLOBAL.with(|g| {
        let g = g.borrow();
        assert!(
            g.is_empty() || g.iter().any(|&(s, e)| s <= a && b <= e),
            "{bytes}-byte global access at {p:?} outside every device buffer"
        );
    });
}

std::thread_local! {
    /// Every registered buffer's bytes at the start of the last plain (not dependent) launch on
    /// this OS thread: what the dependent launches after it undo.
    static SNAPSHOT: RefCell<Vec<(usize, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with every registered buffer's start and its bytes now.
fn each_registered(mut f: impl FnMut(usize, &[u8])) {
    let bufs: Vec<(usize, usize)> = GLOBAL.with(|g| g.borrow().clone());
    for (s, e) in bufs {
        // SAFETY: a registered buffer, live while registered; no kernel runs during `f`.
        f(s, unsafe { core::slice::from_raw_parts(s as *const u8, e - s) });
    }
}

/// Copies every registered buffer into [`SNAPSHOT`].
fn snapshot_globals() {
    let mut snap = Vec::new();
    each_registered(|s, now| snap.push((s, now.to_vec())));
    SNAPSHOT.with(|sn| *sn.borrow_mut() = snap);
}

/// Per registered buffer in [`SNAPSHOT`] (same start and size), the runs of bytes that differ
/// now (only those: a byte between two runs is the dependent launch's to write).
fn changed_since_snapshot() -> Vec<ChangedSpan> {
    SNAPSHOT.with(|sn| {
        let sn = sn.borrow();
        let mut spans = Vec::new();
        each_registered(|s, now| {
            let Some((_, old)) = sn.iter().find(|(a, v)| *a == s && v.len() == now.len()) else { return };
            let mut i = 0;
            while i < now.len() {
                if now[i] == old[i] {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < now.len() && now[i] != old[i] {
                    i += 1;
                }
                spans.push(ChangedSpan {
                    at: s + start,
                    before: old[start..i].to_vec(),
                    after: now[start..i].to_vec(),
                });
            }
        });
        spans
    })
}

pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
    global(p, 16);
    ld_v4(p)
}
pub unsafe fn ld_cg_v4_u32(p: *const u32) -> [u32; 4] {
    ld_nc_v4(p)
}
/// Generic address (global or shared memory): no bounds check.
pub unsafe fn ld_v4(p: *const u32) -> [u32; 4] {
    aligned(p, 16);
    *(p as *const [u32; 4])
}
pub unsafe fn ld_nc_v2_u32(p: *const u32) -> (u32, u32) {
    aligned(p, 8);
    global(p, 8);
    (*p, *p.add(1))
}
pub unsafe fn ld_cg_v2_u32(p: *const u32) -> [u32; 2] {
    aligned(p, 8);
    global(p, 8);
    [*p, *p.add(1)]
}
pub unsafe fn ld_cg_f32(p: *const f32) -> f32 {
    global(p, 4);
    *p
}
pub unsafe fn ld_cg_u16(p: *const u16) -> u16 {
    global(p, 2);
    *p
}
pub unsafe fn st_v4(p: *mut u32, v: [u32; 4]) {
    global(p, 16);
    st_v4_generic(p, v)
}
/// Generic address (global or shared memory): no bounds check.
pub unsafe fn st_v4_generic(p: *mut u32, v: [u32; 4]) {
    aligned(p, 16);
    *(p as *mut [u32; 4]) = v;
}
/// The GPU faults on a misaligned vector access; here it is an assertion.
fn aligned<T>(p: *const T, bytes: usize) {
    assert!((p as usize).is_multiple_of(bytes), "{bytes}-byte access at {p:?} misaligned");
}
pub unsafe fn atomic_add_u32(p: *mut u32, v: u32) -> u32 {
    global(p, 4);
    AtomicU32::from_ptr(p).fetch_add(v, Ordering::Relaxed)
}
pub unsafe fn red_add_u32(p: *mut u32, v: u32) {
    global(p, 4);
    AtomicU32::from_ptr(p).fetch_add(v, Ordering::Relaxed);
}
pub unsafe fn red_add_u64(p: *mut u64, v: u64) {
    global(p, 8);
    AtomicU64::from_ptr(p).fetch_add(v, Ordering::Relaxed);
}
pub unsafe fn prefetch_l1(_p: *const u8) {}
pub unsafe fn prefetch_l2<T>(_p: *const T) {}
pub unsafe fn prefetch_l2_evict_last(_p: *const u8) {}
pub unsafe fn prefetch_global_l2(_p: *const u8) {}

// ---------------------------------------------------------------- shared memory

pub fn dyn_smem<T>() -> *mut T {
    slot().smem[thread().buf.get()].as_ptr() as *mut T
}

/// The shared-window address of the dynamic shared memory: not 0 (as on the GPU, where static
/// shared memory comes first), so an offset mistaken for an address shows.
pub const SMEM_WINDOW: u32 = 0x400;

pub fn dyn_smem_u32() -> u32 {
    SMEM_WINDOW
}

/// The host address of shared-window address `a` for a `T` access; asserts it lies in the
/// block's dynamic shared memory and is naturally aligned.
fn shared<T>(a: u32) -> *mut T {
    let len = cluster().smem_bytes;
    let sz = core::mem::size_of::<T>();
    assert!(
        a >= SMEM_WINDOW && (a - SMEM_WINDOW) as usize + sz <= len,
        "shared access {a:#x} outside [{SMEM_WINDOW:#x}, +{len})"
    );
    assert!((a as usize).is_multiple_of(sz.min(16)), "shared access {a:#x} misaligned for {sz} bytes");
    (dyn_smem::<u8>() as usize + (a - SMEM_WINDOW) as usize) as *mut T
}
pub unsafe fn lds_v4(a: u32) -> [u32; 4] {
    *shared::<[u32; 4]>(a)
}
pub unsafe fn sts_v4(a: u32, v: [u32; 4]) {
    *shared::<[u32; 4]>(a) = v
}
pub unsafe fn lds_f32(a: u32) -> f32 {
    *shared::<f32>(a)
}
pub unsafe fn sts_f32(a: u32, v: f32) {
    *shared::<f32>(a) = v
}
pub unsafe fn lds_u16(a: u32) -> u16 {
    *shared::<u16>(a)
}
pub unsafe fn lds_v2_f32(a: u32) -> (f32, f32) {
    let [x, y] = *shared::<[f32; 2]>(a);
    (x, y)
}
pub unsafe fn sts_v2_f32(a: u32, x: f32, y: f32) {
    *shared::<[f32; 2]>(a) = [x, y]
}
pub unsafe fn lds_v2_f64(a: u32) -> (f64, f64) {
    let [x, y] = *shared::<[f64; 2]>(a);
    (x, y)
}
pub unsafe fn sts_v2_f64(a: u32, x: f64, y: f64) {
    *shared::<[f64; 2]>(a) = [x, y]
}

// ---------------------------------------------------------------- cp.async (written at its wait)

/// Reads `len` bytes of `src` now and queues their write to `dst` in the thread's open group;
/// until then `dst` holds the poison (0xFF), so a thread still reading the old contents there
/// (a missing barrier before the copy) sees it.
unsafe fn cp_async(dst: *mut u8, src: *const u8, len: usize) {
    aligned(dst, len);
    aligned(src, len);
    global(src, len);
    let base = dyn_smem::<u8>() as usize;
    let end = (dst as usize).checked_sub(base).and_then(|off| off.checked_add(len));
    assert!(
        end.is_some_and(|e| e <= cluster().smem_bytes),
        "cp.async destination {dst:?} outside the block's shared memory"
    );
    let mut bytes = [0u8; 16];
    core::ptr::copy_nonoverlapping(src, bytes.as_mut_ptr(), len);
    core::ptr::write_bytes(dst, 0xFF, len);
    thread().cp_async.borrow_mut().open.push(PendingCopy { dst, bytes, len });
}
pub unsafe fn cp_async_16(dst: *mut u8, src: *const u8) {
    cp_async(dst, src, 16)
}
pub unsafe fn cp_async_16_evict_first(dst: *mut u8, src: *const u8) {
    cp_async_16(dst, src)
}
pub unsafe fn cp_async_4(dst: *mut u8, src: *const u8) {
    cp_async(dst, src, 4)
}
pub unsafe fn cp_async_16_s(dst: u32, src: *const u8) {
    cp_async(shared::<[u8; 16]>(dst) as *mut u8, src, 16)
}
/// `cp.async.wait_all`: commits the open copies and completes every group.
pub fn cp_async_wait_all() {
    cp_async_commit_group();
    thread().cp_async.borrow_mut().complete_all_but(0);
}
/// `cp.async.commit_group`: the copies issued since the last commit become the newest group
/// (possibly an empty one).
pub fn cp_async_commit_group() {
    let mut st = thread().cp_async.borrow_mut();
    let open = core::mem::take(&mut st.open);
    st.groups.push_back(open);
}
/// `cp.async.wait_group 1`: every committed group but the newest is complete; uncommitted
/// copies stay in flight.
pub fn cp_async_wait_group_1() {
    thread().cp_async.borrow_mut().complete_all_but(1);
}

// ---------------------------------------------------------------- clusters

pub fn cluster_ctarank() -> u32 {
    thread().rank
}
pub fn cluster_nctarank() -> u32 {
    cluster().slots.len() as u32
}
/// Arrive and wait are one barrier, at the wait: every thread has arrived (and made its
/// writes before the arrive visible) when any passes it.
pub fn cluster_arrive() {}
pub fn cluster_wait() {
    cluster().bar.wait()
}
pub fn mapa<T>(p: *const T, rank: u32) -> *const T {
    let cl = cluster();
    let base = dyn_smem::<u8>() as usize;
    let off = (p as usize).wrapping_sub(base);
    assert!(off < cl.smem_bytes, "mapa of {p:?}, not in this block's shared memory");
    (cl.slots[rank as usize].smem[thread().buf.get()].as_ptr() as usize + off) as *const T
}
