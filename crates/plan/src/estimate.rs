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
    /// Too few failure domains, or too little free space, left to rebuild
    /// anywhere: the data waits for the failed host's return.
    NoRoom,
    /// The failed OSD held no PG.
    NothingLost,
    /// One copy per PG: nothing is left to rebuild from.
    NoCopyLeft,
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

/// The expected largest of `n` disks' figure `f`, disks drawn by
/// capacity (as placement fills them): Σ x · (F(x)^n − F(x⁻)^n).
fn expected_max(c: &Cluster, n: i32, f: fn(&crate::desc::DiskFigures) -> f64) -> f64 {
    let mut v: Vec<(f64, f64)> = c.disks().map(|d| (f(d), d.size_tb)).collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = v.iter().map(|x| x.1).sum();
    let (mut below, mut e) = (0.0, 0.0);
    for (x, w) in v {
        let upto = below + w / total;
        e += x * (upto.powi(n) - below.powi(n));
        below = upto;
    }
    e
}

pub fn speed(c: &Cluster) -> Speed {
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
    // A small EC write (docs/internals/ec.md): the primary reads the old
    // bytes; the data shard keeps them as its undo and writes the new;
    // each parity shard reads its old units and XORs the delta in; the
    // other data shards log the version: m + 2 reads, k + m writes.
    let (disk_write_iops, small_write_net) = match c.scheme {
        Scheme::Replicas(r) => (w_iops / f64::from(r), f64::from(r)),
        Scheme::Ec { k, m } => {
            let (reads, writes) = (f64::from(m) + 2.0, f64::from(k) + f64::from(m));
            (
                1.0 / (writes / w_iops + reads / r_iops),
                2.0 + f64::from(m) + 1.0,
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
    // A write waits for the slowest of the slots it writes (expected over
    // OSD sets drawn by capacity); a read for one disk.
    let width = c.scheme.width() as i32;
    let touched = match c.scheme {
        Scheme::Replicas(_) => width,
        Scheme::Ec { m, .. } => i32::from(m) + 1,
    };
    let write_lat = expected_max(c, touched, |d| d.write_lat_us);
    let read_lat = expected_max(c, 1, |d| d.read_lat_us);
    // Client → primary, primary → every other slot in parallel; an EC
    // write first reads the old bytes from their data shard, and its
    // parity shards read their old units before writing.
    let hop = c.rtt_us + transfer_us;
    let write_lat_us = match c.scheme {
        Scheme::Replicas(1) => hop + write_lat + SOFTWARE_US,
        Scheme::Replicas(_) => 2.0 * hop + write_lat + SOFTWARE_US,
        Scheme::Ec { .. } => {
            3.0 * hop
                + read_lat
                + expected_max(c, touched, |d| d.read_lat_us)
                + write_lat
                + SOFTWARE_US
        }
    };
    // Replicated: the primary answers; EC: the client reads the shard
    // holding the bytes directly.
    let read_lat_us = hop + read_lat + SOFTWARE_US;
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
    /// Raw bytes PGs can use: a PG puts at most one slot in a domain, so
    /// a domain holding more than 1/width of the raw capacity cannot be
    /// filled; and on the table, the OSD with the most slots per TB fills
    /// first.
    pub placeable_raw_tb: f64,
    /// What clients can store: placeable × the scheme's efficiency.
    pub usable_tb: f64,
}

pub fn capacity(c: &Cluster, table: &crate::table::PgTable) -> Capacity {
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
    // The table's fullest OSD (most slots per TB) fills first.
    let counts = table.counts(c.osds() as usize);
    let sizes: Vec<f64> = c.disks().map(|d| d.size_tb).collect();
    let per_slot = (0..sizes.len())
        .filter(|&o| counts[o] > 0)
        .map(|o| sizes[o] / counts[o] as f64)
        .fold(f64::INFINITY, f64::min);
    let hi = hi.min(per_slot * table.rows.len() as f64);
    Capacity {
        raw_tb: raw,
        placeable_raw_tb: hi,
        usable_tb: hi * c.scheme.efficiency(),
    }
}

/// How long data stays with one redundancy fewer after a failure: the
/// out delay, then the lost bytes rebuilt elsewhere by the busiest
/// participant's pace.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Recovery {
    /// Bytes to rebuild, TB.
    pub lost_tb: f64,
    /// PGs that lost a slot; distinct primaries pacing them, OSDs read
    /// from, OSDs written to.
    pub pgs: u64,
    pub primaries: u64,
    pub sources: u64,
    pub targets: u64,
    /// Rebuild rate (lost bytes over the rebuild time), MB/s, and what
    /// limits it.
    pub rate_mbps: Limited,
    /// Out delay + rebuild, seconds.
    pub window_s: f64,
}

/// Nacre's default full ratio: an OSD fuller refuses recovery's writes.
pub const FULL_RATIO: f64 = 0.95;

/// PGs of the pool per OSD (slots, counting every replica or shard).
pub fn pgs_per_osd(c: &Cluster) -> f64 {
    f64::from(c.pgs) * f64::from(c.scheme.width()) / c.osds() as f64
}

/// The recovery of `lost` OSDs (`lost_raw_tb` of raw capacity) given the
/// work the table asks of each participant (None: too few failure domains
/// left to rebuild anywhere).
pub fn recovery(c: &Cluster, lost_raw_tb: f64, work: Option<&crate::table::Work>) -> Recovery {
    let raw: f64 = c.disks().map(|d| d.size_tb).sum();
    let lost_tb = lost_raw_tb * c.fill;
    let stuck = |bound: Bound, window_s: f64| Recovery {
        lost_tb,
        pgs: work.map_or(0, |w| w.pgs),
        primaries: 0,
        sources: 0,
        targets: 0,
        rate_mbps: Limited { value: 0.0, bound },
        window_s,
    };
    if c.scheme.tolerates() == 0 {
        return stuck(Bound::NoCopyLeft, c.out_delay_min * 60.0);
    }
    let Some(w) = work else {
        return stuck(Bound::NoRoom, c.host_repair_hours * 3600.0);
    };
    if w.pgs == 0 {
        return stuck(Bound::NothingLost, 0.0);
    }
    // The survivors must hold the rebuilt bytes under the full ratio.
    if raw * c.fill > (raw - lost_raw_tb) * FULL_RATIO {
        return stuck(Bound::NoRoom, c.host_repair_hours * 3600.0);
    }
    let (time_s, bound) = [
        (w.primary_s, Bound::RecoveryRate),
        (w.source_s.max(w.target_s), Bound::Disks),
        (w.network_s, Bound::Network),
    ]
    .into_iter()
    .fold(
        (0.0, Bound::RecoveryRate),
        |a, b| if b.0 > a.0 { b } else { a },
    );
    Recovery {
        lost_tb: w.lost_tb,
        pgs: w.pgs,
        primaries: w.primaries,
        sources: w.sources,
        targets: w.targets,
        rate_mbps: Limited {
            value: w.lost_tb * 1e6 / time_s.max(1e-9),
            bound,
        },
        window_s: c.out_delay_min * 60.0 + time_s,
    }
}
