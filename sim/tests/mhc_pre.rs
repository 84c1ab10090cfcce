//! MHCPreFwd on the CPU: every kernel pair the planner ships for small shapes (the fixed-point
//! slab pair, FMA partials with the small-n mix, the any-n pair), through the host's
//! plan and launch arguments, against the f64 reference with the GPU test's bars: bf16 outputs
//! within 1 ulp of the correctly rounded value (+ the reference's slack), h_post to 1e-5
//! relative, every element, outputs poisoned first.
use rgk::bf16;
use rgk::mhc::{pre_fwd_launches, MhcPreParams, MhcPreShape, Mix, Partials, PreMixLaunch, PrePartialsLaunch, PrePlan};
use rgk::reference::{mhc_post_pre_fwd, mhc_pre_fwd};
use rgk::verify::{check_float, check_half, poisoned};
use rgk_tests::{fresh_rng, randn_f32, randn_half};
use sim::DevBuf;

/// The H200's multiprocessors and opt-in shared memory per block (the planner's inputs).
const SMS: usize = 132;
const MAX_SMEM: usize = 232_448;

/// Runs `plan` `calls` times on one workspace (zeroed once, then the kernels' state) and
/// checks each call; returns the two kernels.
fn run_case(plan: &PrePlan, p: MhcPreParams, calls: usize, rng: &mut rand::rngs::StdRng) -> [&'static str; 2] {
    let s = plan.shape;
    let l = s.lens().unwrap();
    let scale = if s.c % 2 == 1 { 1.0 / ((s.n * s.c) as f32).sqrt() } else { 1.0 };
    let (phi, x, b) = (randn_f32(rng, l.phi, scale), randn_half::<bf16>(rng, l.x, 1.0), randn_f32(rng, l.b, 1.0));
    let (mut dphi, mut dx, mut db) = (DevBuf::from_slice(&phi), DevBuf::from_slice(&x), DevBuf::from_slice(&b));
    let mut ws = DevBuf::from_slice(&vec![0u64; plan.workspace]);
    let reference = mhc_pre_fwd(s, p, &phi, &x, &b);
    for call in 0..calls {
        let mut dr = DevBuf::from_slice(&poisoned::<bf16>(l.x));
        let mut dy = DevBuf::from_slice(&poisoned::<bf16>(l.x_layer));
        let mut dh = DevBuf::from_slice(&vec![f32::NAN; l.h_post]);
        let (k1, k2) = pre_fwd_launches(
            plan,
            p,
            dphi.addr(),
            dx.addr(),
            db.addr(),
            dr.addr(),
            dy.addr(),
            dh.addr(),
            ws.addr(),
            plan.workspace,
        )
        .unwrap();
        match k1 {
            PrePartialsLaunch::Slab(l) => sim::run(sim::mhc_pre, &l),
            PrePartialsLaunch::Fma(l) => sim::run(sim::mhc_pre, &l),
        }
        match k2 {
            PreMixLaunch::FixedPoint(l) => sim::run(sim::mhc_pre, &l),
            PreMixLaunch::Tile(l) => sim::run(sim::mhc_pre, &l),
        }
        let (xr, xl, h) = (dr.read::<bf16>(), dy.read::<bf16>(), dh.read::<f32>());
        let a = check_half(&xr, &reference.x_res, 1.0);
        let bb = check_half(&xl, &reference.x_layer, 1.0);
        let h: Vec<f64> = h.iter().map(|&v| v as f64).collect();
        let c = check_float(&h, &reference.h_post, 1e-5);
        let what = format!("{:?} {s:?} call {call}", plan.kernels());
        assert!(a.passed() && bb.passed() && c.passed(), "{what}:\n  x_res: {a}\n  x_layer: {bb}\n  h_post: {c}");
        println!("{what}: x_res {:.3} ulp, x_layer {:.3} ulp, h_post rel {:.2e}", a.max_ulp, bb.max_ulp, c.rel_l2_err);
    }
    plan.kernels()
}

fn params(repeat: u32) -> MhcPreParams {
    MhcPreParams { alpha_pre: 1.4, alpha_post: 0.6, alpha_res: 0.8, sinkhorn_repeat: repeat, sinkhorn_eps: 0.02 }
}

#[test]
fn fixed_point_pair() {
    let mut rng = fresh_rng("mhc_pre fixed_point_pair");
    // (4, 4, 128) and (9, 2, 320): 128 partial blocks, two accumulator copies (the `_acc2` pair).
    for (batch, n, c) in [(1, 4, 64), (3, 2, 7), (9, 4, 40), (2, 3, 21), (5, 1, 13), (4, 4, 128), (9, 2, 320)] {
        let plan = PrePlan::for_device(MhcPreShape { batch, n, c }, SMS, MAX_SMEM).unwrap();
        let Partials::SlabFixedPoint(k1) = plan.partials else { panic!("{plan:?}") };
        // Two calls: the second adds into the other half of the workspace.
        let k = run_case(&plan, params(20), 2, &mut rng);
        if k1.acc_copies == 2 {
            assert_eq!(k, ["mhc_pre_partial_slab_fixed_point_acc2", "mhc_pre_mix_fixed_point_acc2"]);
        } else {
            assert_eq!(k, ["mhc_pre_partial_slab_fixed_point", "mhc_pre_mix_fixed_point"]);
        }
    }
    assert!(
        [(4, 4, 128), (9, 2, 320)].iter().all(|&(batch, n, c)| {
            let plan = PrePlan::for_device(MhcPreShape { batch, n, c }, SMS, MAX_SMEM).unwrap();
            plan.partials.acc_copies() == 2
        }),
        "no case reaches the two-copy pair"
    );
}

#[test]
fn fma_partials_small_n() {
    let mut rng = fresh_rng("mhc_pre fma_partials_small_n");
    // A device with few multiprocessors and little shared memory (the first budget that plans
    // FMA partials): the slab kernel 1's phi slab does not fit.
    for (batch, n, c) in [(2, 4, 600), (5, 2, 3001)] {
        let s = MhcPreShape { batch, n, c };
        let plan = (10..16)
            .filter_map(|log| PrePlan::for_device(s, 4, 1 << log).ok())
            .find(|p| matches!(p.partials, Partials::Fma(_)))
            .unwrap();
        assert!(matches!((plan.partials, plan.mix), (Partials::Fma(_), Mix::SmallN(_))), "{plan:?}");
        run_case(&plan, params(1), 1, &mut rng);
    }
}

/// The any-n pair (n > 4) on devices of several SM counts: several groups, several staged
/// tiles (few SMs), q-chunks (m+1 > block), slices S from 1 to 32, partial last tiles, m+1 >
/// kernel 2's block.
#[test]
fn any_n_pair() {
    let mut rng = fresh_rng("mhc_pre any_n_pair");
    let cases = [
        ((3, 5, 7), SMS),
        ((2, 8, 40), SMS),
        ((9, 8, 4099), 3),
        ((3, 5, 97), 5),
        ((6, 16, 40), 4),
        ((2, 16, 300), SMS),
        ((11, 6, 1030), SMS),
        ((33, 5, 50), SMS),
        ((2, 23, 7), SMS),
    ];
    for (((batch, n, c), sms), repeat) in cases.into_iter().zip([20, 1, 0].into_iter().cycle()) {
        let plan = PrePlan::for_device(MhcPreShape { batch, n, c }, sms, MAX_SMEM).unwrap();
        assert!(matches!((plan.partials, plan.mix), (Partials::Fma(_), Mix::AnyN(_))), "{plan:?}");
        run_case(&plan, params(repeat), 1, &mut rng);
    }
}

/// The fused post→pre pair (MHCPostPreFwd): the stored x_out bit for bit (not written on the
/// second call, which passes none), the pre half within the bars above and bitwise equal to the
/// plain pair run on the stored x_out, two calls on one workspace (both halves); aligned and unaligned
/// (scalar paths) inputs, 8 columns per block (kernel 1's 16-byte path), a row whose Σx²
/// chunks cross stream rows within a thread's round (c = 1000), and 128 partial blocks (the
/// `_acc2` pair, two accumulator copies).
#[test]
fn post_pre_fused_pair() {
    let mut rng = fresh_rng("mhc_pre post_pre_fused_pair");
    // (shape, input offset, Sinkhorn rounds, SMs): few SMs keep the grids small for the CPU;
    // 8 SMs at c = 512 give 64 columns per block, 5 at c = 40 give 8 (both the 16-byte path,
    // the second unaligned: scalar); batch 9 is two groups of 8 rows; batch 5 three (2, 2, 1);
    // (4, 4, 512) on 64 SMs: 64 blocks × 2 groups, two accumulator copies.
    let cases = [
        ((1, 4, 64), 0, 20, 8),
        ((9, 4, 40), 1, 0, 5),
        ((2, 3, 33), 1, 1, 4),
        ((2, 4, 512), 0, 1, 8),
        ((5, 4, 64), 0, 1, 8),
        ((1, 4, 1000), 0, 1, 8),
        ((4, 4, 512), 0, 1, 64),
        // Groups of 8 rows: 512-thread blocks, whose row blocks sum with their first 256.
        ((9, 4, 64), 0, 1, 8),
    ];
    let mut reached_acc2 = false;
    for ((batch, n, c), off, repeat, sms) in cases {
        let s = MhcPreShape { batch, n, c };
        let plan = PrePlan::for_device(s, sms, MAX_SMEM).unwrap();
        reached_acc2 |= plan.partials.acc_copies() == 2;
        let l = s.lens().unwrap();
        let p = params(repeat);
        let mut ws = DevBuf::from_slice(&vec![0u64; plan.workspace]);
        let mut ws_plain = DevBuf::from_slice(&vec![0u64; plan.workspace]);
        for call in 0..2 {
            let y = randn_half::<bf16>(&mut rng, l.x_layer, 1.0);
            let h: Vec<f32> =
                randn_f32(&mut rng, l.h_post, 1.0).into_iter().map(|v| 2.0 / (1.0 + (-v).exp())).collect();
            let r = randn_half::<bf16>(&mut rng, l.x, 1.0);
            let scale = if c % 2 == 1 { 1.0 / ((n * c) as f32).sqrt() } else { 1.0 };
            let (phi, b) = (randn_f32(&mut rng, l.phi, scale), randn_f32(&mut rng, l.b, 1.0));
            let pad = |v: &[bf16]| [vec![bf16::ZERO; off], v.to_vec()].concat();
            let (mut dy, mut dh, mut dr) =
                (DevBuf::from_slice(&pad(&y)), DevBuf::from_slice(&h), DevBuf::from_slice(&pad(&r)));
            let (mut dphi, mut db) = (DevBuf::from_slice(&phi), DevBuf::from_slice(&b));
            let mut dxo = DevBuf::from_slice(&poisoned::<bf16>(l.x));
            let mut dnr = DevBuf::from_slice(&poisoned::<bf16>(l.x));
            let mut dnl = DevBuf::from_slice(&poisoned::<bf16>(l.x_layer));
            let mut dnh = DevBuf::from_slice(&vec![f32::NAN; l.h_post]);
            let inputs = [dy.at::<bf16>(off), dh.addr(), dr.at::<bf16>(off), dphi.addr(), db.addr()];
            let outputs = [dnr.addr(), dnl.addr(), dnh.addr()];
            let xo_addr = if call == 0 { dxo.addr() } else { 0 };
            let (k1, k2) =
                rgk::mhc::post_pre_fwd_launches(&plan, p, inputs, xo_addr, outputs, ws.addr(), plan.workspace).unwrap();
            let acc2 = plan.partials.acc_copies() == 2;
            assert_eq!(k1.kernel.ends_with("_acc2"), acc2, "{}", k1.kernel);
            assert_eq!(k2.kernel.ends_with("_acc2"), acc2, "{}", k2.kernel);
            sim::run(sim::mhc_pre, &k1);
            sim::run(sim::mhc_pre, &k2);
            let (x_out, reference) = mhc_post_pre_fwd(s, p, &y, &h, &r, &phi, &b);
            let what = format!("{s:?} offset {off} call {call}");
            let got: Vec<u16> = dxo.read::<bf16>().iter().map(|v| v.to_bits()).collect();
            if call == 0 {
                assert_eq!(got, x_out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{what}: x_out");
            } else {
                assert_eq!(got, poisoned::<bf16>(l.x).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{what}");
            }
            // The plain pair on the stored x_out: the same bits.
            let mut dx = DevBuf::from_slice(&x_out);
            let mut pr = DevBuf::from_slice(&poisoned::<bf16>(l.x));
            let mut pl = DevBuf::from_slice(&poisoned::<bf16>(l.x_layer));
            let mut ph = DevBuf::from_slice(&vec![f32::NAN; l.h_post]);
            let (wa, wl) = (ws_plain.addr(), plan.workspace);
            let plain =
                pre_fwd_launches(&plan, p, dphi.addr(), dx.addr(), db.addr(), pr.addr(), pl.addr(), ph.addr(), wa, wl);
            let (PrePartialsLaunch::Slab(q1), PreMixLaunch::FixedPoint(q2)) = plain.unwrap() else {
                panic!("{what}: not the fixed-point pair")
            };
            sim::run(sim::mhc_pre, &q1);
            sim::run(sim::mhc_pre, &q2);
            assert_eq!(pr.read::<u16>(), dnr.read::<u16>(), "{what}: x_res bits");
            assert_eq!(pl.read::<u16>(), dnl.read::<u16>(), "{what}: x_layer bits");
            assert_eq!(ph.read::<u32>(), dnh.read::<u32>(), "{what}: h_post bits");
            let a = check_half(&dnr.read::<bf16>(), &reference.x_res, 1.0);
            let bb = check_half(&dnl.read::<bf16>(), &reference.x_layer, 1.0);
            let hh: Vec<f64> = dnh.read::<f32>().iter().map(|&v| v as f64).collect();
            let cc = check_float(&hh, &reference.h_post, 1e-5);
            assert!(a.passed() && bb.passed() && cc.passed(), "{what}:\n  x_res: {a}\n  x_layer: {bb}\n  h_post: {cc}");
        }
    }
    assert!(reached_acc2, "no case reaches the fused `_acc2` pair");
}
