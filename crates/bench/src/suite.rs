//! `nacre bench`: the standard suite (LESSONS.md) against any block
//! target — a volume through the client library, any NBD export, or a
//! local file for comparison.
//!
//! Order: 4 MiB linear write (QD16), then a fill of whatever of the test
//! area it did not reach (reads of never-written blocks would measure
//! zeros), 4 KiB random writes at QD128 and at QD1 (each durable before the
//! next), 4 KiB random reads at QD128 and QD1, 4 MiB linear read (QD16).

use std::cell::Cell;
use std::future::Future;
use std::io::IsTerminal;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nacre_io::{rt, AlignedBuf};
use serde::Serialize;

use crate::load::{mix, run_for};
use crate::stats::Summary;

pub type BoxFut<T> = Pin<Box<dyn Future<Output = anyhow::Result<T>>>>;

/// Something with blocks to read and write.
pub trait BlockTarget {
    fn size_bytes(&self) -> u64;
    fn read(&self, offset: u64, len: u32) -> BoxFut<()>;
    /// Writes; with `durable` the write is on stable storage when it
    /// completes (FUA, fsync, or the target's own guarantee).
    fn write(&self, offset: u64, data: AlignedBuf, durable: bool) -> BoxFut<()>;
}

const LINEAR_BYTES: u64 = 4 << 20;
const SMALL_BYTES: u64 = 4096;
const FILL_QD: usize = 16;

#[derive(Clone)]
pub struct SuiteOpts {
    pub runtime: Duration,
    /// Bytes of the target the tests use (from its start).
    pub area_bytes: u64,
    pub progress: bool,
    /// CPU time of other processes doing the work (the cluster), added to
    /// each test's CPU per op.
    pub extra_cpu: Option<Rc<dyn Fn() -> Duration>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SuiteResult {
    pub name: String,
    #[serde(flatten)]
    pub summary: Summary,
}

fn stamp(buf: &mut AlignedBuf, n: u64) {
    for chunk in buf.chunks_mut(SMALL_BYTES as usize) {
        chunk[..8].copy_from_slice(&n.to_le_bytes());
        chunk[8..16].copy_from_slice(&mix(7, n).to_le_bytes());
    }
}

fn progress_line(name: &str, step: usize, total: usize, t0: Instant, runtime: Duration) {
    let frac = (t0.elapsed().as_secs_f64() / runtime.as_secs_f64()).min(1.0);
    let width = 30;
    let done = (frac * width as f64) as usize;
    eprint!(
        "\r[{step}/{total}] {name:<20} ▕{}{}▏ {:>4.0}s/{:.0}s ",
        "█".repeat(done),
        " ".repeat(width - done),
        t0.elapsed().as_secs_f64().min(runtime.as_secs_f64()),
        runtime.as_secs_f64()
    );
}

/// Runs the six tests; returns them in the order they ran.
pub async fn run(t: Rc<dyn BlockTarget>, o: &SuiteOpts) -> anyhow::Result<Vec<SuiteResult>> {
    let area = o.area_bytes.min(t.size_bytes()) / LINEAR_BYTES * LINEAR_BYTES;
    anyhow::ensure!(
        area >= LINEAR_BYTES,
        "the target needs at least 4 MiB (has {} bytes)",
        t.size_bytes()
    );
    let linear_slots = area / LINEAR_BYTES;
    let small_slots = area / SMALL_BYTES;
    let tty = o.progress && std::io::stderr().is_terminal();
    let total = 6;
    let mut out = Vec::new();
    let mut step = 0;
    let highest = Rc::new(Cell::new(0u64));
    macro_rules! test {
        ($name:expr, $qd:expr, $op:expr) => {{
            step += 1;
            if o.progress && !tty {
                eprintln!("nacre bench: [{step}/{total}] {}", $name);
            }
            let t0 = Instant::now();
            let ticker = if tty {
                let (name, runtime, st) = ($name, o.runtime, step);
                Some(rt::spawn(async move {
                    loop {
                        progress_line(name, st, total, t0, runtime);
                        rt::sleep(Duration::from_millis(250)).await;
                    }
                }))
            } else {
                None
            };
            let ext0 = o.extra_cpu.as_ref().map(|f| f());
            let mut s = run_for($qd, o.runtime, $op).await?;
            if let (Some(f), Some(c0)) = (o.extra_cpu.as_ref(), ext0) {
                let extra = f().saturating_sub(c0);
                if s.ops > 0 {
                    s.cpu_us_per_op += extra.as_secs_f64() * 1e6 / s.ops as f64;
                }
            }
            drop(ticker);
            if tty {
                progress_line($name, step, total, t0, o.runtime);
                eprintln!();
            }
            out.push(SuiteResult {
                name: $name.to_string(),
                summary: s,
            });
        }};
    }
    {
        let (t, hi) = (t.clone(), highest.clone());
        test!("write-4m-qd16", 16, move |n| {
            let t = t.clone();
            let slot = n % linear_slots;
            hi.set(hi.get().max(slot + 1));
            async move {
                let mut b = AlignedBuf::new(LINEAR_BYTES as usize);
                stamp(&mut b, n);
                t.write(slot * LINEAR_BYTES, b, false).await?;
                Ok(LINEAR_BYTES)
            }
        });
    }
    fill(&t, highest.get(), linear_slots, o.progress).await?;
    {
        let t2 = t.clone();
        test!("randwrite-4k-qd128", 128, move |n| {
            let t = t2.clone();
            async move {
                let mut b = AlignedBuf::new(SMALL_BYTES as usize);
                stamp(&mut b, n);
                t.write(mix(1, n) % small_slots * SMALL_BYTES, b, false)
                    .await?;
                Ok(SMALL_BYTES)
            }
        });
    }
    {
        let t2 = t.clone();
        test!("randwrite-4k-qd1", 1, move |n| {
            let t = t2.clone();
            async move {
                let mut b = AlignedBuf::new(SMALL_BYTES as usize);
                stamp(&mut b, n);
                t.write(mix(2, n) % small_slots * SMALL_BYTES, b, true)
                    .await?;
                Ok(SMALL_BYTES)
            }
        });
    }
    for (name, qd, stream) in [
        ("randread-4k-qd128", 128usize, 3u64),
        ("randread-4k-qd1", 1, 4),
    ] {
        let t2 = t.clone();
        test!(name, qd, move |n| {
            let t = t2.clone();
            async move {
                t.read(
                    mix(stream, n) % small_slots * SMALL_BYTES,
                    SMALL_BYTES as u32,
                )
                .await?;
                Ok(SMALL_BYTES)
            }
        });
    }
    {
        let t2 = t.clone();
        test!("read-4m-qd16", 16, move |n| {
            let t = t2.clone();
            async move {
                t.read(n % linear_slots * LINEAR_BYTES, LINEAR_BYTES as u32)
                    .await?;
                Ok(LINEAR_BYTES)
            }
        });
    }
    Ok(out)
}

/// Writes the linear slots `from..slots` so that reads find data.
async fn fill(
    t: &Rc<dyn BlockTarget>,
    from: u64,
    slots: u64,
    progress: bool,
) -> anyhow::Result<()> {
    if from >= slots {
        return Ok(());
    }
    if progress {
        eprintln!(
            "nacre bench: filling {} MiB before the read tests",
            (slots - from) * 4
        );
    }
    let next = Rc::new(Cell::new(from));
    let workers: Vec<_> = (0..FILL_QD)
        .map(|_| {
            let (t, next) = (t.clone(), next.clone());
            rt::spawn(async move {
                loop {
                    let slot = next.get();
                    if slot >= slots {
                        return Ok::<(), anyhow::Error>(());
                    }
                    next.set(slot + 1);
                    let mut b = AlignedBuf::new(LINEAR_BYTES as usize);
                    stamp(&mut b, slot);
                    t.write(slot * LINEAR_BYTES, b, false).await?;
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    Ok(())
}

/// Side-by-side table: one row per test and target, in the order the
/// tests ran. With two targets or more, the last is the baseline and every
/// other row says how it compares in operations per second (`÷ local`: above
/// 1 it did more than the baseline).
pub fn table(columns: &[(&str, &[SuiteResult])]) -> String {
    let base = match columns {
        [_, .., last] => Some(*last),
        _ => None,
    };
    let mut out = format!(
        "{:<20} {:<8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "test",
        "target",
        "IOPS",
        "MiB/s",
        "avg µs",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "CPU µs/op"
    );
    if let Some((b, _)) = base {
        out.push_str(&format!(" {:>9}", format!("÷ {b}")));
    }
    out.push('\n');
    let Some((_, first)) = columns.first() else {
        return out;
    };
    for (i, r) in first.iter().enumerate() {
        let base_iops = base.and_then(|(_, rs)| rs.get(i)).map(|x| x.summary.iops);
        for (k, (who, rs)) in columns.iter().enumerate() {
            let Some(s) = rs.get(i).map(|x| &x.summary) else {
                continue;
            };
            out.push_str(&format!(
                "{:<20} {:<8} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>9.1}",
                if k == 0 { r.name.as_str() } else { "" },
                who,
                s.iops,
                s.mib_s,
                s.lat_us.avg,
                s.lat_us.p50,
                s.lat_us.p99,
                s.lat_us.p999,
                s.lat_us.max,
                s.cpu_us_per_op
            ));
            match base_iops {
                Some(b) if k + 1 < columns.len() && b > 0.0 => {
                    out.push_str(&format!(" {:>8.2}×", s.iops / b));
                }
                _ => {}
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &str, iops: f64) -> SuiteResult {
        SuiteResult {
            name: name.into(),
            summary: crate::stats::Summary {
                iops,
                ..Default::default()
            },
        }
    }

    /// Rows keep the order the tests ran; the last target is the baseline
    /// and the others carry their IOPS ratio to it.
    #[test]
    fn the_table_keeps_the_run_order_and_compares_with_the_last_target() {
        let nacre = [
            result("write-4m-qd16", 100.0),
            result("randread-4k-qd1", 3000.0),
        ];
        let local = [
            result("write-4m-qd16", 400.0),
            result("randread-4k-qd1", 6000.0),
        ];
        let t = table(&[("nacre", &nacre), ("local", &local)]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].ends_with("÷ local"), "{}", lines[0]);
        assert!(
            lines[1].starts_with("write-4m-qd16") && lines[1].ends_with("0.25×"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].contains("local") && !lines[2].contains('×'),
            "{}",
            lines[2]
        );
        assert!(
            lines[3].starts_with("randread-4k-qd1") && lines[3].ends_with("0.50×"),
            "{}",
            lines[3]
        );
        let alone = table(&[("nacre", &nacre)]);
        assert!(!alone.contains('÷') && !alone.contains('×'), "{alone}");
    }
}
