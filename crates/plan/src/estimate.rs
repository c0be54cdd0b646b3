//! Capacity, speed and recovery time from the disks' and network's
//! figures — the estimation rules of the team's LESSONS: linear read =
//! OSDs × per-OSD MB/s; linear write = OSDs ÷ replicas × per-OSD MB/s
//! (erasure coding: × k/(k+m)); random IOPS add up over OSDs; QD1 latency
//! averages over them; whatever the network caps is capped.
//!
//! Each rule names what limits it (`Bound`), so an operator sees which
//! part to buy more of. Clients are assumed to have the bandwidth to reach
//! every host at once (their links are not modelled).

use serde::Serialize;

use crate::desc::{Cluster, FailureDomain, Scheme};

/// Bytes of a small op.
const SMALL_OP_BYTES: f64 = 4096.0;

/// What limits a figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bound {
    Disks,
    Network,
    RecoveryRate,
    /// Too few failure domains left to rebuild anywhere: the data waits
    /// for the failed host's return.
    NoRoom,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Limited {
    pub value: f64,
    pub bound: Bound,
}

fn least(options: &[(f64, Bound)]) -> Limited {
    let mut best = Limited {
        value: f64::INFINITY,
        bound: Bound::Disks,
    };
    for &(value, bound) in options {
        if value < best.value {
            best = Limited { value, bound };
        }
    }
    best
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Speed {
    pub write_mbps: Limited,
    pub read_mbps: Limited,
    pub write_iops: Limited,
    pub read_iops: Limited,
    pub write_lat_us: f64,
    pub read_lat_us: f64,
}

/// Nacre's own time per op beyond the network and the disks (client,
/// primary and replicas together).
pub const SOFTWARE_US: f64 = 50.0;

/// A host link in MB/s.
fn link_mbps(c: &Cluster) -> f64 {
    c.network_gbps * 125.0
}

/// Network bytes into the cluster's hosts per byte a client writes.
fn write_net_factor(s: Scheme) -> f64 {
    match s {
        // To the primary, then to each other replica.
        Scheme::Replicas(r) => f64::from(r),
        // To the primary, then a chunk to each other shard.
        Scheme::Ec { k, m } => 1.0 + (f64::from(k) + f64::from(m) - 1.0) / f64::from(k),
    }
}

/// Network bytes out of the cluster's hosts per byte a client reads.
fn read_net_factor(s: Scheme) -> f64 {
    match s {
        Scheme::Replicas(_) => 1.0,
        // The other data shards send theirs to the primary, which answers.
        Scheme::Ec { k, .. } => 1.0 + (f64::from(k) - 1.0) / f64::from(k),
    }
}

pub fn speed(c: &Cluster) -> Speed {
    let osds = c.osds() as f64;
    let sum = |f: fn(&crate::desc::DiskFigures) -> f64| c.disks().map(f).sum::<f64>();
    let net_mbps = c.hosts.len() as f64 * link_mbps(c);
    let eff = c.scheme.efficiency();
    let write_mbps = least(&[
        (sum(|d| d.write_mbps) * eff, Bound::Disks),
        (net_mbps / write_net_factor(c.scheme), Bound::Network),
    ]);
    let read_mbps = least(&[
        (sum(|d| d.read_mbps), Bound::Disks),
        (net_mbps / read_net_factor(c.scheme), Bound::Network),
    ]);
    let (w_iops, r_iops) = (sum(|d| d.write_iops), sum(|d| d.read_iops));
    // A small EC write reads the old bytes and writes the new on the data
    // shard and on each parity shard (the delta is XORed in): m + 1 reads
    // and m + 1 writes.
    let (disk_write_iops, small_write_net) = match c.scheme {
        Scheme::Replicas(r) => (w_iops / f64::from(r), f64::from(r)),
        Scheme::Ec { m, .. } => {
            let touched = f64::from(m) + 1.0;
            (
                1.0 / (touched * (1.0 / w_iops + 1.0 / r_iops)),
                2.0 + touched,
            )
        }
    };
    let op_mb = SMALL_OP_BYTES / 1e6;
    let write_iops = least(&[
        (disk_write_iops, Bound::Disks),
        (net_mbps / (op_mb * small_write_net), Bound::Network),
    ]);
    let read_iops = least(&[(r_iops, Bound::Disks), (net_mbps / op_mb, Bound::Network)]);
    let transfer_us = SMALL_OP_BYTES / link_mbps(c);
    let avg_write_lat = sum(|d| d.write_lat_us) / osds;
    let avg_read_lat = sum(|d| d.read_lat_us) / osds;
    // Client → primary, primary → every other slot in parallel; an EC
    // write first reads the old bytes from their data shard.
    let hop = c.rtt_us + transfer_us;
    let write_lat_us = match c.scheme {
        Scheme::Replicas(1) => hop + avg_write_lat + SOFTWARE_US,
        Scheme::Replicas(_) => 2.0 * hop + avg_write_lat + SOFTWARE_US,
        Scheme::Ec { .. } => 3.0 * hop + avg_read_lat + avg_write_lat + SOFTWARE_US,
    };
    // Replicated: the primary answers; EC: the client reads the shard
    // holding the bytes directly.
    let read_lat_us = hop + avg_read_lat + SOFTWARE_US;
    Speed {
        write_mbps,
        read_mbps,
        write_iops,
        read_iops,
        write_lat_us,
        read_lat_us,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Capacity {
    pub raw_tb: f64,
    /// Raw bytes the failure domains let PGs use: a PG puts at most one
    /// slot in a domain, so a domain holding more than 1/width of the raw
    /// capacity cannot be filled.
    pub placeable_raw_tb: f64,
    /// What clients can store: placeable × the scheme's efficiency.
    pub usable_tb: f64,
}

pub fn capacity(c: &Cluster) -> Capacity {
    let domains: Vec<f64> = match c.domain {
        FailureDomain::Host => (c.hosts.iter())
            .map(|h| h.iter().map(|d| d.size_tb).sum())
            .collect(),
        FailureDomain::Osd => c.disks().map(|d| d.size_tb).collect(),
    };
    let raw: f64 = domains.iter().sum();
    let width = f64::from(c.scheme.width());
    // The largest total t of slot bytes with every domain holding at most
    // t / width: Σ min(cap, t / width) ≥ t. The left side minus t is
    // concave in t and 0 at t = 0, so bisection finds its last root.
    let fits = |t: f64| domains.iter().map(|&d| d.min(t / width)).sum::<f64>() >= t * (1.0 - 1e-12);
    let (mut lo, mut hi) = (0.0, raw);
    if !fits(raw) {
        for _ in 0..200 {
            let mid = (lo + hi) / 2.0;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        hi = lo;
    }
    Capacity {
        raw_tb: raw,
        placeable_raw_tb: hi,
        usable_tb: hi * c.scheme.efficiency(),
    }
}

/// How long data stays with one redundancy fewer after a failure: the
/// out delay, then the lost bytes rebuilt elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Recovery {
    /// Bytes to rebuild, TB.
    pub lost_tb: f64,
    pub par: Parallel,
    /// Rebuild rate, MB/s, and what limits it.
    pub rate_mbps: Limited,
    /// Out delay + rebuild, seconds.
    pub window_s: f64,
}

/// PGs of the pool per OSD (slots, counting every replica or shard).
pub fn pgs_per_osd(c: &Cluster) -> f64 {
    f64::from(c.pgs) * f64::from(c.scheme.width()) / c.osds() as f64
}

/// How many OSDs take part in rebuilding what a failure lost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Parallel {
    /// PGs that lost a slot.
    pub pgs: f64,
    /// Distinct primaries of those PGs: each paces its PGs' recovery at
    /// the OSD's recovery rate.
    pub primaries: f64,
    /// Distinct OSDs the lost slots move to.
    pub targets: f64,
}

impl Parallel {
    /// PGs spread evenly at random: every PG that lost a slot has its own
    /// primary and target while there are OSDs enough.
    pub fn even(c: &Cluster, lost_disks: usize) -> Parallel {
        let pgs = pgs_per_osd(c) * lost_disks as f64;
        let others = c.osds() as f64 - lost_disks as f64;
        let domains_left = match c.domain {
            FailureDomain::Host if c.hosts.iter().any(|h| h.len() == lost_disks) => {
                c.hosts.len() as f64 - 1.0
            }
            FailureDomain::Host => c.hosts.len() as f64,
            FailureDomain::Osd => others,
        };
        if domains_left < f64::from(c.scheme.width()) {
            return Parallel {
                pgs: 0.0,
                primaries: 0.0,
                targets: 0.0,
            };
        }
        let spread = |n: f64| others * -(-n / others).exp_m1();
        Parallel {
            pgs,
            primaries: spread(pgs),
            targets: spread(pgs),
        }
    }
}

/// Rebuilding `lost_disks` disks of host `host` at once (one disk, or the
/// whole host), with `par` OSDs taking part.
pub fn recovery(c: &Cluster, host: usize, lost_disks: usize, par: Parallel) -> Recovery {
    let disks = &c.hosts[host][..lost_disks];
    let lost_tb: f64 = disks.iter().map(|d| d.size_tb * c.fill).sum();
    let osds = c.osds() as f64;
    let hosts_left = if lost_disks == c.hosts[host].len() {
        c.hosts.len() as f64 - 1.0
    } else {
        c.hosts.len() as f64
    };
    // Bytes read, and sent over the network, per byte rebuilt.
    let amplification = match c.scheme {
        Scheme::Replicas(_) => 1.0,
        Scheme::Ec { k, .. } => f64::from(k),
    };
    let avg = |f: fn(&crate::desc::DiskFigures) -> f64| c.disks().map(f).sum::<f64>() / osds;
    if par.targets == 0.0 {
        return Recovery {
            lost_tb,
            par,
            rate_mbps: Limited {
                value: 0.0,
                bound: Bound::NoRoom,
            },
            window_s: c.host_repair_hours * 3600.0,
        };
    }
    let primaries = par.primaries.max(1.0);
    let targets = par.targets;
    let rate_mbps = least(&[
        (primaries * c.recovery_mbps_per_osd, Bound::RecoveryRate),
        (targets * avg(|d| d.write_mbps), Bound::Disks),
        (
            primaries * avg(|d| d.read_mbps) / amplification,
            Bound::Disks,
        ),
        (
            hosts_left.max(1.0) * link_mbps(c) / amplification,
            Bound::Network,
        ),
    ]);
    let window_s = c.out_delay_min * 60.0 + lost_tb * 1e6 / rate_mbps.value;
    Recovery {
        lost_tb,
        par,
        rate_mbps,
        window_s,
    }
}
