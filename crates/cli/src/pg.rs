//! `nacre pg …`: placement groups on demand.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Subcommand;
use nacre_client::Cluster;
use nacre_io::rt;
use nacre_osd::ScrubReport;
use nacre_types::PgId;

use crate::at::At;
use crate::Format;

#[derive(Subcommand)]
pub enum PgCmd {
    /// List the PGs: the OSDs placement gives each, its acting set (those
    /// up, and temporary members keeping a moving PG's copies), its
    /// primary.
    Ls {
        /// Only this pool's.
        #[arg(long)]
        pool: Option<String>,
        #[command(flatten)]
        at: At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Scrub PGs now and wait for what their primaries found: light
    /// compares every copy's object versions and PG log; --deep also reads
    /// every copy whole (each 4 KiB checked against its checksum) and
    /// compares the bytes. Copies that differ are rewritten from the
    /// majority's (else the primary's) copy. In an erasure-coded pool the
    /// shards of each object must make one stripe (light: every parity
    /// shard holds it; deep: the parity re-encoded from the data matches),
    /// and the one shard to blame is rewritten from the others. Exits
    /// non-zero if a PG could not be scrubbed or kept objects it could not
    /// repair.
    Scrub {
        /// The PG as `nacre status` names it: POOL.PG, the PG in hex
        /// (`1.1f`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        pg: Option<String>,
        /// Every PG of every pool (each primary scrubs its PGs one at a
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
        PgCmd::Ls { pool, at, format } => ls(pool.as_deref(), &at, format),
        PgCmd::Scrub {
            pg,
            all,
            deep,
            at,
            format,
        } => scrub(pg.as_deref(), all, deep, &at, format),
    }
}

fn ls(pool: Option<&str>, at: &At, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    let m = nacre_meta::map::load(&*meta)?;
    let stamps = nacre_meta::map::scrub_stamps(&*meta)?;
    let only = match pool {
        Some(name) => Some(m.pool_named(name).map(|p| p.id).with_context(|| {
            let names: Vec<&str> = m.pools.iter().map(|p| p.name.as_str()).collect();
            format!("no pool named {name:?} (pools: {})", names.join(", "))
        })?),
        None => None,
    };
    let (down, state) = (&m.state.down, &m.state);
    let rows: Vec<serde_json::Value> = (m.tables.iter())
        .filter(|t| only.is_none_or(|p| p == t.pool))
        .flat_map(|t| {
            let stamps = &stamps;
            (0..t.pg_count()).map(move |n| {
                let pg = PgId::new(t.pool, n);
                let s = stamps.get(&pg).copied().unwrap_or_default();
                let when = |t: u64| (t > 0).then_some(t);
                serde_json::json!({
                    "pg": pg,
                    "placement": t.placement(n),
                    "acting": t.acting(n, down),
                    "primary": t.primary(n, state),
                    // The last complete scrub (a deep one is light too),
                    // the last deep one (null: never), what the last one
                    // found.
                    "scrubbed_unix_s": when(s.light_unix_s),
                    "deep_scrubbed_unix_s": when(s.deep_unix_s),
                    "scrub_inconsistent": s.inconsistent,
                    "scrub_unrepaired": s.unrepaired,
                })
            })
        })
        .collect();
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Format::Table => {
            println!(
                "{:<8} {:<16} {:<20} {:<8} {:>10} {:>10}",
                "pg", "placement", "acting", "primary", "scrubbed", "deep"
            );
            let now = nacre_meta::map::now_s();
            let ago = |v: &serde_json::Value| -> String {
                v.as_u64().map_or("never".into(), |t| {
                    format!("{} ago", age(now.saturating_sub(t)))
                })
            };
            let list = |v: &serde_json::Value| -> String {
                let ids: Vec<String> = (v.as_array().into_iter().flatten())
                    .map(|o| o.to_string())
                    .collect();
                ids.join(",")
            };
            for r in &rows {
                println!(
                    "{:<8} {:<16} {:<20} {:<8} {:>10} {:>10}{}",
                    r["pg"].as_str().unwrap_or(""),
                    list(&r["placement"]),
                    list(&r["acting"]),
                    r["primary"]
                        .as_u64()
                        .map_or("none".into(), |p| format!("osd.{p}")),
                    ago(&r["scrubbed_unix_s"]),
                    ago(&r["deep_scrubbed_unix_s"]),
                    match r["scrub_unrepaired"].as_u64() {
                        Some(n @ 1..) => format!("  {n} unrepaired"),
                        _ => String::new(),
                    }
                );
            }
        }
    }
    Ok(())
}

/// `s` seconds as people read an age: 42s, 17m, 5h, 3d.
fn age(s: u64) -> String {
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn scrub(pg: Option<&str>, all: bool, deep: bool, at: &At, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    let one: Option<PgId> = pg
        .map(|s| s.parse().map_err(anyhow::Error::msg))
        .transpose()?;
    type Reports = Vec<(PgId, Result<ScrubReport, String>)>;
    let reports: Reports = rt::block_on(async {
        let c = Cluster::connect(meta)?;
        let m = c.map();
        let pgs: Vec<PgId> = match one {
            Some(pg) => {
                let t = (m.table(pg.pool))
                    .with_context(|| format!("PG {pg}: there is no pool {}", pg.pool))?;
                anyhow::ensure!(
                    pg.pg < t.pg_count(),
                    "PG {pg}: pool {} has {} PGs (0..{:x})",
                    pg.pool,
                    t.pg_count(),
                    t.pg_count()
                );
                vec![pg]
            }
            None => (m.tables.iter())
                .flat_map(|t| (0..t.pg_count()).map(|n| PgId::new(t.pool, n)))
                .collect(),
        };
        debug_assert!(all || pgs.len() == 1);
        // One queue per primary (each scrubs one PG at a time anyway).
        let mut queues: BTreeMap<Option<u32>, Vec<PgId>> = BTreeMap::new();
        for &pg in &pgs {
            let primary = m.primary(pg).and_then(|(p, _)| p);
            queues.entry(primary).or_default().push(pg);
        }
        let tasks: Vec<_> = (queues.into_values())
            .map(|q| {
                let c = c.clone();
                rt::spawn(async move {
                    let mut out = Vec::new();
                    for pg in q {
                        let r = match c.scrub_pg(pg, deep).await {
                            Ok(v) => serde_json::from_value::<ScrubReport>(v)
                                .map_err(|e| format!("a report that does not parse: {e}")),
                            Err(e) => Err(e.to_string()),
                        };
                        out.push((pg, r));
                    }
                    out
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await);
        }
        all.sort_by_key(|(pg, _)| *pg);
        anyhow::Ok(all)
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
                .map(|(pg, r)| match r {
                    Ok(r) => serde_json::to_value(r).expect("a report serialises"),
                    Err(e) => serde_json::json!({"pg": pg, "error": e}),
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Format::Table => {
            println!(
                "{:<8} {:<12} {:>8} {:>12} {:>9} {:>10} {:>8}  result",
                "pg", "osds", "objects", "inconsistent", "repaired", "unrepaired", "seconds"
            );
            for (pg, r) in &reports {
                let id = pg.to_string();
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
