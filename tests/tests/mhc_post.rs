//! MHCPostFwd on the GPU against the f64 CPU reference (docs/ops.md §3): at most 1 bf16 ulp off
//! the correctly rounded value (+ the sum slack), every element, outputs poisoned first.
use rand::rngs::StdRng;
use rgk::mhc::{self, MhcPostInputs, MhcPostOutputs, MhcPostShape};
use rgk::verify::{check_half, poisoned};
use rgk::{bf16, Error, Gpu};
use rgk_tests::{fresh_rng, gpu_or_skip, randn_f32, randn_half};

/// Runs one shape with the given element offsets of each buffer inside a larger allocation
/// (offset 0 = aligned); returns the worst ulp error.
fn run_case(gpu: &Gpu, rng: &mut StdRng, s: MhcPostShape, off: [usize; 4]) -> f64 {
    let (ly, lh, lr) = s.lens().unwrap();
    let y: Vec<bf16> = randn_half(rng, ly, 1.0);
    let h = randn_f32(rng, lh, 2.0);
    let r: Vec<bf16> = randn_half(rng, lr, 1.0);
    let st = gpu.stream();
    let pad = |v: &[bf16], o: usize| -> Vec<bf16> {
        let mut p = poisoned::<bf16>(o);
        p.extend_from_slice(v);
        p
    };
    let mut hp = vec![f32::NAN; off[1]];
    hp.extend_from_slice(&h);
    let dy = st.clone_htod(&pad(&y, off[0])).unwrap();
    let dh = st.clone_htod(&hp).unwrap();
    let dr = st.clone_htod(&pad(&r, off[2])).unwrap();
    let mut dout = st.clone_htod(&poisoned::<bf16>(off[3] + lr + 3)).unwrap();
    {
        let mut ov = dout.slice_mut(off[3]..off[3] + lr);
        mhc::post_fwd(
            gpu,
            s,
            MhcPostInputs { x_layer_out: &dy.slice(off[0]..), h_post: &dh.slice(off[1]..), x_res: &dr.slice(off[2]..) },
            MhcPostOutputs { x_out: &mut ov },
        )
        .unwrap();
    }
    let all: Vec<bf16> = st.clone_dtoh(&dout).unwrap();
    // Nothing outside the output range was written.
    for (i, v) in all[..off[3]].iter().chain(&all[off[3] + lr..]).enumerate() {
        assert_eq!(v.to_bits(), 0x7fc1, "write outside x_out at guard element {i} for {s:?}");
    }
    let out = &all[off[3]..off[3] + lr];
    let reference = rgk::reference::mhc_post_fwd(s, &y, &h, &r);
    let rep = check_half(out, &reference, 1.0);
    assert!(rep.passed(), "{s:?} offsets {off:?}: {rep}");
    rep.max_ulp
}

#[test]
fn seed_workloads() {
    let Some(gpu) = gpu_or_skip("mhc_post::seed_workloads") else { return };
    let mut rng = fresh_rng("mhc_post::seed_workloads");
    for (batch, c) in [(1, 1280), (2, 1920), (4, 2560)] {
        let worst = run_case(&gpu, &mut rng, MhcPostShape { batch, n: 4, c }, [0; 4]);
        println!("B={batch} n=4 c={c}: worst {worst:.3} ulp");
    }
}

#[test]
fn shape_sweep() {
    let Some(gpu) = gpu_or_skip("mhc_post::shape_sweep") else { return };
    let mut rng = fresh_rng("mhc_post::shape_sweep");
    let mut worst = 0f64;
    for batch in [1, 3, 64] {
        for n in [1, 2, 4, 8] {
            for c in [1, 7, 8, 1000, 1280, 1003] {
                worst = worst.max(run_case(&gpu, &mut rng, MhcPostShape { batch, n, c }, [0; 4]));
            }
        }
    }
    println!("shape sweep: worst {worst:.3} ulp");
}

#[test]
fn misaligned_sub_slices() {
    let Some(gpu) = gpu_or_skip("mhc_post::misaligned_sub_slices") else { return };
    let mut rng = fresh_rng("mhc_post::misaligned_sub_slices");
    for off in [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 3, 0], [0, 0, 0, 5], [8, 3, 8, 8], [7, 1, 9, 1]] {
        for s in [MhcPostShape { batch: 2, n: 4, c: 1920 }, MhcPostShape { batch: 3, n: 3, c: 7 }] {
            run_case(&gpu, &mut rng, s, off);
        }
    }
}

#[test]
fn extreme_values_stay_finite_and_exact() {
    let Some(gpu) = gpu_or_skip("mhc_post::extreme_values") else { return };
    let s = MhcPostShape { batch: 2, n: 4, c: 64 };
    let (ly, lh, lr) = s.lens().unwrap();
    // Large but finite: |h·y + r| stays below bf16::MAX.
    let y: Vec<bf16> = (0..ly).map(|i| bf16::from_f32(if i % 2 == 0 { 1.0e18 } else { -3.0e-30 })).collect();
    let h: Vec<f32> = (0..lh).map(|i| 1.0e19 * (i as f32 - 3.5)).collect();
    let r: Vec<bf16> = (0..lr).map(|i| bf16::from_f32(1.0e37 * ((i % 5) as f32 - 2.0))).collect();
    let st = gpu.stream();
    let (dy, dh, dr) = (st.clone_htod(&y).unwrap(), st.clone_htod(&h).unwrap(), st.clone_htod(&r).unwrap());
    let mut d = st.clone_htod(&poisoned::<bf16>(lr)).unwrap();
    mhc::post_fwd(
        &gpu,
        s,
        MhcPostInputs { x_layer_out: &dy, h_post: &dh, x_res: &dr },
        MhcPostOutputs { x_out: &mut d },
    )
    .unwrap();
    let out: Vec<bf16> = st.clone_dtoh(&d).unwrap();
    let rep = check_half(&out, &rgk::reference::mhc_post_fwd(s, &y, &h, &r), 1.0);
    assert!(rep.passed(), "{rep}");
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    // Shape errors need no GPU.
    for (s, arg) in [
        (MhcPostShape { batch: 0, n: 4, c: 8 }, "batch"),
        (MhcPostShape { batch: 1, n: 0, c: 8 }, "n"),
        (MhcPostShape { batch: 1, n: 4, c: 0 }, "c"),
        (MhcPostShape { batch: usize::MAX, n: 4, c: 8 }, "c"),
        (MhcPostShape { batch: 1 << 40, n: 1 << 20, c: 1 << 8 }, "x_res"),
    ] {
        match s.lens() {
            Err(Error::Shape { arg: a, .. }) | Err(Error::Overflow { arg: a, .. }) => assert_eq!(a, arg, "{s:?}"),
            other => panic!("{s:?}: expected an error naming {arg}, got {other:?}"),
        }
    }
    let Some(gpu) = gpu_or_skip("mhc_post::bad_input") else { return };
    let s = MhcPostShape { batch: 2, n: 4, c: 16 };
    let st = gpu.stream();
    let ok_y = st.alloc_zeros::<bf16>(32).unwrap();
    let ok_h = st.alloc_zeros::<f32>(8).unwrap();
    let ok_r = st.alloc_zeros::<bf16>(128).unwrap();
    let mut ok_o = st.alloc_zeros::<bf16>(128).unwrap();
    let small_b = st.alloc_zeros::<bf16>(31).unwrap();
    let small_h = st.alloc_zeros::<f32>(7).unwrap();
    let small_r = st.alloc_zeros::<bf16>(127).unwrap();
    let mut small_o = st.alloc_zeros::<bf16>(127).unwrap();
    let expect = |r: rgk::Result<()>, arg: &str| match r {
        Err(Error::BufferTooSmall { arg: a, .. }) => assert_eq!(a, arg),
        other => panic!("expected BufferTooSmall({arg}), got {other:?}"),
    };
    expect(
        mhc::post_fwd(
            &gpu,
            s,
            MhcPostInputs { x_layer_out: &small_b, h_post: &ok_h, x_res: &ok_r },
            MhcPostOutputs { x_out: &mut ok_o },
        ),
        "x_layer_out",
    );
    expect(
        mhc::post_fwd(
            &gpu,
            s,
            MhcPostInputs { x_layer_out: &ok_y, h_post: &small_h, x_res: &ok_r },
            MhcPostOutputs { x_out: &mut ok_o },
        ),
        "h_post",
    );
    expect(
        mhc::post_fwd(
            &gpu,
            s,
            MhcPostInputs { x_layer_out: &ok_y, h_post: &ok_h, x_res: &small_r },
            MhcPostOutputs { x_out: &mut ok_o },
        ),
        "x_res",
    );
    expect(
        mhc::post_fwd(
            &gpu,
            s,
            MhcPostInputs { x_layer_out: &ok_y, h_post: &ok_h, x_res: &ok_r },
            MhcPostOutputs { x_out: &mut small_o },
        ),
        "x_out",
    );
    mhc::post_fwd(
        &gpu,
        s,
        MhcPostInputs { x_layer_out: &ok_y, h_post: &ok_h, x_res: &ok_r },
        MhcPostOutputs { x_out: &mut ok_o },
    )
    .unwrap();
    st.synchronize().unwrap();
}

/// The planner: the division-free vectorised kernel for 16-byte-aligned buffers with
/// `c % 8 == 0`, the general kernel otherwise (both run on the GPU by `shape_sweep` and
/// `misaligned_sub_slices`).
#[test]
fn planner_picks_the_vectorised_kernel_where_aligned() {
    use rgk::mhc::PostKernel;
    let plan = |batch, n, c, aligned| PostKernel::plan(MhcPostShape { batch, n, c }, aligned).unwrap();
    assert_eq!(plan(4, 4, 2560, true), PostKernel::Rows { grid: (3, 4, 4) });
    assert_eq!(plan(2, 4, 1920, true).kernel(), "mhc_post_fwd_bf16_rows");
    assert_eq!(plan(2, 4, 1920, false).kernel(), "mhc_post_fwd_bf16");
    assert_eq!(plan(2, 4, 1003, true).kernel(), "mhc_post_fwd_bf16");
    assert_eq!(plan(70_000, 1, 8, true).kernel(), "mhc_post_fwd_bf16");
    assert_eq!(plan(1, 1, 1, false), PostKernel::Any { blocks: 1 });
    assert!(matches!(PostKernel::plan(MhcPostShape { batch: 0, n: 4, c: 8 }, true), Err(Error::Shape { .. })));
}
