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
