//! EngramGateConvFwd / EngramGateConvBwd (docs/ops.md §4–§5) references in f64.
//!
//! Every value is carried with a running error magnitude (`Ev`): each operation adds the
//! magnitude of its result (one rounding) to the first-order propagation of its operands'
//! magnitudes, and a reduction adds `Σ|terms|` (docs/ops.md's "magnitude of the summed terms") to the
//! terms' own magnitudes. The result's `magnitude` is therefore `Σ` over every rounding of the
//! f32 computation of `|∂out/∂(that intermediate)| · |intermediate|`; an f32 implementation
//! performing those operations errs by at most about `(log2 n + 2)·2^-24·magnitude`
//! (`n` the longest reduction), far inside the slack of docs/ops.md `2^-16·magnitude` (256× margin).
//! Cancellation (e.g. the two terms of an rmsnorm backward) is judged by the terms, as docs/ops.md
//! says. The arithmetic below follows the kernels' order of operations.
use crate::engram::EngramGateShape;
use crate::verify::Half;

use super::RefOutput;

const EPS: f64 = 1e-6;

/// A value with its running error magnitude.
#[derive(Clone, Copy, Debug, Default)]
struct Ev {
    v: f64,
    e: f64,
}

impl Ev {
    /// An exact input (its bits are what the kernel reads).
    fn x(v: f64) -> Self {
        Self { v, e: 0.0 }
    }
    fn add(self, o: Self) -> Self {
        let v = self.v + o.v;
        Self { v, e: self.e + o.e + v.abs() }
    }
    fn sub(self, o: Self) -> Self {
        let v = self.v - o.v;
        Self { v, e: self.e + o.e + v.abs() }
    }
    fn mul(self, o: Self) -> Self {
        let v = self.v * o.v;
        Self { v, e: self.v.abs() * o.e + o.v.abs() * self.e + v.abs() }
    }
    fn div(self, o: Self) -> Self {
        let v = self.v / o.v;
        Self { v, e: self.e / o.v.abs() + v.abs() * o.e / o.v.abs() + v.abs() }
    }
    /// `1/sqrt(self)`.
    fn rsqrt(self) -> Self {
        let v = 1.0 / self.v.sqrt();
        Self { v, e: 0.5 * v / self.v.abs() * self.e + v.abs() }
    }
    fn sigmoid(self) -> Self {
        let v = 1.0 / (1.0 + (-self.v).exp());
        Self { v, e: v * (1.0 - v) * self.e + v }
    }
    /// `Σ terms` as one reduction: `Σ e_i + Σ |v_i|`.
    fn sum(terms: impl IntoIterator<Item = Self>) -> Self {
        let (mut v, mut e, mut m) = (0.0, 0.0, 0.0);
        for t in terms {
            v += t.v;
            e += t.e;
            m += t.v.abs();
        }
        Self { v, e: e + m }
    }
}

/// A reduction built one term at a time (same result as [`Ev::sum`]).
#[derive(Clone, Copy, Debug, Default)]
struct Acc {
    v: f64,
    e: f64,
    m: f64,
}

impl Acc {
    fn push(&mut self, t: Ev) {
        self.v += t.v;
        self.e += t.e;
        self.m += t.v.abs();
    }
    fn get(self) -> Ev {
        Ev { v: self.v, e: self.e + self.m }
    }
}

fn c(v: f64) -> Ev {
    Ev::x(v)
}

/// `rrms = 1/sqrt(sum/d + eps)`.
fn rrms(sum: Ev, d: usize) -> Ev {
    sum.div(c(d as f64)).add(c(EPS)).rsqrt()
}

fn out(vals: &[Ev]) -> RefOutput {
    RefOutput { value: vals.iter().map(|x| x.v).collect(), magnitude: vals.iter().map(|x| x.e).collect() }
}

fn to_f64<T: Half>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Inputs of the op in f64 (`h, k, v` `[M,T,d]`, `wh, wv` `[d]`, `cw` `[4,d]`).
struct Inputs<'a> {
    h: &'a [f64],
    k: &'a [f64],
    v: &'a [f64],
    wh: &'a [f64],
    wv: &'a [f64],
    cw: &'a [f64],
}

/// Per-row forward intermediates.
struct Fwd {
    alpha: Vec<Ev>,
    rh: Vec<Ev>,
    rk: Vec<Ev>,
    rv: Vec<Ev>,
    /// `vh = alpha·v` `[M,T,d]` (unrounded).
    vh: Vec<Ev>,
    /// What `u` is formed from: `q(vh)` (or the kernel's `vhat`), or `vh` when `q` = identity.
    vq: Vec<Ev>,
    /// `vq` rounded correctly from the f64 `vh` (the `vhat` reference).
    vhat: Vec<Ev>,
    y: Vec<Ev>,
}

/// The forward of docs/ops.md §4 in f64. `q`: rounding to the storage dtype (`None` = identity);
/// `vhat_used`: the 16-bit `vhat` actually produced (then `u` is formed from it).
fn forward(s: EngramGateShape, x: &Inputs, q: Option<&dyn Fn(f64) -> f64>, vhat_used: Option<&[f64]>) -> Fwd {
    let (m_len, t_len, d) = (s.m, s.t, s.d);
    let rows = m_len * t_len;
    let sd = (d as f64).sqrt();
    let mut f = Fwd {
        alpha: vec![Ev::default(); rows],
        rh: vec![Ev::default(); rows],
        rk: vec![Ev::default(); rows],
        rv: vec![Ev::default(); rows],
        vh: vec![Ev::default(); rows * d],
        vq: vec![Ev::default(); rows * d],
        vhat: vec![Ev::default(); rows * d],
        y: vec![Ev::default(); rows * d],
    };
    for row in 0..rows {
        let o = row * d;
        let hh = |j: usize| c(x.h[o + j]);
        let kk = |j: usize| c(x.k[o + j]);
        let shh = Ev::sum((0..d).map(|j| hh(j).mul(hh(j))));
        let skk = Ev::sum((0..d).map(|j| kk(j).mul(kk(j))));
        let shk = Ev::sum((0..d).map(|j| hh(j).mul(kk(j)).mul(c(x.wh[j]).mul(c(x.wh[j])))));
        let rh = rrms(shh, d);
        let rk = rrms(skk, d);
        let alpha = shk.mul(rh).mul(rk).div(c(sd)).sigmoid();
        (f.alpha[row], f.rh[row], f.rk[row]) = (alpha, rh, rk);
        for j in 0..d {
            let vh = alpha.mul(c(x.v[o + j]));
            f.vh[o + j] = vh;
            f.vhat[o + j] = match q {
                Some(q) => Ev { v: q(vh.v), e: vh.e },
                None => vh,
            };
            f.vq[o + j] = match (vhat_used, q) {
                (Some(u), _) => c(u[o + j]),
                (None, Some(_)) => f.vhat[o + j],
                (None, None) => vh,
            };
        }
        let svv = Ev::sum((0..d).map(|j| f.vq[o + j].mul(f.vq[o + j])));
        f.rv[row] = rrms(svv, d);
    }
    let u = |row: usize, j: usize| f.vq[row * d + j].mul(f.rv[row]).mul(c(x.wv[j]));
    let mut y = vec![Ev::default(); rows * d];
    for m in 0..m_len {
        for t in 0..t_len {
            let row = m * t_len + t;
            for j in 0..d {
                let mut conv = c(0.0);
                for p in 0..4 {
                    if t + p >= 3 {
                        conv = conv.add(c(x.cw[p * d + j]).mul(u(row + p - 3, j)));
                    }
                }
                let silu = conv.mul(conv.sigmoid());
                y[row * d + j] = silu.add(f.vh[row * d + j]);
            }
        }
    }
    f.y = y;
    f
}

/// The EngramGateConvFwd reference: each output's f64 value (before the final rounding `q`)
/// and its error magnitude (module doc).
#[derive(Clone, Debug, Default)]
pub struct EngramGateFwdRef {
    pub y: RefOutput,
    pub vhat: RefOutput,
    pub alpha: RefOutput,
    pub rrms_h: RefOutput,
    pub rrms_k: RefOutput,
    pub rrms_v: RefOutput,
}

/// EngramGateConvFwd (docs/ops.md §4) in f64 for the storage dtype `T`. `vhat_used`: when given
/// (the kernel's own `vhat`, already checked against `vhat`'s reference), `u`, `rrms_v` and `y`
/// are formed from it, so a value of `vh` that lands within f32 rounding of a `q` tie (where
/// f32 and f64 legitimately round to neighbouring 16-bit values) does not count against `y`.
/// Panics if a slice is shorter than `shape` needs (test helper).
#[allow(clippy::too_many_arguments)]
pub fn engram_gate_fwd<T: Half>(
    shape: EngramGateShape,
    h: &[T],
    k: &[T],
    v: &[T],
    rms_w_h: &[T],
    rms_w_v: &[T],
    conv_w: &[T],
    vhat_used: Option<&[T]>,
) -> EngramGateFwdRef {
    let (hf, kf, vf, whf, wvf, cwf) =
        (to_f64(h), to_f64(k), to_f64(v), to_f64(rms_w_h), to_f64(rms_w_v), to_f64(conv_w));
    let x = Inputs { h: &hf, k: &kf, v: &vf, wh: &whf, wv: &wvf, cw: &cwf };
    let used = vhat_used.map(to_f64);
    let q = |a: f64| T::round_f64(a).to_f64();
    let f = forward(shape, &x, Some(&q), used.as_deref());
    EngramGateFwdRef {
        y: out(&f.y),
        vhat: out(&f.vhat),
        alpha: out(&f.alpha),
        rrms_h: out(&f.rh),
        rrms_k: out(&f.rk),
        rrms_v: out(&f.rv),
    }
}

/// The forward `Y` with `q` = identity, all f64 (the function the backward differentiates),
/// on f64 inputs: `h, k, v` `[M,T,d]`, `rms_w_h, rms_w_v` `[d]`, `conv_w` `[4,d]`.
pub fn engram_gate_fwd_exact(
    shape: EngramGateShape,
    h: &[f64],
    k: &[f64],
    v: &[f64],
    rms_w_h: &[f64],
    rms_w_v: &[f64],
    conv_w: &[f64],
) -> Vec<f64> {
    let x = Inputs { h, k, v, wh: rms_w_h, wv: rms_w_v, cw: conv_w };
    forward(shape, &x, None, None).y.iter().map(|e| e.v).collect()
}

/// The EngramGateConvBwd reference: values and error magnitudes of every gradient.
#[derive(Clone, Debug, Default)]
pub struct EngramGateBwdRef {
    pub dh: RefOutput,
    pub dk: RefOutput,
    pub dv: RefOutput,
    pub drms_w_h: RefOutput,
    pub drms_w_v: RefOutput,
    pub dconv_w: RefOutput,
}

/// Backward on f64 inputs (module doc; `dy` `[M,T,d]`).
#[allow(clippy::too_many_arguments)]
fn backward(s: EngramGateShape, x: &Inputs, dy: &[f64]) -> EngramGateBwdRef {
    let f = forward(s, x, None, None);
    let (m_len, t_len, d) = (s.m, s.t, s.d);
    let rows = m_len * t_len;
    let df = c(d as f64);
    let sc = c(1.0).div(c((d as f64).sqrt()));
    let wv = |j: usize| c(x.wv[j]);
    let cw = |p: usize, j: usize| c(x.cw[p * d + j]);
    // u, conv, dconv
    let u = |row: usize, j: usize| f.vh[row * d + j].mul(f.rv[row]).mul(wv(j));
    let mut dconv = vec![Ev::default(); rows * d];
    for m in 0..m_len {
        for t in 0..t_len {
            let row = m * t_len + t;
            for j in 0..d {
                let mut conv = c(0.0);
                for p in 0..4 {
                    if t + p >= 3 {
                        conv = conv.add(cw(p, j).mul(u(row + p - 3, j)));
                    }
                }
                let sg = conv.sigmoid();
                let sp = sg.mul(c(1.0).add(conv.mul(c(1.0).sub(sg))));
                dconv[row * d + j] = c(dy[row * d + j]).mul(sp);
            }
        }
    }
    let mut r = EngramGateBwdRef::default();
    let (mut dh, mut dk, mut dv) =
        (vec![Ev::default(); rows * d], vec![Ev::default(); rows * d], vec![Ev::default(); rows * d]);
    let mut dwh = vec![Acc::default(); d];
    let mut dwv = vec![Acc::default(); d];
    let mut dcw = vec![Acc::default(); 4 * d];
    for m in 0..m_len {
        for t in 0..t_len {
            let row = m * t_len + t;
            let o = row * d;
            let a = f.alpha[row];
            let rv = f.rv[row];
            let du: Vec<Ev> = (0..d)
                .map(|j| {
                    let mut acc = c(0.0);
                    for p in 0..4 {
                        if t + 3 - p < t_len {
                            acc = acc.add(cw(p, j).mul(dconv[(row + 3 - p) * d + j]));
                        }
                    }
                    acc
                })
                .collect();
            let s1 = Ev::sum((0..d).map(|j| du[j].mul(wv(j)).mul(f.vh[o + j])));
            let c1 = rv.mul(rv).mul(rv).mul(s1.div(df));
            let dvh: Vec<Ev> =
                (0..d).map(|j| c(dy[o + j]).add(rv.mul(du[j].mul(wv(j))).sub(f.vh[o + j].mul(c1)))).collect();
            for j in 0..d {
                dv[o + j] = a.mul(dvh[j]);
            }
            let s2 = Ev::sum((0..d).map(|j| dvh[j].mul(c(x.v[o + j]))));
            let dz = a.mul(c(1.0).sub(a)).mul(s2);
            let (rh, rk) = (f.rh[row], f.rk[row]);
            let aa = dz.mul(sc).mul(rh).mul(rk);
            let p_sum = Ev::sum((0..d).map(|j| {
                let w = c(x.wh[j]);
                c(x.h[o + j]).mul(c(x.k[o + j])).mul(w.mul(w))
            }));
            let pd = p_sum.div(df);
            let (ch, ck) = (rh.mul(rh).mul(pd), rk.mul(rk).mul(pd));
            for j in 0..d {
                let (hh, kk, w) = (c(x.h[o + j]), c(x.k[o + j]), c(x.wh[j]));
                let w2 = w.mul(w);
                dh[o + j] = aa.mul(kk.mul(w2).sub(hh.mul(ch)));
                dk[o + j] = aa.mul(hh.mul(w2).sub(kk.mul(ck)));
                dwh[j].push(c(2.0).mul(aa).mul(w).mul(hh.mul(kk)));
                dwv[j].push(du[j].mul(f.vh[o + j].mul(rv)));
                for p in 0..4 {
                    if t + p >= 3 {
                        dcw[p * d + j].push(dconv[o + j].mul(u(row + p - 3, j)));
                    }
                }
            }
        }
    }
    r.dh = out(&dh);
    r.dk = out(&dk);
    r.dv = out(&dv);
    r.drms_w_h = out(&dwh.into_iter().map(Acc::get).collect::<Vec<_>>());
    r.drms_w_v = out(&dwv.into_iter().map(Acc::get).collect::<Vec<_>>());
    r.dconv_w = out(&dcw.into_iter().map(Acc::get).collect::<Vec<_>>());
    r
}

/// EngramGateConvBwd (docs/ops.md §5) in f64: the exact gradients of `L = Σ dY·Y` with `Y` the
/// forward evaluated with `q` = identity, from the op's inputs (the forward's saved tensors
/// are recomputed). Values are before the final rounding of `dh, dk, dv`. Panics if a slice
/// is shorter than `shape` needs (test helper).
#[allow(clippy::too_many_arguments)]
pub fn engram_gate_bwd<T: Half>(
    shape: EngramGateShape,
    dy: &[T],
    h: &[T],
    k: &[T],
    v: &[T],
    rms_w_h: &[T],
    rms_w_v: &[T],
    conv_w: &[T],
) -> EngramGateBwdRef {
    let (hf, kf, vf, whf, wvf, cwf) =
        (to_f64(h), to_f64(k), to_f64(v), to_f64(rms_w_h), to_f64(rms_w_v), to_f64(conv_w));
    let x = Inputs { h: &hf, k: &kf, v: &vf, wh: &whf, wv: &wvf, cw: &cwf };
    backward(shape, &x, &to_f64(dy))
}

/// [`engram_gate_bwd`] on f64 inputs (for finite-difference checks).
#[allow(clippy::too_many_arguments)]
pub fn engram_gate_bwd_exact(
    shape: EngramGateShape,
    dy: &[f64],
    h: &[f64],
    k: &[f64],
    v: &[f64],
    rms_w_h: &[f64],
    rms_w_v: &[f64],
    conv_w: &[f64],
) -> EngramGateBwdRef {
    let x = Inputs { h, k, v, wh: rms_w_h, wv: rms_w_v, cw: conv_w };
    backward(shape, &x, dy)
}
