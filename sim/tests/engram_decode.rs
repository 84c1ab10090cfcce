//! EngramDecode on the CPU: the two launches of one step (projection, finish) as the plan
//! submits them, for shapes reaching each projection kernel (tensor-core b8k16, bounded
//! tensor-core, scalar on the any-layout path) and finish, both dtypes, checked along the GPU
//! test's chain: the rounded intermediates q(kk), q(vh) to 1 ulp, then `y_t` and the new
//! state to 2 ulp given them, the shifted state a bit copy.
use rgk::engram::{decode_step_launches, plan_decode_steps, DecodeElem, DecodeInputsRaw, EngramDecodeShape};
use rgk::reference::{self as rf, DecodeGiven, DecodeRefInputs};
use rgk::verify::{check_half, poisoned};
use rgk::{bf16, f16};
use rgk_tests::{randn_f32, randn_half};
use sim::DevBuf;

/// One step from a copy of the state; `offset` elements into each buffer (1: the any-layout
/// path). Returns the kernels run.
fn step<T: DecodeElem + 'static>(
    rng: &mut rand::rngs::StdRng,
    s: EngramDecodeShape,
    offset: usize,
) -> [&'static str; 2] {
    let l = s.lens().unwrap();
    let around_one = |rng: &mut rand::rngs::StdRng, n| -> Vec<T> {
        randn_f32(rng, n, 0.5).into_iter().map(|v| T::round_f64(1.0 + v as f64)).collect()
    };
    let (e, h, state): (Vec<T>, Vec<T>, Vec<T>) =
        (randn_half(rng, l.e, 1.0), randn_half(rng, l.h, 3.0), randn_half(rng, l.state, 1.0));
    let (wk, wv): (Vec<T>, Vec<T>) = (randn_half(rng, l.w, 0.05), randn_half(rng, l.w, 0.05));
    let (rwh, rwv) = (around_one(rng, l.rms), around_one(rng, l.rms));
    let cw: Vec<T> = randn_half(rng, l.conv_w, 0.5);
    let at = |v: &[T]| DevBuf::from_slice(&[poisoned::<T>(offset), v.to_vec()].concat());
    let mut ins = [&e, &h, &wk, &wv, &rwh, &rwv, &cw].map(|v| at(v));
    let mut ds = at(&state);
    let (mut y, mut ns) = (at(&poisoned::<T>(l.h + 3)), at(&poisoned::<T>(l.state + 3)));
    let steps = plan_decode_steps(&s).unwrap();
    let splits = steps.vectorised.map_or(0, |p| p.geometry.splits).max(steps.any_layout.geometry.splits) as usize;
    let mut part = DevBuf::from_slice(&vec![f32::NAN; splits * 2 * l.h]);
    let mut kv = DevBuf::from_slice(&vec![f32::NAN; 2 * l.h]);
    let mut capture = DevBuf::from_slice(&vec![u16::MAX; 2 * l.h]);
    let [e_t, h_t, w_k, w_v, rms_w_h, rms_w_v, conv_w] = ins.each_mut().map(|b| b.at::<T>(offset));
    let inputs = DecodeInputsRaw { e_t, h_t, w_k, w_v, rms_w_h, rms_w_v, conv_w };
    let [projection, finish] = decode_step_launches(
        &s,
        &steps,
        T::DTYPE,
        inputs,
        ds.at::<T>(offset),
        ns.at::<T>(offset),
        y.at::<T>(offset),
        0,
        s.max_conv_len as u32 - 1,
        true,
        [part.addr(), kv.addr(), capture.addr()],
    )
    .unwrap();
    sim::run(sim::engram_decode, &projection);
    sim::run(sim::engram_decode, &finish);
    let read = |b: &DevBuf, n: usize, what: &str| -> Vec<T> {
        let all = b.read::<T>();
        assert!(all[offset + n..].iter().all(|v| v.to_f64().is_nan()), "{what}: write past the end");
        all[offset..offset + n].to_vec()
    };
    let (yo, so) = (read(&y, l.h, "y_t"), read(&ns, l.state, "new_conv_state"));
    let raw = capture.read::<u16>();
    let conv = |r: &[u16]| -> Vec<T> {
        r.iter()
            .map(|&b| match T::DTYPE {
                rgk::engram::DecodeDtype::F16 => T::round_f64(f16::from_bits(b).to_f64()),
                rgk::engram::DecodeDtype::Bf16 => T::round_f64(bf16::from_bits(b).to_f64()),
            })
            .collect()
    };
    let (qkk, qvh) = (conv(&raw[..l.h]), conv(&raw[l.h..]));
    let x = DecodeRefInputs {
        e_t: &e,
        h_t: &h,
        conv_state: &state,
        w_k: &wk,
        w_v: &wv,
        rms_w_h: &rwh,
        rms_w_v: &rwv,
        conv_w: &cw,
    };
    let kernels = [projection.kernel, finish.kernel];
    let what = format!("{kernels:?} {s:?} offset {offset}");
    let proj = rf::decode_projections(&s, &x);
    let own = rf::engram_decode_fwd_from(&s, &x, &proj, DecodeGiven::default());
    let rk = check_half(&qkk, &own.kk, 1.0);
    assert!(rk.passed(), "{what}: q(kk): {rk}");
    let g1 = rf::engram_decode_fwd_from(&s, &x, &proj, DecodeGiven { q_kk: Some(&qkk), q_vh: None });
    let rv = check_half(&qvh, &g1.vh, 1.0);
    assert!(rv.passed(), "{what}: q(vh): {rv}");
    let g2 = rf::engram_decode_fwd_from(&s, &x, &proj, DecodeGiven { q_kk: Some(&qkk), q_vh: Some(&qvh) });
    let ry = check_half(&yo, &g2.y_t, 2.0);
    assert!(ry.passed(), "{what}: y_t: {ry}");
    let rs = check_half(&so, &g2.new_conv_state, 2.0);
    assert!(rs.passed(), "{what}: new_conv_state: {rs}");
    let (len, d) = (s.max_conv_len, s.d);
    for b in 0..s.batch {
        for t in 0..len - 1 {
            for j in 0..d {
                let (n, old) = (so[(b * len + t) * d + j], state[(b * len + t + 1) * d + j]);
                assert_eq!(n.to_f64().to_bits(), old.to_f64().to_bits(), "{what}: shifted state [{b},{t},{j}]");
            }
        }
    }
    println!(
        "{what}: q(kk) {:.2} ulp, q(vh) {:.2} ulp, y_t {:.2} ulp, state {:.2} ulp",
        rk.max_ulp, rv.max_ulp, ry.max_ulp, rs.max_ulp
    );
    kernels
}

fn cases<T: DecodeElem + 'static>(name: &str) {
    let mut rng = rgk_tests::fresh_rng(name);
    for ((batch, d_mem, d, l, k, dil), offset) in [
        // Tensor-core b8k16 projection, block finishes of 1, 2 and 4 columns.
        ((1, 512, 256, 12, 4, 3), 0),
        ((3, 320, 40, 4, 3, 1), 0),
        ((2, 256, 512, 16, 4, 5), 0),
        ((1, 160, 1000, 10, 4, 3), 0),
        // Rows wider than the block finish: the 8-column warp finish, staged in shared memory
        // and in the workspace; the 1-column warp finish of the any-layout path.
        ((1, 40, 2056, 5, 3, 2), 0),
        ((1, 40, 4104, 5, 3, 2), 0),
        ((1, 40, 2056, 3, 3, 1), 1),
        // batch > 8 / d_mem % 16 ≠ 0: the bounded tensor-core projection.
        ((9, 512, 256, 6, 4, 1), 0),
        ((5, 300, 24, 3, 2, 3), 0),
        // K > 4 and many splits.
        ((3, 64, 256, 12, 5, 2), 0),
        // The any-layout path: scalar projection.
        ((2, 96, 40, 4, 3, 1), 1),
        ((2, 64, 20, 4, 3, 2), 0),
    ] {
        step::<T>(&mut rng, EngramDecodeShape::new(batch, d_mem, d, l, k, dil), offset);
    }
}

#[test]
fn every_projection_and_finish_f16() {
    cases::<f16>("engram_decode every_projection_and_finish_f16");
}

#[test]
fn every_projection_and_finish_bf16() {
    cases::<bf16>("engram_decode every_projection_and_finish_bf16");
}
