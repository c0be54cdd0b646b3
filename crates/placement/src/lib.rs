//! Placement: the explicit PG → OSD table of a pool. Pure functions, no I/O.
//!
//! The leader computes the table and writes it to the cluster map; every
//! other node reads it. Rules, in order of precedence:
//!
//! 1. the replicas of one PG sit in distinct failure domains (OSD, host or
//!    rack);
//! 2. each OSD holds a share of the pool's replicas proportional to its
//!    weight (a failure domain can hold at most one replica of each PG, so a
//!    domain heavier than that limit is capped and the rest redistributed);
//!    counts land within one of that integer target where the topology
//!    allows;
//! 3. given the previous table, as few replicas as possible move: every
//!    replica stays where it was while its OSD is up, in a distinct domain
//!    and under its target; only the rest is placed anew (and where that
//!    leaves an OSD two or more off its target, chains of moves even it
//!    out: rule 2 first);
//! 4. each PG has a primary (which serves every client op of the PG):
//!    each OSD is primary for a share of the PGs proportional to the
//!    replicas it holds, within one of that integer target where the
//!    table allows, and a PG keeps its previous primary unless balance
//!    needs it to change. In a replicated pool the primary is the first
//!    OSD of its row (reordering a row moves no data); in a *positional*
//!    pool (erasure coding: the OSD at slot `i` holds shard `i`) rows are
//!    never reordered — a replica that stays keeps its slot — and the
//!    table names each PG's primary slot instead (`Table::lead`).
//!
//! Cost: O(slots · log OSDs); 10 000 OSDs and 1 000 000 PGs of 3 replicas
//! take a few seconds (`cargo bench -p nacre-placement`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// One OSD as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Osd {
    pub id: u32,
    pub host: u32,
    pub rack: u32,
    /// Relative capacity (e.g. GiB); 0 takes no data.
    pub weight: u32,
    /// Down or out OSDs take no data.
    pub up: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureDomain {
    Osd,
    Host,
    Rack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool {
    pub pgs: u32,
    /// Replicas (or shards) per PG.
    pub size: u8,
    pub domain: FailureDomain,
    /// Slots are positions (shards of an erasure-coded PG): rows are never
    /// reordered, and the primary is named by [`Table::lead`].
    pub positional: bool,
}

/// PG → OSD ids, `size` per PG, row by row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub size: u8,
    pub osds: Vec<u32>,
    /// A positional table's primary slot of each PG; empty in a replicated
    /// table, whose primary is the first of the row.
    pub lead: Vec<u8>,
}

impl Table {
    pub fn pg(&self, pg: u32) -> &[u32] {
        let s = self.size as usize;
        &self.osds[pg as usize * s..(pg as usize + 1) * s]
    }

    /// The slot of PG `pg`'s primary (the first, where the table names
    /// none or one out of the row).
    pub fn lead_of(&self, pg: u32) -> usize {
        (self.lead.get(pg as usize))
            .map(|&s| usize::from(s))
            .filter(|&s| s < usize::from(self.size))
            .unwrap_or(0)
    }

    /// PG `pg`'s primary.
    pub fn primary(&self, pg: u32) -> u32 {
        self.pg(pg)[self.lead_of(pg)]
    }

    pub fn pgs(&self) -> u32 {
        (self.osds.len() / self.size.max(1) as usize) as u32
    }

    /// Replicas each OSD holds.
    pub fn counts(&self) -> HashMap<u32, u64> {
        let mut c = HashMap::new();
        for &o in &self.osds {
            *c.entry(o).or_insert(0) += 1;
        }
        c
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("pool needs {need} failure domains with weight, the cluster has {have}")]
    TooFewDomains { need: usize, have: usize },
    #[error("invalid pool: {0}")]
    InvalidPool(String),
}

fn domain_of(o: &Osd, d: FailureDomain) -> u32 {
    match d {
        FailureDomain::Osd => o.id,
        FailureDomain::Host => o.host,
        FailureDomain::Rack => o.rack,
    }
}

/// Splits `total` into integers proportional to `weights` (largest
/// remainder), never giving an entry more than `cap`.
fn apportion(total: u64, weights: &[u64], cap: u64) -> Vec<u64> {
    let n = weights.len();
    let mut out = vec![0u64; n];
    let mut capped = vec![false; n];
    let mut left = total;
    loop {
        let w: u128 = (0..n)
            .filter(|&i| !capped[i])
            .map(|i| u128::from(weights[i]))
            .sum();
        if w == 0 || left == 0 {
            break;
        }
        // Entries whose share would pass the cap get the cap and leave.
        let over: Vec<usize> = (0..n)
            .filter(|&i| {
                !capped[i] && u128::from(left) * u128::from(weights[i]) > u128::from(cap) * w
            })
            .collect();
        if !over.is_empty() {
            for i in over {
                capped[i] = true;
                out[i] = cap;
                left -= cap;
            }
            continue;
        }
        let mut rems: Vec<(u128, usize)> = Vec::new();
        let mut given = 0u64;
        for i in (0..n).filter(|&i| !capped[i]) {
            let exact = u128::from(left) * u128::from(weights[i]);
            out[i] = (exact / w) as u64;
            given += out[i];
            rems.push((exact % w, i));
        }
        rems.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, i) in rems.iter().take((left - given) as usize) {
            out[i] += 1;
        }
        break;
    }
    out
}

/// Target replica count of every usable OSD (index into `osds`).
fn targets(osds: &[Osd], pool: &Pool) -> Vec<u64> {
    let total = u64::from(pool.pgs) * u64::from(pool.size);
    let mut domains: Vec<u32> = Vec::new();
    let mut dix = HashMap::new();
    let mut dweight: Vec<u64> = Vec::new();
    for o in osds.iter().filter(|o| o.up && o.weight > 0) {
        let d = domain_of(o, pool.domain);
        let i = *dix.entry(d).or_insert_with(|| {
            domains.push(d);
            dweight.push(0);
            domains.len() - 1
        });
        dweight[i] += u64::from(o.weight);
    }
    let dtarget = apportion(total, &dweight, u64::from(pool.pgs));
    let mut t = vec![0u64; osds.len()];
    for (di, &d) in domains.iter().enumerate() {
        let members: Vec<usize> = (0..osds.len())
            .filter(|&i| osds[i].up && osds[i].weight > 0 && domain_of(&osds[i], pool.domain) == d)
            .collect();
        let w: Vec<u64> = members.iter().map(|&i| u64::from(osds[i].weight)).collect();
        for (k, share) in apportion(dtarget[di], &w, u64::MAX).into_iter().enumerate() {
            t[members[k]] = share;
        }
    }
    t
}

/// Computes the pool's table, keeping what it can of `prev`.
pub fn place(osds: &[Osd], pool: &Pool, prev: Option<&Table>) -> Result<Table, PlacementError> {
    if pool.size == 0 || pool.pgs == 0 {
        return Err(PlacementError::InvalidPool(format!(
            "{} PGs of size {}",
            pool.pgs, pool.size
        )));
    }
    let size = pool.size as usize;
    let usable: Vec<usize> = (0..osds.len())
        .filter(|&i| osds[i].up && osds[i].weight > 0)
        .collect();
    let mut ndomains: Vec<u32> = usable
        .iter()
        .map(|&i| domain_of(&osds[i], pool.domain))
        .collect();
    ndomains.sort_unstable();
    ndomains.dedup();
    if ndomains.len() < size {
        return Err(PlacementError::TooFewDomains {
            need: size,
            have: ndomains.len(),
        });
    }
    let target = targets(osds, pool);
    let index: HashMap<u32, usize> = usable.iter().map(|&i| (osds[i].id, i)).collect();
    let domain: Vec<u32> = osds.iter().map(|o| domain_of(o, pool.domain)).collect();
    let mut count = vec![0u64; osds.len()];
    const FREE: u32 = u32::MAX;
    let mut out = vec![FREE; pool.pgs as usize * size];
    // Pass 1: keep every previous replica that is still allowed (OSD usable,
    // no second replica in its domain), then take each OSD's excess over its
    // target away, spread out: in each sweep a PG gives up at most one
    // replica (of the OSD with the most excess), so the freed slots can go
    // to the OSDs that gained capacity without two landing in one PG.
    if let Some(p) = prev.filter(|p| p.size == pool.size) {
        for pg in 0..pool.pgs.min(p.pgs()) as usize {
            for (slot, &id) in p.pg(pg as u32).iter().enumerate() {
                let Some(&i) = index.get(&id) else { continue };
                let row = &out[pg * size..(pg + 1) * size];
                if !row
                    .iter()
                    .any(|&o| o != FREE && domain[index[&o]] == domain[i])
                {
                    out[pg * size + slot] = id;
                    count[i] += 1;
                }
            }
        }
        let mut excess: Vec<u64> = (0..osds.len())
            .map(|i| count[i].saturating_sub(target[i]))
            .collect();
        let mut left: u64 = excess.iter().sum();
        // First from the PGs a domain that must gain replicas can take the
        // freed slot in (it holds none of the PG's yet, or it is the
        // domain of the replica that goes): freed elsewhere, a slot could
        // only go back to a domain that had enough, and the gaining one
        // would stay short (a host's second OSD added after its first).
        let mut room: HashMap<u32, u64> = HashMap::new();
        for &i in &usable {
            *room.entry(domain[i]).or_default() += target[i].saturating_sub(count[i]);
        }
        let mut progress = true;
        while left > 0 && progress {
            progress = false;
            for pg in 0..pool.pgs as usize {
                let row = &out[pg * size..(pg + 1) * size];
                let worst = (0..size)
                    .filter(|&s| row[s] != FREE && excess[index[&row[s]]] > 0)
                    .max_by_key(|&s| (excess[index[&row[s]]], Reverse(row[s])));
                let Some(s) = worst else { continue };
                let i = index[&row[s]];
                let takes = (room.iter())
                    .filter(|&(&d, &r)| {
                        r > 0
                            && (d == domain[i]
                                || !row.iter().any(|&o| o != FREE && domain[index[&o]] == d))
                    })
                    .max_by_key(|&(&d, &r)| (r, Reverse(d)))
                    .map(|(&d, _)| d);
                let Some(d) = takes else { continue };
                *room.get_mut(&d).expect("a domain with room") -= 1;
                out[pg * size + s] = FREE;
                excess[i] -= 1;
                count[i] -= 1;
                left -= 1;
                progress = true;
                if left == 0 {
                    break;
                }
            }
        }
        // Then the rest, spread out the same way.
        while left > 0 {
            for pg in 0..pool.pgs as usize {
                let row = &out[pg * size..(pg + 1) * size];
                let worst = (0..size)
                    .filter(|&s| row[s] != FREE && excess[index[&row[s]]] > 0)
                    .max_by_key(|&s| (excess[index[&row[s]]], Reverse(row[s])));
                if let Some(s) = worst {
                    let i = index[&row[s]];
                    out[pg * size + s] = FREE;
                    excess[i] -= 1;
                    count[i] -= 1;
                    left -= 1;
                    if left == 0 {
                        break;
                    }
                }
            }
        }
    }
    // Pass 2: fill the rest. For each PG, take the failure domains with the
    // largest remaining demand that the PG does not use yet (a domain that
    // must appear in every remaining PG always has the largest demand), and
    // in each the OSD furthest below its target. Lazy max-heaps: an entry is
    // current while its value matches the live count.
    let mut dix: HashMap<u32, usize> = HashMap::new();
    let mut dmembers: Vec<Vec<usize>> = Vec::new();
    for &i in &usable {
        let k = *dix.entry(domain[i]).or_insert_with(|| {
            dmembers.push(Vec::new());
            dmembers.len() - 1
        });
        dmembers[k].push(i);
    }
    let osd_dom: HashMap<usize, usize> = usable.iter().map(|&i| (i, dix[&domain[i]])).collect();
    let demand = |k: usize, c: &[u64]| {
        dmembers[k]
            .iter()
            .map(|&i| target[i] as i64 - c[i] as i64)
            .sum::<i64>()
    };
    let deficit = |i: usize, c: &[u64]| target[i] as i64 - c[i] as i64;
    let mut ddemand: Vec<i64> = (0..dmembers.len()).map(|k| demand(k, &count)).collect();
    let mut dheap: BinaryHeap<(i64, Reverse<u32>, usize)> = (0..dmembers.len())
        .map(|k| (ddemand[k], Reverse(domain[dmembers[k][0]]), k))
        .collect();
    let mut oheaps: Vec<BinaryHeap<(i64, Reverse<u32>, usize)>> = dmembers
        .iter()
        .map(|m| {
            m.iter()
                .map(|&i| (deficit(i, &count), Reverse(osds[i].id), i))
                .collect()
        })
        .collect();
    let mut skipped = Vec::with_capacity(size);
    for pg in 0..pool.pgs as usize {
        for slot in 0..size {
            if out[pg * size + slot] != FREE {
                continue;
            }
            let k = loop {
                let (d, name, k) = dheap.pop().expect("every domain has a current entry");
                if d != ddemand[k] {
                    continue; // stale
                }
                let row = &out[pg * size..(pg + 1) * size];
                if row.iter().any(|&o| o != FREE && osd_dom[&index[&o]] == k) {
                    skipped.push((d, name, k));
                    continue;
                }
                break k;
            };
            let pick = loop {
                let (d, _, i) = oheaps[k].pop().expect("every OSD has a current entry");
                if d == deficit(i, &count) {
                    break i;
                }
            };
            out[pg * size + slot] = osds[pick].id;
            count[pick] += 1;
            ddemand[k] -= 1;
            oheaps[k].push((deficit(pick, &count), Reverse(osds[pick].id), pick));
            dheap.push((ddemand[k], Reverse(domain[pick]), k));
            dheap.extend(skipped.drain(..));
        }
    }
    even_out(
        &mut out, size, &usable, osds, &index, &domain, &target, &mut count,
    );
    if pool.positional {
        if let Some(p) = prev.filter(|p| p.size == pool.size) {
            restore_slots(&mut out, size, p);
        }
    }
    let mut t = Table {
        size: pool.size,
        osds: out,
        lead: Vec::new(),
    };
    balance_primaries(&mut t, prev, pool.positional);
    Ok(t)
}

/// Puts every OSD of a positional table that was in a PG before back in
/// its old slot of that PG. Shedding an OSD's excess can free its slot in
/// a PG and the fill, or evening out, give it another slot of the same
/// PG: nothing moved for a set of replicas, but for shards that is two
/// shards rebuilt for none. Swapping within the row changes no count and
/// no domain; each swap puts one OSD in its old slot for good (no other
/// OSD had that slot), so at most `size` swaps per PG.
fn restore_slots(out: &mut [u32], size: usize, prev: &Table) {
    for pg in 0..(out.len() / size).min(prev.pgs() as usize) {
        let old = prev.pg(pg as u32);
        let row = &mut out[pg * size..(pg + 1) * size];
        let mut s = 0;
        while s < size {
            match old.iter().position(|&o| o == row[s]) {
                Some(p) if p != s => row.swap(s, p),
                _ => s += 1,
            }
        }
    }
}

/// The most OSDs [`even_out`] expands looking for one chain, the longest
/// chain, and the PG rows it reads in all, in PGs' worth per unit an OSD
/// is off beyond one: bounds its cost where no chain exists.
const CHAIN_EXPANSIONS_MAX: usize = 64;
const CHAIN_STEPS_MAX: usize = 6;
const EVEN_OUT_SCANS_MAX: usize = 32;

/// Evens out what the fill left uneven. It fills PG by PG, greedily, so a
/// PG late in the order may have room only for OSDs already at their
/// target, and keeping the previous table's replicas narrows it further:
/// an OSD can end two or more off its target where a fresh table is
/// within one. Moves one replica at a time along a chain from an OSD
/// above its target to the one furthest below, each step an OSD taking
/// another's slot in a PG that has no other replica in its domain, every
/// step in another PG (so each step's check still holds when all are
/// made); found breadth-first from the OSD below. It runs only while an
/// OSD is two or more off its target, and takes a chain only if its ends
/// differ by two or more and one of them is two off, so every chain
/// lowers the sum of squared deviations and the loop ends; a table
/// within one of every target is left as it is (no move for nothing).
/// An OSD no chain reaches is left as it is.
#[allow(clippy::too_many_arguments)]
fn even_out(
    out: &mut [u32],
    size: usize,
    usable: &[usize],
    osds: &[Osd],
    index: &HashMap<u32, usize>,
    domain: &[u32],
    target: &[u64],
    count: &mut [u64],
) {
    let pgs = out.len() / size;
    let dev = |i: usize, count: &[u64]| count[i] as i64 - target[i] as i64;
    let mut stuck = vec![false; osds.len()];
    // (taker, PG, slot) that reached each OSD.
    let mut via: Vec<Option<(usize, usize, usize)>> = vec![None; osds.len()];
    // Every unit an OSD is off beyond one may need a chain.
    let uneven: usize = (usable.iter())
        .map(|&i| (dev(i, count).unsigned_abs() as usize).saturating_sub(1))
        .sum();
    let mut rows_left = (EVEN_OUT_SCANS_MAX * (uneven + 1)).saturating_mul(pgs);
    loop {
        let Some(u) = (usable.iter().copied())
            .filter(|&i| !stuck[i])
            .min_by_key(|&i| (dev(i, count), osds[i].id))
        else {
            return;
        };
        let du = dev(u, count);
        let over = usable.iter().map(|&i| dev(i, count)).max().unwrap_or(0);
        if du >= 0 || over - du < 2 || (du > -2 && over < 2) {
            return;
        }
        via.iter_mut().for_each(|v| *v = None);
        let on_path = |via: &[Option<(usize, usize, usize)>], mut x: usize, pg: usize| {
            while let Some((from, p, _)) = via[x] {
                if p == pg {
                    return true;
                }
                x = from;
            }
            false
        };
        let mut queue = std::collections::VecDeque::from([(u, 0usize)]);
        let mut found = None;
        let mut expanded = 0;
        'search: while let Some((x, steps)) = queue.pop_front() {
            if steps == CHAIN_STEPS_MAX || expanded == CHAIN_EXPANSIONS_MAX || rows_left < pgs {
                continue;
            }
            expanded += 1;
            rows_left -= pgs;
            let xid = osds[x].id;
            for pg in 0..pgs {
                let row = &out[pg * size..(pg + 1) * size];
                if row.contains(&xid) || on_path(&via, x, pg) {
                    continue;
                }
                for s in 0..size {
                    let y = index[&row[s]];
                    if y == u || via[y].is_some() {
                        continue;
                    }
                    if (0..size).any(|r| r != s && domain[index[&row[r]]] == domain[x]) {
                        continue;
                    }
                    via[y] = Some((x, pg, s));
                    let dy = dev(y, count);
                    if dy - du >= 2 && (du <= -2 || dy >= 2) {
                        found = Some(y);
                        break 'search;
                    }
                    queue.push_back((y, steps + 1));
                }
            }
        }
        let Some(v) = found else {
            stuck[u] = true;
            continue;
        };
        // Each taker takes its giver's slot, from the far end back.
        let mut y = v;
        while let Some((x, pg, s)) = via[y] {
            out[pg * size + s] = osds[x].id;
            y = x;
        }
        count[v] -= 1;
        count[u] += 1;
    }
}

/// Puts each PG's primary first, so that every OSD is primary for its
/// share of the PGs: with `r` replicas in a pool of size `size`, between
/// ⌊r / size⌋ and ⌈r / size⌉ of them.
///
/// Starts from the previous primaries wherever they are still members
/// (else the member furthest below its share) and moves only what leaves
/// that band, along augmenting paths: an OSD above it hands one of its
/// PGs to another member, which, if that takes it above the band itself,
/// hands on one of its own, and so on; an OSD below it takes a PG from a
/// member that can spare one, the same way backwards. A band rather than
/// exact targets keeps primaries put when counts shift by a replica or
/// two. O(PGs · size) per path. A `positional` table records each PG's
/// primary slot in `lead`; a replicated one moves it to the front.
fn balance_primaries(t: &mut Table, prev: Option<&Table>, positional: bool) {
    let size = t.size as usize;
    let pgs = t.pgs() as usize;
    if positional {
        t.lead = vec![0; pgs];
    }
    if size < 2 || pgs == 0 {
        return;
    }
    let mut ids: Vec<u32> = t.osds.clone();
    ids.sort_unstable();
    ids.dedup();
    // OSD id → dense index (ids are small integers; a table, not a hash).
    let mut ix = vec![usize::MAX; *ids.last().expect("a PG has OSDs") as usize + 1];
    for (i, &id) in ids.iter().enumerate() {
        ix[id as usize] = i;
    }
    let ix = |id: &u32| ix[*id as usize];
    let n = ids.len();
    let mut replicas = vec![0u64; n];
    // PGs each OSD is a member of.
    let mut member: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (k, &o) in t.osds.iter().enumerate() {
        replicas[ix(&o)] += 1;
        member[ix(&o)].push(k / size);
    }
    let lo: Vec<u64> = replicas.iter().map(|&r| r / size as u64).collect();
    let hi: Vec<u64> = replicas.iter().map(|&r| r.div_ceil(size as u64)).collect();
    let mut prim = vec![0u64; n];
    let mut first = vec![0usize; pgs]; // slot of each PG's primary
    for (pg, slot) in first.iter_mut().enumerate() {
        let row = &t.osds[pg * size..(pg + 1) * size];
        let keep = prev
            .filter(|p| p.size == t.size && (pg as u32) < p.pgs())
            .and_then(|p| row.iter().position(|&o| o == p.primary(pg as u32)));
        *slot = keep.unwrap_or_else(|| {
            (0..size)
                .max_by_key(|&s| {
                    let i = ix(&row[s]);
                    (hi[i] as i64 - prim[i] as i64, Reverse(row[s]))
                })
                .expect("size >= 2")
        });
        prim[ix(&row[*slot])] += 1;
    }
    let leader = |first: &[usize], pg: usize| ix(&t.osds[pg * size + first[pg]]);
    // One breadth-first search for a path of hand-overs from `start`:
    // `shed` moves a PG away from `start` (forward: start's PGs to their
    // other members, ending at one below `hi`); otherwise a PG comes to
    // `start` (backward: from the leaders of start's PGs, ending at one
    // above `lo`). Applies the path; false when there is none.
    let path = |start: usize, shed: bool, first: &mut Vec<usize>, prim: &mut Vec<u64>| {
        let mut parent: Vec<Option<(usize, usize)>> = vec![None; n];
        let mut seen = vec![false; n];
        seen[start] = true;
        let mut queue = std::collections::VecDeque::from([start]);
        let mut end = None;
        'search: while let Some(u) = queue.pop_front() {
            for &pg in &member[u] {
                let l = leader(first, pg);
                let next: Vec<usize> = if shed {
                    if l != u {
                        continue;
                    }
                    t.osds[pg * size..(pg + 1) * size].iter().map(ix).collect()
                } else {
                    if l == u {
                        continue;
                    }
                    vec![l]
                };
                for v in next {
                    if seen[v] {
                        continue;
                    }
                    seen[v] = true;
                    parent[v] = Some((u, pg));
                    let done = if shed {
                        prim[v] < hi[v]
                    } else {
                        prim[v] > lo[v]
                    };
                    if done {
                        end = Some(v);
                        break 'search;
                    }
                    queue.push_back(v);
                }
            }
        }
        let Some(mut v) = end else {
            return false;
        };
        if shed {
            prim[v] += 1;
            prim[start] -= 1;
        } else {
            prim[v] -= 1;
            prim[start] += 1;
        }
        // Walk back: each step's PG goes to its new leader.
        while let Some((u, pg)) = parent[v] {
            let to = if shed { v } else { u };
            let row = &t.osds[pg * size..(pg + 1) * size];
            first[pg] = row.iter().position(|o| ix(o) == to).expect("member");
            v = u;
        }
        true
    };
    for start in 0..n {
        while prim[start] > hi[start] && path(start, true, &mut first, &mut prim) {}
    }
    for start in 0..n {
        while prim[start] < lo[start] && path(start, false, &mut first, &mut prim) {}
    }
    for (pg, &slot) in first.iter().enumerate() {
        if positional {
            t.lead[pg] = slot as u8;
        } else {
            t.osds[pg * size..(pg + 1) * size].swap(0, slot);
        }
    }
}

/// Replicas that are on another OSD in `b` than in `a` (per PG, as a set).
pub fn moves(a: &Table, b: &Table) -> u64 {
    let mut n = 0;
    for pg in 0..a.pgs().min(b.pgs()) {
        let old = a.pg(pg);
        n += b.pg(pg).iter().filter(|o| !old.contains(o)).count() as u64;
    }
    n
}

/// The fewest replicas any valid table could move from `prev` to reach
/// `next`'s counts: what must leave OSDs that lost capacity.
pub fn min_moves(prev: &Table, next: &Table) -> u64 {
    let (pc, nc) = (prev.counts(), next.counts());
    pc.iter()
        .map(|(o, &c)| c.saturating_sub(*nc.get(o).unwrap_or(&0)))
        .sum()
}

#[cfg(test)]
mod tests;
