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

use nacre_io::{rt, AlignedBuf, BlockDev, FileDev};
use serde::{Deserialize, Serialize};

use crate::load::{mix, run_for_series};
use crate::stats::{Sample, Summary};

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
    /// Tests the progress line counts: the suite's six, and any the
    /// caller runs after them with [`measure`].
    pub steps: usize,
    /// Bytes of the target the tests use (from its start).
    pub area_bytes: u64,
    pub progress: bool,
    /// CPU time of other processes doing the work (the cluster), added to
    /// each test's CPU per op.
    pub extra_cpu: Option<Rc<dyn Fn() -> Duration>>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SuiteResult {
    pub name: String,
    #[serde(flatten)]
    pub summary: Summary,
    /// The run cut into intervals (absent in results of older versions).
    #[serde(default)]
    pub series: Vec<Sample>,
}

/// A window of a local file or device with O_DIRECT, from `start` for
/// `len` bytes; durable writes are followed by fdatasync.
pub struct FileTarget {
    pub dev: Rc<FileDev>,
    pub start: u64,
    pub len: u64,
}

impl FileTarget {
    /// The whole of `dev`.
    pub fn whole(dev: Rc<FileDev>) -> FileTarget {
        let len = dev.size_bytes();
        FileTarget { dev, start: 0, len }
    }
}

impl BlockTarget for FileTarget {
    fn size_bytes(&self) -> u64 {
        self.len
    }
    fn read(&self, offset: u64, len: u32) -> BoxFut<()> {
        let (d, at) = (self.dev.clone(), self.start + offset);
        assert!(
            offset + u64::from(len) <= self.len,
            "a read past the window"
        );
        Box::pin(async move {
            Ok(d.read_at(AlignedBuf::new(len as usize), at)
                .await
                .map(drop)?)
        })
    }
    fn write(&self, offset: u64, data: AlignedBuf, durable: bool) -> BoxFut<()> {
        let (d, at) = (self.dev.clone(), self.start + offset);
        assert!(
            offset + data.len() as u64 <= self.len,
            "a write past the window"
        );
        Box::pin(async move {
            d.write_at(data, at).await?;
            if durable {
                d.sync().await?;
            }
            Ok(())
        })
    }
}

pub fn stamp(buf: &mut AlignedBuf, n: u64) {
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
    let mut out = Vec::new();
    let mut step = 0;
    let highest = Rc::new(Cell::new(0u64));
    macro_rules! test {
        ($name:expr, $qd:expr, $op:expr) => {{
            step += 1;
            out.push(measure($name, step, $qd, o, $op).await?);
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

/// Runs test `name` (step `step` of `o.steps`) from `qd` workers for
/// `o.runtime`, with its progress line, CPU per op (the cluster's too,
/// where `o.extra_cpu` counts it) and time series.
pub async fn measure<Op, Fut>(
    name: &str,
    step: usize,
    qd: usize,
    o: &SuiteOpts,
    op: Op,
) -> anyhow::Result<SuiteResult>
where
    Op: Fn(u64) -> Fut + 'static,
    Fut: Future<Output = anyhow::Result<u64>> + 'static,
{
    let tty = o.progress && std::io::stderr().is_terminal();
    let total = o.steps;
    if o.progress && !tty {
        eprintln!("nacre bench: [{step}/{total}] {name}");
    }
    let t0 = Instant::now();
    let ticker = if tty {
        let (label, runtime) = (name.to_string(), o.runtime);
        Some(rt::spawn(async move {
            loop {
                progress_line(&label, step, total, t0, runtime);
                rt::sleep(Duration::from_millis(250)).await;
            }
        }))
    } else {
        None
    };
    let ext0 = o.extra_cpu.as_ref().map(|f| f());
    let (mut s, series) = run_for_series(qd, o.runtime, op).await?;
    if let (Some(f), Some(c0)) = (o.extra_cpu.as_ref(), ext0) {
        let extra = f().saturating_sub(c0);
        if s.ops > 0 {
            s.cpu_us_per_op += extra.as_secs_f64() * 1e6 / s.ops as f64;
        }
    }
    drop(ticker);
    if tty {
        progress_line(name, step, total, t0, o.runtime);
        eprintln!();
    }
    Ok(SuiteResult {
        name: name.to_string(),
        summary: s,
        series,
    })
}

/// Writes the linear slots `from..slots` so that reads find data.
pub(crate) async fn fill(
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
        "{:<24} {:<8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}",
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
                "{:<24} {:<8} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>9.1}",
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

/// Results saved by `nacre bench --format json` (an object of columns,
/// each a list of tests): the column named `prefer`, else the first.
pub fn load_results(text: &str, prefer: &str) -> anyhow::Result<(String, Vec<SuiteResult>)> {
    let cols: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)
        .map_err(|e| anyhow::anyhow!("not the JSON of `nacre bench --format json`: {e}"))?;
    let (name, v) = cols
        .get_key_value(prefer)
        .or_else(|| cols.iter().next())
        .ok_or_else(|| anyhow::anyhow!("no results in it"))?;
    let results: Vec<SuiteResult> = serde_json::from_value(v.clone())
        .map_err(|e| anyhow::anyhow!("column {name:?} is not a list of test results: {e}"))?;
    Ok((name.clone(), results))
}

/// The new results beside the old: per test, each figure and new ÷ old
/// (IOPS above 1: faster; latency below 1: faster).
pub fn compare_table(new: &[SuiteResult], old: &[SuiteResult]) -> String {
    let mut out = format!(
        "{:<20} {:>10} {:>10} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>7}\n",
        "test", "IOPS", "old", "÷ old", "avg µs", "old", "÷ old", "p99 µs", "old", "÷ old"
    );
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}×", a / b)
        } else {
            "–".into()
        }
    };
    for r in new {
        let s = &r.summary;
        match old.iter().find(|o| o.name == r.name) {
            Some(o) => {
                let t = &o.summary;
                out.push_str(&format!(
                    "{:<20} {:>10.0} {:>10.0} {:>7} {:>9.1} {:>9.1} {:>7} {:>9.1} {:>9.1} {:>7}\n",
                    r.name,
                    s.iops,
                    t.iops,
                    ratio(s.iops, t.iops),
                    s.lat_us.avg,
                    t.lat_us.avg,
                    ratio(s.lat_us.avg, t.lat_us.avg),
                    s.lat_us.p99,
                    t.lat_us.p99,
                    ratio(s.lat_us.p99, t.lat_us.p99),
                ));
            }
            None => out.push_str(&format!(
                "{:<20} {:>10.0} {:>10} {:>7} {:>9.1} {:>9} {:>7} {:>9.1} {:>9} {:>7}\n",
                r.name, s.iops, "–", "", s.lat_us.avg, "–", "", s.lat_us.p99, "–", ""
            )),
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
            series: Vec::new(),
        }
    }

    /// Saved results load back (the column asked for, else the first),
    /// and compare test by test.
    #[test]
    fn saved_results_load_and_compare() {
        let old = [
            result("write-4m-qd16", 100.0),
            result("randread-4k-qd1", 2000.0),
        ];
        let new = [
            result("write-4m-qd16", 150.0),
            result("randwrite-4k-qd1", 10.0),
        ];
        let json = serde_json::json!({ "nbd": old, "nacre": new }).to_string();
        let (col, back) = load_results(&json, "nacre").unwrap();
        assert_eq!((col.as_str(), back.len()), ("nacre", 2));
        let (col, back) = load_results(&json, "absent").unwrap();
        assert!(col == "nbd" || col == "nacre");
        assert!(!back.is_empty());
        assert!(load_results("[1, 2]", "nacre").is_err());
        assert!(load_results("{\"nacre\": [{\"x\": 1}]}", "nacre").is_err());
        let t = compare_table(&new, &old);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[1].starts_with("write-4m-qd16") && lines[1].contains("1.50×"),
            "{t}"
        );
        assert!(
            lines[2].starts_with("randwrite-4k-qd1") && lines[2].contains('–'),
            "{t}"
        );
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
