//! The probability of losing data: which sets of OSDs share a PG, how
//! often enough of one set is down at once, and a Monte Carlo simulation
//! of the same process to check the arithmetic.
//!
//! ## The model
//!
//! Every disk and every host alternates between up and down: it fails at
//! rate λ (its AFR, per year) and stays down for its *window* — the out
//! delay plus the time to rebuild what it held elsewhere
//! ([`crate::estimate::Recovery`], from the table's busiest participant).
//! A PG slot is down while its disk or its disk's host is. A PG that
//! tolerates `f` lost slots loses data when `f + 1` of its slots are down
//! at once; every `(f + 1)`-subset of a PG's OSDs is a *loss set*.
//!
//! In the stationary state a unit with rate λ and window T is down with
//! probability p = λT / (1 + λT) and goes down at rate ν = λ / (1 + λT)
//! (renewal reward, for any distribution of the window). Data is lost when
//! a unit goes down (the *trigger*) while, for some loss set containing
//! it, everything else is down. What must be down is a *cover*: per other
//! member, its disk or its host. Units fail independently, so
//!
//!   loss rate = Σ_trigger ν_trigger × P(some cover of the trigger down)
//!             ≈ Σ_trigger ν_trigger × Σ_{distinct covers} Π p_unit,
//!
//! the union of covers approximated by the sum over *distinct* covers —
//! counting a cover once is what makes one host down (which takes many
//! OSDs down together) count once, not once per OSD on it. What the sum
//! still counts twice needs more units down at once: it is smaller by a
//! further factor p (well under 1% for real clusters). This is why the
//! number of PGs matters: more PGs, more distinct loss sets, more covers
//! (Cidon et al.'s copysets), against faster recovery (more OSDs rebuild
//! at once).
//!
//! The covers are counted on a PG table ([`crate::table`]) when its
//! distinct loss sets are few enough ([`EXACT_LOSS_SETS_MAX`],
//! [`COVERS_MAX`]), else taken by expectation for a placement that
//! spreads PGs evenly at random over the allowed OSD sets (host failure
//! domain; averaged over the cluster's disks and hosts, so rough for a
//! mixed cluster). Tests check the expectation against counts on random
//! tables, and the count against [`simulate`], which runs the process on
//! the table's rows.
//!
//! The annual probability of losing data is 1 − e^(−rate · 1 year).

use std::collections::{BinaryHeap, HashSet};

use nacre_types::SplitMix;
use serde::Serialize;

use crate::desc::{Cluster, FailureDomain};
use crate::estimate::pgs_per_osd;
use crate::table::PgTable;
use crate::PlanError;

const SECONDS_PER_YEAR: f64 = 365.25 * 86_400.0;

/// Most loss sets the count enumerates (distinct placement rows ×
/// C(width, f + 1)), and covers it builds (each set's f + 1 remainders,
/// 2^f covers each at most); beyond them the expectation is used.
pub const EXACT_LOSS_SETS_MAX: u64 = 300_000;
pub const COVERS_MAX: u64 = 20_000_000;

/// Failure figures of every disk and host, per year.
#[derive(Clone, Debug)]
pub struct Units {
    pub disk_host: Vec<u32>,
    pub disk_rate: Vec<f64>,
    pub disk_window_years: Vec<f64>,
    pub host_rate: Vec<f64>,
    pub host_window_years: Vec<f64>,
}

fn down_probability(rate: f64, window: f64) -> f64 {
    rate * window / (1.0 + rate * window)
}

fn failure_rate(rate: f64, window: f64) -> f64 {
    rate / (1.0 + rate * window)
}

impl Units {
    /// The cluster's disks (numbered host by host) and hosts, with each
    /// host's windows (a disk of it lost, and all of it), in seconds.
    pub fn of(c: &Cluster, windows_s: &[(f64, f64)]) -> Units {
        let mut u = Units {
            disk_host: Vec::new(),
            disk_rate: Vec::new(),
            disk_window_years: Vec::new(),
            host_rate: Vec::new(),
            host_window_years: Vec::new(),
        };
        for (h, disks) in c.hosts.iter().enumerate() {
            let (one, all) = windows_s[h];
            for d in disks {
                u.disk_host.push(h as u32);
                u.disk_rate.push(d.afr);
                u.disk_window_years.push(one / SECONDS_PER_YEAR);
            }
            u.host_rate.push(c.host_afr);
            u.host_window_years.push(all / SECONDS_PER_YEAR);
        }
        u
    }

    fn p_disk(&self, d: u32) -> f64 {
        let d = d as usize;
        down_probability(self.disk_rate[d], self.disk_window_years[d])
    }

    fn p_host(&self, h: u32) -> f64 {
        let h = h as usize;
        down_probability(self.host_rate[h], self.host_window_years[h])
    }
}

/// A unit that can be down: a disk or a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Unit {
    Disk(u32),
    Host(u32),
}

/// A host trigger's part of a loss set: its members off the host, and
/// those on it.
pub type HostPart = (Box<[u32]>, Box<[u32]>);

/// What must be down besides a trigger for a loss set to be lost: per
/// trigger, the distinct remainders of the loss sets containing it.
#[derive(Clone, Debug, Default)]
pub struct LossSets {
    /// Per disk: the other members of each loss set holding it.
    pub by_disk: Vec<Vec<Box<[u32]>>>,
    /// Per host: the members off that host of each loss set with a member
    /// on it, and the members on it.
    pub by_host: Vec<Vec<HostPart>>,
    /// Distinct loss sets.
    pub count: u64,
}

/// Calls `f` with every `size`-subset of `items`.
fn subsets(items: &[u32], size: usize, f: &mut impl FnMut(&[u32])) {
    let n = items.len();
    if size > n {
        return;
    }
    let mut idx: Vec<usize> = (0..size).collect();
    let mut pick = vec![0u32; size];
    loop {
        for (p, &i) in pick.iter_mut().zip(&idx) {
            *p = items[i];
        }
        f(&pick);
        // The next combination in lexicographic order.
        let Some(i) = (0..size).rev().find(|&i| idx[i] != i + n - size) else {
            return;
        };
        idx[i] += 1;
        for j in i + 1..size {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// Distinct loss sets of `table`, or None when enumerating their covers
/// would cost more than [`COVERS_MAX`].
pub fn loss_sets(table: &PgTable, tolerates: u32, disk_host: &[u32]) -> Option<LossSets> {
    let width = table.width;
    let mut rows: HashSet<Box<[u32]>> = HashSet::new();
    for row in table.rows.chunks(width) {
        let mut sorted: Box<[u32]> = row.into();
        sorted.sort_unstable();
        rows.insert(sorted);
    }
    let s = tolerates + 1;
    let sets = rows.len() as f64 * choose(width as f64, s);
    let covers = sets * f64::from(s) * 2f64.powi(tolerates as i32);
    if sets > EXACT_LOSS_SETS_MAX as f64
        || covers > COVERS_MAX as f64
        || tolerates as usize >= COVER_MEMBERS_MAX
    {
        return None;
    }
    let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Some(LossSets::of_rows(&flat, width, tolerates, disk_host))
}

impl LossSets {
    /// The loss sets of placement rows (`rows` of `width` OSD ids, which
    /// index `disk_host`).
    pub fn of_rows(osds: &[u32], width: usize, tolerates: u32, disk_host: &[u32]) -> LossSets {
        assert!(
            (tolerates as usize) < COVER_MEMBERS_MAX,
            "covers of {tolerates} members are not enumerated"
        );
        let hosts = disk_host.iter().max().map_or(0, |&h| h as usize + 1);
        let mut sets: HashSet<Box<[u32]>> = HashSet::new();
        for row in osds.chunks(width) {
            let mut sorted = row.to_vec();
            sorted.sort_unstable();
            subsets(&sorted, tolerates as usize + 1, &mut |s| {
                if !sets.contains(s) {
                    sets.insert(s.into());
                }
            });
        }
        let mut by_disk: Vec<HashSet<Box<[u32]>>> = vec![HashSet::new(); disk_host.len()];
        let mut by_host: Vec<HashSet<HostPart>> = vec![HashSet::new(); hosts];
        for s in &sets {
            for (i, &d) in s.iter().enumerate() {
                let rest: Vec<u32> = (s.iter().enumerate())
                    .filter(|&(j, _)| j != i)
                    .map(|(_, &x)| x)
                    .collect();
                by_disk[d as usize].insert(rest.into());
            }
            let mut hs: Vec<u32> = s.iter().map(|&d| disk_host[d as usize]).collect();
            hs.sort_unstable();
            hs.dedup();
            for h in hs {
                let (on, off): (Vec<u32>, Vec<u32>) =
                    s.iter().partition(|&&d| disk_host[d as usize] == h);
                by_host[h as usize].insert((off.into(), on.into()));
            }
        }
        LossSets {
            by_disk: by_disk
                .into_iter()
                .map(|s| s.into_iter().collect())
                .collect(),
            by_host: by_host
                .into_iter()
                .map(|s| s.into_iter().collect())
                .collect(),
            count: sets.len() as u64,
        }
    }
}

/// Every cover of `rest` (per member, its disk or its host), with the
/// members on `pinned_host` covered by their disks only (that host is up
/// when the trigger goes down).
fn covers(rest: &[u32], u: &Units, pinned_host: Option<u32>, out: &mut HashSet<Box<[Unit]>>) {
    // Members grouped by host: a host covers all of its members at once.
    let mut groups: Vec<(u32, Vec<u32>)> = Vec::new();
    for &d in rest {
        let h = u.disk_host[d as usize];
        match groups.iter_mut().find(|g| g.0 == h) {
            Some(g) => g.1.push(d),
            None => groups.push((h, vec![d])),
        }
    }
    let free: Vec<usize> = (0..groups.len())
        .filter(|&i| Some(groups[i].0) != pinned_host)
        .collect();
    for mask in 0u64..(1u64 << free.len()) {
        let mut cover: Vec<Unit> = Vec::new();
        for (gi, (h, members)) in groups.iter().enumerate() {
            let by_host = free
                .iter()
                .position(|&f| f == gi)
                .is_some_and(|bit| mask & (1 << bit) != 0);
            if by_host {
                cover.push(Unit::Host(*h));
            } else {
                cover.extend(members.iter().map(|&d| Unit::Disk(d)));
            }
        }
        cover.sort_unstable();
        out.insert(cover.into());
    }
}

fn cover_probability(cover: &[Unit], u: &Units) -> f64 {
    cover
        .iter()
        .map(|&x| match x {
            Unit::Disk(d) => u.p_disk(d),
            Unit::Host(h) => u.p_host(h),
        })
        .product()
}

/// Members per remainder up to which covers are enumerated (2^members
/// covers each).
const COVER_MEMBERS_MAX: usize = 9;

/// The loss rate per year from counted loss sets.
pub fn rate_counted(sets: &LossSets, u: &Units) -> f64 {
    let mut rate = 0.0;
    let mut seen = HashSet::new();
    for (d, rests) in sets.by_disk.iter().enumerate() {
        let h = u.disk_host[d];
        seen.clear();
        for r in rests {
            covers(r, u, Some(h), &mut seen);
        }
        let p: f64 = seen.iter().map(|c| cover_probability(c, u)).sum();
        let nu = failure_rate(u.disk_rate[d], u.disk_window_years[d]);
        rate += nu * (1.0 - u.p_host(h)) * p;
    }
    for (h, rests) in sets.by_host.iter().enumerate() {
        seen.clear();
        for (off, _) in rests {
            covers(off, u, None, &mut seen);
        }
        let p: f64 = seen.iter().map(|c| cover_probability(c, u)).sum();
        rate += failure_rate(u.host_rate[h], u.host_window_years[h]) * p;
    }
    rate
}

fn choose(n: f64, k: u32) -> f64 {
    (0..k).fold(1.0, |acc, i| acc * (n - f64::from(i)) / f64::from(i + 1))
}

/// Expected distinct items when `draws` are taken evenly at random from
/// `possible`.
fn distinct(possible: f64, draws: f64) -> f64 {
    if possible <= 0.0 {
        return 0.0;
    }
    possible * -(-draws / possible).exp_m1()
}

/// The loss rate per year for a placement spreading PGs evenly at random
/// over sets of OSDs on distinct hosts (host failure domain), with the
/// cluster's average disk and host.
pub fn rate_expected(c: &Cluster, u: &Units) -> f64 {
    let hosts = c.hosts.len() as f64;
    let osds = c.osds() as f64;
    let disks_per_host = osds / hosts;
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (lambda_d, window_d) = (avg(&u.disk_rate), avg(&u.disk_window_years));
    let (lambda_h, window_h) = (avg(&u.host_rate), avg(&u.host_window_years));
    let (p_d, p_h) = (
        down_probability(lambda_d, window_d),
        down_probability(lambda_h, window_h),
    );
    let width = c.scheme.width();
    let rest = c.scheme.tolerates(); // members besides the trigger
    let per_pg = choose(f64::from(width) - 1.0, rest);
    // Covers of a remainder with `j` of its members covered by their
    // hosts: C(rest, j) of them per remainder; possible ones: the
    // remainder's hosts (C(H − 1, rest)) × which are hosts × a disk for
    // each other member.
    let sum_covers = |draws: f64| -> f64 {
        (0..=rest)
            .map(|j| {
                let ways = choose(f64::from(rest), j);
                let possible =
                    choose(hosts - 1.0, rest) * ways * disks_per_host.powi((rest - j) as i32);
                distinct(possible, draws * ways) * p_h.powi(j as i32) * p_d.powi((rest - j) as i32)
            })
            .sum()
    };
    let g = pgs_per_osd(c);
    let by_disk = failure_rate(lambda_d, window_d) * (1.0 - p_h) * sum_covers(g * per_pg);
    let by_host = failure_rate(lambda_h, window_h) * sum_covers(disks_per_host * g * per_pg);
    osds * by_disk + hosts * by_host
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Loss {
    /// Data-loss events per year.
    pub rate_per_year: f64,
    /// Probability of losing some data within a year.
    pub annual_probability: f64,
    /// Mean time to data loss, years.
    pub mttdl_years: f64,
    /// `counted` on the placement table, or `expected` for an even random
    /// placement.
    pub method: &'static str,
    /// Distinct loss sets (counted only).
    pub loss_sets: Option<u64>,
}

impl Loss {
    fn of_rate(rate: f64, method: &'static str, loss_sets: Option<u64>) -> Loss {
        Loss {
            rate_per_year: rate,
            annual_probability: -(-rate).exp_m1(),
            mttdl_years: if rate > 0.0 {
                1.0 / rate
            } else {
                f64::INFINITY
            },
            method,
            loss_sets,
        }
    }
}

/// The loss on `table` with windows `u`: counted where its loss sets
/// are few enough, else expected for an even random spread (which a
/// table with that many distinct sets resembles).
pub fn loss_on(c: &Cluster, table: &PgTable, u: &Units) -> Result<Loss, PlanError> {
    match loss_sets(table, c.scheme.tolerates(), &u.disk_host) {
        Some(sets) => Ok(Loss::of_rate(
            rate_counted(&sets, u),
            "counted",
            Some(sets.count),
        )),
        None if c.domain == FailureDomain::Host => {
            Ok(Loss::of_rate(rate_expected(c, u), "expected", None))
        }
        None => Err(PlanError::Invalid(format!(
            "failure_domain osd with {} PGs of {}: too many loss sets to count (give fewer pgs, or failure_domain host)",
            c.pgs,
            c.scheme.label()
        ))),
    }
}

/// What a simulation saw.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Simulated {
    pub years: u64,
    /// Failures that completed a loss set.
    pub losses: u64,
    /// Years with at least one.
    pub years_with_loss: u64,
}

/// Exponentially distributed with `rate` (infinite for rate 0).
fn exp(rng: &mut SplitMix, rate: f64) -> f64 {
    -rng.unit().ln() / rate
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    DiskFails(u32),
    DiskBack(u32),
    HostFails(u32),
    HostBack(u32),
}

/// Simulates `years` of the process the model describes (every disk and
/// host failing at its rate and down for its window) on the PG rows of
/// `table` and counts the failures after which some PG has more than
/// `tolerates` slots down that it did not have before — from the rows
/// themselves, sharing nothing with the arithmetic above but `u`'s
/// figures, to check it.
pub fn simulate(table: &PgTable, tolerates: u32, u: &Units, years: u64, seed: u64) -> Simulated {
    let mut rng = SplitMix(seed);
    // The PGs each disk and each host holds a slot of.
    let mut pgs_of_disk: Vec<Vec<u32>> = vec![Vec::new(); u.disk_host.len()];
    let mut pgs_of_host: Vec<Vec<u32>> = vec![Vec::new(); u.host_rate.len()];
    for pg in 0..table.pgs() {
        for &o in table.row(pg) {
            pgs_of_disk[o as usize].push(pg as u32);
            let h = u.disk_host[o as usize] as usize;
            if pgs_of_host[h].last() != Some(&(pg as u32)) {
                pgs_of_host[h].push(pg as u32);
            }
        }
    }
    // Times as the bits of positive f64s (ordered like the numbers).
    let mut queue: BinaryHeap<std::cmp::Reverse<(u64, Event)>> = BinaryHeap::new();
    let at = |q: &mut BinaryHeap<_>, t: f64, e: Event| {
        if t.is_finite() {
            q.push(std::cmp::Reverse((t.to_bits(), e)));
        }
    };
    for d in 0..u.disk_host.len() {
        let t = exp(&mut rng, u.disk_rate[d]);
        at(&mut queue, t, Event::DiskFails(d as u32));
    }
    for h in 0..u.host_rate.len() {
        let t = exp(&mut rng, u.host_rate[h]);
        at(&mut queue, t, Event::HostFails(h as u32));
    }
    let mut disk_down = vec![false; u.disk_host.len()];
    let mut host_down = vec![false; u.host_rate.len()];
    let mut result = Simulated {
        years,
        losses: 0,
        years_with_loss: 0,
    };
    let down_slots = |pg: u32, dd: &[bool], hd: &[bool]| {
        table
            .row(pg as usize)
            .iter()
            .filter(|&&o| dd[o as usize] || hd[u.disk_host[o as usize] as usize])
            .count() as u32
    };
    let mut last_loss_year = u64::MAX;
    while let Some(std::cmp::Reverse((bits, event))) = queue.pop() {
        let t = f64::from_bits(bits);
        if t >= years as f64 {
            break;
        }
        let lost = match event {
            Event::DiskFails(d) => {
                let before: Vec<u32> = pgs_of_disk[d as usize]
                    .iter()
                    .map(|&pg| down_slots(pg, &disk_down, &host_down))
                    .collect();
                disk_down[d as usize] = true;
                at(
                    &mut queue,
                    t + u.disk_window_years[d as usize],
                    Event::DiskBack(d),
                );
                (pgs_of_disk[d as usize].iter().zip(before)).any(|(&pg, b)| {
                    b <= tolerates && down_slots(pg, &disk_down, &host_down) > tolerates
                })
            }
            Event::HostFails(h) => {
                let before: Vec<u32> = pgs_of_host[h as usize]
                    .iter()
                    .map(|&pg| down_slots(pg, &disk_down, &host_down))
                    .collect();
                host_down[h as usize] = true;
                at(
                    &mut queue,
                    t + u.host_window_years[h as usize],
                    Event::HostBack(h),
                );
                (pgs_of_host[h as usize].iter().zip(before)).any(|(&pg, b)| {
                    b <= tolerates && down_slots(pg, &disk_down, &host_down) > tolerates
                })
            }
            Event::DiskBack(d) => {
                disk_down[d as usize] = false;
                let next = t + exp(&mut rng, u.disk_rate[d as usize]);
                at(&mut queue, next, Event::DiskFails(d));
                false
            }
            Event::HostBack(h) => {
                host_down[h as usize] = false;
                let next = t + exp(&mut rng, u.host_rate[h as usize]);
                at(&mut queue, next, Event::HostFails(h));
                false
            }
        };
        if lost {
            result.losses += 1;
            let year = t as u64;
            if year != last_loss_year {
                result.years_with_loss += 1;
                last_loss_year = year;
            }
        }
    }
    result
}
