//! Measuring a run: per-op latency into a histogram, process CPU time, and
//! the summary every Nacre benchmark reports.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyUs {
    pub avg: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// What one test measured.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub ops: u64,
    pub iops: f64,
    /// Throughput in MiB/s (2^20 bytes), the unit used across the CLI.
    pub mib_s: f64,
    pub lat_us: LatencyUs,
    /// User + system CPU time of the whole process per operation.
    pub cpu_us_per_op: f64,
}

/// Latencies from 100 ns to 100 s with 3 significant digits.
pub struct Recorder {
    hist: Histogram<u64>,
    bytes: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Recorder {
            hist: Histogram::new_with_bounds(100, 100_000_000_000, 3)
                .expect("valid histogram bounds"),
            bytes: 0,
        }
    }

    pub fn record(&mut self, latency: Duration, bytes: u64) {
        let ns = (latency.as_nanos() as u64).clamp(100, 100_000_000_000);
        self.hist.record(ns).expect("value within bounds");
        self.bytes += bytes;
    }

    pub fn summary(&self, elapsed: Duration, cpu: Duration) -> Summary {
        let ops = self.hist.len();
        let secs = elapsed.as_secs_f64().max(1e-9);
        let us = |ns: u64| ns as f64 / 1000.0;
        Summary {
            ops,
            iops: ops as f64 / secs,
            mib_s: self.bytes as f64 / secs / f64::from(1u32 << 20),
            lat_us: LatencyUs {
                avg: self.hist.mean() / 1000.0,
                p50: us(self.hist.value_at_quantile(0.5)),
                p99: us(self.hist.value_at_quantile(0.99)),
                p999: us(self.hist.value_at_quantile(0.999)),
                max: us(self.hist.max()),
            },
            cpu_us_per_op: if ops == 0 {
                0.0
            } else {
                cpu.as_secs_f64() * 1e6 / ops as f64
            },
        }
    }
}

/// One interval of a run: when it ended (seconds from the start), the
/// operations completed in it per second, and their latencies (0 when
/// none completed).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    pub t_s: f64,
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Intervals a run is cut into for its time series, and the shortest.
pub const SERIES_INTERVALS: u32 = 50;
pub const SERIES_TICK_MIN: Duration = Duration::from_millis(100);

/// A run's completions cut into fixed intervals.
pub struct Series {
    tick: Duration,
    hist: Histogram<u64>,
    start: Duration,
    samples: Vec<Sample>,
}

impl Series {
    /// Intervals for a run of `runtime`.
    pub fn new(runtime: Duration) -> Series {
        Series {
            tick: (runtime / SERIES_INTERVALS).max(SERIES_TICK_MIN),
            hist: Histogram::new_with_bounds(100, 100_000_000_000, 2)
                .expect("valid histogram bounds"),
            start: Duration::ZERO,
            samples: Vec::new(),
        }
    }

    /// An operation of `latency` that completed `at` after the start.
    pub fn record(&mut self, at: Duration, latency: Duration) {
        while at >= self.start + self.tick {
            self.flush(self.start + self.tick);
        }
        let ns = (latency.as_nanos() as u64).clamp(100, 100_000_000_000);
        self.hist.record(ns).expect("value within bounds");
    }

    fn flush(&mut self, end: Duration) {
        let secs = (end - self.start).as_secs_f64().max(1e-9);
        let us = |ns: u64| ns as f64 / 1000.0;
        let h = &self.hist;
        let (p50, p99, max) = if h.is_empty() {
            (0.0, 0.0, 0.0)
        } else {
            (
                us(h.value_at_quantile(0.5)),
                us(h.value_at_quantile(0.99)),
                us(h.max()),
            )
        };
        self.samples.push(Sample {
            t_s: end.as_secs_f64(),
            iops: h.len() as f64 / secs,
            p50_us: p50,
            p99_us: p99,
            max_us: max,
        });
        self.hist.reset();
        self.start = end;
    }

    /// The samples of a run that ended `at` after the start: the last
    /// interval as long as it lasted, unless under half a tick (the ops
    /// in flight at the deadline, whose rate over a sliver of time would
    /// mean nothing).
    pub fn finish(mut self, at: Duration) -> Vec<Sample> {
        if !self.hist.is_empty() && at >= self.start + self.tick / 2 {
            self.flush(at);
        }
        self.samples
    }
}

/// User + system CPU time this process has used.
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_from_known_latencies() {
        let mut r = Recorder::new();
        for i in 1..=1000u64 {
            r.record(Duration::from_micros(i), 4096);
        }
        let s = r.summary(Duration::from_secs(2), Duration::from_millis(10));
        assert_eq!(s.ops, 1000);
        assert!((s.iops - 500.0).abs() < 1e-6);
        assert!((s.lat_us.avg - 500.5).abs() < 1.0);
        assert!((s.lat_us.p50 - 500.0).abs() < 1.0);
        assert!((s.lat_us.p99 - 990.0).abs() < 2.0);
        assert!((s.cpu_us_per_op - 10.0).abs() < 1e-6);
        assert!((s.mib_s - 1.953_125).abs() < 1e-9, "4 096 000 bytes in 2 s");
        assert!(process_cpu() > Duration::ZERO);
    }

    #[test]
    fn a_series_cuts_a_run_into_intervals() {
        let mut s = Series::new(Duration::from_secs(5));
        // 100 ms ticks: 10 ops of 1 ms in the first, none in the second,
        // 5 of 2 ms in the third, the run ending half-way through it.
        for i in 0..10 {
            s.record(Duration::from_millis(i * 10), Duration::from_millis(1));
        }
        for i in 0..5 {
            s.record(
                Duration::from_millis(200 + i * 10),
                Duration::from_millis(2),
            );
        }
        let v = s.finish(Duration::from_millis(250));
        assert_eq!(v.len(), 3);
        // A tail under half a tick is left out.
        let mut t = Series::new(Duration::from_secs(5));
        t.record(Duration::from_millis(50), Duration::from_millis(1));
        t.record(Duration::from_millis(101), Duration::from_millis(1));
        assert_eq!(t.finish(Duration::from_millis(102)).len(), 1);
        assert!((v[0].iops - 100.0).abs() < 1e-6 && (v[0].p50_us - 1000.0).abs() < 10.0);
        assert_eq!((v[1].iops, v[1].p50_us), (0.0, 0.0));
        assert!((v[2].t_s - 0.25).abs() < 1e-9 && (v[2].iops - 100.0).abs() < 1e-6);
        assert!((v[2].p99_us - 2000.0).abs() < 20.0);
    }
}
