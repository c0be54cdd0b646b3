//! The OSD: one blockstore, served over the wire protocol.
//!
//! As **primary** of a PG it orders writes per object (one write per object
//! in flight; writes to different objects run in parallel), assigns each a
//! version one above the object's newest, writes it to its own store and
//! to every replica of the acting set in parallel, and acknowledges once
//! all of them report it durable. A `(client, request id)` seen before is
//! answered from a bounded cache instead of being applied twice, so a
//! client may retry any write after a lost connection. Reads are served
//! from the primary's store; a small read never touches other OSDs.
//!
//! As **replica** it applies `RepWrite`/`RepDelete` at the version the
//! primary chose; the store treats a repeat of a version as done, so a
//! primary's retry is harmless.
//!
//! Every object op carries the epoch of the PG table the sender used; an
//! OSD refuses any other epoch (`StaleEpoch`, with its own epoch in the
//! reply) and any op for a PG it is not primary of (`NotPrimary`).
//!
//! What this issue leaves to the next (multi-host, failures): peering and
//! recovery. A write that failed on some replicas leaves the object
//! degraded on them; the primary, which answers reads, has the newest data.

mod stats;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;

use nacre_blockstore::{Error as StoreError, FormatOptions, OpenReport, Store, StoreOptions};
use nacre_io::net::{Addr, Listener};
use nacre_io::sync::Notify;
use nacre_io::{rt, AlignedBuf, BlockDev, FileDev, OpenFlags};
use nacre_meta::map::PgMap;
use nacre_net::{Frame, Handler, NetError, Rpc, Sockets, Transport};
use nacre_types::{pg_of, ObjectId};
use nacre_wire::{Header, Op, Status};

pub use stats::OsdStats;

/// Completed writes remembered for retries.
const REQ_CACHE_MAX: usize = 1 << 16;
/// Deletes in flight while purging a volume.
const PURGE_PARALLEL_MAX: usize = 64;
/// Attempts to reach a replica before the write fails.
const REPLICA_ATTEMPT_MAX: u32 = 3;

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
    /// Versions handed out by writes that failed somewhere: never reused.
    burnt: RefCell<HashMap<ObjectId, u64>>,
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

/// The client id an OSD sends its sub-ops with: bit 63 set (no client
/// library id has it), the OSD id below.
pub fn osd_client_id(osd: u32) -> u64 {
    (1 << 63) | u64::from(osd)
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

    /// Serves the wire protocol on `l` until the returned task is dropped.
    pub fn serve(self: &Rc<Self>, l: Listener) -> rt::JoinHandle<()> {
        rt::spawn(nacre_net::serve(l, self.clone()))
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
        Rc::new(Osd {
            id,
            store,
            transport,
            map: RefCell::new(map),
            peers: RefCell::new(HashMap::new()),
            busy: RefCell::new(HashSet::new()),
            unbusy: Notify::new(),
            burnt: RefCell::new(HashMap::new()),
            done: RefCell::new(ReqCache::default()),
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
        if !need_primary {
            // A sub-op is taken only from the PG's primary in this epoch
            // (it sends as `osd_client_id(primary)`), and only by a member.
            let from_primary = acting.first().map(|&p| osd_client_id(p)) == Some(h.client);
            if !from_primary || !acting.contains(&self.id) || acting.first() == Some(&self.id) {
                return Some(Status::NotPrimary);
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
        let cur = self.store.version(oid);
        if h.op == Op::Delete && cur.is_none() {
            self.unlock(oid);
            return (Status::Ok, 0);
        }
        let burnt = self.burnt.borrow().get(&oid).copied().unwrap_or(0);
        let version = cur.unwrap_or(0).max(burnt) + 1;
        let acting: Vec<u32> = self.map.borrow().pgmap.acting(h.pg).to_vec();
        let mut sub = *h;
        sub.op = if h.op == Op::Delete {
            Op::RepDelete
        } else {
            Op::RepWrite
        };
        sub.obj_version = version;
        sub.client = osd_client_id(self.id);
        sub.request_id = 0;
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
                self.store.write(oid, version, h.offset, d).await
            }
            None => self.store.delete(oid, version).await,
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
            self.burnt.borrow_mut().remove(&oid);
        } else {
            self.burnt.borrow_mut().insert(oid, version);
        }
        self.unlock(oid);
        (status, version)
    }

    async fn replica_update(&self, h: &Header, data: Option<AlignedBuf>) -> Status {
        let r = match data {
            Some(d) => self.store.write(h.oid, h.obj_version, h.offset, d).await,
            None => match self.store.delete(h.oid, h.obj_version).await {
                Err(StoreError::NotFound(_)) => Ok(()),
                r => r,
            },
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
