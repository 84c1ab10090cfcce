//! Engram: gated causal depthwise conv, training forward/backward (docs/ops.md §4–§5) and the fused
//! one-token decode step (§6).
mod decode;
mod gate_conv;

/// PTX entries of the gated conv (forward and backward).
pub(crate) const GATE_CONV_KERNELS: &[&str] = gate_conv::KERNELS;
/// PTX entries of the decode step.
pub(crate) const DECODE_KERNELS: &[&str] = decode::KERNELS;

pub use decode::{
    DecodeDtype, DecodeElem, DecodeInputs, DecodeInputsRaw, DecodeLens, DecodeOutputs, EngramDecodePlan,
    EngramDecodeShape,
};
pub use gate_conv::{
    bwd_workspace_len, gate_conv_bwd, gate_conv_bwd_raw, gate_conv_fwd, gate_conv_fwd_raw, EngramGateShape,
    GateConvBwdInputs, GateConvBwdOutputs, GateConvBwdPlan, GateConvFwdInputs, GateConvFwdOutputs,
};

// Planner internals the tests and the bench inspect: not part of the API.
#[doc(hidden)]
pub use decode::{
    decode_step_launches, plan_decode_steps, planned_kernels as decode_planned_kernels, DecodeFinishKernel,
    DecodeGeometry, DecodeProjectionKernel, DecodeStepPlan, DecodeStepPlans,
};
#[doc(hidden)]
pub use gate_conv::{gate_conv_bwd_launches, gate_conv_fwd_launch, GateBwdMainLaunch, GateFwdLaunch};
#[doc(hidden)]
pub use gate_conv::{planned_entries as gate_conv_planned_entries, planned_kernels as gate_conv_planned_kernels};
/// The split backward's warp → row multiplier and the 2-D-grid forward's chunk → row
/// multiplier, as the kernels use them.
#[doc(hidden)]
pub use kernel_abi::engram::gate::{chunk_row_magic as fwd_chunk_magic, warp_row_magic as bwd_warp_row_magic};
