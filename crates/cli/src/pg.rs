//! `nacre pg …`: placement groups on demand.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Subcommand;
use nacre_client::Cluster;
use nacre_io::rt;
use nacre_osd::ScrubReport;

use crate::at::At;
use crate::Format;

#[derive(Subcommand)]
pub enum PgCmd {
    /// Scrub PGs now and wait for what their primaries found: light
    /// compares every copy's object versions and PG log; --deep also reads
    /// every copy whole (each 4 KiB checked against its checksum) and
    /// compares the bytes. Copies that differ are rewritten from the
    /// majority's (else the primary's) copy. Exits non-zero if a PG could
    /// not be scrubbed or kept objects it could not repair.
    Scrub {
        /// The PG: its number, or POOL.NUMBER as `nacre status` names it.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        pg: Option<String>,
        /// Every PG of the pool (each primary scrubs its PGs one at a
        /// time; the primaries in parallel).
        #[arg(long)]
        all: bool,
        /// Read and compare every copy's bytes.
        #[arg(long)]
        deep: bool,
        #[command(flatten)]
        at: At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

pub fn run(cmd: PgCmd) -> anyhow::Result<()> {
    match cmd {
        PgCmd::Scrub {
            pg,
            all,
            deep,
            at,
            format,
        } => scrub(pg.as_deref(), all, deep, &at, format),
    }
}

/// PG `s` ("N" or "POOL.N") of pool `pool`.
fn parse_pg(s: &str, pool: u32) -> anyhow::Result<u32> {
    let n = match s.split_once('.') {
        Some((p, n)) => {
            let p: u32 = p.parse().with_context(|| format!("PG {s:?}: pool {p:?}"))?;
            anyhow::ensure!(p == pool, "PG {s:?}: the cluster's pool is {pool}");
            n
        }
        None => s,
    };
    n.parse()
        .with_context(|| format!("PG {s:?}: expected N or POOL.N"))
}

fn scrub(pg: Option<&str>, all: bool, deep: bool, at: &At, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    type Reports = Vec<(u32, Result<ScrubReport, String>)>;
    let (pool, reports): (u32, Reports) = rt::block_on(async {
        let c = Cluster::connect(meta)?;
        let pool = c.default_pool();
        let pgs: Vec<u32> = match pg {
            Some(s) => {
                let n = parse_pg(s, pool.id)?;
                anyhow::ensure!(
                    n < pool.pg_count,
                    "PG {s}: the pool has {} PGs",
                    pool.pg_count
                );
                vec![n]
            }
            None => (0..pool.pg_count).collect(),
        };
        debug_assert!(all || pgs.len() == 1);
        // One queue per primary (each scrubs one PG at a time anyway).
        let mut queues: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
        {
            let m = c.map();
            let t = m.pgmap(pool.id).context("no PG table")?;
            for &n in &pgs {
                queues.entry(t.primary(n)).or_default().push(n);
            }
        }
        let tasks: Vec<_> = (queues.into_values())
            .map(|q| {
                let c = c.clone();
                rt::spawn(async move {
                    let mut out = Vec::new();
                    for n in q {
                        let r = match c.scrub_pg(n, deep).await {
                            Ok(v) => serde_json::from_value::<ScrubReport>(v)
                                .map_err(|e| format!("a report that does not parse: {e}")),
                            Err(e) => Err(e.to_string()),
                        };
                        out.push((n, r));
                    }
                    out
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await);
        }
        all.sort_by_key(|(n, _)| *n);
        anyhow::Ok((pool.id, all))
    })?;
    let failed = (reports.iter())
        .filter(|(_, r)| r.as_ref().map_or(true, |r| r.error.is_some()))
        .count();
    let unrepaired: u64 = (reports.iter())
        .filter_map(|(_, r)| r.as_ref().ok())
        .map(|r| r.unrepaired)
        .sum();
    match format {
        Format::Json => {
            let v: Vec<serde_json::Value> = (reports.iter())
                .map(|(n, r)| match r {
                    Ok(r) => serde_json::to_value(r).expect("a report serialises"),
                    Err(e) => serde_json::json!({"pg": n, "error": e}),
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Format::Table => {
            println!(
                "{:<8} {:<12} {:>8} {:>12} {:>9} {:>10} {:>8}  result",
                "pg", "osds", "objects", "inconsistent", "repaired", "unrepaired", "seconds"
            );
            for (n, r) in &reports {
                let id = format!("{pool}.{n}");
                match r {
                    Ok(r) => {
                        let osds: Vec<String> = r.osds.iter().map(u32::to_string).collect();
                        println!(
                            "{id:<8} {:<12} {:>8} {:>12} {:>9} {:>10} {:>8.1}  {}",
                            osds.join(","),
                            r.objects,
                            r.inconsistent,
                            r.repaired,
                            r.unrepaired,
                            r.seconds,
                            r.error
                                .as_deref()
                                .map_or("ok".to_string(), |e| format!("stopped: {e}"))
                        );
                        for f in &r.findings {
                            println!("         {f}");
                        }
                    }
                    Err(e) => println!(
                        "{id:<8} {:<12} {:>8} {:>12} {:>9} {:>10} {:>8}  {e}",
                        "", "", "", "", "", ""
                    ),
                }
            }
        }
    }
    let kind = if deep { "deep scrub" } else { "scrub" };
    anyhow::ensure!(
        failed == 0 && unrepaired == 0,
        "{kind}: {failed} of {} PGs not scrubbed to the end, {unrepaired} objects left unrepaired",
        reports.len()
    );
    Ok(())
}
