//! Peering and recovery (docs/internals/replication.md §5.3, §8): what the
//! primary of a PG does at every new epoch before it serves the PG, and
//! what the other OSDs answer it.
//!
//! 1. Query every up OSD of the acting set and of the PG's last active
//!    interval for its log (each answers once no op of an older epoch is
//!    in flight there, so the answer holds every write that copy will
//!    ever acknowledge for older epochs, nor one of an earlier peering
//!    attempt of this epoch, so no recovery step lands after it).
//! 2. The authoritative copy is an answering *complete* member of the last
//!    active interval, the one with the newest log head. A complete member
//!    held every acknowledged write when the interval went active (or when
//!    its background recovery ended, as the primary reported) and took
//!    every write acknowledged in it (an acknowledgement needs every
//!    member), so it holds every acknowledged write. Without an answering
//!    complete member the PG stays inactive.
//! 3. Plan the recovery of every member of the acting set to the
//!    authoritative copy, object by object, comparing versions (one
//!    version names one content, invariant 1) of the objects the two logs
//!    name where the logs overlap ([`log_delta`], replication.md §8.5),
//!    else of every object (listings): an older or missing object
//!    needs the authoritative one at its version, with its log entry; an
//!    object a copy holds at a version the authoritative copy does not
//!    know (divergent: a write that was never acknowledged) is rewritten
//!    on every member now, at a new version of this epoch, since the store
//!    never goes back to an older version.
//! 4. A copy that lacks nothing gets the authoritative log now
//!    (`LogSync`): entries the authoritative log does not hold above its
//!    tail are ops that never completed and are forgotten, so that no copy
//!    answers a retry of an undone request as applied; the authoritative
//!    entries it lacks are adopted, so that every member's log holds the
//!    whole authoritative history whichever becomes the authority next.
//!    The others get it once recovered.
//! 5. Recover now what the PG needs to go active with `min_size` complete
//!    copies, one of them a source for the rest that takes every write of
//!    the interval (the authority, or this OSD if the authority is not in
//!    the acting set); the rest is recovered in the background
//!    (`recovery.rs`).
//! 6. Have the leader record the interval as active, naming the members
//!    still incomplete, refill the PG's request cache from the
//!    authoritative log, then serve.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::Duration;

use nacre_blockstore::{LogEntry, LogOp, PgLog};
use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_net::Transport;
use nacre_types::{ObjectId, PgId};
use nacre_wire::{Header, Op, Status, PAYLOAD_MAX_BYTES};

use crate::recovery::{self, Recovery};
use crate::{status_of, Osd, PgEvent, PgState, ReqCache};

/// Pause between two peering attempts of one PG in one epoch.
const PEER_RETRY: Duration = Duration::from_millis(300);
/// Bytes of a PG info's fixed part: tail, entry count, object count,
/// flags (bit 0: the log is marked recovering), 4 spare.
const INFO_HEAD_BYTES: usize = 24;
const OBJECT_BYTES: usize = 24;
/// Objects in one answer to a PG query (2.3 MiB of them, with a whole log
/// well within a frame): a PG that holds more is listed in pages, each
/// after the last object of the one before.
pub const PG_QUERY_PAGE_OBJECTS: usize = 100_000;

/// What a copy's log of a PG needs, once its objects are recovered, to be
/// the authoritative log: the entries to forget (ops the authoritative
/// history does not hold: never acknowledged), then the entries to adopt
/// (history whose effects the copy now holds), oldest first, then the
/// authoritative tail (so that the copy's log names every op above its
/// tail, as the authoritative one does), then the recovering mark cleared
/// (`unmark`: the copy's objects are its log's ops applied again).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LogSync {
    pub forget: Vec<u64>,
    pub adopt: Vec<LogEntry>,
    /// The tail to raise the copy's to (0: none).
    pub tail: u64,
    pub unmark: bool,
    /// Instead: mark the copy recovering (before its PG goes active with
    /// it still to recover: it takes the interval's writes, logged, before
    /// recovery brings it anything).
    pub mark: bool,
}

/// The entries of `copy` that `auth`'s history does not hold (divergent):
/// above `auth`'s tail (below it the authoritative copy cannot tell) and
/// not at their version in `auth`'s log.
pub(crate) fn divergent<'a>(
    copy: &'a PgLog,
    auth: &'a PgLog,
) -> impl Iterator<Item = &'a LogEntry> + 'a {
    (copy.entries.values())
        .filter(move |e| e.version > auth.tail && auth.entries.get(&e.version) != Some(*e))
}

impl LogSync {
    /// What turns `copy` into `auth`: its divergent entries are forgotten
    /// and the entries it lacks are adopted.
    pub(crate) fn between(copy: &PgLog, auth: &PgLog) -> LogSync {
        LogSync {
            tail: if auth.tail > copy.tail { auth.tail } else { 0 },
            unmark: copy.recovering,
            mark: false,
            forget: divergent(copy, auth).map(|e| e.version).collect(),
            adopt: (auth.entries.values())
                .filter(|e| e.version > copy.tail && copy.entries.get(&e.version) != Some(*e))
                .copied()
                .collect(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.forget.is_empty()
            && self.adopt.is_empty()
            && self.tail == 0
            && !self.unmark
            && !self.mark
    }

    /// Only marks the copy recovering.
    pub(crate) fn mark() -> LogSync {
        LogSync {
            mark: true,
            ..LogSync::default()
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(20 + self.forget.len() * 8 + self.adopt.len() * 64);
        b.extend_from_slice(&self.tail.to_le_bytes());
        let flags = u32::from(self.unmark) | (u32::from(self.mark) << 1);
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&(self.forget.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.adopt.len() as u32).to_le_bytes());
        for v in &self.forget {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for e in &self.adopt {
            b.extend_from_slice(&e.to_bytes());
        }
        b
    }

    /// Parses a primary's `LogSync` for PG `pg` (of `pg_count` in its
    /// pool) in `epoch`: versions of this epoch or older (this epoch's:
    /// rewrites of an earlier peering attempt), never 0; entries of this
    /// PG, ascending.
    fn decode(b: &[u8], pg: PgId, pg_count: u32, epoch: u64) -> Result<LogSync, String> {
        if b.len() < 20 {
            return Err(format!("log sync of {} bytes", b.len()));
        }
        let tail = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
        let (unmark, mark) = match u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) {
            0 => (false, false),
            1 => (true, false),
            2 => (false, true),
            f => return Err(format!("log sync flags {f}")),
        };
        let b = &b[12..];
        let n = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
        let m = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
        if b.len() != 8 + n * 8 + m * 64 {
            return Err(format!("log sync of {} bytes for {n} and {m}", b.len()));
        }
        let ok = |v: u64| v != 0 && v >> 32 <= epoch;
        if tail >> 32 > epoch {
            return Err(format!("tail {tail:#x} in epoch {epoch}"));
        }
        let forget: Vec<u64> = (b[8..8 + n * 8].chunks_exact(8))
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if let Some(v) = forget.iter().find(|&&v| !ok(v)) {
            return Err(format!("forget version {v:#x} in epoch {epoch}"));
        }
        let mut adopt = Vec::with_capacity(m);
        for c in b[8 + n * 8..].chunks_exact(64) {
            let e = LogEntry::from_bytes(c).ok_or("a malformed entry")?;
            if e.pg != pg.key() || !pg.holds(e.oid, pg_count) || !ok(e.version) {
                return Err(format!("entry {e:?} is not of PG {pg} in epoch {epoch}"));
            }
            if adopt
                .last()
                .is_some_and(|l: &LogEntry| l.version >= e.version)
            {
                return Err("entries out of order".into());
            }
            adopt.push(e);
        }
        if mark && (tail != 0 || n != 0 || m != 0) {
            return Err("a mark with a log sync".into());
        }
        Ok(LogSync {
            forget,
            adopt,
            tail,
            unmark,
            mark,
        })
    }
}

/// What a PG query asks a copy for besides its log (`Header::length` of
/// the query; the objects named in its payload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Every object of the PG with its version, in pages.
    Listing,
    /// The log alone.
    Log,
    /// The versions of these objects (those the copy holds).
    Versions(Vec<ObjectId>),
    /// The objects of the PG holding an undo, with the undo's version
    /// (an erasure-coded PG's shards: `ec.rs`).
    Undos,
}

impl Ask {
    const LISTING: u32 = 0;
    const LOG: u32 = 1;
    const VERSIONS: u32 = 2;
    const UNDOS: u32 = 3;

    fn code(&self) -> u32 {
        match self {
            Ask::Listing => Ask::LISTING,
            Ask::Log => Ask::LOG,
            Ask::Versions(_) => Ask::VERSIONS,
            Ask::Undos => Ask::UNDOS,
        }
    }

    fn payload(&self) -> Option<Vec<u8>> {
        let Ask::Versions(oids) = self else {
            return None;
        };
        Some(crate::scrub::encode_oids(oids))
    }

    /// Parses a query for PG `pg` (of `pg_count` in its pool): every
    /// object it names must be of that PG.
    fn decode(code: u32, b: &[u8], pg: PgId, pg_count: u32) -> Result<Ask, String> {
        match code {
            Ask::LISTING | Ask::LOG | Ask::UNDOS if !b.is_empty() => {
                Err("a payload where none goes".into())
            }
            Ask::LISTING => Ok(Ask::Listing),
            Ask::LOG => Ok(Ask::Log),
            Ask::UNDOS => Ok(Ask::Undos),
            Ask::VERSIONS if !b.len().is_multiple_of(16) => {
                Err(format!("{} bytes of object ids", b.len()))
            }
            Ask::VERSIONS => {
                let oids = crate::scrub::decode_oids(b);
                match oids.iter().find(|&&o| !pg.holds(o, pg_count)) {
                    Some(o) => Err(format!("{o} is not of PG {pg}")),
                    None => Ok(Ask::Versions(oids)),
                }
            }
            c => Err(format!("query kind {c}")),
        }
    }
}

/// The objects whose versions may differ between a copy and the
/// authoritative copy, from their logs alone (replication.md §8.5): those
/// of every entry one log holds and the other does not. `None` when the
/// logs cannot tell: either copy is marked recovering (its objects are
/// not its log's ops applied), the authoritative log no longer holds
/// every op after the copy's newest (its tail is above the copy's head),
/// or the copy lacks an op of its newest epoch at or below that tail, so
/// objects no log names may differ; then the copies are compared object
/// by object (backfill).
///
/// Why the logs suffice otherwise. A log names every op of the PG's
/// history above its tail: ops are logged with the data they change, a
/// recovered copy takes the authoritative log and tail before its mark
/// is cleared, and only the OSD's own ops land on a copy not marked. A
/// copy not marked holds the history up to some point, every op of which
/// above its tail its log names, plus ops the history does not hold
/// (divergent: never acknowledged), which its log names too. With the
/// copy's head at or above the authority's tail, every history op the
/// copy lacks is in the authoritative log, and every op the authority
/// lacks is in the copy's: an object neither log names changed on
/// neither copy since both held the same history.
pub(crate) fn log_delta(
    copy: &PgLog,
    auth: &PgLog,
) -> Option<std::collections::BTreeSet<ObjectId>> {
    if copy.recovering || auth.recovering || copy.head() < auth.tail {
        return None;
    }
    // A copy applies the sub-ops of an epoch out of order, so it may lack
    // an op below its newest (a crash took it while a later one landed);
    // only in its newest epoch, as every earlier one ended with a peering
    // that compared it. Such a hole at or below the authority's tail is
    // named by neither log: the copy's ops of that epoch must then be
    // whole (one per sequence number) up to the authority's tail.
    let newest = copy.head() >> 32;
    let from = copy.tail.max(newest << 32);
    let upto = auth.tail.min(copy.head());
    if upto > from && copy.entries.range(from + 1..=upto).count() as u64 != upto - from {
        return None;
    }
    let only = |a: &PgLog, b: &PgLog| -> Vec<ObjectId> {
        (a.entries.iter())
            .filter(|(v, e)| b.entries.get(v) != Some(*e))
            .map(|(_, e)| e.oid)
            .collect()
    };
    let mut s: std::collections::BTreeSet<ObjectId> = only(auth, copy).into_iter().collect();
    s.extend(only(copy, auth));
    Some(s)
}

/// What a push of `oid` at `version` to OSD `to` that answered `s` means
/// for the peering: done, the OSD full, or try again.
pub(crate) fn pushed(s: Status, oid: ObjectId, version: u64, to: u32) -> Result<(), PeerError> {
    match s {
        Status::Ok => Ok(()),
        Status::NoSpace => Err(Full(format!(
            "pushing {oid} v{version:#x} to osd.{to}: {s:?}"
        ))),
        s => Err(Retry(format!(
            "pushing {oid} v{version:#x} to osd.{to}: {s:?}"
        ))),
    }
}

/// One copy's state of a PG: its log and its objects with their versions.
#[derive(Clone, Debug, Default)]
pub(crate) struct PgInfo {
    pub log: PgLog,
    pub objects: BTreeMap<ObjectId, u64>,
}

impl PgInfo {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            INFO_HEAD_BYTES + self.log.entries.len() * 64 + self.objects.len() * OBJECT_BYTES,
        );
        b.extend_from_slice(&self.log.tail.to_le_bytes());
        b.extend_from_slice(&(self.log.entries.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.objects.len() as u32).to_le_bytes());
        b.extend_from_slice(&u32::from(self.log.recovering).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        for e in self.log.entries.values() {
            b.extend_from_slice(&e.to_bytes());
        }
        for (oid, v) in &self.objects {
            b.extend_from_slice(&oid.volume.0.to_le_bytes());
            b.extend_from_slice(&oid.block.to_le_bytes());
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses a peer's answer: every entry and every object must be of PG
    /// `pg` (of `pg_count` in its pool).
    fn decode(b: &[u8], pg: PgId, pg_count: u32) -> Result<PgInfo, String> {
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        if b.len() < INFO_HEAD_BYTES {
            return Err(format!("PG info of {} bytes", b.len()));
        }
        let (tail, n, m) = (u64_at(0), u32_at(8) as usize, u32_at(12) as usize);
        if b.len() != INFO_HEAD_BYTES + n * 64 + m * OBJECT_BYTES {
            return Err(format!(
                "PG info of {} bytes for {n} entries and {m} objects",
                b.len()
            ));
        }
        let mut info = PgInfo::default();
        info.log.tail = tail;
        info.log.recovering = match (u32_at(16), u32_at(20)) {
            (0, 0) => false,
            (1, 0) => true,
            (f, p) => return Err(format!("PG info flags {f:#x} {p:#x}")),
        };
        for k in 0..n {
            let at = INFO_HEAD_BYTES + k * 64;
            let e = LogEntry::from_bytes(&b[at..at + 64])
                .filter(|e| e.pg == pg.key() && e.version > tail)
                .ok_or_else(|| format!("PG info: entry {k} is not one of this PG's"))?;
            info.log.entries.insert(e.version, e);
        }
        for k in 0..m {
            let at = INFO_HEAD_BYTES + n * 64 + k * OBJECT_BYTES;
            let oid = ObjectId::new(u64_at(at), u64_at(at + 8));
            let v = u64_at(at + 16);
            if !pg.holds(oid, pg_count) || v == 0 {
                return Err(format!(
                    "PG info: object {oid} v{v} is not one of this PG's"
                ));
            }
            info.objects.insert(oid, v);
        }
        Ok(info)
    }
}

/// Why peering did not finish in this attempt.
pub(crate) enum PeerError {
    /// Cannot finish in this epoch: wait for a new map.
    Inactive(String),
    /// May finish if tried again (a message lost, a peer slow).
    Retry(String),
    /// A copy's store has no room for what it must hold: may finish once
    /// space is freed.
    Full(String),
}

use PeerError::{Full, Inactive, Retry};

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Inactive(why) | Retry(why) | Full(why) => f.write_str(why),
        }
    }
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// This copy's log of PG `pg` and the objects `ask` asks for, once
    /// no op of `epoch` or an earlier one is in flight here.
    async fn local_info(&self, pg: PgId, epoch: u64, ask: &Ask) -> PgInfo {
        self.drain(pg, epoch).await;
        let (key, count) = (pg.key(), self.map.borrow().pg_count(pg.pool));
        let objects = match ask {
            Ask::Listing => {
                self.stats.pg_listed();
                (self.store.list().into_iter())
                    .filter(|(oid, _)| pg.holds(*oid, count))
                    .collect()
            }
            Ask::Log => BTreeMap::new(),
            Ask::Undos => (self.store.undos().into_iter())
                .filter(|(oid, _)| pg.holds(*oid, count))
                .collect(),
            Ask::Versions(oids) => (oids.iter())
                .filter_map(|&o| Some((o, self.store.version(o)?)))
                .collect(),
        };
        PgInfo {
            log: self.store.pg_log(key).unwrap_or_default(),
            objects,
        }
    }

    /// Checks that `h` comes from the primary of its PG in this OSD's
    /// epoch, learning a newer epoch first; the refusal otherwise.
    pub(crate) async fn check_peer_op(self: &Rc<Self>, h: &Header) -> Option<Status> {
        if h.epoch > self.epoch() && !self.catch_up(h.epoch).await {
            return Some(Status::Unavailable);
        }
        let map = self.map.borrow();
        if h.epoch != map.epoch() {
            return Some(Status::StaleEpoch);
        }
        if !self.sent_by_primary(&map, h) {
            return Some(Status::NotPrimary);
        }
        None
    }

    /// Sets how many objects one answer to a PG query lists (at least
    /// one; `PG_QUERY_PAGE_OBJECTS` by default). Smaller pages only make
    /// more round trips: the simulator uses them to page every listing.
    pub fn set_query_page_objects(&self, n: usize) {
        self.query_page.set(n.max(1));
    }

    pub(crate) async fn answer_query(
        self: &Rc<Self>,
        h: &Header,
        payload: Option<AlignedBuf>,
    ) -> (Header, Option<AlignedBuf>) {
        if let Some(s) = self.check_peer_op(h).await {
            let mut r = h.reply(s);
            r.epoch = self.epoch();
            return (r, None);
        }
        let count = self.map.borrow().pg_count(h.pool);
        let ask = match Ask::decode(
            h.length,
            payload.as_deref().unwrap_or(&[]),
            h.pg_id(),
            count,
        ) {
            Ok(a) => a,
            Err(why) => {
                tracing::warn!("osd.{}: PG {} query: {why}", self.id, h.pg_id());
                return (h.reply(Status::Invalid), None);
            }
        };
        // The first page, or the one after object `h.oid`.
        let after = (h.offset != 0).then_some(h.oid);
        let mut info = self.local_info(h.pg_id(), h.epoch, &ask).await;
        if let Some(a) = after {
            info.objects = info.objects.split_off(&a);
            info.objects.remove(&a);
        }
        let page = self.query_page.get();
        let more = info.objects.len() > page;
        if more {
            let cut = *info.objects.keys().nth(page).expect("more than a page");
            info.objects.split_off(&cut);
        }
        let body = info.encode();
        if body.len() > PAYLOAD_MAX_BYTES as usize {
            tracing::error!(
                "osd.{}: PG {}'s info is {} bytes, more than a frame holds",
                self.id,
                h.pg_id(),
                body.len()
            );
            return (h.reply(Status::Unavailable), None);
        }
        let mut r = h.reply(Status::Ok).with_payload(&body);
        r.obj_version = u64::from(more);
        (r, Some(AlignedBuf::from_slice(&body)))
    }

    pub(crate) async fn answer_pull(self: &Rc<Self>, h: &Header) -> (Header, Option<AlignedBuf>) {
        if let Some(s) = self.check_peer_op(h).await {
            return (h.reply(s), None);
        }
        // Only an object of the PG its primary names: a primary pulls for
        // its own PGs.
        if self.map.borrow().pg_of(h.oid) != Some(h.pg_id()) {
            return (h.reply(Status::Invalid), None);
        }
        let Some(v) = self.store.version(h.oid) else {
            return (h.reply(Status::NotFound), None);
        };
        match self.store.read(h.oid, 0, self.store.block_bytes()).await {
            // The version the bytes are of: it may have changed during the
            // read (the puller's lock covers its own copy only).
            Ok(_) if self.store.version(h.oid) != Some(v) => (h.reply(Status::Unavailable), None),
            Ok(buf) => {
                let mut r = h.reply(Status::Ok).with_payload(&buf);
                r.obj_version = v;
                (r, Some(buf))
            }
            Err(e) => {
                // The primary pulls it from another copy.
                self.note_damage(h.oid, &e);
                (h.reply(status_of(&e)), None)
            }
        }
    }

    pub(crate) async fn answer_push(
        self: &Rc<Self>,
        h: &Header,
        data: Option<AlignedBuf>,
    ) -> Status {
        if let Some(s) = self.check_peer_op(h).await {
            return s;
        }
        {
            let m = self.map.borrow();
            if !m.is_acting(h.pg_id(), self.id) {
                return Status::NotPrimary;
            }
            // A version from this epoch or an earlier one, of an object of
            // this PG.
            if m.pg_of(h.oid) != Some(h.pg_id())
                || h.obj_version == 0
                || h.obj_version >> 32 > h.epoch
            {
                return Status::Invalid;
            }
        }
        // Counted like a sub-op: a later epoch's query waits for it.
        let _inflight = self.track(h.pg_id(), h.epoch);
        if data
            .as_ref()
            .is_some_and(|d| d.len() != self.store.block_bytes() as usize)
        {
            return Status::Invalid;
        }
        let entry = (!h.unlogged).then(|| LogEntry {
            pg: h.pg_id().key(),
            version: h.obj_version,
            oid: h.oid,
            op: if data.is_some() {
                LogOp::Write
            } else {
                LogOp::Delete
            },
            offset: h.offset,
            len: h.length,
            client: h.client,
            request: crate::logged_request(h),
        });
        if h.oid.shard_index().is_some() {
            // A shard rebuilt (ec.rs `push_shard`): the version it
            // replaces rides in the range.
            if entry.is_some() {
                return Status::Invalid;
            }
            let expect = u64::from(h.offset) | u64::from(h.length) << 32;
            return (self.rebuild_shard_here(h.oid, h.obj_version, expect, data)).await;
        }
        self.apply_push(h.pg_id(), h.oid, h.obj_version, entry, data)
            .await
    }

    /// Makes shard object `oid` the given bytes (or absent) at `version`,
    /// replacing whatever this OSD holds under that name at any version
    /// (a write the PG's history does not hold may be here, at a higher
    /// one) — but only if it holds `expect` there now (0: nothing), the
    /// version the primary saw when it decided the rebuild: a push
    /// delayed past the rebuild (a frame held up) finds what writes put
    /// there since, and is refused (`Stale`); one that finds what it
    /// would leave (a retry after a lost reply) does nothing. No
    /// recovering mark here: a shard rebuilt before its PG serves is no
    /// holder until an interval with it goes active, and one rebuilt in
    /// the background was marked before (ec.rs).
    pub(crate) async fn rebuild_shard_here(
        &self,
        oid: ObjectId,
        version: u64,
        expect: u64,
        data: Option<AlignedBuf>,
    ) -> Status {
        let cur = self.store.version(oid);
        // What the push would leave is here already (its retry after a
        // lost reply: one version of a shard is one content).
        if (cur == Some(version) && data.is_some()) || (cur.is_none() && data.is_none()) {
            return Status::Ok;
        }
        if cur.unwrap_or(0) != expect {
            tracing::warn!(
                "osd.{}: a rebuild of {oid} v{version:#x} expected v{expect:#x}, found {cur:x?}: refused",
                self.id
            );
            return Status::Stale;
        }
        let mut r = match cur {
            Some(c) => match self.store.delete(oid, c).await {
                Err(nacre_blockstore::Error::NotFound(_)) => Ok(()),
                r => r,
            },
            None => Ok(()),
        };
        if let (Ok(()), Some(d)) = (&r, data) {
            r = self.store.recover(oid, version, d).await;
        }
        match r {
            Ok(()) => {
                self.stats.replaced(oid);
                Status::Ok
            }
            Err(e) => {
                tracing::warn!("osd.{}: rebuilding {oid} v{version:#x}: {e}", self.id);
                status_of(&e)
            }
        }
    }

    pub(crate) async fn answer_log_sync(
        self: &Rc<Self>,
        h: &Header,
        body: Option<&[u8]>,
    ) -> Status {
        if let Some(s) = self.check_peer_op(h).await {
            return s;
        }
        let count = {
            let m = self.map.borrow();
            // (An erasure-coded PG's peering also settles the shards that
            // placement moved out of the row: ec.rs.)
            if !m.is_acting(h.pg_id(), self.id)
                && crate::ec::last_slot(&m, h.pg_id(), self.id).is_none()
            {
                return Status::NotPrimary;
            }
            m.pg_count(h.pool)
        };
        let Ok(sync) = LogSync::decode(body.unwrap_or(&[]), h.pg_id(), count, h.epoch) else {
            return Status::Invalid;
        };
        let _inflight = self.track(h.pg_id(), h.epoch);
        self.log_sync_local(h.pg_id(), &sync).await
    }

    async fn log_sync_local(&self, pg: PgId, sync: &LogSync) -> Status {
        let key = pg.key();
        for &v in &sync.forget {
            if let Err(e) = self.store.pg_forget(key, v).await {
                tracing::warn!("osd.{}: forgetting PG {pg} v{v:#x}: {e}", self.id);
                return status_of(&e);
            }
        }
        for e in &sync.adopt {
            if let Err(err) = self.store.adopt_entry(*e).await {
                tracing::warn!("osd.{}: adopting PG {pg} v{:#x}: {err}", self.id, e.version);
                return status_of(&err);
            }
        }
        if sync.tail != 0 {
            if let Err(e) = self.store.pg_raise_tail(key, sync.tail).await {
                tracing::warn!("osd.{}: raising PG {pg}'s tail: {e}", self.id);
                return status_of(&e);
            }
        }
        if sync.mark || sync.unmark {
            if let Err(s) = self.set_recovering(pg, sync.mark).await {
                return s;
            }
        }
        Status::Ok
    }

    /// Sets (`on`) or clears this copy's recovering mark of PG `pg`
    /// ([`nacre_blockstore::PgLog::recovering`]), if it is not so already.
    async fn set_recovering(&self, pg: PgId, on: bool) -> Result<(), Status> {
        let key = pg.key();
        if self.store.pg_recovering(key) == on {
            return Ok(());
        }
        self.store.pg_mark_recovering(key, on).await.map_err(|e| {
            let what = if on { "marking" } else { "unmarking" };
            tracing::warn!("osd.{}: {what} PG {pg} recovering: {e}", self.id);
            status_of(&e)
        })
    }

    /// Makes OSD `to`'s log of PG `pg` the authoritative one (`sync`).
    pub(crate) async fn log_sync(
        self: &Rc<Self>,
        to: u32,
        pg: PgId,
        epoch: u64,
        sync: &LogSync,
    ) -> Result<(), PeerError> {
        let s = if to == self.id {
            let _inflight = self.track(pg, epoch);
            self.log_sync_local(pg, sync).await
        } else {
            let body = sync.encode();
            let mut h = Header::request(Op::LogSync, 0, ObjectId::default()).with_payload(&body);
            h = h.with_pg(pg);
            h.epoch = epoch;
            h.sender = self.id;
            let body = AlignedBuf::from_slice(&body);
            match self.call_osd(to, h, Some(&body)).await {
                Ok(f) => f.h.status,
                Err(why) => return Err(Retry(why)),
            }
        };
        if s != Status::Ok {
            return Err(Retry(format!(
                "syncing the log of osd.{to} ({} forgotten, {} adopted): {s:?}",
                sync.forget.len(),
                sync.adopt.len()
            )));
        }
        Ok(())
    }

    /// Makes this copy's `oid` the given whole object (or absent) at
    /// `version`, with `entry` logged in the same step when there is one.
    async fn apply_push(
        &self,
        pg: PgId,
        oid: ObjectId,
        version: u64,
        entry: Option<LogEntry>,
        data: Option<AlignedBuf>,
    ) -> Status {
        // Marked recovering before the first object lands: from here until
        // the log sync after the last, this copy's objects are not its
        // log's ops applied, and peering must not compare it by its log.
        let entry_given = entry.is_some();
        if let Err(s) = self.set_recovering(pg, true).await {
            return s;
        }
        // An entry older than what this copy's log keeps would be refused
        // (a store whose log slots hold fewer entries than the authority's,
        // which took more of the interval's writes than it keeps before
        // recovery came to this object): the object comes without it (the
        // copy is marked, and its log sync skips such entries too).
        let entry = entry.filter(|e| !self.store.entry_too_old(e));
        let r = match (entry, data) {
            (Some(e), Some(d)) => self.store.recover_logged(e, d).await,
            (None, Some(d)) => self.store.recover(oid, version, d).await,
            (Some(e), None) => self.store.delete_logged(e).await,
            (None, None) if entry_given => match self.store.delete(oid, version).await {
                Err(nacre_blockstore::Error::NotFound(_)) => Ok(()),
                r => r,
            },
            (None, None) => return Status::Invalid,
        };
        match r {
            Ok(()) => {
                self.stats.replaced(oid);
                Status::Ok
            }
            Err(e) => {
                tracing::warn!("osd.{}: recovery of {oid} v{version:#x}: {e}", self.id);
                status_of(&e)
            }
        }
    }

    /// Peers PG `pg` in `epoch` until it is active, or inactive, or the
    /// epoch is over.
    pub(crate) async fn peer(self: Rc<Self>, pg: PgId, epoch: u64) {
        loop {
            if self.epoch() != epoch {
                return;
            }
            match self.try_peer(pg, epoch).await {
                Ok(()) => {
                    tracing::debug!("osd.{}: PG {pg} active in epoch {epoch}", self.id);
                    self.set_pg_state(pg, epoch, PgState::Active);
                    if self.pg_recovering(pg) {
                        rt::spawn(self.clone().recover_pg(pg, epoch));
                    }
                    return;
                }
                Err(Inactive(why)) => {
                    tracing::info!("osd.{}: PG {pg} inactive in epoch {epoch}: {why}", self.id);
                    return self.set_pg_state(pg, epoch, PgState::Inactive(why));
                }
                Err(Retry(why) | Full(why)) => {
                    tracing::debug!("osd.{}: PG {pg} peering again: {why}", self.id);
                    rt::sleep(PEER_RETRY).await;
                }
            }
        }
    }

    /// OSD `id`'s log of PG `pg` and what `ask` asks for.
    async fn query(
        self: &Rc<Self>,
        id: u32,
        pg: PgId,
        epoch: u64,
        ask: &Ask,
    ) -> Result<PgInfo, String> {
        if id == self.id {
            return Ok(self.local_info(pg, epoch, ask).await);
        }
        let count = self.map.borrow().pg_count(pg.pool);
        let mut h = Header::request(Op::PgQuery, 0, ObjectId::default());
        h = h.with_pg(pg);
        h.epoch = epoch;
        h.sender = self.id;
        h.length = ask.code();
        let body = ask.payload().map(|b| AlignedBuf::from_slice(&b));
        if let Some(b) = &body {
            if b.len() > PAYLOAD_MAX_BYTES as usize {
                return Err(format!("{} objects to ask osd.{id} about", b.len() / 16));
            }
            h = h.with_payload(b);
        }
        let mut info: Option<PgInfo> = None;
        loop {
            let f = self.call_osd(id, h, body.as_ref()).await?;
            if f.h.status != Status::Ok {
                return Err(format!("osd.{id}: {:?}", f.h.status));
            }
            let page = PgInfo::decode(f.payload.as_deref().unwrap_or(&[]), pg, count)
                .map_err(|e| format!("osd.{id}: {e}"))?;
            if let Ask::Versions(oids) = ask {
                if page.objects.keys().any(|o| oids.binary_search(o).is_err()) {
                    return Err(format!("osd.{id}: versions of objects not asked about"));
                }
            }
            let i = match &mut info {
                None => info.insert(page),
                Some(i) => {
                    // Nothing lands in a PG while its primary peers it
                    // (the copy drained older ops before the first page),
                    // so the pages are one listing; check it.
                    if page.log != i.log
                        || (page.objects.keys().next())
                            .is_some_and(|o| Some(o) <= i.objects.keys().next_back())
                    {
                        return Err(format!("osd.{id}: PG {pg} changed between pages"));
                    }
                    i.objects.extend(page.objects);
                    i
                }
            };
            if f.h.obj_version == 0 {
                break;
            }
            h.oid = *(i.objects.keys().next_back())
                .ok_or_else(|| format!("osd.{id}: an empty page before the last"))?;
            h.offset = 1;
        }
        Ok(info.expect("one page at least"))
    }

    async fn try_peer(self: &Rc<Self>, pg: PgId, epoch: u64) -> Result<(), PeerError> {
        if self.scheme(pg.pool).is_some() {
            return self.try_peer_ec(pg, epoch).await;
        }
        let (acting, prior, min_size, size, members) = {
            let m = self.map.borrow();
            if !m.has(pg) {
                return Err(Inactive(format!("no PG {pg} in epoch {}", m.epoch())));
            }
            let prior = m.last_active(pg).cloned();
            // The members of the last active interval that are up with
            // the store they had then.
            let members: Vec<u32> = (prior.iter())
                .flat_map(|p| p.acting.iter().copied().filter(|&o| m.holds(p, o)))
                .collect();
            (
                m.acting(pg),
                prior,
                m.min_size(pg.pool) as usize,
                m.size(pg.pool) as usize,
                members,
            )
        };
        if acting.len() < min_size {
            return Err(Inactive(format!(
                "{} of {size} copies up, min_size {min_size}",
                acting.len()
            )));
        }
        let mut asked = acting.clone();
        if let Some(p) = &prior {
            if members.is_empty() {
                let replaced: Vec<String> = {
                    let m = self.map.borrow();
                    (p.acting.iter())
                        .filter(|&&o| m.is_up(o) && !p.incomplete.contains(&o))
                        .map(|o| format!("osd.{o}"))
                        .collect()
                };
                return Err(Inactive(format!(
                    "waiting for one of {} with the store it had when the PG was last active (epoch {}){}",
                    (p.acting.iter())
                        .filter(|o| !p.incomplete.contains(o))
                        .map(|o| format!("osd.{o}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    p.epoch,
                    if replaced.is_empty() {
                        String::new()
                    } else {
                        format!("; {} came back with a new store", replaced.join(", "))
                    }
                )));
            }
            asked.extend(members.iter().filter(|o| !acting.contains(o)));
        }
        // The logs first: they choose the authority, and say which copies
        // can be compared on the objects they name.
        let asks: Vec<(u32, Ask)> = asked.iter().map(|&id| (id, Ask::Log)).collect();
        let mut infos = HashMap::new();
        for (id, _, r) in self.query_each(pg, epoch, asks).await {
            match r {
                Ok(i) => {
                    infos.insert(id, i);
                }
                // Every member of the acting set is recovered, so every
                // one must answer.
                Err(why) if acting.contains(&id) => return Err(Retry(why)),
                Err(_) => {}
            }
        }
        if self.epoch() != epoch {
            return Err(Retry("the epoch moved".into()));
        }
        let auth = (infos.iter())
            .filter(|(id, _)| prior.is_none() || members.contains(id))
            // Any complete member holds every acknowledged write; one in
            // the acting set takes the interval's writes and can be the
            // source of background recovery (one moved away would make
            // this OSD recover itself first), then the newest history.
            .max_by_key(|(&id, i)| {
                (
                    acting.contains(&id),
                    i.log.head(),
                    id == self.id,
                    std::cmp::Reverse(id),
                )
            })
            .map(|(&id, _)| id)
            .ok_or_else(|| Retry("no member of the last active interval answered".into()))?;
        let recovery::Finished {
            mut wants,
            rewrite,
            behind,
        } = (self.compare(pg, epoch, auth, &acting, &mut infos))
            .await?
            .finish();
        let a = &infos[&auth];
        // A copy that lacks no object takes the authoritative log now; the
        // others once recovery brought them every object.
        let mut left: BTreeMap<u32, (usize, LogSync)> = BTreeMap::new();
        for w in wants.values() {
            for &c in &w.to {
                left.entry(c).or_default().0 += 1;
            }
        }
        // Those, and the copies that lack only objects rewritten below, are
        // marked recovering before anything of this interval lands on them
        // (a rewrite below, a push, a client write once the PG serves): an
        // entry of this epoch in the log of a copy whose objects are not
        // its log's ops applied would let a later peering (this one cut
        // short) compare it by its log and leave it without what it lacks
        // (`log_delta`).
        let marked: BTreeSet<u32> = left.keys().copied().chain(behind).collect();
        for &c in &marked {
            self.log_sync(c, pg, epoch, &LogSync::mark()).await?;
        }
        for oid in rewrite {
            let data = match a.objects.get(&oid) {
                Some(&va) => Some(self.fetch(auth, pg, epoch, oid, va).await?),
                None => None,
            };
            self.rewrite(pg, epoch, &acting, oid, data).await?;
        }
        for &c in acting.iter().filter(|&&c| c != auth) {
            let sync = LogSync::between(&infos[&c].log, &a.log);
            match left.get_mut(&c) {
                // It gets objects (so it is marked recovering): its sync
                // clears the mark.
                Some((_, s)) => {
                    *s = LogSync {
                        unmark: true,
                        ..sync
                    }
                }
                // Marked, it lacked only rewritten objects: whole now.
                None if marked.contains(&c) => {
                    let sync = LogSync {
                        unmark: true,
                        ..sync
                    };
                    self.log_sync(c, pg, epoch, &sync).await?
                }
                None if !sync.is_empty() => self.log_sync(c, pg, epoch, &sync).await?,
                None => {}
            }
        }
        // The PG goes active with at least `min_size` complete copies (so
        // one more lost disk never takes the only copy of an object), one
        // of them the source of background recovery, a member that takes
        // every write of the interval: the authority if it is in the acting
        // set, else this OSD. Copies short of that are recovered now, this
        // OSD first, then those that lack least.
        let complete = |left: &BTreeMap<u32, (usize, LogSync)>| {
            acting.iter().filter(|c| !left.contains_key(c)).count()
        };
        let source = if acting.contains(&auth) {
            auth
        } else {
            self.id
        };
        let mut now: Vec<u32> = Vec::new();
        if left.contains_key(&source) {
            now.push(source);
        }
        let mut rest: Vec<(usize, u32)> = (left.iter())
            .filter(|(&c, _)| c != source)
            .map(|(&c, (n, _))| (*n, c))
            .collect();
        rest.sort_unstable();
        let short = min_size.saturating_sub(complete(&left) + now.len());
        now.extend(rest.iter().take(short).map(|&(_, c)| c));
        for c in now {
            for (&oid, w) in wants.iter_mut().filter(|(_, w)| w.to.contains(&c)) {
                let data = match w.delete {
                    true => None,
                    false => Some(self.fetch(auth, pg, epoch, oid, w.version).await?),
                };
                (self.push(c, pg, epoch, oid, w.version, w.entry, data.as_ref())).await?;
                w.to.retain(|&t| t != c);
            }
            let (_, sync) = left.remove(&c).expect("an incomplete copy");
            if !sync.is_empty() {
                self.log_sync(c, pg, epoch, &sync).await?;
            }
        }
        wants.retain(|_, w| !w.to.is_empty());
        assert!(
            !nacre_blockstore::strict() || (complete(&left) >= min_size && !left.contains_key(&source)),
            "PG {pg} goes active with {} complete copies (min_size {min_size}), source osd.{source}",
            complete(&left)
        );
        if self.epoch() != epoch {
            return Err(Retry("the epoch moved".into()));
        }
        let incomplete: Vec<u32> = left.keys().copied().collect();
        let clean = self.map.borrow().whole(pg) && incomplete.is_empty();
        let heard = infos.keys().copied().collect();
        let ev = PgEvent::Active {
            clean,
            incomplete,
            heard,
        };
        self.report(pg, epoch, &ev).await.map_err(Retry)?;
        // A peering of a later epoch may have run while the report was
        // out: its plan and request cache are the ones that count.
        if self.epoch() != epoch {
            return Err(Retry("the epoch moved".into()));
        }
        // Retries of requests the authoritative history holds are
        // answered from it, whichever primary took them; no other request
        // is (a request of a divergent op must be applied again).
        self.done.borrow_mut().insert(pg, ReqCache::of_log(&a.log));
        if !wants.is_empty() {
            let total = left.values().map(|(n, _)| n).sum();
            self.keep_plan(
                pg,
                Recovery {
                    epoch,
                    source,
                    wants,
                    left,
                    total,
                    stalled: false,
                    ec: None,
                },
            );
        }
        Ok(())
    }

    /// Asks each OSD for its log of PG `pg` and what its [`Ask`] says, at
    /// once; the answers, with what was asked.
    pub(crate) async fn query_each(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        asks: Vec<(u32, Ask)>,
    ) -> Vec<(u32, Ask, Result<PgInfo, String>)> {
        let queries: Vec<_> = (asks.into_iter())
            .map(|(id, ask)| {
                let me = self.clone();
                rt::spawn(async move {
                    let r = me.query(id, pg, epoch, &ask).await;
                    (id, ask, r)
                })
            })
            .collect();
        rt::join_all(queries).await
    }

    /// What each copy of `acting` lacks of `auth`'s, and what diverged
    /// (`infos` holds every copy's log; the objects asked for are added).
    /// A copy whose log overlaps the authority's is compared on the
    /// objects the two logs name ([`log_delta`]): a copy that was down
    /// briefly costs its log and a few versions, not a listing. The others
    /// are compared object by object on listings of every object
    /// (backfill; the authority's too then). Under `strict` the log-only
    /// comparisons are checked against listings of both copies.
    async fn compare(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        auth: u32,
        acting: &[u32],
        infos: &mut HashMap<u32, PgInfo>,
    ) -> Result<recovery::Plan, PeerError> {
        let mut listed: Vec<u32> = Vec::new();
        let mut by_log: Vec<(u32, Vec<ObjectId>)> = Vec::new();
        for &c in acting.iter().filter(|&&c| c != auth) {
            let delta = log_delta(&infos[&c].log, &infos[&auth].log);
            match delta {
                Some(s) => by_log.push((c, s.into_iter().collect())),
                None => listed.push(c),
            }
        }
        (self.stats).compared(by_log.len() as u64, listed.len() as u64);
        let check = nacre_blockstore::strict() && !by_log.is_empty();
        let mut to_list = listed.clone();
        if check {
            to_list.extend(by_log.iter().map(|(c, _)| *c));
        }
        let auth_listed = !to_list.is_empty();
        if auth_listed {
            to_list.push(auth);
        }
        let mut asks: Vec<(u32, Ask)> = (to_list.iter()).map(|&c| (c, Ask::Listing)).collect();
        let union: std::collections::BTreeSet<ObjectId> = (by_log.iter())
            .flat_map(|(_, s)| s.iter().copied())
            .collect();
        if !auth_listed && !union.is_empty() {
            asks.push((auth, Ask::Versions(union.into_iter().collect())));
        }
        // Under `check`, a log member is asked twice: its versions land
        // apart from its listing.
        let mut versions: HashMap<u32, BTreeMap<ObjectId, u64>> = HashMap::new();
        for (c, s) in by_log.iter().filter(|(_, s)| !s.is_empty()) {
            asks.push((*c, Ask::Versions(s.clone())));
        }
        for (id, ask, r) in self.query_each(pg, epoch, asks).await {
            let got = r.map_err(Retry)?;
            // Nothing lands in a PG while its primary peers it.
            if got.log != infos[&id].log {
                return Err(Retry(format!("osd.{id}: PG {pg} changed while it peered")));
            }
            if matches!(ask, Ask::Versions(_)) && id != auth {
                versions.insert(id, got.objects);
            } else {
                infos.get_mut(&id).expect("asked for its log").objects = got.objects;
            }
        }
        if self.epoch() != epoch {
            return Err(Retry("the epoch moved".into()));
        }
        let a = &infos[&auth];
        let mut plan = recovery::Plan::default();
        for c in &listed {
            plan.compare(&a.log, &a.objects, *c, &infos[c].objects, &infos[c].log);
        }
        let none = BTreeMap::new();
        for (c, s) in &by_log {
            let mine = versions.get(c).unwrap_or(&none);
            let theirs: BTreeMap<ObjectId, u64> = (s.iter())
                .filter_map(|o| Some((*o, *a.objects.get(o)?)))
                .collect();
            if check {
                self.check_log_delta(pg, *c, s, &a.objects, &infos[c].objects);
            }
            plan.compare(&a.log, &theirs, *c, mine, &infos[c].log);
        }
        Ok(plan)
    }

    /// Under `strict`: every object whose version differs between copy
    /// `c` and the authority (`listing`s of both) must be among those
    /// their logs named (`named`, sorted); one that is not is counted
    /// (`OsdReport::log_delta_misses`; the simulator requires none).
    fn check_log_delta(
        &self,
        pg: PgId,
        c: u32,
        named: &[ObjectId],
        auth: &BTreeMap<ObjectId, u64>,
        copy: &BTreeMap<ObjectId, u64>,
    ) {
        let keys: std::collections::BTreeSet<&ObjectId> = auth.keys().chain(copy.keys()).collect();
        for oid in keys {
            if auth.get(oid) != copy.get(oid) && named.binary_search(oid).is_err() {
                tracing::error!(
                    "osd.{}: PG {pg}: {oid} is at {:?} on the authority and {:?} on osd.{c}, which the logs did not say",
                    self.id,
                    auth.get(oid),
                    copy.get(oid)
                );
                self.stats.log_delta_missed();
            }
        }
    }

    /// The whole of `oid` at `version` from OSD `from`, else from another
    /// member of the acting set that holds that version: one version names
    /// one content, so a damaged copy at `from` stalls neither peering nor
    /// recovery. A damaged copy here is repaired with what was found.
    pub(crate) async fn fetch(
        self: &Rc<Self>,
        from: u32,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
        version: u64,
    ) -> Result<AlignedBuf, PeerError> {
        match self.fetch_copy(from, pg, epoch, oid, version).await {
            Ok(d) => Ok(d),
            Err((e, damaged_here)) => {
                let found = self.fetch_elsewhere(pg, epoch, oid, version, from, damaged_here);
                found.await.ok_or(e)
            }
        }
    }

    /// `oid` at `version` from a member of PG `pg`'s acting set other than
    /// OSD `but`, the first that has it whole; with `repair` (a read
    /// found this OSD's copy at that version damaged), this OSD's copy is
    /// rewritten with it.
    pub(crate) async fn fetch_elsewhere(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
        version: u64,
        but: u32,
        repair: bool,
    ) -> Option<AlignedBuf> {
        let others: Vec<u32> = (self.map.borrow().acting(pg).into_iter())
            .filter(|&o| o != but)
            .collect();
        for o in others {
            match self.fetch_copy(o, pg, epoch, oid, version).await {
                Ok(d) => {
                    if repair {
                        (self.repair(oid, version, AlignedBuf::from_slice(&d), o)).await;
                    }
                    return Some(d);
                }
                Err((e, _)) => tracing::warn!("osd.{}: PG {pg}: {e}", self.id),
            }
        }
        None
    }

    /// The whole of `oid` at `version` from OSD `from`'s copy; failing,
    /// also whether `from` is this OSD and the read found its copy damaged.
    pub(crate) async fn fetch_copy(
        self: &Rc<Self>,
        from: u32,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
        version: u64,
    ) -> Result<AlignedBuf, (PeerError, bool)> {
        if from == self.id {
            if self.store.version(oid) != Some(version) {
                return Err((Retry(format!("{oid} changed here during peering")), false));
            }
            return match self.store.read(oid, 0, self.store.block_bytes()).await {
                Ok(d) => Ok(d),
                Err(e) => {
                    let damaged = self.note_damage(oid, &e);
                    Err((Retry(format!("reading {oid}: {e}")), damaged))
                }
            };
        }
        let mut h = Header::request(Op::Pull, 0, oid);
        h = h.with_pg(pg);
        h.epoch = epoch;
        h.sender = self.id;
        let f = (self.call_osd(from, h, None).await).map_err(|e| (Retry(e), false))?;
        match (f.h.status, f.payload) {
            (Status::Ok, Some(d)) if f.h.obj_version == version => Ok(d),
            (s, _) => Err((
                Retry(format!(
                    "pulling {oid} v{version:#x} from osd.{from}: {s:?} v{:#x}",
                    f.h.obj_version
                )),
                false,
            )),
        }
    }

    /// Pushes `oid` at `version` (the whole object, or absent) to OSD `to`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn push(
        self: &Rc<Self>,
        to: u32,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
        version: u64,
        entry: Option<LogEntry>,
        data: Option<&AlignedBuf>,
    ) -> Result<(), PeerError> {
        let s = if to == self.id {
            let _inflight = self.track(pg, epoch);
            let data = data.map(|d| AlignedBuf::from_slice(d));
            self.apply_push(pg, oid, version, entry, data).await
        } else {
            let mut h = Header::request(Op::Push, entry.map_or(0, |e| e.request), oid);
            if let Some(d) = data {
                h = h.with_payload(d);
            }
            h = h.with_pg(pg);
            h.epoch = epoch;
            h.sender = self.id;
            h.obj_version = version;
            h.unlogged = entry.is_none();
            if let Some(e) = entry {
                h.offset = e.offset;
                h.length = e.len;
                h.client = e.client;
            }
            match self.call_osd(to, h, data).await {
                Ok(f) => f.h.status,
                Err(why) => return Err(Retry(why)),
            }
        };
        pushed(s, oid, version, to)
    }

    /// Writes `oid` as `data` (or deletes it) on every member of `acting`
    /// at a new version of `epoch`: what undoes a divergent write.
    pub(crate) async fn rewrite(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        acting: &[u32],
        oid: ObjectId,
        data: Option<AlignedBuf>,
    ) -> Result<(), PeerError> {
        if self.epoch() != epoch {
            return Err(Retry("the epoch moved".into()));
        }
        let version = self
            .next_version(pg, epoch)
            .ok_or_else(|| Inactive(format!("no version left for PG {pg} in epoch {epoch}")))?;
        let bb = self.store.block_bytes();
        let entry = LogEntry {
            pg: pg.key(),
            version,
            oid,
            op: if data.is_some() {
                LogOp::Write
            } else {
                LogOp::Delete
            },
            offset: 0,
            len: if data.is_some() { bb } else { 0 },
            client: 0,
            request: 0,
        };
        let mut sub = Header::request(
            if data.is_some() {
                Op::RepWrite
            } else {
                Op::RepDelete
            },
            0,
            oid,
        );
        if let Some(d) = &data {
            sub = sub.with_payload(d);
            sub.length = bb;
        }
        sub = sub.with_pg(pg);
        sub.epoch = epoch;
        sub.obj_version = version;
        sub.sender = self.id;
        tracing::info!(
            "osd.{}: PG {pg}: {oid} diverged; rewritten as v{version:#x}",
            self.id
        );
        let _inflight = self.track(pg, epoch);
        match self.replicate(acting, sub, entry, data).await {
            Status::Ok => Ok(()),
            s => Err(Retry(format!("rewriting {oid}: {s:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Block `b` of a volume of pool 1.
    fn obj(b: u64) -> ObjectId {
        ObjectId {
            volume: nacre_types::VolumeId::new(1, 1),
            block: b,
        }
    }

    fn pg(pg: u32) -> PgId {
        PgId::new(1, pg)
    }

    fn entry(pg: u64, version: u64, oid: ObjectId) -> LogEntry {
        LogEntry {
            pg,
            version,
            oid,
            op: LogOp::Write,
            offset: 0,
            len: 4096,
            client: 7,
            request: version,
        }
    }

    /// A PG info survives the wire, and a malformed or foreign one is
    /// refused with a reason (never a panic).
    #[test]
    fn pg_info_roundtrips_and_refuses_what_is_not_its_pg() {
        let count = 8;
        let oid = (0..)
            .map(obj)
            .find(|o| PgId::of(*o, count) == pg(3))
            .unwrap();
        let other = (0..)
            .map(obj)
            .find(|o| PgId::of(*o, count) != pg(3))
            .unwrap();
        let key = pg(3).key();
        let mut info = PgInfo::default();
        info.log.tail = 4;
        info.log.recovering = true;
        info.log.entries.insert(9, entry(key, 9, oid));
        info.objects.insert(oid, 9);
        let b = info.encode();
        let back = PgInfo::decode(&b, pg(3), count).unwrap();
        assert_eq!(
            (back.log, back.objects),
            (info.log.clone(), info.objects.clone())
        );
        // Flags it does not know.
        for at in [16, 20] {
            let mut bad = b.clone();
            bad[at] = 2;
            assert!(PgInfo::decode(&bad, pg(3), count).is_err());
        }
        // Short, long, and counts that do not match the length.
        assert!(PgInfo::decode(&b[..10], pg(3), count).is_err());
        assert!(PgInfo::decode(&b[..b.len() - 1], pg(3), count).is_err());
        let mut more = b.clone();
        more.push(0);
        assert!(PgInfo::decode(&more, pg(3), count).is_err());
        // An entry of another PG, or at or below the tail.
        assert!(PgInfo::decode(&b, pg(4), count).is_err());
        let mut old = info.clone();
        old.log.entries = [(3, entry(key, 3, oid))].into();
        assert!(PgInfo::decode(&old.encode(), pg(3), count).is_err());
        // An object of another PG, or at version 0.
        let mut foreign = info.clone();
        foreign.objects.insert(other, 5);
        assert!(PgInfo::decode(&foreign.encode(), pg(3), count).is_err());
        let mut zero = info;
        zero.objects.insert(oid, 0);
        assert!(PgInfo::decode(&zero.encode(), pg(3), count).is_err());
    }

    /// A copy's log is made the authoritative one: what it holds above
    /// the authoritative tail and the authority lacks is forgotten, what
    /// the authority holds above the copy's tail and it lacks is adopted;
    /// the sync survives the wire and a malformed one is refused.
    #[test]
    fn log_sync_makes_a_copy_the_authoritative_log_and_refuses_bad_input() {
        let count = 8;
        let oid = (0..)
            .map(obj)
            .find(|o| PgId::of(*o, count) == pg(3))
            .unwrap();
        let key = pg(3).key();
        let e = |v: u64| entry(key, (2 << 32) | v, oid);
        let log = |tail: u64, vs: &[u64]| PgLog {
            entries: vs.iter().map(|&v| (e(v).version, e(v))).collect(),
            tail,
            recovering: false,
        };
        let auth = log(e(2).version, &[3, 5, 6]);
        // Copy (being recovered): 1 (below the authority's tail), 3
        // (shared), 4 (divergent), 5 with another request at its version
        // (divergent).
        let mut copy = log(0, &[1, 3, 4]);
        copy.recovering = true;
        let other5 = LogEntry {
            request: 99,
            ..e(5)
        };
        copy.entries.insert(other5.version, other5);
        let sync = LogSync::between(&copy, &auth);
        assert_eq!(sync.forget, vec![e(4).version, e(5).version]);
        assert_eq!(sync.adopt, vec![e(5), e(6)]);
        // It takes the authority's tail (1 goes) and loses its mark.
        assert_eq!((sync.tail, sync.unmark), (e(2).version, true));
        assert!(LogSync::between(&auth, &auth).is_empty());
        let b = sync.encode();
        assert_eq!(LogSync::decode(&b, pg(3), count, 2).unwrap(), sync);
        // Short, long, from a later epoch, of another PG, version 0, out
        // of order.
        assert!(LogSync::decode(&b[..19], pg(3), count, 2).is_err());
        let mut flags = b.clone();
        flags[8] = 2;
        assert!(LogSync::decode(&flags, pg(3), count, 2).is_err());
        let late = LogSync {
            tail: 3 << 32,
            ..LogSync::default()
        };
        assert!(LogSync::decode(&late.encode(), pg(3), count, 2).is_err());
        // A mark goes alone.
        let mark = LogSync::mark();
        assert!(!mark.is_empty());
        assert_eq!(LogSync::decode(&mark.encode(), pg(3), count, 2), Ok(mark));
        let mixed = LogSync {
            mark: true,
            ..sync.clone()
        };
        assert!(LogSync::decode(&mixed.encode(), pg(3), count, 2).is_err());
        assert!(LogSync::decode(&b[..b.len() - 1], pg(3), count, 2).is_err());
        assert!(LogSync::decode(&b, pg(3), count, 1).is_err());
        assert!(LogSync::decode(&b, pg(4), count, 2).is_err());
        let zero = LogSync {
            forget: vec![0],
            ..LogSync::default()
        };
        assert!(LogSync::decode(&zero.encode(), pg(3), count, 2).is_err());
        let unordered = LogSync {
            adopt: vec![e(6), e(5)],
            ..LogSync::default()
        };
        assert!(LogSync::decode(&unordered.encode(), pg(3), count, 2).is_err());
    }

    /// A query asks for a listing, the log, or versions of objects of its
    /// PG; anything else is refused.
    #[test]
    fn queries_name_what_they_ask_and_only_objects_of_their_pg() {
        let count = 8;
        let of = |pg: PgId| -> Vec<ObjectId> {
            (0..)
                .map(obj)
                .filter(|o| PgId::of(*o, count) == pg)
                .take(3)
                .collect()
        };
        for ask in [Ask::Listing, Ask::Log, Ask::Versions(of(pg(3))), Ask::Undos] {
            let b = ask.payload().unwrap_or_default();
            assert_eq!(Ask::decode(ask.code(), &b, pg(3), count), Ok(ask));
        }
        let mut mixed = of(pg(3));
        mixed.push(of(pg(4))[0]);
        let b = Ask::Versions(mixed).payload().unwrap();
        assert!(Ask::decode(Ask::VERSIONS, &b, pg(3), count).is_err());
        assert!(Ask::decode(Ask::VERSIONS, &b[..15], pg(3), count).is_err());
        assert!(Ask::decode(Ask::LOG, &b, pg(3), count).is_err());
        assert!(Ask::decode(Ask::UNDOS, &b, pg(3), count).is_err());
        assert!(Ask::decode(4, &[], pg(3), count).is_err());
    }

    /// The objects two logs may disagree on: those of every entry one
    /// holds and the other does not (below the authority's tail too);
    /// none to say when a copy is marked recovering, the authority's log
    /// starts after the copy's newest entry, or the copy lacks an op of
    /// its newest epoch at or below the authority's tail.
    #[test]
    fn log_delta_names_what_two_logs_disagree_on() {
        let o = |b: u64| ObjectId::new(1, b);
        let v = |s: u64| (2 << 32) | s;
        let e = |s: u64, b: u64| entry(1, v(s), o(b));
        let log = |tail: u64, es: &[LogEntry]| PgLog {
            entries: es.iter().map(|e| (e.version, *e)).collect(),
            tail,
            recovering: false,
        };
        let auth = log(v(10), &[e(11, 1), e(12, 2), e(14, 4), e(15, 1)]);
        // Down after 12; 13 diverged; 9 and 10 (below the authority's
        // tail) may have diverged for all the authority can tell.
        let copy = log(v(8), &[e(9, 9), e(10, 8), e(11, 1), e(12, 2), e(13, 3)]);
        let d = log_delta(&copy, &auth).unwrap();
        assert_eq!(
            d.into_iter().collect::<Vec<_>>(),
            vec![o(1), o(3), o(4), o(8), o(9)]
        );
        assert!(log_delta(&auth, &auth).unwrap().is_empty());
        // Another op at a shared version.
        let other = log(v(10), &[e(11, 1), e(12, 7)]);
        assert!(log_delta(&other, &auth).unwrap().contains(&o(7)));
        // The authority trimmed past the copy's newest: no overlap.
        assert_eq!(log_delta(&log(v(7), &[e(8, 8)]), &auth), None);
        // A copy at the authority's tail still overlaps (nothing between).
        assert!(log_delta(&log(v(9), &[e(10, 8)]), &auth).is_some());
        // A hole at or below the authority's tail: no one names its op.
        let holed = log(v(8), &[e(9, 9), e(11, 1), e(12, 2)]);
        assert_eq!(log_delta(&holed, &auth), None);
        // One above it is named by the authority's log.
        let above = log(v(9), &[e(10, 8), e(12, 2)]);
        assert!(log_delta(&above, &auth).unwrap().contains(&o(1)));
        // Marked recovering: its objects are not its log's ops applied.
        let mut marked = copy.clone();
        marked.recovering = true;
        assert_eq!(log_delta(&marked, &auth), None);
        let mut marked_auth = auth.clone();
        marked_auth.recovering = true;
        assert_eq!(log_delta(&copy, &marked_auth), None);
    }
}
