//! MHCPostFwd on the CPU: both kernels, through the host's plan, against the f64 reference
//! with the GPU test's bar (1 bf16 ulp of the correctly rounded value, every element) and
//! poisoned guards around the output.
use rgk::bf16;
use rgk::mhc::{post_fwd_plan, MhcPostShape, PostLaunch};
use rgk::verify::{check_half, poisoned};
use rgk_tests::{fresh_rng, randn_f32, randn_half};
use sim::DevBuf;

/// One shape, each buffer at element offset `off[k]` of its allocation; returns the kernel run.
fn run_case(s: MhcPostShape, off: [usize; 4], seed_rng: &mut rand::rngs::StdRng) -> &'static str {
    let (ly, lh, lr) = s.lens().unwrap();
    let y: Vec<bf16> = randn_half(seed_rng, ly, 1.0);
    let h = randn_f32(seed_rng, lh, 2.0);
    let r: Vec<bf16> = randn_half(seed_rng, lr, 1.0);
    let pad = |v: &[bf16], o: usize| [poisoned::<bf16>(o), v.to_vec()].concat();
    let mut dy = DevBuf::from_slice(&pad(&y, off[0]));
    let mut dh = DevBuf::from_slice(&[vec![f32::NAN; off[1]], h.clone()].concat());
    let mut dr = DevBuf::from_slice(&pad(&r, off[2]));
    let mut dout = DevBuf::from_slice(&poisoned::<bf16>(off[3] + lr + 3));
    let plan =
        post_fwd_plan(s, dy.at::<bf16>(off[0]), dh.at::<f32>(off[1]), dr.at::<bf16>(off[2]), dout.at::<bf16>(off[3]))
            .unwrap();
    let kernel = match plan {
        PostLaunch::Rows(p) => {
            sim::run(sim::mhc_post, &p);
            p.kernel
        }
        PostLaunch::Any(p) => {
            sim::run(sim::mhc_post, &p);
            p.kernel
        }
    };
    let all: Vec<bf16> = dout.read();
    for (i, v) in all[..off[3]].iter().chain(&all[off[3] + lr..]).enumerate() {
        assert_eq!(v.to_bits(), 0x7fc1, "write outside x_out at guard element {i} for {s:?}");
    }
    let reference = rgk::reference::mhc_post_fwd(s, &y, &h, &r);
    let rep = check_half(&all[off[3]..off[3] + lr], &reference, 1.0);
    assert!(rep.passed(), "{kernel} {s:?} offsets {off:?}: {rep}");
    println!("{kernel} {s:?} offsets {off:?}: max {:.3} ulp", rep.max_ulp);
    kernel
}

#[test]
fn both_kernels_against_the_reference() {
    let mut rng = fresh_rng("mhc_post both_kernels_against_the_reference");
    let shape = |batch, n, c| MhcPostShape { batch, n, c };
    // Aligned, c % 8 == 0: the vectorised 3-D grid (more than one x block at c = 2048).
    assert_eq!(run_case(shape(2, 4, 64), [0; 4], &mut rng), "mhc_post_fwd_bf16_rows");
    assert_eq!(run_case(shape(1, 2, 2048), [0; 4], &mut rng), "mhc_post_fwd_bf16_rows");
    // Any alignment or c: the grid-stride kernel.
    assert_eq!(run_case(shape(3, 4, 13), [0; 4], &mut rng), "mhc_post_fwd_bf16");
    assert_eq!(run_case(shape(2, 4, 64), [1, 3, 5, 7], &mut rng), "mhc_post_fwd_bf16");
    assert_eq!(run_case(shape(1, 1, 1), [0; 4], &mut rng), "mhc_post_fwd_bf16");
}
