//! The staleness/performance trade-off of the write-policy paper, §5.4:
//! `w* = argmax_w (Revenue(w) − DataLossPenalty(w))`.
//!
//! * Revenue is linear in throughput: `revenue(w) = dollars_per_iops ×
//!   throughput(w)` ("a fixed $ revenue generated per transaction per second").
//! * The data-loss penalty is exponential in staleness and weighted by the
//!   probability of a failure that loses the host: `penalty(w) = p_fail ×
//!   base × (exp(staleness(w) / scale) − 1)` ("an exponential function of the
//!   data staleness ... [accounting] for probability of system crashes").
//!
//! The paper says its functions' exact shapes are "assumed rather
//! arbitrarily"; so are ours, and they are parameters. What comes from the
//! simulation is `throughput(w)` and `staleness(w)` for each journal size `w`.

use serde::Serialize;

/// Parameters of the revenue and penalty functions.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CostModel {
    /// Revenue per (request per second).
    pub dollars_per_iops: f64,
    /// Probability of a failure that loses the cache, over the accounting period.
    pub p_fail: f64,
    /// Penalty scale in dollars.
    pub base: f64,
    /// Staleness (bytes) at which the penalty grows by a factor e.
    pub scale_bytes: f64,
}

/// One point of the trade-off.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct TradeoffPoint {
    /// The knob (journal size, bytes).
    pub w: f64,
    /// Measured throughput (requests/s).
    pub throughput: f64,
    /// Measured staleness (bytes).
    pub staleness_bytes: f64,
    /// Revenue.
    pub revenue: f64,
    /// Penalty.
    pub penalty: f64,
    /// Revenue − penalty.
    pub profit: f64,
}

impl CostModel {
    /// Revenue of a throughput.
    pub fn revenue(&self, throughput: f64) -> f64 {
        self.dollars_per_iops * throughput
    }
    /// Penalty of a staleness.
    pub fn penalty(&self, staleness_bytes: f64) -> f64 {
        self.p_fail * self.base * ((staleness_bytes / self.scale_bytes).exp() - 1.0)
    }
    /// Evaluates the model at measured `(w, throughput, staleness)` points and
    /// returns them with the index of the best (`None` if `points` is empty).
    pub fn evaluate(&self, points: &[(f64, f64, f64)]) -> (Vec<TradeoffPoint>, Option<usize>) {
        let pts: Vec<TradeoffPoint> = points
            .iter()
            .map(|&(w, t, s)| {
                let revenue = self.revenue(t);
                let penalty = self.penalty(s);
                TradeoffPoint {
                    w,
                    throughput: t,
                    staleness_bytes: s,
                    revenue,
                    penalty,
                    profit: revenue - penalty,
                }
            })
            .collect();
        let best = pts
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.profit.total_cmp(&b.1.profit))
            .map(|(i, _)| i);
        (pts, best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_balances_revenue_and_penalty() {
        let m = CostModel {
            dollars_per_iops: 1.0,
            p_fail: 1.0,
            base: 1.0,
            scale_bytes: 100.0,
        };
        // Throughput saturates while the penalty keeps growing.
        let pts = [
            (1.0, 10.0, 0.0),
            (2.0, 50.0, 100.0),
            (3.0, 60.0, 300.0),
            (4.0, 61.0, 500.0),
        ];
        let (out, best) = m.evaluate(&pts);
        assert_eq!(best, Some(1));
        assert!((out[1].penalty - (1f64.exp() - 1.0)).abs() < 1e-12);
        assert!((out[1].profit - (50.0 - (1f64.exp() - 1.0))).abs() < 1e-12);
        assert_eq!(m.evaluate(&[]).1, None);
    }
}
