//! EngramDecodeFwd (docs/ops.md §6) reference, in f64.
//!
//! docs/ops.md rounds three intermediates to the storage dtype: `q(kk)` (into the key rmsnorm), `q(vh)`
//! (into the value rmsnorm) and `q(u)` (the new state row). An implementation that accumulates
//! `kk` in f32 lands within a few f32 ulp of the exact `kk`; when the exact value lies near a
//! rounding boundary of the 16-bit dtype, its `q(kk)` may be the neighbour of the reference's
//! (one 16-bit ulp, a relative 2^-8 for bf16), and everything downstream (alpha, `vh`, `q(vh)`,
//! `u`, `y_t`) then differs by more than the final 2 ulp could absorb. The reference therefore
//! takes the implementation's own rounded intermediates where docs/ops.md rounds
//! ([`DecodeGiven`]), and reports the unrounded `kk` and `vh` so a test can check that those
//! rounded intermediates are themselves within 1 ulp (+ slack) of the correctly rounded
//! values: a chain of checks with no unsound tolerance. With nothing given, it uses its own
//! roundings (the plain formula: the bench's `ref.*` tensors).
use super::RefOutput;
use crate::engram::EngramDecodeShape;
use crate::verify::Half;

/// The input tensors of one step (row-major, the shapes of docs/ops.md; see [`EngramDecodeShape`]).
#[derive(Clone, Copy, Debug)]
pub struct DecodeRefInputs<'a, T> {
    pub e_t: &'a [T],
    pub h_t: &'a [T],
    pub conv_state: &'a [T],
    pub w_k: &'a [T],
    pub w_v: &'a [T],
    pub rms_w_h: &'a [T],
    pub rms_w_v: &'a [T],
    pub conv_w: &'a [T],
}

/// Rounded intermediates `[batch, d]` to evaluate the rest of the step on (see the module
/// docs); `None` = the reference's own `q(·)` of its exact value.
#[derive(Clone, Copy, Debug)]
pub struct DecodeGiven<'a, T> {
    pub q_kk: Option<&'a [T]>,
    pub q_vh: Option<&'a [T]>,
}

impl<T> Default for DecodeGiven<'_, T> {
    fn default() -> Self {
        Self { q_kk: None, q_vh: None }
    }
}

/// The reference results of one step.
#[derive(Clone, Debug, Default)]
pub struct DecodeRef {
    /// `y_t [batch, d]` before its rounding; magnitude `|silu(conv)| + alpha·Σ_i|e_i·W_V[i,j]| +
    /// 1.1·Σ_p|conv terms|` (`silu' ≤ 1.1` carries the conv sum's error).
    pub y_t: RefOutput,
    /// The new state `[batch, L, d]` (seed contract: shifted rows exact, newest row `u`,
    /// magnitude `|u|` for the rrms sum inside it; shifted rows magnitude 0).
    pub new_conv_state: RefOutput,
    /// Exact `kk [batch, d]`, magnitude `Σ_i|e_i·W_K[i,j]|`.
    pub kk: RefOutput,
    /// `vh = alpha·vv [batch, d]` with alpha from the `q(kk)` used, magnitude
    /// `alpha·Σ_i|e_i·W_V[i,j]|`.
    pub vh: RefOutput,
    /// The gate per batch row.
    pub alpha: Vec<f64>,
}

fn q<T: Half>(v: f64) -> f64 {
    T::round_f64(v).to_f64()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// EngramDecodeFwd (docs/ops.md §6) for `shape`, in f64, evaluated on the `given` rounded
/// intermediates where present. Panics if a slice is shorter than the shape needs (test
/// helper) or the shape is invalid.
pub fn engram_decode_fwd<T: Half>(
    shape: &EngramDecodeShape,
    x: &DecodeRefInputs<'_, T>,
    given: DecodeGiven<'_, T>,
) -> DecodeRef {
    engram_decode_fwd_from(shape, x, &decode_projections(shape, x), given)
}

/// The exact projections `kk`, `vv` (`[batch, d]` each) and the magnitudes `Σ_i|e_i·W[i,j]|`,
/// the costly part of [`engram_decode_fwd`], for reuse across several `given`s.
#[derive(Clone, Debug, Default)]
pub struct DecodeProjections {
    pub kk: Vec<f64>,
    pub vv: Vec<f64>,
    pub mag_k: Vec<f64>,
    pub mag_v: Vec<f64>,
}

/// Computes [`DecodeProjections`] in f64.
pub fn decode_projections<T: Half>(shape: &EngramDecodeShape, x: &DecodeRefInputs<'_, T>) -> DecodeProjections {
    let EngramDecodeShape { batch, d_mem, d, .. } = *shape;
    let n = batch * d;
    let mut p = DecodeProjections { kk: vec![0.0; n], vv: vec![0.0; n], mag_k: vec![0.0; n], mag_v: vec![0.0; n] };
    let wk: Vec<f64> = x.w_k[..d_mem * d].iter().map(|v| v.to_f64()).collect();
    let wv: Vec<f64> = x.w_v[..d_mem * d].iter().map(|v| v.to_f64()).collect();
    for b in 0..batch {
        let o = b * d;
        for i in 0..d_mem {
            let e = x.e_t[b * d_mem + i].to_f64();
            if e == 0.0 {
                continue;
            }
            let (rk, rv) = (&wk[i * d..(i + 1) * d], &wv[i * d..(i + 1) * d]);
            for j in 0..d {
                let (pk, pv) = (e * rk[j], e * rv[j]);
                p.kk[o + j] += pk;
                p.vv[o + j] += pv;
                p.mag_k[o + j] += pk.abs();
                p.mag_v[o + j] += pv.abs();
            }
        }
    }
    p
}

/// [`engram_decode_fwd`] from precomputed projections.
pub fn engram_decode_fwd_from<T: Half>(
    shape: &EngramDecodeShape,
    x: &DecodeRefInputs<'_, T>,
    proj: &DecodeProjections,
    given: DecodeGiven<'_, T>,
) -> DecodeRef {
    shape.lens().expect("a valid shape");
    let EngramDecodeShape { batch, d, max_conv_len: l, kernel_size: k, dilation, eps, .. } = *shape;
    let eps = eps as f64;
    let f = |v: &[T], i: usize| v[i].to_f64();
    let mut r = DecodeRef::default();
    for b in 0..batch {
        let kk = &proj.kk[b * d..(b + 1) * d];
        let vv = &proj.vv[b * d..(b + 1) * d];
        let mk = &proj.mag_k[b * d..(b + 1) * d];
        let mv = &proj.mag_v[b * d..(b + 1) * d];
        let qkk: Vec<f64> = match given.q_kk {
            Some(g) => (0..d).map(|j| g[b * d + j].to_f64()).collect(),
            None => kk.iter().map(|&v| q::<T>(v)).collect(),
        };
        // Gate.
        let h: Vec<f64> = (0..d).map(|j| f(x.h_t, b * d + j)).collect();
        let rrms = |v: &[f64]| 1.0 / (v.iter().map(|a| a * a).sum::<f64>() / d as f64 + eps).sqrt();
        let (rh, rk) = (rrms(&h), rrms(&qkk));
        let dot: f64 = (0..d)
            .map(|j| {
                let w = f(x.rms_w_h, j);
                (h[j] * rh * w) * (qkk[j] * rk * w)
            })
            .sum();
        let alpha = sigmoid(dot / (d as f64).sqrt());
        r.alpha.push(alpha);
        let vh: Vec<f64> = vv.iter().map(|&v| alpha * v).collect();
        let qvh: Vec<f64> = match given.q_vh {
            Some(g) => (0..d).map(|j| g[b * d + j].to_f64()).collect(),
            None => vh.iter().map(|&v| q::<T>(v)).collect(),
        };
        let rv = rrms(&qvh);
        // Conv, outputs.
        let mut u_row = Vec::with_capacity(d);
        for j in 0..d {
            let u = qvh[j] * rv * f(x.rms_w_v, j);
            let mut conv = f(x.conv_w, (k - 1) * d + j) * u;
            let mut mag = conv.abs();
            for p in 0..k - 1 {
                let t = l - (k - 1 - p) * dilation;
                let term = f(x.conv_w, p * d + j) * f(x.conv_state, (b * l + t) * d + j);
                conv += term;
                mag += term.abs();
            }
            let silu = conv * sigmoid(conv);
            r.y_t.value.push(silu + vh[j]);
            r.y_t.magnitude.push(silu.abs() + alpha * mv[j] + 1.1 * mag);
            u_row.push(u);
        }
        for t in 0..l - 1 {
            for j in 0..d {
                r.new_conv_state.value.push(f(x.conv_state, (b * l + t + 1) * d + j));
                r.new_conv_state.magnitude.push(0.0);
            }
        }
        r.new_conv_state.magnitude.extend(u_row.iter().map(|u| u.abs()));
        r.new_conv_state.value.extend(u_row);
        r.kk.value.extend_from_slice(kk);
        r.kk.magnitude.extend_from_slice(mk);
        r.vh.value.extend_from_slice(&vh);
        r.vh.magnitude.extend(mv.iter().map(|m| alpha * m));
    }
    r
}

/// The logical (oldest-first) view of a ring-buffer state whose oldest row of every batch row
/// is physical row `pos`: `logical[b, t] = physical[b, (pos + t) mod L]` (see
/// `EngramDecodePlan::step_ring`).
pub fn ring_logical<T: Copy>(shape: &EngramDecodeShape, physical: &[T], pos: usize) -> Vec<T> {
    let (l, d) = (shape.max_conv_len, shape.d);
    let mut out = Vec::with_capacity(shape.batch * l * d);
    for b in 0..shape.batch {
        for t in 0..l {
            let row = (pos + t) % l;
            out.extend_from_slice(&physical[(b * l + row) * d..(b * l + row + 1) * d]);
        }
    }
    out
}
