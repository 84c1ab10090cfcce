//! EngramGateConv forward and backward on the CPU: one shape per kernel the planner launches
//! (both dtypes, scales 1 and 100), through the host's launches, checked by the GPU tests' own
//! checks (`tests/tests/engram_gate_common`: 2 ulp for 16-bit outputs, 1e-4 relative for f32).
use rgk::engram::{
    bwd_workspace_len, gate_conv_bwd_launches, gate_conv_fwd_launch, EngramGateShape, GateBwdMainLaunch, GateFwdLaunch,
};
use rgk::verify::{poisoned, Half};
use rgk::{bf16, f16};
use sim::DevBuf;

#[path = "../../tests/tests/engram_gate_common/mod.rs"]
mod common;
use common::{check_bwd, check_fwd, gen, gpu::saved_from_reference, BwdOut, FwdOut, GateInputs};

fn up<T: Copy>(v: &[T]) -> DevBuf {
    DevBuf::from_slice(v)
}

/// The forward through the host's launch; returns its outputs and kernel.
fn fwd<T: Half + 'static>(x: &GateInputs<T>) -> (FwdOut<T>, &'static str) {
    let (n, rows) = x.s.lens().unwrap();
    let mut ins = [&x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw].map(|v| up(v));
    let (mut y, mut vhat) = (up(&poisoned::<T>(n)), up(&poisoned::<T>(n)));
    let mut f = [(); 4].map(|_| up(&vec![f32::NAN; rows]));
    let inputs = ins.each_mut().map(|b| b.addr());
    let [a, rh, rk, rv] = f.each_mut().map(|b| b.addr());
    let kernel = match gate_conv_fwd_launch::<T>(x.s, inputs, [y.addr(), vhat.addr(), a, rh, rk, rv]).unwrap() {
        GateFwdLaunch::Smem(p) => {
            sim::run(sim::engram_gate, &p);
            p.kernel
        }
        GateFwdLaunch::Tiled(p) => {
            sim::run(sim::engram_gate, &p);
            p.kernel
        }
    };
    let [alpha, rrms_h, rrms_k, rrms_v] = f.map(|b| b.read::<f32>());
    (FwdOut { y: y.read(), vhat: vhat.read(), alpha, rrms_h, rrms_k, rrms_v }, kernel)
}

/// The backward on the reference's saved tensors, the workspace NaN first; returns its
/// outputs and kernels.
fn bwd<T: Half + 'static>(x: &GateInputs<T>) -> (BwdOut<T>, [&'static str; 2]) {
    let (n, _) = x.s.lens().unwrap();
    let d = x.s.d;
    let saved = saved_from_reference(x);
    let mut ins = [&x.dy, &x.h, &x.k, &x.v, &x.wh, &x.wv, &x.cw].map(|v| up(v));
    let mut sv = [&saved.alpha, &saved.rrms_h, &saved.rrms_k].map(|v| up(v));
    let mut ws = up(&vec![f32::NAN; bwd_workspace_len(x.s).unwrap()]);
    let mut dx = [(); 3].map(|_| up(&poisoned::<T>(n)));
    let mut dw = [d, d, 4 * d].map(|l| up(&vec![f32::NAN; l]));
    let [dh, dk, dv] = dx.each_mut().map(|b| b.addr());
    let [dwh, dwv, dcw] = dw.each_mut().map(|b| b.addr());
    let (main, reduce) = gate_conv_bwd_launches::<T>(
        x.s,
        ins.each_mut().map(|b| b.addr()),
        sv.each_mut().map(|b| b.addr()),
        ws.addr(),
        [dh, dk, dv, dwh, dwv, dcw],
    )
    .unwrap();
    let main = match main {
        GateBwdMainLaunch::Split(p) => {
            sim::run(sim::engram_gate, &p);
            p.kernel
        }
        GateBwdMainLaunch::Tiled(p) => {
            sim::run(sim::engram_gate, &p);
            p.kernel
        }
    };
    sim::run(sim::engram_gate, &reduce);
    let [dh, dk, dv] = dx.map(|b| b.read::<T>());
    let [drms_w_h, drms_w_v, dconv_w] = dw.map(|b| b.read::<f32>());
    (BwdOut { dh, dk, dv, drms_w_h, drms_w_v, dconv_w }, [main, reduce.kernel])
}

fn dtype<T: 'static>() -> &'static str {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f16>() {
        "f16"
    } else {
        "bf16"
    }
}

fn fwd_cases<T: Half + 'static>(rng: &mut rand::rngs::StdRng) {
    for (m, t, d, kernel) in [
        (2, 7, 8, "engram_gate_fwd_smem_grid1d_{}_r1"),
        (2, 13, 256, "engram_gate_fwd_smem_{}_r1"),
        (2, 13, 512, "engram_gate_fwd_smem_{}_r2"),
        (1, 12, 768, "engram_gate_fwd_smem_{}_r3"),
        (2, 13, 1000, "engram_gate_fwd_smem_{}_r4"),
        (1, 9, 4096, "engram_gate_fwd_stream_vec8_{}"),
        (2, 7, 13, "engram_gate_fwd_stream_scalar_{}"),
    ] {
        let s = EngramGateShape { m, t, d };
        for scale in [1.0, 100.0] {
            let x = gen::<T>(rng, s, scale, false);
            let (o, k) = fwd(&x);
            assert_eq!(k, kernel.replace("{}", dtype::<T>()), "{s:?}");
            let w = check_fwd(&format!("{k} {s:?} scale {scale}"), &x, &o);
            println!("{k} {s:?} scale {scale}: {w:?}");
        }
    }
}

fn bwd_cases<T: Half + 'static>(rng: &mut rand::rngs::StdRng) {
    for (m, t, d, main, reduce) in [
        (2, 7, 8, "engram_gate_bwd_split_{}_r1", "engram_gate_bwd_reduce"),
        (1, 12, 768, "engram_gate_bwd_split_{}_r1", "engram_gate_bwd_reduce_vec4"),
        (2, 13, 800, "engram_gate_bwd_split_{}_r2", "engram_gate_bwd_reduce_vec4"),
        (2, 13, 1000, "engram_gate_bwd_rowwarp_{}_r4", "engram_gate_bwd_reduce_vec4"),
        (1, 9, 4096, "engram_gate_bwd_stream_vec8_{}", "engram_gate_bwd_reduce_vec4"),
        (2, 7, 13, "engram_gate_bwd_stream_scalar_{}", "engram_gate_bwd_reduce"),
        (1, 5, 770, "engram_gate_bwd_stream_scalar_{}", "engram_gate_bwd_reduce"),
    ] {
        let s = EngramGateShape { m, t, d };
        for scale in [1.0, 100.0] {
            let x = gen::<T>(rng, s, scale, false);
            let (o, k) = bwd(&x);
            assert_eq!(k, [main.replace("{}", dtype::<T>()).as_str(), reduce], "{s:?}");
            let w = check_bwd(&format!("{k:?} {s:?} scale {scale}"), &x, &o);
            println!("{k:?} {s:?} scale {scale}: {w:?}");
        }
    }
}

/// Small and odd shapes (one row, d below a chunk, several tiles per row), forward then
/// backward, bf16 at scale 1 with unit weights and f16 at scale 100 with random ones.
#[test]
fn small_and_odd_shapes() {
    let mut rng = rgk_tests::fresh_rng("engram_gate small_and_odd_shapes");
    for (m, t, d) in [(1, 1, 8), (1, 2, 3), (2, 3, 16), (1, 4, 8), (7, 5, 24), (2, 13, 40), (1, 32, 256)] {
        let s = EngramGateShape { m, t, d };
        fwd_then_bwd(&gen::<bf16>(&mut rng, s, 1.0, true));
        fwd_then_bwd(&gen::<f16>(&mut rng, s, 100.0, false));
    }
}

fn fwd_then_bwd<T: Half + 'static>(x: &GateInputs<T>) {
    let (o, k) = fwd(x);
    check_fwd(&format!("{k} {:?}", x.s), x, &o);
    let (o, k) = bwd(x);
    check_bwd(&format!("{k:?} {:?}", x.s), x, &o);
}

#[test]
fn forward_every_planned_kernel() {
    let mut rng = rgk_tests::fresh_rng("engram_gate forward_every_planned_kernel");
    fwd_cases::<bf16>(&mut rng);
    fwd_cases::<f16>(&mut rng);
}

#[test]
fn backward_every_planned_kernel_bf16() {
    bwd_cases::<bf16>(&mut rgk_tests::fresh_rng("engram_gate backward_every_planned_kernel_bf16"));
}

#[test]
fn backward_every_planned_kernel_f16() {
    bwd_cases::<f16>(&mut rgk_tests::fresh_rng("engram_gate backward_every_planned_kernel_f16"));
}
