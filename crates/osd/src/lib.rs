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
//! from a cache, filled at open from the PG logs, instead of being applied
//! twice, so a client may retry any write after a lost connection or a
//! restart. Reads are served from the primary's store once no write of the
//! object is in flight; a small read never touches other OSDs.
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
//! Still to come (issue 8): peering and recovery. A write that failed on
//! some copies leaves them different until then; the primary's copy
//! answers reads.

mod stats;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;

use nacre_blockstore::{
    Error as StoreError, FormatOptions, LogEntry, LogOp, OpenReport, Store, StoreOptions,
};
use nacre_io::net::{Addr, Listener};
use nacre_io::sync::Notify;
use nacre_io::{rt, AlignedBuf, BlockDev, FileDev, OpenFlags};
use nacre_meta::map::PgMap;
use nacre_net::{Frame, Handler, NetError, Rpc, Sockets, Transport};
use nacre_types::{pg_of, ObjectId};
use nacre_wire::{Header, Op, Status, SENDER_CLIENT};

pub use stats::OsdStats;

/// Completed writes remembered for retries.
const REQ_CACHE_MAX: usize = 1 << 16;
/// Deletes in flight while purging a volume.
const PURGE_PARALLEL_MAX: usize = 64;
/// Attempts to reach a replica before the write fails.
const REPLICA_ATTEMPT_MAX: u32 = 3;
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
    /// O_DIRECT (off only on file systems that refuse it, e.g. tmpfs).
    pub direct: bool,
}

/// What the OSD knows of the cluster: its pool's PG table and peers.
#[derive(Clone, Debug)]
pub struct OsdMap {
    pub pgmap: PgMap,
    pub addrs: HashMap<u32, Addr>,
}

/// An OSD: its store on a device `D` (a file or block device in a cluster,
/// the fault-injecting device in the simulator) and its peers over a
/// transport `T` (sockets, or the simulator's network).
pub struct Osd<D: BlockDev + 'static = FileDev, T: Transport = Sockets> {
    pub id: u32,
    store: Store<D>,
    transport: T,
    map: RefCell<OsdMap>,
    peers: RefCell<HashMap<u32, Rc<T::Conn>>>,
    /// Objects with a write or delete in flight, and a wake-up for waiters.
    busy: RefCell<HashSet<ObjectId>>,
    unbusy: Notify,
    /// Per PG, the epoch and the last `seq` this primary assigned in it.
    seqs: RefCell<HashMap<u32, (u64, u64)>>,
    /// The newest epoch in the store's PG logs at open: this incarnation
    /// assigns versions only in later epochs, so that it never repeats one
    /// an earlier incarnation gave out (whatever the map says).
    epoch_floor: u64,
    done: RefCell<ReqCache>,
    pub stats: OsdStats,
}

#[derive(Default)]
struct ReqCache {
    map: HashMap<(u64, u64), u64>,
    order: VecDeque<(u64, u64)>,
}

impl ReqCache {
    fn get(&self, k: (u64, u64)) -> Option<u64> {
        self.map.get(&k).copied()
    }
    fn insert(&mut self, k: (u64, u64), v: u64) {
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

/// The key of a PG in the store's PG logs.
pub fn pg_key(pool: u32, pg: u32) -> u64 {
    (u64::from(pool) << 32) | u64::from(pg)
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
    /// Opens (formatting a new file) the OSD's store. Runs inside `block_on`.
    pub async fn open(cfg: &OsdConfig, map: OsdMap) -> Result<Rc<Osd>, StoreError> {
        let new = !cfg.path.exists();
        let flags = OpenFlags {
            create_bytes: Some(cfg.size_bytes),
            direct: cfg.direct,
            force_pread: false,
        };
        let dev = FileDev::open(&cfg.path, &flags)?;
        if new {
            let fo = FormatOptions {
                block_bytes: cfg.object_bytes,
                journal_bytes: cfg.journal_bytes,
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
        Ok(Osd::with_store(cfg.id, store, &report, map, Sockets))
    }

    /// Serves the wire protocol on `l` until the returned handle is
    /// dropped (then no new connection is taken; connections already open
    /// end when their peers close them).
    pub fn serve(self: &Rc<Self>, l: Listener) -> Serving {
        let stop = Notify::new();
        let stopped = Rc::new(std::cell::Cell::new(false));
        let (s2, f2) = (stop.clone(), stopped.clone());
        let me = self.clone();
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
        Serving { stop, stopped }
    }
}

/// An OSD's listener; dropping it stops taking connections.
pub struct Serving {
    stop: Notify,
    stopped: Rc<std::cell::Cell<bool>>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stopped.set(true);
        self.stop.notify();
    }
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// An OSD on an open store (`report` is what its open found), reaching
    /// its peers through `transport`.
    pub fn with_store(
        id: u32,
        store: Store<D>,
        report: &OpenReport,
        map: OsdMap,
        transport: T,
    ) -> Rc<Self> {
        if let Some(why) = &report.replay_stopped {
            tracing::error!("osd.{id}: journal replay stopped before its end: {why}");
        }
        let stats = OsdStats::default();
        stats.set_replay_stopped(report.replay_stopped.clone());
        // Requests already applied, from the PG logs: a retry after this
        // OSD restarted is answered, not applied again.
        let mut done = ReqCache::default();
        let mut epoch_floor = 0;
        for pg in store.pg_logs() {
            let log = store.pg_log(pg).unwrap_or_default();
            epoch_floor = epoch_floor.max(log.head() >> 32);
            for e in log.entries.values() {
                done.insert((e.client, e.request), e.version);
            }
        }
        Rc::new(Osd {
            id,
            store,
            transport,
            map: RefCell::new(map),
            peers: RefCell::new(HashMap::new()),
            busy: RefCell::new(HashSet::new()),
            unbusy: Notify::new(),
            seqs: RefCell::new(HashMap::new()),
            epoch_floor,
            done: RefCell::new(done),
            stats,
        })
    }

    /// Checkpoints and closes the store (the last step of a clean stop).
    pub async fn close(&self) -> Result<(), StoreError> {
        self.peers.borrow_mut().clear();
        self.store.clone().close().await
    }

    pub fn store(&self) -> &Store<D> {
        &self.store
    }

    pub fn epoch(&self) -> u64 {
        self.map.borrow().pgmap.epoch
    }

    /// Takes a newer map (from the cluster map's leader).
    pub fn set_map(&self, map: OsdMap) {
        debug_assert!(map.pgmap.epoch >= self.epoch());
        *self.map.borrow_mut() = map;
    }

    /// The PG's next version in the current epoch, if any is left.
    fn next_version(&self, pg: u32) -> Option<u64> {
        let epoch = self.epoch();
        let mut seqs = self.seqs.borrow_mut();
        let s = seqs.entry(pg).or_insert((epoch, 0));
        if s.0 != epoch {
            *s = (epoch, 0);
        }
        if s.1 + 1 >= PG_SEQ_MAX || epoch > nacre_meta::map::EPOCH_MAX || epoch <= self.epoch_floor
        {
            return None;
        }
        s.1 += 1;
        Some((epoch << 32) | s.1)
    }

    /// The log entry of op `h` at `version`.
    fn entry(&self, h: &Header, version: u64) -> LogEntry {
        let (op, offset, len) = match h.op {
            Op::Write | Op::RepWrite => (LogOp::Write, h.offset, h.payload_len),
            _ => (LogOp::Delete, 0, 0),
        };
        LogEntry {
            pg: pg_key(self.map.borrow().pgmap.pool, h.pg),
            version,
            oid: h.oid,
            op,
            offset,
            len,
            client: h.client,
            request: h.request_id,
        }
    }

    /// Checks epoch, PG and (for client ops) primacy.
    fn check_route(&self, h: &Header, need_primary: bool) -> Option<Status> {
        let map = self.map.borrow();
        if h.epoch != map.pgmap.epoch {
            return Some(Status::StaleEpoch);
        }
        let pgs = map.pgmap.pg_count();
        if h.pg >= pgs || pg_of(h.oid, pgs) != h.pg {
            return Some(Status::Invalid);
        }
        let acting = map.pgmap.acting(h.pg);
        if need_primary && acting.first() != Some(&self.id) {
            return Some(Status::NotPrimary);
        }
        if need_primary && h.sender != SENDER_CLIENT {
            return Some(Status::Invalid);
        }
        if !need_primary {
            // A sub-op is taken only from the PG's primary in this epoch,
            // and only by a member.
            let from_primary = acting.first() == Some(&h.sender);
            if !from_primary || !acting.contains(&self.id) || acting.first() == Some(&self.id) {
                return Some(Status::NotPrimary);
            }
            if h.obj_version == 0 || h.obj_version >> 32 != h.epoch {
                return Some(Status::Invalid);
            }
        }
        None
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

    fn peer(&self, id: u32) -> Result<Rc<T::Conn>, NetError> {
        if let Some(c) = self.peers.borrow().get(&id) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr = (self.map.borrow().addrs.get(&id).cloned())
            .ok_or_else(|| NetError::Protocol(format!("no address for osd.{id}")))?;
        let c = self.transport.connect(&addr)?;
        self.peers.borrow_mut().insert(id, c.clone());
        Ok(c)
    }

    /// Sends a sub-op to replica `id`, reconnecting after a lost connection.
    async fn to_replica(
        self: Rc<Self>,
        id: u32,
        h: Header,
        data: Option<Rc<AlignedBuf>>,
    ) -> Status {
        let mut last = String::new();
        for _ in 0..REPLICA_ATTEMPT_MAX {
            let payload = data.as_ref().map(|d| AlignedBuf::from_slice(d));
            let conn = match self.peer(id) {
                Ok(c) => c,
                Err(e) => {
                    last = e.to_string();
                    rt::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            };
            match conn.call(h, payload).await {
                Ok(f) => return f.h.status,
                Err(e) => last = e.to_string(),
            }
        }
        tracing::warn!("osd.{}: replica osd.{id} unreachable: {last}", self.id);
        Status::Unavailable
    }

    /// Applies a write or delete as primary; returns the status and version.
    async fn primary_update(
        self: &Rc<Self>,
        h: &Header,
        data: Option<AlignedBuf>,
    ) -> (Status, u64) {
        let oid = h.oid;
        self.lock(oid).await;
        let key = (h.client, h.request_id);
        if let Some(v) = self.done.borrow().get(key) {
            self.unlock(oid);
            return (Status::Ok, v);
        }
        let Some(version) = self.next_version(h.pg) else {
            tracing::warn!(
                "osd.{}: PG {} has no version left in epoch {} (this OSD's logs reach epoch {})",
                self.id,
                h.pg,
                self.epoch(),
                self.epoch_floor
            );
            self.unlock(oid);
            return (Status::Unavailable, 0);
        };
        // Versions of an epoch come only from this primary, and epochs
        // rise: a version at or below the stored one is a bug.
        let cur = self.store.version(oid).unwrap_or(0);
        if version <= cur {
            let why = format!("{oid}: new version {version:#x} is not above the stored {cur:#x}");
            assert!(!nacre_blockstore::strict(), "{why}");
            tracing::error!("osd.{}: {why}", self.id);
            self.unlock(oid);
            return (Status::Unavailable, 0);
        }
        let acting: Vec<u32> = self.map.borrow().pgmap.acting(h.pg).to_vec();
        let entry = self.entry(h, version);
        let mut sub = *h;
        sub.op = if h.op == Op::Delete {
            Op::RepDelete
        } else {
            Op::RepWrite
        };
        sub.obj_version = version;
        sub.sender = self.id;
        // One buffer shared by the replica tasks (each sends its own copy,
        // kept for a resend); the local write takes the original when no
        // replica holds it any more, a copy otherwise.
        let data = data.map(Rc::new);
        let replicas: Vec<_> = (acting.iter().skip(1))
            .map(|&r| rt::spawn(self.clone().to_replica(r, sub, data.clone())))
            .collect();
        let local = match data {
            Some(d) => {
                let d = Rc::try_unwrap(d).unwrap_or_else(|d| AlignedBuf::from_slice(&d));
                self.store.write_logged(entry, h.offset, d).await
            }
            None => self.store.delete_logged(entry).await,
        };
        let mut status = match &local {
            Ok(()) => Status::Ok,
            Err(e) => {
                tracing::debug!("osd.{}: {oid} v{version}: {e}", self.id);
                status_of(e)
            }
        };
        for r in replicas {
            let s = r.await;
            if status == Status::Ok && s != Status::Ok {
                status = s;
            }
        }
        if status == Status::Ok {
            self.done.borrow_mut().insert(key, version);
        }
        self.unlock(oid);
        (status, version)
    }

    async fn replica_update(&self, h: &Header, data: Option<AlignedBuf>) -> Status {
        let entry = self.entry(h, h.obj_version);
        let r = match data {
            Some(d) => self.store.write_logged(entry, h.offset, d).await,
            None => self.store.delete_logged(entry).await,
        };
        match r {
            Ok(()) => Status::Ok,
            Err(e) => {
                tracing::debug!("osd.{}: replica {} v{}: {e}", self.id, h.oid, h.obj_version);
                status_of(&e)
            }
        }
    }

    /// Deletes every local object of a volume.
    async fn purge_volume(self: &Rc<Self>, volume: u64) -> Status {
        let victims: Vec<(ObjectId, u64)> = (self.store.list().into_iter())
            .filter(|(o, _)| o.volume.0 == volume)
            .collect();
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
        status
    }
}

impl<D: BlockDev + 'static, T: Transport> Handler for Osd<D, T> {
    async fn handle(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        let h = f.h;
        let route = match h.op {
            Op::Read | Op::Write | Op::Delete => self.check_route(&h, true),
            Op::RepWrite | Op::RepDelete => self.check_route(&h, false),
            Op::PurgeVolume | Op::Stat => None,
        };
        if let Some(s) = route {
            let mut r = h.reply(s);
            r.epoch = self.epoch();
            return (r, None);
        }
        match h.op {
            Op::Read => {
                let t = self.stats.start();
                // Only committed data: a write of this object in flight may
                // be on this copy and not yet on the others; wait for it to
                // be acknowledged or to fail.
                self.wait_unbusy(h.oid).await;
                match self.store.read(h.oid, h.offset, h.length).await {
                    Ok(buf) => {
                        self.stats.read_done(t, buf.len());
                        (h.reply(Status::Ok).with_payload(&buf), Some(buf))
                    }
                    Err(e) => {
                        if let StoreError::Corrupt(why) = &e {
                            tracing::error!(
                                "osd.{}: object {} holds damaged data: {why}",
                                self.id,
                                h.oid
                            );
                            self.stats.damaged(format!("object {}: {why}", h.oid));
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
                (r, None)
            }
            Op::RepWrite | Op::RepDelete => {
                let s = self.replica_update(&h, f.payload).await;
                if s == Status::Ok {
                    self.stats.replica_done();
                }
                (h.reply(s), None)
            }
            Op::PurgeVolume => (h.reply(self.purge_volume(h.oid.volume.0).await), None),
            Op::Stat => {
                let body = serde_json::to_vec(&self.stats.report(self.id, &self.store))
                    .expect("stats serialise");
                (
                    h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                )
            }
        }
    }
}
