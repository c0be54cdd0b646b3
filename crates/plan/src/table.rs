//! PG tables of a planned cluster, and what rebuilding a failure costs
//! each OSD and host on them.
//!
//! Two kinds: Nacre's own (`nacre-placement`, as the leader makes it: a
//! fresh table, the table without a failed disk or host, and after it
//! returns), and an even random spread (as CRUSH spreads PGs: each PG on
//! `width` failure domains drawn at random, weighted by capacity; a lost
//! slot moves to a random allowed OSD). OSDs are numbered host by host.

use std::collections::HashSet;

use crate::desc::{Cluster, FailureDomain, Scheme};
use crate::PlanError;

/// PG rows of `width` OSD ids, and each PG's primary.
#[derive(Clone, Debug)]
pub struct PgTable {
    pub width: usize,
    pub rows: Vec<u32>,
    pub primary: Vec<u32>,
    /// Nacre's table behind the rows (None for a random one).
    nacre: Option<nacre_placement::Table>,
}

/// Where every OSD is.
#[derive(Clone, Debug)]
pub struct Osds {
    pub host: Vec<u32>,
    pub size_tb: Vec<f64>,
    pub read_mbps: Vec<f64>,
    pub write_mbps: Vec<f64>,
}

impl Osds {
    pub fn of(c: &Cluster) -> Osds {
        let mut o = Osds {
            host: Vec::new(),
            size_tb: Vec::new(),
            read_mbps: Vec::new(),
            write_mbps: Vec::new(),
        };
        for (h, disks) in c.hosts.iter().enumerate() {
            for d in disks {
                o.host.push(h as u32);
                o.size_tb.push(d.size_tb);
                o.read_mbps.push(d.read_mbps);
                o.write_mbps.push(d.write_mbps);
            }
        }
        o
    }

    /// The ids of host `h`'s OSDs.
    pub fn of_host(&self, h: usize) -> Vec<u32> {
        (0..self.host.len() as u32)
            .filter(|&o| self.host[o as usize] == h as u32)
            .collect()
    }
}

fn placement_osds(c: &Cluster, down: &[bool]) -> Vec<nacre_placement::Osd> {
    let osds = Osds::of(c);
    (0..osds.host.len())
        .map(|i| nacre_placement::Osd {
            id: i as u32,
            host: osds.host[i],
            rack: osds.host[i],
            weight: (osds.size_tb[i] * 1000.0).round().max(1.0) as u32,
            up: !down[i],
        })
        .collect()
}

fn placement_pool(c: &Cluster) -> nacre_placement::Pool {
    nacre_placement::Pool {
        pgs: c.pgs,
        size: c.scheme.width() as u8,
        domain: match c.domain {
            FailureDomain::Host => nacre_placement::FailureDomain::Host,
            FailureDomain::Osd => nacre_placement::FailureDomain::Osd,
        },
        positional: matches!(c.scheme, Scheme::Ec { .. }),
    }
}

impl PgTable {
    /// A table from its rows (primaries: each row's first OSD).
    pub fn from_rows(width: usize, rows: Vec<u32>) -> PgTable {
        let primary = rows.chunks(width).map(|r| r[0]).collect();
        PgTable {
            width,
            rows,
            primary,
            nacre: None,
        }
    }

    fn of_nacre(t: nacre_placement::Table) -> PgTable {
        PgTable {
            width: usize::from(t.size),
            rows: t.osds.clone(),
            primary: (0..t.pgs()).map(|pg| t.primary(pg)).collect(),
            nacre: Some(t),
        }
    }

    pub fn pgs(&self) -> usize {
        self.primary.len()
    }

    pub fn row(&self, pg: usize) -> &[u32] {
        &self.rows[pg * self.width..(pg + 1) * self.width]
    }

    /// Nacre's fresh table for `c`.
    pub fn nacre(c: &Cluster) -> Result<PgTable, PlanError> {
        let osds = placement_osds(c, &vec![false; c.osds() as usize]);
        nacre_placement::place(&osds, &placement_pool(c), None)
            .map(PgTable::of_nacre)
            .map_err(|e| PlanError::Invalid(format!("placement: {e}")))
    }

    /// An even random spread over `c` (seeded).
    pub fn random(c: &Cluster, seed: u64) -> PgTable {
        let osds = Osds::of(c);
        let mut rng = nacre_types::SplitMix(seed);
        let width = c.scheme.width() as usize;
        let mut rows = Vec::with_capacity(c.pgs as usize * width);
        let down = vec![false; osds.host.len()];
        let sampler = Sampler::of(&osds);
        for _ in 0..c.pgs {
            let mut row: Vec<u32> = Vec::with_capacity(width);
            for _ in 0..width {
                let o = pick(&osds, &sampler, c.domain, &row, &down, &mut rng)
                    .expect("resolve checked there are domains enough");
                row.push(o);
            }
            rows.extend(row);
        }
        PgTable::from_rows(width, rows)
    }

    /// The table once `lost` OSDs are out, or None when too few failure
    /// domains are left to hold every PG's slots apart.
    pub fn without(
        &self,
        c: &Cluster,
        lost: &[u32],
        seed: u64,
    ) -> Result<Option<PgTable>, PlanError> {
        let mut down = vec![false; c.osds() as usize];
        for &o in lost {
            down[o as usize] = true;
        }
        if let Some(t) = &self.nacre {
            let osds = placement_osds(c, &down);
            return match nacre_placement::place(&osds, &placement_pool(c), Some(t)) {
                Ok(t) => Ok(Some(PgTable::of_nacre(t))),
                Err(nacre_placement::PlacementError::TooFewDomains { .. }) => Ok(None),
                Err(e) => Err(PlanError::Invalid(format!("placement: {e}"))),
            };
        }
        let osds = Osds::of(c);
        let sampler = Sampler::of(&osds);
        let mut rng = nacre_types::SplitMix(seed);
        let mut rows = self.rows.clone();
        let mut primary = self.primary.clone();
        for pg in 0..self.pgs() {
            let row = &mut rows[pg * self.width..(pg + 1) * self.width];
            if !row.iter().any(|&o| down[o as usize]) {
                continue;
            }
            for s in 0..self.width {
                if down[row[s] as usize] {
                    let others: Vec<u32> = (0..self.width)
                        .filter(|&i| i != s && !down[row[i] as usize])
                        .map(|i| row[i])
                        .collect();
                    match pick(&osds, &sampler, c.domain, &others, &down, &mut rng) {
                        Some(o) => row[s] = o,
                        None => return Ok(None),
                    }
                }
            }
            // The first member that stayed leads.
            if down[primary[pg] as usize] {
                let old = &self.rows[pg * self.width..(pg + 1) * self.width];
                primary[pg] = *old.iter().find(|&&o| !down[o as usize]).unwrap_or(&row[0]);
            }
        }
        Ok(Some(PgTable {
            width: self.width,
            rows,
            primary,
            nacre: None,
        }))
    }

    /// Nacre's table once every OSD is back (from this one, as the leader
    /// does); a random table stays as it is.
    pub fn returned(&self, c: &Cluster) -> Result<PgTable, PlanError> {
        match &self.nacre {
            Some(t) => {
                let osds = placement_osds(c, &vec![false; c.osds() as usize]);
                nacre_placement::place(&osds, &placement_pool(c), Some(t))
                    .map(PgTable::of_nacre)
                    .map_err(|e| PlanError::Invalid(format!("placement: {e}")))
            }
            None => Ok(self.clone()),
        }
    }

    /// Slots each OSD holds.
    pub fn counts(&self, osds: usize) -> Vec<u64> {
        let mut n = vec![0u64; osds];
        for &o in &self.rows {
            n[o as usize] += 1;
        }
        n
    }
}

/// Cumulative capacities for drawing hosts, and OSDs within a host, in
/// proportion to their size.
pub struct Sampler {
    host_cum: Vec<f64>,
    /// Per host: its first OSD id and cumulative sizes of its OSDs.
    osd_first: Vec<u32>,
    osd_cum: Vec<Vec<f64>>,
    all_cum: Vec<f64>,
}

impl Sampler {
    pub fn of(osds: &Osds) -> Sampler {
        let hosts = osds.host.iter().max().map_or(0, |&h| h as usize + 1);
        let mut s = Sampler {
            host_cum: Vec::with_capacity(hosts),
            osd_first: vec![0; hosts],
            osd_cum: vec![Vec::new(); hosts],
            all_cum: Vec::with_capacity(osds.host.len()),
        };
        let (mut all, mut per_host) = (0.0, vec![0.0; hosts]);
        for (o, &h) in osds.host.iter().enumerate() {
            let h = h as usize;
            if s.osd_cum[h].is_empty() {
                s.osd_first[h] = o as u32;
            }
            per_host[h] += osds.size_tb[o];
            s.osd_cum[h].push(per_host[h]);
            all += osds.size_tb[o];
            s.all_cum.push(all);
        }
        let mut acc = 0.0;
        for p in per_host {
            acc += p;
            s.host_cum.push(acc);
        }
        s
    }

    fn draw(cum: &[f64], rng: &mut nacre_types::SplitMix) -> usize {
        let x = rng.unit() * cum.last().copied().unwrap_or(0.0);
        cum.partition_point(|&c| c < x)
            .min(cum.len().saturating_sub(1))
    }
}

/// A random up OSD, weighted by size, in a failure domain none of `row`
/// uses (any OSD not in `row` for the OSD domain): drawn, and drawn again
/// while it is not allowed; after many misses, chosen among all the
/// allowed ones.
fn pick(
    osds: &Osds,
    s: &Sampler,
    domain: FailureDomain,
    row: &[u32],
    down: &[bool],
    rng: &mut nacre_types::SplitMix,
) -> Option<u32> {
    let key = |o: usize| match domain {
        FailureDomain::Host => osds.host[o],
        FailureDomain::Osd => o as u32,
    };
    let allowed = |o: usize| !down[o] && !row.iter().any(|&r| key(r as usize) == key(o));
    for _ in 0..64 {
        let o = match domain {
            FailureDomain::Host => {
                let h = Sampler::draw(&s.host_cum, rng);
                s.osd_first[h] as usize + Sampler::draw(&s.osd_cum[h], rng)
            }
            FailureDomain::Osd => Sampler::draw(&s.all_cum, rng),
        };
        if allowed(o) {
            return Some(o as u32);
        }
    }
    let total: f64 = (0..osds.host.len())
        .filter(|&o| allowed(o))
        .map(|o| osds.size_tb[o])
        .sum();
    if total <= 0.0 {
        return None;
    }
    let mut x = rng.unit() * total;
    let mut last = None;
    for o in (0..osds.host.len()).filter(|&o| allowed(o)) {
        last = Some(o as u32);
        x -= osds.size_tb[o];
        if x <= 0.0 {
            return last;
        }
    }
    last
}

/// What rebuilding a failure asks of each participant: bytes each
/// primary paces (at the recovery rate), each surviving OSD reads, each
/// new OSD writes, each host sends or receives.
#[derive(Clone, Debug, Default)]
pub struct Work {
    pub lost_tb: f64,
    pub pgs: u64,
    pub primaries: u64,
    pub sources: u64,
    pub targets: u64,
    /// The busiest of each kind, in seconds at its speed.
    pub primary_s: f64,
    pub source_s: f64,
    pub target_s: f64,
    pub network_s: f64,
}

/// The work of rebuilding the slots `lost` held in `before` where `after`
/// puts them. An EC primary reads `k` shards per shard rebuilt, and paces
/// `k + 1` blocks per block (crates/osd/src/recovery.rs).
pub fn work(c: &Cluster, osds: &Osds, before: &PgTable, after: &PgTable, lost: &[u32]) -> Work {
    let n = osds.host.len();
    let mut is_lost = vec![false; n];
    for &o in lost {
        is_lost[o as usize] = true;
    }
    let counts = before.counts(n);
    // Bytes a slot of each OSD holds.
    let slot_mb = |o: u32| {
        let o = o as usize;
        osds.size_tb[o] * c.fill * 1e6 / counts[o].max(1) as f64
    };
    let (reads_per_slot, paced_per_slot) = match c.scheme {
        Scheme::Replicas(_) => (1.0, 1.0),
        Scheme::Ec { k, .. } => (f64::from(k), f64::from(k) + 1.0),
    };
    let hosts = c.hosts.len();
    let mut paced = vec![0.0; n];
    let mut read = vec![0.0; n];
    let mut written = vec![0.0; n];
    let mut net_in = vec![0.0; hosts];
    let mut net_out = vec![0.0; hosts];
    let mut w = Work::default();
    let (mut prim, mut src, mut tgt) = (HashSet::new(), HashSet::new(), HashSet::new());
    for pg in 0..before.pgs() {
        let (old, new) = (before.row(pg), after.row(pg));
        let lost_slots: Vec<usize> = (0..before.width)
            .filter(|&s| is_lost[old[s] as usize])
            .collect();
        if lost_slots.is_empty() {
            continue;
        }
        w.pgs += 1;
        let survivors: Vec<u32> = old
            .iter()
            .copied()
            .filter(|&o| !is_lost[o as usize])
            .collect();
        let p = after.primary[pg];
        prim.insert(p);
        for &s in &lost_slots {
            let mb = slot_mb(old[s]);
            w.lost_tb += mb / 1e6;
            paced[p as usize] += mb * paced_per_slot;
            // The new home: the OSD `after` put in the slot, or (a table
            // that reordered the row) any OSD new to it.
            let target = if !old.contains(&new[s]) {
                new[s]
            } else {
                *new.iter().find(|o| !old.contains(o)).unwrap_or(&new[s])
            };
            tgt.insert(target);
            written[target as usize] += mb;
            // Reads spread over the survivors; an EC rebuild gathers them
            // at the primary, a copy goes from a survivor to the target.
            let share = mb * reads_per_slot / survivors.len().max(1) as f64;
            for &o in &survivors {
                src.insert(o);
                read[o as usize] += share;
                net_out[osds.host[o as usize] as usize] += share;
            }
            let into = if reads_per_slot > 1.0 { p } else { target };
            net_in[osds.host[into as usize] as usize] += mb * reads_per_slot;
            if into != target {
                net_out[osds.host[p as usize] as usize] += mb;
                net_in[osds.host[target as usize] as usize] += mb;
            }
        }
    }
    let link = c.network_gbps * 125.0;
    let most = |v: &[f64], speed: &dyn Fn(usize) -> f64| {
        (0..v.len()).map(|i| v[i] / speed(i)).fold(0.0, f64::max)
    };
    w.primary_s = most(&paced, &|_| c.recovery_mbps_per_osd);
    w.source_s = most(&read, &|o| osds.read_mbps[o]);
    w.target_s = most(&written, &|o| osds.write_mbps[o]);
    w.network_s = most(&net_in, &|_| link).max(most(&net_out, &|_| link));
    w.primaries = prim.len() as u64;
    w.sources = src.len() as u64;
    w.targets = tgt.len() as u64;
    w
}
