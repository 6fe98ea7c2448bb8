//! Medians and ratios: the only statistics a noisy shared machine supports.

/// The median of `values`, `None` when empty. NaNs are ignored.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// An interval that holds the median of the distribution `values` were
/// drawn from with probability at least `confidence` (e.g. 0.95), whatever
/// that distribution: the `k`th smallest and `k`th largest value, for the
/// largest `k` whose coverage, `1 - 2 P(Binomial(n, 1/2) < k)`, is at least
/// `confidence`. Assumes only that the values are independent draws (the
/// rounds of a benchmark). `None` below 6 values at 95 %: too few for any
/// interval to reach it. NaNs are ignored.
pub fn median_interval(values: &[f64], confidence: f64) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    let n = v.len();
    if n == 0 {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    // P(Binomial(n, 1/2) = i) for i = 0, 1, ..., in floating point (exact
    // enough for the few hundred rounds a benchmark runs).
    let mut p = 0.5f64.powi(n as i32);
    let mut below = 0.0;
    let mut best = None;
    for k in 1..=n.div_ceil(2) {
        // `below` is P(B < k) once p (= P(B = k - 1)) is added.
        below += p;
        p *= (n - (k - 1)) as f64 / k as f64;
        if 1.0 - 2.0 * below < confidence {
            break;
        }
        best = Some((v[k - 1], v[n - k]));
    }
    best
}

/// Per-round values of a comparison (differences or ratios) summed up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    pub median: f64,
    /// Where the median lies with 95 % confidence (from 6 values on).
    pub interval: Option<(f64, f64)>,
    /// Values below the mark given to [`paired`] (the rounds one side won).
    pub below: usize,
    /// Values summed up (NaNs left out).
    pub rounds: usize,
}

/// [`Paired`] of `values`, counting those below `mark`; `None` when there
/// is no value. NaNs are ignored.
pub fn paired(values: &[f64], mark: f64) -> Option<Paired> {
    Some(Paired {
        median: median(values)?,
        interval: median_interval(values, 0.95),
        below: values.iter().filter(|v| **v < mark).count(),
        rounds: values.iter().filter(|v| !v.is_nan()).count(),
    })
}

/// `part / whole` as a percentage, `None` when `whole` is zero.
pub fn percent(part: f64, whole: f64) -> Option<f64> {
    (whole != 0.0).then(|| 100.0 * part / whole)
}

/// Per-run overheads in percent: `100 * (profiled[i] / baseline[i] - 1)` for
/// each run `i` measured in both lists, pairing runs of the same round so
/// that machine noise shared by a round cancels out.
pub fn paired_overheads(baseline: &[f64], profiled: &[f64]) -> Vec<f64> {
    baseline
        .iter()
        .zip(profiled)
        .filter(|(b, _)| **b > 0.0)
        .map(|(b, p)| 100.0 * (p / b - 1.0))
        .collect()
}

/// Per-round ratios `a[i] / b[i]` of two lists measured in the same
/// rounds (none if their lengths differ: a failed run shifted one), for
/// rounds where `b` is positive.
pub fn paired_ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    if a.len() != b.len() {
        return Vec::new();
    }
    a.iter()
        .zip(b)
        .filter(|(_, b)| **b > 0.0)
        .map(|(a, b)| a / b)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_ratios_need_the_same_rounds() {
        assert_eq!(paired_ratios(&[2.0, 3.0], &[1.0, 0.0]), vec![2.0]);
        assert!(paired_ratios(&[2.0, 3.0], &[1.0]).is_empty());
    }

    #[test]
    fn the_median_interval_is_the_order_statistics_binomial_coverage_allows() {
        let values: Vec<f64> = (1..=25).map(f64::from).collect();
        // n = 25: P(B <= 7) = 0.0216, so the 8th smallest and largest
        // (coverage 0.957); the 9th would cover only 0.892.
        assert_eq!(median_interval(&values, 0.95), Some((8.0, 18.0)));
        // n = 6: only min and max, covering 1 - 2/64 = 0.969.
        assert_eq!(
            median_interval(&[6.0, 1.0, 5.0, 2.0, 4.0, 3.0], 0.95),
            Some((1.0, 6.0))
        );
        // n = 5: even min and max cover only 0.9375.
        assert_eq!(median_interval(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95), None);
        assert_eq!(
            median_interval(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.9),
            Some((1.0, 5.0))
        );
        assert_eq!(median_interval(&[], 0.95), None);
        assert_eq!(median_interval(&[f64::NAN; 9], 0.95), None);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.5]), Some(7.5));
    }

    #[test]
    fn median_ignores_nan_and_empty_is_none() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[f64::NAN, 1.0, 5.0, 3.0]), Some(3.0));
    }

    #[test]
    fn percent_of_zero_is_none() {
        assert_eq!(percent(1.0, 0.0), None);
        assert_eq!(percent(1.0, 4.0), Some(25.0));
    }

    #[test]
    fn overheads_pair_runs_of_the_same_round() {
        let o = paired_overheads(&[2.0, 4.0, 0.0], &[2.2, 4.0, 1.0]);
        assert_eq!(o.len(), 2, "a zero baseline is skipped: {o:?}");
        assert!((o[0] - 10.0).abs() < 1e-9);
        assert!(o[1].abs() < 1e-9);
    }
}
