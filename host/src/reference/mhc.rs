//! mHC references (docs/ops.md §2–§3).
use half::bf16;

use super::RefOutput;
use crate::mhc::MhcPostShape;

/// MHCPostFwd (docs/ops.md §3): `h_post[β,i]·x_layer_out[β,j] + x_res[β,i·c+j]` in f64, for
/// `x_out` `[batch, n·c]`. Panics if a slice is shorter than `shape` needs (test helper).
pub fn mhc_post_fwd(shape: MhcPostShape, x_layer_out: &[bf16], h_post: &[f32], x_res: &[bf16]) -> RefOutput {
    let MhcPostShape { batch, n, c } = shape;
    let mut out = RefOutput { value: Vec::with_capacity(batch * n * c), magnitude: Vec::with_capacity(batch * n * c) };
    for b in 0..batch {
        for i in 0..n {
            let h = h_post[b * n + i] as f64;
            for j in 0..c {
                let p = h * x_layer_out[b * c + j].to_f64();
                let r = x_res[b * n * c + i * c + j].to_f64();
                out.value.push(p + r);
                out.magnitude.push(p.abs() + r.abs());
            }
        }
    }
    out
}

// ------------------------------------------------------------------ MHCPreFwd (docs/ops.md §2)

use crate::mhc::{MhcPreParams, MhcPreShape};

/// The logit sums of MHCPreFwd, exact to f64 rounding: per batch row β, `h[β·m + q] =
/// Σ_i x[β,i]·phi[i,q]`, `abs[β·m + q] = Σ_i |x[β,i]·phi[i,q]|` and `sumsq[β] = Σ_i x[β,i]²`
/// (`m = n²+2n`).
#[derive(Clone, Debug)]
pub struct MhcPreLogits {
    pub h: Vec<f64>,
    pub abs: Vec<f64>,
    pub sumsq: Vec<f64>,
}

/// Computes [`MhcPreLogits`] (the expensive part of the reference: `batch·n·c·(n²+2n)` f64
/// products). Panics if a slice is shorter than `shape` needs (test helper).
pub fn mhc_pre_logits(shape: MhcPreShape, phi: &[f32], x: &[bf16]) -> MhcPreLogits {
    let MhcPreShape { batch, n, c } = shape;
    let m = shape.logits();
    let k_len = n * c;
    let mut out = MhcPreLogits { h: vec![0.0; batch * m], abs: vec![0.0; batch * m], sumsq: vec![0.0; batch] };
    for b in 0..batch {
        let xr = &x[b * k_len..(b + 1) * k_len];
        let (h, a) = (&mut out.h[b * m..(b + 1) * m], &mut out.abs[b * m..(b + 1) * m]);
        let mut sq = 0.0;
        for (i, xv) in xr.iter().enumerate() {
            let xv = xv.to_f64();
            sq += xv * xv;
            for (q, &p) in phi[i * m..(i + 1) * m].iter().enumerate() {
                let t = xv * p as f64;
                h[q] += t;
                a[q] += t.abs();
            }
        }
        out.sumsq[b] = sq;
    }
    out
}

/// The MHCPreFwd reference: outputs with their tolerance magnitudes, and the f64 coefficients.
#[derive(Clone, Debug, Default)]
pub struct MhcPreRef {
    /// `[batch, n·c]`; magnitude per [`mhc_pre_fwd_from_logits`].
    pub x_res: RefOutput,
    /// `[batch, c]`.
    pub x_layer: RefOutput,
    /// `[batch, n]` (checked with `verify::check_float`).
    pub h_post: RefOutput,
    /// `r` per batch row.
    pub r: Vec<f64>,
    /// `H_pre`, `[batch, n]`.
    pub h_pre: Vec<f64>,
    /// The Sinkhorn-normalised `R`, `[batch, n, n]`.
    pub res: Vec<f64>,
}

/// The accuracy budget of a logit `z = alpha·h/r + b` as a kernel may compute it, relative to
/// the magnitude of its terms: `Δz = LOGIT_REL·(|alpha|·Σ|x·phi|/r + |b| + |z| + 1)`.
///
/// the rule of docs/ops.md would allow each logit sum `2^-16·Σ|x·phi|` (≈ 0.1 for the seed workloads'
/// logits of magnitude ~100 — far too loose to say anything about R). Our kernel sums the
/// exact f64 products in f64 and exchanges partials truncated to 32 mantissa bits (error
/// ≤ 2^-32 of Σ|partials| ≤ 2^-32·Σ|x·phi|); 2^-28 covers that 16×.
pub const LOGIT_REL: f64 = 1.0 / (1u64 << 28) as f64;
/// Relative error of an f32 exponential `e^d` computed from an accurate argument (the kernel:
/// `ex2.approx` of the reduced fraction, 2^-22.5, times an exact power of two), doubled.
pub const EXP_REL: f64 = 1.0 / (1u64 << 21) as f64;
const U32: f64 = 1.0 / (1u64 << 24) as f64;
/// Absolute floor: f32 results below the normal range (subnormal spacing 2^-149).
const TINY: f64 = 1.0 / (1u128 << 126) as f64;

fn sigmoid64(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// MHCPreFwd (docs/ops.md §2) in f64 from its logit sums, with tolerance magnitudes that cover the
/// f32 error of the coefficients as well as the `2^-16·Σ|terms|` of docs/ops.md for the final sums:
///
/// * each logit carries `Δz` ([`LOGIT_REL`]);
/// * `H_pre = σ(z)` carries `ΔH = H·((1−H)·(Δz + EXP_REL) + 3u) + 2^-126` (σ' = σ(1−σ); f32
///   add and divide; u = 2^-24);
/// * `E = exp(z − row max)` carries the relative bound `ρ = Δz + Δz_max + EXP_REL` (1 where
///   E < 2^-126); each Sinkhorn division by `s + eps` adds `ρ_s·s/(s+eps) + 2u`, with the sum's
///   bound `ρ_s = Σ ρ_k·R_k / s + (n−1)·u` (first-order propagation of positive sums: a
///   diagonal-scaling step never amplifies relative errors beyond the weighted mean of its
///   inputs'), so `ΔR = ρ·R + 2^-126`;
/// * `x_res[β,i·c+j]`: magnitude `Σ_k |R_ik·x_k| + 2^16·Σ_k ΔR_ik·|x_k|`, so the checked slack
///   `2^-16·magnitude` is the `2^-16·Σ|terms|` of docs/ops.md plus the coefficients' worst-case effect;
///   `x_layer` likewise with `H_pre`;
/// * `h_post = 2σ`: magnitude `2^20·2·ΔH` (the `2^-20·magnitude` slack of `check_float`).
pub fn mhc_pre_fwd_from_logits(
    shape: MhcPreShape,
    params: MhcPreParams,
    logits: &MhcPreLogits,
    b: &[f32],
    x: &[bf16],
) -> MhcPreRef {
    let MhcPreShape { batch, n, c } = shape;
    let m = shape.logits();
    let eps = params.sinkhorn_eps as f64;
    let mut out = MhcPreRef::default();
    for beta in 0..batch {
        let r = logits.sumsq[beta].sqrt() / ((n * c) as f64).sqrt() + 1e-4;
        out.r.push(r);
        let mut z = vec![0.0; m];
        let mut dz = vec![0.0; m];
        for q in 0..m {
            let alpha = if q < n {
                params.alpha_pre
            } else if q < 2 * n {
                params.alpha_post
            } else {
                params.alpha_res
            } as f64;
            let bq = b[q] as f64;
            z[q] = alpha * logits.h[beta * m + q] / r + bq;
            dz[q] = LOGIT_REL * (alpha.abs() * logits.abs[beta * m + q] / r + bq.abs() + z[q].abs() + 1.0);
        }
        let mut hp = vec![0.0; n];
        let mut dh = vec![0.0; n];
        for k in 0..n {
            let h = sigmoid64(z[k]);
            hp[k] = h;
            dh[k] = h * ((1.0 - h) * (dz[k] + EXP_REL) + 3.0 * U32) + TINY;
            let hpost = sigmoid64(z[n + k]);
            let dpost = hpost * ((1.0 - hpost) * (dz[n + k] + EXP_REL) + 3.0 * U32) + TINY;
            out.h_post.value.push(2.0 * hpost);
            out.h_post.magnitude.push(2.0 * dpost * (1u64 << 20) as f64);
        }
        // R with its first-order relative error bound rho.
        let mut rm = vec![0.0; n * n];
        let mut rho = vec![0.0; n * n];
        for i in 0..n {
            let row = &z[2 * n + i * n..2 * n + (i + 1) * n];
            let (kmax, zmax) =
                row.iter().enumerate().fold((0, f64::NEG_INFINITY), |a, (k, &v)| if v > a.1 { (k, v) } else { a });
            for k in 0..n {
                let e = (row[k] - zmax).exp();
                rm[i * n + k] = e;
                rho[i * n + k] =
                    if e < TINY { 1.0 } else { dz[2 * n + i * n + k] + dz[2 * n + i * n + kmax] + EXP_REL };
            }
        }
        let nu = (n as f64 - 1.0) * U32;
        let normalise = |rm: &mut [f64], rho: &mut [f64], idx: &dyn Fn(usize) -> usize| {
            let s: f64 = (0..n).map(|t| rm[idx(t)]).sum();
            let rs = if s > 0.0 { (0..n).map(|t| rho[idx(t)] * rm[idx(t)]).sum::<f64>() / s + nu } else { nu };
            let d = s + eps;
            for t in 0..n {
                rm[idx(t)] /= d;
                rho[idx(t)] += rs * (s / d) + 2.0 * U32;
            }
        };
        for _ in 0..params.sinkhorn_repeat {
            for i in 0..n {
                normalise(&mut rm, &mut rho, &|k| i * n + k);
            }
            for k in 0..n {
                normalise(&mut rm, &mut rho, &|i| i * n + k);
            }
        }
        let dr: Vec<f64> = rm.iter().zip(&rho).map(|(r, p)| r * p + TINY).collect();
        let xb = &x[beta * n * c..(beta + 1) * n * c];
        let scale = (1u64 << 16) as f64;
        for i in 0..n {
            for j in 0..c {
                let (mut v, mut mag, mut err) = (0.0, 0.0, 0.0);
                for k in 0..n {
                    let xv = xb[k * c + j].to_f64();
                    v += rm[i * n + k] * xv;
                    mag += (rm[i * n + k] * xv).abs();
                    err += dr[i * n + k] * xv.abs();
                }
                out.x_res.value.push(v);
                out.x_res.magnitude.push(mag + scale * err);
            }
        }
        for j in 0..c {
            let (mut v, mut mag, mut err) = (0.0, 0.0, 0.0);
            for k in 0..n {
                let xv = xb[k * c + j].to_f64();
                v += hp[k] * xv;
                mag += (hp[k] * xv).abs();
                err += dh[k] * xv.abs();
            }
            out.x_layer.value.push(v);
            out.x_layer.magnitude.push(mag + scale * err);
        }
        out.h_pre.extend_from_slice(&hp);
        out.res.extend_from_slice(&rm);
    }
    out
}

/// [`mhc_pre_logits`] then [`mhc_pre_fwd_from_logits`]. Panics if a slice is shorter than
/// `shape` needs (test helper).
pub fn mhc_pre_fwd(shape: MhcPreShape, params: MhcPreParams, phi: &[f32], x: &[bf16], b: &[f32]) -> MhcPreRef {
    mhc_pre_fwd_from_logits(shape, params, &mhc_pre_logits(shape, phi, x), b, x)
}

// ------------------------------------------------------------------ MHCPostPreFwd (docs/ops.md §7)

/// The post half's output as MHCPostFwd stores it: `q(fma_f32(h_post, x_layer_out, x_res))`,
/// one f32 fused multiply-add rounded to bf16 — the exact bits (an f32 FMA is exactly rounded,
/// and so is the conversion), which MHCPostPreFwd's pre half consumes.
pub fn mhc_post_stored(shape: MhcPostShape, x_layer_out: &[bf16], h_post: &[f32], x_res: &[bf16]) -> Vec<bf16> {
    let MhcPostShape { batch, n, c } = shape;
    let mut out = Vec::with_capacity(batch * n * c);
    for b in 0..batch {
        for i in 0..n {
            let h = h_post[b * n + i];
            for j in 0..c {
                let v = h.mul_add(x_layer_out[b * c + j].to_f32(), x_res[b * n * c + i * c + j].to_f32());
                out.push(bf16::from_f32(v));
            }
        }
    }
    out
}

/// MHCPostPreFwd (docs/ops.md §7): [`mhc_post_stored`], then [`mhc_pre_fwd`] of it. Returns the
/// stored `x_out` and the pre half's reference. Panics if a slice is shorter than `shape` needs
/// (test helper).
#[allow(clippy::too_many_arguments)]
pub fn mhc_post_pre_fwd(
    shape: MhcPreShape,
    params: MhcPreParams,
    x_layer_out: &[bf16],
    h_post: &[f32],
    x_res: &[bf16],
    phi: &[f32],
    b: &[f32],
) -> (Vec<bf16>, MhcPreRef) {
    let post = MhcPostShape { batch: shape.batch, n: shape.n, c: shape.c };
    let x_out = mhc_post_stored(post, x_layer_out, h_post, x_res);
    let pre = mhc_pre_fwd(shape, params, phi, &x_out, b);
    (x_out, pre)
}
