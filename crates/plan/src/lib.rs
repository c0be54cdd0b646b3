//! `nacre plan`: what a cluster described in TOML will hold, how fast it
//! will be, how long it takes to recover a lost disk or host, and how
//! likely it is to lose data in a year. Pure functions, no I/O: the CLI
//! reads the file and prints the answer.
//!
//! - [`desc`]: the description, its checks, typical figures per disk kind;
//! - [`estimate`]: capacity, bandwidth, IOPS, QD1 latency, recovery time;
//! - [`loss`]: the data-loss model, counted from a placement table or
//!   expected for large clusters, and a Monte Carlo simulation of it.
//!
//! Every figure is an estimate from the rules written beside it; none is
//! measured here. `docs/PLAN.md` explains the rules and their limits.

pub mod desc;
pub mod estimate;
pub mod loss;
pub mod table;

use serde::Serialize;

pub use desc::{Cluster, Description, EXAMPLE};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("cluster description: {0}")]
    Invalid(String),
}

/// Recovery and data loss on one kind of table.
#[derive(Clone, Debug, Serialize)]
pub struct OnTable {
    /// A disk and a whole host lost: of each group of hosts, the first
    /// host's first disk and the host itself; the slowest group shown.
    pub disk_recovery: estimate::Recovery,
    pub host_recovery: estimate::Recovery,
    pub loss: loss::Loss,
}

/// Everything `nacre plan` answers.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub hosts: u64,
    pub osds: u64,
    pub scheme: String,
    pub pgs: u32,
    pub pgs_per_osd: f64,
    pub capacity: estimate::Capacity,
    pub speed: estimate::Speed,
    /// On Nacre's placement; the loss is the worse of the fresh table and
    /// the table after a disk failed and came back (the greedy fresh
    /// table reuses few OSD sets; the moves mix them).
    pub nacre: OnTable,
    /// Were the PGs spread evenly at random (as CRUSH spreads them); None
    /// when its loss sets are too many to count with an OSD failure
    /// domain.
    pub even: Option<OnTable>,
    pub warnings: Vec<String>,
}

/// Seed of the random table: the same plan every run.
const EVEN_SEED: u64 = 0x6e61_6372_6570_6c61;

/// Per host, its windows in seconds (a disk lost, the host lost), and the
/// slowest recoveries of a disk and of a host.
type Recoveries = (Vec<(f64, f64)>, estimate::Recovery, estimate::Recovery);

/// The recoveries on `t`.
fn recoveries(
    c: &Cluster,
    osds: &table::Osds,
    t: &table::PgTable,
) -> Result<Recoveries, PlanError> {
    let mut windows = vec![(0.0, 0.0); c.hosts.len()];
    let mut done: Vec<Option<(f64, f64)>> = vec![None; c.group.iter().max().map_or(0, |g| g + 1)];
    let (mut disk, mut host): (Option<estimate::Recovery>, Option<estimate::Recovery>) =
        (None, None);
    for (h, &g) in c.group.iter().enumerate() {
        if let Some(w) = done[g] {
            windows[h] = w;
            continue;
        }
        let on_host = osds.of_host(h);
        let one = &on_host[..1];
        let size = |lost: &[u32]| lost.iter().map(|&o| osds.size_tb[o as usize]).sum::<f64>();
        let rec = |lost: &[u32]| -> Result<estimate::Recovery, PlanError> {
            let next = t.without(c, lost, EVEN_SEED ^ h as u64)?;
            let w = next.map(|n| table::work(c, osds, t, &n, lost));
            Ok(estimate::recovery(c, size(lost), w.as_ref()))
        };
        let (d, a) = (rec(one)?, rec(&on_host)?);
        windows[h] = (d.window_s, a.window_s);
        done[g] = Some(windows[h]);
        if disk.is_none_or(|x| d.window_s > x.window_s) {
            disk = Some(d);
        }
        if host.is_none_or(|x| a.window_s > x.window_s) {
            host = Some(a);
        }
    }
    match (disk, host) {
        (Some(d), Some(a)) => Ok((windows, d, a)),
        _ => Err(PlanError::Invalid("no hosts".into())),
    }
}

fn warnings(c: &Cluster, p: &OnTable) -> Vec<String> {
    let mut w = Vec::new();
    if p.host_recovery.rate_mbps.bound == estimate::Bound::NoRoom {
        w.push(format!(
            "a lost host's data cannot be rebuilt elsewhere (too few failure domains, or the others would pass the {:.0}% full ratio at fill {:.2}): it stays with one redundancy fewer until the host returns (host_repair_hours = {})",
            estimate::FULL_RATIO * 100.0,
            c.fill,
            c.host_repair_hours
        ));
    }
    if c.fill > 0.75 {
        w.push(format!(
            "fill {:.2}: clusters slow down above 75% full (CERN); plan for more capacity",
            c.fill
        ));
    }
    w
}

pub fn plan(c: &Cluster) -> Result<Plan, PlanError> {
    let osds = table::Osds::of(c);
    let nacre_table = table::PgTable::nacre(c)?;
    let (windows, disk_recovery, host_recovery) = recoveries(c, &osds, &nacre_table)?;
    let u = loss::Units::of(c, &windows);
    let mut loss = loss::loss_on(c, &nacre_table, &u)?;
    // After the first OSD failed and came back.
    if let Some(next) = nacre_table.without(c, &[0], 0)? {
        let aged = loss::loss_on(c, &next.returned(c)?, &u)?;
        if aged.rate_per_year > loss.rate_per_year {
            loss = aged;
        }
    }
    let nacre = OnTable {
        disk_recovery,
        host_recovery,
        loss,
    };
    let random = table::PgTable::random(c, EVEN_SEED);
    let (windows, disk_recovery, host_recovery) = recoveries(c, &osds, &random)?;
    let even = loss::loss_on(c, &random, &loss::Units::of(c, &windows))
        .ok()
        .map(|loss| OnTable {
            disk_recovery,
            host_recovery,
            loss,
        });
    Ok(Plan {
        hosts: c.hosts.len() as u64,
        osds: c.osds(),
        scheme: c.scheme.label(),
        pgs: c.pgs,
        pgs_per_osd: estimate::pgs_per_osd(c),
        capacity: estimate::capacity(c, &nacre_table),
        speed: estimate::speed(c),
        warnings: warnings(c, &nacre),
        nacre,
        even,
    })
}
