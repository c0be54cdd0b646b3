//! `nacre osd bench`: each OSD measures its own store (`nacre_osd`'s
//! bench: no replication, no network), one at a time or all at once; the
//! table ranks them by 4 KiB write latency at QD1 and marks those far
//! from the others.

use anyhow::Context;
use nacre_client::Cluster;
use nacre_io::rt;
use nacre_osd::slow::median;
use nacre_osd::{BenchReport, BenchTest, BENCH_BYTES_MAX, BENCH_BYTES_MIN};

use crate::at::At;
use crate::Format;

/// How far from the median of all the benched OSDs a figure must be (this
/// many times worse) for its OSD to be marked.
pub const OUTLIER_FACTOR: f64 = 2.0;
/// Fewest OSDs a median is taken over.
const OUTLIER_OSDS_MIN: usize = 3;

/// The figures compared across OSDs: test, which figure, whether higher
/// is worse, and how people name it.
const COMPARED: [(&str, Figure, bool, &str); 6] = [
    ("randwrite-4k-qd1", Figure::P50, true, "4k write QD1 p50"),
    ("randread-4k-qd1", Figure::P50, true, "4k read QD1 p50"),
    (
        "randwrite-4k-qd32",
        Figure::Iops,
        false,
        "4k write QD32 IOPS",
    ),
    ("randread-4k-qd32", Figure::Iops, false, "4k read QD32 IOPS"),
    ("write-objects", Figure::MbPerS, false, "write MB/s"),
    ("read-objects", Figure::MbPerS, false, "read MB/s"),
];

#[derive(Clone, Copy)]
enum Figure {
    P50,
    Iops,
    MbPerS,
}

/// A figure of `r`'s (none from a bench that stopped short).
fn figure(r: &BenchReport, test: &str, f: Figure) -> Option<f64> {
    if r.error.is_some() {
        return None;
    }
    let t: &BenchTest = r.tests.iter().find(|t| t.name == test)?;
    (t.ops > 0).then_some(match f {
        Figure::P50 => t.lat_p50_us as f64,
        Figure::Iops => t.iops,
        Figure::MbPerS => t.mb_per_s,
    })
}

/// Why each report stands out: every compared figure at least
/// [`OUTLIER_FACTOR`] times worse than the median of all the reports
/// (with at least [`OUTLIER_OSDS_MIN`] of them), said with the ratio.
pub fn outliers(reports: &[&BenchReport]) -> Vec<Vec<String>> {
    let mut why = vec![Vec::new(); reports.len()];
    if reports.len() < OUTLIER_OSDS_MIN {
        return why;
    }
    for (test, f, higher_worse, name) in COMPARED {
        let got: Vec<Option<f64>> = reports.iter().map(|r| figure(r, test, f)).collect();
        let known: Vec<f64> = got.iter().flatten().copied().collect();
        if known.len() < OUTLIER_OSDS_MIN {
            continue;
        }
        let Some(mid) = median(known) else {
            continue;
        };
        for (w, x) in why.iter_mut().zip(&got) {
            let Some(x) = *x else { continue };
            let worse = if higher_worse { x / mid } else { mid / x };
            if mid > 0.0 && worse >= OUTLIER_FACTOR {
                w.push(format!("{name} {worse:.1}× worse than the median"));
            }
        }
    }
    why
}

pub fn run(at: &At, which: &str, size: u64, parallel: bool, format: Format) -> anyhow::Result<()> {
    anyhow::ensure!(
        (BENCH_BYTES_MIN..=BENCH_BYTES_MAX).contains(&size),
        "--size: a bench writes {}..={} MiB per OSD, not {size} bytes",
        BENCH_BYTES_MIN >> 20,
        BENCH_BYTES_MAX >> 20
    );
    let one: Option<u32> = match which {
        "all" => None,
        s => Some(
            s.strip_prefix("osd.")
                .unwrap_or(s)
                .parse()
                .with_context(|| format!("{s:?}: an OSD's number (osd.ID), or all"))?,
        ),
    };
    let rows = measure(at, one, size, parallel, format == Format::Table)?;
    report(&rows, size, parallel, format)
}

/// An OSD benched: its id, its host, its report or why not.
pub type Row = (u32, String, Result<BenchReport, String>);

/// Benches OSD `one`, or every OSD that is up, over `size` bytes each,
/// one at a time or all at once (`progress`: a line on stderr for each).
pub fn measure(
    at: &At,
    one: Option<u32>,
    size: u64,
    parallel: bool,
    progress: bool,
) -> anyhow::Result<Vec<Row>> {
    let meta = at.meta()?;
    rt::block_on(async {
        let c = Cluster::connect(meta)?;
        let m = c.map();
        let osds: Vec<(u32, String)> = match one {
            Some(id) => {
                let o = (m.osds.iter().find(|o| o.id == id))
                    .with_context(|| format!("no osd.{id} in the cluster (`nacre osd ls`)"))?;
                anyhow::ensure!(m.is_up(id), "osd.{id} is down");
                vec![(id, o.host.clone())]
            }
            None => (m.osds.iter())
                .filter(|o| m.is_up(o.id))
                .map(|o| (o.id, o.host.clone()))
                .collect(),
        };
        anyhow::ensure!(!osds.is_empty(), "no OSD is up");
        let bench = |id: u32| {
            let c = c.clone();
            async move {
                let r = c.osd_bench(id, size).await.map_err(|e| e.to_string());
                r.and_then(|v| serde_json::from_value::<BenchReport>(v).map_err(|e| e.to_string()))
            }
        };
        let mut rows = Vec::new();
        if parallel {
            if progress {
                eprintln!(
                    "nacre osd bench: {} OSDs at once, {} MiB each",
                    osds.len(),
                    size >> 20
                );
            }
            let tasks: Vec<_> = osds.iter().map(|&(id, _)| rt::spawn(bench(id))).collect();
            for ((id, host), r) in osds.into_iter().zip(rt::join_all(tasks).await) {
                rows.push((id, host, r));
            }
        } else {
            for (k, (id, host)) in osds.iter().enumerate() {
                if progress {
                    eprintln!(
                        "nacre osd bench: osd.{id} ({} of {}), {} MiB",
                        k + 1,
                        osds.len(),
                        size >> 20
                    );
                }
                rows.push((*id, host.clone(), bench(*id).await));
            }
        }
        Ok(rows)
    })
}

fn report(rows: &[Row], size: u64, parallel: bool, format: Format) -> anyhow::Result<()> {
    let done: Vec<&BenchReport> = rows
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().ok())
        .collect();
    let why = outliers(&done);
    let mut ranked: Vec<(&BenchReport, &Vec<String>, &str)> = (done.iter().zip(&why))
        .map(|(r, w)| {
            let host = (rows.iter())
                .find(|(id, _, _)| *id == r.osd)
                .map_or("", |(_, h, _)| h.as_str());
            (*r, w, host)
        })
        .collect();
    let key = |r: &BenchReport| figure(r, "randwrite-4k-qd1", Figure::P50).unwrap_or(f64::MAX);
    ranked.sort_by(|a, b| key(a.0).total_cmp(&key(b.0)));
    let failed: Vec<(u32, &String)> = (rows.iter())
        .filter_map(|(id, _, r)| r.as_ref().err().map(|e| (*id, e)))
        .collect();
    match format {
        Format::Json => {
            let v = serde_json::json!({
                "size_bytes": size,
                "parallel": parallel,
                "osds": ranked.iter().map(|(r, w, host)| serde_json::json!({
                    "osd": r.osd,
                    "host": host,
                    "report": r,
                    "outlier": w,
                })).collect::<Vec<_>>(),
                "failed": failed.iter().map(|(id, e)| serde_json::json!({"osd": id, "error": e})).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Format::Table => print_table(&ranked, &failed, size, parallel),
    }
    let stopped: Vec<String> = (ranked.iter())
        .filter_map(|(r, _, _)| r.error.as_ref().map(|e| format!("osd.{}: {e}", r.osd)))
        .chain(failed.iter().map(|(id, e)| format!("osd.{id}: {e}")))
        .collect();
    anyhow::ensure!(stopped.is_empty(), "benches failed: {}", stopped.join("; "));
    Ok(())
}

fn print_table(
    ranked: &[(&BenchReport, &Vec<String>, &str)],
    failed: &[(u32, &String)],
    size: u64,
    parallel: bool,
) {
    println!(
        "osd bench: {} MiB per OSD, {}; ranked by 4 KiB write latency at QD1 (durable, as the store acknowledges it)\n",
        size >> 20,
        if parallel { "all at once" } else { "one at a time" }
    );
    println!(
        "{:<8} {:<12} {:>13} {:>12} {:>11} {:>13} {:>12} {:>11} {:>10} {:>10}",
        "osd",
        "host",
        "w QD1 p50 µs",
        "w QD1 p99 µs",
        "w QD32 IOPS",
        "r QD1 p50 µs",
        "r QD1 p99 µs",
        "r QD32 IOPS",
        "write MB/s",
        "read MB/s"
    );
    let t = |r: &BenchReport, name: &str| -> BenchTest {
        (r.tests.iter().find(|t| t.name == name))
            .cloned()
            .unwrap_or_default()
    };
    for (r, why, host) in ranked {
        let (w1, w32, r1, r32, wl, rl) = (
            t(r, "randwrite-4k-qd1"),
            t(r, "randwrite-4k-qd32"),
            t(r, "randread-4k-qd1"),
            t(r, "randread-4k-qd32"),
            t(r, "write-objects"),
            t(r, "read-objects"),
        );
        println!(
            "{:<8} {:<12} {:>13} {:>12} {:>11.0} {:>13} {:>12} {:>11.0} {:>10.0} {:>10.0}{}",
            format!("osd.{}", r.osd),
            host,
            w1.lat_p50_us,
            w1.lat_p99_us,
            w32.iops,
            r1.lat_p50_us,
            r1.lat_p99_us,
            r32.iops,
            wl.mb_per_s,
            rl.mb_per_s,
            if why.is_empty() {
                String::new()
            } else {
                format!("  OUTLIER: {}", why.join(", "))
            }
        );
        if let Some(e) = &r.error {
            println!("         stopped short: {e}");
        }
    }
    for (id, e) in failed {
        println!("osd.{id:<4} failed: {e}");
    }
    if ranked.len() < OUTLIER_OSDS_MIN {
        println!("\n(fewer than {OUTLIER_OSDS_MIN} OSDs: none marked)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(osd: u32, w_p50: u64, iops: f64, mbs: f64) -> BenchReport {
        let t = |name: &str, p50: u64, iops: f64, mb: f64| BenchTest {
            name: name.into(),
            ops: 10,
            lat_p50_us: p50,
            iops,
            mb_per_s: mb,
            ..BenchTest::default()
        };
        BenchReport {
            osd,
            tests: vec![
                t("randwrite-4k-qd1", w_p50, 0.0, 0.0),
                t("randread-4k-qd1", 100, 0.0, 0.0),
                t("randwrite-4k-qd32", 0, iops, 0.0),
                t("randread-4k-qd32", 0, 20_000.0, 0.0),
                t("write-objects", 0, 0.0, mbs),
                t("read-objects", 0, 0.0, 500.0),
            ],
            ..BenchReport::default()
        }
    }

    /// An OSD twice as slow as the median (latency up, or IOPS and MB/s
    /// down) is marked with each figure and its ratio; the others, and
    /// any set of fewer than three OSDs, are not.
    #[test]
    fn outliers_are_the_osds_far_from_the_median() {
        let rs = [
            report(0, 100, 10_000.0, 400.0),
            report(1, 110, 9_000.0, 420.0),
            report(2, 350, 10_500.0, 390.0),
            report(3, 105, 4_000.0, 150.0),
        ];
        let refs: Vec<&BenchReport> = rs.iter().collect();
        let why = outliers(&refs);
        assert!(why[0].is_empty() && why[1].is_empty(), "{why:?}");
        assert_eq!(why[2], vec!["4k write QD1 p50 3.3× worse than the median"]);
        assert_eq!(
            why[3],
            vec![
                "4k write QD32 IOPS 2.4× worse than the median",
                "write MB/s 2.6× worse than the median"
            ]
        );
        assert!(outliers(&refs[..2]).iter().all(Vec::is_empty));
    }
}
