//! Latency statistics: one sample set ([`Samples`]) and one exact quantile (linear
//! interpolation between ranks, NumPy's default) behind every figure we print — load
//! reports, pool simulations, profiles, benches and the dashboard's history.
//! A sample set is either unbounded or a reservoir: a uniform random sample of at most
//! `capacity` of the values pushed (Algorithm R, seeded), for streams that must not grow
//! without limit. A reservoir counts every value it sees, so its quantiles stay unbiased
//! and its cap is never silent: [`Samples::seen`] against [`Samples::len`].

use crate::rng::SplitMix64;

/// The `q`-quantile (0..=1) of sorted values, interpolating linearly between ranks
/// (NumPy's default), so p50 of an even count is the middle pair's mean; `None` when
/// empty. The one quantile rule: [`Samples`] reads through it.
pub fn quantile_of_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = q.clamp(0.0, 1.0) * last as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Samples of one measure (seconds, milliseconds, tokens/s: the caller's unit).
///
/// Reads take `&mut self` because the first read sorts the kept values in place; later
/// reads are cheap until the next push. Every read sees the sorted values, so a mean
/// does not depend on whether a quantile was read first.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<f64>,
    sorted: bool,
    seen: u64,
    reservoir: Option<Reservoir>,
}

/// Algorithm R's state: the cap and the draws that pick which value a new one replaces.
#[derive(Debug, Clone)]
struct Reservoir {
    capacity: usize,
    rng: SplitMix64,
}

impl Samples {
    /// An unbounded sample set: every value is kept.
    pub fn new() -> Self {
        Samples::default()
    }

    /// A reservoir that keeps a uniform random sample of at most `capacity` values
    /// (deterministic for a given `seed`) and counts every value pushed.
    pub fn reservoir(capacity: usize, seed: u64) -> Self {
        Samples { reservoir: Some(Reservoir { capacity, rng: SplitMix64(seed) }), ..Samples::default() }
    }

    pub fn push(&mut self, value: f64) {
        self.seen += 1;
        match &mut self.reservoir {
            Some(r) if self.values.len() >= r.capacity => {
                // Algorithm R: the n-th value replaces a kept one with probability
                // capacity / n, so every value seen is kept with the same probability.
                // Kept values are exchangeable, so sorting them in place is harmless.
                let slot = r.rng.below(self.seen) as usize;
                if slot < r.capacity {
                    self.values[slot] = value;
                    self.sorted = false;
                }
            }
            _ => {
                self.values.push(value);
                self.sorted = false;
            }
        }
    }

    /// Values kept (for a reservoir, at most its capacity).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Values pushed since creation or the last [`Samples::take`], kept or not.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The kept values and the count seen, leaving this set empty with the same mode
    /// (a reservoir keeps its capacity and carries on with its draws).
    pub fn take(&mut self) -> Samples {
        let fresh = Samples { reservoir: self.reservoir.clone(), ..Samples::default() };
        std::mem::replace(self, fresh)
    }

    pub fn mean(&mut self) -> Option<f64> {
        let sorted = self.sorted();
        (!sorted.is_empty()).then(|| sorted.iter().sum::<f64>() / sorted.len() as f64)
    }

    pub fn min(&mut self) -> Option<f64> {
        self.sorted().first().copied()
    }

    pub fn max(&mut self) -> Option<f64> {
        self.sorted().last().copied()
    }

    /// The exact `q`-quantile (0..=1) of the kept values, see [`quantile_of_sorted`].
    pub fn quantile(&mut self, q: f64) -> Option<f64> {
        quantile_of_sorted(self.sorted(), q)
    }

    /// The 0.5-quantile: the middle pair's mean for an even count.
    pub fn median(&mut self) -> Option<f64> {
        self.quantile(0.5)
    }

    fn sorted(&mut self) -> &[f64] {
        if !self.sorted {
            self.values.sort_by(f64::total_cmp);
            self.sorted = true;
        }
        &self.values
    }
}

impl Extend<f64> for Samples {
    fn extend<I: IntoIterator<Item = f64>>(&mut self, values: I) {
        values.into_iter().for_each(|v| self.push(v));
    }
}

impl FromIterator<f64> for Samples {
    fn from_iter<I: IntoIterator<Item = f64>>(values: I) -> Self {
        let mut samples = Samples::new();
        samples.extend(values);
        samples
    }
}

impl From<Vec<f64>> for Samples {
    fn from(values: Vec<f64>) -> Self {
        Samples { seen: values.len() as u64, values, sorted: false, reservoir: None }
    }
}

/// Times kept as `f32` seconds.
impl From<Vec<f32>> for Samples {
    fn from(values: Vec<f32>) -> Self {
        values.into_iter().map(f64::from).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let mut s: Samples = (1..=10).rev().map(f64::from).collect();
        assert_eq!(s.median(), Some(5.5));
        assert!((s.quantile(0.9).unwrap() - 9.1).abs() < 1e-12);
        assert!((s.quantile(0.99).unwrap() - 9.91).abs() < 1e-12);
        assert_eq!((s.quantile(0.0), s.quantile(1.0)), (Some(1.0), Some(10.0)));
        assert_eq!((s.quantile(-1.0), s.quantile(2.0)), (Some(1.0), Some(10.0)));
        assert_eq!(Samples::from(vec![4.0]).quantile(0.99), Some(4.0));
        assert_eq!(Samples::from(vec![3.0, 1.0, 2.0]).median(), Some(2.0));
    }

    #[test]
    fn an_empty_set_has_no_figures() {
        let mut s = Samples::new();
        assert_eq!((s.mean(), s.min(), s.max(), s.median()), (None, None, None, None));
        assert_eq!((s.len(), s.seen(), s.is_empty()), (0, 0, true));
    }

    #[test]
    fn reads_after_a_push_see_the_new_value() {
        let mut s = Samples::from(vec![2.0, 1.0]);
        assert_eq!((s.min(), s.max(), s.mean()), (Some(1.0), Some(2.0), Some(1.5)));
        s.push(0.0);
        s.extend([6.0]);
        assert_eq!((s.min(), s.max(), s.mean(), s.median()), (Some(0.0), Some(6.0), Some(2.25), Some(1.5)));
        assert_eq!(Samples::from(vec![0.25f32, 0.5]).max(), Some(0.5));
    }

    fn uniform_stream(count: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64(seed);
        (0..count).map(|_| rng.open_unit()).collect()
    }

    #[test]
    fn a_reservoir_keeps_its_capacity_and_its_quantiles_match_the_exact_ones() {
        let values = uniform_stream(100_000, 3);
        let mut exact = Samples::from(values.clone());
        let mut reservoir = Samples::reservoir(1_000, 11);
        reservoir.extend(values);
        assert_eq!((reservoir.len(), reservoir.seen()), (1_000, 100_000));
        for (q, tolerance) in [(0.5, 0.04), (0.9, 0.025)] {
            let (kept, all) = (reservoir.quantile(q).unwrap(), exact.quantile(q).unwrap());
            assert!((kept - all).abs() < tolerance, "q {q}: reservoir {kept}, exact {all}");
        }
    }

    #[test]
    fn a_reservoir_over_a_rising_stream_keeps_the_whole_stream_not_its_start() {
        // Latencies that grow under load: keeping the first 1,000 would report a median of
        // 499.5 against a true 49,999.5.
        let mut reservoir = Samples::reservoir(1_000, 5);
        reservoir.extend((0..100_000).map(f64::from));
        let median = reservoir.median().unwrap();
        assert!((median - 49_999.5).abs() < 5_000.0, "median {median}");
        let mut first: Samples = (0..1_000).map(f64::from).collect();
        assert!((first.median().unwrap() - 49_999.5).abs() > 40_000.0);
    }

    #[test]
    fn a_reservoir_is_deterministic_for_its_seed() {
        let run = |seed| {
            let mut r = Samples::reservoir(10, seed);
            r.extend((0..1_000).map(f64::from));
            (r.median(), r.mean())
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn take_hands_over_the_window_and_the_reservoir_carries_on() {
        let mut r = Samples::reservoir(100, 9);
        r.extend((0..250).map(f64::from));
        let mut window = r.take();
        assert_eq!((window.len(), window.seen(), window.max().is_some()), (100, 250, true));
        assert_eq!((r.len(), r.seen()), (0, 0));
        r.extend((0..150).map(f64::from));
        assert_eq!((r.len(), r.seen()), (100, 150));
        let mut unbounded = Samples::new();
        unbounded.extend((0..150).map(f64::from));
        assert_eq!((unbounded.take().len(), unbounded.len()), (150, 0));
    }
}
