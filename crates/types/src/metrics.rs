//! Latency histograms the daemons keep for their metrics (`nacre up
//! --metrics`): cumulative since the daemon started, cheap to record from
//! the thread that serves the op (a few relaxed atomic adds) and read from
//! the thread that answers a scrape.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// Finite buckets of a [`Histogram`]: bucket `i` counts ops of at most
/// `8 << i` µs (8 µs … about 8.4 s); one more counts the slower ones.
pub const LATENCY_BUCKETS: usize = 21;

/// The upper bound of finite bucket `i`, in µs.
pub const fn bucket_bound_us(i: usize) -> u64 {
    8 << i
}

/// The bucket of an op that took `us` µs (`LATENCY_BUCKETS`: slower than
/// every bound).
pub fn bucket_of(us: u64) -> usize {
    if us <= 8 {
        return 0;
    }
    // ceil(log2(us)) - 3: the first bound at or above `us`.
    let ceil_log2 = 64 - (us - 1).leading_zeros() as usize;
    (ceil_log2 - 3).min(LATENCY_BUCKETS)
}

/// Op latencies since the start: a count per bucket and the sum.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn record(&self, us: u64) {
        self.counts[bucket_of(us)].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut counts: Vec<u64> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        while counts.last() == Some(&0) {
            counts.pop();
        }
        HistogramSnapshot {
            counts,
            sum_us: self.sum_us.load(Relaxed),
        }
    }
}

/// A [`Histogram`] read at one moment (what crosses the wire): the count
/// of each bucket, not cumulative, the empty ones at the end left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    pub counts: Vec<u64>,
    pub sum_us: u64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Each finite bucket's upper bound in seconds with its count (not
    /// cumulative), then `+Inf` with the slower ones: every bucket, so a
    /// scraper sees the same set each time.
    pub fn buckets_seconds(&self) -> Vec<(f64, u64)> {
        (0..=LATENCY_BUCKETS)
            .map(|i| {
                let bound = match i {
                    LATENCY_BUCKETS => f64::INFINITY,
                    _ => bucket_bound_us(i) as f64 / 1e6,
                };
                (bound, self.counts.get(i).copied().unwrap_or(0))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_latency_lands_in_the_first_bucket_that_bounds_it() {
        for us in [
            0,
            1,
            8,
            9,
            15,
            16,
            17,
            100,
            1000,
            8 << 20,
            (8 << 20) + 1,
            u64::MAX,
        ] {
            let b = bucket_of(us);
            if b < LATENCY_BUCKETS {
                assert!(us <= bucket_bound_us(b), "{us} µs in bucket {b}");
            }
            if b > 0 {
                assert!(us > bucket_bound_us(b - 1), "{us} µs in bucket {b}");
            }
        }
        assert_eq!(bucket_of(u64::MAX), LATENCY_BUCKETS);
        let h = Histogram::default();
        for us in [3, 9, 9, 40, 1 << 30] {
            h.record(us);
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 5);
        assert_eq!(s.sum_us, 3 + 9 + 9 + 40 + (1 << 30));
        let b = s.buckets_seconds();
        assert_eq!(b.len(), LATENCY_BUCKETS + 1);
        assert_eq!((b[0].1, b[1].1, b[3].1, b[LATENCY_BUCKETS].1), (1, 2, 1, 1));
        assert_eq!(b[1].0, 16e-6);
    }
}
