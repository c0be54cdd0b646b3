//! The cluster map's leader (docs/internals/replication.md §5.1): it owns
//! the map and changes it, one epoch at a time.
//!
//! - An OSD that starts sends `Boot` with its store's id; the leader marks
//!   it up in a new epoch (its `up_from`), so a restarted process is a new
//!   incarnation, and records the store: an interval's member counts for
//!   peering only while it runs the store it had in that interval.
//! - Every up OSD heartbeats the leader (`Ping`, every
//!   `HEARTBEAT_INTERVAL_MS`); one unheard of for `HEARTBEAT_GRACE_MS` is
//!   marked down in a new epoch.
//! - An OSD whose process is known to have exited (`Dead`, from the
//!   supervisor that reaped it, naming the incarnation) is marked down at
//!   once: a dead process serves no read, so its lease need not run out.
//! - A primary whose write failed on some copy reports `PgEvent::Failed`:
//!   a new epoch ends the interval and the PG peers again.
//! - A primary that finished peering reports `PgEvent::Active`; the leader
//!   records the interval (epoch, acting set, stores, and the members still
//!   being recovered in the background) as the PG's last active one,
//!   durably, before the primary takes a write; the primary reports again
//!   as members finish. The next peering needs an answer from one of its
//!   complete members.
//! - Read leases are tied to epochs: a heartbeat naming an epoch older
//!   than the newest a PG went active in gets no lease, and the first
//!   record of a PG's interval waits until every member of its last active
//!   interval that did not answer the new peering (it may not have heard
//!   of the new epoch, and could serve reads in the old one: a primary, or
//!   an EC shard read directly) holds no lease granted in an older epoch.
//!
//! Every change is persisted (`persist`, the meta store in `nacre up`)
//! before anyone hears of it, then pushed to every up OSD; an OSD that
//! missed the push learns the epoch from its next heartbeat's answer.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use nacre_io::sync::Notify;
use nacre_io::{rt, AlignedBuf};
use nacre_meta::map::{Interval, PgTable, Placed, PoolRecord, EPOCH_MAX};
use nacre_net::{Frame, Handler, Rpc, Transport};
use nacre_types::{ObjectId, PgId, HEARTBEAT_GRACE_MS, HEARTBEAT_INTERVAL_MS};
use nacre_wire::{Header, Op, Status};

use crate::map::{OsdMap, PgEvent, PoolChange};

/// How often the leader drops the temporary members of PGs whose new
/// members are complete, all in one epoch.
pub const TEMP_SETTLE_MS: u64 = 2_000;

/// Added to the end of a lease the leader waits out (`leases_end`): the
/// OSD measures it on its own clock, whose rate may differ a little.
const LEASE_MARGIN_MS: u64 = 100;

/// Stores a map durably; an error refuses the change.
pub type Persist = Box<dyn Fn(&OsdMap) -> Result<(), String>>;
/// Computes a pool's PG table (OSD ids, `size` per PG, and an
/// erasure-coded pool's lead slots) over the given OSDs (those of the map
/// that are in), keeping what it can of the current table (none for a new
/// pool); or why it cannot.
pub type Placer = Box<dyn Fn(&PoolRecord, Option<&PgTable>, &[u32]) -> Result<Placed, String>>;

pub struct Leader<T: Transport> {
    transport: T,
    map: RefCell<OsdMap>,
    persist: Persist,
    /// When each up OSD last answered a heartbeat (or booted).
    heard: RefCell<HashMap<u32, Duration>>,
    /// The read lease last granted to each OSD: the epoch its heartbeat
    /// (or boot) named, and when the lease ends on this leader's clock —
    /// counted from the heartbeat's arrival, which is after its sending,
    /// so never before the OSD's own end.
    leases: RefCell<HashMap<u32, (u64, Duration)>>,
    /// A heartbeat naming an epoch below this gets no lease: some PG went
    /// active in it (or is being recorded active), and an OSD still in an
    /// older epoch might serve reads of an interval that ended.
    fence: Cell<u64>,
    conns: RefCell<HashMap<u32, Rc<T::Conn>>>,
    stopped: Cell<bool>,
    /// How PG tables are recomputed when an OSD is marked out or in (none:
    /// the table never changes).
    placer: RefCell<Option<Placer>>,
    /// After how long down an OSD is marked out (none: never); since when
    /// each down OSD is down; and the OSDs this leader marked out for that,
    /// which it marks in again when they boot.
    out_delay: Cell<Option<Duration>>,
    down_since: RefCell<HashMap<u32, Duration>>,
    auto_out: RefCell<std::collections::HashSet<u32>>,
    /// When temporary members were last looked at (`settle_temps`).
    settled: Cell<Duration>,
    /// Each OSD's store write p99 per window, newest first, as its last
    /// heartbeat said (`crate::slow`); and whether an OSD that stands out
    /// is demoted from leading PGs (`slow_osd_action = demote`).
    slow_figures: RefCell<BTreeMap<u32, Vec<Option<f64>>>>,
    demote_slow: Cell<bool>,
    /// Each OSD's demotions by this leader ([`hold_down`]).
    demotions: RefCell<BTreeMap<u32, Demotions>>,
    /// Whether this leader may still act (an elected monitor's term has
    /// not ended); none: always.
    authority: RefCell<Option<Authority>>,
    /// Before this instant (`rt::monotonic`) no PG event is taken: a new
    /// elected leader's wait for its predecessor's read leases.
    events_after: Cell<Duration>,
    /// PGs gone active whose intervals wait to be stored together
    /// (`Leader::store_actives`), and whether a task to store them runs.
    actives: RefCell<Vec<Active>>,
    storing: Cell<bool>,
    stored: Notify,
}

/// A PG's `PgEvent::Active`, checked, waiting for its interval to be
/// stored.
struct Active {
    pg: PgId,
    primary: u32,
    interval: Interval,
    /// What the primary is told, once stored (or refused).
    answer: Rc<Cell<Option<Status>>>,
}

/// An OSD's demotions: when this leader demoted it within the last
/// [`DEMOTIONS_REMEMBERED`], oldest first, and until when (the runtime's
/// clock) its last demotion holds whatever its figures say.
#[derive(Default)]
struct Demotions {
    times: Vec<Duration>,
    held_until: Duration,
}

/// How long a leader remembers that it demoted an OSD ([`hold_down`]).
const DEMOTIONS_REMEMBERED: Duration = Duration::from_secs(3600);

/// How long an OSD demoted for the `n`th time within
/// [`DEMOTIONS_REMEMBERED`] stays demoted at least, however calm it turns
/// meanwhile: nothing the first time (calm in every kept window is
/// enough), then a minute, doubled at each demotion up to 32 minutes. A
/// disk slow only under a primary's load — calm once demoted, slow again
/// once restored — costs two epochs (every PG peers) a few times an hour
/// instead of every minute.
fn hold_down(n: usize) -> Duration {
    match n {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(60) * (1u32 << (n - 2).min(5)),
    }
}

/// How long a leader may still act (`None`: no longer); checked at every
/// message, and no read lease it grants outlasts it.
pub type Authority = Box<dyn Fn() -> Option<Duration>>;

/// `Ok`, or `Invalid` with the reason as UTF-8 text.
fn refusal(h: &Header, r: Result<(), String>) -> (Header, Option<AlignedBuf>) {
    match r {
        Ok(()) => (h.reply(Status::Ok), None),
        Err(why) => {
            let body = why.into_bytes();
            (
                h.reply(Status::Invalid).with_payload(&body),
                Some(AlignedBuf::from_slice(&body)),
            )
        }
    }
}

/// A store id as an OSD boots with ([`crate::Osd::store_id`]): 32
/// lowercase hex digits, then `.N` for a lineage N > 0.
fn is_store_id(s: &str) -> bool {
    let (uuid, lineage) = match s.split_once('.') {
        Some((u, l)) => (u, Some(l)),
        None => (s, None),
    };
    uuid.len() == 32
        && (uuid.bytes()).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && lineage.is_none_or(|l| {
            l.len() <= 10
                && !l.starts_with('0')
                && l.parse::<u32>().is_ok_and(|n| n > 0)
                && l.bytes().all(|b| b.is_ascii_digit())
        })
}

fn json_reply(h: &Header, body: Vec<u8>) -> (Header, Option<AlignedBuf>) {
    (
        h.reply(Status::Ok).with_payload(&body),
        Some(AlignedBuf::from_slice(&body)),
    )
}

impl<T: Transport> Leader<T> {
    /// A leader for `map` (as stored: every OSD is taken as down until it
    /// boots), starting in a new epoch.
    pub fn new(mut map: OsdMap, transport: T, persist: Persist) -> Result<Rc<Self>, String> {
        let mut all: Vec<u32> = (map.pools.values())
            .flat_map(|p| p.table.osds.iter().copied())
            .collect();
        all.extend(map.addrs.keys().copied());
        all.sort_unstable();
        all.dedup();
        map.cluster.down = all;
        // A pool removed whose keys a cut-short store left behind.
        let removed = map.cluster.removed_pools.clone();
        map.pools.retain(|id, _| !removed.contains(id));
        map.up_from.clear();
        map.stores.clear();
        map.cluster.epoch += 1;
        persist(&map)?;
        let fence = map.cluster.epoch;
        Ok(Rc::new(Leader {
            transport,
            map: RefCell::new(map),
            persist,
            heard: RefCell::new(HashMap::new()),
            // Leases granted in earlier epochs are the predecessor's
            // (`hold_events_until`); this one grants none below its own.
            leases: RefCell::new(HashMap::new()),
            fence: Cell::new(fence),
            conns: RefCell::new(HashMap::new()),
            stopped: Cell::new(false),
            placer: RefCell::new(None),
            out_delay: Cell::new(None),
            down_since: RefCell::new(HashMap::new()),
            auto_out: RefCell::new(Default::default()),
            settled: Cell::new(Duration::ZERO),
            slow_figures: RefCell::new(BTreeMap::new()),
            demote_slow: Cell::new(true),
            demotions: RefCell::new(BTreeMap::new()),
            authority: RefCell::new(None),
            events_after: Cell::new(Duration::ZERO),
            actives: RefCell::new(Vec::new()),
            storing: Cell::new(false),
            stored: Notify::new(),
        }))
    }

    /// Whether an OSD that slow-OSD detection names is demoted from
    /// leading PGs (the default) or only named (`nacre status`).
    pub fn set_slow_osd_action(&self, demote: bool) {
        self.demote_slow.set(demote);
    }

    /// Demotes the OSDs up that stand out as slow (`crate::slow`) and
    /// restores those demoted that stand out in no window any more (or
    /// cannot be judged) once their hold-down passed ([`hold_down`]), in
    /// one epoch if anything changed: a PG's primary is then another
    /// member. An OSD that goes down is restored unless its hold-down runs
    /// (restarting a slow OSD does not end its hold).
    fn demote_the_slow(self: &Rc<Self>) {
        let (up, demoted) = {
            let m = self.map.borrow();
            let up: Vec<u32> = m.up_from.keys().copied().collect();
            (up, m.cluster.demoted.clone())
        };
        let now = rt::monotonic();
        (self.demotions.borrow_mut()).retain(|_, d| {
            d.times
                .retain(|&t| now.saturating_sub(t) < DEMOTIONS_REMEMBERED);
            !d.times.is_empty() || now < d.held_until
        });
        let demote = self.demote_slow.get();
        let held = |id: &u32| {
            demote && (self.demotions.borrow().get(id)).is_some_and(|d| now < d.held_until)
        };
        let reports: Vec<(u32, Vec<Option<f64>>)> = {
            let f = self.slow_figures.borrow();
            (up.iter())
                .filter_map(|id| Some((*id, f.get(id)?.clone())))
                .collect()
        };
        // With demotion off, every demoted OSD is restored.
        let (slow, restless) = match demote {
            true => (
                crate::slow::slow_osds(&reports),
                crate::slow::restless_osds(&reports),
            ),
            false => (Vec::new(), Vec::new()),
        };
        let next: std::collections::BTreeSet<u32> = (demoted.iter().copied())
            .filter(|id| (up.contains(id) && restless.contains(id)) || held(id))
            .chain(slow.iter().map(|s| s.osd))
            .collect();
        let next: Vec<u32> = next.into_iter().collect();
        if next == demoted {
            return;
        }
        // The hold each newly demoted OSD gets: its demotions within the
        // hour, this one included, decide it.
        let holds: Vec<(u32, Duration)> = (next.iter())
            .filter(|id| !demoted.contains(id))
            .map(|&id| {
                let d = self.demotions.borrow();
                let before = d.get(&id).map_or(0, |d| d.times.len());
                (id, hold_down(before + 1))
            })
            .collect();
        let why = match slow.iter().find(|s| !demoted.contains(&s.osd)) {
            Some(s) => match holds.iter().find(|h| h.0 == s.osd) {
                Some((_, hold)) if !hold.is_zero() => format!(
                    "demoted from leading PGs again within an hour, for {hold:?} at least: {}",
                    s.message()
                ),
                _ => format!("demoted from leading PGs: {}", s.message()),
            },
            None if next.is_empty() => "no OSD demoted any more (none stands out)".to_string(),
            None => format!("OSDs demoted from leading PGs (too slow): {next:?}"),
        };
        // Remembered only once the epoch that demotes them is stored.
        if self.change(&why, |m| m.cluster.demoted = next).is_ok() {
            let mut d = self.demotions.borrow_mut();
            for (id, hold) in holds {
                let e = d.entry(id).or_default();
                e.times.push(now);
                e.held_until = now + hold;
            }
        }
    }

    /// Marks an OSD out once it has been down for `delay` (zero: never),
    /// and in again when it boots. Needs a placer.
    pub fn set_out_delay(&self, delay: Duration) {
        self.out_delay.set((!delay.is_zero()).then_some(delay));
        // Every OSD counts as down from now until it boots.
        let now = rt::monotonic();
        let m = self.map.borrow();
        let mut since = self.down_since.borrow_mut();
        for &id in m.addrs.keys().filter(|id| !m.is_up(**id)) {
            since.entry(id).or_insert(now);
        }
    }

    /// Marks out every OSD down for longer than the out delay; one whose
    /// out is refused (too few OSDs left) is tried again a delay later.
    fn out_the_long_down(self: &Rc<Self>) {
        let Some(delay) = self.out_delay.get() else {
            return;
        };
        let now = rt::monotonic();
        let due: Vec<u32> = {
            let m = self.map.borrow();
            let since = self.down_since.borrow();
            (since.iter())
                .filter(|(id, t)| now.saturating_sub(**t) >= delay && !m.cluster.out.contains(id))
                .map(|(id, _)| *id)
                .collect()
        };
        for id in due {
            match self.mark_out(id, true) {
                Ok(()) => {
                    tracing::warn!("leader: osd.{id} down for {delay:?}: marked out");
                    self.auto_out.borrow_mut().insert(id);
                    self.down_since.borrow_mut().remove(&id);
                }
                Err(why) => {
                    tracing::warn!("leader: osd.{id} down for {delay:?} but not marked out: {why}");
                    self.down_since.borrow_mut().insert(id, now);
                }
            }
        }
    }

    /// Lets OSDs be marked out and in, with `placer` computing the tables.
    pub fn set_placer(&self, placer: Placer) {
        *self.placer.borrow_mut() = Some(placer);
    }

    /// Marks OSD `id` out (`out`: its PGs move to the other OSDs) or in
    /// again, with a new table in a new epoch; every PG whose acting set
    /// changes peers, and recovery fills the new members while the PGs
    /// serve. Why not, if it cannot be.
    pub fn mark_out(self: &Rc<Self>, id: u32, out: bool) -> Result<(), String> {
        let (pools, mut outs) = {
            let m = self.map.borrow();
            if !m.addrs.contains_key(&id) {
                let mut ids: Vec<u32> = m.addrs.keys().copied().collect();
                ids.sort_unstable();
                let ids: Vec<String> = ids.iter().map(|o| format!("osd.{o}")).collect();
                return Err(format!("no osd.{id}; the OSDs are {}", ids.join(", ")));
            }
            (m.pools.clone(), m.cluster.out.clone())
        };
        if outs.contains(&id) == out {
            return Ok(());
        }
        if out {
            outs.push(id);
        } else {
            outs.retain(|&o| o != id);
        }
        outs.sort_unstable();
        let verb = if out { "out" } else { "in" };
        let mut tables = BTreeMap::new();
        let (mut moved, mut copies) = (0, 0);
        for (pool, p) in &pools {
            let table = self
                .place(&p.record, Some(&p.table), &outs)
                .map_err(|e| format!("osd.{id} cannot be marked {verb}: {e}"))?;
            let n = (table.osds.iter().zip(&p.table.osds))
                .filter(|(a, b)| a != b)
                .count();
            copies += table.osds.len();
            moved += n;
            // A pool whose table does not change keeps its temporary
            // members as they are.
            if n > 0 {
                tables.insert(*pool, table);
            }
        }
        let why = format!("osd.{id} marked {verb}; {moved} of {copies} PG copies move");
        self.apply(&why, |m| {
            m.cluster.out = outs;
            for (pool, table) in tables {
                let size = m.pools[&pool].table.size;
                retable(m, pool, size, table);
            }
        })
    }

    /// Pool `pool`'s PG table over the OSDs of the map not in `out`,
    /// checked.
    fn place(
        &self,
        pool: &PoolRecord,
        prev: Option<&PgTable>,
        out: &[u32],
    ) -> Result<Placed, String> {
        let inn: Vec<u32> = (self.map.borrow().addrs.keys())
            .copied()
            .filter(|o| !out.contains(o))
            .collect();
        let p = self.placer.borrow();
        let p = p.as_ref().ok_or("this cluster's PG tables cannot change")?;
        let table = p(pool, prev, &inn)?;
        let slots = pool.pg_count as usize * pool.size as usize;
        let leads = if pool.ec.is_some() {
            pool.pg_count as usize
        } else {
            0
        };
        if table.osds.len() != slots || table.lead.len() != leads {
            return Err(format!(
                "the new table of pool {} has {} slots and {} leads, not {slots} and {leads}",
                pool.name,
                table.osds.len(),
                table.lead.len()
            ));
        }
        Ok(table)
    }

    /// Adds OSD `id` at `addr` to the map, out: it can boot, and holds no
    /// PG until it is marked in. Its record is in the meta store already
    /// (the placer reads it from there). Adding the same OSD again is a
    /// no-op; another address for a known id is refused.
    pub fn add_osd(self: &Rc<Self>, id: u32, addr: String) -> Result<(), String> {
        if addr.parse::<nacre_io::net::Addr>().is_err() {
            return Err(format!("osd.{id}: {addr:?} is no address"));
        }
        if let Some(known) = self.map.borrow().addrs.get(&id) {
            return if *known == addr {
                Ok(())
            } else {
                Err(format!("osd.{id} exists already, at {known}"))
            };
        }
        self.apply(&format!("osd.{id} added (out) at {addr}"), |m| {
            m.addrs.insert(id, addr);
            m.cluster.out.push(id);
            m.cluster.out.sort_unstable();
        })
    }

    /// Makes a pool change (`nacre pool create`) in a new epoch; why not,
    /// if it cannot be.
    pub fn pool_change(self: &Rc<Self>, c: PoolChange) -> Result<(), String> {
        match c {
            PoolChange::Create(rec) => self.add_pool(rec),
            PoolChange::Set { id, size, min_size } => self.set_pool(id, size, min_size),
            PoolChange::Remove { id } => self.rm_pool(id),
        }
    }

    /// Pool `id` with `size` copies and `min_size` (`None`: as it is), in
    /// a new epoch. Another size is another table: placement lays the
    /// pool out anew, and the OSDs each PG leaves that are complete stay
    /// in its acting set until the new members are (as when an OSD is
    /// marked out), so no copy is lost on the way.
    fn set_pool(
        self: &Rc<Self>,
        id: u32,
        size: Option<u8>,
        min_size: Option<u8>,
    ) -> Result<(), String> {
        let (p, out) = {
            let m = self.map.borrow();
            let p = (m.pools.get(&id).cloned()).ok_or_else(|| format!("no pool {id}"))?;
            (p, m.cluster.out.clone())
        };
        let rec = PoolRecord {
            size: size.unwrap_or(p.record.size),
            min_size: min_size.unwrap_or(p.record.min_size),
            ..p.record.clone()
        };
        nacre_meta::map::check_pool(&rec).map_err(|e| e.to_string())?;
        if rec == p.record {
            return Ok(());
        }
        let table = if rec.size == p.record.size {
            None
        } else {
            let osds = self
                .place(&rec, Some(&p.table), &out)
                .map_err(|e| format!("pool {} with {} copies: {e}", rec.name, rec.size))?;
            Some(osds)
        };
        let why = format!(
            "pool {}: {} copies, min_size {}{}",
            rec.name,
            rec.size,
            rec.min_size,
            if table.is_some() {
                " (placed anew)"
            } else {
                ""
            }
        );
        let set = |m: &mut OsdMap| {
            m.pools.get_mut(&id).expect("known pool").record = rec.clone();
            if let Some(osds) = &table {
                retable(m, id, rec.size, osds.clone());
            }
        };
        self.fits(&set)?;
        self.apply(&why, set)
    }

    /// Whether the map with `f` applied still fits the frame every OSD is
    /// sent it in (with room for each PG's interval to be recorded: a few
    /// hundred bytes each); why not.
    fn fits(&self, f: &impl Fn(&mut OsdMap)) -> Result<(), String> {
        let mut m = self.map.borrow().clone();
        f(&mut m);
        let intervals: usize = (m.pools.values())
            .map(|p| (p.table.pg_count() as usize).saturating_sub(p.last_active.len()))
            .sum();
        let per = 64 + 48 * (m.pools.values().map(|p| p.table.size).max().unwrap_or(1) as usize);
        let bytes = m.to_json().len() + intervals * per;
        let max = nacre_wire::PAYLOAD_MAX_BYTES as usize;
        if bytes > max {
            return Err(format!(
                "the map would be about {bytes} bytes with every PG's interval, more than the {max} a frame carries: fewer PGs or copies"
            ));
        }
        Ok(())
    }

    /// Takes pool `id` out of the map, in a new epoch; its id goes on
    /// the removed list, from which every OSD learns to delete what it
    /// holds of it. (That no volume uses it is the command's to check:
    /// the leader does not know volumes.)
    fn rm_pool(self: &Rc<Self>, id: u32) -> Result<(), String> {
        let name = match self.map.borrow().pools.get(&id) {
            Some(p) => p.record.name.clone(),
            None if self.map.borrow().cluster.removed_pools.contains(&id) => return Ok(()),
            None => return Err(format!("no pool {id}")),
        };
        self.apply(&format!("pool {name} (id {id}) removed"), |m| {
            m.pools.remove(&id);
            m.cluster.removed_pools.push(id);
            m.cluster.removed_pools.sort_unstable();
        })
    }

    /// Adds pool `rec` (its id new, its name unused), placed over the OSDs
    /// that are in. The same pool again is a no-op (a retried request).
    fn add_pool(self: &Rc<Self>, rec: PoolRecord) -> Result<(), String> {
        nacre_meta::map::check_pool(&rec).map_err(|e| e.to_string())?;
        let out = {
            let m = self.map.borrow();
            if m.cluster.removed_pools.contains(&rec.id) {
                return Err(format!(
                    "pool id {} was removed: ids are never given again",
                    rec.id
                ));
            }
            if let Some(p) = m
                .pools
                .values()
                .find(|p| p.record.shard_bytes() != rec.shard_bytes())
            {
                return Err(format!(
                    "shards of {} bytes: pool {}'s are {} (a copy or a shard of an object is one store block)",
                    rec.shard_bytes(), p.record.name, p.record.shard_bytes()
                ));
            }
            if let Some(p) = m.pools.get(&rec.id) {
                return if p.record == rec {
                    Ok(())
                } else {
                    Err(format!("pool id {} is pool {}'s", rec.id, p.record.name))
                };
            }
            if let Some(p) = m.pools.values().find(|p| p.record.name == rec.name) {
                return Err(format!(
                    "a pool named {:?} exists already (id {})",
                    rec.name, p.record.id
                ));
            }
            let others = m.pools.values().map(|p| p.record.pg_count).sum();
            nacre_meta::map::check_pg_total(others, &rec).map_err(|e| e.to_string())?;
            m.cluster.out.clone()
        };
        let placed = self
            .place(&rec, None, &out)
            .map_err(|e| format!("pool {}: {e}", rec.name))?;
        let why = format!(
            "pool {} (id {}) created: {}, min_size {}, {} PGs over {} OSDs",
            rec.name,
            rec.id,
            rec.scheme(),
            rec.min_size,
            rec.pg_count,
            (placed
                .osds
                .iter()
                .collect::<std::collections::BTreeSet<_>>())
            .len()
        );
        let table = PgTable::new(rec.id, rec.size, placed);
        let add = |m: &mut OsdMap| {
            let state = nacre_meta::map::PoolState {
                record: rec.clone(),
                table: table.clone(),
                last_active: BTreeMap::new(),
            };
            m.pools.insert(rec.id, state);
        };
        self.fits(&add)?;
        self.apply(&why, add)
    }

    /// Takes OSD `id` out of the map (`nacre osd rm`): only once it is
    /// down and out and no PG counts on its copies — none places it or has
    /// it in its acting set, and none went active last with it as a
    /// complete member (its copy may be the only one of some write).
    pub fn rm_osd(self: &Rc<Self>, id: u32) -> Result<(), String> {
        {
            let m = self.map.borrow();
            if !m.addrs.contains_key(&id) {
                return Err(format!("no osd.{id} in the map"));
            }
            let known = m.pools.values().any(|p| p.table.knows(id));
            if known && !m.cluster.out.contains(&id) {
                return Err(format!(
                    "osd.{id} is in: mark it out first (nacre osd out {id}) and wait until every PG is clean"
                ));
            }
            if m.is_up(id) {
                return Err(format!(
                    "osd.{id} is up: stop it first (SIGTERM; in nacre up, to the pid in DIR/osd.{id}.pid)"
                ));
            }
            if let Some(pg) = m.pgs().find(|&pg| m.acting(pg).contains(&id)) {
                return Err(format!(
                    "PG {pg} still has osd.{id} in its acting set: wait until every PG is clean"
                ));
            }
            let last = (m.pools.iter()).find_map(|(pool, p)| {
                let (pg, _) = (p.last_active.iter())
                    .find(|(_, iv)| iv.acting.contains(&id) && !iv.incomplete.contains(&id))?;
                Some(PgId::new(*pool, *pg))
            });
            if let Some(pg) = last {
                return Err(format!(
                    "PG {pg} last went active with osd.{id}'s copy: wait until it is active without it"
                ));
            }
        }
        self.apply(&format!("osd.{id} removed"), |m| {
            m.addrs.remove(&id);
            m.up_from.remove(&id);
            m.stores.remove(&id);
            m.full.remove(&id);
            m.cluster.out.retain(|&o| o != id);
            m.cluster.down.retain(|&o| o != id);
            m.cluster.demoted.retain(|&o| o != id);
        })?;
        self.heard.borrow_mut().remove(&id);
        self.demotions.borrow_mut().remove(&id);
        self.down_since.borrow_mut().remove(&id);
        self.auto_out.borrow_mut().remove(&id);
        Ok(())
    }

    pub fn map(&self) -> OsdMap {
        self.map.borrow().clone()
    }

    /// Drops the temporary members of every PG whose placement members are
    /// all up and complete in its last active interval: it holds `size`
    /// complete copies without them. One new epoch for all such PGs.
    fn settle_temps(self: &Rc<Self>) {
        let done: Vec<PgId> = {
            let m = self.map.borrow();
            (m.pools.iter())
                .flat_map(|(pool, p)| p.table.temp.keys().map(|pg| PgId::new(*pool, *pg)))
                .filter(|&pg| {
                    m.last_active(pg)
                        .is_some_and(|iv| (m.placement(pg).iter()).all(|&o| m.holds(iv, o)))
                })
                .collect()
        };
        if done.is_empty() {
            return;
        }
        let why = format!(
            "{} PGs complete where placement puts them: their temporary members leave",
            done.len()
        );
        let _ = self.change(&why, |m| {
            for pg in &done {
                if let Some(p) = m.pools.get_mut(&pg.pool) {
                    p.table.temp.remove(&pg.pg);
                }
            }
        });
    }

    /// Ends [`Leader::run`].
    pub fn stop(&self) {
        self.stopped.set(true);
    }

    /// From now on this leader answers only while `a` says it may act
    /// (`Unavailable` otherwise, to everything): an elected monitor's term
    /// can end while its process is paused, and the messages queued
    /// meanwhile must not be answered as if it still led.
    pub fn set_authority(&self, a: Authority) {
        *self.authority.borrow_mut() = Some(a);
    }

    /// Takes no PG event (no interval goes active, none ends) before `at`
    /// (`rt::monotonic`): an event that comes sooner waits. OSDs boot and
    /// peer meanwhile. An elected leader's predecessor may have granted
    /// read leases that last until then; a new interval going active
    /// before they end would let an old primary serve a stale read.
    pub fn hold_events_until(&self, at: Duration) {
        self.events_after.set(at);
    }

    fn may_act(&self) -> bool {
        !self.stopped.get()
            && self
                .authority
                .borrow()
                .as_ref()
                .is_none_or(|a| a().is_some())
    }

    /// The read lease an answer to a `Ping` or `Boot` grants (in its
    /// `length`, milliseconds from the request's sending): `READ_LEASE_MS`,
    /// but no longer than this leader's authority lasts, so that every
    /// read lease it granted has ended when etcd can elect another
    /// (docs/internals/cluster.md *Monitors*).
    fn read_lease_ms(&self) -> u32 {
        let full = nacre_types::READ_LEASE_MS;
        let left = (self.authority.borrow().as_ref())
            .map_or(Some(full), |a| a().map(|d| d.as_millis() as u64));
        left.unwrap_or(0).min(full) as u32
    }

    /// The lease (milliseconds, [`Leader::read_lease_ms`]) for OSD `id`'s
    /// heartbeat or boot that named epoch `named`, noted: none below the
    /// fence (the OSD learns the newer epoch from the answer and asks
    /// again with it).
    fn grant_lease(&self, id: u32, named: u64) -> u32 {
        if named < self.fence.get() {
            return 0;
        }
        let ms = self.read_lease_ms();
        if ms > 0 {
            let until = rt::monotonic() + Duration::from_millis(u64::from(ms));
            self.leases.borrow_mut().insert(id, (named, until));
        }
        ms
    }

    /// When every lease that may let one of `osds` serve reads in an epoch
    /// before `epoch` has ended (with a margin for clock rates): each
    /// one's last lease, if it was granted for an older epoch (an OSD's
    /// epochs only rise, so one granted in `epoch` or later means it
    /// serves no older epoch again). From now on no such lease is granted.
    fn leases_end(&self, epoch: u64, osds: impl Iterator<Item = u32>) -> Duration {
        self.fence.set(self.fence.get().max(epoch));
        let leases = self.leases.borrow();
        (osds.filter_map(|o| leases.get(&o)))
            .filter(|(named, _)| *named < epoch)
            .map(|(_, until)| *until + Duration::from_millis(LEASE_MARGIN_MS))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Stores the intervals of the PGs that went active since the last
    /// call, in one `persist` (a PG event each would be a meta-store
    /// write each: a thousand PGs peering at once held this thread for
    /// seconds, long enough to miss heartbeats), then answers their
    /// primaries. An event whose epoch ended meanwhile, or whose sender is
    /// no longer the PG's primary, is answered as it would have been had
    /// it arrived now.
    async fn store_actives(self: Rc<Self>) {
        // The events read in this turn of the runtime join the batch.
        rt::yield_now().await;
        self.storing.set(false);
        let batch = std::mem::take(&mut *self.actives.borrow_mut());
        let mut m = self.map.borrow().clone();
        let mut answers = Vec::with_capacity(batch.len());
        let mut changed = false;
        for a in batch {
            let s = if a.interval.epoch != m.epoch() {
                Status::StaleEpoch
            } else if m.primary(a.pg) != Some(a.primary) {
                Status::NotPrimary
            } else if let Some(p) = m.pools.get_mut(&a.pg.pool) {
                p.last_active.insert(a.pg.pg, a.interval);
                changed = true;
                Status::Ok
            } else {
                Status::Invalid
            };
            answers.push((a.pg, a.answer, s));
        }
        let stored = if !changed {
            Ok(())
        } else if !self.may_act() {
            Err("this leader's term ended".to_string())
        } else {
            (self.persist)(&m)
        };
        match &stored {
            Ok(()) if changed => *self.map.borrow_mut() = m,
            Ok(()) => {}
            Err(e) => {
                let pgs: Vec<PgId> = (answers.iter())
                    .filter(|(_, _, s)| *s == Status::Ok)
                    .map(|(pg, _, _)| *pg)
                    .collect();
                tracing::error!("leader: cannot record PGs {pgs:?} active: {e}");
            }
        }
        for (_, answer, s) in answers {
            answer.set(Some(match (&stored, s) {
                (Err(_), Status::Ok) => Status::Unavailable,
                _ => s,
            }));
        }
        self.stored.notify();
    }

    /// [`Leader::change`] for an admin's request: why not, as text.
    fn apply(self: &Rc<Self>, why: &str, change: impl FnOnce(&mut OsdMap)) -> Result<(), String> {
        self.change(why, change)
            .map(drop)
            .map_err(|s| format!("the map could not be stored: {s:?}"))
    }

    /// A new epoch with `change` applied: persisted, then pushed.
    fn change(self: &Rc<Self>, why: &str, change: impl FnOnce(&mut OsdMap)) -> Result<u64, Status> {
        if !self.may_act() {
            return Err(Status::Unavailable);
        }
        let mut m = self.map.borrow().clone();
        if m.epoch() >= EPOCH_MAX {
            tracing::error!("leader: the map is at its last epoch {}", m.epoch());
            return Err(Status::Unavailable);
        }
        m.cluster.epoch += 1;
        change(&mut m);
        if let Err(e) = (self.persist)(&m) {
            tracing::error!("leader: cannot store epoch {}: {e}", m.epoch());
            return Err(Status::Unavailable);
        }
        tracing::info!("leader: epoch {}: {why}", m.epoch());
        let epoch = m.epoch();
        let up: Vec<u32> = m.up_from.keys().copied().collect();
        *self.map.borrow_mut() = m;
        for id in up {
            rt::spawn(self.clone().push(id));
        }
        Ok(epoch)
    }

    fn conn(&self, id: u32) -> Option<Rc<T::Conn>> {
        if let Some(c) = self.conns.borrow().get(&id) {
            if !c.is_closed() {
                return Some(c.clone());
            }
        }
        let addr = self.map.borrow().addr(id)?;
        let c = self.transport.connect(&addr).ok()?;
        self.conns.borrow_mut().insert(id, c.clone());
        Some(c)
    }

    /// Sends the current map to OSD `id` (once; heartbeats catch misses).
    async fn push(self: Rc<Self>, id: u32) {
        let (epoch, body) = {
            let m = self.map.borrow();
            (m.epoch(), m.to_json())
        };
        let Some(c) = self.conn(id) else { return };
        let mut h = Header::request(Op::Map, 0, ObjectId::default()).with_payload(&body);
        h.epoch = epoch;
        let _ = c.call(h, Some(AlignedBuf::from_slice(&body))).await;
    }

    /// A heartbeat from OSD `h.sender`, incarnation `h.obj_version` (its
    /// `up_from`): counted when it arrives, if that incarnation is up;
    /// `Unavailable` if it is not (it must boot again). The answer carries
    /// the epoch.
    fn heartbeat(&self, h: &Header) -> Header {
        let m = self.map.borrow();
        let up = m.up_from.get(&h.sender) == Some(&h.obj_version);
        if up {
            self.heard.borrow_mut().insert(h.sender, rt::monotonic());
        }
        let mut r = h.reply(if up { Status::Ok } else { Status::Unavailable });
        r.epoch = m.epoch();
        r
    }

    /// Records whether OSD `id`'s store is full, as its heartbeat says, in
    /// a new epoch when that changes (primaries then refuse new objects
    /// for its PGs up front).
    fn note_full(self: &Rc<Self>, id: u32, full: bool) {
        if self.map.borrow().full.contains(&id) == full {
            return;
        }
        let why = format!("osd.{id} {}", if full { "full" } else { "no longer full" });
        let _ = self.change(&why, |m| {
            if full {
                m.full.insert(id);
            } else {
                m.full.remove(&id);
            }
        });
    }

    /// Marks OSDs whose heartbeats stopped down, until [`Leader::stop`].
    pub async fn run(self: Rc<Self>) {
        let every = Duration::from_millis(HEARTBEAT_INTERVAL_MS);
        let grace = Duration::from_millis(HEARTBEAT_GRACE_MS);
        let mut ticked = rt::monotonic();
        while !self.stopped.get() {
            rt::sleep(every).await;
            let up: Vec<u32> = self.map.borrow().up_from.keys().copied().collect();
            let now = rt::monotonic();
            // A tick this late means this thread was held up (a slow meta
            // store under `persist`): the heartbeats that arrived meanwhile
            // are still unread, so the silence is the leader's own. Every
            // OSD gets a fresh grace (a later mark-down is always safe).
            let gap = now.saturating_sub(ticked);
            ticked = now;
            if gap > 2 * every {
                tracing::warn!(
                    "leader: held up for {gap:?}; no OSD is marked down for the silence meanwhile"
                );
                let mut heard = self.heard.borrow_mut();
                for id in &up {
                    heard.insert(*id, now);
                }
                continue;
            }
            let silent: Vec<u32> = {
                let heard = self.heard.borrow();
                (up.iter().copied())
                    .filter(|id| heard.get(id).is_none_or(|t| now.saturating_sub(*t) > grace))
                    .collect()
            };
            if !silent.is_empty() {
                let why =
                    format!("marked down (no heartbeat for {HEARTBEAT_GRACE_MS} ms): {silent:?}");
                let _ = self.mark_down(&why, &silent);
            }
            self.out_the_long_down();
            self.demote_the_slow();
            // Every epoch makes every PG peer again: drop temporary
            // members in batches, not one epoch per PG that finished.
            let now = rt::monotonic();
            if now >= self.settled.get() + Duration::from_millis(TEMP_SETTLE_MS) {
                self.settled.set(now);
                self.settle_temps();
            }
        }
    }

    fn mark_down(self: &Rc<Self>, why: &str, ids: &[u32]) -> Result<u64, Status> {
        let now = rt::monotonic();
        for &id in ids {
            self.down_since.borrow_mut().entry(id).or_insert(now);
            // Its next incarnation is judged by its own figures.
            self.slow_figures.borrow_mut().remove(&id);
        }
        self.change(why, |m| {
            for id in ids {
                m.up_from.remove(id);
                if !m.cluster.down.contains(id) {
                    m.cluster.down.push(*id);
                }
            }
            m.cluster.down.sort_unstable();
        })
    }

    /// The process of OSD `id`, incarnation `up_from`, has exited: down
    /// now if that incarnation is up (a later one, or one already down,
    /// is left alone).
    fn dead(self: &Rc<Self>, id: u32, up_from: u64) -> Status {
        if !self.map.borrow().addrs.contains_key(&id) {
            return Status::Invalid;
        }
        if self.map.borrow().up_from.get(&id) != Some(&up_from) {
            return Status::Ok;
        }
        match self.mark_down(&format!("osd.{id} marked down (its process exited)"), &[id]) {
            Ok(_) => {
                // A process that exited serves nothing.
                self.leases.borrow_mut().remove(&id);
                Status::Ok
            }
            Err(s) => s,
        }
    }

    fn boot(self: &Rc<Self>, id: u32, body: &[u8]) -> Result<(), Status> {
        let store = std::str::from_utf8(body).map_err(|_| Status::Invalid)?;
        if !self.map.borrow().addrs.contains_key(&id) || !is_store_id(store) {
            return Err(Status::Invalid);
        }
        let stranger = {
            let m = self.map.borrow();
            let was = (m.pools.values())
                .flat_map(|p| p.last_active.values())
                .find_map(|i| i.stores.get(&id).filter(|s| *s != store));
            was.cloned()
        };
        if let Some(was) = stranger {
            tracing::warn!(
                "leader: osd.{id} boots with store {store}, not {was}: it holds none of the writes of its earlier intervals"
            );
        }
        // A new disk is not held for its predecessor's slowness.
        if (self.map.borrow().stores.get(&id)).is_some_and(|s| s != store) {
            self.demotions.borrow_mut().remove(&id);
        }
        self.change(&format!("osd.{id} up"), |m| {
            m.cluster.down.retain(|o| *o != id);
            let e = m.epoch();
            m.up_from.insert(id, e);
            m.stores.insert(id, store.to_string());
        })?;
        self.heard.borrow_mut().insert(id, rt::monotonic());
        self.down_since.borrow_mut().remove(&id);
        // Marked out only for being down: in again, now that it is back.
        if self.auto_out.borrow_mut().remove(&id) {
            match self.mark_out(id, false) {
                Ok(()) => tracing::info!("leader: osd.{id} is back: marked in"),
                Err(why) => tracing::warn!("leader: osd.{id} is back but not marked in: {why}"),
            }
        }
        Ok(())
    }

    async fn pg_event(self: &Rc<Self>, h: &Header, body: &[u8]) -> Status {
        let Ok(ev) = serde_json::from_slice::<PgEvent>(body) else {
            return Status::Invalid;
        };
        let (epoch, primary, acting, size, row, positional) = {
            let m = self.map.borrow();
            if !m.has(h.pg_id()) {
                return Status::Invalid;
            }
            let positional = (m.pools.get(&h.pool)).is_some_and(|p| p.record.ec.is_some());
            (
                m.epoch(),
                m.primary(h.pg_id()),
                m.acting(h.pg_id()),
                m.size(h.pool),
                if positional {
                    m.placement(h.pg_id()).to_vec()
                } else {
                    Vec::new()
                },
                positional,
            )
        };
        if h.epoch != epoch {
            return Status::StaleEpoch;
        }
        if primary != Some(h.sender) {
            return Status::NotPrimary;
        }
        match ev {
            PgEvent::Active {
                clean,
                incomplete,
                heard,
            } => {
                if incomplete.iter().any(|o| !acting.contains(o))
                    || (clean && !incomplete.is_empty())
                {
                    return Status::Invalid;
                }
                // The first record in this epoch: the last active
                // interval's members that could serve reads of it (its
                // primary; any member of an EC PG, whose shards answer
                // direct reads) and did not answer this peering may still
                // serve them, not having heard of this epoch, until their
                // leases end — or they heartbeat naming this epoch.
                let prior = self.map.borrow().last_active(h.pg_id()).cloned();
                if let Some(p) = prior.filter(|p| p.epoch != epoch) {
                    // (A replicated PG's primary: the one that reported the
                    // interval active — with a member demoted it need not
                    // be the first.)
                    let led = p.primary.or(p.acting.first().copied());
                    let readers: Vec<u32> = if positional {
                        p.acting.clone()
                    } else {
                        led.into_iter().collect()
                    };
                    let unheard: Vec<u32> = (readers.iter().copied())
                        .filter(|o| *o != h.sender && !heard.contains(o))
                        .collect();
                    let mut said = false;
                    loop {
                        let now = rt::monotonic();
                        let end = self.leases_end(epoch, unheard.iter().copied());
                        if end <= now {
                            break;
                        }
                        if !said {
                            said = true;
                            tracing::info!(
                                "leader: PG {} waits up to {} ms for the read leases of {unheard:?} (its last interval's, epoch {}) to end",
                                h.pg_id(),
                                (end - now).as_millis(),
                                p.epoch
                            );
                        }
                        rt::sleep((end - now).min(Duration::from_millis(100))).await;
                        let m = self.map.borrow();
                        if m.epoch() != epoch {
                            return Status::StaleEpoch;
                        }
                        if m.primary(h.pg_id()) != Some(h.sender) {
                            return Status::NotPrimary;
                        }
                    }
                }
                let stores = {
                    let m = self.map.borrow();
                    (acting.iter())
                        .filter_map(|o| Some((*o, m.stores.get(o)?.clone())))
                        .collect()
                };
                let answer = Rc::new(Cell::new(None));
                self.actives.borrow_mut().push(Active {
                    pg: h.pg_id(),
                    primary: h.sender,
                    interval: Interval {
                        epoch,
                        acting,
                        stores,
                        incomplete,
                        row,
                        primary: Some(h.sender),
                    },
                    answer: answer.clone(),
                });
                if !self.storing.replace(true) {
                    rt::spawn(self.clone().store_actives());
                }
                let s = loop {
                    if let Some(s) = answer.get() {
                        break s;
                    }
                    self.stored.wait().await;
                };
                if clean && s == Status::Ok {
                    tracing::debug!(
                        "leader: PG {} active+clean in epoch {epoch} ({size} copies)",
                        h.pg_id()
                    );
                }
                s
            }
            PgEvent::Failed { why } => {
                let why = format!("PG {} interval ends: {why}", h.pg_id());
                match self.change(&why, |_| {}) {
                    Ok(_) => Status::Ok,
                    Err(s) => s,
                }
            }
        }
    }
}

impl<T: Transport> Handler for Leader<T> {
    /// The map for `Boot` and `GetMap` (as large as a frame may be), a
    /// refusal's few words for the others.
    fn reply_bytes_max(&self, h: &Header) -> usize {
        match h.op {
            Op::Boot | Op::GetMap => nacre_wire::PAYLOAD_MAX_BYTES as usize,
            _ => 4096,
        }
    }

    async fn handle(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        let h = f.h;
        if !self.may_act() {
            // A leader that stepped down (its term ended) answers nothing:
            // a heartbeat it answered would extend a read lease past the
            // next leader's start.
            return (h.reply(Status::Unavailable), None);
        }
        match h.op {
            Op::Boot => match self.boot(h.sender, f.payload.as_deref().unwrap_or(&[])) {
                Ok(()) => {
                    // A new incarnation: judged by its own figures.
                    self.slow_figures.borrow_mut().remove(&h.sender);
                    let (mut r, body) = json_reply(&h, self.map.borrow().to_json());
                    // The OSD takes this map: the lease is for its epoch.
                    r.length = self.grant_lease(h.sender, self.map.borrow().epoch());
                    (r, body)
                }
                Err(s) => (h.reply(s), None),
            },
            Op::GetMap => json_reply(&h, self.map.borrow().to_json()),
            Op::Ping => {
                let mut r = self.heartbeat(&h);
                if r.status == Status::Ok {
                    if let Some(b) = f.payload.as_deref().filter(|b| !b.is_empty()) {
                        let p99: Vec<Option<f64>> = (b.chunks_exact(4))
                            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                            .map(|us| (us > 0).then_some(f64::from(us)))
                            .collect();
                        self.slow_figures.borrow_mut().insert(h.sender, p99);
                    }
                    self.note_full(h.sender, h.offset != 0);
                    r.length = self.grant_lease(h.sender, h.epoch);
                }
                (r, None)
            }
            Op::Dead => (h.reply(self.dead(h.sender, h.obj_version)), None),
            Op::MarkOut => refusal(&h, self.mark_out(h.sender, h.obj_version != 0)),
            Op::RmOsd => refusal(&h, self.rm_osd(h.sender)),
            Op::PoolChange => {
                let c = serde_json::from_slice(f.payload.as_deref().unwrap_or(&[]))
                    .map_err(|e| format!("a pool change that does not parse: {e}"));
                refusal(&h, c.and_then(|c| self.pool_change(c)))
            }
            Op::AddOsd => {
                let addr = std::str::from_utf8(f.payload.as_deref().unwrap_or(&[]))
                    .map_err(|_| "the address is not UTF-8".to_string())
                    .map(str::to_string);
                refusal(&h, addr.and_then(|a| self.add_osd(h.sender, a)))
            }
            Op::PgEvent => {
                let wait = self.events_after.get().saturating_sub(rt::monotonic());
                if !wait.is_zero() {
                    rt::sleep(wait).await;
                    if !self.may_act() {
                        return (h.reply(Status::Unavailable), None);
                    }
                }
                let body = f.payload.as_deref().unwrap_or(&[]);
                let s = self.pg_event(&h, body).await;
                let mut r = h.reply(s);
                r.epoch = self.map.borrow().epoch();
                (r, None)
            }
            _ => (h.reply(Status::Invalid), None),
        }
    }
}

/// Gives pool `pool` of `m` the table `osds` of `size` OSDs per PG, its
/// temporary members those of the old table's acting sets that it leaves
/// and that are complete ([`temp_members`]).
fn retable(m: &mut OsdMap, pool: u32, size: u8, placed: Placed) {
    let old = m.pools[&pool].table.clone();
    let t = &mut m.pools.get_mut(&pool).expect("known pool").table;
    (t.size, t.osds, t.lead) = (size, placed.osds, placed.lead);
    let temp = temp_members(m, pool, &old);
    m.pools.get_mut(&pool).expect("known pool").table.temp = temp;
}

/// The temporary members of every PG of pool `pool` of `m`, whose table
/// just changed from `old`: the OSDs of its old acting set that the new
/// table moves it away from and that are complete in its last active
/// interval (up with the store they had then). They stay in the acting
/// set, taking every write, until the new members are complete
/// (`Leader::settle_temps`), so a PG that moves keeps its complete copies
/// meanwhile.
///
/// None for an erasure-coded pool: a shard that moves is rebuilt at its
/// new slot from `k` others by the next peering (a temporary member
/// would have to keep its old slot, which the table cannot name yet).
fn temp_members(m: &OsdMap, pool: u32, old: &PgTable) -> BTreeMap<u32, Vec<u32>> {
    let mut temp = BTreeMap::new();
    if (m.pools.get(&pool)).is_some_and(|p| p.record.ec.is_some()) {
        return temp;
    }
    for pg in 0..old.pg_count() {
        let id = PgId::new(pool, pg);
        let Some(iv) = m.last_active(id) else {
            continue;
        };
        // Not a full one: marking a full OSD out is how its PGs take
        // writes of new objects again at once.
        let keep: Vec<u32> = (old.acting(pg, &m.cluster.down).into_iter())
            .filter(|&o| !m.placement(id).contains(&o) && m.holds(iv, o) && !m.full.contains(&o))
            .collect();
        if !keep.is_empty() {
            temp.insert(pg, keep);
        }
    }
    temp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table change keeps, per PG, the members it moves away from that
    /// are up and complete in the last active interval — not the ones
    /// that were being recovered, nor those down or with another store.
    #[test]
    fn a_moved_pg_keeps_its_complete_copies_as_temporary_members() {
        let store = |o: u32| format!("{o:032x}");
        let record = PoolRecord {
            id: 1,
            name: "rbd".into(),
            size: 2,
            min_size: 1,
            pg_count: 3,
            failure_domain: "osd".into(),
            object_bytes: 4096,
            ec: None,
        };
        let table = PgTable {
            pool: 1,
            size: 2,
            osds: vec![0, 1, 2, 3, 1, 2],
            lead: Vec::new(),
            temp: BTreeMap::new(),
        };
        let mut m = OsdMap {
            cluster: nacre_meta::map::ClusterState {
                epoch: 9,
                ..Default::default()
            },
            pools: [(
                1,
                nacre_meta::map::PoolState {
                    record,
                    table,
                    last_active: Default::default(),
                },
            )]
            .into(),
            addrs: (0..5).map(|o| (o, format!("unix:/tmp/{o}"))).collect(),
            up_from: (0..5).map(|o| (o, 2)).collect(),
            stores: (0..5).map(|o| (o, store(o))).collect(),
            full: Default::default(),
        };
        let iv = |acting: &[u32], incomplete: &[u32]| Interval {
            epoch: 8,
            acting: acting.to_vec(),
            stores: acting.iter().map(|&o| (o, store(o))).collect(),
            incomplete: incomplete.to_vec(),
            ..Interval::default()
        };
        let pool = m.pools.get_mut(&1).unwrap();
        pool.last_active.insert(0, iv(&[0, 1], &[]));
        pool.last_active.insert(1, iv(&[2, 3], &[3]));
        pool.last_active.insert(2, iv(&[1, 2], &[]));
        let old = pool.table.clone();
        // osd.1 and osd.3 out: PG 0 → [0, 4], PG 1 → [2, 4], PG 2 → [4, 2].
        pool.table.osds = vec![0, 4, 2, 4, 4, 2];
        let t = temp_members(&m, 1, &old);
        assert_eq!(t.get(&0), Some(&vec![1]), "complete: stays");
        assert_eq!(t.get(&1), None, "osd.3 was incomplete");
        assert_eq!(t.get(&2), Some(&vec![1]));
        // Full, down, or back with another store: nothing kept.
        m.full.insert(1);
        assert!(temp_members(&m, 1, &old).is_empty());
        m.full.clear();
        m.up_from.remove(&1);
        assert!(temp_members(&m, 1, &old).is_empty());
        m.up_from.insert(1, 10);
        m.stores.insert(1, store(7));
        assert!(temp_members(&m, 1, &old).is_empty());
        // A new lineage of the same store is another store too.
        m.stores.insert(1, format!("{}.1", store(1)));
        assert!(temp_members(&m, 1, &old).is_empty());
        // An erasure-coded pool's PGs get none: a moved shard is rebuilt.
        m.stores.insert(1, store(1));
        assert_eq!(temp_members(&m, 1, &old).len(), 2);
        let p = m.pools.get_mut(&1).unwrap();
        p.record.ec = Some(nacre_meta::map::EcScheme { k: 2, m: 1 });
        assert!(temp_members(&m, 1, &old).is_empty());
    }

    #[test]
    fn a_repeated_demotion_holds_longer_each_time_up_to_32_minutes() {
        let m = |n| hold_down(n).as_secs() / 60;
        assert_eq!(hold_down(1), Duration::ZERO);
        assert_eq!(
            [m(2), m(3), m(4), m(7), m(8), m(1000)],
            [1, 2, 4, 32, 32, 32]
        );
    }

    #[test]
    fn store_ids_are_a_uuid_and_a_lineage() {
        let uuid = "0123456789abcdef0123456789abcdef";
        for ok in [
            uuid.to_string(),
            format!("{uuid}.1"),
            format!("{uuid}.4294967295"),
        ] {
            assert!(is_store_id(&ok), "{ok}");
        }
        for bad in [
            String::new(),
            uuid[1..].to_string(),
            uuid.to_uppercase(),
            format!("{uuid}."),
            format!("{uuid}.0"),
            format!("{uuid}.01"),
            format!("{uuid}.+1"),
            format!("{uuid}.4294967296"),
            format!("{uuid}.1.1"),
            format!("{uuid}x"),
        ] {
            assert!(!is_store_id(&bad), "{bad}");
        }
    }
}
