//! `nacre plan`: reads a cluster description (TOML) and prints what
//! `nacre-plan` estimates for it.

use std::path::PathBuf;

use anyhow::Context;
use nacre_io::rt;
use nacre_plan::estimate::{Bound, Limited, Recovery};
use nacre_plan::loss::Loss;
use nacre_plan::{Description, Plan};

use crate::at::{At, PREFIX_DEFAULT};
use crate::{args, net, osd_bench, Format};
use nacre_osd::slow::median;

/// The AFR given to the disks of a description made from a live cluster
/// (a failure rate is not measured): a conservative figure to edit.
const MEASURED_DISK_AFR: f64 = 0.02;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// The cluster description (TOML; `nacre plan --example` prints one
    /// to start from, docs/PLAN.md explains every field).
    #[arg(required_unless_present_any = ["example", "from_cluster"])]
    file: Option<PathBuf>,
    /// Print an example description and stop.
    #[arg(long)]
    example: bool,
    /// Plan the live cluster at --dir or --etcd instead of FILE: its hosts
    /// and OSD sizes, each host group's disks as `nacre osd bench`
    /// measures them (one OSD at a time; the median of the group's OSDs),
    /// the network as `nacre net bench` does (median throughput and round
    /// trip), the pool's scheme and PG count; the disks' failure rate is
    /// not measured (2% a year). Prints that description first (TOML, to
    /// keep, edit and plan again with `nacre plan FILE`).
    #[arg(long, conflicts_with_all = ["file", "example"])]
    from_cluster: bool,
    /// With --from-cluster: the directory of a cluster on this machine
    /// (`nacre up --dir`).
    #[arg(long, requires = "from_cluster", conflicts_with = "etcd")]
    dir: Option<PathBuf>,
    /// With --from-cluster: the etcd of a cluster on many hosts (its
    /// client URLs, comma-separated).
    #[arg(long, requires = "from_cluster")]
    etcd: Option<String>,
    /// With --etcd: where the cluster's keys live in etcd.
    #[arg(long, default_value = PREFIX_DEFAULT)]
    prefix: String,
    /// With --from-cluster: the pool to plan (default the first).
    #[arg(long, requires = "from_cluster")]
    pool: Option<String>,
    /// With --from-cluster: bytes each OSD's bench writes (4M..64G).
    #[arg(long, value_parser = args::parse_size, default_value = "256M")]
    bench_size: u64,
    /// Output: a table for people, or JSON for scripts.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    if a.example {
        print!("{}", nacre_plan::EXAMPLE);
        return Ok(());
    }
    let (cluster, described) = if a.from_cluster {
        anyhow::ensure!(
            a.dir.is_some() || a.etcd.is_some(),
            "--from-cluster: give the cluster's --dir or --etcd"
        );
        let at = At {
            dir: a.dir.clone(),
            etcd: a.etcd.clone(),
            prefix: a.prefix.clone(),
        };
        let d = describe_cluster(&at, a.pool.as_deref(), a.bench_size)?;
        let c = d
            .resolve()
            .context("the description made from the cluster")?;
        (c, Some(d))
    } else {
        let path = a.file.context("give the description's file")?;
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let c = Description::parse(&text)
            .and_then(|d| d.resolve())
            .with_context(|| format!("{}", path.display()))?;
        (c, None)
    };
    let plan = nacre_plan::plan(&cluster)?;
    match a.format {
        Format::Json => {
            let mut v = serde_json::to_value(&plan)?;
            if let Some(d) = &described {
                v["description"] = serde_json::to_value(d)?;
            }
            println!("{}", serde_json::to_string_pretty(&v)?)
        }
        Format::Table => {
            if let Some(d) = &described {
                println!("# The cluster as measured (nacre plan --from-cluster):\n");
                println!("{}", d.to_toml());
            }
            print!("{}", table(&plan))
        }
    }
    Ok(())
}

/// `x` to `places` decimals: measured figures, as people write them.
fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

/// A description of the live cluster at `at`: hosts grouped by their
/// number of OSDs up, each group's disk the median of its OSDs' sizes and
/// bench figures, the network from `nacre net bench`, pool `pool` (or
/// the first).
fn describe_cluster(at: &At, pool: Option<&str>, bench_size: u64) -> anyhow::Result<Description> {
    let meta = at.meta()?;
    let m = nacre_meta::map::load(&*meta)?;
    let p = match pool {
        Some(name) => m
            .pool_named(name)
            .with_context(|| format!("no pool named {name:?}"))?,
        None => m.pools.first().context("the cluster has no pool")?,
    };
    let domain = match p.failure_domain.as_str() {
        "osd" => nacre_plan::desc::FailureDomain::Osd,
        "host" => nacre_plan::desc::FailureDomain::Host,
        f => anyhow::bail!(
            "pool {:?} places its copies across {f}s: the planner knows hosts and OSDs only",
            p.name
        ),
    };
    let down: Vec<String> = (m.osds.iter())
        .filter(|o| !m.is_up(o.id))
        .map(|o| format!("osd.{}", o.id))
        .collect();
    anyhow::ensure!(
        down.is_empty(),
        "{} down: --from-cluster measures every OSD (describe the cluster in a file instead)",
        down.join(", ")
    );
    let capacity: std::collections::HashMap<u32, u64> = rt::block_on(async {
        let c = nacre_client::Cluster::connect(meta.clone())?;
        let stats = c.osd_stats().await;
        anyhow::Ok(
            (stats.into_iter())
                .filter_map(|(id, v)| Some((id, v?["capacity_bytes"].as_u64()?)))
                .collect(),
        )
    })?;
    let rows = osd_bench::measure(at, None, bench_size, false, true)?;
    let failed: Vec<String> = (rows.iter())
        .filter_map(|(id, _, r)| r.as_ref().err().map(|e| format!("osd.{id}: {e}")))
        .chain((rows.iter()).filter_map(|(id, _, r)| {
            r.as_ref()
                .ok()?
                .error
                .as_ref()
                .map(|e| format!("osd.{id}: {e}"))
        }))
        .collect();
    anyhow::ensure!(
        failed.is_empty(),
        "OSD benches failed: {}",
        failed.join("; ")
    );
    let (_, links) = net::measure(at, true)
        .context("--from-cluster measures the network between the hosts (a one-host cluster: describe it in a file)")?;
    let links: Vec<&nacre_osd::LinkReport> = (links.iter())
        .map(|(a, b, r)| r.as_ref().map_err(|e| anyhow::anyhow!("{a} → {b}: {e}")))
        .collect::<anyhow::Result<_>>()?;
    // A group per host; past the planner's groups, hosts grouped by how
    // many OSDs they have (their disks then the median of the group's).
    let mut per_host: std::collections::BTreeMap<&str, Vec<&nacre_osd::BenchReport>> =
        Default::default();
    for (_, host, r) in &rows {
        (per_host.entry(host).or_default()).push(r.as_ref().expect("checked above"));
    }
    let by_host = per_host.len() <= nacre_plan::desc::GROUPS_MAX;
    type Key<'a> = (usize, &'a str);
    let mut groups: std::collections::BTreeMap<Key, Vec<&nacre_osd::BenchReport>> =
        Default::default();
    let mut counts: std::collections::BTreeMap<Key, u32> = Default::default();
    for (host, reports) in &per_host {
        let key = (reports.len(), if by_host { *host } else { "" });
        groups
            .entry(key)
            .or_default()
            .extend(reports.iter().copied());
        *counts.entry(key).or_default() += 1;
    }
    let figure =
        |rs: &[&nacre_osd::BenchReport], test: &str, f: fn(&nacre_osd::BenchTest) -> f64| {
            median(
                (rs.iter())
                    .filter_map(|r| r.tests.iter().find(|t| t.name == test).map(f))
                    .collect(),
            )
            .map(|x| round(x, 1))
        };
    let hosts = (groups.iter())
        .map(|(&key, rs)| {
            // The mean: the group's capacity is the sum of its disks'.
            let sizes: Vec<f64> = (rs.iter())
                .filter_map(|r| capacity.get(&r.osd).map(|&b| b as f64 / 1e12))
                .collect();
            let size = sizes.iter().sum::<f64>() / sizes.len().max(1) as f64;
            let disks = key.0;
            nacre_plan::desc::HostGroup {
                count: counts[&key],
                disks: disks as u32,
                disk: nacre_plan::desc::Disk {
                    kind: None,
                    size_tb: round(size, 6),
                    read_iops: figure(rs, "randread-4k-qd32", |t| t.iops),
                    write_iops: figure(rs, "randwrite-4k-qd32", |t| t.iops),
                    read_mbps: figure(rs, "read-objects", |t| t.mb_per_s),
                    write_mbps: figure(rs, "write-objects", |t| t.mb_per_s),
                    read_lat_us: figure(rs, "randread-4k-qd1", |t| t.lat_avg_us),
                    write_lat_us: figure(rs, "randwrite-4k-qd1", |t| t.lat_avg_us),
                    afr: Some(MEASURED_DISK_AFR),
                },
            }
        })
        .collect();
    let mbps = median(links.iter().map(|l| l.mb_per_s).collect()).unwrap_or(0.0);
    let rtt = median(links.iter().map(|l| l.rtt_p50_us as f64).collect());
    Ok(Description {
        hosts,
        network: nacre_plan::desc::Network {
            gbps: round(mbps * 8.0 / 1000.0, 2),
            rtt_us: rtt,
        },
        pool: nacre_plan::desc::PoolScheme {
            replicas: p.ec.is_none().then_some(p.size),
            ec: p.ec.as_ref().map(|e| format!("{}+{}", e.k, e.m)),
            failure_domain: Some(domain),
            pgs: Some(p.pg_count),
            fill: None,
        },
        failures: Default::default(),
    })
}

fn bound(b: Bound) -> &'static str {
    match b {
        Bound::Disks => "disks",
        Bound::Network => "network",
        Bound::RecoveryRate => "recovery rate",
        Bound::NoRoom => "nowhere to rebuild",
        Bound::NothingLost => "nothing lost",
        Bound::NoCopyLeft => "no copy left",
    }
}

fn limited(l: &Limited, unit: &str) -> String {
    format!("{:.0} {unit} ({})", l.value, bound(l.bound))
}

fn duration(s: f64) -> String {
    let m = (s / 60.0).round() as u64;
    match m {
        0..=119 => format!("{m} min"),
        _ if m < 48 * 60 => format!("{} h {} min", m / 60, m % 60),
        _ => format!("{:.1} days", s / 86_400.0),
    }
}

fn recovery(r: &Recovery) -> String {
    match r.rate_mbps.bound {
        Bound::NoRoom => format!(
            "{:.1} TB wait for the host's return ({}): no room to rebuild it elsewhere",
            r.lost_tb,
            duration(r.window_s)
        ),
        Bound::NothingLost => "held no PG: nothing to rebuild".into(),
        Bound::NoCopyLeft => "one copy per PG: its data is lost".into(),
        _ => format!(
            "{:.1} TB rebuilt at {} ({} PGs: {} primaries, {} OSDs read, {} written): {} with the out delay",
            r.lost_tb,
            limited(&r.rate_mbps, "MB/s"),
            r.pgs,
            r.primaries,
            r.sources,
            r.targets,
            duration(r.window_s)
        ),
    }
}

fn loss(l: &Loss) -> String {
    let how = match l.loss_sets {
        Some(n) => format!("{n} loss sets counted"),
        None => "expected for an even spread".into(),
    };
    format!(
        "{:.2e} per year (MTTDL {:.2e} years; {how})",
        l.annual_probability, l.mttdl_years
    )
}

fn table(p: &Plan) -> String {
    let s = &p.speed;
    let mut rows = vec![
        (
            "cluster",
            format!(
                "{} hosts, {} OSDs, {}, {} PGs ({:.0} per OSD)",
                p.hosts, p.osds, p.scheme, p.pgs, p.pgs_per_osd
            ),
        ),
        (
            "capacity",
            format!(
                "{:.1} TB usable ({:.1} TB raw, {:.1} TB of it placeable)",
                p.capacity.usable_tb, p.capacity.raw_tb, p.capacity.placeable_raw_tb
            ),
        ),
        ("linear write", limited(&s.write_mbps, "MB/s")),
        ("linear read", limited(&s.read_mbps, "MB/s")),
        ("4 KiB write", limited(&s.write_iops, "IOPS")),
        ("4 KiB read", limited(&s.read_iops, "IOPS")),
        (
            "QD1 latency",
            format!(
                "write {:.0} µs, read {:.0} µs",
                s.write_lat_us, s.read_lat_us
            ),
        ),
        ("lost disk", recovery(&p.nacre.disk_recovery)),
        ("lost host", recovery(&p.nacre.host_recovery)),
        ("data loss", loss(&p.nacre.loss)),
    ];
    if let Some(e) = &p.even {
        rows.push(("PGs at random:", String::new()));
        rows.push(("  lost disk", recovery(&e.disk_recovery)));
        rows.push(("  lost host", recovery(&e.host_recovery)));
        rows.push(("  data loss", loss(&e.loss)));
    }
    for w in &p.warnings {
        rows.push(("warning", w.clone()));
    }
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<16} {v}\n"));
    }
    out.push_str(
        "Estimates from the description (docs/PLAN.md has the rules); MB/s = 10^6 bytes/s, TB = 10^12 bytes.\n",
    );
    out
}
