//! Tolerance checks shared by the tests and the benchmark (docs/ops.md "Tolerances").
//!
//! A 16-bit output element passes when `|ours − q(ref)| ≤ k·ulp(q(ref)) + 2^-16·Σ|terms|`,
//! NaN or Inf for a finite reference always fails. Normwise errors (`rel_l2_err`,
//! `max_abs_err`) are measured against the unrounded f64 reference.
use half::{bf16, f16};

use crate::reference::RefOutput;

/// A 16-bit storage dtype.
pub trait Half: Copy + Send + Sync + 'static {
    const NAME: &'static str;
    /// Exact conversion to f64.
    fn to_f64(self) -> f64;
    /// Round to nearest even from f64 (a single rounding).
    fn round_f64(v: f64) -> Self;
    /// The unit in the last place of `self` (for zero: the smallest subnormal).
    fn ulp(self) -> f64;
    /// A NaN bit pattern, to poison outputs before a launch.
    fn poison() -> Self;
}

impl Half for bf16 {
    const NAME: &'static str = "bf16";
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn round_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn ulp(self) -> f64 {
        let e = ((self.to_bits() >> 7) & 0xff) as i32;
        // normal: 2^(e-127-7); subnormal/zero: 2^(-126-7)
        2f64.powi(e.max(1) - 127 - 7)
    }
    fn poison() -> Self {
        bf16::from_bits(0x7fc1)
    }
}

impl Half for f16 {
    const NAME: &'static str = "f16";
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn round_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn ulp(self) -> f64 {
        let e = ((self.to_bits() >> 10) & 0x1f) as i32;
        2f64.powi(e.max(1) - 15 - 10)
    }
    fn poison() -> Self {
        f16::from_bits(0x7e01)
    }
}

/// The outcome of comparing one output against its reference.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Elements compared.
    pub count: usize,
    /// Elements outside the tolerance (or not finite).
    pub failures: usize,
    /// The largest `|ours − q(ref)| / ulp(q(ref))` seen (ulp checks only).
    pub max_ulp: f64,
    /// `‖ours − ref‖₂ / ‖ref‖₂` against the unrounded reference.
    pub rel_l2_err: f64,
    /// `max |ours − ref|` against the unrounded reference.
    pub max_abs_err: f64,
    /// The first failing element: (index, ours, reference).
    pub first_failure: Option<(usize, f64, f64)>,
    /// FNV-1a hash of our values' bit patterns (as f64, which every checked type converts to
    /// exactly): two runs agree bitwise exactly when their digests are equal (up to collisions).
    pub digest: u64,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures == 0
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} elements, {} failures, max {:.3} ulp, rel_l2 {:.3e}, max_abs {:.3e}, bits {:016x}",
            self.count, self.failures, self.max_ulp, self.rel_l2_err, self.max_abs_err, self.digest
        )?;
        if let Some((i, o, r)) = self.first_failure {
            write!(f, "; first failure at {i}: got {o:e}, reference {r:e}")?;
        }
        Ok(())
    }
}

/// FNV-1a over the little-endian bytes of each value's f64 bit pattern.
pub fn digest(values: impl Iterator<Item = f64>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in values {
        for b in v.to_bits().to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Accumulates the normwise errors.
fn norms(ours: impl Iterator<Item = f64>, reference: &[f64]) -> (f64, f64) {
    let (mut num, mut den, mut max_abs) = (0f64, 0f64, 0f64);
    for (o, &r) in ours.zip(reference) {
        let d = o - r;
        num += d * d;
        den += r * r;
        max_abs = max_abs.max(d.abs());
    }
    let rel = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    (rel, max_abs)
}

/// Checks a 16-bit output against `reference` within `max_ulp` ulp of the correctly rounded
/// value, plus `2^-16 · magnitude` slack. Every element is checked; `ours.len()` must equal
/// the reference's length (a mismatch counts every missing element as a failure).
pub fn check_half<T: Half>(ours: &[T], reference: &RefOutput, max_ulp: f64) -> Report {
    let mut rep = Report { count: reference.value.len(), ..Report::default() };
    if ours.len() != reference.value.len() {
        rep.failures = reference.value.len().abs_diff(ours.len()).max(1);
    }
    for (i, (&o, (&r, &m))) in ours.iter().zip(reference.value.iter().zip(&reference.magnitude)).enumerate() {
        let o = o.to_f64();
        let q = T::round_f64(r);
        let ulp = q.ulp();
        let err = (o - q.to_f64()).abs();
        let slack = m * 2f64.powi(-16);
        let ok = o.is_finite() && err <= max_ulp * ulp + slack;
        if o.is_finite() {
            rep.max_ulp = rep.max_ulp.max(err / ulp);
        }
        if !ok {
            rep.failures += 1;
            rep.first_failure.get_or_insert((i, o, r));
        }
    }
    (rep.rel_l2_err, rep.max_abs_err) = norms(ours.iter().map(|v| v.to_f64()), &reference.value);
    rep.digest = digest(ours.iter().map(|v| v.to_f64()));
    if ours.iter().any(|v| !v.to_f64().is_finite()) {
        rep.rel_l2_err = f64::NAN;
    }
    rep
}

/// Checks an f32/f64 output to a relative tolerance per element:
/// `|ours − ref| ≤ rel·|ref| + 2^-20·magnitude` (f32 accumulation slack).
pub fn check_float(ours: &[f64], reference: &RefOutput, rel: f64) -> Report {
    let mut rep = Report { count: reference.value.len(), ..Report::default() };
    if ours.len() != reference.value.len() {
        rep.failures = reference.value.len().abs_diff(ours.len()).max(1);
    }
    for (i, (&o, (&r, &m))) in ours.iter().zip(reference.value.iter().zip(&reference.magnitude)).enumerate() {
        let err = (o - r).abs();
        if !(o.is_finite() && err <= rel * r.abs() + m * 2f64.powi(-20)) {
            rep.failures += 1;
            rep.first_failure.get_or_insert((i, o, r));
        }
    }
    (rep.rel_l2_err, rep.max_abs_err) = norms(ours.iter().copied(), &reference.value);
    rep.digest = digest(ours.iter().copied());
    rep
}

/// Poison values for a buffer of `len` elements of `T` (NaN patterns), so an element the
/// kernel fails to write is caught.
pub fn poisoned<T: Half>(len: usize) -> Vec<T> {
    vec![T::poison(); len]
}
