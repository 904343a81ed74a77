//! The curve a keep-alive policy is judged against: fixed keep-alives from 1 to 120 minutes
//! trace cold-start overhead against idle memory for a workload and a node size, and a policy
//! is as good as its overhead over the curve's at the same idle memory. A policy that only
//! keeps containers longer moves along the curve (ratio 1); one that predicts well lies under it.

/// One point of the curve: a fixed keep-alive, its idle memory-time and cold-start overhead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CurvePoint {
    pub minutes: f64,
    pub idle_gb_s: f64,
    pub overhead_s: f64,
}

/// The curve's overhead at `idle_gb_s`, interpolated linearly between its neighbouring points
/// by idle memory; `None` outside the curve (below its least idle memory or above its most),
/// where nothing fixed says what that memory buys.
pub fn overhead_at(curve: &[CurvePoint], idle_gb_s: f64) -> Option<f64> {
    let mut points: Vec<CurvePoint> = curve.to_vec();
    points.sort_by(|a, b| a.idle_gb_s.total_cmp(&b.idle_gb_s));
    let (first, last) = (points.first()?, points.last()?);
    if idle_gb_s < first.idle_gb_s || idle_gb_s > last.idle_gb_s {
        return None;
    }
    for pair in points.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if (a.idle_gb_s..=b.idle_gb_s).contains(&idle_gb_s) {
            let span = b.idle_gb_s - a.idle_gb_s;
            if span <= 0.0 {
                return Some(a.overhead_s.min(b.overhead_s));
            }
            let t = (idle_gb_s - a.idle_gb_s) / span;
            return Some(a.overhead_s + t * (b.overhead_s - a.overhead_s));
        }
    }
    Some(first.overhead_s)
}

/// A policy's overhead over the curve's at its idle memory (`None` outside the curve, or
/// where the curve pays nothing there).
pub fn ratio_to_curve(curve: &[CurvePoint], idle_gb_s: f64, overhead_s: f64) -> Option<f64> {
    let at = overhead_at(curve, idle_gb_s)?;
    (at > 0.0).then(|| (overhead_s / at * 100.0).round() / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(minutes: f64, idle: f64, overhead: f64) -> CurvePoint {
        CurvePoint { minutes, idle_gb_s: idle, overhead_s: overhead }
    }

    #[test]
    fn a_policy_is_judged_at_its_own_idle_memory() {
        let curve = [p(10.0, 300.0, 400.0), p(1.0, 100.0, 1000.0), p(30.0, 500.0, 200.0)];
        // On a point, between points, and outside.
        assert_eq!(overhead_at(&curve, 300.0), Some(400.0));
        assert_eq!(overhead_at(&curve, 200.0), Some(700.0));
        assert_eq!(overhead_at(&curve, 50.0), None);
        assert_eq!(overhead_at(&curve, 600.0), None);
        // Half the curve's overhead at 400 GB·s (300 there).
        assert_eq!(ratio_to_curve(&curve, 400.0, 150.0), Some(0.5));
        // A fixed keep-alive is on its own curve.
        assert_eq!(ratio_to_curve(&curve, 500.0, 200.0), Some(1.0));
        assert_eq!(ratio_to_curve(&[p(1.0, 1.0, 0.0), p(2.0, 2.0, 0.0)], 1.5, 3.0), None);
    }
}
