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

use serde::Serialize;

pub use desc::{Cluster, Description, EXAMPLE};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("cluster description: {0}")]
    Invalid(String),
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
    /// The slowest disk's and host's recovery on Nacre's placement.
    pub disk_recovery: estimate::Recovery,
    pub host_recovery: estimate::Recovery,
    /// Data loss on Nacre's placement.
    pub loss: loss::Loss,
    /// Data loss were the PGs spread evenly at random (as CRUSH spreads
    /// them), with recovery as parallel as that spread allows (host
    /// failure domain only).
    pub loss_even: Option<loss::Loss>,
}

pub fn plan(c: &Cluster) -> Result<Plan, PlanError> {
    let placed = loss::Placed::of(c)?;
    let mut disk: Option<estimate::Recovery> = None;
    let mut host: Option<estimate::Recovery> = None;
    let mut seen = Vec::new();
    for h in 0..c.hosts.len() {
        if seen.contains(&c.group[h]) {
            continue;
        }
        seen.push(c.group[h]);
        let (d, a) = loss::recoveries(c, h, Some(&placed))?;
        if disk.is_none_or(|x| d.window_s > x.window_s) {
            disk = Some(d);
        }
        if host.is_none_or(|x| a.window_s > x.window_s) {
            host = Some(a);
        }
    }
    let (Some(disk_recovery), Some(host_recovery)) = (disk, host) else {
        return Err(PlanError::Invalid("no hosts".into()));
    };
    Ok(Plan {
        hosts: c.hosts.len() as u64,
        osds: c.osds(),
        scheme: c.scheme.label(),
        pgs: c.pgs,
        pgs_per_osd: estimate::pgs_per_osd(c),
        capacity: estimate::capacity(c),
        speed: estimate::speed(c),
        disk_recovery,
        host_recovery,
        loss: loss::loss(c, &placed)?,
        loss_even: match c.domain {
            desc::FailureDomain::Host => Some(loss::loss_even(c, &loss::Units::of(c, None)?)?),
            desc::FailureDomain::Osd => None,
        },
    })
}
