//! Bytes until the next sampled allocation: exponentially distributed with
//! a given mean, as tcmalloc and jemalloc sample. The sampling points form
//! a Poisson process over the bytes a thread allocates, so an allocation of
//! `s` bytes is sampled with probability `1 - exp(-s / mean)` whatever came
//! before it, which is what the analyzer's estimator divides by.
//!
//! Without the C math library (the sampler stays free of dependencies):
//! a small random generator and a natural logarithm good to about 1e-12.

/// xorshift64*: fast, and plenty for drawing sampling intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rng(u64);

impl Rng {
    /// A generator from any seed (0 is replaced).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// The natural logarithm of a finite `x > 0` (other inputs give 0).
pub fn ln(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 || x.is_infinite() {
        return 0.0;
    }
    // x = m * 2^e with m in [1, 2), from the bits (subnormals are far
    // below what `unit` produces).
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
    let mut e = e as f64;
    // Center m on 1 so the series below converges fast: m in [0.75, 1.5).
    if m > 1.5 {
        m /= 2.0;
        e += 1.0;
    }
    // ln(m) = 2 atanh(z), z = (m - 1) / (m + 1), |z| < 0.2.
    let z = (m - 1.0) / (m + 1.0);
    let z2 = z * z;
    let mut term = z;
    let mut sum = 0.0;
    let mut k = 1.0;
    while k < 30.0 {
        sum += term / k;
        term *= z2;
        k += 2.0;
    }
    e * core::f64::consts::LN_2 + 2.0 * sum
}

/// Bytes until the next sample, for a mean of `mean` bytes (at least 1).
pub fn next_interval(rng: &mut Rng, mean: u64) -> i64 {
    if mean <= 1 {
        return 0;
    }
    let bytes = -ln(rng.unit()) * mean as f64;
    // At least one byte; at most far beyond any realistic run, so the
    // countdown cannot overflow.
    bytes.clamp(1.0, (1u64 << 50) as f64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_matches_the_math_library() {
        let mut x = 1e-17;
        while x < 1e17 {
            let err = (ln(x) - x.ln()).abs();
            assert!(err < 1e-12 * x.ln().abs().max(1.0), "{x}: {err}");
            x *= 1.37;
        }
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(0.0), 0.0);
        assert_eq!(ln(-1.0), 0.0);
        assert_eq!(ln(f64::NAN), 0.0);
    }

    #[test]
    fn intervals_are_exponential_with_the_mean_asked_for() {
        let mut rng = Rng::new(42);
        let mean = 512 * 1024;
        let n = 200_000;
        let draws: Vec<i64> = (0..n).map(|_| next_interval(&mut rng, mean)).collect();
        let avg = draws.iter().sum::<i64>() as f64 / n as f64;
        assert!((avg / mean as f64 - 1.0).abs() < 0.01, "{avg}");
        // Exponential: P(X > mean) = 1/e.
        let above = draws.iter().filter(|&&d| d > mean as i64).count() as f64 / n as f64;
        assert!((above - (-1.0f64).exp()).abs() < 0.01, "{above}");
        assert!(draws.iter().all(|&d| d >= 1));
        assert_eq!(next_interval(&mut rng, 1), 0, "every allocation");
    }
}
