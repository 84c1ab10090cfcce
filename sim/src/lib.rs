//! The kernels' own code (`kernels-gpu` built for the host: its CPU backend `prim::cpu`) run
//! with the launches the host planners make ([`rgk::Planned`]), so the tests here check the
//! kernels and the host's entry names, arguments and geometry together, against the f64
//! references, without a GPU.
use std::any::Any;

use rgk::Planned;

/// Device memory of the simulation: a host buffer 256-byte aligned (as `cuMemAlloc`'s are), so
/// the planners see the alignment they would on the GPU.
pub struct DevBuf {
    mem: Vec<u8>,
    off: usize,
    bytes: usize,
}

impl DevBuf {
    /// A buffer holding `v`.
    pub fn from_slice<T: Copy>(v: &[T]) -> Self {
        let bytes = std::mem::size_of_val(v);
        let mut b = Self::zeroed(bytes);
        // SAFETY: `bytes` bytes at `addr()` are owned by `b`.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, b.addr() as *mut u8, bytes) };
        b
    }
    /// `bytes` zero bytes, registered as device memory of this thread's launches: a kernel's
    /// `.global` access outside every live `DevBuf` panics (`prim::cpu::register_global`).
    pub fn zeroed(bytes: usize) -> Self {
        let mem = vec![0u8; bytes + 256];
        let off = (mem.as_ptr() as usize).next_multiple_of(256) - mem.as_ptr() as usize;
        kernels_gpu::prim::cpu::register_global(mem.as_ptr() as usize + off, bytes);
        DevBuf { mem, off, bytes }
    }
    /// The device address of the first byte.
    pub fn addr(&mut self) -> u64 {
        self.mem[self.off..].as_mut_ptr() as u64
    }
    /// The device address of element `i` of a `T` array.
    pub fn at<T>(&mut self, i: usize) -> u64 {
        self.addr() + (i * std::mem::size_of::<T>()) as u64
    }
    /// The contents as `T`s.
    pub fn read<T: Copy>(&self) -> Vec<T> {
        let n = self.bytes / std::mem::size_of::<T>();
        let p = self.mem[self.off..].as_ptr() as *const T;
        // SAFETY: `n` whole `T`s inside the buffer; `read_unaligned` needs no alignment.
        (0..n).map(|i| unsafe { p.add(i).read_unaligned() }).collect()
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        kernels_gpu::prim::cpu::unregister_global(self.mem.as_ptr() as usize + self.off);
    }
}

/// A kernel family's entries by PTX name, each as a `Box<unsafe fn(Args)>` (from the
/// `kernel_abi` list the entries are declared from).
pub type EntryTable = fn(&str) -> Option<Box<dyn Any>>;

/// `pub fn $table(name)`: the entry of that PTX name in `$module`, over the rows of the
/// `kernel_abi` kernel list `$list` (the list the device declares the entries from). `$d` is
/// `$`, so the inner macro can take the rows.
macro_rules! entry_table {
    ($d:tt $table:ident, $list:ident, $module:path) => {
        macro_rules! $table {
                    ($d($d name:ident: $d($d rest:expr),*;)*) => {
                        #[doc = concat!("The entries of `", stringify!($module), "` by PTX name (see [`EntryTable`]).")]
                        pub fn $table(name: &str) -> Option<Box<dyn Any>> {
                            use $module as m;
                            match name {
                                $d(stringify!($d name) => Some(Box::new(m::$d name as unsafe fn(_))),)*
                                _ => None,
                            }
                        }
                    };
                }
        kernel_abi::$list!($table);
    };
}
entry_table!($ mhc_post, mhc_post_kernels, kernels_gpu::mhc::post);
entry_table!($ mhc_pre, mhc_pre_kernels, kernels_gpu::mhc::pre);
entry_table!($ engram_gate, gate_kernels, kernels_gpu::engram::gate_conv);
entry_table!($ fft, fft_pass_kernels, kernels_gpu::fft::stockham);
entry_table!($ engram_decode, decode_kernels, kernels_gpu::engram::decode);

/// Runs the planned launch on the CPU: the entry named `p.kernel` in `table`, with `p`'s
/// geometry and arguments (the entry must take `A`, the planner's argument struct); a
/// `p.dependent` launch as a programmatic dependent of the `run`s before it on this thread
/// (`prim::cpu::launch_dependent`: until its wait each block sees their writes, back to the last
/// plain launch, undone).
pub fn run<A: Copy + 'static>(table: EntryTable, p: &Planned<A>) {
    let entry = table(p.kernel).unwrap_or_else(|| panic!("no kernel named {}", p.kernel));
    let Ok(f) = entry.downcast::<unsafe fn(A)>() else {
        panic!("{} does not take {}", p.kernel, std::any::type_name::<A>());
    };
    let d = p.dims;
    kernels_gpu::prim::cpu::launch_kernel(d.grid, d.block, d.shared_bytes, p.dependent, *f, p.args);
}
