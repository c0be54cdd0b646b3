//! The OSD: one blockstore, served over the wire protocol.
//!
//! As **primary** of a PG it orders writes per object (one write per object
//! in flight; writes to different objects run in parallel), assigns each
//! write or delete the PG's next version `epoch << 32 | seq`
//! (docs/internals/replication.md §3: the PG table's epoch rises at every
//! OSD start, so a restarted primary never hands out a version again),
//! writes it with its PG log entry to its own store and to every replica of
//! the acting set in parallel, and acknowledges once all of them report it
//! durable. A delete is logged and replicated even where the object is
//! absent (a tombstone). A `(client, request id)` seen before is answered
//! from a cache, filled at every peering from the authoritative PG log,
//! instead of being applied twice, so a client may retry any write after a
//! lost connection, a restart or a failover. Reads are served from the
//! primary's store once no write of the object is in flight and while its
//! read lease holds; a small read never touches other OSDs.
//!
//! As **replica** it applies `RepWrite`/`RepDelete` at the version the
//! primary chose, with the same log entry (the sub-op carries the client's
//! id and request id); the store takes a repeat of a version as done only
//! for the same entry, so a primary's retry is harmless and a version
//! given to two contents is refused.
//!
//! Every object op carries the epoch of the PG table the sender used; an
//! OSD refuses any other epoch (`StaleEpoch`, with its own epoch in the
//! reply), any client op for a PG it is not primary of (`NotPrimary`), and
//! any sub-op whose sender is not the PG's primary.
//!
//! The map comes from the leader ([`leader`]): an OSD boots (the leader
//! marks it up in a new epoch), and at every new epoch the primary of each
//! PG peers ([`peering`]): it brings every copy of the acting set to the
//! authoritative history, has the leader record the interval as active,
//! and only then serves the PG's client ops. A write that fails on some
//! copy stops the PG and ends the interval (the leader starts a new epoch),
//! so copies never drift apart under one version.

mod bench;
mod ec;
pub mod leader;
pub mod map;
mod netbench;
mod peering;
mod recovery;
mod scrub;
pub mod slow;
mod stats;
mod stray;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use nacre_blockstore::{
    Error as StoreError, FormatOptions, LogEntry, LogOp, OpenReport, Store, StoreOptions,
};
use nacre_io::net::{Addr, Listener};
use nacre_io::sync::Notify;
use nacre_io::{rt, AlignedBuf, BlockDev, FileDev, OpenFlags, SharedBuf};
use nacre_net::{Frame, Handler, NetError, Rpc, Sockets, Transport};
use nacre_types::{ObjectId, PgId, DAMAGED_OBJECTS_OUT, PG_WAIT_MS};
use nacre_wire::{Header, Op, Status, SENDER_CLIENT};

pub use bench::{BenchReport, BenchTest, BENCH_BYTES_MAX, BENCH_BYTES_MIN, BENCH_VOLUME};
pub use map::{OsdMap, PgEvent, PoolChange};
pub use netbench::LinkReport;
pub use peering::PG_QUERY_PAGE_OBJECTS;
pub use recovery::RECOVERY_BYTES_PER_S_DEFAULT;
pub use scrub::{
    encode_oids, ScrubConfig, ScrubNews, ScrubReport, DEEP_SCRUB_INTERVAL_DEFAULT,
    SCRUB_BYTES_PER_S_DEFAULT, SCRUB_INTERVAL_DEFAULT,
};
pub use stats::{
    OpMetrics, OsdMetrics, OsdReport, OsdStats, PgReport, StoreMetrics, VolumeUsage,
    LATENCY_WINDOWS_KEPT, PG_REPORT_MAX,
};
pub use stray::STRAY_CHECK_MS;

/// Completed writes remembered for retries, per PG (twice what a PG log
/// holds at the default slot size, which refills the cache at peering).
const REQ_CACHE_MAX: usize = 1024;
/// Deletes in flight while purging a volume.
const PURGE_PARALLEL_MAX: usize = 64;
/// Attempts to reach a replica before the write fails.
const REPLICA_ATTEMPT_MAX: u32 = 3;
/// Attempts to reach the leader at boot, one every `LEADER_RETRY`.
const BOOT_ATTEMPT_MAX: u32 = 100;
const LEADER_RETRY: Duration = Duration::from_millis(200);
/// A PG's versions in one epoch are `epoch << 32 | seq` with `seq` below
/// this; a primary that reaches it stops taking writes for the PG until
/// the epoch changes (at 100 000 writes/s into one PG: after 11 hours).
pub const PG_SEQ_MAX: u64 = (1 << 32) - (1 << 16);

/// Where an OSD keeps its data and how it is reached.
#[derive(Clone, Debug)]
pub struct OsdConfig {
    pub id: u32,
    pub path: PathBuf,
    /// Size of the store file when it is created.
    pub size_bytes: u64,
    pub addr: Addr,
    pub object_bytes: u32,
    /// Journal size of a new store (the store's default if `None`).
    pub journal_bytes: Option<u64>,
    /// PGs a new store can hold logs of ([`pg_log_region`]).
    pub pg_log_slots: u32,
    /// O_DIRECT (off only on file systems that refuse it, e.g. tmpfs).
    pub direct: bool,
    /// Where the cluster map's leader listens.
    pub leader: LeaderAddr,
}

/// Where the cluster map's leader listens, shared with whoever learns of a
/// new one (an OSD daemon's watch on the elected monitor's key): the next
/// call to the leader goes to the new address.
#[derive(Clone, Debug)]
pub struct LeaderAddr(std::sync::Arc<std::sync::Mutex<Addr>>);

impl LeaderAddr {
    pub fn new(addr: Addr) -> LeaderAddr {
        LeaderAddr(std::sync::Arc::new(std::sync::Mutex::new(addr)))
    }
    pub fn get(&self) -> Addr {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    pub fn set(&self, addr: Addr) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = addr;
    }
}

/// A PG this OSD is primary of, in the current epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PgState {
    /// Gathering the copies' histories and recovering them.
    Peering,
    /// Serving client ops.
    Active,
    /// A write failed on some copy: no ops until the next epoch.
    Failed,
    /// Cannot peer in this epoch (too few copies up, or no member of the
    /// last active interval): the reason.
    Inactive(String),
}

/// An OSD: its store on a device `D` (a file or block device in a cluster,
/// the fault-injecting device in the simulator) and its peers over a
/// transport `T` (sockets, or the simulator's network).
pub struct Osd<D: BlockDev + 'static = FileDev, T: Transport = Sockets> {
    pub id: u32,
    store: Store<D>,
    transport: T,
    leader: LeaderAddr,
    /// The connection to the leader, and the address it went to.
    leader_conn: RefCell<Option<(Addr, Rc<T::Conn>)>>,
    /// Epoch 0 until the leader answered `Boot`.
    map: RefCell<OsdMap>,
    /// The epoch this incarnation was marked up in (0: not yet).
    up_from: Cell<u64>,
    /// A map fetch is under way.
    fetching: Cell<bool>,
    /// A boot again (after being marked down while running) is under way.
    rebooting: Cell<bool>,
    /// When the read lease ends: the sending of the last heartbeat (or
    /// `Boot`) the leader answered, plus what the answer granted. And
    /// whether the task that sends them runs.
    leased: Cell<Duration>,
    beating: Cell<bool>,
    /// Closed or crashed: takes no new map, boots no more.
    halted: Cell<bool>,
    /// The PGs this OSD is primary of in the current epoch.
    pgs: RefCell<HashMap<PgId, PgState>>,
    pg_changed: Notify,
    /// Writes and deletes in flight per (PG, epoch): a peering query of a
    /// newer epoch waits for older ones to finish, so its answer includes
    /// every op this copy will ever acknowledge for them.
    inflight: RefCell<HashMap<(PgId, u64), u32>>,
    drained: Notify,
    peers: RefCell<HashMap<u32, Rc<T::Conn>>>,
    /// Objects with a write or delete in flight, and a wake-up for waiters.
    busy: RefCell<HashSet<ObjectId>>,
    unbusy: Notify,
    /// Per PG, the epoch and the last `seq` this primary assigned in it.
    seqs: RefCell<HashMap<PgId, (u64, u64)>>,
    /// The newest epoch in the store's PG logs at open: this incarnation
    /// assigns versions only in later epochs, so that it never repeats one
    /// an earlier incarnation gave out (whatever the map says).
    epoch_floor: u64,
    /// Per PG, requests applied (client id, request id → version): filled
    /// from the authoritative log at every peering, then by acknowledged
    /// writes, so a retry is answered and not applied again.
    done: RefCell<HashMap<PgId, ReqCache>>,
    /// Per PG this OSD is primary of, the copies it still recovers in the
    /// background (`recovery.rs`); and the pace: bytes per second, and when
    /// the budget next allows a push.
    recovery: RefCell<HashMap<PgId, recovery::Recovery>>,
    recovery_rate: Cell<u64>,
    recovery_next: Cell<Duration>,
    /// The fewest complete copies of the PGs this OSD recovers, when it
    /// was computed and in which epoch (`recovery::outranked`).
    recovery_floor: Cell<(Duration, u64, usize)>,
    /// Objects per PG query answer (`peering::PG_QUERY_PAGE_OBJECTS`).
    query_page: Cell<usize>,
    /// Used fractions of the store at which it is near full (a warning)
    /// and full (writes that need new space refused, recovery goes on).
    ratios: Cell<(f64, f64)>,
    /// PGs whose stray copy is being deleted here (`stray.rs`): writes
    /// into them are refused meanwhile.
    removing: RefCell<HashSet<PgId>>,
    /// The removed pools of the last purge that left nothing of them, and
    /// when (`stray::purge_removed_pools` lists the store again only when
    /// the list changes or that is old).
    purged_pools: RefCell<(Vec<u32>, Duration)>,
    /// The epoch in which a look for stray copies last found none, and
    /// when (`stray::stray_loop` looks again only when that is old).
    strays_none: Cell<(u64, Duration)>,
    /// Whether the last heartbeat said the store is full.
    said_full: Cell<bool>,
    /// Asking the leader to mark this OSD out for its damaged reads
    /// ([`Osd::note_damage`]) is under way.
    asking_out: Cell<bool>,
    /// The PG being scrubbed here (and whether deeply), a wake-up for
    /// scrubs waiting their turn, the schedule and pace (`scrub.rs`): per
    /// PG when it was scrubbed, when its next light and deep scrubs are
    /// due, and when the budget next allows a read; the scrubs to record
    /// in the cluster's stamps.
    scrubbing: Cell<Option<(PgId, bool)>>,
    scrub_idle: Notify,
    scrub_cfg: Cell<ScrubConfig>,
    scrub_hist: RefCell<HashMap<PgId, scrub::History>>,
    scrub_news: RefCell<std::collections::VecDeque<ScrubNews>>,
    scrub_due: RefCell<HashMap<PgId, (Duration, Duration)>>,
    scrub_next: Cell<Duration>,
    /// Volumes this OSD was asked to purge since it started: their copies
    /// differ while the purge goes from OSD to OSD, and scrub leaves them
    /// alone (the monitor's sweep deletes what a purge left).
    purged: RefCell<HashSet<u64>>,
    /// Scrubs admins asked for: the last ticket given, those queued or
    /// running (ticket, PG, deep), and the reports of those done.
    scrub_tickets: Cell<u64>,
    benches: bench::Benches,
    scrub_asked: RefCell<Vec<(u64, PgId, bool)>>,
    scrub_reports: RefCell<BTreeMap<u64, ScrubReport>>,
    /// Per erasure-coded pool, its code and layout (`ec.rs`).
    schemes: RefCell<HashMap<u32, Rc<ec::Scheme>>>,
    /// Per erasure-coded PG, the commits its shards are still to hear.
    commits: RefCell<HashMap<PgId, ec::Commits>>,
    /// Per erasure-coded PG, the epoch its primary named this OSD's shard
    /// complete in (`Op::ShardActive`): it answers clients' direct reads
    /// of its slot while that is its epoch.
    serving: RefCell<HashMap<PgId, u64>>,
    /// Shard objects deleted or replaced whole here whose commit has not
    /// arrived (shard object → the op's version): those ops keep no undo,
    /// so until then a delete might be on this shard alone, never
    /// acknowledged, and undone by the next peering (and a replaced shard
    /// is left unread until its write is known committed too); direct
    /// reads of them are refused. A new map clears it (no direct read is
    /// answered before the next peering settles every op).
    deleting: RefCell<HashMap<ObjectId, u64>>,
    pub stats: OsdStats,
}

#[derive(Default)]
pub(crate) struct ReqCache {
    map: HashMap<(u64, u64), u64>,
    order: VecDeque<(u64, u64)>,
}

impl ReqCache {
    /// The requests a PG's authoritative log holds as applied, for a new
    /// primary to answer their retries from: every client entry, except
    /// those of an object a later rewrite (client 0: peering's undoing of
    /// divergent ops, scrub's repair) wrote over. A rewrite restores the
    /// authority's content, which may not hold the entry's effect (the
    /// entry was divergent on that copy), and the same log may still name
    /// it: the rewrite and the log sync that forgets the divergent entries
    /// are separate steps, and an epoch can end between them (simulator
    /// seed 96 of `acknowledged_ops_survive_osds_marked_out_and_in` lost an
    /// acknowledged write that way). Such a request is applied again when
    /// retried. The rule is coarse: it also hides requests the rewrite
    /// kept, whose retry then writes their bytes a second time, over any
    /// later overlapping write that was in flight beside it
    /// (replication.md §5.3 step 5).
    pub(crate) fn of_log(log: &nacre_blockstore::PgLog) -> ReqCache {
        let mut rewritten: HashMap<ObjectId, u64> = HashMap::new();
        for e in log.entries.values().filter(|e| e.client == 0) {
            rewritten.insert(e.oid, e.version);
        }
        let mut done = ReqCache::default();
        for e in log.entries.values().filter(|e| e.client != 0) {
            if rewritten.get(&e.oid).is_none_or(|&w| w < e.version) {
                done.insert((e.client, e.request), e.version);
            }
        }
        done
    }

    fn get(&self, k: (u64, u64)) -> Option<u64> {
        self.map.get(&k).copied()
    }
    pub(crate) fn insert(&mut self, k: (u64, u64), v: u64) {
        if self.map.insert(k, v).is_none() {
            self.order.push_back(k);
            if self.order.len() > REQ_CACHE_MAX {
                if let Some(old) = self.order.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
    }
}

/// The PG log region of a store that may hold `pgs` PGs (an OSD holds at
/// most every PG of the pool once): a slot each, at least the default.
pub fn pg_log_region(pgs: u32) -> nacre_blockstore::LogRegion {
    let d = nacre_blockstore::LogRegion::DEFAULT;
    nacre_blockstore::LogRegion {
        slots: pgs.clamp(d.slots, nacre_blockstore::LogRegion::SLOTS_MAX),
        ..d
    }
}

/// The request id a log entry of op `h` records: the client's, or 0 for
/// an OSD's own op (client 0: a rewrite, a pushed rewrite). Such an op is
/// sent with request id 0, which the connection replaces with one of its
/// own, different on each copy's connection: logged, it would make the
/// copies' entries differ at one version, and every later peering would
/// take the entry for divergent and rewrite the object again.
pub(crate) fn logged_request(h: &Header) -> u64 {
    if h.client == 0 {
        0
    } else {
        h.request_id
    }
}

fn status_of(e: &StoreError) -> Status {
    match e {
        StoreError::NotFound(_) => Status::NotFound,
        StoreError::NoSpace => Status::NoSpace,
        StoreError::Invalid(_) => Status::Invalid,
        StoreError::Corrupt(_) => Status::Corrupt,
        StoreError::StaleVersion { .. } => Status::Stale,
        _ => Status::Unavailable,
    }
}

impl Osd<FileDev, Sockets> {
    /// Opens (formatting a new file) the OSD's store. Runs inside
    /// `block_on`; then [`Osd::serve`] and [`Osd::boot`].
    pub async fn open(cfg: &OsdConfig) -> Result<Rc<Osd>, StoreError> {
        let new = !cfg.path.exists();
        let flags = OpenFlags {
            // A store's size is fixed when it is formatted: an existing
            // file is never grown (that would add no capacity).
            create_bytes: new.then_some(cfg.size_bytes),
            direct: cfg.direct,
            ..OpenFlags::default()
        };
        let dev = FileDev::open(&cfg.path, &flags)?;
        if new {
            let fo = FormatOptions {
                block_bytes: cfg.object_bytes,
                journal_bytes: cfg.journal_bytes,
                pg_logs: pg_log_region(cfg.pg_log_slots),
                ..FormatOptions::default()
            };
            Store::format(&dev, &fo).await?;
        }
        let (store, report) = Store::open(dev, StoreOptions::default()).await?;
        if store.block_bytes() != cfg.object_bytes {
            return Err(StoreError::Invalid(format!(
                "{}: store blocks are {} bytes, the pool's objects {}",
                cfg.path.display(),
                store.block_bytes(),
                cfg.object_bytes
            )));
        }
        tracing::info!(
            "osd.{}: store open ({} objects, {} journal records replayed)",
            cfg.id,
            store.object_count(),
            report.records_replayed
        );
        Ok(Osd::with_store(
            cfg.id,
            store,
            &report,
            cfg.leader.clone(),
            Sockets,
        ))
    }

    /// Serves the wire protocol on `l` until the returned handle is
    /// dropped (then no new connection is taken, and connections still
    /// open are answered `Unavailable` and no longer hold the OSD).
    pub fn serve(self: &Rc<Self>, l: Listener) -> Serving {
        let stop = Notify::new();
        let stopped = Rc::new(std::cell::Cell::new(false));
        let (s2, f2) = (stop.clone(), stopped.clone());
        let gate = Rc::new(Gate(RefCell::new(Some(self.clone()))));
        let me = gate.clone();
        rt::spawn(async move {
            let mut accept = std::pin::pin!(nacre_net::serve(l, me));
            let mut wake = Box::pin(s2.wait());
            std::future::poll_fn(|cx| {
                if f2.get() {
                    return std::task::Poll::Ready(());
                }
                if wake.as_mut().poll(cx).is_ready() {
                    wake = Box::pin(s2.wait());
                    cx.waker().wake_by_ref();
                }
                accept.as_mut().poll(cx)
            })
            .await
        });
        Serving {
            stop,
            stopped,
            gate,
        }
    }
}

/// What a served connection reaches: the OSD until it stops serving.
struct Gate(RefCell<Option<Rc<Osd>>>);

impl Handler for Gate {
    async fn handle(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        let osd = self.0.borrow().clone();
        match osd {
            Some(o) => o.handle(f).await,
            None => (f.h.reply(Status::Unavailable), None),
        }
    }

    fn reply_bytes_max(&self, h: &Header) -> usize {
        (self.0.borrow().as_ref()).map_or(0, |o| o.reply_bytes_max(h))
    }
}

/// An OSD's listener; dropping it stops taking connections and lets go of
/// the OSD.
pub struct Serving {
    stop: Notify,
    stopped: Rc<std::cell::Cell<bool>>,
    gate: Rc<Gate>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stopped.set(true);
        self.stop.notify();
        self.gate.0.borrow_mut().take();
    }
}

/// Counts an op in flight for its PG and epoch while it lives.
struct Inflight<'a> {
    counts: &'a RefCell<HashMap<(PgId, u64), u32>>,
    drained: &'a Notify,
    key: (PgId, u64),
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        let mut c = self.counts.borrow_mut();
        if let Some(n) = c.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.key);
            }
        }
        self.drained.notify();
    }
}

/// The map of an OSD that has not booted: epoch 0, no PGs.
fn no_map() -> OsdMap {
    OsdMap {
        cluster: Default::default(),
        pools: Default::default(),
        addrs: Default::default(),
        up_from: Default::default(),
        stores: Default::default(),
        full: Default::default(),
    }
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// An OSD on an open store (`report` is what its open found), reaching
    /// its peers through `transport` and the leader at `leader`.
    pub fn with_store(
        id: u32,
        store: Store<D>,
        report: &OpenReport,
        leader: LeaderAddr,
        transport: T,
    ) -> Rc<Self> {
        if let Some(why) = &report.replay_stopped {
            tracing::error!(
                "osd.{id}: journal replay stopped before its end: {why}; it boots as store {}.{}, holding none of its PGs' earlier history",
                nacre_blockstore::uuid_string(&store.geometry().uuid),
                store.lineage()
            );
        }
        let stats = OsdStats::default();
        stats.set_replay_stopped(report.replay_stopped.clone());
        let epoch_floor = (store.pg_logs().into_iter())
            .filter_map(|pg| store.pg_log(pg))
            .map(|log| log.head() >> 32)
            .max()
            .unwrap_or(0);
        Rc::new(Osd {
            id,
            store,
            transport,
            leader,
            leader_conn: RefCell::new(None),
            map: RefCell::new(no_map()),
            up_from: Cell::new(0),
            fetching: Cell::new(false),
            rebooting: Cell::new(false),
            leased: Cell::new(Duration::ZERO),
            beating: Cell::new(false),
            halted: Cell::new(false),
            pgs: RefCell::new(HashMap::new()),
            pg_changed: Notify::new(),
            inflight: RefCell::new(HashMap::new()),
            drained: Notify::new(),
            peers: RefCell::new(HashMap::new()),
            busy: RefCell::new(HashSet::new()),
            unbusy: Notify::new(),
            seqs: RefCell::new(HashMap::new()),
            epoch_floor,
            done: RefCell::new(HashMap::new()),
            recovery: RefCell::new(HashMap::new()),
            recovery_rate: Cell::new(RECOVERY_BYTES_PER_S_DEFAULT),
            recovery_next: Cell::new(Duration::ZERO),
            recovery_floor: Cell::new((Duration::ZERO, 0, usize::MAX)),
            query_page: Cell::new(peering::PG_QUERY_PAGE_OBJECTS),
            ratios: Cell::new((1.0, 1.0)),
            removing: RefCell::new(HashSet::new()),
            purged_pools: RefCell::new((Vec::new(), Duration::ZERO)),
            strays_none: Cell::new((0, Duration::ZERO)),
            said_full: Cell::new(false),
            asking_out: Cell::new(false),
            scrubbing: Cell::new(None),
            scrub_idle: Notify::new(),
            scrub_cfg: Cell::new(ScrubConfig::default()),
            scrub_hist: RefCell::new(HashMap::new()),
            scrub_news: RefCell::new(std::collections::VecDeque::new()),
            scrub_due: RefCell::new(HashMap::new()),
            scrub_next: Cell::new(Duration::ZERO),
            purged: RefCell::new(HashSet::new()),
            scrub_tickets: Cell::new(0),
            benches: bench::Benches::default(),
            scrub_asked: RefCell::new(Vec::new()),
            scrub_reports: RefCell::new(BTreeMap::new()),
            schemes: RefCell::new(HashMap::new()),
            commits: RefCell::new(HashMap::new()),
            serving: RefCell::new(HashMap::new()),
            deleting: RefCell::new(HashMap::new()),
            stats,
        })
    }

    /// Checkpoints and closes the store (the last step of a clean stop).
    pub async fn close(&self) -> Result<(), StoreError> {
        self.halt();
        self.peers.borrow_mut().clear();
        self.store.clone().close().await
    }

    /// Stops taking maps and booting (a stop, or a simulated crash: the
    /// tasks of an instance whose power was cut must not act for it).
    pub fn halt(&self) {
        self.halted.set(true);
        self.pg_changed.notify();
    }

    /// Sets the used fractions of the store at which it is near full and
    /// full (`0 < nearfull <= full <= 1`): beyond `full` a write that needs
    /// new space is refused (`NoSpace`, ENOSPC at the client), while
    /// recovery, overwrites in place, deletes and trims go on; both show in
    /// `nacre status`. A new OSD keeps no space back (1, 1).
    pub fn set_full_ratios(&self, nearfull: f64, full: f64) {
        self.ratios.set((nearfull, full));
        self.store.set_full_ratio(full);
    }

    pub fn store(&self) -> &Store<D> {
        &self.store
    }

    /// The epoch this incarnation was marked up in (0: not yet).
    pub fn up_from(&self) -> u64 {
        self.up_from.get()
    }

    pub fn epoch(&self) -> u64 {
        self.map.borrow().epoch()
    }

    pub fn map(&self) -> OsdMap {
        self.map.borrow().clone()
    }

    /// The state of PG `pg` if this OSD is its primary.
    pub fn pg_state(&self, pg: PgId) -> Option<PgState> {
        self.pgs.borrow().get(&pg).cloned()
    }

    /// What `Op::Stat` answers: counters, space, and the PGs this OSD is
    /// primary of in its epoch.
    pub fn stat_report(&self) -> OsdReport {
        let mut r = self.stats.report(self.id, &self.store);
        (r.nearfull_ratio, r.full_ratio) = self.ratios.get();
        r.scrubbing = (self.scrubbing.get())
            .map(|(pg, deep)| format!("{pg}{}", if deep { " deep" } else { "" }));
        let cfg = self.scrub_cfg.get();
        let secs = |d: Duration| d.as_secs_f64().ceil() as u64;
        (r.scrub_interval_s, r.deep_scrub_interval_s) =
            (secs(cfg.interval), secs(cfg.deep_interval));
        // Only PGs this OSD still leads: another primary speaks for the rest.
        (r.pgs_scrub_unrepaired).retain(|(pg, _)| self.pgs.borrow().contains_key(pg));
        let m = self.map.borrow();
        r.epoch = m.epoch();
        let mut pgs: Vec<(PgId, PgState)> = (self.pgs.borrow().iter())
            .map(|(&pg, s)| (pg, s.clone()))
            .collect();
        pgs.sort_unstable_by_key(|(pg, _)| *pg);
        // Objects per PG, counted only if some PG waits with copies down.
        let mut objects: Option<HashMap<PgId, u64>> = None;
        for (pg, s) in pgs {
            let acting = m.acting(pg);
            let size = usize::from(m.size(pg.pool));
            let placed_up = (m.placement(pg).iter())
                .filter(|o| acting.contains(o))
                .count();
            let leaving = || {
                let t: Vec<String> = (acting.iter())
                    .filter(|o| !m.placement(pg).contains(o))
                    .map(|o| format!("osd.{o}"))
                    .collect();
                format!(
                    "{} stays in until its replacement is complete",
                    t.join(", ")
                )
            };
            // Copies down and not yet replaced: degraded at once, waiting
            // (for the OSD to return, or be marked out and replaced).
            let missing = size.saturating_sub(acting.len()) as u64;
            if missing > 0 && s == PgState::Active {
                let per = objects.get_or_insert_with(|| {
                    let mut per = HashMap::new();
                    self.store.for_each_object(|oid| {
                        if let Some(pg) = m.pg_of(oid) {
                            *per.entry(pg).or_default() += 1;
                        }
                    });
                    per
                });
                r.degraded_waiting_objects += per.get(&pg).copied().unwrap_or(0) * missing;
            }
            let (state, detail) = match s {
                PgState::Active if self.recovery_progress(pg).is_some() => {
                    let (left, total) = self.recovery_progress(pg).expect("checked");
                    r.recovery_objects_left += left as u64;
                    let what = format!("{left} of {total} object copies left to recover");
                    // Temporary members keep the PG's copies while it
                    // moves: it is degraded only with fewer complete
                    // copies than `size`.
                    if !self.pg_degraded(pg) {
                        r.misplaced_objects_left += left as u64;
                        (
                            "active+remapped+backfilling",
                            Some(format!("{what}; {}", leaving())),
                        )
                    } else {
                        r.degraded_objects_left += left as u64;
                        let up = if acting.len() >= size {
                            String::new()
                        } else {
                            format!("; {} of {size} copies up", acting.len())
                        };
                        ("active+recovering", Some(format!("{what}{up}")))
                    }
                }
                PgState::Active if m.whole(pg) => ("active+clean", None),
                PgState::Active if placed_up == size => ("active+remapped", Some(leaving())),
                PgState::Active => (
                    "active+degraded",
                    Some(format!("{placed_up} of {size} copies up")),
                ),
                PgState::Peering => ("peering", None),
                PgState::Failed => (
                    "peering",
                    Some("a write failed on some copy; waiting for the next epoch".into()),
                ),
                PgState::Inactive(why) => ("inactive", Some(why)),
            };
            *r.pg_states.entry(state.into()).or_default() += 1;
            if state != "active+clean" && r.pgs_not_clean.len() < PG_REPORT_MAX {
                r.pgs_not_clean.push(PgReport {
                    pg,
                    state: state.into(),
                    detail,
                });
            }
        }
        r
    }

    async fn leader_call(&self, h: Header, body: Option<AlignedBuf>) -> Result<Frame, NetError> {
        let cached = self.leader_conn.borrow().clone();
        let addr = self.leader.get();
        let conn = match cached {
            Some((a, c)) if a == addr && !c.is_closed() => c,
            _ => {
                let c = self.transport.connect(&addr)?;
                *self.leader_conn.borrow_mut() = Some((addr, c.clone()));
                c
            }
        };
        let r = conn.call(h, body).await;
        if r.is_err() {
            *self.leader_conn.borrow_mut() = None;
        }
        r
    }

    /// The store's id as the leader knows it: its uuid in hex, then
    /// `.N` for lineage N > 0 ([`Store::lineage`]): a store that lost
    /// acknowledged writes is another store to the cluster, holding none
    /// of the history of the intervals it was in (replication.md §8.4).
    pub fn store_id(&self) -> String {
        let uuid: String = (self.store.geometry().uuid.iter())
            .map(|b| format!("{b:02x}"))
            .collect();
        match self.store.lineage() {
            0 => uuid,
            n => format!("{uuid}.{n}"),
        }
    }

    /// Tells the leader this incarnation stops (a clean stop), so that it
    /// is marked down at once rather than after the heartbeat grace; waits
    /// for the answer at most a second. The OSD must serve nothing any
    /// more and be halted (else it would take the map that marks it down
    /// and boot again, or serve a read as a deposed primary).
    pub async fn leave(&self) {
        let up_from = self.up_from.get();
        if up_from == 0 {
            return;
        }
        let mut h = Header::request(Op::Dead, 0, ObjectId::default());
        h.sender = self.id;
        h.obj_version = up_from;
        match rt::timeout(Duration::from_secs(1), self.leader_call(h, None)).await {
            Some(Ok(f)) if f.h.status == Status::Ok => {
                tracing::info!("osd.{}: the leader marked it down", self.id)
            }
            r => {
                let why = match r {
                    Some(Ok(f)) => format!("{:?}", f.h.status),
                    Some(Err(e)) => e.to_string(),
                    None => "no answer".into(),
                };
                tracing::warn!(
                    "osd.{}: the leader did not take its stop ({why}); it marks it down after the heartbeat grace",
                    self.id
                )
            }
        }
    }

    /// Registers this incarnation with the leader, which marks it up in a
    /// new epoch and answers with that map. Fails after
    /// `BOOT_ATTEMPT_MAX` unanswered attempts.
    pub async fn boot(self: &Rc<Self>) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..BOOT_ATTEMPT_MAX {
            if self.halted.get() {
                return Err(format!("osd.{}: stopped while booting", self.id));
            }
            let store = self.store_id();
            let mut h =
                Header::request(Op::Boot, 0, ObjectId::default()).with_payload(store.as_bytes());
            h.sender = self.id;
            // The leader hears this OSD after this instant: the read lease
            // runs from here, not from the reply.
            let sent = rt::monotonic();
            match (self.leader_call(h, Some(AlignedBuf::from_slice(store.as_bytes())))).await {
                Ok(f) if f.h.status == Status::Ok => {
                    self.extend_read_lease(sent, f.h.length);
                    let body = f.payload.as_deref().unwrap_or(&[]);
                    match OsdMap::from_json(body) {
                        Ok(m) => {
                            let Some(&up) = m.up_from.get(&self.id) else {
                                last = "the leader's map does not have it up".into();
                                continue;
                            };
                            tracing::info!("osd.{}: up from epoch {up}", self.id);
                            self.up_from.set(up);
                            // Applied again even if a push of this epoch, or
                            // of a later one, came first while this
                            // incarnation was not up in it: the newer map.
                            let m = if m.epoch() >= self.epoch() {
                                m
                            } else {
                                self.map.borrow().clone()
                            };
                            self.apply_map(m, true);
                            if !self.beating.replace(true) {
                                rt::spawn(Self::heartbeat(Rc::downgrade(self)));
                                rt::spawn(Self::ping_loop(Rc::downgrade(self)));
                                rt::spawn(Self::stray_loop(Rc::downgrade(self)));
                                rt::spawn(Self::scrub_loop(Rc::downgrade(self)));
                                rt::spawn(self.clone().bench_leftovers());
                            }
                            return Ok(());
                        }
                        Err(e) => last = e,
                    }
                }
                Ok(f) => last = format!("{:?}", f.h.status),
                Err(e) => last = e.to_string(),
            }
            rt::sleep(LEADER_RETRY).await;
        }
        Err(format!(
            "osd.{}: the leader does not answer: {last}",
            self.id
        ))
    }

    /// Fetches the map from the leader (one fetch at a time).
    async fn refresh_map(self: &Rc<Self>) {
        if self.fetching.replace(true) {
            return;
        }
        let h = Header::request(Op::GetMap, 0, ObjectId::default());
        if let Ok(f) = self.leader_call(h, None).await {
            if let Ok(m) = OsdMap::from_json(f.payload.as_deref().unwrap_or(&[])) {
                self.set_map(m);
            }
        }
        self.fetching.set(false);
    }

    /// Waits (bounded) until this OSD knows epoch `epoch`.
    async fn catch_up(self: &Rc<Self>, epoch: u64) -> bool {
        for _ in 0..3 {
            if self.epoch() >= epoch {
                return true;
            }
            self.refresh_map().await;
            if self.epoch() < epoch {
                rt::sleep(LEADER_RETRY).await;
            }
        }
        self.epoch() >= epoch
    }

    /// Takes a newer map: every PG this OSD is primary of peers again.
    /// An OSD the map has down while it runs boots again (a new
    /// incarnation); until then it is primary of nothing.
    pub fn set_map(self: &Rc<Self>, m: OsdMap) {
        self.apply_map(m, false);
    }

    /// [`Osd::set_map`]; `again` also re-applies the current epoch.
    fn apply_map(self: &Rc<Self>, m: OsdMap, again: bool) {
        let known = self.epoch();
        if self.halted.get() || self.up_from.get() == 0 || m.epoch() < known {
            return;
        }
        let epoch = m.epoch();
        let me = m.up_from.get(&self.id) == Some(&self.up_from.get());
        // Marked down while running (a map of this epoch or a newer one
        // says so, however it came): boot again, once at a time.
        if !me && !self.rebooting.replace(true) {
            tracing::warn!(
                "osd.{}: marked down in epoch {epoch} while running; booting again",
                self.id
            );
            let me = self.clone();
            rt::spawn(async move {
                me.up_from.set(u64::MAX);
                if let Err(e) = me.boot().await {
                    tracing::error!("{e}");
                }
                me.rebooting.set(false);
            });
        }
        if m.epoch() == known && !again {
            return;
        }
        let mine: Vec<PgId> = (m.pgs())
            .filter(|&pg| me && m.primary(pg) == Some(self.id))
            .collect();
        *self.map.borrow_mut() = m;
        self.recovery.borrow_mut().clear();
        self.serving.borrow_mut().clear();
        self.deleting.borrow_mut().clear();
        {
            let mut pgs = self.pgs.borrow_mut();
            pgs.clear();
            pgs.extend(mine.iter().map(|&pg| (pg, PgState::Peering)));
        }
        self.pg_changed.notify();
        for pg in mine {
            rt::spawn(self.clone().peer(pg, epoch));
        }
    }

    /// Heartbeats the leader every `HEARTBEAT_INTERVAL_MS` (`Ping`, with
    /// this incarnation's `up_from`). The leader counts one when it arrives;
    /// the read lease runs from when it was sent, so it always ends before
    /// the leader's grace for the same heartbeat, however late the
    /// messages. A newer epoch in the answer fetches the map; `Unavailable`
    /// (marked down) fetches it too, which boots this OSD again.
    /// (Holds the OSD only while it asks, so a closed one goes.)
    async fn heartbeat(me: std::rc::Weak<Self>) {
        let every = Duration::from_millis(nacre_types::HEARTBEAT_INTERVAL_MS);
        loop {
            rt::sleep(every).await;
            let Some(me) = me.upgrade().filter(|o| !o.halted.get()) else {
                return;
            };
            let up = me.up_from.get();
            if up == 0 || up == u64::MAX {
                continue;
            }
            let mut h = Header::request(Op::Ping, 0, ObjectId::default());
            h.sender = me.id;
            h.epoch = me.epoch();
            h.obj_version = up;
            // Whether a write that takes a new block would fail here; once
            // said, until some room is back (not one freed block: that
            // would flip the map's epoch at every trim and write).
            let spare = me.store.spare_blocks();
            let room = (u64::from(me.store.geometry().nblocks) / 100).max(16);
            let full = if me.said_full.get() {
                spare < room
            } else {
                spare == 0
            };
            me.said_full.set(full);
            h.offset = u32::from(full);
            // What slow-OSD detection compares.
            let mut figures = [0u8; nacre_wire::PING_FIGURES_BYTES as usize];
            for (c, p) in figures.chunks_mut(4).zip(me.stats.store_write_p99()) {
                let us = p.map_or(0, |p| p.clamp(1.0, f64::from(u32::MAX)) as u32);
                c.copy_from_slice(&us.to_le_bytes());
            }
            let h = h.with_payload(&figures);
            let sent = rt::monotonic();
            match me
                .leader_call(h, Some(AlignedBuf::from_slice(&figures)))
                .await
            {
                Ok(f) if f.h.status == Status::Ok => {
                    if me.up_from.get() == up {
                        me.extend_read_lease(sent, f.h.length);
                    }
                    if f.h.epoch > me.epoch() {
                        me.refresh_map().await;
                    }
                }
                Ok(f) if f.h.status == Status::Unavailable => me.refresh_map().await,
                _ => {}
            }
        }
    }

    fn set_pg_state(&self, pg: PgId, epoch: u64, s: PgState) {
        if self.epoch() == epoch {
            if let Some(st) = self.pgs.borrow_mut().get_mut(&pg) {
                *st = s;
            }
            self.pg_changed.notify();
        }
    }

    /// Waits until PG `pg` is active in `epoch` (bounded by `PG_WAIT_MS`).
    async fn wait_active(&self, pg: PgId, epoch: u64) -> Result<(), Status> {
        let until = rt::monotonic() + Duration::from_millis(PG_WAIT_MS);
        loop {
            if self.epoch() != epoch {
                return Err(Status::StaleEpoch);
            }
            match self.pgs.borrow().get(&pg) {
                Some(PgState::Active) => return Ok(()),
                None => return Err(Status::NotPrimary),
                Some(_) => {}
            }
            let left = until.saturating_sub(rt::monotonic());
            if left.is_zero() || rt::timeout(left, self.pg_changed.wait()).await.is_none() {
                return Err(Status::Unavailable);
            }
        }
    }

    fn track(&self, pg: PgId, epoch: u64) -> Inflight<'_> {
        *self.inflight.borrow_mut().entry((pg, epoch)).or_default() += 1;
        Inflight {
            counts: &self.inflight,
            drained: &self.drained,
            key: (pg, epoch),
        }
    }

    /// Waits until no op of PG `pg` from `epoch` or an earlier one is in
    /// flight here. In `epoch` itself, while the PG peers, those are the
    /// pushes, rewrites and log syncs of an earlier peering attempt that
    /// the primary stopped waiting for: the next attempt must see their
    /// effects, not have them land after it made its plan.
    async fn drain(&self, pg: PgId, epoch: u64) {
        while (self.inflight.borrow().keys()).any(|&(p, e)| p == pg && e <= epoch) {
            self.drained.wait().await;
        }
    }

    /// Ends the interval of PG `pg` after a failed write: no more ops
    /// here, and the leader is asked for a new epoch.
    fn fail_pg(self: &Rc<Self>, pg: PgId, epoch: u64, why: String) {
        if self.pg_state(pg) != Some(PgState::Active) || self.epoch() != epoch {
            return;
        }
        tracing::warn!("osd.{}: PG {pg} stops in epoch {epoch}: {why}", self.id);
        self.set_pg_state(pg, epoch, PgState::Failed);
        let me = self.clone();
        rt::spawn(async move {
            let ev = PgEvent::Failed { why };
            // Until it is heard, or the epoch moves anyway, or this OSD
            // stopped.
            while me.epoch() == epoch
                && !me.halted.get()
                && me.report(pg, epoch, &ev).await.is_err()
            {
                rt::sleep(LEADER_RETRY).await;
            }
        });
    }

    /// Tells the leader about PG `pg` in `epoch`.
    async fn report(&self, pg: PgId, epoch: u64, ev: &PgEvent) -> Result<(), String> {
        let body = serde_json::to_vec(ev).expect("events serialise");
        let mut h = Header::request(Op::PgEvent, 0, ObjectId::default()).with_payload(&body);
        h = h.with_pg(pg);
        h.epoch = epoch;
        h.sender = self.id;
        match self
            .leader_call(h, Some(AlignedBuf::from_slice(&body)))
            .await
        {
            Ok(f) if f.h.status == Status::Ok => Ok(()),
            Ok(f) => Err(format!("leader: {:?}", f.h.status)),
            Err(e) => Err(format!("leader: {e}")),
        }
    }

    /// The PG's next version in `epoch`, if that is still the current
    /// epoch and a version is left in it: a task of an epoch that just
    /// ended must not take one of the next epoch, whose versions belong to
    /// that epoch's primary.
    fn next_version(&self, pg: PgId, epoch: u64) -> Option<u64> {
        if self.epoch() != epoch {
            return None;
        }
        let mut seqs = self.seqs.borrow_mut();
        let s = seqs.entry(pg).or_insert((epoch, 0));
        if s.0 != epoch {
            *s = (epoch, 0);
        }
        if s.1 + 1 >= PG_SEQ_MAX
            || epoch > nacre_meta::map::EPOCH_MAX
            || epoch <= self.epoch_floor
            || epoch < self.up_from.get()
        {
            return None;
        }
        s.1 += 1;
        Some((epoch << 32) | s.1)
    }

    /// Counts a damaged copy rewritten if `e` (applied here) wrote its
    /// object whole or deleted it.
    fn replaced(&self, e: &LogEntry) {
        if e.op == LogOp::Delete || (e.offset == 0 && e.len == self.store.block_bytes()) {
            self.stats.replaced(e.oid);
        }
    }

    /// The log entry of op `h` at `version` (as the primary logs it and
    /// every replica from the sub-op: the same entry on every copy).
    fn entry(&self, h: &Header, version: u64) -> LogEntry {
        let (op, offset, len) = match h.op {
            Op::Write | Op::RepWrite => (LogOp::Write, h.offset, h.payload_len),
            _ => (LogOp::Delete, 0, 0),
        };
        LogEntry {
            pg: h.pg_id().key(),
            version,
            oid: h.oid,
            op,
            offset,
            len,
            client: h.client,
            request: logged_request(h),
        }
    }

    /// Checks epoch, PG and (for client ops) primacy.
    fn check_route(&self, h: &Header, need_primary: bool) -> Option<Status> {
        let map = self.map.borrow();
        if h.epoch != map.epoch() {
            return Some(Status::StaleEpoch);
        }
        // The object's pool (in its volume id) is in the map and the
        // object is in the PG the frame names; a listing names a PG of its
        // volume's pool.
        let pg_ok = if h.op == Op::List {
            h.oid.pool() == h.pool && h.pg < map.pg_count(h.pool)
        } else {
            map.pg_of(h.oid) == Some(h.pg_id())
        };
        // A shard's id (its index in the block) is the OSDs' alone, and so
        // are the bits between a block index (below 2⁵²) and it: a store
        // names the blocks its undos keep with one (refused there too, but
        // only after the op has a version, which would end the interval).
        if !pg_ok || h.oid.shard_index().is_some() || h.oid.block >> 52 != 0 {
            return Some(Status::Invalid);
        }
        if need_primary && !self.pgs.borrow().contains_key(&h.pg_id()) {
            return Some(Status::NotPrimary);
        }
        if need_primary && h.sender != SENDER_CLIENT {
            return Some(Status::Invalid);
        }
        // Client 0 names the OSDs' own rewrites in the PG logs
        // (`ReqCache::of_log`): no client writes as it.
        if need_primary && h.client == 0 && matches!(h.op, Op::Write | Op::Delete) {
            return Some(Status::Invalid);
        }
        if !need_primary {
            // A sub-op is taken only from the PG's primary in this epoch,
            // and only by a member.
            if !self.sent_by_primary(&map, h) || !map.is_acting(h.pg_id(), self.id) {
                return Some(Status::NotPrimary);
            }
            if h.obj_version == 0 || h.obj_version >> 32 != h.epoch {
                return Some(Status::Invalid);
            }
        }
        None
    }

    /// Whether `h` comes from another OSD that is the primary of the PG
    /// it names in `map`.
    fn sent_by_primary(&self, map: &OsdMap, h: &Header) -> bool {
        map.primary(h.pg_id()) == Some(h.sender) && h.sender != self.id
    }

    async fn lock(&self, oid: ObjectId) {
        while !self.busy.borrow_mut().insert(oid) {
            self.unbusy.wait().await;
        }
    }

    /// Waits until no write or delete of `oid` is in flight.
    async fn wait_unbusy(&self, oid: ObjectId) {
        while self.busy.borrow().contains(&oid) {
            self.unbusy.wait().await;
        }
    }

    fn unlock(&self, oid: ObjectId) {
        self.busy.borrow_mut().remove(&oid);
        self.unbusy.notify();
    }

    fn conn(&self, id: u32) -> Result<Rc<T::Conn>, NetError> {
        if let Some(c) = self.peers.borrow().get(&id) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr = (self.map.borrow().addr(id))
            .ok_or_else(|| NetError::Protocol(format!("no address for osd.{id}")))?;
        let c = self.transport.connect(&addr)?;
        self.peers.borrow_mut().insert(id, c.clone());
        Ok(c)
    }

    /// Sends a request to OSD `id`, reconnecting after a lost connection;
    /// the reply, or why there is none. `data` is copied once (the
    /// attempts share the copy).
    async fn call_osd(
        &self,
        id: u32,
        h: Header,
        data: Option<&AlignedBuf>,
    ) -> Result<Frame, String> {
        let data = data.map(|d| SharedBuf::new(AlignedBuf::from_slice(d)));
        self.call_osd_shared(id, h, data.as_ref()).await
    }

    /// [`Self::call_osd`] with a payload others hold too: every attempt
    /// sends it from where it is, without a copy.
    async fn call_osd_shared(
        &self,
        id: u32,
        h: Header,
        data: Option<&SharedBuf>,
    ) -> Result<Frame, String> {
        let mut last = String::new();
        for _ in 0..REPLICA_ATTEMPT_MAX {
            let conn = match self.conn(id) {
                Ok(c) => c,
                Err(e) => {
                    last = e.to_string();
                    rt::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            match conn.call_shared(h, data.cloned()).await {
                Ok(f) => return Ok(f),
                Err(e) => last = e.to_string(),
            }
        }
        Err(format!("osd.{id} unreachable: {last}"))
    }

    /// Sends a sub-op to replica `id`.
    async fn to_replica(self: Rc<Self>, id: u32, h: Header, data: Option<SharedBuf>) -> Status {
        match self.call_osd_shared(id, h, data.as_ref()).await {
            Ok(f) => f.h.status,
            Err(why) => {
                tracing::warn!("osd.{}: {why}", self.id);
                Status::Unavailable
            }
        }
    }

    /// Applies `entry` (with `data` for a write) on this OSD's store and,
    /// through sub-op `sub`, on every other OSD of `acting`, in parallel:
    /// `Ok` once every copy has it durably.
    async fn replicate(
        self: &Rc<Self>,
        acting: &[u32],
        sub: Header,
        entry: LogEntry,
        data: Option<AlignedBuf>,
    ) -> Status {
        // One buffer shared by the replica tasks (sent from where it is,
        // kept for a resend) and the local write (a whole block goes to
        // the device from it; a smaller write is copied: the store pads
        // that buffer for its journal write and keeps it for the fold).
        let data = data.map(SharedBuf::new);
        let replicas: Vec<_> = (acting.iter().filter(|&&r| r != self.id))
            .map(|&r| (r, rt::spawn(self.clone().to_replica(r, sub, data.clone()))))
            .collect();
        let t0 = rt::monotonic();
        let local = match data {
            Some(d) => (self.store).write_logged(entry, entry.offset, d).await,
            None => self.store.delete_logged(entry).await,
        };
        self.stats.store_write_done(t0);
        let mut status = match &local {
            Ok(()) => {
                self.replaced(&entry);
                Status::Ok
            }
            Err(e) => {
                tracing::debug!("osd.{}: {} v{:#x}: {e}", self.id, entry.oid, entry.version);
                status_of(e)
            }
        };
        for (id, mut r) in replicas {
            let s = self.replica_status(id, &mut r, sub.epoch).await;
            if status == Status::Ok && s != Status::Ok {
                status = s;
            }
        }
        status
    }

    /// The status of replica task `r` (to OSD `replica`), or `StaleEpoch`
    /// as soon as this OSD is in another epoch than `epoch` whose map
    /// marks `replica` down: the interval ended, and the next one's
    /// peering settles what the copies hold, so waiting on a replica cut
    /// off (until its RPC timeout) would only stall the client, who
    /// retries in the new epoch. (The task runs on; a replica in the new
    /// epoch refuses its sub-op.) A replica still up is waited for, for
    /// at most `HEARTBEAT_GRACE_MS` after the epoch moved (one up but cut
    /// off from this OSD alone would hold the write, and this PG's next
    /// peering, for the RPC's retries): it answers soon, applied in the
    /// old epoch or refused in the new one, and a write every copy applied
    /// is acknowledged instead of retried. Giving up early is always safe:
    /// the write is then not acknowledged.
    async fn replica_status(
        &self,
        replica: u32,
        r: &mut rt::JoinHandle<Status>,
        epoch: u64,
    ) -> Status {
        let mut until: Option<Duration> = None;
        loop {
            if self.epoch() != epoch {
                let now = rt::monotonic();
                let grace = Duration::from_millis(nacre_types::HEARTBEAT_GRACE_MS);
                let u = *until.get_or_insert(now + grace);
                if !self.map.borrow().is_up(replica) || now >= u {
                    return Status::StaleEpoch;
                }
            }
            let mut changed = std::pin::pin!(self.pg_changed.wait());
            // A timer only once the epoch moved: none on the write path.
            let mut timer = until.map(|u| Box::pin(rt::sleep(u.saturating_sub(rt::monotonic()))));
            let s = std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(s) = std::pin::Pin::new(&mut *r).poll(cx) {
                    return std::task::Poll::Ready(Some(s));
                }
                if let Some(t) = timer.as_mut() {
                    if t.as_mut().poll(cx).is_ready() {
                        return std::task::Poll::Ready(None);
                    }
                }
                changed.as_mut().poll(cx).map(|()| None)
            })
            .await;
            if let Some(s) = s {
                return s;
            }
        }
    }

    /// Applies a write or delete as primary; returns the status and version.
    async fn primary_update(
        self: &Rc<Self>,
        h: &Header,
        data: Option<AlignedBuf>,
    ) -> (Status, u64) {
        // Client 0 names a peering's rollback in a PG log (ec.rs
        // `same_op`), and a request id of 0 is one a connection replaces
        // with its own: a client's op has neither.
        if h.client == 0 || h.request_id == 0 {
            return (Status::Invalid, 0);
        }
        if let Err(s) = self.wait_active(h.pg_id(), h.epoch).await {
            return (s, 0);
        }
        let oid = h.oid;
        self.lock(oid).await;
        let r = self.primary_update_locked(h, data).await;
        self.unlock(oid);
        r
    }

    async fn primary_update_locked(
        self: &Rc<Self>,
        h: &Header,
        data: Option<AlignedBuf>,
    ) -> (Status, u64) {
        let oid = h.oid;
        let key = (h.client, h.request_id);
        if let Some(v) = self.done.borrow().get(&h.pg_id()).and_then(|c| c.get(key)) {
            return (Status::Ok, v);
        }
        // The PG may have stopped, or the epoch moved, while this op
        // waited for the object.
        let epoch = h.epoch;
        if self.epoch() != epoch {
            return (Status::StaleEpoch, 0);
        }
        if self.pg_state(h.pg_id()) != Some(PgState::Active) {
            return (Status::Unavailable, 0);
        }
        // A copy that lacks the object must have it whole before a write
        // changes part of it (or a delete, before its recovery could
        // bring it back). An EC PG's delete needs no rebuild: it leaves
        // every shard as it must be, and takes the object from the plan.
        let ec = self.scheme(h.pool).is_some();
        let planned = self.must_recover(h.pg_id(), epoch, oid, false);
        if planned && !(ec && h.op == Op::Delete) {
            if let Err(s) = Box::pin(self.recover_for_op(h.pg_id(), epoch, oid)).await {
                return (s, 0);
            }
        }
        // A conditional op (a shrink's, on what it listed) leaves an
        // object written since alone, and creates none. (An EC PG's
        // object's version is its shards' newest: ec.rs.)
        if h.obj_version != 0 {
            let cur = match ec {
                true => {
                    let v = match Box::pin(self.ec_version(h)).await {
                        Ok(v) => v,
                        Err(s) => return (s, 0),
                    };
                    // The shards took a while to answer: the PG may have
                    // stopped meanwhile.
                    if self.epoch() != epoch || self.pg_state(h.pg_id()) != Some(PgState::Active) {
                        return (Status::Unavailable, 0);
                    }
                    v
                }
                false => self.store.version(oid),
            };
            match cur {
                None => return (Status::NotFound, 0),
                Some(cur) if cur > h.obj_version => return (Status::Stale, cur),
                Some(_) => {}
            }
        }
        // A write that takes a new block (a new object, or a whole-block
        // write) where a copy is full: refused before it has a version, so
        // that it ends no interval (failed on that copy, it would, and
        // every such write to a full cluster would start an epoch).
        if h.op == Op::Write && self.store.needs_block(oid, h.offset, h.length) {
            let full = {
                let m = self.map.borrow();
                (m.acting(h.pg_id()).into_iter()).find(|o| m.full.contains(o))
            };
            if let Some(o) = full.or_else(|| (self.store.spare_blocks() == 0).then_some(self.id)) {
                tracing::debug!("osd.{}: {oid}: osd.{o} is full", self.id);
                return (Status::NoSpace, 0);
            }
        }
        let _inflight = self.track(h.pg_id(), epoch);
        let Some(version) = self.next_version(h.pg_id(), epoch) else {
            // The epoch moved while the op recovered its object: the
            // client retries in the new one.
            if self.epoch() != epoch {
                return (Status::StaleEpoch, 0);
            }
            tracing::warn!(
                "osd.{}: PG {} has no version left in epoch {epoch} (this OSD's logs reach epoch {}, it is up from {})",
                self.id,
                h.pg_id(),
                self.epoch_floor,
                self.up_from.get()
            );
            return (Status::Unavailable, 0);
        };
        // Versions of an epoch come only from this primary, and epochs
        // rise: a version at or below the stored one is a bug.
        let cur = self.store.version(oid).unwrap_or(0);
        if version <= cur {
            let why = format!("{oid}: new version {version:#x} is not above the stored {cur:#x}");
            assert!(!nacre_blockstore::strict(), "{why}");
            tracing::error!("osd.{}: {why}", self.id);
            return (Status::Unavailable, 0);
        }
        let status = if ec {
            Box::pin(self.ec_update(h, version, data)).await
        } else {
            let acting = self.map.borrow().acting(h.pg_id());
            let entry = self.entry(h, version);
            let mut sub = *h;
            sub.op = if h.op == Op::Delete {
                Op::RepDelete
            } else {
                Op::RepWrite
            };
            sub.obj_version = version;
            sub.sender = self.id;
            self.replicate(&acting, sub, entry, data).await
        };
        if status == Status::Ok {
            (self.done.borrow_mut().entry(h.pg_id()).or_default()).insert(key, version);
            if planned && ec && h.op == Op::Delete {
                Box::pin(self.deleted_while_planned(h.pg_id(), epoch, oid)).await;
            }
        } else {
            // Some copies may have it and some not: the interval ends.
            self.fail_pg(h.pg_id(), epoch, format!("{oid} v{version:#x}: {status:?}"));
        }
        (status, version)
    }

    async fn replica_update(&self, h: &Header, data: Option<AlignedBuf>) -> Status {
        let _inflight = self.track(h.pg_id(), h.epoch);
        let entry = self.entry(h, h.obj_version);
        let t0 = rt::monotonic();
        let r = match data {
            Some(d) => self.store.write_logged(entry, h.offset, d).await,
            None => self.store.delete_logged(entry).await,
        };
        self.stats.store_write_done(t0);
        match r {
            Ok(()) => {
                self.replaced(&entry);
                Status::Ok
            }
            Err(e) => {
                tracing::debug!("osd.{}: replica {} v{}: {e}", self.id, h.oid, h.obj_version);
                status_of(&e)
            }
        }
    }

    /// The bytes read `h` asks for, from another member of the acting set
    /// holding the object at the version this copy has (one version
    /// names one content), for a read this copy's checksums refused; this
    /// copy is then rewritten with that content ([`Store::repair`]).
    /// `Corrupt` if no other copy has it whole (`OSD_DAMAGED` then names
    /// this OSD), `Unavailable` if this OSD may no longer serve the read.
    async fn read_elsewhere(self: &Rc<Self>, h: &Header) -> Result<AlignedBuf, Status> {
        // Under the object's lock: no write of it starts meanwhile, so the
        // version read here is the one every member holds (a write in
        // flight would be on some copies only), and a member answering
        // the pull is not changing it.
        self.lock(h.oid).await;
        let r = self.read_elsewhere_locked(h).await;
        self.unlock(h.oid);
        // The pulls took time: answer only if this OSD may still serve
        // reads of the PG (the same checks as before the read).
        let serving = self.epoch() == h.epoch
            && self.pg_state(h.pg_id()) == Some(PgState::Active)
            && self.holds_read_lease();
        match (r, serving) {
            (_, false) => Err(Status::Unavailable),
            (Some(d), true) => Ok(d),
            (None, true) => Err(Status::Corrupt),
        }
    }

    /// The read lease: not heard from the leader for `READ_LEASE_MS` (or
    /// the shorter lease its last answer granted: its own authority was
    /// ending), this OSD may be marked down, or another leader elected,
    /// and another primary may have taken writes this copy lacks, so it
    /// serves no read.
    fn holds_read_lease(&self) -> bool {
        rt::monotonic() <= self.leased.get()
    }

    /// An answer from the leader to a heartbeat or `Boot` sent at `sent`
    /// granted a read lease of `ms` from then (at most `READ_LEASE_MS`).
    fn extend_read_lease(&self, sent: Duration, ms: u32) {
        let ms = u64::from(ms).min(nacre_types::READ_LEASE_MS);
        let until = sent + Duration::from_millis(ms);
        if until > self.leased.get() {
            self.leased.set(until);
        }
    }

    async fn read_elsewhere_locked(self: &Rc<Self>, h: &Header) -> Option<AlignedBuf> {
        let version = self.store.version(h.oid)?;
        let d = (self.fetch_elsewhere(h.pg_id(), h.epoch, h.oid, version, self.id, true)).await?;
        let range = h.offset as usize..(h.offset + h.length) as usize;
        (d.len() >= range.end).then(|| AlignedBuf::from_slice(&d[range]))
    }

    /// Rewrites this OSD's damaged copy of `oid` at `version` with `data`,
    /// read from OSD `from`'s copy at that version ([`Store::repair`]).
    async fn repair(&self, oid: ObjectId, version: u64, data: AlignedBuf, from: u32) -> bool {
        match self.store.repair(oid, version, data).await {
            Ok(()) => {
                self.stats.repaired(oid);
                tracing::warn!(
                    "osd.{}: {oid} v{version:#x} repaired from osd.{from}'s copy",
                    self.id
                );
                true
            }
            Err(e) => {
                tracing::warn!(
                    "osd.{}: {oid} v{version:#x} read from osd.{from}, not repaired: {e}",
                    self.id
                );
                false
            }
        }
    }

    /// Whether the failed read `e` of this OSD's copy of `oid` found it
    /// damaged (a checksum that failed, an error from the device) rather
    /// than absent, busy or refused; if so, counts it. At
    /// [`DAMAGED_OBJECTS_OUT`] objects found damaged since it started, the
    /// OSD asks the leader to mark it out: its disk has shown that it does
    /// not keep data. Its PGs move to other OSDs, its copies the sources
    /// of their recovery until the new ones are complete, each damaged
    /// object pulled from another copy (replication.md §7).
    fn note_damage(self: &Rc<Self>, oid: ObjectId, e: &StoreError) -> bool {
        let why = match e {
            StoreError::Corrupt(why) => why.clone(),
            StoreError::Io(e) => format!("read error: {e}"),
            _ => return false,
        };
        tracing::error!("osd.{}: object {oid} holds damaged data: {why}", self.id);
        let n = self.stats.damaged(oid, format!("object {oid}: {why}"));
        let out = self.map.borrow().cluster.out.contains(&self.id);
        if n >= DAMAGED_OBJECTS_OUT && !out && !self.asking_out.replace(true) {
            let me = self.clone();
            rt::spawn(async move {
                me.ask_out(n).await;
                me.asking_out.set(false);
            });
        }
        true
    }

    async fn ask_out(&self, n: u64) {
        let mut h = Header::request(Op::MarkOut, 0, ObjectId::new(0, 0));
        h.sender = self.id;
        h.obj_version = 1;
        match self.leader_call(h, None).await {
            Ok(f) if f.h.status == Status::Ok => tracing::error!(
                "osd.{}: {n} objects found damaged since it started: marked out, its PGs move to other OSDs",
                self.id
            ),
            Ok(f) => tracing::error!(
                "osd.{}: {n} objects found damaged since it started, but the leader did not mark it out: {:?} {}",
                self.id,
                f.h.status,
                String::from_utf8_lossy(f.payload.as_deref().unwrap_or(&[]))
            ),
            Err(e) => tracing::error!(
                "osd.{}: {n} objects found damaged since it started; asking to be marked out: {e}",
                self.id
            ),
        }
    }

    /// The objects this OSD holds per volume, and those of them it counts
    /// for the cluster (one count per object): in a replicated pool those
    /// of the PGs it is the primary of, in an erasure-coded one its shards
    /// at the first parity slot, if it holds that slot (every object has
    /// its parity shards; a data shard may be absent).
    pub fn volume_usage(&self) -> VolumeUsage {
        let m = self.map.borrow();
        let mut per: BTreeMap<u64, [u64; 4]> = BTreeMap::new();
        // A bench's objects are this OSD's own: no volume's, and no sweep
        // of orphans may take them for one.
        for (oid, _) in self.store.list_where(|o| o.volume != BENCH_VOLUME) {
            let e = per.entry(oid.volume.0).or_insert([oid.volume.0, 0, 0, 0]);
            e[1] += 1;
            let Some(pg) = m.pg_of(oid) else {
                continue;
            };
            let ec = (m.pools.get(&pg.pool)).and_then(|p| p.record.ec);
            let counted = match ec {
                Some(e) => {
                    oid.shard_index() == Some(e.k)
                        && m.placement(pg).get(usize::from(e.k)) == Some(&self.id)
                }
                None => m.primary(pg) == Some(self.id),
            };
            // The highest block among the objects it counts: a stray copy
            // (not listed by a primary, so no cut would take it) is not
            // counted.
            if counted {
                e[2] += 1;
                e[3] = e[3].max(oid.whole().block.saturating_add(1));
            }
        }
        VolumeUsage {
            block_bytes: self.store.block_bytes(),
            volumes: per.into_values().collect(),
        }
    }

    /// Answers `Op::List` as the active primary of the PG: the objects of
    /// the volume in the PG from the block named on, at their
    /// authoritative versions (those this copy still lacks included,
    /// those deleted since excluded), a page of them.
    async fn answer_list(self: &Rc<Self>, h: &Header) -> (Header, Option<AlignedBuf>) {
        let (pg, epoch, from) = (h.pg_id(), h.epoch, h.oid.block);
        if h.length == 0 || h.length > nacre_wire::LIST_PAGE_MAX {
            return (h.reply(Status::Invalid), None);
        }
        if let Err(s) = self.wait_active(pg, epoch).await {
            let mut r = h.reply(s);
            r.epoch = self.epoch();
            return (r, None);
        }
        // As a read: a primary cut off from the leader may be deposed.
        if !self.holds_read_lease() {
            return (h.reply(Status::Unavailable), None);
        }
        if self.scheme(pg.pool).is_some() {
            // An EC PG's objects are on its shards (ec.rs).
            return match self.ec_list(h).await {
                Ok(body) => (
                    h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                ),
                Err(s) => (h.reply(s), None),
            };
        }
        let count = self.map.borrow().pg_count(pg.pool);
        let volume = h.oid.volume;
        let keep = |o: &ObjectId| o.volume == volume && o.block >= from && pg.holds(*o, count);
        let mut found: BTreeMap<u64, u64> = (self.store.list_where(keep).into_iter())
            .map(|(o, v)| (o.block, v))
            .collect();
        if let Some(r) = (self.recovery.borrow().get(&pg)).filter(|r| r.epoch == epoch) {
            for (o, w) in r.wants.range(h.oid..) {
                if o.volume != h.oid.volume {
                    break;
                }
                if w.delete {
                    found.remove(&o.block);
                } else {
                    found.insert(o.block, w.version);
                }
            }
        }
        let body = nacre_wire::encode_list(found.into_iter().take(h.length as usize));
        (
            h.reply(Status::Ok).with_payload(&body),
            Some(AlignedBuf::from_slice(&body)),
        )
    }

    /// Deletes every local object of a volume.
    async fn purge_volume(self: &Rc<Self>, volume: u64) -> Status {
        self.purged.borrow_mut().insert(volume);
        let victims = self.store.list_where(|o| o.volume.0 == volume);
        let mut status = Status::Ok;
        for chunk in victims.chunks(PURGE_PARALLEL_MAX) {
            let tasks: Vec<_> = chunk
                .iter()
                .map(|&(oid, v)| {
                    let me = self.clone();
                    rt::spawn(async move {
                        me.lock(oid).await;
                        let v = me.store.version(oid).unwrap_or(v);
                        let r = me.store.delete(oid, v + 1).await;
                        me.unlock(oid);
                        r
                    })
                })
                .collect();
            for t in tasks {
                match t.await {
                    Ok(()) | Err(StoreError::NotFound(_)) => {}
                    Err(e) => status = status_of(&e),
                }
            }
        }
        // Nothing of it is left to recover (else the PGs would wait for
        // objects no copy holds any more).
        self.forget_volume(volume).await;
        status
    }
}

impl<D: BlockDev + 'static, T: Transport> Handler for Osd<D, T> {
    fn reply_bytes_max(&self, h: &Header) -> usize {
        match h.op {
            Op::Read | Op::ShardRead | Op::DirectRead => h.length as usize,
            Op::Pull => self.store.block_bytes() as usize,
            Op::Stat | Op::Metrics | Op::Scrub | Op::Bench | Op::NetBench => {
                nacre_wire::CONTROL_PAYLOAD_MAX_BYTES as usize
            }
            Op::Echo => h.length.min(nacre_wire::ECHO_REPLY_MAX) as usize,
            Op::PgQuery | Op::VolumeUsage => nacre_wire::PAYLOAD_MAX_BYTES as usize,
            Op::List | Op::ShardList => {
                h.length.min(nacre_wire::LIST_PAGE_MAX) as usize * nacre_wire::LIST_ENTRY_BYTES
            }
            _ => 0,
        }
    }

    /// Serves `f`, counting it by type ([`OsdStats::op_started`]).
    async fn handle(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        let me = self.clone();
        let counted = me.stats.op_started(f.h.op);
        let received = f.payload.as_ref().map_or(0, |p| p.len());
        let (h, body) = self.dispatch(f).await;
        counted.done(h.status, received, body.as_ref().map_or(0, |b| b.len()));
        (h, body)
    }
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    async fn dispatch(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        let h = f.h;
        // A peer ahead of this OSD: learn its epoch (in the background;
        // this request is answered with the epoch known now).
        if h.epoch > self.epoch() && self.up_from.get() != 0 && h.op != Op::Map {
            let me = self.clone();
            rt::spawn(async move { me.refresh_map().await });
        }
        let route = match h.op {
            Op::Read | Op::Write | Op::Delete | Op::List => self.check_route(&h, true),
            Op::RepWrite | Op::RepDelete => self.check_route(&h, false),
            Op::ShardRead
            | Op::ShardWrite
            | Op::ShardDelete
            | Op::ShardCommit
            | Op::ShardSettle
            | Op::ShardList
            | Op::ShardVersion => self.check_shard_route(&h),
            _ => None,
        };
        // Nothing lands in a PG whose stray copy is being deleted here, and
        // nobody learns its state mid-way: a query answered while deletes
        // are in flight could list objects about to go (the peer retries).
        let route = route.or_else(|| {
            (matches!(
                h.op,
                Op::RepWrite
                    | Op::RepDelete
                    | Op::ShardRead
                    | Op::ShardWrite
                    | Op::ShardDelete
                    | Op::ShardSettle
                    | Op::ShardList
                    | Op::ShardVersion
                    | Op::Push
                    | Op::LogSync
                    | Op::PgQuery
                    | Op::Pull
                    | Op::Scrub
            ) && self.removing.borrow().contains(&h.pg_id()))
            .then_some(Status::Unavailable)
        });
        if let Some(s) = route {
            let mut r = h.reply(s);
            r.epoch = self.epoch();
            return (r, None);
        }
        match h.op {
            Op::Read => {
                if let Err(s) = self.wait_active(h.pg_id(), h.epoch).await {
                    let mut r = h.reply(s);
                    r.epoch = self.epoch();
                    return (r, None);
                }
                let t = self.stats.start();
                // Only committed data: a write of this object in flight may
                // be on this copy and not yet on the others; wait for it to
                // be acknowledged or to fail.
                self.wait_unbusy(h.oid).await;
                if !self.holds_read_lease() {
                    return (h.reply(Status::Unavailable), None);
                }
                if self.pg_state(h.pg_id()) != Some(PgState::Active) {
                    // It failed: this copy may hold what others lack.
                    return (h.reply(Status::Unavailable), None);
                }
                if self.scheme(h.pool).is_some() {
                    // Under the object's lock: no write starts meanwhile,
                    // so no shard read sees a write not yet committed on
                    // every shard (which could still be undone).
                    self.lock(h.oid).await;
                    let r = Box::pin(self.ec_read(&h)).await;
                    self.unlock(h.oid);
                    return match r {
                        Ok(buf) => {
                            self.stats.read_done(t, buf.len());
                            (h.reply(Status::Ok).with_payload(&buf), Some(buf))
                        }
                        Err(s) => (h.reply(s), None),
                    };
                }
                // This copy still lacks the object: recover it first.
                if self.must_recover(h.pg_id(), h.epoch, h.oid, true) {
                    self.lock(h.oid).await;
                    let r = Box::pin(self.recover_for_op(h.pg_id(), h.epoch, h.oid)).await;
                    self.unlock(h.oid);
                    if let Err(s) = r {
                        return (h.reply(s), None);
                    }
                }
                match self.store.read(h.oid, h.offset, h.length).await {
                    Ok(buf) => {
                        self.stats.read_done(t, buf.len());
                        (h.reply(Status::Ok).with_payload(&buf), Some(buf))
                    }
                    Err(e) => {
                        if self.note_damage(h.oid, &e) {
                            return match Box::pin(self.read_elsewhere(&h)).await {
                                Ok(buf) => {
                                    self.stats.read_done(t, buf.len());
                                    (h.reply(Status::Ok).with_payload(&buf), Some(buf))
                                }
                                Err(s) => (h.reply(s), None),
                            };
                        }
                        (h.reply(status_of(&e)), None)
                    }
                }
            }
            Op::Write | Op::Delete => {
                let t = self.stats.start();
                let len = f.payload.as_ref().map_or(0, |p| p.len());
                let (s, v) = self.primary_update(&h, f.payload).await;
                if s == Status::Ok {
                    self.stats.write_done(t, len);
                }
                let mut r = h.reply(s);
                r.obj_version = v;
                r.epoch = self.epoch();
                (r, None)
            }
            Op::RepWrite | Op::RepDelete => {
                let s = self.replica_update(&h, f.payload).await;
                if s == Status::Ok {
                    self.stats.replica_done();
                }
                (h.reply(s), None)
            }
            _ => Box::pin(self.dispatch_rare(f)).await,
        }
    }

    /// The ops that are not client I/O or its replication: their futures
    /// are larger than the hot ops' and are boxed apart, so the future of
    /// every request (copied into the task that serves it) stays small.
    async fn dispatch_rare(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        let h = f.h;
        match h.op {
            Op::Read | Op::Write | Op::Delete | Op::RepWrite | Op::RepDelete => {
                unreachable!("dispatch serves {:?}", h.op)
            }
            Op::ShardRead => self.answer_shard_read(&h).await,
            Op::DirectRead => {
                let t = self.stats.start();
                let r = self.answer_direct_read(&h).await;
                self.stats.direct_read(r.as_ref().err().copied());
                match r {
                    Ok(buf) => {
                        self.stats.read_done(t, buf.len());
                        (h.reply(Status::Ok).with_payload(&buf), Some(buf))
                    }
                    Err(s) => {
                        let mut r = h.reply(s);
                        r.epoch = self.epoch();
                        (r, None)
                    }
                }
            }
            Op::ShardActive => (h.reply(self.answer_shard_active(&h).await), None),
            Op::ShardWrite | Op::ShardDelete => {
                let s = self.apply_shard_op(&h, f.payload).await;
                (h.reply(s), None)
            }
            Op::ShardCommit => {
                let s = self.answer_shard_commit(&h, f.payload.as_deref().unwrap_or(&[]));
                (h.reply(s), None)
            }
            Op::ShardSettle => (h.reply(self.settle_shard(&h).await), None),
            Op::ShardVersion => match self.store.version(h.oid) {
                Some(v) => {
                    let mut r = h.reply(Status::Ok);
                    r.obj_version = v;
                    (r, None)
                }
                None => (h.reply(Status::NotFound), None),
            },
            Op::ShardList => {
                let body = self.shard_list(&h);
                (
                    h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                )
            }
            Op::List => self.answer_list(&h).await,
            Op::PurgeVolume if h.oid.volume == BENCH_VOLUME => (h.reply(Status::Invalid), None),
            Op::PurgeVolume => (h.reply(self.purge_volume(h.oid.volume.0).await), None),
            Op::PgClean => (h.reply(self.answer_pg_clean(&h)), None),
            Op::VolumeUsage => {
                let body = serde_json::to_vec(&self.volume_usage()).expect("usage serialises");
                (
                    h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                )
            }
            Op::Stat => {
                let body = serde_json::to_vec(&self.stat_report()).expect("stats serialise");
                (
                    h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                )
            }
            Op::Metrics => {
                let mut report = self.stat_report();
                // Counted by state in `pg_states`; named, they (and the
                // peers' pings, not exported) could crowd the op counters
                // out of a control payload.
                report.pgs_not_clean.clear();
                report.peer_ping_us_p50.clear();
                let m = self.stats.metrics(report, &self.store);
                let body = serde_json::to_vec(&m).expect("metrics serialise");
                (
                    h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                )
            }

            Op::Map => {
                let body = f.payload.as_deref().unwrap_or(&[]);
                match OsdMap::from_json(body) {
                    Ok(m) => {
                        self.set_map(m);
                        (h.reply(Status::Ok), None)
                    }
                    Err(why) => {
                        tracing::warn!("osd.{}: a bad map pushed: {why}", self.id);
                        (h.reply(Status::Invalid), None)
                    }
                }
            }
            Op::PgQuery => self.answer_query(&h, f.payload).await,
            Op::Pull => self.answer_pull(&h).await,
            Op::Scrub => self.answer_scrub(&h, f.payload).await,
            Op::Bench => self.answer_bench(&h),
            Op::Echo => self.answer_echo(&h),
            Op::NetBench => self.answer_net_bench(&h).await,
            Op::Push => {
                let s = self.answer_push(&h, f.payload).await;
                (h.reply(s), None)
            }
            Op::LogSync => {
                let s = self.answer_log_sync(&h, f.payload.as_deref()).await;
                (h.reply(s), None)
            }
            Op::Boot
            | Op::GetMap
            | Op::PgEvent
            | Op::Ping
            | Op::Dead
            | Op::MarkOut
            | Op::AddOsd
            | Op::RmOsd
            | Op::PoolChange => (h.reply(Status::Invalid), None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nacre_blockstore::{LogOp, PgLog};

    fn entry(version: u64, oid: ObjectId, client: u64, request: u64) -> LogEntry {
        LogEntry {
            pg: 1 << 32,
            version,
            oid,
            op: LogOp::Write,
            offset: 0,
            len: 4096,
            client,
            request,
        }
    }

    /// A request whose object a later rewrite wrote over is not answered
    /// from the log (its effect may be gone: it is applied again); one
    /// after the rewrite, or of another object, is.
    #[test]
    fn a_rewrite_hides_the_earlier_requests_of_its_object() {
        let (x, y) = (ObjectId::new(9, 1), ObjectId::new(9, 2));
        let v = |epoch: u64, seq: u64| epoch << 32 | seq;
        let mut log = PgLog::default();
        for e in [
            entry(v(10, 1), x, 7, 40),
            entry(v(10, 2), y, 7, 41),
            entry(v(12, 1), x, 0, 0),
            entry(v(12, 2), x, 7, 42),
        ] {
            log.entries.insert(e.version, e);
        }
        let done = ReqCache::of_log(&log);
        assert_eq!(done.get((7, 40)), None, "undone by the rewrite");
        assert_eq!(done.get((7, 41)), Some(v(10, 2)));
        assert_eq!(done.get((7, 42)), Some(v(12, 2)));
        assert_eq!(done.get((0, 0)), None);
    }
}
