//! Step latency against batch size, as the profiler or the engine's metrics measure it.

use serde::{Deserialize, Serialize};

/// Points (batch, milliseconds), interpolated linearly between them and extended along
/// the last segment beyond them (a step's cost keeps growing with its rows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyTable {
    points: Vec<(usize, f64)>,
}

impl LatencyTable {
    /// The same latency at every batch size.
    pub fn constant(ms: f64) -> Self {
        LatencyTable { points: vec![(1, ms)] }
    }

    /// Points in any order; a batch given twice keeps its last value. `None` when no
    /// point is usable (batch 0, or a latency that is not positive).
    pub fn from_points(points: impl IntoIterator<Item = (usize, f64)>) -> Option<Self> {
        let mut kept: Vec<(usize, f64)> = Vec::new();
        for (batch, ms) in points {
            if batch == 0 || !(ms > 0.0) || !ms.is_finite() {
                continue;
            }
            kept.retain(|(b, _)| *b != batch);
            kept.push((batch, ms));
        }
        kept.sort_by_key(|(b, _)| *b);
        (!kept.is_empty()).then_some(LatencyTable { points: kept })
    }

    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }

    /// The same table with every latency times `factor` (a visit that takes several steps).
    pub fn scaled(&self, factor: f64) -> Self {
        LatencyTable { points: self.points.iter().map(|&(b, ms)| (b, ms * factor)).collect() }
    }

    /// Milliseconds of one step over `batch` rows.
    pub fn at(&self, batch: usize) -> f64 {
        let x = batch.max(1) as f64;
        let pts = &self.points;
        let (first, last) = (pts[0], pts[pts.len() - 1]);
        if pts.len() == 1 || x <= first.0 as f64 {
            return first.1;
        }
        let segment = pts.windows(2).find(|w| x <= w[1].0 as f64).unwrap_or(&pts[pts.len() - 2..]);
        let ((x0, y0), (x1, y1)) = ((segment[0].0 as f64, segment[0].1), (segment[1].0 as f64, segment[1].1));
        let y = y0 + (y1 - y0) * (x - x0) / (x1 - x0);
        // Extrapolating a falling segment must not reach zero.
        if x > last.0 as f64 {
            y.max(last.1)
        } else {
            y
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_between_points_and_extends_the_last_segment() {
        let table = LatencyTable::from_points([(8, 20.0), (1, 6.0), (16, 30.0)]).unwrap();
        assert_eq!(table.at(0), 6.0);
        assert_eq!(table.at(1), 6.0);
        assert!((table.at(4) - 12.0).abs() < 1e-12);
        assert!((table.at(12) - 25.0).abs() < 1e-12);
        assert!((table.at(24) - 40.0).abs() < 1e-12);
    }

    #[test]
    fn unusable_points_are_dropped() {
        assert!(LatencyTable::from_points([(0, 5.0), (2, -1.0), (3, f64::NAN)]).is_none());
        let table = LatencyTable::from_points([(2, 5.0), (2, 7.0)]).unwrap();
        assert_eq!(table.points(), &[(2, 7.0)]);
        assert_eq!(LatencyTable::constant(3.5).at(40), 3.5);
    }
}
