//! MHCPostPreFwd (docs/ops.md §7): an mHC model's layer transition — MHCPostFwd of layer L, whose
//! output `x_out` is the next layer's input, then MHCPreFwd of layer L+1 on it — in the two
//! kernels of MHCPreFwd's fixed-point pair, with x computed from the post half's inputs where
//! each kernel reads it (`kernels-gpu/src/mhc/pre.rs`, `XSrc`): no separate post launch and no
//! round trip of `x_out` through memory; `x_out` is written only when the caller asks for it.
//! The arithmetic is MHCPostFwd's and MHCPreFwd's, so the outputs equal the two ops run back to
//! back, bit for bit (with the intermediate x_out 16-byte aligned, as every allocation is: Σx²
//! is summed in the order MHCPreFwd uses for such an x). Shapes outside the fixed-point pair's class (n > 4, batch > 65535, a phi
//! slab beyond shared memory) run the two ops back to back.
use cudarc::driver::{sys::CUdeviceptr, sys::CUstream, CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;

use super::post::{post_fwd_raw, MhcPostShape};
use super::pre::{
    prepare_kernel, ColumnMix, MhcPreParams, MhcPreShape, Mix, Partials, PreKernel, PrePlan, SlabPartialGrid,
};
use crate::error::check_len;
use crate::runtime::{launch_planned, GraphReplay, LaunchDims, Planned};
use crate::{Error, Gpu, Result};
use kernel_abi::{PostPreMixArgs, PostPrePartialArgs};

/// The inputs of [`MhcPostPre::run`]: the post half's `x_layer_out` `[batch, c]` bf16, `h_post`
/// `[batch, n]` f32 and `x_res` `[batch, n·c]` bf16 (layer L), and the pre half's `phi`
/// `[n·c, n²+2n]` f32 and `b` `[n²+2n]` f32 (layer L+1).
#[derive(Clone, Copy)]
pub struct MhcPostPreInputs<'a> {
    pub x_layer_out: &'a dyn DevicePtr<bf16>,
    pub h_post: &'a dyn DevicePtr<f32>,
    pub x_res: &'a dyn DevicePtr<bf16>,
    pub phi: &'a dyn DevicePtr<f32>,
    pub b: &'a dyn DevicePtr<f32>,
}

/// The outputs of [`MhcPostPre::run`]: `x_out` `[batch, n·c]` bf16 (the post half's output,
/// written only when given), and layer L+1's `x_res` `[batch, n·c]` bf16, `x_layer` `[batch, c]`
/// bf16 and `h_post` `[batch, n]` f32.
pub struct MhcPostPreOutputs<'a> {
    pub x_out: Option<&'a mut dyn DevicePtrMut<bf16>>,
    pub x_res: &'a mut dyn DevicePtrMut<bf16>,
    pub x_layer: &'a mut dyn DevicePtrMut<bf16>,
    pub h_post: &'a mut dyn DevicePtrMut<f32>,
}

/// How a [`MhcPostPre`] runs.
enum Path {
    /// The fused pair, with its workspace (the fixed-point accumulators) and graph.
    Fused { workspace: CudaSlice<u64>, graph: GraphReplay },
    /// MHCPostFwd into `x_out` (or this scratch buffer), then MHCPreFwd.
    BackToBack { pre: super::pre::MhcPre, scratch: CudaSlice<bf16> },
}

/// MHCPostPreFwd for one shape (`batch` rows, `n` streams, `c` channels; the same for both
/// halves), owning its workspace: create once, [`MhcPostPre::run`] many times.
///
/// ```no_run
/// use rgk::{bf16, Gpu, mhc::{MhcPostPre, MhcPostPreInputs, MhcPostPreOutputs, MhcPreParams, MhcPreShape}};
/// # fn main() -> Result<(), rgk::Error> {
/// let gpu = Gpu::new(0)?;
/// let s = MhcPreShape { batch: 2, n: 4, c: 1920 };
/// let l = s.lens()?;
/// let st = gpu.stream();
/// let (x_layer_out, h_post) = (st.alloc_zeros::<bf16>(l.x_layer)?, st.alloc_zeros::<f32>(l.h_post)?);
/// let x_res = st.alloc_zeros::<bf16>(l.x)?;
/// let (phi, b) = (st.alloc_zeros::<f32>(l.phi)?, st.alloc_zeros::<f32>(l.b)?);
/// let (mut next_res, mut next_layer) = (st.alloc_zeros::<bf16>(l.x)?, st.alloc_zeros::<bf16>(l.x_layer)?);
/// let mut next_h_post = st.alloc_zeros::<f32>(l.h_post)?;
/// let mut op = MhcPostPre::new(&gpu, s)?;
/// let inputs = MhcPostPreInputs { x_layer_out: &x_layer_out, h_post: &h_post, x_res: &x_res, phi: &phi, b: &b };
/// let outputs =
///     MhcPostPreOutputs { x_out: None, x_res: &mut next_res, x_layer: &mut next_layer, h_post: &mut next_h_post };
/// op.run(&gpu, MhcPreParams::default(), inputs, outputs)?;
/// # Ok(()) }
/// ```
pub struct MhcPostPre {
    plan: PrePlan,
    path: Path,
}

impl MhcPostPre {
    /// Plans `shape` (MHCPreFwd's planner, [`PrePlan::new`]) and allocates the workspace.
    /// Errors: those of [`PrePlan::new`], or a driver error.
    pub fn new(gpu: &Gpu, shape: MhcPreShape) -> Result<Self> {
        let plan = PrePlan::new(gpu, shape)?;
        let st = gpu.stream();
        let path = if let Some((g1, g2)) = fused_pair(&plan) {
            // The fused kernels take the pair's geometry and shared memory.
            let (k1, k2) = fused_kernels(g1.acc_copies);
            prepare_kernel(gpu, k1, g1.block, g1.smem)?;
            prepare_kernel(gpu, k2, g2.block, g2.smem)?;
            Path::Fused { workspace: st.alloc_zeros::<u64>(plan.workspace)?, graph: GraphReplay::new() }
        } else {
            let lens = shape.lens()?;
            Path::BackToBack { pre: super::pre::MhcPre::new(gpu, shape)?, scratch: st.alloc_zeros::<bf16>(lens.x)? }
        };
        Ok(Self { plan, path })
    }

    pub fn plan(&self) -> &PrePlan {
        &self.plan
    }

    /// Whether this shape runs the fused pair (else MHCPostFwd and MHCPreFwd back to back).
    pub fn is_fused(&self) -> bool {
        matches!(self.path, Path::Fused { .. })
    }

    /// Runs MHCPostPreFwd on [`Gpu::stream`]; asynchronous: `x_out = q(h_post ⊙ x_layer_out +
    /// x_res)` (docs/ops.md §3, written when `outputs.x_out` is given), then MHCPreFwd (§2) of
    /// `x_out` with `phi`, `b` and `params`. Deterministic: the same inputs give the same bits,
    /// equal to [`super::post_fwd`] then [`super::MhcPre::run`] on a 16-byte aligned `x_out`.
    ///
    /// Errors: [`Error::BufferTooSmall`] naming the buffer (layer L+1's outputs as
    /// `next_x_res`, `next_x_layer`, `next_h_post`), [`Error::Shape`] naming a bad parameter, or
    /// a driver error from the launch.
    pub fn run(
        &mut self,
        gpu: &Gpu,
        params: MhcPreParams,
        inputs: MhcPostPreInputs<'_>,
        outputs: MhcPostPreOutputs<'_>,
    ) -> Result<()> {
        let MhcPostPreInputs { x_layer_out, h_post, x_res, phi, b } = inputs;
        let MhcPostPreOutputs { x_out, x_res: next_res, x_layer, h_post: next_h_post } = outputs;
        let l = self.plan.shape.lens()?;
        check_len("x_layer_out", l.x_layer, x_layer_out.len())?;
        check_len("h_post", l.h_post, h_post.len())?;
        check_len("x_res", l.x, x_res.len())?;
        check_len("phi", l.phi, phi.len())?;
        check_len("b", l.b, b.len())?;
        if let Some(o) = &x_out {
            check_len("x_out", l.x, o.len())?;
        }
        check_len("next_x_res", l.x, next_res.len())?;
        check_len("next_x_layer", l.x_layer, x_layer.len())?;
        check_len("next_h_post", l.h_post, next_h_post.len())?;
        let st = gpu.stream();
        let (y, _g1) = x_layer_out.device_ptr(st);
        let (h, _g2) = h_post.device_ptr(st);
        let (r, _g3) = x_res.device_ptr(st);
        let (p, _g4) = phi.device_ptr(st);
        let (bp, _g5) = b.device_ptr(st);
        let mut x_out = x_out;
        let (o, _g6) = match x_out.as_mut() {
            Some(o) => {
                let (ptr, g) = o.device_ptr_mut(st);
                (ptr, Some(g))
            }
            None => (0, None),
        };
        let (nr, _g7) = next_res.device_ptr_mut(st);
        let (nl, _g8) = x_layer.device_ptr_mut(st);
        let (nh, _g9) = next_h_post.device_ptr_mut(st);
        // SAFETY: every buffer was checked to hold the elements the shape addresses; `&mut`
        // borrows keep the outputs apart from the inputs; the calls are ordered on this stream.
        unsafe { self.run_raw(gpu, params, [y, h, r, p, bp], o, [nr, nl, nh], st.cu_stream()) }
    }

    /// [`MhcPostPre::run`] on raw device pointers, launched on `stream`: `inputs` =
    /// `[x_layer_out, h_post, x_res, phi, b]`, `x_out` (0: not written), `outputs` = `[x_res,
    /// x_layer, h_post]` of layer L+1. Errors: those of [`post_pre_fwd_launches`] (fused) or of
    /// `post_fwd_raw` and [`super::MhcPre::run_raw`] (back to back), or a driver error.
    ///
    /// # Safety
    /// Each pointer must address device memory of `gpu`'s context holding the elements the
    /// shape addresses (as in [`MhcPostPre::run`]), valid until the kernels finish; outputs must
    /// not overlap the inputs or each other. `stream` belongs to `gpu`'s context, and all calls
    /// with one `MhcPostPre` are ordered on one stream (the workspace carries state). The
    /// workspace's and scratch buffer's events are recorded on [`Gpu::stream`], not on
    /// `stream`: with another stream, the caller keeps this `MhcPostPre` alive until its
    /// launches finish.
    pub unsafe fn run_raw(
        &mut self,
        gpu: &Gpu,
        params: MhcPreParams,
        inputs: [CUdeviceptr; 5],
        x_out: CUdeviceptr,
        outputs: [CUdeviceptr; 3],
        stream: CUstream,
    ) -> Result<()> {
        let [y, h, r, p, bp] = inputs;
        let [nr, nl, nh] = outputs;
        let plan = &self.plan;
        match &mut self.path {
            Path::Fused { workspace, graph } => {
                let ws_len = workspace.len();
                let (w, _g) = workspace.device_ptr_mut(gpu.stream());
                let (k1, k2) = post_pre_fwd_launches(plan, params, inputs, x_out, outputs, w, ws_len)?;
                let mut key = vec![y, h, r, p, bp, x_out, nr, nl, nh, w];
                key.extend(PrePlan::key_words(params));
                graph.run(gpu, stream, key, |s| {
                    launch_planned(gpu.function(k1.kernel)?, &k1, s)?;
                    launch_planned(gpu.function(k2.kernel)?, &k2, s)
                })
            }
            Path::BackToBack { pre, scratch } => {
                params.validate()?;
                let s = plan.shape;
                let post_shape = MhcPostShape { batch: s.batch, n: s.n, c: s.c };
                let (sp, _g) = scratch.device_ptr_mut(gpu.stream());
                let xo = if x_out == 0 { sp } else { x_out };
                post_fwd_raw(gpu, post_shape, y, h, r, xo, stream)?;
                pre.run_raw(gpu, params, [p, xo, bp], [nr, nl, nh], stream)
            }
        }
    }
}

/// The PTX entries MHCPostPreFwd launches for `plan` (the fused pair, or MHCPostFwd's kernel
/// then `plan`'s; the post kernel is left out here: MHCPostFwd's planner names it).
pub(crate) fn planned_kernels(plan: &PrePlan) -> Vec<&'static str> {
    if let Some((g1, _)) = fused_pair(plan) {
        let (k1, k2) = fused_kernels(g1.acc_copies);
        vec![k1, k2]
    } else {
        plan.kernels().to_vec()
    }
}

/// The geometry of MHCPreFwd's fixed-point pair, the one the fused kernels extend, when `plan`
/// is that pair.
fn fused_pair(plan: &PrePlan) -> Option<(SlabPartialGrid, ColumnMix)> {
    match (plan.partials, plan.mix) {
        (Partials::SlabFixedPoint(g1), Mix::FixedPoint(g2)) => Some((g1, g2)),
        _ => None,
    }
}

/// The fused pair's entries for `acc_copies` copies of the accumulators per half (the `_acc2`
/// entries at 2, as MHCPreFwd's).
fn fused_kernels(acc_copies: u32) -> (&'static str, &'static str) {
    if acc_copies > 1 {
        (PreKernel::PostPrePartialSlabFixedPointAcc2.name(), PreKernel::PostPreMixFixedPointAcc2.name())
    } else {
        (PreKernel::PostPrePartialSlabFixedPoint.name(), PreKernel::PostPreMixFixedPoint.name())
    }
}

/// The two launches of the fused pair for `plan` (which must be MHCPreFwd's fixed-point pair)
/// on these device addresses: `inputs` = `[x_layer_out, h_post, x_res, phi, b]`, `x_out` (0:
/// not written), `outputs` = `[x_res, x_layer, h_post]` of layer L+1; `workspace` as
/// `pre_fwd_raw`'s for this plan.
///
/// Errors: [`Error::Shape`] naming `n` when `plan` is not the fixed-point pair (the caller then
/// runs the two ops back to back) or a bad parameter; [`Error::BufferTooSmall`] or
/// [`Error::Shape`] naming `workspace`.
#[doc(hidden)]
pub fn post_pre_fwd_launches(
    plan: &PrePlan,
    params: MhcPreParams,
    inputs: [CUdeviceptr; 5],
    x_out: CUdeviceptr,
    outputs: [CUdeviceptr; 3],
    workspace: CUdeviceptr,
    workspace_len: usize,
) -> Result<(Planned<PostPrePartialArgs>, Planned<PostPreMixArgs>)> {
    let Some((g1, g2)) = fused_pair(plan) else {
        return Err(Error::Shape {
            arg: "n",
            msg: format!("{:?}: the fused kernels need MHCPreFwd's fixed-point pair", plan.shape),
        });
    };
    plan.shape.lens()?;
    params.validate()?;
    check_len("workspace", plan.workspace, workspace_len)?;
    if !workspace.is_multiple_of(8) {
        return Err(Error::Shape { arg: "workspace", msg: "not 8-byte aligned".into() });
    }
    let [y, h, r, p, bp] = inputs;
    let [nr, nl, nh] = outputs;
    let s = plan.shape;
    let (batch, n, c) = (s.batch as u32, s.n as u32, s.c as u32);
    let (x_layer_out, h_post_in, x_res_in) = (y as *const u16, h as *const f32, r as *const u16);
    let part_ws = workspace as *mut f64;
    let args = PostPrePartialArgs {
        phi: p as *const f32,
        x_layer_out,
        h_post_in,
        x_res_in,
        x_out: x_out as *mut u16,
        part_ws,
        batch,
        n,
        c,
        cw: g1.cols,
        bpc: g1.batch_per_group,
        alpha_pre: params.alpha_pre,
        alpha_post: params.alpha_post,
        alpha_res: params.alpha_res,
        inv_sqrt_nc: s.inv_sqrt_nc(),
    };
    let (k1_name, k2_name) = fused_kernels(g1.acc_copies);
    let dims = g1.launch_dims(true);
    let k1 = Planned { kernel: k1_name, dims, args, dependent: false };
    let args = PostPreMixArgs {
        x_layer_out,
        h_post_in,
        x_res_in,
        bias: bp as *const f32,
        part_ws: part_ws as *const f64,
        x_res: nr as *mut u16,
        x_layer: nl as *mut u16,
        h_post: nh as *mut f32,
        batch,
        n,
        c,
        repeat: params.sinkhorn_repeat,
        eps: params.sinkhorn_eps,
    };
    let dims = LaunchDims { grid: (g2.tiles, batch, 1), block: (g2.block, 1, 1), shared_bytes: g2.smem };
    let k2 = Planned { kernel: k2_name, dims, args, dependent: true };
    Ok((k1, k2))
}
