//! Undoable writes: a write that keeps what it replaced until the caller
//! releases it, so that it can still be rolled back (an erasure-coded
//! shard keeps the previous version of the units a write changed until
//! the write has committed on every shard of its stripe;
//! docs/internals/ec.md).
//!
//! [`Store::write_undoable`] reads the range it is about to replace (or
//! notes that the object does not exist), and journals an `Undo` record
//! with those bytes immediately before the write's own record. Batches
//! are applied in journal order and replay stops at the first bad one, so
//! after any crash the store holds either the write and its undo, or
//! neither, or the undo alone (then it is dropped: its write never
//! happened).
//!
//! **Invariant** (checked under `strict` at the end of replay, asserted by
//! the crash test against its model): an object with an undo is stored at
//! exactly the undo's version, and the undo's bytes are the object's bytes
//! over its range at the version before (or the undo says it was absent).
//! A later write (or a recovery, at a higher version) or a delete drops
//! the undo; a repair (the same version rewritten) keeps it.
//!
//! Undo bytes live in the journal, which a checkpoint trims: before a
//! checkpoint moves the journal's tail past an undo's record (held, or
//! staged: its write may sit in a later batch), it journals the undo
//! again (`relog_undos`), so an undo lasts until it is released, across
//! any number of checkpoints and restarts. A release is journaled too
//! (a `Release` record, lazily, with the next batch), so a crash brings
//! back only undos released since the last batch was made durable.
//!
//! The journal cost of the undos held (their bytes padded to 4 KiB, plus
//! a record header each: `undo_cost`) is bounded (`undo_bytes_max`, a
//! sixteenth of the journal), and so is what a crash brings back (the
//! undos held then, and those released since the last durable batch,
//! which were held at that time: two sixteenths), so re-logging them
//! always fits the fifth of the journal kept back for the checkpointer;
//! an undoable write that would pass the bound waits for releases.

use std::rc::Rc;

use nacre_io::sync::oneshot;
use nacre_io::{AlignedBuf, BlockDev};
use nacre_types::ObjectId;

use crate::error::{Error, Result};
use crate::format::RecordKind;
use crate::index::Overlay;
use crate::journal::{chunk_csums, Record};
use crate::pglog::{LogEntry, LogOp};
use crate::store::{Inner, Queued, State, Store, READ_RETRY_MAX};

/// What an object held before its newest write, kept for rolling that
/// write back.
#[derive(Debug)]
pub struct Undo {
    /// The version of the write this undoes (the object's version now).
    pub version: u64,
    /// The bytes the write replaced and where they were; `None`: the
    /// object did not exist before the write.
    pub before: Option<(u32, AlignedBuf)>,
}

/// The bit of [`ObjectId::block`] that names an object's *hidden* twin,
/// which holds the block an undo keeps: a volume's block index stays below
/// 2⁵² and a shard's index is in the top byte, so bits 52..56 are free. No
/// op from outside may name it; listings and counts leave it out.
const HIDDEN_BIT: u64 = 1 << 55;

/// The hidden object that holds the block `oid`'s undo keeps.
pub(crate) fn hidden(oid: ObjectId) -> ObjectId {
    ObjectId {
        volume: oid.volume,
        block: oid.block | HIDDEN_BIT,
    }
}

/// Whether `oid` names a hidden object (see [`hidden`]).
pub fn is_hidden(oid: &ObjectId) -> bool {
    oid.block & HIDDEN_BIT != 0
}

/// An undo held in memory.
#[derive(Clone)]
pub(crate) enum Kept {
    /// The bytes the write replaced, in the journal at `data_pos` (and
    /// maybe cached).
    Bytes(Overlay),
    /// The object's whole block as it was, kept under its hidden name;
    /// `pos`: the batch of its record.
    Block { version: u64, pos: u64 },
}

impl Kept {
    pub(crate) fn version(&self) -> u64 {
        match self {
            Kept::Bytes(o) => o.version,
            Kept::Block { version, .. } => *version,
        }
    }

    fn cost(&self) -> u64 {
        match self {
            Kept::Bytes(o) => undo_cost(o.len),
            Kept::Block { .. } => undo_cost(0),
        }
    }

    /// Where its record is in the journal.
    fn pos(&self) -> u64 {
        match self {
            Kept::Bytes(o) => o.data_pos,
            Kept::Block { pos, .. } => *pos,
        }
    }

    fn is_block(&self) -> bool {
        matches!(self, Kept::Block { .. })
    }
}

/// What an applied write did to its object's undos.
#[derive(Default)]
pub(crate) struct Changed {
    /// An older undo that kept a block was dropped: its hidden object goes.
    dropped_block: bool,
    /// The write's own undo keeps a block: the block the write replaces
    /// becomes the hidden object instead of being freed.
    keeps_block: bool,
}

/// Undos held in memory: per object, the applied one and one whose write
/// has not been applied yet (its `Undo` record is, the write's is not).
#[derive(Default)]
pub(crate) struct Undos {
    held: crate::index::OidMap<Kept>,
    staged: crate::index::OidMap<Kept>,
    /// Journal cost (`undo_cost`) of `held` and `staged`.
    bytes: u64,
    /// Bytes of undoable writes admitted and not yet finished (they are in
    /// `held` or `staged` too once their record is applied: counted
    /// twice for a moment, never missed).
    admitted: u64,
    /// Undos in `held` that keep a block (each a hidden object).
    blocks: usize,
}

/// What re-logging an undo of `len` bytes costs the journal, at most: its
/// bytes padded to a 4 KiB sector, and a record header with its checksums.
pub(crate) fn undo_cost(len: u32) -> u64 {
    u64::from(len).div_ceil(4096) * 4096 + 128
}

impl Undos {
    /// Puts `u` in; the undo it replaces, if any.
    fn put(&mut self, staged: bool, oid: ObjectId, u: Kept) -> Option<Kept> {
        self.bytes += u.cost();
        if !staged && u.is_block() {
            self.blocks += 1;
        }
        let map = if staged {
            &mut self.staged
        } else {
            &mut self.held
        };
        let old = map.insert(oid, u)?;
        self.bytes -= old.cost();
        if !staged && old.is_block() {
            self.blocks -= 1;
        }
        Some(old)
    }

    fn take(&mut self, staged: bool, oid: &ObjectId) -> Option<Kept> {
        let map = if staged {
            &mut self.staged
        } else {
            &mut self.held
        };
        let u = map.remove(oid)?;
        self.bytes -= u.cost();
        if !staged && u.is_block() {
            self.blocks -= 1;
        }
        Some(u)
    }

    /// Drops `oid`'s held undo; whether it kept a block (whose hidden
    /// object the caller removes).
    pub(crate) fn drop_held(&mut self, oid: &ObjectId) -> bool {
        self.take(false, oid).is_some_and(|u| u.is_block())
    }

    /// How many held undos keep a block (hidden objects).
    pub(crate) fn block_count(&self) -> usize {
        self.blocks
    }

    /// An `Undo` or `UndoBlock` record applied: ignored if the object is
    /// newer; staged for its write if older; at the object's version
    /// (re-logged by a checkpoint, or, in replay, a write a fuzzy
    /// checkpoint captured) held — but live only in place of the held
    /// undo it copies, so a release made while the copy was being
    /// journaled stands; and one that keeps a block only where the block
    /// is (`has_hidden`: a release or a later write may have removed it).
    pub(crate) fn on_record(
        &mut self,
        stored: Option<u64>,
        rec: &Record,
        data: Option<AlignedBuf>,
        replay: bool,
        has_hidden: bool,
    ) {
        let u = if rec.kind == RecordKind::UndoBlock {
            Kept::Block {
                version: rec.version,
                pos: rec.data_pos,
            }
        } else {
            Kept::Bytes(Overlay {
                offset: rec.offset,
                len: rec.len,
                data_pos: rec.data_pos,
                version: rec.version,
                csums: rec.csums.clone().into_boxed_slice(),
                data: data.filter(|_| rec.len > 0).map(Rc::new),
            })
        };
        match stored {
            Some(v) if v == rec.version => {
                let copies = (self.held.get(&rec.oid))
                    .is_some_and(|h| h.version() == v && h.is_block() == u.is_block());
                if (replay || copies) && (!u.is_block() || has_hidden) {
                    // The same undo again (same version, same block).
                    let _ = self.put(false, rec.oid, u);
                }
            }
            Some(v) if v > rec.version => {}
            _ => {
                let _ = self.put(true, rec.oid, u);
            }
        }
    }

    /// A release of `oid`'s undo at `upto` or older (see
    /// [`Store::release_undo`]); whether it kept a block.
    pub(crate) fn on_release(&mut self, oid: &ObjectId, upto: u64) -> bool {
        if self.held.get(oid).is_some_and(|u| u.version() <= upto) {
            return self.drop_held(oid);
        }
        false
    }

    /// A write of `oid` at `version` applied: its staged undo becomes the
    /// held one; an older undo is dropped.
    pub(crate) fn on_write(&mut self, oid: ObjectId, version: u64) -> Changed {
        let mut out = Changed::default();
        if let Some(s) = self.staged.get(&oid).map(Kept::version) {
            if s <= version {
                let u = self.take(true, &oid).expect("staged undo present");
                if s == version {
                    out.keeps_block = u.is_block();
                    let old = self.put(false, oid, u);
                    out.dropped_block = old.is_some_and(|o| o.is_block());
                    return out;
                }
            }
        }
        if self.held.get(&oid).is_some_and(|u| u.version() < version) {
            out.dropped_block = self.drop_held(&oid);
        }
        out
    }

    /// A delete of `oid` applied; whether its held undo kept a block.
    pub(crate) fn on_delete(&mut self, oid: &ObjectId) -> bool {
        self.take(true, oid);
        self.drop_held(oid)
    }

    /// After replay: staged undos whose write never came are dropped, and
    /// so is any undo whose object is not at its version, or that keeps a
    /// block no hidden object holds; then every hidden object no held
    /// undo names is removed.
    pub(crate) fn settle(&mut self, index: &mut crate::index::Index) {
        let staged: Vec<ObjectId> = self.staged.keys().copied().collect();
        for oid in staged {
            self.take(true, &oid);
        }
        let stale: Vec<ObjectId> = (self.held.iter())
            .filter(|(oid, u)| {
                index.version(oid) != Some(u.version())
                    || (u.is_block() && index.block_of(&hidden(**oid)).is_none())
            })
            .map(|(oid, _)| *oid)
            .collect();
        for oid in stale {
            self.drop_held(&oid);
        }
        let mut orphans = Vec::new();
        index.for_each(|o| {
            if is_hidden(&o) {
                orphans.push(o);
            }
        });
        for h in orphans {
            let base = ObjectId {
                volume: h.volume,
                block: h.block & !HIDDEN_BIT,
            };
            if !self.held.get(&base).is_some_and(Kept::is_block) {
                index.clear_block(&h);
            }
        }
    }

    /// `strict`: every held undo is at its object's version, and one that
    /// keeps a block has its hidden object.
    pub(crate) fn check(&self, index: &crate::index::Index) {
        for (oid, u) in &self.held {
            crate::strict_assert!(
                index.version(oid) == Some(u.version()),
                "undo of {oid} at {} with the object at {:?}",
                u.version(),
                index.version(oid)
            );
            crate::strict_assert!(
                !u.is_block() || index.block_of(&hidden(*oid)).is_some(),
                "the undo of {oid} keeps a block no hidden object holds"
            );
        }
    }

    pub(crate) fn memory_bytes(&self) -> u64 {
        let cached: u64 = (self.held.values().chain(self.staged.values()))
            .filter_map(|u| match u {
                Kept::Bytes(o) if o.data.is_some() => Some(u64::from(o.len)),
                _ => None,
            })
            .sum();
        cached + 64 * (self.held.len() + self.staged.len()) as u64
    }
}

/// What an undoable write's record says it replaced: the bytes of its
/// range (`None`: the object did not exist), or the object's whole block,
/// which the write keeps instead of freeing.
pub(crate) enum Before {
    Bytes(Option<(u32, AlignedBuf)>),
    Block,
}

/// How an undoable write gets its new bytes: made from the old ones, or
/// given (then a whole-block write may keep the old block as its undo
/// instead of reading and journaling its bytes).
enum Make<F> {
    From(F),
    Given(AlignedBuf),
}

impl<D: BlockDev + 'static> Store<D> {
    /// A logged write of `len` bytes at `offset` of `entry.oid` at
    /// `entry.version` that can be rolled back: the store reads the range
    /// (`None` if the object does not exist), `make` turns those bytes into
    /// the new ones (`len` of them), and the write is journaled together
    /// with what it replaced ([`Store::undo`]), kept until
    /// [`Store::release_undo`]. Nothing else may write the object
    /// meanwhile: the read and the write are one step (the store waits for
    /// ops in flight on it first, and starts again if one slips in). A
    /// repeat of the version (the log holding this same entry) is done
    /// without calling `make`.
    pub async fn write_undoable(
        &self,
        entry: LogEntry,
        offset: u32,
        len: u32,
        make: impl FnOnce(Option<&[u8]>) -> AlignedBuf,
    ) -> Result<()> {
        self.undoable(entry, offset, len, Make::From(make)).await
    }

    /// [`Store::write_undoable`] of `data`, which does not depend on what
    /// it replaces: a write of a whole block over an object that has one
    /// (and no overlay) keeps that block as its undo — read to check its
    /// checksums, no undo bytes in the journal — while the blocks kept
    /// stay under a sixteenth of the store and the free ones well above
    /// the reserve; any other is made as `write_undoable`.
    pub async fn replace_undoable(
        &self,
        entry: LogEntry,
        offset: u32,
        data: AlignedBuf,
    ) -> Result<()> {
        let len = data.len() as u32;
        self.undoable(
            entry,
            offset,
            len,
            Make::<fn(Option<&[u8]>) -> AlignedBuf>::Given(data),
        )
        .await
    }

    async fn undoable(
        &self,
        entry: LogEntry,
        offset: u32,
        len: u32,
        make: Make<impl FnOnce(Option<&[u8]>) -> AlignedBuf>,
    ) -> Result<()> {
        let inner = &self.0;
        inner.check_entry(&entry, LogOp::Write)?;
        if entry.offset != offset || entry.len != len {
            return Err(Error::Invalid(format!(
                "log entry of {}+{} given with an undoable write of {len} bytes at {offset}",
                entry.offset, entry.len
            )));
        }
        inner.check_range(offset, len)?;
        let oid = entry.oid;
        let given = matches!(make, Make::Given(_));
        let whole = offset == 0 && len == inner.g.block_bytes;
        let fits = |cost: u64| {
            if cost > inner.undo_bytes_max() {
                return Err(Error::Invalid(format!(
                    "an undoable write of {len} bytes: at most {} (a sixteenth of the journal)",
                    inner.undo_bytes_max() - undo_cost(0)
                )));
            }
            Ok(())
        };
        if !given || !whole {
            fits(undo_cost(len))?;
        }
        let mut make = Some(make);
        let mut room: Option<Admitted<'_, D>> = None;
        for _ in 0..READ_RETRY_MAX {
            inner.wait_idle(&oid).await?;
            let stored = inner.st.borrow().index.version(&oid);
            match stored {
                // A repeat (or another op at this version, which the
                // write refuses after checking the log): no undo.
                Some(v) if v >= entry.version => {
                    let data = AlignedBuf::zeroed(len as usize);
                    return self.logged_write(entry, offset, data.into(), None).await;
                }
                _ => {}
            }
            // The old block kept whole: only where the object's content
            // is its block alone (no overlay), while few are kept, and
            // while the free blocks could still take a rollback of each
            // (a rollback writes a new block before its kept one goes).
            let keep = given && whole && {
                let st = inner.st.borrow();
                let few = (inner.g.nblocks / 16) as usize;
                st.index.block_of(&oid).is_some()
                    && !st.index.pending.contains_key(&oid)
                    && st.undos.block_count() < few
                    && st.alloc.free_count() as usize > st.reserve_blocks as usize + 2 * few
            };
            let cost = undo_cost(if keep { 0 } else { len });
            if room.as_ref().map(|r| r.1) != Some(cost) {
                // Waiting for room may let other ops in: look again (with
                // no claim held meanwhile).
                drop(room.take());
                fits(cost)?;
                room = Some(Admitted::reserve(inner, cost).await?);
                continue;
            }
            // A kept block is read too, not copied: an undo whose bytes
            // fail their checksum could never be rolled back to, so a
            // write over damaged bytes is refused (`Corrupt`) either way.
            let before = match stored {
                Some(_) => Some(inner.read(oid, offset, len).await?),
                None => None,
            };
            // Nothing may have changed the object since it was read (nor,
            // for a kept block, put an overlay over it).
            let moved = {
                let st = inner.st.borrow();
                st.index.version(&oid) != stored
                    || st.inflight.contains_key(&oid)
                    || (keep && st.index.pending.contains_key(&oid))
            };
            if moved {
                continue;
            }
            let (data, undo) = match make.take().expect("made once") {
                Make::Given(d) if keep => (d, Before::Block),
                Make::Given(d) => (d, Before::Bytes(before.map(|b| (offset, b)))),
                Make::From(f) => {
                    let d = f(before.as_deref());
                    (d, Before::Bytes(before.map(|b| (offset, b))))
                }
            };
            if data.len() != len as usize {
                return Err(Error::Invalid(format!(
                    "an undoable write of {len} bytes made {}",
                    data.len()
                )));
            }
            return self
                .logged_write(entry, offset, data.into(), Some(undo))
                .await;
        }
        Err(Error::Busy(format!(
            "{oid} kept changing while an undoable write read it"
        )))
    }

    /// What `oid` held before its newest write, if that write was
    /// undoable and its undo is not released.
    pub async fn undo(&self, oid: ObjectId) -> Result<Option<Undo>> {
        let inner = &self.0;
        for _ in 0..READ_RETRY_MAX {
            let epoch = inner.epoch.get();
            let Some(u) = inner.st.borrow().undos.held.get(&oid).cloned() else {
                return Ok(None);
            };
            let (version, bytes) = match &u {
                Kept::Bytes(o) if o.len == 0 => {
                    return Ok(Some(Undo {
                        version: o.version,
                        before: None,
                    }))
                }
                Kept::Bytes(o) => (
                    o.version,
                    match &o.data {
                        Some(d) => Ok((o.offset, AlignedBuf::from_slice(d))),
                        None => (inner.read_overlay(o, 0, o.len).await).map(|(b, _)| (o.offset, b)),
                    },
                ),
                Kept::Block { version, .. } => (
                    *version,
                    (inner.read(hidden(oid), 0, inner.g.block_bytes).await).map(|b| (0, b)),
                ),
            };
            // The undo may have been replaced while it was read (a kept
            // block is read by its hidden name, which a newer undo reuses).
            let same = (inner.st.borrow().undos.held.get(&oid))
                .is_some_and(|n| n.version() == version && n.is_block() == u.is_block());
            match bytes {
                Ok(_) if !same => continue,
                Ok(before) => {
                    return Ok(Some(Undo {
                        version,
                        before: Some(before),
                    }))
                }
                // The journal moved under the read (the undo was
                // re-logged), or the undo went meanwhile.
                Err(_) if inner.epoch.get() != epoch => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Busy(format!("the undo of {oid} kept moving")))
    }

    /// Whether `oid` is settled: no op on it in flight and no undo held
    /// (every write of it that landed here committed).
    pub fn settled(&self, oid: ObjectId) -> bool {
        let st = self.0.st.borrow();
        !st.inflight.contains_key(&oid) && !st.undos.held.contains_key(&oid)
    }

    /// The objects holding an undo, with its version, sorted.
    pub fn undos(&self) -> Vec<(ObjectId, u64)> {
        let st = self.0.st.borrow();
        let mut v: Vec<(ObjectId, u64)> = (st.undos.held.iter())
            .map(|(oid, u)| (*oid, u.version()))
            .collect();
        v.sort();
        v
    }

    /// Drops `oid`'s undo if it is for version `upto` or older: that write
    /// committed and will never be rolled back (a block it kept is freed
    /// at the next checkpoint). In memory: after a crash a released undo
    /// may be back (harmless: the write it undoes is the object's newest,
    /// and the caller decides whether to roll back).
    pub fn release_undo(&self, oid: ObjectId, upto: u64) {
        let mut st = self.0.st.borrow_mut();
        if st.undos.held.get(&oid).is_some_and(|u| u.version() <= upto) {
            if st.undos.drop_held(&oid) {
                drop_hidden(&mut st, oid, false);
            }
            // Journaled with the next batch, without waking the writer
            // (after a crash before it, the undo is back: harmless).
            let (done, _) = oneshot();
            st.writer.queue.push_back(Queued {
                rec: Record::bare(RecordKind::Release, oid, upto, None),
                data: None,
                data_done: None,
                durable: false,
                checkpoint: false,
                done,
            });
            drop(st);
            self.0.applied.notify();
        }
    }
}

/// A write of `oid` at `version` applied ([`Undos::on_write`]): the hidden
/// object of an undo it dropped goes. Whether the write's own undo keeps
/// the block it replaces.
pub(crate) fn on_write(st: &mut State, oid: ObjectId, version: u64, replay: bool) -> bool {
    let changed = st.undos.on_write(oid, version);
    if changed.dropped_block {
        drop_hidden(st, oid, replay);
    }
    changed.keeps_block
}

/// Removes `oid`'s hidden object (the block an undo of it kept); the block
/// is free from the next checkpoint (at once in replay, whose allocator is
/// built afterwards).
pub(crate) fn drop_hidden(st: &mut State, oid: ObjectId, replay: bool) {
    if let Some(b) = st.index.clear_block(&hidden(oid)) {
        if !replay {
            st.alloc.defer(b);
        }
    }
}

/// An undoable write's claim on the undo room, from admission to its end.
struct Admitted<'a, D: BlockDev>(&'a Inner<D>, u64);

impl<'a, D: BlockDev + 'static> Admitted<'a, D> {
    /// Waits until `cost` more fits the room (or nothing else is in it:
    /// one alone always fits), and claims it in the same step.
    async fn reserve(inner: &'a Inner<D>, cost: u64) -> Result<Self> {
        loop {
            {
                let mut st = inner.st.borrow_mut();
                let used = st.undos.bytes + st.undos.admitted;
                if used == 0 || used + cost <= inner.undo_bytes_max() {
                    st.undos.admitted += cost;
                    return Ok(Admitted(inner, cost));
                }
            }
            inner.check_writable()?;
            inner.applied.wait().await;
        }
    }
}

impl<D: BlockDev> Drop for Admitted<'_, D> {
    fn drop(&mut self) {
        self.0.st.borrow_mut().undos.admitted -= self.1;
        self.0.applied.notify();
    }
}

impl<D: BlockDev + 'static> Inner<D> {
    /// The most undo bytes held at once: re-logging them must fit the
    /// journal space kept for the checkpointer (a fifth of the journal).
    pub(crate) fn undo_bytes_max(&self) -> u64 {
        self.g.journal_bytes / 16
    }

    /// Queues the `Undo` (or `UndoBlock`) record of the write of `oid` at
    /// `version` about to be queued.
    pub(crate) fn enqueue_undo(
        &self,
        oid: ObjectId,
        version: u64,
        before: Before,
        durable: bool,
        checkpoint: bool,
    ) -> nacre_io::sync::Receiver<Result<()>> {
        let (kind, offset, data) = match before {
            Before::Bytes(Some((o, d))) => (RecordKind::Undo, o, Some(d)),
            Before::Bytes(None) => (RecordKind::Undo, 0, None),
            Before::Block => (RecordKind::UndoBlock, 0, None),
        };
        let len = data.as_ref().map_or(0, |d| d.len() as u32);
        let (tx, rx) = oneshot();
        self.enqueue(Queued {
            rec: Record {
                kind,
                oid,
                version,
                offset,
                len,
                block: 0,
                csums: data.as_deref().map(chunk_csums).unwrap_or_default(),
                data_pos: 0,
                entry: None,
            },
            data,
            data_done: None,
            durable,
            checkpoint,
            done: tx,
        });
        rx
    }

    /// Journals again every undo whose record lies before journal position
    /// `j`, durably: the checkpoint about to move the tail to `j` would
    /// otherwise drop its bytes (or, for a kept block, the record naming
    /// it; the block itself is in the object table, under its hidden name).
    pub(crate) async fn relog_undos(&self, j: u64) -> Result<()> {
        let old: Vec<(bool, ObjectId, Kept)> = {
            let st = self.st.borrow();
            let u = &st.undos;
            (u.held.iter().map(|(o, u)| (false, o, u)))
                .chain(u.staged.iter().map(|(o, u)| (true, o, u)))
                .filter(|(_, _, u)| u.pos() < j)
                .map(|(staged, oid, u)| (staged, *oid, u.clone()))
                .collect()
        };
        let mut acks = Vec::with_capacity(old.len());
        for (staged, oid, u) in old {
            let before = match &u {
                Kept::Block { .. } => Before::Block,
                Kept::Bytes(o) => Before::Bytes(match (&o.data, o.len) {
                    (_, 0) => None,
                    (Some(d), _) => Some((o.offset, AlignedBuf::from_slice(d))),
                    (None, _) => Some((o.offset, self.read_overlay(o, 0, o.len).await?.0)),
                }),
            };
            // Released or replaced while its bytes were read: nothing to
            // keep (a release queued from here on is journaled after this
            // copy: the checkpointer's records go first).
            let still = {
                let st = self.st.borrow();
                let map = if staged {
                    &st.undos.staged
                } else {
                    &st.undos.held
                };
                map.get(&oid).is_some_and(|n| {
                    n.version() == u.version() && n.pos() == u.pos() && n.is_block() == u.is_block()
                })
            };
            if still {
                acks.push(self.enqueue_undo(oid, u.version(), before, true, true));
            }
        }
        for rx in acks {
            rx.await
                .unwrap_or_else(|| Err(Error::Failed("journal writer stopped".into())))?;
        }
        Ok(())
    }
}

/// Applies an `Undo` or `UndoBlock` record (see [`Undos::on_record`]).
pub(crate) fn apply(st: &mut State, rec: &Record, data: Option<AlignedBuf>, replay: bool) {
    let stored = st.index.version(&rec.oid);
    let has_hidden = st.index.block_of(&hidden(rec.oid)).is_some();
    st.undos.on_record(stored, rec, data, replay, has_hidden);
}
