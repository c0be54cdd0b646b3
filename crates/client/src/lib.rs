//! The client library: what a gateway (or `nacre bench`) links to reach
//! the cluster.
//!
//! [`Cluster`] holds the map (from the meta store) and one connection per
//! OSD; an object op goes to its PG's primary with the PG table's epoch.
//! A lost connection, a `StaleEpoch` or `NotPrimary` answer (the map is
//! reloaded) and an `Unavailable` one (a PG peering, or below `min_size`)
//! are retried with the same request id, which the primary uses to apply
//! a write at most once, for up to `CLIENT_OP_TIMEOUT_MS`, or until the
//! volume is abandoned ([`Volume::abandon`]: the gateway's client is gone).
//!
//! [`Volume`] stripes a thin block device over objects: byte `x` lives in
//! object `x / object_bytes` at offset `x % object_bytes`. An object that
//! was never written does not exist and reads as zeros; trimming a whole
//! object deletes it, so space comes back.
// PERF-CRITICAL

mod feed;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use nacre_io::net::Addr;
use nacre_io::sync::Notify;
use nacre_io::{rt, AlignedBuf, SharedBuf};
use nacre_meta::map::{self, ClusterMap, PoolRecord, SessionRecord, VolumeRecord};
use nacre_meta::{MetaError, MetaStore};
use nacre_net::{Conn, Frame};
use nacre_types::{ObjectId, PgId, CLIENT_OP_TIMEOUT_MS, SECTOR_BYTES};
use nacre_wire::{Header, Op, Status};

/// How long `Cluster::osd_stats` waits for one OSD's answer.
pub const STAT_TIMEOUT_MS: u64 = 2_000;

/// How long a read sent straight to the OSD of an EC data shard waits
/// before the primary is asked instead (an OSD the map does not yet show
/// down may not answer at all).
const DIRECT_READ_TIMEOUT_MS: u64 = 1_000;
/// After a direct read to an OSD failed (no connection, no answer), how
/// long its shards are read through the primaries instead; after an OSD
/// said it serves no direct reads of a PG now (`NotPrimary`: not yet
/// named complete, being rebuilt), how long that PG's are.
const DIRECT_OFF_OSD_MS: u64 = 5_000;
const DIRECT_OFF_PG_MS: u64 = 2_000;

/// Pause before the second attempt of an op; it doubles up to the next,
/// or for an op carrying at most `RETRY_SMALL_BYTES` (a read, a small
/// write: cheap to send again) up to `RETRY_DELAY_MAX_SMALL`, so that
/// it waits at most that long past the end of an outage (at 1 s, a
/// 4 KiB read during a 3 s outage took 3.55 or 4.55 s).
const RETRY_DELAY: Duration = Duration::from_millis(50);
const RETRY_DELAY_MAX: Duration = Duration::from_millis(1000);
const RETRY_DELAY_MAX_SMALL: Duration = Duration::from_millis(200);
const RETRY_SMALL_BYTES: usize = 16 << 10;
/// How often `Cluster::scrub_pg` asks for the report of a scrub.
const SCRUB_POLL: Duration = Duration::from_millis(200);
/// Largest single volume I/O (the NBD gateway's limit is lower).
pub const IO_MAX_BYTES: u64 = 64 << 20;
/// Objects deleted at once by a trim.
const TRIM_PARALLEL_MAX: usize = 64;
/// Rounds a cut makes while objects past the end change under it
/// ([`Volume::cut_after`]).
const CUT_ROUNDS_MAX: usize = 8;

/// What a cut's op did to one object.
enum Cut {
    Deleted,
    /// Nothing left to do (absent, or its tail zeroed).
    Done,
    /// Newer than listed: left, and listed again.
    Changed,
}
/// How long `volume rm --force` and a shrink wait for the gateways to cut
/// or shrink the open connections.
pub const SESSION_WAIT_MS: u64 = 30_000;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no space left in the cluster")]
    NoSpace,
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("no volume named {0:?} (`nacre volume ls` lists them)")]
    NoVolume(String),
    #[error("data failed its checksum: {0}")]
    Corrupt(String),
    /// The volume has open connections and the change would pull the
    /// ground from under them.
    #[error("{0}")]
    InUse(String),
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// The volume was abandoned ([`Volume::abandon`]) before the op was
    /// done: it may or may not have been applied.
    #[error("abandoned: the volume's client is gone")]
    Abandoned,
    #[error(transparent)]
    Meta(#[from] MetaError),
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// A connection to the cluster, on one runtime thread.
pub struct Cluster {
    meta: Arc<dyn MetaStore>,
    map: RefCell<ClusterMap>,
    /// Reloads the map on a thread of its own when an op asks.
    feed: feed::MapFeed,
    /// Why the feed's last load failed, until an op reports it.
    map_error: RefCell<Option<String>>,
    conns: RefCell<HashMap<u32, Rc<Conn>>>,
    /// Those of reads sent straight to EC data shards
    /// ([`Cluster::direct_read`]), with a short deadline.
    direct_conns: RefCell<HashMap<u32, Rc<Conn>>>,
    /// Until when direct reads skip an OSD, or an OSD's shard of a PG
    /// (`None`): the OSD failed, or refused the PG.
    direct_off: RefCell<HashMap<(u32, Option<PgId>), Duration>>,
    client_id: u64,
    next_request: Cell<u64>,
}

pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into the buffer we pass.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n == 8 {
        return u64::from_le_bytes(b);
    }
    // Uniqueness, not secrecy, is needed: time and pid do.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

impl Cluster {
    /// Loads the map from `meta`. Connections open on first use.
    pub fn connect(meta: Arc<dyn MetaStore>) -> Result<Rc<Cluster>> {
        let m = map::load(&*meta)?;
        if m.pools.is_empty() {
            return Err(ClientError::Unavailable(
                "the cluster map has no pool".into(),
            ));
        }
        let feed = feed::MapFeed::start(meta.clone())
            .map_err(|e| ClientError::Unavailable(format!("map loader thread: {e}")))?;
        Ok(Rc::new(Cluster {
            meta,
            map: RefCell::new(m),
            feed,
            map_error: RefCell::new(None),
            conns: RefCell::new(HashMap::new()),
            direct_conns: RefCell::new(HashMap::new()),
            direct_off: RefCell::new(HashMap::new()),
            // Not 0: the OSDs' own rewrites log as client 0.
            client_id: (random_u64() & !(1 << 63)).max(1),
            next_request: Cell::new(1),
        }))
    }

    pub fn meta(&self) -> &Arc<dyn MetaStore> {
        &self.meta
    }

    pub fn map(&self) -> ClusterMap {
        self.map.borrow().clone()
    }

    /// The pool named `name`, or with none the pool volumes go to by
    /// default: the only one, else the one named `rbd` (as in Ceph).
    pub fn pool(&self, name: Option<&str>) -> Result<PoolRecord> {
        let m = self.map.borrow();
        let names = || {
            let n: Vec<&str> = m.pools.iter().map(|p| p.name.as_str()).collect();
            n.join(", ")
        };
        let found = match name {
            Some(n) => m.pool_named(n),
            None if m.pools.len() == 1 => m.pools.first(),
            None => m.pool_named("rbd"),
        };
        found.cloned().ok_or_else(|| {
            ClientError::Invalid(match name {
                _ if m.pools.is_empty() => {
                    "the cluster has no pool yet (nacre pool create makes one)".into()
                }
                Some(n) => format!("no pool named {n:?}; the pools are {}", names()),
                None => format!("name the pool (--pool): the pools are {}", names()),
            })
        })
    }

    /// Asks the map feed for a newer map, from an op's retry loop, and
    /// notes in `last` why the previous load failed, if it did: a meta
    /// store that cannot answer now (an etcd election, a restarting
    /// member) is a reason to try again later, not to fail the op, nor to
    /// hold up the ops whose map is right.
    fn refresh_map(&self, last: &mut String) {
        self.adopt_map();
        if let Some(e) = self.map_error.borrow_mut().take() {
            *last = format!("{last}; the map could not be reloaded: {e}");
        }
        self.feed.ask();
    }

    /// Takes what the feed loaded, if anything: a newer map replaces ours.
    fn adopt_map(&self) {
        match self.feed.take() {
            Some(Ok(m)) if m.revision > self.map.borrow().revision => {
                *self.map.borrow_mut() = m;
            }
            Some(Err(e)) => *self.map_error.borrow_mut() = Some(e),
            _ => {}
        }
    }

    /// Loads the map now, waiting for the meta store: for admin paths
    /// (volume removal, orphan sweeps), never for I/O.
    fn reload_map(&self) -> Result<()> {
        let m = map::load(&*self.meta)?;
        *self.map.borrow_mut() = m;
        Ok(())
    }

    fn conn(&self, osd: u32) -> Result<Rc<Conn>> {
        self.conn_in(&self.conns, osd, None)
    }

    /// The connection to OSD `osd` in `conns`, made if there is none (or
    /// it closed), its requests' deadline `timeout` (`None`: the default).
    fn conn_in(
        &self,
        conns: &RefCell<HashMap<u32, Rc<Conn>>>,
        osd: u32,
        timeout: Option<Duration>,
    ) -> Result<Rc<Conn>> {
        if let Some(c) = conns.borrow().get(&osd) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr: Addr = {
            let m = self.map.borrow();
            let rec = m
                .osd(osd)
                .ok_or_else(|| ClientError::Unavailable(format!("osd.{osd} is not in the map")))?;
            rec.addr
                .parse()
                .map_err(|e| ClientError::Unavailable(format!("osd.{osd} address: {e}")))?
        };
        let c = match timeout {
            Some(t) => Conn::connect_with_timeout(&addr, t),
            None => Conn::connect(&addr),
        };
        let c = c.map_err(|e| ClientError::Unavailable(format!("osd.{osd}: {e}")))?;
        conns.borrow_mut().insert(osd, c.clone());
        Ok(c)
    }

    /// A read of `len` bytes at `offset` of `oid` sent straight to the OSD
    /// holding the one data shard of an erasure-coded pool's object the
    /// range lies in (`Op::DirectRead`), saving the primary's hop: the
    /// bytes (`None`: the range was never written), or, where that does
    /// not apply (a replicated pool, a range over several shards, the
    /// shard's OSD down or the primary itself, no timers to bound the
    /// wait) or the OSD refused or did not answer in time, nothing, and the
    /// caller asks the primary. One attempt, no retry; an OSD that failed
    /// one, or refused its PG, is skipped for a while.
    async fn direct_read(
        &self,
        oid: ObjectId,
        offset: u32,
        len: u32,
    ) -> Option<Option<AlignedBuf>> {
        if !rt::has_timers() {
            return None;
        }
        self.adopt_map();
        let (osd, h) = {
            let m = self.map.borrow();
            let pool = m.pool(oid.pool())?;
            let ec = pool.ec?;
            let layout =
                nacre_ec::Layout::new(ec.k.into(), ec.m.into(), pool.shard_bytes()).ok()?;
            let ranges = layout.data_ranges(offset, len).ok()?;
            let [r] = ranges[..] else {
                return None;
            };
            let t = m.table(oid.pool())?;
            let pg = PgId::of(oid, t.pg_count());
            let osd = *t.placement(pg.pg).get(r.shard)?;
            let down = &m.state.down;
            // (A demoted OSD is slow: its shard is read through another.)
            if down.contains(&osd)
                || m.state.demoted.contains(&osd)
                || t.primary(pg.pg, &m.state) == Some(osd)
            {
                return None;
            }
            let now = rt::monotonic();
            let mut off = self.direct_off.borrow_mut();
            for key in [(osd, None), (osd, Some(pg))] {
                match off.get(&key) {
                    Some(&until) if until > now => return None,
                    Some(_) => {
                        off.remove(&key);
                    }
                    None => {}
                }
            }
            let mut h = Header::request(Op::DirectRead, 0, oid).with_pg(pg);
            (h.offset, h.length, h.epoch, h.client) = (offset, len, m.epoch(), self.client_id);
            (osd, h)
        };
        // Connections of their own, with a short deadline (a timer per
        // read would cost more than the hop saved).
        let d = Duration::from_millis(DIRECT_READ_TIMEOUT_MS);
        let skip = |key, ms| {
            let until = rt::monotonic() + Duration::from_millis(ms);
            self.direct_off.borrow_mut().insert(key, until);
        };
        let Ok(conn) = self.conn_in(&self.direct_conns, osd, Some(d)) else {
            skip((osd, None), DIRECT_OFF_OSD_MS);
            return None;
        };
        match conn.call(h, None).await {
            Ok(f) if f.h.status == Status::Ok => match f.payload {
                Some(b) if b.len() == len as usize => Some(Some(b)),
                _ => None,
            },
            Ok(f) if f.h.status == Status::NotFound => Some(None),
            Ok(f) if f.h.status == Status::NotPrimary => {
                skip((osd, Some(h.pg_id())), DIRECT_OFF_PG_MS);
                None
            }
            Ok(_) => None,
            Err(_) => {
                self.direct_conns.borrow_mut().remove(&osd);
                skip((osd, None), DIRECT_OFF_OSD_MS);
                None
            }
        }
    }

    /// Sends `h` (for an object of `pool`) to the primary, with retries;
    /// none once `gone` is set (an attempt in flight runs to its end).
    async fn object_op(
        &self,
        h: Header,
        payload: Option<&SharedBuf>,
        gone: &Cell<bool>,
    ) -> Result<Frame> {
        Ok(self.primary_op(None, h, payload, gone).await?.1)
    }

    /// Sends `h` to the primary of PG `pg` (`None`: the PG of `h`'s
    /// object, in the pool its volume id names), with retries: a lost connection, `StaleEpoch` or
    /// `NotPrimary` (the map is reloaded) and `Unavailable` (a PG peering
    /// or below `min_size`) are tried again, with the same request id, for
    /// up to `CLIENT_OP_TIMEOUT_MS`, none once `gone` is set. Returns the
    /// primary that answered and its answer.
    async fn primary_op(
        &self,
        pg: Option<PgId>,
        mut h: Header,
        payload: Option<&SharedBuf>,
        gone: &Cell<bool>,
    ) -> Result<(u32, Frame)> {
        h.client = self.client_id;
        // One id for all attempts: the primary applies a write once.
        h.request_id = self.next_request.get();
        self.next_request.set(h.request_id + 1);
        let mut last = String::new();
        let until = rt::monotonic() + Duration::from_millis(CLIENT_OP_TIMEOUT_MS);
        let mut delay = Duration::ZERO;
        let delay_max = if payload.map_or(0, |p| p.len()) <= RETRY_SMALL_BYTES {
            RETRY_DELAY_MAX_SMALL
        } else {
            RETRY_DELAY_MAX
        };
        while rt::monotonic() < until {
            if !delay.is_zero() {
                rt::sleep(delay).await;
            }
            if gone.get() {
                return Err(ClientError::Abandoned);
            }
            delay = (delay * 2).clamp(RETRY_DELAY, delay_max);
            self.adopt_map();
            let (primary, epoch, pg) = {
                let m = self.map.borrow();
                let pool = pg.map_or(h.oid.pool(), |p| p.pool);
                // A pool made since this map was loaded (its volume's
                // record named it): a newer map has it.
                let Some(t) = m.table(pool) else {
                    drop(m);
                    last = format!(
                        "pool {pool} is not in the map of epoch {}",
                        self.map.borrow().epoch()
                    );
                    self.refresh_map(&mut last);
                    continue;
                };
                let count = t.pg_count();
                let pg = pg.unwrap_or_else(|| PgId::of(h.oid, count));
                if pg.pg >= count {
                    return Err(ClientError::Invalid(format!(
                        "PG {pg}: the pool has {count} PGs"
                    )));
                }
                (t.primary(pg.pg, &m.state), m.epoch(), pg)
            };
            let Some(primary) = primary else {
                last = format!("PG {pg}: no OSD of it is up");
                self.refresh_map(&mut last);
                continue;
            };
            h.epoch = epoch;
            h = h.with_pg(pg);
            let conn = match self.conn(primary) {
                Ok(c) => c,
                Err(e) => {
                    last = e.to_string();
                    self.refresh_map(&mut last);
                    continue;
                }
            };
            // Every attempt sends from the caller's buffer, uncopied.
            match conn.call_shared(h, payload.cloned()).await {
                Ok(f) if f.h.status == Status::StaleEpoch || f.h.status == Status::NotPrimary => {
                    last = format!("osd.{primary}: {:?}", f.h.status);
                    self.refresh_map(&mut last);
                }
                Ok(f) if f.h.status == Status::Unavailable => {
                    last = format!("osd.{primary}: unavailable");
                }
                Ok(f) => return Ok((primary, f)),
                Err(e) => {
                    last = format!("osd.{primary}: {e}");
                    self.conns.borrow_mut().remove(&primary);
                    self.refresh_map(&mut last);
                }
            }
        }
        Err(ClientError::Unavailable(last))
    }
}

fn status_err(s: Status, what: &str) -> ClientError {
    match s {
        Status::NoSpace => ClientError::NoSpace,
        Status::Corrupt => ClientError::Corrupt(what.to_string()),
        Status::Invalid => ClientError::Invalid(what.to_string()),
        s => ClientError::Unavailable(format!("{what}: {s:?}")),
    }
}

/// One piece of a volume I/O: a range inside one object.
#[derive(Clone, Copy, Debug)]
struct Piece {
    block: u64,
    offset: u32,
    len: u32,
    /// Position in the caller's buffer.
    at: usize,
}

fn pieces(offset: u64, len: u64, object_bytes: u32) -> impl Iterator<Item = Piece> {
    let ob = u64::from(object_bytes);
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let block = pos / ob;
        let off = pos % ob;
        let n = (ob - off).min(end - pos);
        let p = Piece {
            block,
            offset: off as u32,
            len: n as u32,
            at: (pos - offset) as usize,
        };
        pos += n;
        Some(p)
    })
}

/// A block volume striped over objects.
pub struct Volume {
    cluster: Rc<Cluster>,
    rec: VolumeRecord,
    /// The size enforced now: the record's at open, or a later one
    /// ([`Volume::set_size`]).
    size: Cell<u64>,
    /// Size changes so far; an admitted I/O counts under the generation it
    /// was admitted in until it ends.
    generation: Cell<u64>,
    running: RefCell<BTreeMap<u64, usize>>,
    settled: Notify,
    /// Set by [`Volume::abandon`].
    gone: Cell<bool>,
}

/// An I/O a gateway admitted: it keeps its volume's size generation busy
/// until dropped, so a shrink knows when no I/O checked against the old
/// size still runs.
pub struct Admitted {
    vol: Rc<Volume>,
    generation: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut r = self.vol.running.borrow_mut();
        let n = r.get_mut(&self.generation).expect("admitted I/O counted");
        *n -= 1;
        if *n == 0 {
            r.remove(&self.generation);
            drop(r);
            self.vol.settled.notify();
        }
    }
}

impl Volume {
    /// Opens volume `name` (its record is read once, now); a volume being
    /// deleted is refused.
    pub fn open(cluster: &Rc<Cluster>, name: &str) -> Result<Volume> {
        let rec = map::get_volume(&**cluster.meta(), name)?
            .ok_or_else(|| ClientError::NoVolume(name.to_string()))?;
        if rec.deleting {
            return Err(ClientError::InUse(format!(
                "volume {name:?} is being deleted"
            )));
        }
        Ok(Self::with_record(cluster, rec))
    }

    fn with_record(cluster: &Rc<Cluster>, rec: VolumeRecord) -> Volume {
        Volume {
            cluster: cluster.clone(),
            size: Cell::new(rec.size_bytes),
            rec,
            generation: Cell::new(0),
            running: RefCell::new(BTreeMap::new()),
            settled: Notify::new(),
            gone: Cell::new(false),
        }
    }

    pub fn record(&self) -> &VolumeRecord {
        &self.rec
    }

    pub fn size_bytes(&self) -> u64 {
        self.size.get()
    }

    /// Counts an I/O as running under the current size until the guard
    /// drops (a gateway takes one before it checks a request's range).
    pub fn admit(self: &Rc<Self>) -> Admitted {
        let generation = self.generation.get();
        *self.running.borrow_mut().entry(generation).or_default() += 1;
        Admitted {
            vol: self.clone(),
            generation,
        }
    }

    /// The client this volume serves is gone (its connection closed
    /// without a goodbye): the ops of every I/O still running start no
    /// new attempt and fail `Abandoned` (an attempt in flight runs to its
    /// end or its deadline), instead of retrying for
    /// `CLIENT_OP_TIMEOUT_MS` for no one. Each I/O still ends only when
    /// all its parts have, so its [`Admitted`] guard outlives them.
    pub fn abandon(&self) {
        self.gone.set(true);
    }

    /// Enforces `bytes` as the size from now on; returns the new size
    /// generation for [`Volume::settled`].
    pub fn set_size(&self, bytes: u64) -> u64 {
        self.size.set(bytes);
        let g = self.generation.get() + 1;
        self.generation.set(g);
        g
    }

    /// The size generation: how many times the size was set since open.
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// Returns once no I/O admitted before generation `g` still runs: after
    /// a shrink, nothing more lands past the new end.
    pub async fn settled(&self, g: u64) {
        while self.running.borrow().range(..g).next().is_some() {
            self.settled.wait().await;
        }
    }

    fn oid(&self, block: u64) -> ObjectId {
        ObjectId::new(self.rec.id, block)
    }

    /// Checks that `offset..offset+len` is sector-aligned, non-empty, at
    /// most `max_bytes` long and inside the volume.
    fn check(&self, what: &str, offset: u64, len: u64, max_bytes: u64) -> Result<()> {
        let s = u64::from(SECTOR_BYTES);
        if len == 0 || len > max_bytes || !offset.is_multiple_of(s) || !len.is_multiple_of(s) {
            return Err(ClientError::Invalid(format!(
                "{what} {offset}+{len}: must be {s}-byte aligned and at most {max_bytes} bytes"
            )));
        }
        if offset.checked_add(len).is_none_or(|e| e > self.size.get()) {
            return Err(ClientError::Invalid(format!(
                "{what} {offset}+{len} past the end of the {}-byte volume",
                self.size.get()
            )));
        }
        Ok(())
    }

    /// The bytes of piece `p` (zeros where unwritten).
    async fn read_piece(&self, p: Piece) -> Result<AlignedBuf> {
        let oid = self.oid(p.block);
        let got = match (self.cluster.direct_read(oid, p.offset, p.len)).await {
            Some(got) => got,
            None => {
                let mut h = Header::request(Op::Read, 0, oid);
                h.offset = p.offset;
                h.length = p.len;
                let f = (self.cluster).object_op(h, None, &self.gone).await?;
                if f.h.status == Status::Ok && !f.h.answers(&h) {
                    return Err(ClientError::Unavailable(format!(
                        "read {oid} {}+{}: answered for {} {}+{}",
                        p.offset, p.len, f.h.oid, f.h.offset, f.h.length
                    )));
                }
                match f.h.status {
                    // (Data, even if the reply wrongly carries none.)
                    Status::Ok => Some(f.payload.unwrap_or_else(|| AlignedBuf::new(0))),
                    Status::NotFound => None,
                    s => return Err(status_err(s, &format!("read {oid}"))),
                }
            }
        };
        let Some(b) = got else {
            return Ok(AlignedBuf::zeroed(p.len as usize));
        };
        // The reply goes out as it is (read_parts): a wrong length would
        // shift everything after it.
        if b.len() != p.len as usize {
            return Err(ClientError::Unavailable(format!(
                "read {oid} {}+{}: answered with {} bytes",
                p.offset,
                p.len,
                b.len()
            )));
        }
        Ok(b)
    }

    /// Reads `len` bytes at `offset`; unwritten ranges are zeros.
    pub async fn read(self: &Rc<Self>, offset: u64, len: u64) -> Result<AlignedBuf> {
        let mut parts = self.read_parts(offset, len).await?;
        if parts.len() == 1 {
            return Ok(parts.pop().expect("one part"));
        }
        let mut out = AlignedBuf::new(len as usize);
        let mut at = 0;
        for b in parts {
            out[at..at + b.len()].copy_from_slice(&b);
            at += b.len();
        }
        Ok(out)
    }

    /// [`Volume::read`] as the objects' own buffers, in order, each of
    /// them as long as its part of the range: a reply sends them back to
    /// back instead of assembling them by copying.
    pub async fn read_parts(self: &Rc<Self>, offset: u64, len: u64) -> Result<Vec<AlignedBuf>> {
        self.check("read", offset, len, IO_MAX_BYTES)?;
        let ps: Vec<Piece> = pieces(offset, len, self.rec.object_bytes).collect();
        if let [p] = ps[..] {
            return Ok(vec![self.read_piece(p).await?]);
        }
        let tasks: Vec<_> = (ps.iter())
            .map(|&p| {
                let me = self.clone();
                rt::spawn(async move { me.read_piece(p).await })
            })
            .collect();
        // Every part ends before the read does (none outlives the I/O).
        rt::join_all(tasks).await.into_iter().collect()
    }

    async fn write_piece(&self, p: Piece, data: SharedBuf) -> Result<()> {
        self.write_piece_if(p, data, 0).await.map(|_| ())
    }

    /// Writes piece `p`; with `up_to` not 0, only to an object that exists
    /// at that version or below (else `NotFound` or `Stale`, not errors).
    async fn write_piece_if(&self, p: Piece, data: SharedBuf, up_to: u64) -> Result<Status> {
        let mut h = Header::request(Op::Write, 0, self.oid(p.block)).with_payload(&data);
        h.offset = p.offset;
        h.length = p.len;
        h.obj_version = up_to;
        let f = self.cluster.object_op(h, Some(&data), &self.gone).await?;
        match f.h.status {
            Status::Ok => Ok(Status::Ok),
            s @ (Status::NotFound | Status::Stale) if up_to != 0 => Ok(s),
            s => Err(status_err(s, &format!("write {}", self.oid(p.block)))),
        }
    }

    /// Writes `data` at `offset`; returns once every replica has it durable.
    pub async fn write(self: &Rc<Self>, offset: u64, data: AlignedBuf) -> Result<()> {
        self.check("write", offset, data.len() as u64, IO_MAX_BYTES)?;
        let ps: Vec<Piece> = pieces(offset, data.len() as u64, self.rec.object_bytes).collect();
        // The pieces are ranges of the one buffer, sent from where they are.
        let data = SharedBuf::new(data);
        if let [p] = ps[..] {
            return self.write_piece(p, data).await;
        }
        let tasks: Vec<_> = (ps.iter())
            .map(|&p| {
                let me = self.clone();
                let part = data.slice(p.at..p.at + p.len as usize);
                rt::spawn(async move { me.write_piece(p, part).await })
            })
            .collect();
        rt::join_all(tasks).await.into_iter().collect()
    }

    /// Deletes object `block`; with `up_to` not 0, only if it is at that
    /// version or below. Whether it was there to delete (`None`: it was,
    /// at a newer version, and stays).
    async fn delete_object(&self, block: u64, up_to: u64) -> Result<Option<bool>> {
        let mut h = Header::request(Op::Delete, 0, self.oid(block));
        h.obj_version = up_to;
        let f = (self.cluster).object_op(h, None, &self.gone).await?;
        match f.h.status {
            Status::Ok => Ok(Some(true)),
            Status::NotFound => Ok(Some(false)),
            Status::Stale if up_to != 0 => Ok(None),
            s => Err(status_err(s, &format!("delete {}", self.oid(block)))),
        }
    }

    /// One page of PG `pg`'s objects of this volume at block `from` or
    /// above, with their versions, from the PG's primary (`Op::List`).
    async fn list_page(&self, pg: PgId, from: u64) -> Result<Vec<(u64, u64)>> {
        let mut h = Header::request(Op::List, 0, self.oid(from));
        h.length = nacre_wire::LIST_PAGE_MAX;
        let (_, f) = (self.cluster)
            .primary_op(Some(pg), h, None, &self.gone)
            .await?;
        if f.h.status != Status::Ok {
            return Err(status_err(f.h.status, &format!("list PG {pg}")));
        }
        let body = f.payload.as_deref().unwrap_or(&[]);
        Ok(nacre_wire::decode_list(body))
    }

    /// Makes everything of the volume past its record's size read as
    /// zeros, while the record still marks that data for deletion
    /// (`stale_until` past the size): the objects each PG's primary lists
    /// there are deleted (the one the end falls inside zeroed from it on),
    /// each op conditional on the version listed. Only objects that exist
    /// cost an op: a sparse 64 TiB volume's shrink sends one listing per
    /// PG. The record is read again after each listing, and the cut stops
    /// (`None`) once it has changed; while the mark stands no grow is
    /// published, so what a client writes after a later grow has a version
    /// above any listed before it and is never touched. An op refused
    /// because its object changed since the listing (`Stale`: another
    /// cut, a peering rewrite) sends the cut round again. Returns the
    /// objects deleted.
    pub async fn cut_after(self: &Rc<Self>) -> Result<Option<u64>> {
        let (ob, end) = (u64::from(self.rec.object_bytes), self.rec.size_bytes);
        let count = {
            let m = self.cluster.map.borrow();
            let t = m.table(self.rec.pool).ok_or_else(|| {
                ClientError::Unavailable(format!("pool {} has no PG table", self.rec.pool))
            })?;
            t.pg_count()
        };
        let mut deleted = 0;
        for _ in 0..CUT_ROUNDS_MAX {
            let mut changed = false;
            for pg in (0..count).map(|n| PgId::new(self.rec.pool, n)) {
                let mut from = end / ob;
                loop {
                    let page = self.list_page(pg, from).await?;
                    if !self.still_marked()? {
                        return Ok(None);
                    }
                    for chunk in page.chunks(TRIM_PARALLEL_MAX) {
                        let tasks: Vec<_> = (chunk.iter())
                            .map(|&(block, version)| {
                                let me = self.clone();
                                rt::spawn(async move { me.cut_object(block, version).await })
                            })
                            .collect();
                        // Every op ends before the cut does (none outlives it).
                        for r in rt::join_all(tasks).await {
                            match r? {
                                Cut::Deleted => deleted += 1,
                                Cut::Changed => changed = true,
                                Cut::Done => {}
                            }
                        }
                    }
                    match page.last() {
                        Some(&(last, _)) if page.len() == nacre_wire::LIST_PAGE_MAX as usize => {
                            from = last.saturating_add(1)
                        }
                        _ => break,
                    }
                }
            }
            if !changed {
                return Ok(Some(deleted));
            }
        }
        Err(ClientError::Unavailable(format!(
            "volume {:?}: objects past its end kept changing over {CUT_ROUNDS_MAX} rounds of deleting them; run the command again",
            self.rec.name
        )))
    }

    /// Whether the record still is the one this handle was opened with,
    /// marking data past its end for deletion.
    fn still_marked(&self) -> Result<bool> {
        let r = map::get_volume(&*self.cluster.meta, &self.rec.name)?;
        Ok(r.is_some_and(|r| {
            (r.id, r.size_bytes, r.stale_until, r.deleting)
                == (
                    self.rec.id,
                    self.rec.size_bytes,
                    self.rec.stale_until,
                    false,
                )
                && r.stale_until > r.size_bytes
        }))
    }

    /// A cut's op on object `block`, listed at `version`: deleted if it
    /// lies wholly past the end, else zeroed from the end on.
    async fn cut_object(&self, block: u64, version: u64) -> Result<Cut> {
        let (ob, end) = (u64::from(self.rec.object_bytes), self.rec.size_bytes);
        if block > end / ob || end.is_multiple_of(ob) {
            return Ok(match self.delete_object(block, version).await? {
                Some(true) => Cut::Deleted,
                Some(false) => Cut::Done,
                None => Cut::Changed,
            });
        }
        let p = Piece {
            block,
            offset: (end % ob) as u32,
            len: (ob - end % ob) as u32,
            at: 0,
        };
        let zeros = SharedBuf::new(AlignedBuf::zeroed(p.len as usize));
        Ok(match self.write_piece_if(p, zeros, version).await? {
            Status::Stale => Cut::Changed,
            _ => Cut::Done,
        })
    }

    /// Makes `offset..offset+len` read as zeros. Whole objects are deleted
    /// (their space returns); the partial ends are written with zeros.
    pub async fn zero(self: &Rc<Self>, offset: u64, len: u64) -> Result<()> {
        self.check("zero", offset, len, u64::MAX)?;
        let ob = self.rec.object_bytes;
        // A chunk of pieces at a time: a shrink of a huge volume holds
        // `TRIM_PARALLEL_MAX` pieces, never the whole range's.
        let mut ps = pieces(offset, len, ob).peekable();
        while ps.peek().is_some() {
            let chunk: Vec<Piece> = ps.by_ref().take(TRIM_PARALLEL_MAX).collect();
            let tasks: Vec<_> = chunk
                .iter()
                .map(|&p| {
                    let me = self.clone();
                    rt::spawn(async move {
                        if p.offset == 0 && p.len == ob {
                            me.delete_object(p.block, 0).await.map(|_| ())
                        } else {
                            let zeros = AlignedBuf::zeroed(p.len as usize);
                            me.write_piece(p, SharedBuf::new(zeros)).await
                        }
                    })
                })
                .collect();
            // Every part ends before the I/O does: one left running after
            // an error could land past the end of a shrink that waited
            // for this I/O.
            rt::join_all(tasks)
                .await
                .into_iter()
                .collect::<Result<()>>()?;
        }
        Ok(())
    }
}

/// Volume administration (create, resize, delete), for the CLI and tests.
impl Cluster {
    /// Creates volume `name` in pool `pool` (`None`: [`Cluster::pool`]'s
    /// default).
    pub fn create_volume(
        &self,
        name: &str,
        pool: Option<&str>,
        size_bytes: u64,
    ) -> Result<VolumeRecord> {
        check_size(size_bytes)?;
        let pool = self.pool(pool)?;
        Ok(map::create_volume(&*self.meta, name, &pool, size_bytes)?)
    }

    /// Changes the size. A shrink of a volume with open connections is
    /// refused unless `force`; then the gateways enforce the new size on
    /// those connections (writes past it fail) before the data past the
    /// new end is deleted, so a later grow reads zeros there. Without
    /// `wait`, a shrink returns once recorded and the sweep deletes the
    /// data ([`Cluster::reclaim_orphans`]).
    pub async fn resize_volume(
        self: &Rc<Self>,
        name: &str,
        size_bytes: u64,
        force: bool,
        wait: bool,
    ) -> Result<VolumeRecord> {
        check_size(size_bytes)?;
        let old = self.volume(name)?;
        if size_bytes < old.size_bytes && !force {
            self.refuse_in_use(
                &old,
                "shrink",
                "they see the new size at once and their writes past it fail",
            )?;
        }
        // Whatever a shrink left past the end goes before a grow can expose
        // it: the grow is published only while nothing is left to cut (a
        // shrink, or the sweep finding data past the end, may mark some
        // meanwhile; then it is cut, and the grow tried again).
        let mut cur = old.clone();
        let rec = loop {
            if cur.stale_until > cur.size_bytes && size_bytes > cur.size_bytes {
                self.drop_stale(&cur).await?;
            }
            let uncut = Cell::new(false);
            let r = map::update_volume(&*self.meta, name, |r| {
                uncut.set(false);
                if r.id != old.id || r.deleting {
                    return Err(MetaError::Invalid(format!(
                        "volume {name:?} is being deleted"
                    )));
                }
                if size_bytes > r.size_bytes && r.stale_until > r.size_bytes {
                    uncut.set(true);
                    return Err(MetaError::Invalid(format!(
                        "volume {name:?}: data past its end is still being deleted; run the command again"
                    )));
                }
                if size_bytes < r.size_bytes {
                    r.stale_until = r.stale_until.max(r.size_bytes);
                }
                r.size_bytes = size_bytes;
                Ok(())
            });
            match r {
                Err(_) if uncut.get() && cur.stale_until <= cur.size_bytes => {
                    cur = self.volume(name)?
                }
                r => break r?,
            }
        };
        if rec.stale_until > rec.size_bytes && wait {
            // Every open connection enforces the new size (no write
            // admitted at the old one still runs) before the cut-off data
            // goes; else a write racing the delete could outlive it.
            self.wait_sessions(&rec, |s| s.size_bytes <= size_bytes, "shrink")
                .await?;
            let n = self.drop_stale(&rec).await?;
            tracing::info!("volume {name:?}: {n} objects past its new end deleted");
        } else if size_bytes > old.size_bytes {
            // A grow: the open connections see it once their gateway
            // heard of it; waited for (bounded), so that they do when this
            // returns. The grow stands either way.
            let seen = self.wait_sessions(&rec, |s| s.size_bytes >= size_bytes, "grow");
            if let Err(e) = seen.await {
                tracing::warn!("{e}");
            }
        }
        Ok(map::get_volume(&*self.meta, name)?.unwrap_or(rec))
    }

    fn volume(&self, name: &str) -> Result<VolumeRecord> {
        map::get_volume(&*self.meta, name)?.ok_or_else(|| ClientError::NoVolume(name.to_string()))
    }

    /// Refuses `what` on a volume that has open connections.
    fn refuse_in_use(&self, v: &VolumeRecord, what: &str, forced: &str) -> Result<()> {
        let open = map::list_sessions(&*self.meta, v.id)?;
        if open.is_empty() {
            return Ok(());
        }
        Err(ClientError::InUse(format!(
            "volume {:?} has {} open connection{} ({}); disconnect {} first, or give --force to {what} it anyway ({forced})",
            v.name,
            open.len(),
            if open.len() == 1 { "" } else { "s" },
            describe_sessions(&open),
            if open.len() == 1 { "it" } else { "them" },
        )))
    }

    /// Waits until every open connection to `v` satisfies `done` (a
    /// connection that closes does), for up to [`SESSION_WAIT_MS`].
    async fn wait_sessions(
        &self,
        v: &VolumeRecord,
        done: impl Fn(&SessionRecord) -> bool,
        what: &str,
    ) -> Result<()> {
        let until = rt::monotonic() + Duration::from_millis(SESSION_WAIT_MS);
        loop {
            let open: Vec<SessionRecord> = (map::list_sessions(&*self.meta, v.id)?.into_iter())
                .filter(|s| !done(s))
                .collect();
            if open.is_empty() {
                return Ok(());
            }
            if rt::monotonic() >= until {
                return Err(ClientError::Unavailable(format!(
                    "{what} of volume {:?}: {} connection{} did not let go within {} s ({}); run the command again",
                    v.name,
                    open.len(),
                    if open.len() == 1 { "" } else { "s" },
                    SESSION_WAIT_MS / 1000,
                    describe_sessions(&open)
                )));
            }
            rt::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes the data a shrink cut off (everything past `size_bytes`;
    /// [`Volume::cut_after`]), then clears the mark if the record (size
    /// and mark) has not moved meanwhile; if it has, the cut stops and
    /// whoever moved it owns what is left. Returns the objects deleted.
    async fn drop_stale(self: &Rc<Self>, v: &VolumeRecord) -> Result<u64> {
        self.reload_map()?;
        let h = Rc::new(Volume::with_record(self, v.clone()));
        let Some(deleted) = h.cut_after().await? else {
            return Ok(0);
        };
        if !h.still_marked()? {
            return Ok(deleted);
        }
        let cleared = map::update_volume(&*self.meta, &v.name, |r| {
            if (r.id, r.size_bytes, r.stale_until) == (v.id, v.size_bytes, v.stale_until) {
                r.stale_until = 0;
            }
            Ok(())
        });
        match cleared {
            // Deleted meanwhile: nothing left to clear.
            Err(_) if map::get_volume(&*self.meta, &v.name)?.is_none_or(|r| r.id != v.id) => {}
            r => {
                r?;
            }
        }
        Ok(deleted)
    }

    /// Deletes a volume: refused while it has open connections unless
    /// `force`. Marks it deleting (gateways refuse new connections and cut
    /// the open ones), waits until none is open, deletes its objects on
    /// every OSD that is up, then its record. Copies on OSDs that are down
    /// are orphans the next sweep deletes ([`Cluster::reclaim_orphans`]).
    /// Without `wait`, returns once it is marked; the sweep does the rest.
    pub async fn delete_volume(&self, name: &str, force: bool, wait: bool) -> Result<()> {
        let rec = self.volume(name)?;
        if !force {
            self.refuse_in_use(&rec, "delete", "they are cut and their later I/O fails")?;
        }
        let rec = map::update_volume(&*self.meta, name, |r| {
            if r.id != rec.id {
                return Err(MetaError::Invalid(format!(
                    "volume {name:?} was replaced meanwhile"
                )));
            }
            r.deleting = true;
            Ok(())
        })?;
        if !wait {
            return Ok(());
        }
        self.wait_sessions(&rec, |_| false, "delete").await?;
        self.finish_delete(&rec).await
    }

    /// Deletes the objects of volume `rec` (marked deleting, no connection
    /// open) on every OSD that is up, then its record.
    async fn finish_delete(&self, rec: &VolumeRecord) -> Result<()> {
        self.reload_map()?;
        let m = self.map();
        for osd in m.osds.iter().map(|o| o.id).filter(|&o| m.is_up(o)) {
            let h = Header::request(Op::PurgeVolume, 0, ObjectId::new(rec.id, 0));
            let f = self
                .conn(osd)?
                .call(h, None)
                .await
                .map_err(|e| ClientError::Unavailable(format!("osd.{osd}: {e}")))?;
            if f.h.status != Status::Ok {
                return Err(status_err(f.h.status, &format!("purge on osd.{osd}")));
            }
        }
        Ok(map::remove_volume(&*self.meta, &rec.name, rec.id)?)
    }

    /// Objects per volume id over the OSDs that are up, and the OSDs that
    /// are down or did not answer (their objects are not counted).
    pub async fn volume_usage(&self) -> (BTreeMap<u64, VolumeUse>, Vec<u32>) {
        let m = self.map();
        let (mut per, mut missing) = (BTreeMap::<u64, VolumeUse>::new(), Vec::new());
        for osd in m.osds.iter().map(|o| o.id) {
            let Some(u) = self.osd_usage(osd, &m).await else {
                missing.push(osd);
                continue;
            };
            let bb = u.block_bytes;
            for [v, n, primary, _] in u.volumes {
                // An object of an EC pool is `k` blocks of data, the shard
                // that counts it one.
                let pool = nacre_types::VolumeId(v).pool();
                let k = (m.pool(pool).and_then(|p| p.ec)).map_or(1, |e| u64::from(e.k));
                let e = per.entry(v).or_default();
                e.objects += primary;
                e.bytes += primary * bb * k;
                e.raw_bytes += n * bb;
            }
        }
        (per, missing)
    }

    /// OSD `osd`'s answer to `Op::VolumeUsage` (`nacre_osd::VolumeUsage`
    /// in JSON), if it is up and answers.
    async fn osd_usage(&self, osd: u32, m: &ClusterMap) -> Option<OsdUsage> {
        if !m.is_up(osd) {
            return None;
        }
        let h = Header::request(Op::VolumeUsage, 0, ObjectId::default());
        let f = self.conn(osd).ok()?.call(h, None).await.ok()?;
        let v: serde_json::Value = serde_json::from_slice(f.payload.as_deref()?).ok()?;
        Some(OsdUsage {
            block_bytes: v["block_bytes"].as_u64()?,
            volumes: serde_json::from_value(v["volumes"].clone()).ok()?,
        })
    }

    /// The sweep (every `--reclaim-interval`, in the elected monitor):
    ///
    /// - finds objects of volumes that no longer exist (a purge that
    ///   missed a down OSD, a write or recovery push that raced a delete)
    ///   on every OSD that is up and deletes them. Volume ids are never
    ///   reused: an id whose serial is at most the last one handed out
    ///   (read first) that names no volume (read after) belongs to a
    ///   deleted volume, so a volume created meanwhile is never taken;
    /// - finishes what a `volume rm` or a shrink left when its command
    ///   stopped (killed, or its host lost) and was not run again: a
    ///   volume still marked deleting, data past a shrink's end not yet
    ///   cut — once no connection holds it and the previous sweep saw the
    ///   same mark (`seen`): a command has had a whole interval (if it
    ///   still runs, both cut, which [`Volume::cut_after`] makes safe);
    /// - marks and cuts objects found past a volume's end that no shrink
    ///   marked (a write a gateway cut off from the cluster sent before
    ///   its session ran out).
    ///
    /// Records what it did for `nacre status`.
    pub async fn reclaim_orphans(
        self: &Rc<Self>,
        seen: &mut Unfinished,
    ) -> Result<map::OrphanReport> {
        let last = map::last_volume_id(&*self.meta)?;
        let volumes = map::list_volumes(&*self.meta)?;
        let live: std::collections::HashSet<u64> = volumes.iter().map(|v| v.id).collect();
        self.reload_map()?;
        let m = self.map();
        let mut report = map::get_orphans(&*self.meta)?;
        report.left.clear();
        // The highest block + 1 any OSD holds, per volume.
        let mut ends: BTreeMap<u64, u64> = BTreeMap::new();
        for osd in m.osds.iter().map(|o| o.id) {
            let Some(u) = self.osd_usage(osd, &m).await else {
                continue;
            };
            for [v, n, _, end] in u.volumes {
                let serial = nacre_types::VolumeId(v).serial();
                if serial == 0 || serial > last || live.contains(&v) {
                    let e = ends.entry(v).or_default();
                    *e = (*e).max(end);
                    continue;
                }
                let h = Header::request(Op::PurgeVolume, 0, ObjectId::new(v, 0));
                let r = match self.conn(osd) {
                    Ok(c) => c
                        .call(h, None)
                        .await
                        .map(|f| f.h.status)
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match r {
                    Ok(Status::Ok) => {
                        tracing::info!(
                            "osd.{osd}: deleted {n} orphaned objects of deleted volume {v}"
                        );
                        report.reclaimed_objects += n;
                    }
                    Ok(s) => report.left.push(format!(
                        "osd.{osd}: {n} objects of deleted volume {v} ({s:?})"
                    )),
                    Err(e) => report.left.push(format!(
                        "osd.{osd}: {n} objects of deleted volume {v} ({e})"
                    )),
                }
            }
        }
        let mut now = Unfinished::new();
        for v in volumes {
            let end = ends.get(&v.id).copied().unwrap_or(0);
            if let Err(e) = self.finish(&v, end, seen, &mut now, &mut report).await {
                report.left.push(format!("volume {:?}: {e}", v.name));
            }
        }
        *seen = now;
        report.last_sweep_unix_s = map::now_s();
        map::put_orphans(&*self.meta, &report)?;
        Ok(report)
    }

    /// The sweep's part for one live volume, `listed` as it was before the
    /// OSDs were asked what they hold: its objects reach block `end` - 1
    /// in the PGs the OSDs that answered lead.
    async fn finish(
        self: &Rc<Self>,
        listed: &VolumeRecord,
        end: u64,
        seen: &Unfinished,
        now: &mut Unfinished,
        report: &mut map::OrphanReport,
    ) -> Result<()> {
        // Acted on as it is now (the sweep may have run long since).
        let Some(mut v) = map::get_volume(&*self.meta, &listed.name)?.filter(|r| r.id == listed.id)
        else {
            return Ok(());
        };
        let blocks = listed.size_bytes.div_ceil(u64::from(v.object_bytes));
        let unmarked = !v.deleting && v.stale_until <= v.size_bytes;
        if unmarked {
            if end <= blocks || v.size_bytes != listed.size_bytes {
                return Ok(());
            }
            // Data past the end no shrink marked: marked now (if the size
            // is still the one the objects were compared with).
            tracing::warn!(
                "volume {:?}: objects up to block {} past its end (block {blocks}): deleting them",
                v.name,
                end - 1
            );
            let stale = end.saturating_mul(u64::from(v.object_bytes));
            v = map::update_volume(&*self.meta, &v.name, |r| {
                if r.id == v.id && r.size_bytes == listed.size_bytes && !r.deleting {
                    r.stale_until = r.stale_until.max(stale);
                }
                Ok(())
            })?;
            if v.stale_until < stale {
                return Ok(());
            }
        }
        // A command's mark is taken over once the previous sweep saw it
        // too (the command has had a whole interval).
        let mark = (v.id, v.deleting, v.size_bytes, v.stale_until);
        now.insert(mark);
        if !unmarked && !seen.contains(&mark) {
            return Ok(());
        }
        let open = map::list_sessions(&*self.meta, v.id)?;
        if v.deleting {
            if open.is_empty() {
                self.finish_delete(&v).await?;
                tracing::info!("volume {:?}: its interrupted delete finished", v.name);
                report.finished += 1;
            }
        } else if open.iter().all(|s| s.size_bytes <= v.size_bytes) {
            let n = self.drop_stale(&v).await?;
            tracing::info!(
                "volume {:?}: {n} objects past its end ({} bytes) deleted",
                v.name,
                v.size_bytes
            );
            report.trimmed_objects += n;
            report.finished += u64::from(!unmarked);
        }
        Ok(())
    }

    /// Has PG `pg` scrubbed by its primary, deeply
    /// (every copy read whole) or not, and waits for the report
    /// (`nacre_osd::ScrubReport`, JSON): the primary queues the scrub and
    /// answers with a ticket, then its report once done (asked every
    /// [`SCRUB_POLL`]). Follows the PG to a new primary (map changes) for
    /// up to `CLIENT_OP_TIMEOUT_MS` of attempts to start it; the scrub
    /// itself may take as long as it takes, but a primary that stops
    /// answering, or restarts (forgetting the ticket), fails it.
    pub async fn scrub_pg(&self, pg: PgId, deep: bool) -> Result<serde_json::Value> {
        let (primary, ticket) = self.scrub_start(pg, deep).await?;
        let mut h = Header::request(Op::Scrub, 0, ObjectId::default()).with_pg(pg);
        h.length = nacre_wire::SCRUB_REPORT;
        h.obj_version = ticket;
        let what = format!("the scrub of PG {pg}");
        self.wait_report(primary, h, &what).await
    }

    /// Asks OSD `osd` for the report `h` names (an `Op::Scrub` or
    /// `Op::Bench` report of a ticket) every [`SCRUB_POLL`] until it
    /// answers with one (JSON); `what` names the work in errors. An OSD
    /// that stops answering for `CLIENT_OP_TIMEOUT_MS`, or restarts
    /// (forgetting the ticket), fails it.
    async fn wait_report(&self, osd: u32, h: Header, what: &str) -> Result<serde_json::Value> {
        let mut lost = 0;
        loop {
            rt::sleep(SCRUB_POLL).await;
            let r = match self.conn(osd) {
                Ok(c) => c.call(h, None).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match r {
                Ok(f) if f.h.status == Status::Ok => {
                    lost = 0;
                    let Some(body) = f.payload else { continue };
                    return serde_json::from_slice(&body).map_err(|e| {
                        ClientError::Unavailable(format!("osd.{osd}'s report of {what}: {e}"))
                    });
                }
                Ok(f) => {
                    return Err(ClientError::Unavailable(format!(
                        "osd.{osd} has no report of {what} ({:?}): it restarted; ask again",
                        f.h.status
                    )))
                }
                Err(e) => {
                    self.conns.borrow_mut().remove(&osd);
                    lost += 1;
                    if lost * SCRUB_POLL > Duration::from_millis(CLIENT_OP_TIMEOUT_MS) {
                        return Err(ClientError::Unavailable(format!("osd.{osd}, {what}: {e}")));
                    }
                }
            }
        }
    }

    /// Has OSD `osd` measure its own store over `bytes` (`nacre osd
    /// bench`) and waits for its report (`nacre_osd::BenchReport`, JSON):
    /// the OSD answers with a ticket, then its report once done
    /// ([`Self::wait_report`]). An OSD that refuses says why.
    pub async fn osd_bench(&self, osd: u32, bytes: u64) -> Result<serde_json::Value> {
        let mut h = Header::request(Op::Bench, 0, ObjectId::default());
        (h.length, h.obj_version) = (nacre_wire::BENCH_START, bytes);
        let f = (self.conn(osd)?.call(h, None).await)
            .map_err(|e| ClientError::Unavailable(format!("osd.{osd}: {e}")))?;
        if f.h.status != Status::Ok {
            let why = String::from_utf8_lossy(f.payload.as_deref().unwrap_or(&[])).into_owned();
            return Err(match f.h.status {
                Status::Invalid => ClientError::Invalid(format!("osd.{osd}: {why}")),
                s => ClientError::Unavailable(format!("osd.{osd}: {s:?} {why}")),
            });
        }
        h.length = nacre_wire::BENCH_REPORT;
        h.obj_version = f.h.obj_version;
        self.wait_report(osd, h, "its bench").await
    }

    /// Has OSD `from` measure its link to OSD `to` through its own
    /// connection (`nacre net bench`): the report (`nacre_osd::LinkReport`,
    /// JSON), or why not.
    pub async fn net_bench(&self, from: u32, to: u32) -> Result<serde_json::Value> {
        let mut h = Header::request(Op::NetBench, 0, ObjectId::default());
        h.obj_version = u64::from(to);
        let f = (self.conn(from)?.call(h, None).await)
            .map_err(|e| ClientError::Unavailable(format!("osd.{from}: {e}")))?;
        let body = f.payload.as_deref().unwrap_or(&[]);
        match f.h.status {
            Status::Ok => serde_json::from_slice(body)
                .map_err(|e| ClientError::Unavailable(format!("osd.{from}'s link report: {e}"))),
            s => {
                let why = String::from_utf8_lossy(body);
                Err(ClientError::Unavailable(format!("osd.{from}: {s:?} {why}")))
            }
        }
    }

    /// Asks PG `pg`'s primary to scrub it; the primary and its ticket.
    async fn scrub_start(&self, pg: PgId, deep: bool) -> Result<(u32, u64)> {
        let mut h = Header::request(Op::Scrub, 0, ObjectId::default());
        h.length = if deep {
            nacre_wire::SCRUB_START_DEEP
        } else {
            nacre_wire::SCRUB_START
        };
        let (primary, f) = self
            .primary_op(Some(pg), h, None, &Cell::new(false))
            .await?;
        match f.h.status {
            Status::Ok => Ok((primary, f.h.obj_version)),
            s => Err(status_err(s, &format!("osd.{primary}, scrub of PG {pg}"))),
        }
    }

    /// Every OSD's counters and space (`None` for an OSD that did not answer).
    ///
    /// Only OSDs that are up are asked (one that is down, or cut off from
    /// the meta store long enough for its `up` key to lapse, is `None`
    /// without waiting on it), each for at most [`STAT_TIMEOUT_MS`].
    pub async fn osd_stats(&self) -> Vec<(u32, Option<serde_json::Value>)> {
        let osds: Vec<(u32, bool)> = {
            let m = self.map.borrow();
            m.osds.iter().map(|o| (o.id, m.is_up(o.id))).collect()
        };
        let mut out = Vec::new();
        for (osd, up) in osds {
            let h = Header::request(Op::Stat, 0, ObjectId::default());
            let r = match up.then(|| self.conn(osd)) {
                Some(Ok(c)) => {
                    let d = Duration::from_millis(STAT_TIMEOUT_MS);
                    rt::timeout(d, c.call(h, None)).await.and_then(|r| r.ok())
                }
                _ => None,
            };
            let v = r
                .and_then(|f| f.payload)
                .and_then(|p| serde_json::from_slice(&p).ok());
            out.push((osd, v));
        }
        out
    }
}

struct OsdUsage {
    block_bytes: u64,
    /// `[volume id, objects, of them as primary, highest block + 1]`.
    volumes: Vec<[u64; 4]>,
}

/// Marks of unfinished volume commands a sweep saw (volume id, deleting,
/// size, data past the end up to): the next sweep finishes those it sees
/// again ([`Cluster::reclaim_orphans`]).
pub type Unfinished = std::collections::BTreeSet<(u64, bool, u64, u64)>;

/// One volume's objects over the cluster ([`Cluster::volume_usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeUse {
    /// Objects (each counted once, by its PG's primary).
    pub objects: u64,
    /// Their space: what the volume holds, thin.
    pub bytes: u64,
    /// The space of every copy.
    pub raw_bytes: u64,
}

/// The open connections, for a message: who and since when.
fn describe_sessions(open: &[SessionRecord]) -> String {
    let now = map::now_s();
    let mut out: Vec<String> = (open.iter().take(4))
        .map(|s| {
            format!(
                "{}, open {} s",
                s.client,
                now.saturating_sub(s.since_unix_s)
            )
        })
        .collect();
    if open.len() > 4 {
        out.push(format!("and {} more", open.len() - 4));
    }
    out.join("; ")
}

fn check_size(size_bytes: u64) -> Result<()> {
    let s = u64::from(SECTOR_BYTES);
    if size_bytes == 0 || !size_bytes.is_multiple_of(s) || size_bytes > 1 << 60 {
        return Err(ClientError::Invalid(format!(
            "volume size {size_bytes}: a positive multiple of {s} up to 1 EiB"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nacre_meta::map::OsdRecord;

    /// A cluster map of three OSDs that no one answers for, and a volume
    /// of 1 MiB on it: every op retries until it times out.
    fn unreachable(dir: &std::path::Path) -> Rc<Volume> {
        let meta = nacre_meta::embedded::Embedded::open(dir).unwrap();
        unreachable_on(dir, meta)
    }

    fn unreachable_on(dir: &std::path::Path, meta: Arc<dyn MetaStore>) -> Rc<Volume> {
        let osds: Vec<OsdRecord> = (0..3)
            .map(|id| {
                let addr = format!("unix:{}", dir.join(format!("none.{id}.sock")).display());
                OsdRecord::local(id, addr, 1)
            })
            .collect();
        let pool = PoolRecord::rbd(3, 2, 8, 128 << 10);
        map::init(&*meta, &osds, &pool).unwrap();
        map::create_volume(&*meta, "v", &pool, 1 << 20).unwrap();
        let cluster = Cluster::connect(meta).unwrap();
        Rc::new(Volume::open(&cluster, "v").unwrap())
    }

    /// An abandoned volume's I/O stops retrying: reads, writes and zeroing
    /// over several objects end `Abandoned` instead of retrying for
    /// `CLIENT_OP_TIMEOUT_MS` (then they would end `Unavailable`).
    #[test]
    fn an_abandoned_volume_stops_retrying() {
        let d = tempfile::tempdir().unwrap();
        let vol = unreachable(d.path());
        rt::block_on(async {
            let ios: Vec<rt::JoinHandle<Result<()>>> = vec![
                {
                    let v = vol.clone();
                    rt::spawn(async move { v.write(64 << 10, AlignedBuf::zeroed(256 << 10)).await })
                },
                {
                    let v = vol.clone();
                    rt::spawn(async move { v.read(0, 512 << 10).await.map(drop) })
                },
                {
                    let v = vol.clone();
                    rt::spawn(async move { v.zero(4096, 1 << 19).await })
                },
            ];
            rt::sleep(Duration::from_millis(300)).await;
            vol.abandon();
            for io in ios {
                let r = io.await;
                assert!(matches!(r, Err(ClientError::Abandoned)), "{r:?}");
            }
        });
    }

    /// How [`Misreads`] answers a read: a sector less or more than asked
    /// for, or the right length a sector further on.
    #[derive(Clone, Copy, Debug)]
    enum Lie {
        Short,
        Long,
        Shifted,
    }

    /// An OSD that answers every read `Ok`, wrongly: a well-formed frame
    /// (its header's length says what its payload holds), the wrong
    /// answer.
    struct Misreads(Lie);

    impl nacre_net::Handler for Misreads {
        async fn handle(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
            let mut h = f.h.reply(Status::Ok);
            if f.h.op != Op::Read {
                return (h, None);
            }
            match self.0 {
                Lie::Short => h.length -= SECTOR_BYTES,
                Lie::Long => h.length += SECTOR_BYTES,
                Lie::Shifted => h.offset += SECTOR_BYTES,
            }
            let data = AlignedBuf::zeroed(h.length as usize);
            (h.with_payload(&data), Some(data))
        }
    }

    /// A read reply of another length or for another range than asked
    /// fails the read with an error naming the object and what came back;
    /// it never reaches the caller as data (the NBD reply goes out as the
    /// pieces' buffers back to back, so a short piece would shift every
    /// byte after it).
    #[test]
    fn a_read_answered_wrongly_fails() {
        for lie in [Lie::Short, Lie::Long, Lie::Shifted] {
            let d = tempfile::tempdir().unwrap();
            let vol = unreachable(d.path());
            rt::block_on(async {
                // The map's three OSDs, all answering alike.
                for id in 0..3 {
                    let addr = Addr::Unix(d.path().join(format!("none.{id}.sock")));
                    let l = nacre_io::net::Listener::bind(&addr).unwrap();
                    drop(rt::spawn(nacre_net::serve(l, Rc::new(Misreads(lie)))));
                }
                // One piece; then four objects' pieces (128 KiB objects).
                for len in [4096u64, 512 << 10] {
                    let r = vol.read(0, len).await.map(|b| b.len());
                    let Err(ClientError::Unavailable(why)) = &r else {
                        panic!("read of {len} ({lie:?}): {r:?}");
                    };
                    assert!(why.contains("answered"), "{why}");
                    assert!(why.contains(&vol.oid(0).to_string()), "{why}");
                }
            });
        }
    }

    /// A meta store whose calls, once `hang` is set, block until it is
    /// cleared (an etcd that does not answer).
    struct Hanging {
        inner: Arc<dyn MetaStore>,
        hang: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Hanging {
        fn wait(&self) {
            while self.hang.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    impl MetaStore for Hanging {
        fn range(
            &self,
            r: &nacre_meta::Range,
        ) -> nacre_meta::Result<(Vec<nacre_meta::KeyValue>, i64)> {
            self.wait();
            self.inner.range(r)
        }
        fn txn(&self, t: nacre_meta::Txn) -> nacre_meta::Result<nacre_meta::TxnResponse> {
            self.wait();
            self.inner.txn(t)
        }
        fn watch(
            &self,
            r: &nacre_meta::Range,
            start: i64,
        ) -> nacre_meta::Result<nacre_meta::Watch> {
            self.wait();
            self.inner.watch(r, start)
        }
        fn lease_grant(&self, ttl_s: i64) -> nacre_meta::Result<i64> {
            self.wait();
            self.inner.lease_grant(ttl_s)
        }
        fn lease_keepalive(&self, id: i64) -> nacre_meta::Result<i64> {
            self.wait();
            self.inner.lease_keepalive(id)
        }
        fn lease_revoke(&self, id: i64) -> nacre_meta::Result<()> {
            self.wait();
            self.inner.lease_revoke(id)
        }
    }

    /// No I/O waits on the meta store: with every meta store call hanging,
    /// ops that keep asking for a new map (their primaries do not answer)
    /// go on retrying on the runtime and end when abandoned, before the
    /// meta store answers again. (With the map loaded on the runtime
    /// thread, the first reload would hold every op until then.)
    #[test]
    fn ops_never_wait_on_the_meta_store() {
        let d = tempfile::tempdir().unwrap();
        let hang = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let meta: Arc<dyn MetaStore> = Arc::new(Hanging {
            inner: nacre_meta::embedded::Embedded::open(d.path()).unwrap(),
            hang: hang.clone(),
        });
        let vol = unreachable_on(d.path(), meta);
        hang.store(true, std::sync::atomic::Ordering::Relaxed);
        // Released after 20 s if the test has not ended by then.
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (done, ended) = std::sync::mpsc::channel::<()>();
        let release = {
            let (hang, released) = (hang.clone(), released.clone());
            std::thread::spawn(move || {
                if ended.recv_timeout(Duration::from_secs(20)).is_err() {
                    released.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                hang.store(false, std::sync::atomic::Ordering::Relaxed);
            })
        };
        rt::block_on(async {
            let v = vol.clone();
            let io = rt::spawn(async move { v.read(0, 4096).await.map(drop) });
            rt::sleep(Duration::from_millis(500)).await;
            vol.abandon();
            let r = io.await;
            assert!(matches!(r, Err(ClientError::Abandoned)), "{r:?}");
        });
        assert!(
            !released.load(std::sync::atomic::Ordering::Relaxed),
            "the op waited for the meta store"
        );
        done.send(()).unwrap();
        drop(vol);
        release.join().unwrap();
    }

    #[test]
    fn pieces_cover_the_range() {
        let ps: Vec<Piece> = pieces(100 * 1024, 300 * 1024, 128 * 1024).collect();
        let spans: Vec<(u64, u32, u32, usize)> = ps
            .iter()
            .map(|p| (p.block, p.offset, p.len, p.at))
            .collect();
        assert_eq!(
            spans,
            [
                (0, 102_400, 28_672, 0),
                (1, 0, 131_072, 28_672),
                (2, 0, 131_072, 159_744),
                (3, 0, 16_384, 290_816)
            ]
        );
        assert_eq!(pieces(0, 4096, 4096).count(), 1);
    }
}
