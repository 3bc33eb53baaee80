//! Kneedle knee detection (Satopää, Albrecht, Irwin, Raghavan: "Finding a
//! 'Kneedle' in a Haystack: Detecting Knee Points in System Behavior", 2011).
//!
//! Offline variant without smoothing: the curve is normalised to the unit
//! square, turned into a concave increasing shape, and the difference curve
//! `y_d = y_n - x_n` is scanned. Every local maximum `(x_lmx, y_lmx)` of `y_d`
//! gets a threshold `T = y_lmx - S · mean(Δx_n)`; it is reported as a knee if
//! `y_d` drops below `T` before it starts increasing again (the paper's reset
//! at the next local minimum). All knees are returned, not just the first.

/// Shape of the input curve.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CurveShape {
    /// Concave and increasing, e.g. a hit-ratio curve.
    ConcaveIncreasing,
    /// Convex and decreasing, e.g. a miss-ratio curve (flipped to `1 - y`).
    ConvexDecreasing,
}

/// One detected knee.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Knee {
    /// Index of the knee in the input slice.
    pub index: usize,
    /// x value of the knee.
    pub x: f64,
    /// y value of the knee (input units).
    pub y: f64,
    /// Value of the normalised difference curve at the knee (its prominence).
    pub diff: f64,
}

/// The paper's default sensitivity.
pub const DEFAULT_SENSITIVITY: f64 = 1.0;

/// All knees of `points`, in increasing x order.
///
/// Caller guarantees: `points` sorted by strictly increasing x, all values
/// finite, `sensitivity >= 0` (asserted). Returns no knee for fewer than three
/// points or a constant y (flat line), and none for a straight line.
pub fn kneedle(points: &[(f64, f64)], shape: CurveShape, sensitivity: f64) -> Vec<Knee> {
    assert!(
        sensitivity >= 0.0 && sensitivity.is_finite(),
        "bad sensitivity {sensitivity}"
    );
    for w in points.windows(2) {
        assert!(w[0].0 < w[1].0, "x values must be strictly increasing");
    }
    assert!(
        points.iter().all(|p| p.0.is_finite() && p.1.is_finite()),
        "non-finite point"
    );
    let n = points.len();
    if n < 3 {
        return Vec::new();
    }
    let (x0, x1) = (points[0].0, points[n - 1].0);
    let (ymin, ymax) = points
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
    let yrange = ymax - ymin;
    if yrange <= f64::EPSILON * ymax.abs().max(1.0) {
        return Vec::new();
    }
    let diff: Vec<f64> = points
        .iter()
        .map(|&(x, y)| {
            let xn = (x - x0) / (x1 - x0);
            let mut yn = (y - ymin) / yrange;
            if shape == CurveShape::ConvexDecreasing {
                yn = 1.0 - yn;
            }
            yn - xn
        })
        .collect();
    // Mean spacing of the normalised x values is 1 / (n - 1).
    let step = sensitivity / (n - 1) as f64;
    let mut knees = Vec::new();
    for i in 1..n - 1 {
        let is_lmx = diff[i] > diff[i - 1] && diff[i] >= diff[i + 1];
        if !is_lmx {
            continue;
        }
        let threshold = diff[i] - step;
        for j in i + 1..n {
            if diff[j] < threshold {
                knees.push(Knee {
                    index: i,
                    x: points[i].0,
                    y: points[i].1,
                    diff: diff[i],
                });
                break;
            }
            if diff[j] > diff[j - 1] {
                break; // passed a local minimum before reaching the threshold: reset
            }
        }
    }
    knees
}

/// The knee with the largest difference value (ties: the smaller x), if any.
pub fn most_prominent(knees: &[Knee]) -> Option<Knee> {
    knees
        .iter()
        .copied()
        .fold(None, |best: Option<Knee>, k| match best {
            Some(b) if b.diff >= k.diff => Some(b),
            _ => Some(k),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples a piecewise-linear function through `corners` at x = 0, 1, …, last.
    fn piecewise(corners: &[(f64, f64)]) -> Vec<(f64, f64)> {
        let last = corners.last().unwrap().0 as usize;
        (0..=last)
            .map(|x| {
                let x = x as f64;
                let i = corners
                    .partition_point(|c| c.0 <= x)
                    .clamp(1, corners.len() - 1);
                let (a, b) = (corners[i - 1], corners[i]);
                (x, a.1 + (b.1 - a.1) * (x - a.0) / (b.0 - a.0))
            })
            .collect()
    }

    #[test]
    fn one_knee_concave() {
        let pts = piecewise(&[(0.0, 0.0), (20.0, 0.8), (100.0, 1.0)]);
        let k = kneedle(&pts, CurveShape::ConcaveIncreasing, 1.0);
        assert_eq!(k.len(), 1, "{k:?}");
        assert_eq!(k[0].index, 20);
        assert_eq!(k[0].x, 20.0);
    }

    #[test]
    fn one_knee_decreasing_miss_ratio_form() {
        let pts: Vec<_> = piecewise(&[(0.0, 0.0), (20.0, 0.8), (100.0, 1.0)])
            .into_iter()
            .map(|(x, y)| (x, 1.0 - y))
            .collect();
        let k = kneedle(&pts, CurveShape::ConvexDecreasing, 1.0);
        assert_eq!(k.iter().map(|k| k.index).collect::<Vec<_>>(), vec![20]);
        // The same points read as concave increasing have no knee.
        assert!(kneedle(&pts, CurveShape::ConcaveIncreasing, 1.0).is_empty());
    }

    #[test]
    fn two_knees() {
        let pts = piecewise(&[
            (0.0, 0.0),
            (10.0, 0.4),
            (40.0, 0.5),
            (50.0, 0.9),
            (100.0, 1.0),
        ]);
        let k = kneedle(&pts, CurveShape::ConcaveIncreasing, 1.0);
        assert_eq!(k.iter().map(|k| k.x).collect::<Vec<_>>(), vec![10.0, 50.0]);
        assert_eq!(most_prominent(&k).unwrap().x, 50.0);
    }

    #[test]
    fn flat_and_straight_lines_have_no_knee() {
        let flat: Vec<_> = (0..50).map(|x| (x as f64, 0.3)).collect();
        assert!(kneedle(&flat, CurveShape::ConcaveIncreasing, 1.0).is_empty());
        assert!(kneedle(&flat, CurveShape::ConvexDecreasing, 1.0).is_empty());
        let line: Vec<_> = (0..50).map(|x| (x as f64, 2.0 * x as f64 + 1.0)).collect();
        assert!(kneedle(&line, CurveShape::ConcaveIncreasing, 1.0).is_empty());
    }

    #[test]
    fn sensitivity_suppresses_a_shallow_knee() {
        // A bump whose difference curve falls by only 0.02 before rising again.
        let pts = piecewise(&[
            (0.0, 0.0),
            (10.0, 0.2),
            (14.0, 0.22),
            (20.0, 0.3),
            (100.0, 1.0),
        ]);
        let low = kneedle(&pts, CurveShape::ConcaveIncreasing, 1.0);
        assert!(low.iter().any(|k| k.index == 10), "{low:?}");
        let high = kneedle(&pts, CurveShape::ConcaveIncreasing, 5.0);
        assert!(!high.iter().any(|k| k.index == 10), "{high:?}");
    }
}
