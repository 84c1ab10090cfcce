//! FFTC2CFwd (docs/ops.md §1) reference: `y[b, k] = Σ_{j<n} x[b, j] · exp(-2πi·j·k/n)`, in f64.
//!
//! Storage is interleaved: element `j` of transform `b` is `(x[2(b·n + j)], x[2(b·n + j) + 1])`.
//! [`fft_c2c_fwd`] is an iterative radix-2 FFT (O(n log n), relative L2 error ≈ 1e-16·√log n)
//! with twiddles from [`twiddle`] (correctly rounded up to the last bit in nearly every case);
//! [`dft_naive`] is the O(n²) definition, used to test it.

/// `exp(-2πi·k/n)` as `(re, im)` in f64, for `n` a power of two (`n ≥ 1`, any `k`).
///
/// The angle is reduced exactly on the integers (quadrant and octant symmetry), so only an
/// angle in [0, π/4] is evaluated, and the rounding of `(π/2)·r/n` is corrected to first order
/// (`π/2` held as a double-double). The result is within about half an ulp of the exact value.
pub fn twiddle(k: u64, n: u64) -> (f64, f64) {
    assert!(n.is_power_of_two(), "twiddle: n = {n} is not a power of two");
    let k = k & (n - 1);
    // 2πk/n = (π/2)·(q + r/n) with 4k = q·n + r, 0 ≤ r < n (done in u128: no overflow).
    let (k4, nn) = (4 * k as u128, n as u128);
    let q = (k4 / nn) as u32;
    let r = (k4 % nn) as u64;
    // θ = (π/2)·r/n ∈ [0, π/2); use the complement above π/4.
    let swap = 2 * r as u128 > nn;
    let rr = if swap { n - r } else { r };
    let (mut c, mut s) = sincos_frac_pi2(rr, n);
    if swap {
        std::mem::swap(&mut c, &mut s);
    }
    // cos/sin of (π/2)·q + θ
    let (cos, sin) = match q & 3 {
        0 => (c, s),
        1 => (-s, c),
        2 => (-c, -s),
        _ => (s, -c),
    };
    (cos + 0.0, -sin + 0.0)
}

/// `(cos θ, sin θ)` for `θ = (π/2)·r/n ≤ π/4`, with the argument carried as a double-double.
fn sincos_frac_pi2(r: u64, n: u64) -> (f64, f64) {
    if r == 0 {
        return (1.0, 0.0);
    }
    if 2 * r as u128 == n as u128 {
        return (std::f64::consts::FRAC_1_SQRT_2, std::f64::consts::FRAC_1_SQRT_2);
    }
    const PI_2_HI: f64 = std::f64::consts::FRAC_PI_2;
    const PI_2_LO: f64 = 6.123_233_995_736_766e-17; // π/2 − PI_2_HI
    let f = r as f64 / n as f64; // exact: n is a power of two and r < 2^53 here
    let hi = PI_2_HI * f;
    let lo = PI_2_HI.mul_add(f, -hi) + PI_2_LO * f;
    let (s, c) = hi.sin_cos();
    (c - s * lo, s + c * lo)
}

/// The table `W_n^i = exp(-2πi·i/n)` for `i < len`, interleaved `(re, im)`.
pub fn twiddle_table(n: u64, len: usize) -> Vec<f64> {
    (0..len as u64)
        .flat_map(|i| {
            let (re, im) = twiddle(i, n);
            [re, im]
        })
        .collect()
}

/// Forward FFT of `batch` transforms of length `n` (a power of two), interleaved complex f64
/// in and out (`x.len() ≥ 2·n·batch`). Iterative radix-2, decimation in time.
pub fn fft_c2c_fwd(n: usize, batch: usize, x: &[f64]) -> Vec<f64> {
    assert!(n.is_power_of_two(), "fft_c2c_fwd: n = {n} is not a power of two");
    assert!(x.len() >= 2 * n * batch, "fft_c2c_fwd: x holds {} reals, needs {}", x.len(), 2 * n * batch);
    let log = n.trailing_zeros();
    let half = n / 2;
    let (mut wr, mut wi) = (Vec::with_capacity(half), Vec::with_capacity(half));
    for i in 0..half as u64 {
        let (a, b) = twiddle(i, n as u64);
        wr.push(a);
        wi.push(b);
    }
    let mut out = vec![0f64; 2 * n * batch];
    let (mut re, mut im) = (vec![0f64; n], vec![0f64; n]);
    for b in 0..batch {
        let xb = &x[2 * b * n..2 * (b + 1) * n];
        for j in 0..n {
            let rj = if log == 0 { 0 } else { j.reverse_bits() >> (usize::BITS - log) };
            re[rj] = xb[2 * j];
            im[rj] = xb[2 * j + 1];
        }
        let mut len = 2;
        while len <= n {
            let h = len / 2;
            let step = n / len;
            for start in (0..n).step_by(len) {
                for i in 0..h {
                    let (w_r, w_i) = (wr[i * step], wi[i * step]);
                    let (p, q) = (start + i, start + i + h);
                    let tr = re[q] * w_r - im[q] * w_i;
                    let ti = re[q] * w_i + im[q] * w_r;
                    re[q] = re[p] - tr;
                    im[q] = im[p] - ti;
                    re[p] += tr;
                    im[p] += ti;
                }
            }
            len *= 2;
        }
        let ob = &mut out[2 * b * n..2 * (b + 1) * n];
        for k in 0..n {
            ob[2 * k] = re[k];
            ob[2 * k + 1] = im[k];
        }
    }
    out
}

/// The O(n²) definition (any `n ≥ 1`), for testing [`fft_c2c_fwd`]; twiddles `exp(-2πi·(jk mod
/// n)/n)` from `f64::sin_cos`.
pub fn dft_naive(n: usize, batch: usize, x: &[f64]) -> Vec<f64> {
    let mut out = vec![0f64; 2 * n * batch];
    for b in 0..batch {
        for k in 0..n {
            let (mut sr, mut si) = (0f64, 0f64);
            for j in 0..n {
                let a = -2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                let (s, c) = a.sin_cos();
                let (xr, xi) = (x[2 * (b * n + j)], x[2 * (b * n + j) + 1]);
                sr += xr * c - xi * s;
                si += xr * s + xi * c;
            }
            out[2 * (b * n + k)] = sr;
            out[2 * (b * n + k) + 1] = si;
        }
    }
    out
}

/// Normwise error of `ours` against `reference` (both interleaved complex as reals):
/// `(‖ours − ref‖₂ / ‖ref‖₂, max |ours − ref|)`; a NaN or Inf in `ours` gives `(∞, ∞)`.
pub fn fft_error(ours: &[f64], reference: &[f64]) -> (f64, f64) {
    assert_eq!(ours.len(), reference.len(), "fft_error: lengths differ");
    let (mut num, mut den, mut max) = (0f64, 0f64, 0f64);
    for (&o, &r) in ours.iter().zip(reference) {
        if !o.is_finite() {
            return (f64::INFINITY, f64::INFINITY);
        }
        let d = o - r;
        num += d * d;
        den += r * r;
        max = max.max(d.abs());
    }
    let rel = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    (rel, max)
}

/// The accuracy bar the tests hold our FFT to: relative L2 error against [`fft_c2c_fwd`] on
/// `randn` input, growing like √log2 n (`unit` = 2^-24 for c64, 2^-53 for c128). cuFFT's c64
/// error on such input is ≈ 1e-7..3e-7.
pub fn fft_error_bound(n: usize, c128: bool) -> f64 {
    let unit = if c128 { 2f64.powi(-53) } else { 2f64.powi(-24) };
    let lg = (n.max(2) as f64).log2();
    3.0 * unit * (1.0 + lg.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(len: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn twiddle_matches_sin_cos() {
        for n in [1u64, 2, 4, 8, 16, 1024, 1 << 22, 1 << 40] {
            for k in [0u64, 1, 2, 3, n / 8, n / 4 + 1, n / 2, 3 * n / 4, n - 1, 7 * n / 8 + 3] {
                let (re, im) = twiddle(k, n);
                let a = -2.0 * std::f64::consts::PI * (k % n) as f64 / n as f64;
                assert!((re - a.cos()).abs() < 2e-15 && (im - a.sin()).abs() < 2e-15, "k={k} n={n}: {re} {im}");
            }
        }
        // Exact values on the axes and the diagonal symmetry.
        assert_eq!(twiddle(1, 4), (0.0, -1.0));
        assert_eq!(twiddle(2, 4), (-1.0, 0.0));
        let (a, b) = twiddle(1, 8);
        assert_eq!(a, -b);
        assert_eq!(a, std::f64::consts::FRAC_1_SQRT_2);
    }

    #[test]
    fn fft_matches_naive_dft() {
        for log in 0..=9 {
            let n = 1 << log;
            for batch in [1, 3] {
                let x = lcg(2 * n * batch, 17 + log as u64);
                let (rel, _) = fft_error(&fft_c2c_fwd(n, batch, &x), &dft_naive(n, batch, &x));
                assert!(rel < 1e-14 * (1.0 + log as f64), "n={n} batch={batch}: rel {rel:e}");
            }
        }
    }

    #[test]
    fn fft_known_values() {
        // A delta gives all ones; a constant gives n at k = 0.
        let n = 64;
        let mut x = vec![0f64; 2 * n];
        x[0] = 1.0;
        assert!(fft_c2c_fwd(n, 1, &x).chunks(2).all(|c| c == [1.0, 0.0]));
        let x: Vec<f64> = (0..n).flat_map(|_| [1.0, 0.0]).collect();
        let y = fft_c2c_fwd(n, 1, &x);
        assert_eq!(&y[..2], &[n as f64, 0.0]);
        assert!(y[2..].iter().all(|v| v.abs() < 1e-13));
        // exp(2πi·3j/n) puts n at k = 3.
        let x: Vec<f64> = (0..n as u64)
            .flat_map(|j| {
                let (c, s) = twiddle(3 * j, n as u64);
                [c, -s]
            })
            .collect();
        let y = fft_c2c_fwd(n, 1, &x);
        for k in 0..n {
            let expect = if k == 3 { n as f64 } else { 0.0 };
            assert!((y[2 * k] - expect).abs() < 1e-12 && y[2 * k + 1].abs() < 1e-12, "k={k}");
        }
    }
}
