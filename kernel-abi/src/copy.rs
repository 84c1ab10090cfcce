//! The device copy kernel (`device_copy_16b`: the copy-chain floor of the FFT reports).

kernel_args! {
    /// `device_copy_16b`: `dst[i] = src[i]` for `chunks` 16-byte chunks, grid-stride.
    pub struct DeviceCopyArgs / device_copy_entry {
        pub src: *const u32,
        pub dst: *mut u32,
        pub chunks: u64,
    }
}
