//! The description of a cluster that `nacre plan` reads (TOML), its
//! validation, and the typical figures of each kind of disk that fill in
//! what the description leaves out.
//!
//! Units follow data sheets, and every name carries its unit: disk sizes
//! in TB (10^12 bytes), bandwidth in MB/s (10^6 bytes per second),
//! networks in Gbit/s, latencies in µs, failure rates as the fraction
//! failing per year (AFR).

use serde::{Deserialize, Serialize};

use crate::PlanError;

/// A cluster as planned: groups of identical hosts, the network, the pool
/// and what fails how often.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    pub hosts: Vec<HostGroup>,
    pub network: Network,
    pub pool: PoolScheme,
    #[serde(default)]
    pub failures: Failures,
}

/// `count` hosts with `disks` disks each, all alike (one OSD per disk).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostGroup {
    pub count: u32,
    pub disks: u32,
    pub disk: Disk,
}

/// One disk: its kind fills in any figure not given.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    pub kind: Option<DiskKind>,
    pub size_tb: f64,
    /// 4 KiB random reads per second at a deep queue (QD128).
    pub read_iops: Option<f64>,
    /// 4 KiB random writes per second at a deep queue, each durable (the
    /// store commits them in groups: one flush for many).
    pub write_iops: Option<f64>,
    /// Linear 4 MiB reads.
    pub read_mbps: Option<f64>,
    /// Linear 4 MiB writes.
    pub write_mbps: Option<f64>,
    /// A 4 KiB read at QD1.
    pub read_lat_us: Option<f64>,
    /// A durable 4 KiB write at QD1 (with fsync, or O_SYNC: the worse;
    /// `nacre disk check` measures it).
    pub write_lat_us: Option<f64>,
    /// Fraction of such disks failing per year.
    pub afr: Option<f64>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DiskKind {
    /// Data-centre NVMe with power-loss protection.
    Nvme,
    /// Data-centre SATA/SAS SSD with power-loss protection.
    Ssd,
    /// SSD without power-loss protection: every durable write waits for
    /// its flash program.
    DesktopSsd,
    /// 7 200 rpm hard disk, write cache off.
    Hdd,
}

/// A disk with every figure known.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DiskFigures {
    pub size_tb: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_mbps: f64,
    pub write_mbps: f64,
    pub read_lat_us: f64,
    pub write_lat_us: f64,
    pub afr: f64,
}

impl DiskKind {
    /// Typical data-sheet figures (the size is always given).
    pub fn typical(self) -> DiskFigures {
        let (read_iops, write_iops, read_mbps, write_mbps, read_lat_us, write_lat_us, afr) =
            match self {
                DiskKind::Nvme => (500_000.0, 150_000.0, 3_000.0, 2_000.0, 80.0, 30.0, 0.01),
                DiskKind::Ssd => (90_000.0, 30_000.0, 530.0, 480.0, 120.0, 60.0, 0.01),
                DiskKind::DesktopSsd => (90_000.0, 20_000.0, 530.0, 480.0, 120.0, 1_500.0, 0.015),
                DiskKind::Hdd => (200.0, 200.0, 200.0, 200.0, 8_000.0, 8_000.0, 0.02),
            };
        DiskFigures {
            size_tb: 0.0,
            read_iops,
            write_iops,
            read_mbps,
            write_mbps,
            read_lat_us,
            write_lat_us,
            afr,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// Each host's link, Gbit/s (full duplex).
    pub gbps: f64,
    /// Round trip of a 4 KiB message between two hosts (`nacre net bench`
    /// measures it); 50 µs if not given (a 10G network).
    pub rtt_us: Option<f64>,
}

/// The pool: `replicas = 3`, or `ec = "4+2"`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolScheme {
    pub replicas: Option<u8>,
    pub ec: Option<String>,
    /// `host` (the default) or `osd`.
    pub failure_domain: Option<FailureDomain>,
    /// The pool's PG count; by default 100 per OSD.
    pub pgs: Option<u32>,
    /// How full the disks are when one fails (what recovery must copy);
    /// 0.7 by default.
    pub fill: Option<f64>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FailureDomain {
    Osd,
    Host,
}

/// What fails, and how fast the cluster reacts.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Failures {
    /// Overrides every disk's AFR.
    pub disk_afr: Option<f64>,
    /// Fraction of hosts failing per year in a way that takes their disks
    /// until their data is rebuilt elsewhere (a failed host is treated as
    /// lost, which most are not: an upper bound).
    pub host_afr: f64,
    /// How long an OSD is down before it is marked out and recovery
    /// starts (`nacre mon --out-delay`).
    pub out_delay_min: f64,
    /// Recovery bandwidth each OSD gives (`--recovery-rate`), MB/s.
    pub recovery_mbps_per_osd: f64,
    /// How long a failed host takes to come back when the cluster cannot
    /// rebuild its data elsewhere (fewer failure domains left than a PG's
    /// width, e.g. 3 replicas on 3 hosts), hours.
    pub host_repair_hours: f64,
}

impl Default for Failures {
    fn default() -> Self {
        Failures {
            disk_afr: None,
            host_afr: 0.02,
            out_delay_min: 10.0,
            // Nacre's default recovery rate, 100 MiB/s.
            recovery_mbps_per_osd: 104.857_6,
            host_repair_hours: 48.0,
        }
    }
}

/// The pool's shape: `n` slots per PG, of which any `n - tolerates` keep
/// the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Scheme {
    Replicas(u8),
    Ec { k: u8, m: u8 },
}

impl Scheme {
    pub fn width(self) -> u32 {
        match self {
            Scheme::Replicas(r) => u32::from(r),
            Scheme::Ec { k, m } => u32::from(k) + u32::from(m),
        }
    }

    /// Slots a PG can lose and keep its data.
    pub fn tolerates(self) -> u32 {
        match self {
            Scheme::Replicas(r) => u32::from(r) - 1,
            Scheme::Ec { m, .. } => u32::from(m),
        }
    }

    /// Usable bytes per raw byte.
    pub fn efficiency(self) -> f64 {
        match self {
            Scheme::Replicas(r) => 1.0 / f64::from(r),
            Scheme::Ec { k, m } => f64::from(k) / (f64::from(k) + f64::from(m)),
        }
    }

    pub fn label(self) -> String {
        match self {
            Scheme::Replicas(r) => format!("{r} replicas"),
            Scheme::Ec { k, m } => format!("EC {k}+{m}"),
        }
    }
}

/// Most hosts, disks per host, OSDs, groups of hosts and PGs (and PG
/// slots) a description may ask for: the planner places the PGs several
/// times, so these bound its time and memory (seconds, a few hundred MB).
pub const HOSTS_MAX: u64 = 10_000;
pub const DISKS_PER_HOST_MAX: u32 = 1_000;
pub const OSDS_MAX: u64 = 100_000;
pub const GROUPS_MAX: usize = 64;
pub const PGS_MAX: u32 = 4_000_000;
pub const SLOTS_MAX: u64 = 4_000_000;

/// A description with every figure known and checked.
#[derive(Clone, Debug, Serialize)]
pub struct Cluster {
    /// Per host: its disks.
    pub hosts: Vec<Vec<DiskFigures>>,
    /// Per host: the index of its `[[hosts]]` group (hosts of a group are
    /// alike).
    pub group: Vec<usize>,
    pub network_gbps: f64,
    pub rtt_us: f64,
    pub scheme: Scheme,
    pub domain: FailureDomain,
    pub pgs: u32,
    pub fill: f64,
    pub host_afr: f64,
    pub out_delay_min: f64,
    pub recovery_mbps_per_osd: f64,
    pub host_repair_hours: f64,
}

impl Cluster {
    pub fn osds(&self) -> u64 {
        self.hosts.iter().map(|h| h.len() as u64).sum()
    }

    pub fn disks(&self) -> impl Iterator<Item = &DiskFigures> {
        self.hosts.iter().flatten()
    }
}

fn invalid(what: String) -> PlanError {
    PlanError::Invalid(what)
}

/// `x` must be finite and within `lo..=hi` (a lower bound of 0 excludes 0
/// when `open_lo`).
fn check(name: &str, x: f64, lo: f64, hi: f64, open_lo: bool) -> Result<f64, PlanError> {
    let low_ok = if open_lo { x > lo } else { x >= lo };
    if !x.is_finite() || !low_ok || x > hi {
        let bound = if open_lo { "above" } else { "at least" };
        return Err(invalid(format!(
            "{name} = {x}: must be {bound} {lo} and at most {hi}"
        )));
    }
    Ok(x)
}

fn parse_ec(s: &str) -> Result<Scheme, PlanError> {
    let bad = || invalid(format!("pool.ec = {s:?}: give k+m, e.g. \"4+2\""));
    let (k, m) = s.trim().split_once('+').ok_or_else(bad)?;
    let k: u8 = k.trim().parse().map_err(|_| bad())?;
    let m: u8 = m.trim().parse().map_err(|_| bad())?;
    // What the OSDs support (crates/ec).
    if !(2..=16).contains(&k) || !(1..=4).contains(&m) {
        return Err(invalid(format!(
            "pool.ec = {s:?}: k must be 2 to 16 and m 1 to 4"
        )));
    }
    Ok(Scheme::Ec { k, m })
}

impl Disk {
    fn resolve(&self, group: usize, disk_afr: Option<f64>) -> Result<DiskFigures, PlanError> {
        let at = |f: &str| format!("hosts[{group}].disk.{f}");
        let typical = self.kind.map(DiskKind::typical);
        let pick = |f: &str, given: Option<f64>, t: Option<f64>| {
            given.or(t).ok_or_else(|| {
                invalid(format!(
                    "{} is not given: give it, or the disk's kind (nvme, ssd, desktop-ssd, hdd) for a typical figure",
                    at(f)
                ))
            })
        };
        let t = |f: fn(&DiskFigures) -> f64| typical.as_ref().map(f);
        let d = DiskFigures {
            size_tb: check(&at("size_tb"), self.size_tb, 0.0, 1_000.0, true)?,
            read_iops: pick("read_iops", self.read_iops, t(|d| d.read_iops))?,
            write_iops: pick("write_iops", self.write_iops, t(|d| d.write_iops))?,
            read_mbps: pick("read_mbps", self.read_mbps, t(|d| d.read_mbps))?,
            write_mbps: pick("write_mbps", self.write_mbps, t(|d| d.write_mbps))?,
            read_lat_us: pick("read_lat_us", self.read_lat_us, t(|d| d.read_lat_us))?,
            write_lat_us: pick("write_lat_us", self.write_lat_us, t(|d| d.write_lat_us))?,
            afr: pick("afr", disk_afr.or(self.afr), t(|d| d.afr))?,
        };
        check(&at("read_iops"), d.read_iops, 0.0, 1e8, true)?;
        check(&at("write_iops"), d.write_iops, 0.0, 1e8, true)?;
        check(&at("read_mbps"), d.read_mbps, 0.0, 1e6, true)?;
        check(&at("write_mbps"), d.write_mbps, 0.0, 1e6, true)?;
        check(&at("read_lat_us"), d.read_lat_us, 0.0, 1e7, true)?;
        check(&at("write_lat_us"), d.write_lat_us, 0.0, 1e7, true)?;
        check(&at("afr"), d.afr, 0.0, 10.0, false)?;
        Ok(d)
    }
}

impl Description {
    pub fn parse(text: &str) -> Result<Description, PlanError> {
        toml::from_str(text).map_err(|e| invalid(e.to_string()))
    }

    /// Every figure filled in and checked against its range.
    pub fn resolve(&self) -> Result<Cluster, PlanError> {
        let f = &self.failures;
        if let Some(a) = f.disk_afr {
            check("failures.disk_afr", a, 0.0, 10.0, false)?;
        }
        if self.hosts.is_empty() || self.hosts.len() > GROUPS_MAX {
            return Err(invalid(format!(
                "{} [[hosts]] groups: give 1 to {GROUPS_MAX}",
                self.hosts.len()
            )));
        }
        let osd_count: u64 = (self.hosts.iter())
            .map(|g| u64::from(g.count) * u64::from(g.disks))
            .sum();
        if osd_count > OSDS_MAX {
            return Err(invalid(format!(
                "{osd_count} OSDs: the planner takes at most {OSDS_MAX}"
            )));
        }
        let host_count: u64 = self.hosts.iter().map(|g| u64::from(g.count)).sum();
        if host_count > HOSTS_MAX {
            return Err(invalid(format!(
                "{host_count} hosts: the planner takes at most {HOSTS_MAX}"
            )));
        }
        let mut hosts = Vec::new();
        let mut group = Vec::new();
        for (i, g) in self.hosts.iter().enumerate() {
            if g.count == 0 || g.disks == 0 || g.disks > DISKS_PER_HOST_MAX {
                return Err(invalid(format!(
                    "hosts[{i}]: count must be at least 1 and disks 1 to {DISKS_PER_HOST_MAX}"
                )));
            }
            let d = g.disk.resolve(i, f.disk_afr)?;
            for _ in 0..g.count {
                hosts.push(vec![d; g.disks as usize]);
                group.push(i);
            }
        }
        let scheme = match (self.pool.replicas, &self.pool.ec) {
            (Some(r), None) if (1..=16).contains(&r) => Scheme::Replicas(r),
            (Some(r), None) => {
                return Err(invalid(format!("pool.replicas = {r}: give 1 to 16")));
            }
            (None, Some(ec)) => parse_ec(ec)?,
            _ => {
                return Err(invalid(
                    "[pool]: give either replicas = N or ec = \"k+m\"".into(),
                ))
            }
        };
        let domain = self.pool.failure_domain.unwrap_or(FailureDomain::Host);
        let width = u64::from(scheme.width());
        let osds: u64 = hosts.iter().map(|h| h.len() as u64).sum();
        let domains = match domain {
            FailureDomain::Host => hosts.len() as u64,
            FailureDomain::Osd => osds,
        };
        if domains < width {
            return Err(invalid(format!(
                "{} needs {width} failure domains ({domain:?}s); the cluster has {domains}",
                scheme.label()
            )));
        }
        let pgs = match self.pool.pgs {
            Some(p) if (1..=PGS_MAX).contains(&p) => p,
            Some(p) => return Err(invalid(format!("pool.pgs = {p}: give 1 to {PGS_MAX}"))),
            None => (osds * 100 / width).clamp(1, SLOTS_MAX / width) as u32,
        };
        if u64::from(pgs) * width > SLOTS_MAX {
            return Err(invalid(format!(
                "{pgs} PGs of {width} slots: the planner takes at most {SLOTS_MAX} slots"
            )));
        }
        let gbps = check("network.gbps", self.network.gbps, 0.0, 10_000.0, true)?;
        let rtt_us = self.network.rtt_us.unwrap_or(50.0);
        check("network.rtt_us", rtt_us, 0.0, 1e7, true)?;
        let fill = self.pool.fill.unwrap_or(0.7);
        check("pool.fill", fill, 0.0, 1.0, true)?;
        Ok(Cluster {
            hosts,
            group,
            network_gbps: gbps,
            rtt_us,
            scheme,
            domain,
            pgs,
            fill,
            host_afr: check("failures.host_afr", f.host_afr, 0.0, 10.0, false)?,
            out_delay_min: check("failures.out_delay_min", f.out_delay_min, 0.0, 1e6, false)?,
            recovery_mbps_per_osd: check(
                "failures.recovery_mbps_per_osd",
                f.recovery_mbps_per_osd,
                0.0,
                1e6,
                true,
            )?,
            host_repair_hours: check(
                "failures.host_repair_hours",
                f.host_repair_hours,
                0.0,
                1e6,
                true,
            )?,
        })
    }
}

impl Description {
    /// The description as TOML that [`Description::parse`] reads back
    /// (`nacre plan --from-cluster` prints it to keep and edit).
    pub fn to_toml(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let opt = |s: &mut String, name: &str, v: Option<f64>| {
            if let Some(v) = v {
                let _ = write!(s, ", {name} = {v:?}");
            }
        };
        for g in &self.hosts {
            let d = &g.disk;
            let _ = write!(
                s,
                "[[hosts]]\ncount = {}\ndisks = {}\ndisk = {{ ",
                g.count, g.disks
            );
            if let Some(k) = d.kind {
                let name = match k {
                    DiskKind::Nvme => "nvme",
                    DiskKind::Ssd => "ssd",
                    DiskKind::DesktopSsd => "desktop-ssd",
                    DiskKind::Hdd => "hdd",
                };
                let _ = write!(s, "kind = \"{name}\", ");
            }
            let _ = write!(s, "size_tb = {:?}", d.size_tb);
            opt(&mut s, "read_iops", d.read_iops);
            opt(&mut s, "write_iops", d.write_iops);
            opt(&mut s, "read_mbps", d.read_mbps);
            opt(&mut s, "write_mbps", d.write_mbps);
            opt(&mut s, "read_lat_us", d.read_lat_us);
            opt(&mut s, "write_lat_us", d.write_lat_us);
            opt(&mut s, "afr", d.afr);
            s.push_str(" }\n\n");
        }
        let _ = write!(s, "[network]\ngbps = {:?}\n", self.network.gbps);
        if let Some(r) = self.network.rtt_us {
            let _ = writeln!(s, "rtt_us = {r:?}");
        }
        let p = &self.pool;
        s.push_str("\n[pool]\n");
        if let Some(r) = p.replicas {
            let _ = writeln!(s, "replicas = {r}");
        }
        if let Some(ec) = &p.ec {
            let _ = writeln!(s, "ec = {ec:?}");
        }
        if let Some(f) = p.failure_domain {
            let f = match f {
                FailureDomain::Osd => "osd",
                FailureDomain::Host => "host",
            };
            let _ = writeln!(s, "failure_domain = \"{f}\"");
        }
        if let Some(n) = p.pgs {
            let _ = writeln!(s, "pgs = {n}");
        }
        if let Some(f) = p.fill {
            let _ = writeln!(s, "fill = {f:?}");
        }
        let f = &self.failures;
        s.push_str("\n[failures]\n");
        if let Some(a) = f.disk_afr {
            let _ = writeln!(s, "disk_afr = {a:?}");
        }
        let _ = write!(
            s,
            "host_afr = {:?}\nout_delay_min = {:?}\nrecovery_mbps_per_osd = {:?}\nhost_repair_hours = {:?}\n",
            f.host_afr, f.out_delay_min, f.recovery_mbps_per_osd, f.host_repair_hours
        );
        s
    }
}

/// A description to start from (`nacre plan --example`).
pub const EXAMPLE: &str = r#"# A cluster for `nacre plan`. Units: TB (10^12 bytes), MB/s, Gbit/s, µs;
# afr = fraction failing per year. A disk's `kind` (nvme, ssd, desktop-ssd,
# hdd) fills in any figure left out; `nacre disk check` measures them.

[[hosts]]
count = 4
disks = 6
disk = { kind = "ssd", size_tb = 3.84 }

# [[hosts]]            # more groups of hosts, each alike within
# count = 2
# disks = 10
# disk = { kind = "hdd", size_tb = 16, write_lat_us = 9000 }

[network]
gbps = 10
rtt_us = 50              # 4 KiB round trip (`nacre net bench`)

[pool]
replicas = 3             # or: ec = "4+2"
failure_domain = "host"  # or "osd"
# pgs = 800              # default: 100 per OSD
fill = 0.7               # how full disks are when one fails

[failures]
host_afr = 0.02
out_delay_min = 10       # down this long before recovery starts
recovery_mbps_per_osd = 104.9
host_repair_hours = 48   # a host's return, where its data cannot move
"#;
