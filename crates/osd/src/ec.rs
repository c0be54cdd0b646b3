//! Erasure-coded PGs (docs/internals/ec.md): the shards' side of the shard
//! ops, the primary's reads and writes, peering, and the plan of the
//! shards rebuilt in the background.
//!
//! The OSD at slot `s` of a PG's row holds shard `s` of each of its
//! objects, stored as `oid.shard(s)`. A read gathers the ranges
//! [`Layout::data_ranges`] names from the data shards. A write of version
//! `v` goes to every shard: the data shards it touches get their new bytes
//! and the parity shards the parity delta, both as undoable writes (each
//! shard keeps what it replaced until the write committed), the others the
//! log entry alone; it is acknowledged once every shard has it, and then
//! the shards release their undos (`Op::ShardCommit`). A delete deletes
//! every shard, logged. A shard that is down misses ops (degraded: a read
//! rebuilds its ranges from `k` others, the parity carries its writes); so
//! does one whose read fails (damaged bytes).
//!
//! Peering counts the shards that *hold*: up in the slots, and with the
//! stores, they had as complete members of the last active interval —
//! each has every acknowledged op, so an op some holders lack was never
//! acknowledged: a write is rolled back from the undos of the holders
//! that prepared it, a delete rolled forward. With `min_size` shards up
//! and `k` holders (or holders placement moved out of the row, as
//! sources), every other shard up (stale) is rebuilt from `k` holders —
//! the objects its log says it missed, or every object (backfill) — and
//! takes their log: before the PG goes active until `k + 1` shards are
//! complete, the rest marked recovering and rebuilt in the background
//! (`recovery::ShardRebuild`: reads go around a stale shard's planned
//! objects, writes rebuild them first). Only once the PG is active are
//! the undos of the writes every shard holds released. Otherwise the PG
//! stays inactive and says why. A listing (a shrink's) is the union of the
//! complete shards' (`Op::ShardList`); an object's version, for a
//! conditional op, its shards' newest. Scrub: `scrub` (below).

use std::collections::BTreeMap;
use std::rc::Rc;

use nacre_blockstore::{LogEntry, LogOp, PgLog};
use nacre_ec::{Codec, Layout};
use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_net::Transport;
use nacre_types::{ObjectId, PgId};
use nacre_wire::{Header, Op, Status, SETTLE_DELETE, SETTLE_ROLL_BACK, SHARD_COMMIT_ENTRY_BYTES};

use crate::peering::{Ask, PeerError};

mod scrub;
use crate::{status_of, Osd, PgEvent, ReqCache};

/// What makes two shards' entries at one version the same op: the object,
/// the op and the request. A rollback's (client 0) is a write on every
/// shard, whatever each did (a shard whose undo said the object was new
/// deleted it, the others logged it alone).
fn same_op(e: &LogEntry) -> (ObjectId, LogOp, u64, u64) {
    let op = if e.client == 0 { LogOp::Write } else { e.op };
    (e.oid.whole(), op, e.client, e.request)
}

/// An EC pool's code and layout.
pub(crate) struct Scheme {
    pub layout: Layout,
    pub codec: Codec,
}

/// A PG's committed writes whose shards are still to be told
/// ([`Osd::queue_commit`]).
#[derive(Default)]
pub(crate) struct Commits {
    epoch: u64,
    to: Vec<u32>,
    writes: Vec<(ObjectId, u64)>,
    /// A task is sending them.
    sending: bool,
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// The code and layout of pool `pool`, if it is erasure-coded (made
    /// once per pool).
    pub(crate) fn scheme(&self, pool: u32) -> Option<Rc<Scheme>> {
        let (e, shard) = {
            let m = self.map.borrow();
            let r = &m.pools.get(&pool)?.record;
            (r.ec?, r.shard_bytes())
        };
        if let Some(s) = self.schemes.borrow().get(&pool) {
            return Some(s.clone());
        }
        let (k, m) = (usize::from(e.k), usize::from(e.m));
        let made = Layout::new(k, m, shard).and_then(|layout| {
            Ok(Scheme {
                layout,
                codec: Codec::new(k, m)?,
            })
        });
        match made {
            Ok(s) => {
                let s = Rc::new(s);
                self.schemes.borrow_mut().insert(pool, s.clone());
                Some(s)
            }
            Err(e) => {
                tracing::error!("osd.{}: pool {pool}: {e}", self.id);
                None
            }
        }
    }

    /// This OSD's slot in PG `pg`'s row.
    fn slot(&self, pg: PgId) -> Option<u8> {
        let m = self.map.borrow();
        let s = m.placement(pg).iter().position(|&o| o == self.id)?;
        u8::try_from(s).ok()
    }

    /// Checks a shard op from the primary: this epoch, the PG's primary
    /// sending, the object in the PG, and the shard this OSD's slot — but
    /// a read, which a peering may send to an OSD that held a shard of the
    /// PG before it moved (a source for rebuilding), names any shard of
    /// the PG: it is answered with what this store holds under that name.
    pub(crate) fn check_shard_route(&self, h: &Header) -> Option<Status> {
        let map = self.map.borrow();
        if h.epoch != map.epoch() {
            return Some(Status::StaleEpoch);
        }
        // (A listing names a PG of its volume's pool and any block.)
        let pg_ok = match h.op {
            Op::ShardList => h.oid.pool() == h.pool && h.pg < map.pg_count(h.pool),
            _ => map.pg_of(h.oid) == Some(h.pg_id()),
        };
        if !pg_ok || self.scheme(h.pool).is_none() {
            return Some(Status::Invalid);
        }
        if !self.sent_by_primary(&map, h) {
            return Some(Status::NotPrimary);
        }
        if h.op == Op::ShardRead {
            return h.oid.shard_index().is_none().then_some(Status::Invalid);
        }
        let pg = h.pg_id();
        let now = (map.is_acting(pg, self.id))
            .then(|| self.slot(pg))
            .flatten();
        // A settle also reaches a shard that placement moved out of the row
        // (a source of the peering), by the slot it held.
        let before = (h.op == Op::ShardSettle)
            .then(|| last_slot(&map, pg, self.id))
            .flatten();
        drop(map);
        let shard = h.oid.shard_index();
        let shard_ok = match h.op {
            Op::ShardCommit | Op::ShardList => now.is_some() && shard.is_none(),
            _ => shard.is_some() && (shard == now || shard == before),
        };
        if now.is_none() && !shard_ok {
            return Some(Status::NotPrimary);
        }
        let version_ok = match h.op {
            Op::ShardWrite | Op::ShardDelete => h.obj_version >> 32 == h.epoch,
            // A rollback is a write of this interval; a delete rolled
            // forward keeps the version it was given.
            Op::ShardSettle => match h.offset {
                // Of this interval, or of an earlier one whose rollback a
                // crash or a map change cut short (completed as begun).
                SETTLE_ROLL_BACK => {
                    h.client == 0 && h.obj_version >> 32 <= h.epoch && h.request_id < h.obj_version
                }
                SETTLE_DELETE => h.obj_version != 0 && h.obj_version >> 32 <= h.epoch,
                _ => false,
            },
            _ => true,
        };
        (!shard_ok || !version_ok).then_some(Status::Invalid)
    }

    /// `Op::ShardRead`: the range of this shard, and its version.
    /// Damaged bytes are counted (`Osd::note_damage`) and answered
    /// `Corrupt`: the primary reads around this shard, and a scrub
    /// rewrites it.
    pub(crate) async fn answer_shard_read(
        self: &Rc<Self>,
        h: &Header,
    ) -> (Header, Option<AlignedBuf>) {
        match self.store.read(h.oid, h.offset, h.length).await {
            Ok(buf) => {
                let mut r = h.reply(Status::Ok).with_payload(&buf);
                r.obj_version = self.store.version(h.oid).unwrap_or(0);
                (r, Some(buf))
            }
            Err(e) => {
                self.note_damage(h.oid, &e);
                (h.reply(status_of(&e)), None)
            }
        }
    }

    /// `Op::DirectRead`: a client's read of a range of one data shard,
    /// answered by this shard alone only where the primary's read would
    /// return the same bytes (docs/internals/ec.md *Reading a shard
    /// directly*): in this OSD's epoch, at this OSD's slot, named complete
    /// by the primary in this epoch, under the read lease (the leader
    /// records no later interval before a lease given in an older epoch
    /// ended), the PG's log not marked recovering, and the object settled
    /// before and after the read (a write or delete that landed here and
    /// is not known committed on every shard could still be undone by the
    /// next peering). Anything else is refused, and the client asks the
    /// primary: `NotPrimary` where this OSD does not serve the PG's direct
    /// reads now (it skips the PG a while), `Unavailable` where the object
    /// or the lease is the reason.
    pub(crate) async fn answer_direct_read(
        self: &Rc<Self>,
        h: &Header,
    ) -> Result<AlignedBuf, Status> {
        let scheme = self.scheme(h.pool).ok_or(Status::Invalid)?;
        let pg = h.pg_id();
        {
            let m = self.map.borrow();
            if m.pg_of(h.oid) != Some(pg) || h.oid.shard_index().is_some() {
                return Err(Status::Invalid);
            }
            if h.epoch != m.epoch() {
                return Err(Status::StaleEpoch);
            }
        }
        let ranges =
            (scheme.layout.data_ranges(h.offset, h.length)).map_err(|_| Status::Invalid)?;
        let [r] = ranges[..] else {
            return Err(Status::Invalid);
        };
        if self.slot(pg) != Some(r.shard as u8) || !self.map.borrow().is_acting(pg, self.id) {
            return Err(Status::Invalid);
        }
        let soid = h.oid.shard(r.shard as u8);
        // Not this PG's now (the client skips it a while), or not this
        // object's now.
        let may = || {
            if self.epoch() != h.epoch {
                Err(Status::StaleEpoch)
            } else if self.serving.borrow().get(&pg) != Some(&h.epoch)
                || self.store.pg_recovering(pg.key())
            {
                Err(Status::NotPrimary)
            } else if !self.holds_read_lease()
                || !self.store.settled(soid)
                || self.deleting.borrow().contains_key(&soid)
            {
                Err(Status::Unavailable)
            } else {
                Ok(())
            }
        };
        may()?;
        let read = self.store.read(soid, r.offset, r.len).await;
        may()?;
        read.map_err(|e| {
            // The primary reads around a damaged shard; a scrub rewrites it.
            self.note_damage(soid, &e);
            status_of(&e)
        })
    }

    /// `Op::ShardActive`: the primary names this shard complete in its
    /// epoch, which must be this OSD's; direct reads of it are answered
    /// until the epoch moves.
    pub(crate) async fn answer_shard_active(self: &Rc<Self>, h: &Header) -> Status {
        if let Some(s) = self.check_peer_op(h).await {
            return s;
        }
        let pg = h.pg_id();
        if self.scheme(pg.pool).is_none()
            || self.slot(pg).is_none()
            || !self.map.borrow().is_acting(pg, self.id)
        {
            return Status::Invalid;
        }
        if self.store.pg_recovering(pg.key()) {
            // Not complete after all (the primary's view is older).
            return Status::Unavailable;
        }
        self.serving.borrow_mut().insert(pg, h.epoch);
        Status::Ok
    }

    /// Names the complete shards of active EC PG `pg` (every member of the
    /// acting set but `incomplete` and this primary) to themselves, so
    /// that they answer direct reads in `epoch`; in the background, once
    /// each (one not told serves none: its clients ask the primary).
    pub(crate) fn grant_direct_reads(self: &Rc<Self>, pg: PgId, epoch: u64, incomplete: &[u32]) {
        if self.scheme(pg.pool).is_none() {
            return;
        }
        let to: Vec<u32> = (self.map.borrow().acting(pg).into_iter())
            .filter(|o| *o != self.id && !incomplete.contains(o))
            .collect();
        for o in to {
            let mut h = Header::request(Op::ShardActive, 0, ObjectId::default());
            h = h.with_pg(pg);
            (h.epoch, h.sender) = (epoch, self.id);
            let me = self.clone();
            rt::spawn(async move {
                if let Ok(f) = me.call_osd(o, h, None).await {
                    if f.h.status != Status::Ok {
                        tracing::debug!(
                            "osd.{}: PG {pg}: osd.{o} takes no direct reads in epoch {epoch}: {:?}",
                            me.id,
                            f.h.status
                        );
                    }
                }
            });
        }
    }

    /// The log entry of shard op `h` (at its `obj_version`).
    fn shard_entry(h: &Header) -> LogEntry {
        LogEntry {
            pg: h.pg_id().key(),
            version: h.obj_version,
            oid: h.oid,
            op: if h.op == Op::ShardDelete {
                LogOp::Delete
            } else {
                LogOp::Write
            },
            offset: if h.op == Op::ShardWrite { h.offset } else { 0 },
            len: if h.op == Op::ShardWrite { h.length } else { 0 },
            client: h.client,
            request: h.request_id,
        }
    }

    /// `Op::ShardWrite` and `Op::ShardDelete` on this OSD's store.
    pub(crate) async fn apply_shard_op(&self, h: &Header, data: Option<AlignedBuf>) -> Status {
        let _inflight = self.track(h.pg_id(), h.epoch);
        let e = Self::shard_entry(h);
        if h.replace && (h.offset != 0 || h.length != self.store.block_bytes()) {
            return Status::Invalid;
        }
        if h.op == Op::ShardDelete || h.replace {
            // Marked before it shows: no direct read sees it uncommitted.
            self.deleting.borrow_mut().insert(h.oid, h.obj_version);
        }
        // Bytes that depend on none of the old (an XOR delta does), or a
        // delete: they replace a damaged copy if they cover the whole
        // shard (`Osd::replaced` checks).
        let fresh = h.op == Op::ShardDelete || (data.is_some() && !h.xor);
        let t0 = rt::monotonic();
        let r = match (h.op, data) {
            (Op::ShardDelete, _) => self.store.delete_logged(e).await,
            (_, None) => self.store.log_only(e).await,
            // Every other shard holds the write: no peering rolls it back.
            (_, Some(d)) if h.replace => self.store.write_logged(e, 0, d).await,
            (_, Some(d)) if h.xor => {
                let make = move |old: Option<&[u8]>| {
                    let mut out = AlignedBuf::zeroed(d.len());
                    for (i, b) in out.iter_mut().enumerate() {
                        *b = d[i] ^ old.map_or(0, |o| o[i]);
                    }
                    out
                };
                (self.store)
                    .write_undoable(e, h.offset, h.length, make)
                    .await
            }
            // New bytes over old: a whole shard keeps its old block as the
            // undo (read to check it, not copied into the journal).
            (_, Some(d)) => self.store.replace_undoable(e, h.offset, d).await,
        };
        self.stats.store_write_done(t0);
        match r {
            Ok(()) => {
                if fresh {
                    self.replaced(&e);
                }
                Status::Ok
            }
            Err(err) => {
                tracing::debug!(
                    "osd.{}: shard {} v{:#x}: {err}",
                    self.id,
                    h.oid,
                    h.obj_version
                );
                status_of(&err)
            }
        }
    }

    /// `Op::ShardSettle` on this OSD's store (see the op). Each step is
    /// skipped where it is done, so a settle cut by a crash is completed
    /// by the next peering's.
    pub(crate) async fn settle_shard(&self, h: &Header) -> Status {
        let _inflight = self.track(h.pg_id(), h.epoch);
        let key = h.pg_id().key();
        let has = |v: u64| (self.store.pg_log(key)).is_some_and(|l| l.entries.contains_key(&v));
        let entry = |version, op, offset, len, client, request| LogEntry {
            pg: key,
            version,
            oid: h.oid,
            op,
            offset,
            len,
            client,
            request,
        };
        let r = if h.offset == SETTLE_DELETE {
            let e = entry(h.obj_version, LogOp::Delete, 0, 0, h.client, h.request_id);
            match has(e.version) {
                true => Ok(()),
                false => self.store.delete_logged(e).await,
            }
        } else {
            let (w, v) = (h.obj_version, h.request_id);
            let mut r = Ok(());
            if !has(w) {
                r = match self.store.undo(h.oid).await {
                    Ok(Some(u)) if u.version == v => match u.before {
                        Some((off, b)) => {
                            let e = entry(w, LogOp::Write, off, b.len() as u32, 0, v);
                            if off == 0 && b.len() == self.store.block_bytes() as usize {
                                // A whole block (one the write kept, most
                                // likely, whose block comes back only once
                                // this lands): a recovery's, which may take
                                // the blocks kept back from clients.
                                self.store.recover_logged(e, b).await
                            } else {
                                self.store.write_logged(e, off, b).await
                            }
                        }
                        None => {
                            self.store
                                .delete_logged(entry(w, LogOp::Delete, 0, 0, 0, v))
                                .await
                        }
                    },
                    Ok(_) => {
                        self.store
                            .log_only(entry(w, LogOp::Write, 0, 0, 0, v))
                            .await
                    }
                    Err(e) => Err(e),
                };
            }
            if r.is_ok() && has(v) {
                r = self.store.pg_forget(key, v).await;
            }
            r
        };
        match r {
            Ok(()) => Status::Ok,
            Err(e) => {
                tracing::warn!(
                    "osd.{}: settling {} v{:#x}: {e}",
                    self.id,
                    h.oid,
                    h.obj_version
                );
                status_of(&e)
            }
        }
    }

    /// `Op::ShardList`: the shard objects of this OSD's slot of `h.oid`'s
    /// volume in its PG, from `h.oid`'s block on, each by its whole
    /// object's block with its version, in block order, at most
    /// `h.length` of them (an encoded `Op::List` page).
    pub(crate) fn shard_list(&self, h: &Header) -> Vec<u8> {
        let (pg, volume, from) = (h.pg_id(), h.oid.volume, h.oid.block);
        let count = self.map.borrow().pg_count(pg.pool);
        let Some(slot) = self.slot(pg) else {
            return Vec::new();
        };
        let keep = |o: &ObjectId| {
            o.volume == volume
                && o.shard_index() == Some(slot)
                && o.whole().block >= from
                && pg.holds(*o, count)
        };
        let mut found: BTreeMap<u64, u64> = BTreeMap::new();
        for (o, v) in self.store.list_where(keep) {
            let e = found.entry(o.whole().block).or_default();
            *e = (*e).max(v);
        }
        let max = h.length.min(nacre_wire::LIST_PAGE_MAX) as usize;
        nacre_wire::encode_list(found.into_iter().take(max))
    }

    /// The primary's answer to `Op::List` on an EC PG: the union of its
    /// shards' listings (`Op::ShardList`), each object at its shards'
    /// newest version. Every object has a shard on each parity shard and
    /// on a data shard, `m + 1` of them, and at most `m` are down
    /// (`min_size` is at least `k`), so a shard up lists it; an object
    /// among the first `length` of the union is among the first `length`
    /// of every shard that holds it.
    ///
    /// Shards still rebuilt in the background are not asked (they may
    /// hold objects deleted while they were away); `k + 1` or more are
    /// complete, so every object has a shard on one of those.
    pub(crate) async fn ec_list(self: &Rc<Self>, h: &Header) -> Result<Vec<u8>, Status> {
        let stale = self.rebuilding(h.pg_id(), h.epoch, None);
        let mut up = self.up_shards(h.pg_id());
        up.retain(|(_, o)| !stale.contains(o));
        let lists: Vec<_> = (up.iter())
            .map(|&(s, o)| {
                let mut sub = self.shard_header(h, Op::ShardList, s, 0);
                (sub.oid, sub.length) = (h.oid.whole(), h.length);
                rt::spawn(self.clone().shard_call(o, sub, None))
            })
            .collect();
        let mut found: BTreeMap<u64, u64> = BTreeMap::new();
        for r in rt::join_all(lists).await {
            match r {
                (Status::Ok, body, _) => {
                    for (b, v) in nacre_wire::decode_list(body.as_deref().unwrap_or(&[])) {
                        let e = found.entry(b).or_default();
                        *e = (*e).max(v);
                    }
                }
                (s, _, _) => return Err(s),
            }
        }
        Ok(nacre_wire::encode_list(
            found.into_iter().take(h.length as usize),
        ))
    }

    /// The version of EC object `h.oid`: its shards' newest
    /// (`Op::ShardVersion`, from each shard up), or `None` if no shard up
    /// holds it. A write since any listing raises it: it reaches every
    /// parity shard up and a data shard, and a shard rebuilt since is at
    /// least at the holders' newest entry for the object. (A shard whose
    /// rebuild of the object is still to come is not asked.)
    pub(crate) async fn ec_version(self: &Rc<Self>, h: &Header) -> Result<Option<u64>, Status> {
        let stale = self.rebuilding(h.pg_id(), h.epoch, Some(h.oid.whole()));
        let reads: Vec<_> = (self.up_shards(h.pg_id()).into_iter())
            .filter(|(_, o)| !stale.contains(o))
            .map(|(s, o)| {
                let sub = self.shard_header(h, Op::ShardVersion, s, 0);
                rt::spawn(self.clone().shard_call(o, sub, None))
            })
            .collect();
        let mut newest = None;
        for r in rt::join_all(reads).await {
            match r {
                (Status::Ok, _, v) => newest = newest.max(Some(v)),
                (Status::NotFound, _, _) => {}
                (s, _, _) => return Err(s),
            }
        }
        Ok(newest)
    }

    /// PG `pg`'s shards up: (slot, OSD).
    fn up_shards(&self, pg: PgId) -> Vec<(usize, u32)> {
        let m = self.map.borrow();
        let acting = m.acting(pg);
        (m.placement(pg).iter().copied().enumerate())
            .filter(|(_, o)| acting.contains(o))
            .collect()
    }

    /// `Op::ShardCommit`: releases the undos of the writes named (this
    /// OSD's shard of each object).
    pub(crate) fn answer_shard_commit(&self, h: &Header, body: &[u8]) -> Status {
        let Some(s) = self.slot(h.pg_id()) else {
            return Status::NotPrimary;
        };
        for e in body.chunks_exact(SHARD_COMMIT_ENTRY_BYTES) {
            let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
            let oid = ObjectId::new(word(0), word(8)).shard(s);
            self.store.release_undo(oid, word(16));
            let mut deleting = self.deleting.borrow_mut();
            if deleting.get(&oid).is_some_and(|&v| v <= word(16)) {
                deleting.remove(&oid);
            }
        }
        Status::Ok
    }

    /// Sends shard op `h` to OSD `to` or applies it here; its status and,
    /// for a read, the bytes and the shard object's version.
    async fn shard_call(
        self: Rc<Self>,
        to: u32,
        h: Header,
        data: Option<AlignedBuf>,
    ) -> (Status, Option<AlignedBuf>, u64) {
        if to == self.id {
            // As a shard would: nothing of an epoch that ended.
            if h.op != Op::ShardRead && h.epoch != self.epoch() {
                return (Status::StaleEpoch, None, 0);
            }
            let s = match h.op {
                Op::ShardRead => {
                    let (r, b) = self.answer_shard_read(&h).await;
                    return (r.status, b, r.obj_version);
                }
                Op::ShardCommit => self.answer_shard_commit(&h, data.as_deref().unwrap_or(&[])),
                Op::ShardList => {
                    let body = AlignedBuf::from_slice(&self.shard_list(&h));
                    return (Status::Ok, Some(body), 0);
                }
                Op::ShardVersion => {
                    return match self.store.version(h.oid) {
                        Some(v) => (Status::Ok, None, v),
                        None => (Status::NotFound, None, 0),
                    };
                }
                Op::ShardSettle => self.settle_shard(&h).await,
                _ => self.apply_shard_op(&h, data).await,
            };
            return (s, None, 0);
        }
        match self.call_osd(to, h, data.as_ref()).await {
            // Shard data for another object or range is not this read's.
            Ok(f) if h.op == Op::ShardRead && f.h.status == Status::Ok && !f.h.answers(&h) => {
                tracing::warn!(
                    "osd.{}: osd.{to} answered a read of {} {}+{} for {} {}+{}",
                    self.id,
                    h.oid,
                    h.offset,
                    h.length,
                    f.h.oid,
                    f.h.offset,
                    f.h.length
                );
                (Status::Unavailable, None, 0)
            }
            Ok(f) => (f.h.status, f.payload, f.h.obj_version),
            Err(why) => {
                tracing::warn!("osd.{}: {why}", self.id);
                (Status::Unavailable, None, 0)
            }
        }
    }

    /// A shard op of client op `h` on shard `s` of its object.
    fn shard_header(&self, h: &Header, op: Op, s: usize, version: u64) -> Header {
        let mut sub = *h;
        sub.op = op;
        sub.oid = h.oid.whole().shard(s as u8);
        sub.obj_version = version;
        sub.sender = self.id;
        sub.xor = false;
        (sub.offset, sub.length) = (0, 0);
        sub.payload_len = 0;
        sub.payload_crc = 0;
        sub
    }

    /// The primary's read of an EC PG's object: the ranges of the data
    /// shards, gathered (zeros where a shard does not hold the object); a
    /// range of a shard that is down is rebuilt from the same range of
    /// `k` shards that are up (a degraded read). A shard the background
    /// rebuild has yet to bring the object to counts as down, and so does
    /// one that fails to read (damaged bytes, an I/O error, no answer):
    /// the read is made again around it, while `k` shards are left.
    pub(crate) async fn ec_read(self: &Rc<Self>, h: &Header) -> Result<AlignedBuf, Status> {
        let scheme = self.scheme(h.pool).ok_or(Status::Invalid)?;
        let n = scheme.layout.k + scheme.layout.m;
        let (row, acting) = {
            let m = self.map.borrow();
            (m.placement(h.pg_id()).to_vec(), m.acting(h.pg_id()))
        };
        let stale = self.rebuilding(h.pg_id(), h.epoch, Some(h.oid.whole()));
        let mut up: Vec<usize> = (0..n)
            .filter(|&s| acting.contains(&row[s]) && !stale.contains(&row[s]))
            .collect();
        loop {
            match self.ec_read_from(h, &scheme, &row, &up).await {
                Ok(b) => return Ok(b),
                Err((s, Some(bad))) if matches!(s, Status::Corrupt | Status::Unavailable) => {
                    tracing::warn!(
                        "osd.{}: reading {}: shard {bad} on osd.{}: {s:?}; reading around it",
                        self.id,
                        h.oid,
                        row[bad]
                    );
                    up.retain(|&x| x != bad);
                }
                Err((s, _)) => return Err(s),
            }
        }
    }

    /// [`Osd::ec_read`] from the shards `up` (slots of `row`); what fails,
    /// with the shard that failed, if one did.
    async fn ec_read_from(
        self: &Rc<Self>,
        h: &Header,
        scheme: &Scheme,
        row: &[u32],
        up: &[usize],
    ) -> Result<AlignedBuf, (Status, Option<usize>)> {
        let (k, n) = (scheme.layout.k, scheme.layout.k + scheme.layout.m);
        let ranges =
            (scheme.layout.data_ranges(h.offset, h.length)).map_err(|_| (Status::Invalid, None))?;
        // Every read at once: a range of each data shard that is up, the
        // same range of the first `k` shards up for one that is down.
        let mut reads: Vec<(usize, u32, u32)> = Vec::new();
        for r in &ranges {
            if up.contains(&r.shard) {
                reads.push((r.shard, r.offset, r.len));
            } else if up.len() < k {
                return Err((Status::Unavailable, None));
            } else {
                reads.extend(up[..k].iter().map(|&s| (s, r.offset, r.len)));
            }
        }
        let tasks: Vec<_> = (reads.iter())
            .map(|&(s, offset, len)| {
                let mut sub = self.shard_header(h, Op::ShardRead, s, 0);
                (sub.offset, sub.length) = (offset, len);
                rt::spawn(self.clone().shard_call(row[s], sub, None))
            })
            .collect();
        let mut got: Vec<AlignedBuf> = Vec::with_capacity(reads.len());
        let mut found = false;
        for (&(s, _, len), t) in reads.iter().zip(tasks) {
            match t.await {
                (Status::Ok, Some(b), _) if b.len() == len as usize => {
                    found = true;
                    got.push(b);
                }
                (Status::NotFound, _, _) => got.push(AlignedBuf::zeroed(len as usize)),
                (Status::Ok, _, _) => return Err((Status::Unavailable, Some(s))),
                (st, _, _) => return Err((st, Some(s))),
            }
        }
        if !found {
            return Err((Status::NotFound, None));
        }
        let mut got = got.into_iter();
        let mut bufs: Vec<AlignedBuf> = Vec::with_capacity(ranges.len());
        for r in &ranges {
            if up.contains(&r.shard) {
                bufs.push(got.next().expect("a read per range"));
                continue;
            }
            let from: Vec<AlignedBuf> = got.by_ref().take(k).collect();
            let mut chunks: Vec<Option<&[u8]>> = vec![None; n];
            for (&s, b) in up[..k].iter().zip(&from) {
                chunks[s] = Some(&b[..]);
            }
            let mut out = AlignedBuf::zeroed(r.len as usize);
            (scheme
                .codec
                .reconstruct(&chunks, &[r.shard], &mut [&mut out[..]]))
            .map_err(|_| (Status::Invalid, None))?;
            bufs.push(out);
        }
        let parts: Vec<_> = (ranges.iter().copied())
            .zip(bufs.iter().map(|b| &b[..]))
            .collect();
        let mut out = AlignedBuf::zeroed(h.length as usize);
        (scheme.layout.gather(h.offset, &parts, &mut out)).map_err(|_| (Status::Invalid, None))?;
        Ok(out)
    }

    /// The primary's write or delete of an EC PG's object at `version`,
    /// on every shard that is up (the object locked, the PG active).
    pub(crate) async fn ec_update(
        self: &Rc<Self>,
        h: &Header,
        version: u64,
        data: Option<AlignedBuf>,
    ) -> Status {
        let Some(scheme) = self.scheme(h.pool) else {
            return Status::Invalid;
        };
        let (k, m) = (scheme.layout.k, scheme.layout.m);
        // The shards that are up take the op; one that is down misses it
        // and is rebuilt when it comes back (a degraded write: the parity
        // carries a down data shard's new bytes).
        let (row, acting) = {
            let m = self.map.borrow();
            (m.placement(h.pg_id()).to_vec(), m.acting(h.pg_id()))
        };
        let up: Vec<(usize, u32)> = (row.iter().copied().enumerate())
            .filter(|(_, o)| acting.contains(o))
            .collect();
        let mut ops: Vec<(u32, Header, Option<AlignedBuf>)> = Vec::with_capacity(k + m);
        match data {
            None => {
                for &(s, o) in &up {
                    ops.push((o, self.shard_header(h, Op::ShardDelete, s, version), None));
                }
            }
            Some(new) => {
                let (offset, len) = (h.offset, new.len() as u32);
                let l = &scheme.layout;
                let (Ok(parts), Ok((p0, plen))) =
                    (l.scatter(offset, &new), l.parity_range(offset, len))
                else {
                    return Status::Invalid;
                };
                // What the range holds now: the parity delta needs it —
                // but for whole stripes, whose parity is the new bytes'
                // code alone (a delta over zeros, written over the old
                // parity rather than XORed into it).
                let whole = l.whole_stripes(offset, len);
                let old = if whole {
                    AlignedBuf::zeroed(len as usize)
                } else {
                    let mut read = *h;
                    (read.op, read.length, read.payload_len, read.payload_crc) =
                        (Op::Read, len, 0, 0);
                    match self.ec_read(&read).await {
                        Ok(b) => b,
                        Err(Status::NotFound) => AlignedBuf::zeroed(len as usize),
                        Err(s) => return s,
                    }
                };
                let Ok(delta) = l.parity_delta(&scheme.codec, offset, &old, &new) else {
                    return Status::Invalid;
                };
                // The read may have outlived the epoch: nothing is
                // written then (a write some shards took and others
                // refused would only be rolled back by the next peering).
                if self.epoch() != h.epoch
                    || self.pg_state(h.pg_id()) != Some(crate::PgState::Active)
                {
                    return Status::StaleEpoch;
                }
                for &(s, o) in &up {
                    let mut sub = self.shard_header(h, Op::ShardWrite, s, version);
                    let payload = if s < k {
                        parts.iter().find(|(r, _)| r.shard == s).map(|(r, b)| {
                            (sub.offset, sub.length) = (r.offset, r.len);
                            AlignedBuf::from_slice(b)
                        })
                    } else {
                        (sub.offset, sub.length, sub.xor) = (p0, plen, !whole);
                        Some(AlignedBuf::from_slice(&delta[s - k]))
                    };
                    if let Some(p) = &payload {
                        sub = sub.with_payload(p);
                    }
                    ops.push((o, sub, payload));
                }
            }
        }
        let tasks: Vec<_> = (ops.into_iter())
            .map(|(o, sub, p)| {
                let me = self.clone();
                (
                    o,
                    rt::spawn(async move { me.shard_call(o, sub, p).await.0 }),
                )
            })
            .collect();
        // As for copies (`Osd::replica_status`): a shard the new epoch
        // marks down is not waited for (the write is not acknowledged;
        // the next peering settles what the shards hold).
        let mut status = Status::Ok;
        // Shards that refused the write because the bytes it replaces (its
        // undo, or the parity the delta goes into) failed their checksum:
        // nothing was written there.
        let mut damaged: Vec<u32> = Vec::new();
        for (o, mut t) in tasks {
            let s = self.replica_status(o, &mut t, h.epoch).await;
            if s == Status::Corrupt && h.op == Op::Write {
                damaged.push(o);
            } else if status == Status::Ok && s != Status::Ok {
                status = s;
            }
        }
        match damaged[..] {
            [] => {}
            [d] if status == Status::Ok => {
                status = self.replace_damaged(h, &scheme, version, &up, d).await;
            }
            // Two damaged shards: one replaced without undo while the
            // other still lacks the write could leave the first holding a
            // write the next peering rolls back elsewhere. The PG's
            // interval ends (the caller), the next peering rolls the write
            // back, and the client retries (a scrub repairs the shards).
            _ if status == Status::Ok => status = Status::Unavailable,
            // Another shard's own error stands.
            _ => {}
        }
        if status == Status::Ok && matches!(h.op, Op::Write | Op::Delete) {
            // Every shard has it: committed; the shards may drop what a
            // write replaced (sent now, not with the next write: a shard's
            // room for undos waits for releases), and answer direct reads
            // of what a delete removed.
            let to = up.iter().map(|&(_, o)| o).collect();
            self.queue_commit(h.pg_id(), h.epoch, to, (h.oid, version));
        }
        status
    }

    /// Rebuilds the shard on OSD `damaged`, which refused write `h` at
    /// `version` because the bytes it replaces failed their checksum, as
    /// its whole shard object at that version from `k` of the shards `up`
    /// that took the write, and writes it there over the damaged one,
    /// logged, keeping no undo ([`nacre_wire::FLAG_REPLACE`]): safe, as
    /// every other shard holds the write durably, so no peering rolls it
    /// back (one rolls back only a write some holder lacks) — which is why
    /// only one damaged shard is ever replaced. A write over damaged bytes
    /// then succeeds and repairs them, where failing it would fail the
    /// client's write (an EIO) until a scrub. `Unavailable` if fewer than
    /// `k` shards read (the client retries once the next peering settled
    /// the write).
    async fn replace_damaged(
        self: &Rc<Self>,
        h: &Header,
        scheme: &Scheme,
        version: u64,
        up: &[(usize, u32)],
        damaged: u32,
    ) -> Status {
        let took: Vec<(usize, u32)> = (up.iter().copied())
            .filter(|&(_, o)| o != damaged)
            .collect();
        let (pg, oid, o) = (h.pg_id(), h.oid.whole(), damaged);
        let Some(&(slot, _)) = up.iter().find(|&&(_, x)| x == o) else {
            return Status::Unavailable;
        };
        let whole = self
            .decode_shard(pg, h.epoch, scheme, oid, slot, &took, None)
            .await;
        let data = match whole {
            Ok((v, Some(d))) if v == version => d,
            Ok((v, _)) => {
                tracing::warn!(
                    "osd.{}: {oid} shard {slot} on osd.{o}: rebuilt at v{v:#x}, not the write's v{version:#x}",
                    self.id
                );
                return Status::Unavailable;
            }
            Err(e) => {
                tracing::warn!("osd.{}: {oid} shard {slot} on osd.{o}: {e}", self.id);
                return Status::Unavailable;
            }
        };
        tracing::warn!(
            "osd.{}: {oid} shard {slot} on osd.{o} failed its checksum under a write: rewritten whole at v{version:#x}",
            self.id
        );
        let mut sub = self.shard_header(h, Op::ShardWrite, slot, version);
        (sub.offset, sub.length, sub.replace) = (0, data.len() as u32, true);
        sub = sub.with_payload(&data);
        match self.clone().shard_call(o, sub, Some(data)).await.0 {
            Status::Corrupt => Status::Unavailable,
            s => s,
        }
    }

    /// Queues the commit of write `w` of PG `pg` in `epoch` for its
    /// shards (on OSDs `to`): sent at once, or, while a commit of the PG
    /// is on its way, with the others that queue meanwhile (one message
    /// per shard for many writes under load, none waiting at QD1).
    fn queue_commit(self: &Rc<Self>, pg: PgId, epoch: u64, to: Vec<u32>, w: (ObjectId, u64)) {
        let mut all = self.commits.borrow_mut();
        let c = all.entry(pg).or_default();
        if c.epoch != epoch {
            // Those of an earlier epoch: its peering released them.
            (c.epoch, c.to) = (epoch, to);
            c.writes.clear();
        }
        c.writes.push(w);
        if !c.sending {
            c.sending = true;
            rt::spawn(self.clone().send_commits(pg));
        }
    }

    /// Sends PG `pg`'s queued commits until none is left.
    async fn send_commits(self: Rc<Self>, pg: PgId) {
        loop {
            let (epoch, to, writes) = {
                let mut all = self.commits.borrow_mut();
                let c = all.get_mut(&pg).expect("queued");
                if c.writes.is_empty() {
                    c.sending = false;
                    return;
                }
                (c.epoch, c.to.clone(), std::mem::take(&mut c.writes))
            };
            self.clone().commit_shards(pg, epoch, to, writes).await;
        }
    }

    /// Tells the shards on OSDs `to` that `writes` of `epoch` committed.
    async fn commit_shards(
        self: Rc<Self>,
        pg: PgId,
        epoch: u64,
        to: Vec<u32>,
        writes: Vec<(ObjectId, u64)>,
    ) {
        for chunk in
            writes.chunks(nacre_wire::CONTROL_PAYLOAD_MAX_BYTES as usize / SHARD_COMMIT_ENTRY_BYTES)
        {
            let body: Vec<u8> = (chunk.iter())
                .flat_map(|(o, v)| {
                    let w = o.whole();
                    (w.volume.0.to_le_bytes().into_iter())
                        .chain(w.block.to_le_bytes())
                        .chain(v.to_le_bytes())
                })
                .collect();
            let mut h = Header::request(Op::ShardCommit, 0, chunk[0].0.whole()).with_pg(pg);
            (h.epoch, h.sender) = (epoch, self.id);
            let h = h.with_payload(&body);
            let calls: Vec<_> = (to.iter())
                .map(|&o| {
                    let body = Some(AlignedBuf::from_slice(&body));
                    (o, rt::spawn(self.clone().shard_call(o, h, body)))
                })
                .collect();
            for (o, call) in calls {
                let (s, _, _) = call.await;
                if s != Status::Ok {
                    // The next peering releases what is left.
                    tracing::debug!("osd.{}: commit to osd.{o} of PG {pg}: {s:?}", self.id);
                }
            }
        }
    }

    /// Settles the ops that some of the `held` shards (those that hold
    /// every acknowledged write) lack, object by object: the newest op of
    /// an object, if partial, is rolled back (a write: every shard that
    /// prepared it restores its undo at a new version of this interval,
    /// the others log that version) or forward (a delete, which left no
    /// undo: the shards lacking it apply it); older partial entries of it
    /// are forgotten where held (a settle cut short). Safe because none
    /// was acknowledged: an acknowledged op is on every shard that holds
    /// (docs/internals/ec.md, *Settling a write some shards hold*). The
    /// number of objects settled.
    async fn settle_ops(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        held: &[Member],
    ) -> Result<usize, PeerError> {
        // Per version: the members holding it, and its entry (as the first
        // holder has it; every holder must name the same op).
        let same = same_op;
        // Every shard's entries above its own tail: a version one shard
        // still logs may be below another's tail (its log, capped, dropped
        // it), and is partial only where a shard whose log reaches that
        // far lacks it.
        let mut ops: BTreeMap<u64, (Vec<usize>, LogEntry)> = BTreeMap::new();
        for (i, m) in held.iter().enumerate() {
            for (&v, e) in m.log.entries.range(m.log.tail + 1..) {
                let (who, first) = ops.entry(v).or_insert((Vec::new(), *e));
                if same(first) != same(e) {
                    return Err(PeerError::Inactive(format!(
                        "version {v:#x} names two ops on the shards"
                    )));
                }
                who.push(i);
            }
        }
        let lacks = |i: usize, v: u64| held[i].log.tail < v && !ops[&v].0.contains(&i);
        let mut objects: BTreeMap<ObjectId, Vec<u64>> = BTreeMap::new();
        for (&v, (_, e)) in &ops {
            if (0..held.len()).any(|i| lacks(i, v)) {
                objects.entry(e.oid.whole()).or_default().push(v);
            }
        }
        let newest: BTreeMap<ObjectId, u64> = (ops.iter())
            .map(|(&v, (_, e))| (e.oid.whole(), v))
            .collect();
        for (&oid, partial) in &objects {
            let top = newest[&oid];
            let mut forget: Vec<u64> = partial.clone();
            if partial.last() == Some(&top) {
                let (_, e) = &ops[&top];
                let all: Vec<usize> = (0..held.len()).collect();
                let (kind, version, client, request, to) = match (e.op, e.client) {
                    // A rollback cut short (a delete on a shard whose
                    // undo said the object was new, a write elsewhere):
                    // completed as it was begun.
                    (_, 0) => (SETTLE_ROLL_BACK, top, 0, e.request, all),
                    (LogOp::Delete, _) => {
                        let lacking = all.into_iter().filter(|&i| lacks(i, top)).collect();
                        (SETTLE_DELETE, top, e.client, e.request, lacking)
                    }
                    (LogOp::Write, _) => {
                        let w = (self.next_version(pg, epoch)).ok_or_else(|| {
                            PeerError::Retry("no version left in the epoch".into())
                        })?;
                        (SETTLE_ROLL_BACK, w, 0, top, all)
                    }
                };
                // The rollback forgets the version it undoes itself.
                forget.retain(|&v| v != top && (kind == SETTLE_DELETE || v != request));
                let calls: Vec<_> = (to.into_iter())
                    .map(|i| {
                        let shard = oid.shard(held[i].slot as u8);
                        let mut h = Header::request(Op::ShardSettle, request, shard).with_pg(pg);
                        (h.epoch, h.sender, h.client) = (epoch, self.id, client);
                        (h.obj_version, h.offset) = (version, kind);
                        rt::spawn(self.clone().shard_call(held[i].osd, h, None))
                    })
                    .collect();
                for (s, _, _) in rt::join_all(calls).await {
                    if s != Status::Ok {
                        return Err(PeerError::Retry(format!("settling {oid}: {s:?}")));
                    }
                }
            }
            for v in forget {
                let sync = crate::peering::LogSync {
                    forget: vec![v],
                    ..Default::default()
                };
                for &i in &ops[&v].0 {
                    self.log_sync(held[i].osd, pg, epoch, &sync).await?;
                }
            }
        }
        Ok(objects.len())
    }

    /// Peering of an EC PG. The shards that *hold* are those up in the
    /// slots, and with the stores, they had as complete members of the
    /// last active interval: each holds every acknowledged write. With at
    /// least `min_size` shards up and `k` of them holding, ops some
    /// holders lack are settled (none was acknowledged), every other
    /// shard up is rebuilt from `k` holders (the objects its log says it
    /// missed, or all of them) and takes the holders' log — now until
    /// `k + 1` shards (or `min_size`) are complete, the rest in the
    /// background — and the PG goes active; otherwise it stays inactive,
    /// saying why.
    pub(crate) async fn try_peer_ec(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
    ) -> Result<(), PeerError> {
        let scheme = (self.scheme(pg.pool))
            .ok_or_else(|| PeerError::Inactive("the pool's code cannot be made".into()))?;
        let (k, n) = (scheme.layout.k, scheme.layout.k + scheme.layout.m);
        let (row, up, holders, away, min_size, prior) = {
            let m = self.map.borrow();
            let prior = m.last_active(pg).cloned();
            let row = m.placement(pg).to_vec();
            let acting = m.acting(pg);
            let up: Vec<(usize, u32)> = (row.iter().copied().enumerate())
                .filter(|(_, o)| acting.contains(o))
                .collect();
            // Complete members of the last active interval that placement
            // has since moved out of their slots (out of the row, or to
            // another slot of it), up: sources for rebuilding the shards
            // they held (by their old slots), until the PG goes active
            // without them there.
            let away: Vec<(usize, u32)> = (prior.iter())
                .flat_map(|p| p.row.iter().copied().enumerate())
                .filter(|&(s, o)| {
                    row.get(s) != Some(&o) && prior.as_ref().is_some_and(|p| m.holds(p, o))
                })
                .collect();
            let holders: Vec<usize> = (up.iter())
                .filter(|&&(s, o)| {
                    prior
                        .as_ref()
                        .is_none_or(|p| m.is_up(o) && p.holds_slot(o, s, m.stores.get(&o)))
                })
                .map(|&(s, _)| s)
                .collect();
            let min_size = usize::from(m.min_size(pg.pool));
            (row, up, holders, away, min_size, prior)
        };
        if up.len() < min_size {
            return Err(PeerError::Inactive(format!(
                "{} of {n} shards up, min_size {min_size}",
                up.len()
            )));
        }
        let short = |held: usize| {
            PeerError::Inactive(format!(
                "{held} shards up hold what the PG held when last active (epoch {}); {k} are needed to rebuild the others",
                prior.as_ref().map_or(0, |p| p.epoch)
            ))
        };
        let mut ids: Vec<u32> = up.iter().chain(&away).map(|&(_, o)| o).collect();
        ids.sort_unstable();
        ids.dedup();
        let asks = ids.into_iter().map(|o| (o, Ask::Undos)).collect();
        let mut members: Vec<Member> = Vec::with_capacity(up.len());
        let mut moved: Vec<Member> = Vec::with_capacity(away.len());
        // Every shard's undos, by object (whole), the newest version.
        let mut undos: BTreeMap<ObjectId, u64> = BTreeMap::new();
        // Those that answered, in this epoch (for the leader: they serve
        // no read of an older one).
        let mut heard: Vec<u32> = Vec::new();
        for (id, _, r) in self.query_each(pg, epoch, asks).await {
            let i = match r {
                Ok(i) => i,
                // A source away from the row may be gone: fewer sources.
                Err(_) if !row.contains(&id) => continue,
                Err(why) => return Err(PeerError::Retry(why)),
            };
            heard.push(id);
            if let Some(&(slot, _)) = away.iter().find(|&&(_, o)| o == id) {
                moved.push(Member {
                    slot,
                    osd: id,
                    log: i.log.clone(),
                });
            }
            if !up.iter().any(|&(_, o)| o == id) {
                continue;
            }
            for (oid, v) in i.objects {
                let u = undos.entry(oid.whole()).or_default();
                *u = (*u).max(v);
            }
            let slot = row
                .iter()
                .position(|&o| o == id)
                .expect("a member of the row");
            members.push(Member {
                slot,
                osd: id,
                log: i.log,
            });
        }
        if self.epoch() != epoch {
            return Err(PeerError::Retry("the epoch moved".into()));
        }
        if prior.is_none() && members.iter().any(|m| !m.log.entries.is_empty()) {
            return Err(PeerError::Inactive(
                "shards hold history of a PG never active".into(),
            ));
        }
        // A holder's log names its own slot's shard; one whose log names
        // another slot was rebuilt for that slot by a peering whose
        // interval never went active: it is stale, rebuilt whole, log and
        // all. (A holder is never marked recovering: its rebuild ended
        // before the interval it holds from went active.)
        let (held, stale): (Vec<Member>, Vec<Member>) = (members.into_iter())
            .partition(|m| holders.contains(&m.slot) && !m.log.recovering && !m.foreign());
        // The holders placement moved out of the row are sources too, by
        // the slots they held, settled with the rest.
        let mut sources = held;
        sources.extend((moved.into_iter()).filter(|m| !m.foreign() && !m.log.recovering));
        if sources.is_empty() {
            return Err(short(0));
        }
        // An op some sources lack was never acknowledged (each holds
        // every acknowledged op): settle it, then look again.
        let settled = self.settle_ops(pg, epoch, &sources).await?;
        if settled > 0 {
            return Err(PeerError::Retry(format!(
                "settled {settled} ops not on every shard"
            )));
        }
        let first = (sources.iter().find(|m| m.osd == self.id)).unwrap_or(&sources[0]);
        let auth = stripe_log(&first.log);
        let floor = sources.iter().map(|m| m.log.tail).max().unwrap_or(0);
        let above = |l: &PgLog| -> Vec<LogEntry> {
            (l.entries.range(floor + 1..)).map(|(_, e)| *e).collect()
        };
        if let Some(m) = (sources.iter()).find(|m| above(&stripe_log(&m.log)) != above(&auth)) {
            return Err(PeerError::Inactive(format!(
                "the shards' logs differ (osd.{} and osd.{}) where no op is partial",
                first.osd, m.osd
            )));
        }
        // A shard up whose log, naming its slot, tells it lacks nothing of
        // the sources' history (`log_delta`: no object the two logs name
        // apart, and no op it could have missed below their tails) was
        // rebuilt for that slot by a peering whose interval never went
        // active (its log is synced only after its objects), or missed
        // nothing: a source too. (Only so, after the settle: one that
        // missed acknowledged ops must never judge which ops are partial.)
        let (rebuilt, stale): (Vec<Member>, Vec<Member>) = stale.into_iter().partition(|x| {
            let delta = crate::peering::log_delta(&stripe_log(&x.log), &auth);
            !x.foreign() && delta.is_some_and(|d| d.is_empty())
        });
        // The shards complete in their slots: the holders up and those
        // rebuilt for their slots. (One slot, one source: a source moved
        // out of a slot and the one rebuilt in it hold the same shard,
        // and `k` sources must be `k` shards to decode.)
        let mut complete: Vec<(usize, u32)> = (sources.iter())
            .filter(|m| row.get(m.slot) == Some(&m.osd))
            .chain(&rebuilt)
            .map(|m| (m.slot, m.osd))
            .collect();
        for x in rebuilt {
            if !sources.iter().any(|s| s.slot == x.slot) {
                sources.push(x);
            }
        }
        if sources.len() < k {
            return Err(short(sources.len()));
        }
        // What every other shard up lacks: the objects its log says it
        // missed (or every object, listed) and what it holds of its slot
        // that no source has (deleted: the history deleted it), each with
        // the version it holds there; and what it holds of another slot.
        let mut listing: Option<std::collections::BTreeSet<ObjectId>> = None;
        let mut plans = Vec::with_capacity(stale.len());
        for x in &stale {
            let mine = stripe_log(&x.log);
            let delta = match x.foreign() {
                false => crate::peering::log_delta(&mine, &auth),
                true => None,
            };
            let slot = Some(x.slot as u8);
            let backfill = delta.is_none();
            let (mut objects, held_there) = match delta {
                Some(objects) => {
                    let names: Vec<ObjectId> =
                        objects.iter().map(|o| o.shard(x.slot as u8)).collect();
                    let versions = self.shard_versions(pg, epoch, x, names).await?;
                    (objects, versions)
                }
                None => {
                    if listing.is_none() {
                        // Objects by whole: every object has a shard on
                        // some source (its parity shards and a data shard
                        // hold it: `m + 1` shards, and at most `m` do not
                        // hold).
                        let shards = self.ec_listing(pg, epoch, &sources).await?;
                        listing = Some(shards.into_keys().map(|o| o.whole()).collect());
                    }
                    let all = listing.clone().expect("listed");
                    let theirs = self.ec_listing(pg, epoch, std::slice::from_ref(x)).await?;
                    (all, theirs)
                }
            };
            let mut other = Vec::new();
            if backfill {
                for (&o, &v) in &held_there {
                    if o.shard_index() != slot {
                        other.push((o, v));
                    } else {
                        // Rebuilt as the history left it: absent.
                        objects.insert(o.whole());
                    }
                }
            }
            let expect: BTreeMap<ObjectId, u64> = (objects.iter())
                .map(|&o| {
                    (
                        o,
                        held_there.get(&o.shard(x.slot as u8)).copied().unwrap_or(0),
                    )
                })
                .collect();
            plans.push((x, mine, expect, other));
        }
        // Rebuilt now, before the PG serves, until `k + 1` shards (or
        // `min_size`, if more) are complete in their slots: an
        // acknowledged write must survive one more loss while the others
        // are rebuilt. Those that lack least first.
        let target = (k + 1).max(min_size).min(up.len());
        plans.sort_by_key(|(x, _, expect, _)| (expect.len(), x.slot));
        let now_count = target.saturating_sub(complete.len()).min(plans.len());
        let later_plans = plans.split_off(now_count);
        let from: Vec<(usize, u32)> = sources.iter().map(|m| (m.slot, m.osd)).collect();
        // Each object's newest entry in the holders' log (entries in
        // version order: the last one kept).
        let newest: BTreeMap<ObjectId, LogEntry> =
            auth.entries.values().map(|e| (e.oid, *e)).collect();
        for (x, _, expect, _) in &plans {
            tracing::info!(
                "osd.{}: PG {pg}: rebuilding {} objects of shard {} on osd.{}",
                self.id,
                expect.len(),
                x.slot,
                x.osd
            );
            for (&oid, &v) in expect {
                let (to, newest) = ((x.slot, x.osd), newest.get(&oid));
                (self.rebuild_shard(pg, epoch, &scheme, oid, to, &from, newest, v)).await?;
            }
        }
        // Then each takes the holders' log, and what it holds of another
        // slot goes. In that order: a shard that moved to another slot of
        // the PG may be a source for the slot it held until its log names
        // the new one.
        for (x, mine, _, other) in plans {
            let sync = shard_log_sync(x, &mine, &auth);
            self.log_sync_in_parts(x.osd, pg, epoch, sync).await?;
            for (o, v) in other {
                self.push_shard(x.osd, pg, epoch, o, v, v, None).await?;
            }
            complete.push((x.slot, x.osd));
        }
        complete.sort_unstable();
        assert!(
            !nacre_blockstore::strict() || complete.len() >= target,
            "PG {pg} goes active with {} complete shards, {target} wanted",
            complete.len()
        );
        // The others are rebuilt in the background, from the complete
        // shards up (`recover_pg`): marked recovering first, they take the
        // interval's ops but are no holders at a later peering.
        let mut wants: BTreeMap<ObjectId, crate::recovery::Want> = BTreeMap::new();
        let mut rebuild = crate::recovery::ShardRebuild {
            sources: complete,
            slots: BTreeMap::new(),
            expect: std::collections::HashMap::new(),
            other: BTreeMap::new(),
        };
        let mut left: BTreeMap<u32, (usize, crate::peering::LogSync)> = BTreeMap::new();
        for (x, mine, expect, other) in later_plans {
            self.log_sync(x.osd, pg, epoch, &crate::peering::LogSync::mark())
                .await?;
            for (&oid, &v) in &expect {
                let w = wants.entry(oid).or_insert_with(|| {
                    let newest = newest.get(&oid);
                    crate::recovery::Want {
                        version: newest.map_or(0, |e| e.version),
                        entry: newest.copied(),
                        delete: newest.is_some_and(|e| e.op == LogOp::Delete),
                        to: Vec::new(),
                    }
                });
                w.to.push(x.osd);
                rebuild.expect.insert((oid, x.osd), v);
            }
            rebuild.slots.insert(x.osd, x.slot);
            rebuild.other.insert(x.osd, other);
            left.insert(x.osd, (expect.len(), shard_log_sync(x, &mine, &auth)));
        }
        if self.epoch() != epoch {
            return Err(PeerError::Retry("the epoch moved".into()));
        }
        let incomplete: Vec<u32> = left.keys().copied().collect();
        let clean = self.map.borrow().whole(pg) && incomplete.is_empty();
        let ev = PgEvent::Active {
            clean,
            incomplete: incomplete.clone(),
            heard,
        };
        self.report(pg, epoch, &ev)
            .await
            .map_err(PeerError::Retry)?;
        // A peering of a later epoch may have run while the report was
        // out: its plan and request cache are the ones that count.
        if self.epoch() != epoch {
            return Err(PeerError::Retry("the epoch moved".into()));
        }
        self.done.borrow_mut().insert(pg, ReqCache::of_log(&auth));
        self.grant_direct_reads(pg, epoch, &incomplete);
        if !left.is_empty() {
            let total = left.values().map(|(n, _)| n).sum();
            self.keep_plan(
                pg,
                crate::recovery::Recovery {
                    epoch,
                    source: self.id,
                    wants,
                    left,
                    total,
                    stalled: false,
                    ec: Some(rebuild),
                },
            );
        }
        // Every write any shard holds is on every shard up: every undo the
        // shards keep is of a committed write (also those whose entries a
        // capped log dropped, after a lost commit): release them all. Only
        // once the interval is recorded active: until then the next
        // peering may count from the last one's holders, among which a
        // write on every shard up now may be partial, to roll back.
        let to: Vec<u32> = up.iter().map(|&(_, o)| o).collect();
        if !undos.is_empty() {
            (self.clone())
                .commit_shards(pg, epoch, to, undos.into_iter().collect())
                .await;
        }
        Ok(())
    }

    /// Whether PG `pg`'s recovery in `epoch` rebuilds shards.
    pub(crate) fn ec_recovery(&self, pg: PgId, epoch: u64) -> bool {
        (self.recovery.borrow().get(&pg)).is_some_and(|r| r.epoch == epoch && r.ec.is_some())
    }

    /// The OSDs of PG `pg` whose shard of `oid` (whole) the background
    /// rebuild of `epoch` has yet to bring; for `None`, every shard it
    /// still rebuilds. They are read as if down.
    fn rebuilding(&self, pg: PgId, epoch: u64, oid: Option<ObjectId>) -> Vec<u32> {
        let r = self.recovery.borrow();
        let Some(r) = r.get(&pg).filter(|r| r.epoch == epoch) else {
            return Vec::new();
        };
        match oid {
            Some(o) => r.wants.get(&o).map_or_else(Vec::new, |w| w.to.clone()),
            None => r.left.keys().copied().collect(),
        }
    }

    /// Rebuilds `oid` (whole) of PG `pg`'s plan on the shard of OSD `to`
    /// (the caller holds the object's lock); the bytes written there.
    /// A push whose outcome is not known (no answer, or refused: the plan
    /// no longer matches the shard) ends the interval, as a scrub's does
    /// (`ec_scrub_push`): it may still land after the unlock, and bring
    /// back what a delete since took; the next peering waits for one
    /// already taken in, and the epoch fences the rest. One refused for
    /// room (`NoSpace`) waits for the next try.
    pub(crate) async fn rebuild_planned(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
        want: &crate::recovery::Want,
        to: u32,
    ) -> Result<u64, PeerError> {
        let scheme = (self.scheme(pg.pool))
            .ok_or_else(|| PeerError::Retry("the pool's code cannot be made".into()))?;
        let (slot, expect, from) = {
            let r = self.recovery.borrow();
            let Some(e) = (r.get(&pg).filter(|r| r.epoch == epoch)).and_then(|r| r.ec.as_ref())
            else {
                return Err(PeerError::Retry("the rebuild ended".into()));
            };
            let slot = *e.slots.get(&to).expect("a stale shard");
            let expect = e.expect.get(&(oid, to)).copied().unwrap_or(0);
            (slot, expect, e.sources.clone())
        };
        let newest = want.entry.as_ref();
        let (version, data) =
            (self.decode_shard(pg, epoch, &scheme, oid, slot, &from, newest)).await?;
        let bytes = data.as_ref().map_or(0, |d| d.len() as u64);
        let shard = oid.whole().shard(slot as u8);
        match self
            .push_shard(to, pg, epoch, shard, version, expect, data)
            .await
        {
            Ok(()) => Ok(bytes),
            Err(PeerError::Full(why)) => Err(PeerError::Full(why)),
            Err(e) => {
                self.fail_pg(pg, epoch, format!("rebuilding {shard} on osd.{to}: {e}"));
                Err(e)
            }
        }
    }

    /// Ends the rebuild of OSD `to`'s shard of PG `pg`, which holds every
    /// object now: what it holds of another slot goes, then its log
    /// becomes the holders' (`sync`, which clears its recovering mark).
    pub(crate) async fn finish_shard(
        self: &Rc<Self>,
        to: u32,
        pg: PgId,
        epoch: u64,
        sync: crate::peering::LogSync,
    ) -> Result<(), PeerError> {
        let other = (self.recovery.borrow().get(&pg))
            .filter(|r| r.epoch == epoch)
            .and_then(|r| r.ec.as_ref()?.other.get(&to).cloned())
            .unwrap_or_default();
        for (o, v) in other {
            self.push_shard(to, pg, epoch, o, v, v, None).await?;
        }
        if let Some(e) = (self.recovery.borrow_mut().get_mut(&pg))
            .filter(|r| r.epoch == epoch)
            .and_then(|r| r.ec.as_mut())
        {
            e.other.remove(&to);
        }
        self.log_sync_in_parts(to, pg, epoch, sync).await
    }

    /// [`Osd::log_sync`] of `sync` to `to` in parts that each fit a
    /// control frame: what it forgets, what it adopts, then its tail and
    /// mark.
    async fn log_sync_in_parts(
        self: &Rc<Self>,
        to: u32,
        pg: PgId,
        epoch: u64,
        sync: crate::peering::LogSync,
    ) -> Result<(), PeerError> {
        use crate::peering::LogSync;
        const ENTRIES: usize = 512;
        for f in sync.forget.chunks(ENTRIES) {
            let part = LogSync {
                forget: f.to_vec(),
                ..Default::default()
            };
            self.log_sync(to, pg, epoch, &part).await?;
        }
        for a in sync.adopt.chunks(ENTRIES) {
            let part = LogSync {
                adopt: a.to_vec(),
                ..Default::default()
            };
            self.log_sync(to, pg, epoch, &part).await?;
        }
        let last = LogSync {
            forget: Vec::new(),
            adopt: Vec::new(),
            ..sync
        };
        if !last.is_empty() {
            self.log_sync(to, pg, epoch, &last).await?;
        }
        Ok(())
    }

    /// Rebuilds shard object `oid` on OSD `to` as `data` (or absent) at
    /// `version`, if it holds `expect` there (0: nothing) when the push
    /// lands (`Osd::rebuild_shard_here`).
    #[allow(clippy::too_many_arguments)]
    async fn push_shard(
        self: &Rc<Self>,
        to: u32,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
        version: u64,
        expect: u64,
        data: Option<AlignedBuf>,
    ) -> Result<(), PeerError> {
        let s = if to == self.id {
            let _inflight = self.track(pg, epoch);
            self.rebuild_shard_here(oid, version, expect, data).await
        } else {
            let mut h = Header::request(Op::Push, 0, oid).with_pg(pg);
            if let Some(d) = &data {
                h = h.with_payload(d);
            }
            // The version it replaces rides in the range, unused by a
            // push with no log entry (the request id is the connection's:
            // one of 0 is replaced, and the same id twice at once waits).
            (h.offset, h.length) = (expect as u32, (expect >> 32) as u32);
            (h.epoch, h.sender, h.obj_version, h.unlogged) = (epoch, self.id, version, true);
            match self.call_osd(to, h, data.as_ref()).await {
                Ok(f) => f.h.status,
                Err(why) => return Err(PeerError::Retry(why)),
            }
        };
        crate::peering::pushed(s, oid, version, to)
    }

    /// The versions OSD `x` holds of the shard objects `names`.
    async fn shard_versions(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        x: &Member,
        names: Vec<ObjectId>,
    ) -> Result<BTreeMap<ObjectId, u64>, PeerError> {
        let mut out = BTreeMap::new();
        for part in names.chunks(2048) {
            let ask = vec![(x.osd, Ask::Versions(part.to_vec()))];
            for (_, _, r) in self.query_each(pg, epoch, ask).await {
                out.extend(r.map_err(PeerError::Retry)?.objects);
            }
        }
        Ok(out)
    }

    /// The shard objects the shards `of` hold, with their versions.
    async fn ec_listing(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        of: &[Member],
    ) -> Result<BTreeMap<ObjectId, u64>, PeerError> {
        let asks = of.iter().map(|m| (m.osd, Ask::Listing)).collect();
        let mut all: BTreeMap<ObjectId, u64> = BTreeMap::new();
        for (_, _, r) in self.query_each(pg, epoch, asks).await {
            for (oid, v) in r.map_err(PeerError::Retry)?.objects {
                let e = all.entry(oid).or_default();
                *e = (*e).max(v);
            }
        }
        Ok(all)
    }

    /// Rebuilds shard `x.0` of `oid` on OSD `x.1` ([`Osd::decode_shard`]),
    /// the push fenced by `expect`, the version it holds there.
    #[allow(clippy::too_many_arguments)]
    async fn rebuild_shard(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        scheme: &Scheme,
        oid: ObjectId,
        x: (usize, u32),
        held: &[(usize, u32)],
        newest: Option<&LogEntry>,
        expect: u64,
    ) -> Result<(), PeerError> {
        let (version, data) =
            (self.decode_shard(pg, epoch, scheme, oid, x.0, held, newest)).await?;
        let shard = oid.whole().shard(x.0 as u8);
        (self.push_shard(x.1, pg, epoch, shard, version, expect, data)).await
    }

    /// Shard `slot` of `oid` as the first `k` of the `held` shards,
    /// (slot, OSD), make it — or absent, if the object's newest op,
    /// `newest`, is a delete, or no holder has it — at the newest version
    /// of the shards read and of `newest`.
    #[allow(clippy::too_many_arguments)]
    async fn decode_shard(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        scheme: &Scheme,
        oid: ObjectId,
        slot: usize,
        held: &[(usize, u32)],
        newest: Option<&LogEntry>,
    ) -> Result<(u64, Option<AlignedBuf>), PeerError> {
        let (k, n) = (scheme.layout.k, scheme.layout.k + scheme.layout.m);
        if let Some(e) = newest.filter(|e| e.op == LogOp::Delete) {
            return Ok((e.version, None));
        }
        let len = scheme.layout.shard_bytes;
        // The first `k` sources, but one whose shard fails to read
        // (damaged, an I/O error, no answer) is left for the next.
        let mut from: Vec<(usize, u32)> = held.to_vec();
        let (bufs, version, found) = 'read: loop {
            if from.len() < k {
                return Err(PeerError::Retry(format!(
                    "rebuilding {oid}: fewer than {k} of its shards read"
                )));
            }
            let reads: Vec<_> = (from[..k].iter())
                .map(|m| {
                    let mut h =
                        Header::request(Op::ShardRead, 0, oid.whole().shard(m.0 as u8)).with_pg(pg);
                    (h.epoch, h.sender, h.length) = (epoch, self.id, len);
                    rt::spawn(self.clone().shard_call(m.1, h, None))
                })
                .collect();
            let mut version = newest.map_or(0, |e| e.version);
            let mut bufs: Vec<AlignedBuf> = Vec::with_capacity(k);
            let mut found = false;
            for (&m, r) in from[..k].iter().zip(rt::join_all(reads).await) {
                match r {
                    (Status::Ok, Some(b), v) if b.len() == len as usize => {
                        found = true;
                        version = version.max(v);
                        bufs.push(b);
                    }
                    (Status::NotFound, _, _) => bufs.push(AlignedBuf::zeroed(len as usize)),
                    (Status::Corrupt | Status::Unavailable | Status::Ok, _, _) => {
                        from.retain(|&f| f != m);
                        continue 'read;
                    }
                    (s, _, _) => {
                        return Err(PeerError::Retry(format!(
                            "reading shard {} of {oid} from osd.{}: {s:?}",
                            m.0, m.1
                        )))
                    }
                }
            }
            break (bufs, version, found);
        };
        if !found {
            return Ok((version.max(1), None));
        }
        let mut chunks: Vec<Option<&[u8]>> = vec![None; n];
        for (m, b) in from[..k].iter().zip(&bufs) {
            chunks[m.0] = Some(&b[..]);
        }
        let mut out = AlignedBuf::zeroed(len as usize);
        (scheme
            .codec
            .reconstruct(&chunks, &[slot], &mut [&mut out[..]]))
        .map_err(|e| PeerError::Inactive(format!("rebuilding {oid}: {e}")))?;
        Ok((version, Some(out)))
    }
}

/// The slot OSD `osd` held in PG `pg`'s last active interval, if that was
/// an erasure-coded PG's (whose interval records its row).
pub(crate) fn last_slot(m: &crate::OsdMap, pg: PgId, osd: u32) -> Option<u8> {
    let s = m.last_active(pg)?.row.iter().position(|&o| o == osd)?;
    u8::try_from(s).ok()
}

/// A shard of a PG being peered: its slot, its OSD, its log.
pub(crate) struct Member {
    slot: usize,
    osd: u32,
    log: PgLog,
}

impl Member {
    /// Whether its log names shards of another slot (an OSD that held
    /// another shard of the PG before).
    fn foreign(&self) -> bool {
        (self.log.entries.values()).any(|e| e.oid.shard_index() != Some(self.slot as u8))
    }
}

/// What makes stale shard `x`'s log, `mine` (its [`stripe_log`]), the
/// holders' `auth`, each entry naming its shard, and clears its
/// recovering mark: what it lacks adopted and what they lack forgotten —
/// or, from a log of another slot, every entry. Entries of ops that reach
/// it after `mine` was read (an interval's) are neither.
fn shard_log_sync(x: &Member, mine: &PgLog, auth: &PgLog) -> crate::peering::LogSync {
    let mut sync = match x.foreign() {
        false => crate::peering::LogSync::between(mine, auth),
        true => crate::peering::LogSync {
            forget: mine.entries.keys().copied().collect(),
            adopt: auth.entries.values().copied().collect(),
            tail: if auth.tail > mine.tail { auth.tail } else { 0 },
            ..Default::default()
        },
    };
    for e in &mut sync.adopt {
        e.oid = e.oid.whole().shard(x.slot as u8);
    }
    sync.unmark = true;
    sync
}

/// A shard's log with its entries comparable across shards: each names
/// its whole object and no range, and a rollback (client 0) is a write
/// ([`same_op`]).
fn stripe_log(l: &PgLog) -> PgLog {
    let mut out = l.clone();
    for e in out.entries.values_mut() {
        let (oid, op, _, _) = same_op(e);
        (e.oid, e.op, e.offset, e.len) = (oid, op, 0, 0);
    }
    out
}
