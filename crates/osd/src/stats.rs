//! An OSD's counters: client ops served as primary, replica ops, bytes,
//! latency sums, and rates over the last completed second.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use nacre_blockstore::Store;
use nacre_io::BlockDev;
use nacre_types::metrics::{Histogram, HistogramSnapshot};
use nacre_types::{ObjectId, PgId};
use serde::{Deserialize, Serialize};

use crate::scrub::ScrubReport;

/// Damaged objects an OSD remembers by name (counts past it stay there:
/// the threshold that matters is far lower).
const DAMAGED_OBJECTS_KEPT: usize = 1024;

/// Counters with a rate: reads, writes, their bytes, object copies
/// recovered and their bytes, and of those the moves (rebalance).
const RATES: usize = 8;

/// Buckets of a latency window: a quarter of a power of two each, from
/// 1 µs to about 2^31 µs (36 minutes: anything slower lands in the last).
const LATENCY_BUCKETS: usize = 128;
/// How long a latency window lasts; the last complete one is reported.
pub const LATENCY_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// Complete latency windows a [`LatencyWindow`] keeps: slow-OSD
/// detection asks for a figure that stood out in each of them.
pub const LATENCY_WINDOWS_KEPT: usize = 3;

/// Op latencies of the last complete [`LATENCY_WINDOW`]s, for percentiles
/// (what slow-OSD detection compares between OSDs): a few increments per
/// op, no allocation. Its clock is the runtime's (`rt::monotonic`:
/// virtual in the simulator, where a slow disk is a virtual delay).
pub struct LatencyWindow {
    start: Cell<Option<Duration>>,
    current: RefCell<[u32; LATENCY_BUCKETS]>,
    /// The last complete windows, newest first (an idle one empty).
    recent: RefCell<VecDeque<[u32; LATENCY_BUCKETS]>>,
}

impl Default for LatencyWindow {
    fn default() -> Self {
        LatencyWindow {
            start: Cell::new(None),
            current: RefCell::new([0; LATENCY_BUCKETS]),
            recent: RefCell::new(VecDeque::with_capacity(LATENCY_WINDOWS_KEPT + 1)),
        }
    }
}

/// The bucket of `us`: below 4 µs one per µs, then four per power of two.
fn latency_bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let lg = 63 - u64::from(us.leading_zeros());
    ((4 * lg + ((us >> (lg - 2)) & 3)) as usize).min(LATENCY_BUCKETS - 1)
}

/// The largest latency bucket `b` holds, in µs.
fn latency_bucket_top(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let (lg, frac) = ((b / 4) as u64, (b % 4) as u64);
    ((4 + frac + 1) << (lg - 2)) - 1
}

/// Quantile `q` of one window's buckets (the top of its bucket), or None
/// if it saw no op.
fn bucket_quantile(w: &[u32; LATENCY_BUCKETS], q: f64) -> Option<f64> {
    let n: u64 = w.iter().map(|&c| u64::from(c)).sum();
    if n == 0 {
        return None;
    }
    let want = ((q * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0u64;
    for (b, &c) in w.iter().enumerate() {
        seen += u64::from(c);
        if seen >= want {
            return Some(latency_bucket_top(b) as f64);
        }
    }
    None
}

impl LatencyWindow {
    /// Counts an op of `us` µs, `now` on the runtime's clock.
    pub fn record_at(&self, now: Duration, us: u64) {
        self.rotate(now);
        self.current.borrow_mut()[latency_bucket(us)] += 1;
    }

    /// Starts a new window once the current one is over; the one before
    /// joins the complete ones, and so does an empty one for each whole
    /// window that passed idle since.
    fn rotate(&self, now: Duration) {
        let Some(t0) = self.start.get() else {
            self.start.set(Some(now));
            return;
        };
        let passed = now.saturating_sub(t0);
        if passed < LATENCY_WINDOW {
            return;
        }
        let done = std::mem::replace(&mut *self.current.borrow_mut(), [0; LATENCY_BUCKETS]);
        let mut recent = self.recent.borrow_mut();
        recent.push_front(done);
        let idle = (passed.as_nanos() / LATENCY_WINDOW.as_nanos()) as usize - 1;
        for _ in 0..idle.min(LATENCY_WINDOWS_KEPT) {
            recent.push_front([0; LATENCY_BUCKETS]);
        }
        recent.truncate(LATENCY_WINDOWS_KEPT);
        self.start.set(Some(now));
    }

    /// Quantile `q` of the last complete window (the top of its bucket:
    /// within a quarter of a power of two above the truth), or None if it
    /// saw no op.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.quantile_at(nacre_io::rt::monotonic(), q)
    }

    fn quantile_at(&self, now: Duration, q: f64) -> Option<f64> {
        self.recent_at(now, q).first().copied().flatten()
    }

    /// Quantile `q` of each complete window kept, newest first.
    pub fn recent(&self, q: f64) -> Vec<Option<f64>> {
        self.recent_at(nacre_io::rt::monotonic(), q)
    }

    fn recent_at(&self, now: Duration, q: f64) -> Vec<Option<f64>> {
        self.rotate(now);
        let recent = self.recent.borrow();
        recent.iter().map(|w| bucket_quantile(w, q)).collect()
    }
}

/// Op codes an OSD counts ops of (every [`nacre_wire::Op`] is below).
const OP_CODES: usize = 64;
const _: () = assert!((nacre_wire::Op::Metrics as usize) < OP_CODES);

/// Ops of one type this OSD answered since it started.
#[derive(Default)]
struct OpCounters {
    count: Cell<u64>,
    /// By status, those answered with another status than `Ok` or
    /// `NotFound` (an answer: the range reads as zeros, the object is
    /// absent).
    errors: RefCell<BTreeMap<String, u64>>,
    received_bytes: Cell<u64>,
    sent_bytes: Cell<u64>,
    latency: Histogram,
}

/// [`OpCounters`] of every op code.
struct OpTable(Box<[OpCounters]>);

impl Default for OpTable {
    fn default() -> Self {
        OpTable((0..OP_CODES).map(|_| OpCounters::default()).collect())
    }
}

#[derive(Default)]
pub struct OsdStats {
    /// Every op answered, by type; and those being served now.
    ops: OpTable,
    ops_in_flight: Cell<u64>,
    /// This OSD's own store writes since it started (what
    /// `store_write_window` holds for ten seconds at a time).
    store_write_latency: Histogram,
    /// Round trips of this OSD's pings to each peer it shares a PG with.
    peer_pings: RefCell<BTreeMap<u32, LatencyWindow>>,
    /// Client reads and writes served as primary: latencies of the last
    /// complete window.
    read_window: LatencyWindow,
    write_window: LatencyWindow,
    /// Writes to this OSD's own store, however they came.
    store_write_window: LatencyWindow,
    reads: Cell<u64>,
    writes: Cell<u64>,
    read_bytes: Cell<u64>,
    write_bytes: Cell<u64>,
    replica_ops: Cell<u64>,
    read_us_sum: Cell<u64>,
    write_us_sum: Cell<u64>,
    /// Counters at the start of the current one-second window, and the
    /// rates of the last complete one.
    window: Cell<Option<(Instant, [u64; RATES])>>,
    rates: Cell<[f64; RATES]>,
    /// Clients' direct reads of this OSD's shards, answered and refused
    /// (the client then asks the primary).
    direct_reads: Cell<u64>,
    direct_refused: Cell<u64>,
    /// Reads that found this OSD's copy damaged, and what the last one
    /// said.
    damaged_reads: Cell<u64>,
    last_damage: RefCell<Option<String>>,
    /// The objects of those reads (up to [`DAMAGED_OBJECTS_KEPT`]).
    damaged_objects: RefCell<std::collections::HashSet<ObjectId>>,
    /// Damaged copies rewritten from another copy.
    repaired: Cell<u64>,
    /// Objects found damaged whose copy here has not been rewritten since
    /// (up to [`DAMAGED_OBJECTS_KEPT`]).
    unrepaired: RefCell<std::collections::HashSet<ObjectId>>,
    /// Why the store's journal replay stopped before its end at open.
    replay_stopped: RefCell<Option<String>>,
    /// Object copies this OSD recovered as primary, and their bytes; and
    /// of them, those of PGs that kept every copy (a move: rebalance).
    recovered_objects: Cell<u64>,
    recovered_bytes: Cell<u64>,
    rebalanced_objects: Cell<u64>,
    rebalanced_bytes: Cell<u64>,
    /// Objects of stray copies (PGs placement moved away) deleted here.
    stray_removed: Cell<u64>,
    /// PG queries this OSD answered with a listing of the PG's objects
    /// (backfill), not from its log.
    pg_listings: Cell<u64>,
    /// Objects whose copies differed where their PG logs said nothing
    /// (checked under `strict` only).
    log_delta_misses: Cell<u64>,
    /// Copies this OSD, as primary, compared with the authoritative one
    /// from their logs, and on listings of their objects.
    compared_by_log: Cell<u64>,
    compared_by_listing: Cell<u64>,
    /// Scrubs this OSD finished as primary (light, deep), and what all of
    /// its scrubs compared and found.
    scrubs: Cell<u64>,
    deep_scrubs: Cell<u64>,
    scrub_objects: Cell<u64>,
    scrub_inconsistent: Cell<u64>,
    scrub_repaired: Cell<u64>,
    scrub_unrepaired: Cell<u64>,
    last_scrub_finding: RefCell<Option<String>>,
    /// PGs whose last scrub left objects unrepaired, with how many.
    scrub_unrepaired_pgs: RefCell<BTreeMap<PgId, u64>>,
}

/// What `Op::Stat` answers (JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OsdReport {
    pub id: u32,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub replica_ops: u64,
    /// Clients' reads of one of this OSD's EC shards sent to it directly
    /// (not through the PG's primary), answered; and those refused.
    #[serde(default)]
    pub direct_reads: u64,
    #[serde(default)]
    pub direct_reads_refused: u64,
    pub read_latency_us_avg: f64,
    pub write_latency_us_avg: f64,
    /// Client reads and writes this OSD served as primary in the last
    /// complete 10 s window: p50 and p99, each the top of its bucket
    /// (within a quarter of a power of two above the truth); absent when
    /// the window saw none.
    #[serde(default)]
    pub read_latency_us_p50: Option<f64>,
    #[serde(default)]
    pub read_latency_us_p99: Option<f64>,
    #[serde(default)]
    pub write_latency_us_p50: Option<f64>,
    #[serde(default)]
    pub write_latency_us_p99: Option<f64>,
    /// This OSD's own store writes (as primary, as replica, of shards:
    /// its disk as the OSD sees it, no network): p99 of each of the last
    /// complete windows, newest first (None: a window without one). What
    /// slow-OSD detection compares.
    #[serde(default)]
    pub store_write_us_p99: Vec<Option<f64>>,
    /// This OSD's pings to each OSD it shares a PG with (the link, no
    /// disk): per peer, the median round trip in µs of each of the last
    /// complete windows, newest first. What `SLOW_LINK` compares.
    #[serde(default)]
    pub peer_ping_us_p50: crate::slow::PeerPings,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub objects: u64,
    /// Reads that found this OSD's copy damaged since it started (a
    /// checksum that failed, an error from the device): this OSD holds
    /// damaged data, the operator must know.
    #[serde(default)]
    pub damaged_reads: u64,
    /// The objects those reads found damaged (distinct, up to 1 024).
    #[serde(default)]
    pub damaged_objects: u64,
    #[serde(default)]
    pub last_damage: Option<String>,
    /// Of those, the copies rewritten from another copy's (the rest were
    /// refused with EIO, or served from another copy but not rewritten).
    #[serde(default)]
    pub repaired: u64,
    /// Objects found damaged here whose copy has not been rewritten since
    /// (repaired, or written whole or deleted): damage nothing fixed yet.
    #[serde(default)]
    pub damaged_unrepaired: u64,
    /// Replay of the store's journal stopped before its end at open
    /// (damage in the journal, not a torn tail).
    #[serde(default)]
    pub replay_stopped: Option<String>,
    /// The map epoch this OSD is in.
    #[serde(default)]
    pub epoch: u64,
    /// The PGs this OSD is primary of in that epoch, counted by state
    /// ([`PgReport::state`]).
    #[serde(default)]
    pub pg_states: BTreeMap<String, u32>,
    /// Those not `active+clean`, with why (at most [`PG_REPORT_MAX`]).
    #[serde(default)]
    pub pgs_not_clean: Vec<PgReport>,
    /// Object copies this OSD, as primary, has recovered since it
    /// started, their bytes, and how many its PGs still lack.
    #[serde(default)]
    pub recovered_objects: u64,
    #[serde(default)]
    pub recovered_bytes: u64,
    #[serde(default)]
    pub recovery_objects_left: u64,
    /// Of those, the copies of degraded PGs (fewer complete copies than
    /// the pool's size: redundancy lost) and of PGs that move with every
    /// copy kept (misplaced); and the pace over the last second.
    #[serde(default)]
    pub degraded_objects_left: u64,
    #[serde(default)]
    pub misplaced_objects_left: u64,
    #[serde(default)]
    pub recovery_objects_per_s: f64,
    #[serde(default)]
    pub recovery_bytes_per_s: f64,
    /// Of the copies recovered (since the start, and the pace), those of
    /// PGs that kept every copy: moves to a new placement (rebalance).
    #[serde(default)]
    pub rebalanced_objects: u64,
    #[serde(default)]
    pub rebalanced_bytes: u64,
    #[serde(default)]
    pub rebalance_objects_per_s: f64,
    #[serde(default)]
    pub rebalance_bytes_per_s: f64,
    /// Object copies missing from active PGs that recover nothing: a copy
    /// is down and not yet replaced (its OSD is still in).
    #[serde(default)]
    pub degraded_waiting_objects: u64,
    /// The store's object (block) size: a recovered copy is one.
    #[serde(default)]
    pub object_bytes: u64,
    /// Objects of stray copies (PGs placement gave to other OSDs) this
    /// OSD has deleted since it started, once those PGs were clean.
    #[serde(default)]
    pub stray_objects_removed: u64,
    /// PG queries answered with a listing of the PG's objects (backfill)
    /// since the OSD started; the others were answered from the log.
    #[serde(default)]
    pub pg_listings: u64,
    /// Under `strict`: objects whose copies differed where their PG logs
    /// said nothing (a peering compared from the logs would miss them).
    #[serde(default)]
    pub log_delta_misses: u64,
    /// Copies this OSD, as primary, compared with the authoritative one
    /// from their PG logs (a few object versions) and on listings of
    /// every object of the PG (backfill), since it started.
    #[serde(default)]
    pub compared_by_log: u64,
    #[serde(default)]
    pub compared_by_listing: u64,
    /// Scrubs of its PGs this OSD finished as primary since it started,
    /// light and deep; the objects all its scrubs compared, those whose
    /// copies differed, and of them the ones rewritten from the
    /// authority and the ones left alone; the last difference found.
    #[serde(default)]
    pub scrubs: u64,
    #[serde(default)]
    pub deep_scrubs: u64,
    #[serde(default)]
    pub scrub_objects: u64,
    #[serde(default)]
    pub scrub_inconsistent: u64,
    #[serde(default)]
    pub scrub_repaired: u64,
    #[serde(default)]
    pub scrub_unrepaired: u64,
    #[serde(default)]
    pub last_scrub_finding: Option<String>,
    /// PGs whose last scrub left objects unrepaired (`["1.5", objects]`,
    /// at most [`PG_REPORT_MAX`]).
    #[serde(default)]
    pub pgs_scrub_unrepaired: Vec<(PgId, u64)>,
    /// The PG being scrubbed now, e.g. `1.5` or `1.5 deep`.
    #[serde(default)]
    pub scrubbing: Option<String>,
    /// Its scrub schedule: seconds between light and between deep scrubs
    /// of a PG (0: none scheduled).
    #[serde(default)]
    pub scrub_interval_s: u64,
    #[serde(default)]
    pub deep_scrub_interval_s: u64,
    /// The used fractions at which this OSD is near full and full.
    #[serde(default = "one")]
    pub nearfull_ratio: f64,
    #[serde(default = "one")]
    pub full_ratio: f64,
}

fn one() -> f64 {
    1.0
}

/// An op being served ([`OsdStats::op_started`]); [`OpInFlight::done`]
/// counts it with its answer, and dropping it without (the connection went
/// away first) only ends it.
pub struct OpInFlight<'a> {
    stats: &'a OsdStats,
    op: nacre_wire::Op,
    t0: Duration,
}

impl OpInFlight<'_> {
    /// The op was answered with `status`, having brought `received` bytes
    /// of payload and sending `sent` back.
    pub fn done(self, status: nacre_wire::Status, received: usize, sent: usize) {
        let Some(c) = self.stats.ops.0.get(self.op as usize) else {
            return;
        };
        add(&c.count, 1);
        add(&c.received_bytes, received as u64);
        add(&c.sent_bytes, sent as u64);
        let us = nacre_io::rt::monotonic()
            .saturating_sub(self.t0)
            .as_micros() as u64;
        c.latency.record(us);
        if !matches!(
            status,
            nacre_wire::Status::Ok | nacre_wire::Status::NotFound
        ) {
            *c.errors
                .borrow_mut()
                .entry(format!("{status:?}"))
                .or_default() += 1;
        }
    }
}

impl Drop for OpInFlight<'_> {
    fn drop(&mut self) {
        let n = &self.stats.ops_in_flight;
        n.set(n.get() - 1);
    }
}

/// What `Op::Metrics` answers (JSON): what `--metrics` endpoints export of
/// an OSD.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OsdMetrics {
    /// What `Op::Stat` answers (without the PGs it names: the counts by
    /// state are there).
    pub report: OsdReport,
    /// Every op type answered since the OSD started.
    pub ops: Vec<OpMetrics>,
    /// Ops being served when it answered (its queue depth).
    pub ops_in_flight: u64,
    /// Its own store writes since it started.
    pub store_write_latency: HistogramSnapshot,
    pub store: StoreMetrics,
}

/// One op type's counters ([`OsdMetrics::ops`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OpMetrics {
    /// The op's name (`Read`, `RepWrite`, ...).
    pub op: String,
    pub count: u64,
    /// Answered with another status than `Ok` or `NotFound`, by status.
    pub errors: BTreeMap<String, u64>,
    /// Payload bytes the requests brought and the answers carried.
    pub received_bytes: u64,
    pub sent_bytes: u64,
    pub latency: HistogramSnapshot,
}

/// The store's counters since the OSD opened it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StoreMetrics {
    /// Journal batches written, records in them, small writes (through
    /// the journal) and big ones (whole blocks in place), syncs,
    /// checkpoints, reads retried after a checksum mismatch.
    pub counters: nacre_blockstore::Stats,
    /// Journal bytes written since the last checkpoint.
    pub journal_used_bytes: u64,
    /// RAM its index, checksum and overlay caches and undo records take.
    pub memory_bytes: u64,
}

/// What `Op::VolumeUsage` answers (JSON): the objects an OSD holds per
/// volume. Every object takes one block.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeUsage {
    pub block_bytes: u32,
    /// `[volume id, objects here (copies or shards), of them those it
    /// counts for the cluster (`Osd::volume_usage`: one count per object),
    /// the highest block of those + 1]`, by volume id.
    pub volumes: Vec<[u64; 4]>,
}

/// PGs not `active+clean` an OSD names in its report (the counts cover
/// every PG): a report must fit one control frame.
pub const PG_REPORT_MAX: usize = 32;

/// One PG as its primary sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgReport {
    pub pg: PgId,
    /// `active+clean`, `active+degraded` (fewer than `size` copies up),
    /// `active+recovering` (some copies lack objects; served meanwhile),
    /// `active+remapped+backfilling` (moving to the OSDs placement gives
    /// it: new copies filling while its temporary members keep `size`
    /// complete ones), `active+remapped` (filled, the temporary members
    /// not gone yet),
    /// `peering` (gathering and recovering the copies, or waiting for the
    /// next epoch after a failed write), or `inactive` (cannot peer).
    pub state: String,
    #[serde(default)]
    pub detail: Option<String>,
}

fn add(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

impl OsdStats {
    pub fn start(&self) -> Instant {
        Instant::now()
    }

    pub fn read_done(&self, t: Instant, bytes: usize) {
        let us = t.elapsed().as_micros() as u64;
        add(&self.reads, 1);
        add(&self.read_bytes, bytes as u64);
        add(&self.read_us_sum, us);
        self.read_window.record_at(nacre_io::rt::monotonic(), us);
        self.tick();
    }

    /// The p99 of this OSD's store writes in each kept window, newest
    /// first.
    pub fn store_write_p99(&self) -> Vec<Option<f64>> {
        self.store_write_window.recent(0.99)
    }

    /// A write to this OSD's store that started at `t0` (the runtime's
    /// clock) ended.
    pub fn store_write_done(&self, t0: Duration) {
        let now = nacre_io::rt::monotonic();
        let us = now.saturating_sub(t0).as_micros() as u64;
        self.store_write_window.record_at(now, us);
        self.store_write_latency.record(us);
    }

    /// A ping to OSD `peer` came back after `us` µs.
    pub fn peer_pinged(&self, peer: u32, us: u64) {
        let now = nacre_io::rt::monotonic();
        (self.peer_pings.borrow_mut().entry(peer).or_default()).record_at(now, us);
    }

    /// Forgets the pings of OSDs no longer among `peers`.
    pub fn keep_peers(&self, peers: &[u32]) {
        (self.peer_pings.borrow_mut()).retain(|p, _| peers.contains(p));
    }

    /// Each peer's median ping round trip in each kept window, newest
    /// first.
    pub fn peer_ping_p50(&self) -> crate::slow::PeerPings {
        (self.peer_pings.borrow().iter())
            .map(|(&p, w)| (p, w.recent(0.5)))
            .collect()
    }

    /// An op of code `op` began: counted in flight until the returned
    /// guard is dropped.
    pub fn op_started(&self, op: nacre_wire::Op) -> OpInFlight<'_> {
        self.ops_in_flight.set(self.ops_in_flight.get() + 1);
        OpInFlight {
            stats: self,
            op,
            t0: nacre_io::rt::monotonic(),
        }
    }

    /// What `Op::Metrics` answers: the report of `Op::Stat` (`report`)
    /// with every op type's counters, and the store's.
    pub fn metrics<D: BlockDev>(&self, report: OsdReport, store: &Store<D>) -> OsdMetrics {
        let ops = (self.ops.0.iter().enumerate())
            .filter(|(_, c)| c.count.get() > 0)
            .filter_map(|(code, c)| {
                let op = nacre_wire::Op::from_u8(code as u8)?;
                Some(OpMetrics {
                    op: format!("{op:?}"),
                    count: c.count.get(),
                    errors: c.errors.borrow().clone(),
                    received_bytes: c.received_bytes.get(),
                    sent_bytes: c.sent_bytes.get(),
                    latency: c.latency.snapshot(),
                })
            })
            .collect();
        let m = store.memory();
        OsdMetrics {
            report,
            ops,
            // Less this request, which is being answered.
            ops_in_flight: self.ops_in_flight.get().saturating_sub(1),
            store_write_latency: self.store_write_latency.snapshot(),
            store: StoreMetrics {
                counters: store.stats(),
                journal_used_bytes: store.journal_used_bytes(),
                memory_bytes: m.index_bytes
                    + m.csum_cache_bytes
                    + m.overlay_cache_bytes
                    + m.undo_bytes,
            },
        }
    }

    pub fn write_done(&self, t: Instant, bytes: usize) {
        let us = t.elapsed().as_micros() as u64;
        add(&self.writes, 1);
        add(&self.write_bytes, bytes as u64);
        add(&self.write_us_sum, us);
        self.write_window.record_at(nacre_io::rt::monotonic(), us);
        self.tick();
    }

    /// A client's direct read answered, or refused with the status given.
    pub fn direct_read(&self, refused: Option<nacre_wire::Status>) {
        match refused {
            None => add(&self.direct_reads, 1),
            // Not found is an answer (the range reads as zeros).
            Some(nacre_wire::Status::NotFound) => add(&self.direct_reads, 1),
            Some(_) => add(&self.direct_refused, 1),
        }
    }

    /// A read found this OSD's copy of `oid` damaged; the objects found
    /// damaged so far.
    pub fn damaged(&self, oid: ObjectId, what: String) -> u64 {
        add(&self.damaged_reads, 1);
        *self.last_damage.borrow_mut() = Some(what);
        let mut unrepaired = self.unrepaired.borrow_mut();
        if unrepaired.len() < DAMAGED_OBJECTS_KEPT {
            unrepaired.insert(oid);
        }
        let mut objects = self.damaged_objects.borrow_mut();
        if objects.len() < DAMAGED_OBJECTS_KEPT {
            objects.insert(oid);
        }
        objects.len() as u64
    }

    /// The damaged copy of `oid` was rewritten from another copy's bytes.
    pub fn repaired(&self, oid: ObjectId) {
        add(&self.repaired, 1);
        self.unrepaired.borrow_mut().remove(&oid);
    }

    /// `oid` was written whole or deleted here: a damaged copy of it is
    /// gone (a scrub's rewrite, a client's, recovery's).
    pub fn replaced(&self, oid: ObjectId) {
        if self.unrepaired.borrow_mut().remove(&oid) {
            add(&self.repaired, 1);
        }
    }

    pub fn pg_listed(&self) {
        add(&self.pg_listings, 1);
    }

    pub fn compared(&self, by_log: u64, by_listing: u64) {
        add(&self.compared_by_log, by_log);
        add(&self.compared_by_listing, by_listing);
    }

    pub fn log_delta_missed(&self) {
        add(&self.log_delta_misses, 1);
    }

    pub fn set_replay_stopped(&self, why: Option<String>) {
        *self.replay_stopped.borrow_mut() = why;
    }

    /// Recovery pushed `objects` object copies, `bytes` in all, for a PG
    /// that had lost redundancy or (`moved`) one that had not.
    pub fn recovered(&self, bytes: u64, objects: u64, moved: bool) {
        add(&self.recovered_bytes, bytes);
        add(&self.recovered_objects, objects);
        if moved {
            add(&self.rebalanced_bytes, bytes);
            add(&self.rebalanced_objects, objects);
        }
        self.tick();
    }

    /// A stray copy of `objects` objects was deleted.
    pub fn stray_removed(&self, objects: u64) {
        add(&self.stray_removed, objects);
    }

    /// A scrub of PG `r.pg` ended.
    pub fn scrubbed(&self, r: &ScrubReport) {
        if r.error.is_none() {
            add(
                if r.deep {
                    &self.deep_scrubs
                } else {
                    &self.scrubs
                },
                1,
            );
            let mut pgs = self.scrub_unrepaired_pgs.borrow_mut();
            if r.unrepaired == 0 {
                pgs.remove(&r.pg);
            }
        }
        if r.unrepaired != 0 {
            self.scrub_unrepaired_pgs
                .borrow_mut()
                .insert(r.pg, r.unrepaired);
        }
        add(&self.scrub_objects, r.objects);
        add(&self.scrub_inconsistent, r.inconsistent);
        add(&self.scrub_repaired, r.repaired);
        add(&self.scrub_unrepaired, r.unrepaired);
    }

    /// A scrub found copies that differ (`what`: which, and what was done).
    pub fn scrub_found(&self, what: String) {
        *self.last_scrub_finding.borrow_mut() = Some(what);
    }

    pub fn replica_done(&self) {
        add(&self.replica_ops, 1);
    }

    fn now_counts(&self) -> [u64; RATES] {
        [
            self.reads.get(),
            self.writes.get(),
            self.read_bytes.get(),
            self.write_bytes.get(),
            self.recovered_objects.get(),
            self.recovered_bytes.get(),
            self.rebalanced_objects.get(),
            self.rebalanced_bytes.get(),
        ]
    }

    /// Rolls the one-second window when it is over.
    fn tick(&self) {
        let now = Instant::now();
        match self.window.get() {
            None => self.window.set(Some((now, self.now_counts()))),
            Some((t0, c0)) => {
                let dt = now.duration_since(t0).as_secs_f64();
                if dt >= 1.0 {
                    let c = self.now_counts();
                    let mut r = [0.0; RATES];
                    for i in 0..RATES {
                        r[i] = (c[i] - c0[i]) as f64 / dt;
                    }
                    // Idle for more than a window: the rate is ~0 now.
                    if dt >= 2.0 {
                        r = [0.0; RATES];
                    }
                    self.rates.set(r);
                    self.window.set(Some((now, c)));
                }
            }
        }
    }

    pub fn report<D: BlockDev + 'static>(&self, id: u32, store: &Store<D>) -> OsdReport {
        self.tick();
        let idle = self
            .window
            .get()
            .is_some_and(|(t0, _)| t0.elapsed().as_secs_f64() >= 2.0);
        let r = if idle { [0.0; RATES] } else { self.rates.get() };
        let avg = |s: u64, n: u64| if n == 0 { 0.0 } else { s as f64 / n as f64 };
        let sp = store.space();
        // A damaged copy deleted since (a stray copy removed, a volume
        // purged) is no damage held here any more.
        (self.unrepaired.borrow_mut()).retain(|&oid| store.version(oid).is_some());
        OsdReport {
            id,
            reads: self.reads.get(),
            writes: self.writes.get(),
            read_bytes: self.read_bytes.get(),
            write_bytes: self.write_bytes.get(),
            replica_ops: self.replica_ops.get(),
            direct_reads: self.direct_reads.get(),
            direct_reads_refused: self.direct_refused.get(),
            read_latency_us_avg: avg(self.read_us_sum.get(), self.reads.get()),
            write_latency_us_avg: avg(self.write_us_sum.get(), self.writes.get()),
            read_latency_us_p50: self.read_window.quantile(0.5),
            read_latency_us_p99: self.read_window.quantile(0.99),
            write_latency_us_p50: self.write_window.quantile(0.5),
            write_latency_us_p99: self.write_window.quantile(0.99),
            store_write_us_p99: self.store_write_p99(),
            peer_ping_us_p50: self.peer_ping_p50(),
            read_iops: r[0],
            write_iops: r[1],
            read_bytes_per_s: r[2],
            write_bytes_per_s: r[3],
            recovery_objects_per_s: r[4],
            recovery_bytes_per_s: r[5],
            rebalance_objects_per_s: r[6],
            rebalance_bytes_per_s: r[7],
            rebalanced_objects: self.rebalanced_objects.get(),
            rebalanced_bytes: self.rebalanced_bytes.get(),
            object_bytes: u64::from(store.block_bytes()),
            capacity_bytes: sp.total_bytes,
            used_bytes: sp.used_bytes,
            objects: store.object_count() as u64,
            damaged_reads: self.damaged_reads.get(),
            damaged_objects: self.damaged_objects.borrow().len() as u64,
            last_damage: self.last_damage.borrow().clone(),
            repaired: self.repaired.get(),
            damaged_unrepaired: self.unrepaired.borrow().len() as u64,
            replay_stopped: self.replay_stopped.borrow().clone(),
            recovered_objects: self.recovered_objects.get(),
            recovered_bytes: self.recovered_bytes.get(),
            stray_objects_removed: self.stray_removed.get(),
            pg_listings: self.pg_listings.get(),
            log_delta_misses: self.log_delta_misses.get(),
            compared_by_log: self.compared_by_log.get(),
            compared_by_listing: self.compared_by_listing.get(),
            scrubs: self.scrubs.get(),
            deep_scrubs: self.deep_scrubs.get(),
            scrub_objects: self.scrub_objects.get(),
            scrub_inconsistent: self.scrub_inconsistent.get(),
            scrub_repaired: self.scrub_repaired.get(),
            scrub_unrepaired: self.scrub_unrepaired.get(),
            last_scrub_finding: self.last_scrub_finding.borrow().clone(),
            pgs_scrub_unrepaired: (self.scrub_unrepaired_pgs.borrow().iter())
                .take(PG_REPORT_MAX)
                .map(|(&pg, &n)| (pg, n))
                .collect(),
            ..OsdReport::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest answers an OSD can give fit one control frame: a
    /// metrics answer with every op type seen, every bucket and error
    /// status at its largest count (what `Op::Metrics` leaves out: the
    /// PGs named and the peers' pings), and a stat report naming as many
    /// PGs and peers as it may, with long texts.
    #[test]
    fn the_largest_answers_fit_a_control_payload() {
        let text = "x".repeat(1024);
        let pgs: Vec<PgId> = (0..PG_REPORT_MAX as u32)
            .map(|i| PgId::new(65_535, i))
            .collect();
        let report = OsdReport {
            id: u32::MAX,
            last_damage: Some(text.clone()),
            replay_stopped: Some(text.clone()),
            last_scrub_finding: Some(text.clone()),
            scrubbing: Some(text.clone()),
            store_write_us_p99: vec![Some(f64::MAX); LATENCY_WINDOWS_KEPT],
            pg_states: ([
                "active+clean",
                "active+degraded",
                "active+recovering",
                "active+remapped+backfilling",
                "active+remapped",
                "peering",
                "inactive",
            ]
            .iter())
            .map(|s| (s.to_string(), u32::MAX))
            .collect(),
            pgs_scrub_unrepaired: pgs.iter().map(|&pg| (pg, u64::MAX)).collect(),
            ..Default::default()
        };
        let mut full = report.clone();
        full.pgs_not_clean = (pgs.iter())
            .map(|&pg| PgReport {
                pg,
                state: "active+remapped+backfilling".into(),
                detail: Some(text[..200].to_string()),
            })
            .collect();
        full.peer_ping_us_p50 = (0..crate::netbench::PEERS_PINGED_MAX as u32)
            .map(|p| (u32::MAX - p, vec![Some(f64::MAX); LATENCY_WINDOWS_KEPT]))
            .collect();
        let most = |len: usize| HistogramSnapshot {
            counts: vec![u64::MAX; len],
            sum_us: u64::MAX,
        };
        let metrics = OsdMetrics {
            report,
            ops: (0..OP_CODES as u8)
                .filter_map(nacre_wire::Op::from_u8)
                .map(|op| OpMetrics {
                    op: format!("{op:?}"),
                    count: u64::MAX,
                    errors: (1..=u32::from(u8::MAX))
                        .filter_map(nacre_wire::Status::from_u32)
                        .map(|s| (format!("{s:?}"), u64::MAX))
                        .collect(),
                    received_bytes: u64::MAX,
                    sent_bytes: u64::MAX,
                    latency: most(nacre_types::metrics::LATENCY_BUCKETS + 1),
                })
                .collect(),
            ops_in_flight: u64::MAX,
            store_write_latency: most(nacre_types::metrics::LATENCY_BUCKETS + 1),
            store: StoreMetrics::default(),
        };
        let max = nacre_wire::CONTROL_PAYLOAD_MAX_BYTES as usize;
        let m = serde_json::to_vec(&metrics).unwrap().len();
        let s = serde_json::to_vec(&full).unwrap().len();
        assert!(m <= max, "a metrics answer of {m} bytes");
        assert!(s <= max, "a stat report of {s} bytes");
    }

    #[test]
    fn buckets_cover_every_latency_in_order() {
        let mut last = 0;
        for us in 0..100_000u64 {
            let b = latency_bucket(us);
            assert!(b >= last, "{us} µs in bucket {b} after {last}");
            assert!(latency_bucket_top(b) >= us, "{us} above its bucket's top");
            // Within a quarter of a power of two.
            assert!(latency_bucket_top(b) as f64 <= (us as f64 * 1.25).max(us as f64 + 1.0));
            last = b;
        }
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
    }

    /// Percentiles come from the last complete window: none before one
    /// ends, the last one's after, none once a whole window passed idle.
    #[test]
    fn percentiles_of_the_last_complete_window() {
        let w = LatencyWindow::default();
        let at = |s: u64| Duration::from_secs(100 + s);
        // 98 ops of 100 µs and 2 of 10 ms in the first window.
        for _ in 0..98 {
            w.record_at(at(0), 100);
        }
        w.record_at(at(1), 10_000);
        w.record_at(at(2), 10_000);
        assert_eq!(w.quantile_at(at(5), 0.5), None);
        let p50 = w.quantile_at(at(11), 0.5).unwrap();
        let p99 = w.quantile_at(at(11), 0.99).unwrap();
        assert!((100.0..=125.0).contains(&p50), "{p50}");
        assert!((10_000.0..=12_500.0).contains(&p99), "{p99}");
        // The window that started at 11 s saw nothing and ended at 21 s.
        assert_eq!(w.quantile_at(at(21), 0.5), None);
        w.record_at(at(22), 300);
        assert_eq!(w.quantile_at(at(52), 0.5), None, "a whole window idle");
        // The last three kept, newest first: the idle ones empty.
        assert_eq!(w.recent_at(at(52), 0.5), vec![None, None, Some(319.0)]);
        for s in [53, 64, 75] {
            w.record_at(at(s), 1000);
        }
        assert_eq!(
            w.recent_at(at(86), 0.5),
            vec![Some(1023.0), Some(1023.0), Some(1023.0)]
        );
    }
}
