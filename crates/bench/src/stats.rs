//! Measuring a run: per-op latency into a histogram, process CPU time, and
//! the summary every Nacre benchmark reports.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct LatencyUs {
    pub avg: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// What one test measured.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
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
}
