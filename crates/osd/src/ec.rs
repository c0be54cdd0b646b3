//! Erasure-coded PGs (docs/internals/ec.md): the shards' side of the shard
//! ops, the primary's reads and writes, and the peering of a PG whose
//! shards are all up.
//!
//! The OSD at slot `s` of a PG's row holds shard `s` of each of its
//! objects, stored as `oid.shard(s)`. A read gathers the ranges
//! [`Layout::data_ranges`] names from the data shards. A write of version
//! `v` goes to every shard: the data shards it touches get their new bytes
//! and the parity shards the parity delta, both as undoable writes (each
//! shard keeps what it replaced until the write committed), the others the
//! log entry alone; it is acknowledged once every shard has it, and then
//! the shards release their undos (`Op::ShardCommit`). A delete deletes
//! every shard, logged.
//!
//! Peering takes an EC PG active only with every shard up, in the slots
//! and with the stores it last had, so that an op not on every shard was
//! never acknowledged: a write some shards lack is rolled back from the
//! undos of those that prepared it, a delete rolled forward; otherwise
//! the PG stays inactive and says why, rather than serve a stripe it
//! cannot vouch for. Not built yet: degraded reads and writes, peering
//! with shards missing (rule 3 of docs/internals/ec.md's counting),
//! recovery of a shard from `k` others, moving shards, scrub.
//! No pool of the kind can be created yet (`map::check_served`); the
//! simulator builds one.

use std::collections::BTreeMap;
use std::rc::Rc;

use nacre_blockstore::{LogEntry, LogOp};
use nacre_ec::{Codec, Layout};
use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_net::Transport;
use nacre_types::{ObjectId, PgId};
use nacre_wire::{Header, Op, Status, SETTLE_DELETE, SETTLE_ROLL_BACK, SHARD_COMMIT_ENTRY_BYTES};

use crate::peering::{Ask, PeerError};
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
    /// sending, the object in the PG, and the shard this OSD's slot.
    pub(crate) fn check_shard_route(&self, h: &Header) -> Option<Status> {
        let map = self.map.borrow();
        if h.epoch != map.epoch() {
            return Some(Status::StaleEpoch);
        }
        if map.pg_of(h.oid) != Some(h.pg_id()) || self.scheme(h.pool).is_none() {
            return Some(Status::Invalid);
        }
        if !self.sent_by_primary(&map, h) || !map.is_acting(h.pg_id(), self.id) {
            return Some(Status::NotPrimary);
        }
        drop(map);
        let shard_ok = match h.op {
            Op::ShardCommit => h.oid.shard_index().is_none(),
            _ => h.oid.shard_index().is_some() && h.oid.shard_index() == self.slot(h.pg_id()),
        };
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
    pub(crate) async fn answer_shard_read(&self, h: &Header) -> (Header, Option<AlignedBuf>) {
        match self.store.read(h.oid, h.offset, h.length).await {
            Ok(buf) => {
                let mut r = h.reply(Status::Ok).with_payload(&buf);
                r.obj_version = self.store.version(h.oid).unwrap_or(0);
                (r, Some(buf))
            }
            Err(e) => (h.reply(status_of(&e)), None),
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
        let r = match (h.op, data) {
            (Op::ShardDelete, _) => self.store.delete_logged(e).await,
            (_, None) => self.store.log_only(e).await,
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
            (_, Some(d)) => {
                (self.store)
                    .write_undoable(e, h.offset, h.length, move |_| d)
                    .await
            }
        };
        match r {
            Ok(()) => Status::Ok,
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
                            self.store.write_logged(e, off, b).await
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

    /// `Op::ShardCommit`: releases the undos of the writes named (this
    /// OSD's shard of each object).
    pub(crate) fn answer_shard_commit(&self, h: &Header, body: &[u8]) -> Status {
        let Some(s) = self.slot(h.pg_id()) else {
            return Status::NotPrimary;
        };
        for e in body.chunks_exact(SHARD_COMMIT_ENTRY_BYTES) {
            let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
            let oid = ObjectId::new(word(0), word(8));
            self.store.release_undo(oid.shard(s), word(16));
        }
        Status::Ok
    }

    /// Sends shard op `h` (to the OSD at slot `s`) or applies it here; its
    /// status and, for a read, the bytes (zeros where the shard is absent).
    async fn shard_call(
        self: Rc<Self>,
        to: u32,
        h: Header,
        data: Option<AlignedBuf>,
    ) -> (Status, Option<AlignedBuf>) {
        if to == self.id {
            // As a shard would: nothing of an epoch that ended.
            if h.op != Op::ShardRead && h.epoch != self.epoch() {
                return (Status::StaleEpoch, None);
            }
            return match h.op {
                Op::ShardRead => match self.store.read(h.oid, h.offset, h.length).await {
                    Ok(b) => (Status::Ok, Some(b)),
                    Err(nacre_blockstore::Error::NotFound(_)) => (Status::NotFound, None),
                    Err(e) => (status_of(&e), None),
                },
                Op::ShardCommit => (
                    self.answer_shard_commit(&h, data.as_deref().unwrap_or(&[])),
                    None,
                ),
                Op::ShardSettle => (self.settle_shard(&h).await, None),
                _ => (self.apply_shard_op(&h, data).await, None),
            };
        }
        match self.call_osd(to, h, data.as_ref()).await {
            Ok(f) => (f.h.status, f.payload),
            Err(why) => {
                tracing::warn!("osd.{}: {why}", self.id);
                (Status::Unavailable, None)
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
    /// shards, gathered (zeros where a shard does not hold the object).
    pub(crate) async fn ec_read(self: &Rc<Self>, h: &Header) -> Result<AlignedBuf, Status> {
        let scheme = self.scheme(h.pool).ok_or(Status::Invalid)?;
        let row = self.map.borrow().placement(h.pg_id()).to_vec();
        let ranges =
            (scheme.layout.data_ranges(h.offset, h.length)).map_err(|_| Status::Invalid)?;
        let reads: Vec<_> = (ranges.iter())
            .map(|r| {
                let mut sub = self.shard_header(h, Op::ShardRead, r.shard, 0);
                (sub.offset, sub.length) = (r.offset, r.len);
                rt::spawn(self.clone().shard_call(row[r.shard], sub, None))
            })
            .collect();
        let mut bufs = Vec::with_capacity(ranges.len());
        let mut found = false;
        for (r, t) in ranges.iter().zip(reads) {
            match t.await {
                (Status::Ok, Some(b)) if b.len() == r.len as usize => {
                    found = true;
                    bufs.push(b);
                }
                (Status::NotFound, _) => bufs.push(AlignedBuf::zeroed(r.len as usize)),
                (s, _) => {
                    return Err(if s == Status::Ok {
                        Status::Unavailable
                    } else {
                        s
                    })
                }
            }
        }
        if !found {
            return Err(Status::NotFound);
        }
        let parts: Vec<_> = ranges
            .iter()
            .copied()
            .zip(bufs.iter().map(|b| &b[..]))
            .collect();
        let mut out = AlignedBuf::zeroed(h.length as usize);
        (scheme.layout.gather(h.offset, &parts, &mut out)).map_err(|_| Status::Invalid)?;
        Ok(out)
    }

    /// The primary's write or delete of an EC PG's object at `version`,
    /// on every shard (the object locked, the PG active and whole).
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
        let row = self.map.borrow().placement(h.pg_id()).to_vec();
        let mut ops: Vec<(u32, Header, Option<AlignedBuf>)> = Vec::with_capacity(k + m);
        match data {
            None => {
                for (s, &o) in row.iter().enumerate() {
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
                // What the range holds now: the parity delta needs it.
                let mut read = *h;
                (read.op, read.length, read.payload_len, read.payload_crc) = (Op::Read, len, 0, 0);
                let old = match self.ec_read(&read).await {
                    Ok(b) => b,
                    Err(Status::NotFound) => AlignedBuf::zeroed(len as usize),
                    Err(s) => return s,
                };
                let Ok(delta) = l.parity_delta(&scheme.codec, offset, &old, &new) else {
                    return Status::Invalid;
                };
                // The read may have outlived the epoch: nothing is
                // written then (a write some shards take and others
                // refuse leaves the PG waiting for the roll back, which
                // is not built yet).
                if self.epoch() != h.epoch
                    || self.pg_state(h.pg_id()) != Some(crate::PgState::Active)
                {
                    return Status::StaleEpoch;
                }
                for (s, &o) in row.iter().enumerate() {
                    let mut sub = self.shard_header(h, Op::ShardWrite, s, version);
                    let payload = if s < k {
                        parts.iter().find(|(r, _)| r.shard == s).map(|(r, b)| {
                            (sub.offset, sub.length) = (r.offset, r.len);
                            AlignedBuf::from_slice(b)
                        })
                    } else {
                        (sub.offset, sub.length, sub.xor) = (p0, plen, true);
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
        for (o, mut t) in tasks {
            let s = self.replica_status(o, &mut t, h.epoch).await;
            if status == Status::Ok && s != Status::Ok {
                status = s;
            }
        }
        if status == Status::Ok && h.op == Op::Write {
            // Every shard has it: committed; the shards may drop what it
            // replaced (sent now, not with the next write: a shard's room
            // for undos waits for releases).
            rt::spawn(
                self.clone()
                    .commit_shards(h.pg_id(), row, vec![(h.oid, version)]),
            );
        }
        status
    }

    /// Tells every shard of `row` that `writes` committed.
    async fn commit_shards(self: Rc<Self>, pg: PgId, row: Vec<u32>, writes: Vec<(ObjectId, u64)>) {
        let epoch = self.epoch();
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
            for &o in &row {
                let (s, _) = (self.clone())
                    .shard_call(o, h, Some(AlignedBuf::from_slice(&body)))
                    .await;
                if s != Status::Ok {
                    // The next peering releases what is left.
                    tracing::debug!("osd.{}: commit to osd.{o} of PG {pg}: {s:?}", self.id);
                }
            }
        }
    }

    /// Settles the ops above `floor` that some shards of `row` (whose logs
    /// are `logs`, in `row`'s order) lack, object by object: the newest
    /// op of an object, if partial, is rolled back (a write: every shard
    /// that prepared it restores its undo at a new version of this
    /// interval, the others log that version) or forward (a delete, which
    /// left no undo: the shards lacking it apply it); older partial
    /// entries of it are forgotten where held (a settle cut short). Safe
    /// because none was acknowledged: an acknowledged op is on every shard
    /// of its interval, and every shard of the last active one is here
    /// (docs/internals/ec.md, *Settling a write some shards hold*). The
    /// number of objects settled.
    async fn settle_ops(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        row: &[u32],
        logs: &[(u32, nacre_blockstore::PgLog)],
    ) -> Result<usize, PeerError> {
        // Per version: the slots holding it, and its entry (as the first
        // holder has it; every holder must name the same op).
        let same = same_op;
        // Every shard's entries above its own tail: a version one shard
        // still logs may be below another's tail (its log, capped, dropped
        // it), and is partial only where a shard whose log reaches that
        // far lacks it.
        let mut held: BTreeMap<u64, (Vec<usize>, LogEntry)> = BTreeMap::new();
        for (slot, (_, l)) in logs.iter().enumerate() {
            for (&v, e) in l.entries.range(l.tail + 1..) {
                let (slots, first) = held.entry(v).or_insert((Vec::new(), *e));
                if same(first) != same(e) {
                    return Err(PeerError::Inactive(format!(
                        "version {v:#x} names two ops on the shards"
                    )));
                }
                slots.push(slot);
            }
        }
        let lacks = |slot: usize, v: u64| logs[slot].1.tail < v && !held[&v].0.contains(&slot);
        let mut objects: BTreeMap<ObjectId, Vec<u64>> = BTreeMap::new();
        for (&v, (_, e)) in &held {
            if (0..row.len()).any(|s| lacks(s, v)) {
                objects.entry(e.oid.whole()).or_default().push(v);
            }
        }
        let newest: BTreeMap<ObjectId, u64> = (held.iter())
            .map(|(&v, (_, e))| (e.oid.whole(), v))
            .collect();
        for (&oid, partial) in &objects {
            let top = newest[&oid];
            let mut forget: Vec<u64> = partial.clone();
            if partial.last() == Some(&top) {
                let (_, e) = &held[&top];
                let all: Vec<usize> = (0..row.len()).collect();
                let (kind, version, client, request, to) = match (e.op, e.client) {
                    // A rollback cut short (a delete on a shard whose
                    // undo said the object was new, a write elsewhere):
                    // completed as it was begun.
                    (_, 0) => (SETTLE_ROLL_BACK, top, 0, e.request, all),
                    (LogOp::Delete, _) => {
                        let lacking = all.into_iter().filter(|&s| lacks(s, top)).collect();
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
                    .map(|s| {
                        let shard = oid.shard(s as u8);
                        let mut h = Header::request(Op::ShardSettle, request, shard).with_pg(pg);
                        (h.epoch, h.sender, h.client) = (epoch, self.id, client);
                        (h.obj_version, h.offset) = (version, kind);
                        rt::spawn(self.clone().shard_call(row[s], h, None))
                    })
                    .collect();
                for (s, _) in rt::join_all(calls).await {
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
                for &s in &held[&v].0 {
                    self.log_sync(row[s], pg, epoch, &sync).await?;
                }
            }
        }
        Ok(objects.len())
    }

    /// Peering of an EC PG: active only with every shard up (in the slots
    /// and with the stores it last had), ops not on every shard settled,
    /// and every shard's log the same (every write any shard holds is on all, so
    /// committed); otherwise inactive, saying why.
    pub(crate) async fn try_peer_ec(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
    ) -> Result<(), PeerError> {
        let (row, whole, prior) = {
            let m = self.map.borrow();
            let prior = m.last_active(pg).cloned();
            // Every member must hold the shard of its slot: the same row
            // as the last interval that went active, each with its store.
            let same = prior.as_ref().is_none_or(|p| {
                p.acting == m.placement(pg) && p.acting.iter().all(|&o| m.holds(p, o))
            });
            (m.placement(pg).to_vec(), m.whole(pg) && same, prior)
        };
        if !whole {
            return Err(PeerError::Inactive(
                "an erasure-coded PG is served with every shard up, in the slots and with the stores it last had, only (degraded EC and moving shards are not built yet)".into(),
            ));
        }
        let asks = row.iter().map(|&o| (o, Ask::Undos)).collect();
        let mut logs = Vec::with_capacity(row.len());
        // Every shard's undos, by object (whole), the newest version.
        let mut undos: BTreeMap<ObjectId, u64> = BTreeMap::new();
        for (id, _, r) in self.query_each(pg, epoch, asks).await {
            match r {
                Ok(i) => {
                    for (oid, v) in i.objects {
                        let u = undos.entry(oid.whole()).or_default();
                        *u = (*u).max(v);
                    }
                    logs.push((id, i.log));
                }
                Err(why) => return Err(PeerError::Retry(why)),
            }
        }
        if self.epoch() != epoch {
            return Err(PeerError::Retry("the epoch moved".into()));
        }
        // Entries compared as the same op on every shard (each names its
        // shard's object and range), above every shard's tail.
        let floor = logs.iter().map(|(_, l)| l.tail).max().unwrap_or(0);
        let ops = |log: &nacre_blockstore::PgLog| -> BTreeMap<u64, (ObjectId, LogOp, u64, u64)> {
            (log.entries.range(floor + 1..))
                .map(|(&v, e)| (v, same_op(e)))
                .collect()
        };
        // Each log names its own slot's shard (a shard in another slot
        // is not this one), and a PG never active has no history.
        let slot_of = |id: u32| row.iter().position(|&o| o == id).map(|s| s as u8);
        let misplaced = logs
            .iter()
            .find(|(id, l)| (l.entries.values()).any(|e| e.oid.shard_index() != slot_of(*id)));
        if let Some((id, _)) = misplaced {
            return Err(PeerError::Inactive(format!(
                "osd.{id}'s log names shards of another slot: moving shards is not built yet"
            )));
        }
        if prior.is_none() && logs.iter().any(|(_, l)| !l.entries.is_empty()) {
            return Err(PeerError::Inactive(
                "shards hold history of a PG never active".into(),
            ));
        }
        // An op not on every shard was never acknowledged (every shard of
        // the last active interval is here): settle it, then look again.
        let settled = self.settle_ops(pg, epoch, &row, &logs).await?;
        if settled > 0 {
            return Err(PeerError::Retry(format!(
                "settled {settled} ops not on every shard"
            )));
        }
        let first = ops(&logs[0].1);
        if let Some((id, _)) = logs.iter().find(|(_, l)| ops(l) != first) {
            return Err(PeerError::Inactive(format!(
                "the shards' logs differ (osd.{} and osd.{id}) where no op is partial",
                logs[0].0
            )));
        }
        // Every write any shard holds is on every shard: every undo the
        // shards keep is of a committed write (also those whose entries a
        // capped log dropped, after a lost commit): release them all.
        if !undos.is_empty() {
            (self.clone())
                .commit_shards(pg, row.clone(), undos.into_iter().collect())
                .await;
        }
        self.report(
            pg,
            epoch,
            &PgEvent::Active {
                clean: true,
                incomplete: Vec::new(),
            },
        )
        .await
        .map_err(PeerError::Retry)?;
        self.done
            .borrow_mut()
            .insert(pg, ReqCache::of_log(&logs[0].1));
        Ok(())
    }
}
