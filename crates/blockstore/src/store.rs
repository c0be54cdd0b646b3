//! The store: its public API and write admission, over the shared state
//! (`state`) and the tasks that run it (`writer`, `checkpoint`).
//!
//! Write path (`// PERF-CRITICAL`): a partial write to an object that has a
//! block becomes a Small journal record carrying its data; a whole-block
//! write, or the first write to an object, goes to a freshly allocated block
//! (Big record pointing at it; the data write and the journal write run in
//! parallel and one fsync covers both). The journal writer task takes every
//! queued record as one batch, writes it with one gathered write, waits for
//! the Big data writes, fsyncs once, applies the batch to the index, and
//! acknowledges every writer: group commit.
//!
//! Crash argument, in one place:
//! - a write is acknowledged only after the fsync that follows both its
//!   journal record and its data block; replay finds every such batch, since
//!   batches are applied only in order and a batch is written only after the
//!   previous one completed;
//! - redo is idempotent (a record applies if its version is at least the
//!   stored one), so a checkpoint may capture table pages at any moment
//!   after the overlays before its journal position were folded in: replay
//!   from that position repairs whatever it captured half-way ("fuzzy
//!   checkpoint");
//! - table pages are shadowed (two copies; a checkpoint writes the copy the
//!   committed checkpoint does not use), the checkpoint header is written
//!   after the pages are durable, and the journal tail advances only after
//!   the header is durable;
//! - a freed block is reused only after a checkpoint that no longer
//!   references it committed (see `alloc`).

use std::cell::RefCell;
use std::rc::Rc;

use nacre_io::rt;
use nacre_io::sync::oneshot;
use nacre_io::{AlignedBuf, BlockDev, SendBuf};
use nacre_types::ObjectId;

use crate::error::{Error, Result};
use crate::format::{Geometry, RecordKind};
use crate::journal::{chunk_csums, Record};
use crate::pglog::{Admission, LogEntry, LogOp, PgLog};
use crate::replay::{FormatOptions, OpenReport};
use crate::state::{Inner, Queued, State, Stats, Store, StoreOptions};
use crate::undo::is_hidden;

/// Refuses an op from outside that names a hidden object (the block an
/// undo keeps: `crate::undo::hidden`).
fn check_visible(oid: &ObjectId) -> Result<()> {
    if is_hidden(oid) {
        return Err(Error::Invalid(format!(
            "{oid}: the block index's bit 55 is reserved"
        )));
    }
    Ok(())
}

/// Space in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// Freed, returned to `free_bytes` at the next checkpoint.
    pub pending_free_bytes: u64,
}

/// RAM in use, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// Object table, hash slots and overlay bookkeeping.
    pub index_bytes: u64,
    /// Cached checksum-table pages and unmerged checksum changes.
    pub csum_cache_bytes: u64,
    /// Small-write data kept until folded.
    pub overlay_cache_bytes: u64,
    /// Undos held ([`Store::write_undoable`]): bytes cached and bookkeeping.
    pub undo_bytes: u64,
}

#[derive(Clone, Copy)]
enum Admit {
    Full,
    Partial,
    Delete,
    /// A whole-object rewrite at the stored version ([`Store::repair`]).
    Repair,
}

/// Who a write is for: a client's (kept off the reserved blocks), or
/// recovery's and repair's (which may take them, so a full store can
/// still be brought up to date).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Client,
    Recovery,
    /// The same version again, whole, replacing damaged bytes.
    Repair,
}

/// A logged op's hold on its PG's log (see `PgLogs::hold`).
struct PgHold<'a, D: BlockDev>(&'a Inner<D>, Option<LogEntry>);

impl<D: BlockDev> Drop for PgHold<'_, D> {
    fn drop(&mut self) {
        if let Some(e) = &self.1 {
            self.0.st.borrow_mut().pglogs.release(e);
        }
    }
}

impl<D: BlockDev + 'static> Store<D> {
    /// Formats `dev` as an empty store (destroying what it held).
    pub async fn format(dev: &D, opts: &FormatOptions) -> Result<Geometry> {
        crate::replay::format(dev, opts).await
    }

    /// Opens the store on `dev`: loads the newest checkpoint, replays the
    /// journal after it, and starts the journal writer and checkpointer.
    pub async fn open(dev: D, opts: StoreOptions) -> Result<(Store<D>, OpenReport)> {
        let (inner, mut report) = crate::replay::open(dev, opts).await?;
        let inner = Rc::new(inner);
        let mut tasks = vec![
            rt::spawn(crate::writer::journal_task(inner.clone())),
            rt::spawn(crate::writer::sync_task(inner.clone())),
        ];
        // Replay made everything it applied durable; a header must say so
        // before any block it freed is reused or any fold rewrites a block
        // (else a later replay would check old full-block records against
        // the new content and stop there).
        let redone = async {
            inner.sync_barrier(true).await?;
            crate::checkpoint::redo_replay_folds(&inner).await
        };
        match redone.await {
            Ok(n) => report.folds_redone = n,
            Err(e) => {
                // The writer and syncer stop once their queues are empty.
                inner.st.borrow_mut().closing = true;
                inner.journal_kick.notify();
                return Err(e);
            }
        }
        // Only now may anything else plan a fold: the checkpointer would
        // otherwise fold the same blocks as the redo, from checksums the
        // redo has not patched yet.
        crate::strict_assert!(inner.st.borrow().ckpt.folds.is_empty());
        inner.st.borrow_mut().ckpt.running = true;
        tasks.push(rt::spawn(crate::checkpoint::checkpoint_task(inner.clone())));
        let store = Store(inner, Rc::new(RefCell::new(tasks)));
        if report.replay_stopped.is_some() {
            // Replay raised the lineage; any checkpoint from now on, which
            // starts the journal past the damage, records it. Take one
            // before anyone relies on the store.
            store.0.request_checkpoint_and_wait().await?;
            tracing::error!(
                "store {}: journal replay stopped before its end: writes it acknowledged may be lost; now lineage {}",
                crate::replay::uuid_string(&store.0.g.uuid),
                store.lineage()
            );
        }
        Ok((store, report))
    }

    pub fn geometry(&self) -> &Geometry {
        &self.0.g
    }

    pub fn block_bytes(&self) -> u32 {
        self.0.g.block_bytes
    }

    /// Writes `data` at `offset` inside object `oid` as `version`; returns
    /// once the write is durable (group commit).
    pub async fn write(
        &self,
        oid: ObjectId,
        version: u64,
        offset: u32,
        data: AlignedBuf,
    ) -> Result<()> {
        self.0
            .write_inner(
                oid,
                version,
                offset,
                data.into(),
                true,
                None,
                Mode::Client,
                None,
            )
            .await
    }

    /// Recovery: `oid` becomes the whole object `data` at `version` (no
    /// log entry: the log no longer holds the write that made it). Like
    /// [`Store::recover_logged`], it may take the blocks kept back from
    /// client writes.
    pub async fn recover(&self, oid: ObjectId, version: u64, data: AlignedBuf) -> Result<()> {
        self.check_whole("recovery", oid, &data)?;
        (self.0)
            .write_inner(
                oid,
                version,
                0,
                data.into(),
                true,
                None,
                Mode::Recovery,
                None,
            )
            .await
    }

    /// Repair: `oid`, stored at `version`, is written again whole as
    /// `data` (that version's content, from another copy) to a new block,
    /// replacing a copy whose checksums failed. No log entry: the version
    /// and its history stay what they were. Fails (`Invalid`,
    /// `StaleVersion`) if the store does not hold the object at `version`.
    pub async fn repair(&self, oid: ObjectId, version: u64, data: AlignedBuf) -> Result<()> {
        self.check_whole("repair", oid, &data)?;
        (self.0)
            .write_inner(oid, version, 0, data.into(), true, None, Mode::Repair, None)
            .await
    }

    fn check_whole(&self, what: &str, oid: ObjectId, data: &[u8]) -> Result<()> {
        if data.len() != self.block_bytes() as usize {
            return Err(Error::Invalid(format!(
                "{what} of {oid} with {} bytes, not a whole object",
                data.len()
            )));
        }
        Ok(())
    }

    /// Keeps `1 - ratio` of the data blocks (at least none, at most all)
    /// back from writes: once no more are free, a write that needs a new
    /// block fails `NoSpace`, while recovery ([`Store::recover`],
    /// [`Store::recover_logged`]) may still take them, and overwrites of
    /// allocated blocks and deletes go on, so a full store can always be
    /// brought up to date and emptied.
    pub fn set_full_ratio(&self, ratio: f64) {
        let n = f64::from(self.0.g.nblocks);
        let keep = (n * (1.0 - ratio.clamp(0.0, 1.0))).floor();
        self.0.st.borrow_mut().adm.reserve_blocks = keep as u32;
    }

    /// Blocks a write that needs a new one may still take: those free
    /// beyond the reserve ([`Store::set_full_ratio`]) and those on their
    /// way back (freed, waiting for a checkpoint). At 0 the store is full:
    /// such a write fails `NoSpace`.
    pub fn spare_blocks(&self) -> u64 {
        let st = self.0.st.borrow();
        let coming = st.alloc.deferred_count() as u64 + st.ckpt.releasing as u64;
        (u64::from(st.alloc.free_count()) + coming).saturating_sub(u64::from(st.adm.reserve_blocks))
    }

    /// Whether a write of `len` bytes at `offset` of `oid` takes a new
    /// block: a whole-block write (written aside, the old block freed
    /// after), or any write of an object that has none.
    pub fn needs_block(&self, oid: ObjectId, offset: u32, len: u32) -> bool {
        (offset == 0 && len == self.0.g.block_bytes)
            || self.0.st.borrow().index.block_of(&oid).is_none()
    }

    /// Like [`Store::write`], but returns once the write is in the journal,
    /// before it is durable; a later [`Store::sync`] makes it durable.
    pub async fn write_unsynced(
        &self,
        oid: ObjectId,
        version: u64,
        offset: u32,
        data: AlignedBuf,
    ) -> Result<()> {
        self.0
            .write_inner(
                oid,
                version,
                offset,
                data.into(),
                false,
                None,
                Mode::Client,
                None,
            )
            .await
    }

    /// Deletes `oid` (durably); its block returns to free space at the next
    /// checkpoint. `version` must be at least the stored one.
    pub async fn delete(&self, oid: ObjectId, version: u64) -> Result<()> {
        self.0.delete(oid, version, None).await
    }

    /// [`Store::write`] at `entry.version`, with `entry` added to its PG's
    /// log in the same durable step. A repeat of the version is done only
    /// if the log holds this same entry for it; a repeat that the log
    /// shows was another op's is `Invalid` (one version, one content).
    ///
    /// `data` may be shared with others (a payload the caller also sends
    /// to other copies): a whole-block write goes to the device from
    /// where it is, a smaller one is copied.
    pub async fn write_logged(
        &self,
        entry: LogEntry,
        offset: u32,
        data: impl Into<SendBuf>,
    ) -> Result<()> {
        self.logged_write(entry, offset, data.into(), None).await
    }

    /// [`Store::write_logged`], undoable with `undo` (see
    /// `Inner::write_inner`).
    pub(crate) async fn logged_write(
        &self,
        entry: LogEntry,
        offset: u32,
        data: SendBuf,
        undo: Option<crate::undo::Before>,
    ) -> Result<()> {
        self.0.check_entry(&entry, LogOp::Write)?;
        let len = data.len() as u32;
        if entry.offset != offset || entry.len != len {
            return Err(Error::Invalid(format!(
                "log entry for {}+{} of {} given with a write of {len} bytes at {offset}",
                entry.offset, entry.len, entry.oid
            )));
        }
        (self.0)
            .write_inner(
                entry.oid,
                entry.version,
                offset,
                data,
                true,
                Some(entry),
                Mode::Client,
                undo,
            )
            .await
    }

    /// Recovery: `entry.oid` becomes the whole object `data` at
    /// `entry.version`, with `entry` (the write that made that version,
    /// whatever range it covered) logged in the same durable step.
    pub async fn recover_logged(&self, entry: LogEntry, data: AlignedBuf) -> Result<()> {
        self.0.check_entry(&entry, LogOp::Write)?;
        self.check_whole("recovery", entry.oid, &data)?;
        (self.0)
            .write_inner(
                entry.oid,
                entry.version,
                0,
                data.into(),
                true,
                Some(entry),
                Mode::Recovery,
                None,
            )
            .await
    }

    /// Deletes `entry.oid` at `entry.version` with `entry` logged in the
    /// same durable step. The entry is logged even when this copy lacks
    /// the object (a tombstone: the delete must not be undone by a copy
    /// that missed it).
    pub async fn delete_logged(&self, entry: LogEntry) -> Result<()> {
        self.0.check_entry(&entry, LogOp::Delete)?;
        match self.0.delete(entry.oid, entry.version, Some(entry)).await {
            Err(Error::NotFound(_)) => self.log_only(entry).await,
            r => r,
        }
    }

    /// Adds `entry` to its PG's log (durably) without touching data: history
    /// adopted from another copy, whose object recovery brings later.
    pub async fn log_only(&self, entry: LogEntry) -> Result<()> {
        self.0.check_entry(&entry, entry.op)?;
        let (pg, version) = (entry.pg, entry.version);
        self.0
            .pg_op(RecordKind::Log, pg, version, Some(entry))
            .await
    }

    /// Drops PG `pg`'s log entries newer than `to` (durably): divergent
    /// history that peering found no other copy has.
    pub async fn pg_rewind(&self, pg: u64, to: u64) -> Result<()> {
        self.0.pg_op(RecordKind::PgRewind, pg, to, None).await
    }

    /// Adopts `entry` into its PG's log (durably) as history another copy
    /// holds and whose effect this copy already has; an entry older than
    /// what the log keeps (at or below its tail, or before every entry of
    /// a full log) is skipped.
    pub async fn adopt_entry(&self, entry: LogEntry) -> Result<()> {
        if self.entry_too_old(&entry) {
            return Ok(());
        }
        self.log_only(entry).await
    }

    /// Whether `entry` is older than what its PG's log keeps (at or below
    /// its tail, or before every entry of a full log): a logged op with
    /// it is refused.
    pub fn entry_too_old(&self, entry: &LogEntry) -> bool {
        self.0.st.borrow().pglogs.too_old(entry)
    }

    /// Drops PG `pg`'s entry at `version` (durably), if the log has it: an
    /// op that peering undid, whose request must not be taken as applied.
    /// Refused while an op at that version is in flight.
    pub async fn pg_forget(&self, pg: u64, version: u64) -> Result<()> {
        self.0.pg_op(RecordKind::PgForget, pg, version, None).await
    }

    /// Sets or clears PG `pg`'s recovering mark (durably;
    /// [`PgLog::recovering`]); on a PG without a log, makes one.
    pub async fn pg_mark_recovering(&self, pg: u64, recovering: bool) -> Result<()> {
        (self.0)
            .pg_op(RecordKind::PgMark, pg, u64::from(recovering), None)
            .await
    }

    /// Raises PG `pg`'s tail to `upto` (durably), dropping the entries at
    /// or below it: a copy that took another's log takes its tail too, so
    /// that its log names every op above its tail.
    pub async fn pg_raise_tail(&self, pg: u64, upto: u64) -> Result<()> {
        self.0.pg_op(RecordKind::PgTail, pg, upto, None).await
    }

    /// Whether PG `pg`'s log is marked recovering.
    pub fn pg_recovering(&self, pg: u64) -> bool {
        (self.0.st.borrow().pglogs.get(pg)).is_some_and(|l| l.recovering)
    }

    /// Forgets PG `pg`'s log (durably): the PG left this OSD.
    pub async fn pg_remove(&self, pg: u64) -> Result<()> {
        self.0.pg_op(RecordKind::PgRemove, pg, 0, None).await
    }

    /// Trims PG `pg`'s log up to version `upto`. Kept in memory until the
    /// next checkpoint; after a crash before it the log is only longer.
    pub fn pg_trim(&self, pg: u64, upto: u64) {
        self.0.st.borrow_mut().pglogs.trim(pg, upto);
    }

    /// A copy of PG `pg`'s log, if the store has one.
    pub fn pg_log(&self, pg: u64) -> Option<PgLog> {
        self.0.st.borrow().pglogs.get(pg).cloned()
    }

    /// The PGs the store holds logs of, sorted.
    pub fn pg_logs(&self) -> Vec<u64> {
        self.0.st.borrow().pglogs.keys()
    }

    /// Barrier: every write acknowledged before this call is durable when it
    /// returns.
    pub async fn sync(&self) -> Result<()> {
        self.0.sync().await
    }

    /// Reads `len` bytes at `offset` of `oid`. Never returns bytes that fail
    /// their checksum: such a read is `Error::Corrupt`.
    pub async fn read(&self, oid: ObjectId, offset: u32, len: u32) -> Result<AlignedBuf> {
        check_visible(&oid)?;
        self.0.read(oid, offset, len).await
    }

    /// The data block holding the object (for scrub tools and tests).
    pub fn block_of(&self, oid: ObjectId) -> Option<u32> {
        self.0.st.borrow().index.block_of(&oid)
    }

    /// The object's newest version, if it exists.
    pub fn version(&self, oid: ObjectId) -> Option<u64> {
        self.0.st.borrow().index.version(&oid)
    }

    /// Every object with its newest version, sorted by id (the hidden
    /// objects that hold kept blocks left out, here and below).
    pub fn list(&self) -> Vec<(ObjectId, u64)> {
        self.0.st.borrow().index.list(|o| !is_hidden(o))
    }

    /// Calls `f` with every object, in no order (a count, without
    /// collecting them).
    pub fn for_each_object(&self, mut f: impl FnMut(ObjectId)) {
        (self.0.st.borrow().index).for_each(|o| {
            if !is_hidden(&o) {
                f(o)
            }
        })
    }

    /// The objects `keep` accepts with their newest versions, sorted.
    pub fn list_where(&self, keep: impl Fn(&ObjectId) -> bool) -> Vec<(ObjectId, u64)> {
        (self.0.st.borrow().index).list(|o| !is_hidden(o) && keep(o))
    }

    pub fn space(&self) -> Space {
        let st = self.0.st.borrow();
        let bb = u64::from(self.0.g.block_bytes);
        let total = u64::from(self.0.g.nblocks) * bb;
        let free = u64::from(st.alloc.free_count()) * bb;
        Space {
            total_bytes: total,
            used_bytes: total - free,
            free_bytes: free,
            pending_free_bytes: (st.alloc.deferred_count() + st.ckpt.releasing) as u64 * bb,
        }
    }

    pub fn stats(&self) -> Stats {
        self.0.st.borrow().stats
    }

    /// RAM the store uses, by purpose.
    pub fn memory(&self) -> Memory {
        let st = self.0.st.borrow();
        Memory {
            index_bytes: st.index.memory_bytes() + st.pglogs.memory_bytes(),
            csum_cache_bytes: st.csum.memory_bytes(),
            overlay_cache_bytes: st.index.overlay_cache_bytes(),
            undo_bytes: st.undos.memory_bytes(),
        }
    }

    pub fn object_count(&self) -> usize {
        let st = self.0.st.borrow();
        st.index.object_count() - st.undos.block_count()
    }

    /// Journal bytes written since the last checkpoint.
    pub fn journal_used_bytes(&self) -> u64 {
        let st = self.0.st.borrow();
        st.journal.used()
    }

    /// The store's lineage: 0 from format, raised at each open whose
    /// journal replay stopped at damage ([`OpenReport::replay_stopped`]):
    /// such a store lost writes it had acknowledged, and must not be taken
    /// for the store that acknowledged them. With the uuid it names the
    /// history the store holds. [`Store::open`] returns once a checkpoint
    /// recorded the new lineage; that checkpoint also starts the journal
    /// where replay stopped, so the damage is not met again (a crash
    /// before it finds the damage again, and raises the lineage from the
    /// same number).
    pub fn lineage(&self) -> u32 {
        self.0.st.borrow().lineage
    }

    /// Takes a checkpoint now and waits for it.
    pub async fn checkpoint(&self) -> Result<()> {
        self.0.request_checkpoint_and_wait().await
    }

    /// Stops accepting writes, finishes queued ones, takes a final
    /// checkpoint (so the next open replays nothing) and waits for the
    /// store's tasks to stop; the device is released with the last clone.
    pub async fn close(self) -> Result<()> {
        // The first checkpoint folds and journals its folds; the second
        // trims those records too.
        self.0.request_checkpoint_and_wait().await?;
        self.0.request_checkpoint_and_wait().await?;
        self.0.st.borrow_mut().closing = true;
        self.0.journal_kick.notify();
        self.0.ckpt_kick.notify();
        let tasks = std::mem::take(&mut *self.1.borrow_mut());
        for t in tasks {
            t.await;
        }
        // Closed cleanly only if nothing failed on the way.
        match &self.0.st.borrow().failed {
            Some(why) => Err(Error::Failed(why.clone())),
            None => Ok(()),
        }
    }
}

impl<D: BlockDev + 'static> Inner<D> {
    /// The newest version of `oid` counting writes still in flight.
    fn current_version(&self, oid: &ObjectId) -> Option<u64> {
        let st = self.st.borrow();
        let stored = st.index.version(oid);
        match st.adm.max_version(oid) {
            Some(v) => Some(stored.unwrap_or(0).max(v)),
            None => stored,
        }
    }

    /// Checks `version` against the object; `Ok(true)` means it is a repeat.
    fn check_version(&self, oid: ObjectId, version: u64) -> Result<bool> {
        if version == 0 {
            return Err(Error::Invalid("version 0 is reserved".into()));
        }
        match self.current_version(&oid) {
            Some(cur) if version < cur => Err(Error::StaleVersion {
                object: oid,
                given: version,
                current: cur,
            }),
            Some(cur) => Ok(version == cur),
            None => Ok(false),
        }
    }

    /// A repeat of a write version already taken: done once that write has
    /// finished and, if asked, is durable. `Ok(false)` when the write it
    /// repeats was withdrawn (`NoSpace`): then this is a new attempt, to be
    /// admitted afresh. Only a recorded withdrawal says so — not the stored
    /// version, which a delete admitted meanwhile may have removed.
    async fn repeat(
        &self,
        oid: &ObjectId,
        version: u64,
        durable: bool,
        entry: Option<&LogEntry>,
    ) -> Result<bool> {
        self.wait_idle(oid).await?;
        {
            let mut st = self.st.borrow_mut();
            if st.adm.take_withdrawn(oid, version) {
                return Ok(false);
            }
            // A logged op repeats only the op its log entry names.
            if let Some(e) = entry {
                let logged = st.pglogs.get(e.pg).and_then(|l| l.entries.get(&version));
                if logged != Some(e) {
                    return Err(Error::Invalid(format!(
                        "version {version} of {oid} is not this op's (the log has {logged:?})"
                    )));
                }
            }
        }
        if durable {
            self.sync().await?;
        }
        Ok(true)
    }

    /// Admits an op on `oid`: checks its version, waits while it must not
    /// overtake ops already admitted, and registers it. Ops on one object
    /// reach the journal in admission order. `Ok(None)` means a repeat.
    async fn admit(&self, oid: ObjectId, version: u64, kind: Admit) -> Result<Option<bool>> {
        loop {
            self.check_writable()?;
            let at = self.check_version(oid, version)?;
            match kind {
                // A delete at the version of the last write is still a delete.
                Admit::Delete => {}
                Admit::Repair if !at => {
                    return Err(Error::Invalid(format!(
                        "repair of {oid} at version {version}: the store does not hold it"
                    )))
                }
                Admit::Repair => {}
                Admit::Full | Admit::Partial if at => return Ok(None),
                Admit::Full | Admit::Partial => {}
            }
            {
                let mut st = self.st.borrow_mut();
                let has_block = st.index.block_of(&oid).is_some();
                let admitted = st.adm.admit(oid, version, |f| match kind {
                    // Everything before a delete must be applied first.
                    // So must they before a repair, which writes the
                    // version the index holds now.
                    Admit::Delete | Admit::Repair => true,
                    // A partial write needs the object's block to be known.
                    Admit::Partial => f.preparing > 0 || !has_block,
                    Admit::Full => f.preparing > 0,
                });
                if admitted {
                    return Ok(Some(has_block));
                }
            }
            self.applied.wait().await;
        }
    }

    /// Withdraws an admitted op that never reached the queue; `write` is
    /// the version of a withdrawn write, which a repeat must not take as
    /// done.
    fn withdraw(&self, oid: &ObjectId, write: Option<u64>) {
        let mut st = self.st.borrow_mut();
        let State { adm, index, .. } = &mut *st;
        adm.withdraw(oid, write, |o| index.version(o));
        drop(st);
        self.applied.notify();
    }

    /// Admits a logged op's entry (see `PgLogs::hold`): `Ok(None)` when
    /// the log shows the op was applied already, else the hold, released
    /// when the op ends however it ends.
    fn hold_pg(&self, entry: Option<&LogEntry>) -> Result<Option<PgHold<'_, D>>> {
        let Some(e) = entry else {
            return Ok(Some(PgHold(self, None)));
        };
        match self.st.borrow_mut().pglogs.hold(e)? {
            Admission::Done => Ok(None),
            Admission::Go => Ok(Some(PgHold(self, Some(*e)))),
        }
    }

    /// A record that changes only a PG log, made durable.
    async fn pg_op(
        &self,
        kind: RecordKind,
        pg: u64,
        version: u64,
        entry: Option<LogEntry>,
    ) -> Result<()> {
        self.check_writable()?;
        match kind {
            RecordKind::PgRewind => self.st.borrow().pglogs.check_rewind(pg, version)?,
            RecordKind::PgForget => self.st.borrow().pglogs.check_forget(pg, version)?,
            RecordKind::PgMark | RecordKind::PgTail => self.st.borrow().pglogs.check_new(pg)?,
            _ => {}
        }
        let Some(_hold) = self.hold_pg(entry.as_ref())? else {
            return Ok(());
        };
        self.submit(Record::pg_op(kind, pg, version, entry)).await
    }

    /// Queues a record without data, durable, and waits until it is applied.
    async fn submit(&self, rec: Record) -> Result<()> {
        let (tx, rx) = oneshot();
        self.enqueue(Queued {
            rec,
            data: None,
            data_done: None,
            durable: true,
            checkpoint: false,
            done: tx,
        });
        rx.await
            .unwrap_or_else(|| Err(Error::Failed("journal writer stopped".into())))
    }

    /// `recovery`: the write may take the blocks kept back from others.
    /// `undo`: an undoable write ([`Store::write_undoable`]), with what it
    /// replaces (`None`: the object is new), journaled just before it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write_inner(
        self: &Rc<Self>,
        oid: ObjectId,
        version: u64,
        offset: u32,
        data: SendBuf,
        durable: bool,
        entry: Option<LogEntry>,
        mode: Mode,
        undo: Option<crate::undo::Before>,
    ) -> Result<()> {
        self.check_range(offset, data.len().min(u32::MAX as usize) as u32)?;
        check_visible(&oid)?;
        let len = data.len() as u32;
        if let Some(e) = entry.filter(|e| e.oid != oid) {
            return Err(Error::Invalid(format!(
                "log entry of {} given with a write of {oid}",
                e.oid
            )));
        }
        let Some(_hold) = self.hold_pg(entry.as_ref())? else {
            return Ok(());
        };
        let full = offset == 0 && len == self.g.block_bytes;
        let kind = match mode {
            Mode::Repair => Admit::Repair,
            _ if full => Admit::Full,
            _ => Admit::Partial,
        };
        let has_block = loop {
            match self.admit(oid, version, kind).await? {
                Some(has_block) => break has_block,
                None if self.repeat(&oid, version, durable, entry.as_ref()).await? => return Ok(()),
                None => continue,
            }
        };
        let (tx, rx) = oneshot();
        if full || !has_block {
            let block_buf = if full {
                data
            } else {
                let mut b = AlignedBuf::zeroed(self.g.block_bytes as usize);
                b[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                SendBuf::Owned(b)
            };
            let csums = chunk_csums(&block_buf);
            let block = match self.alloc_block(mode != Mode::Client).await {
                Ok(b) => {
                    self.st.borrow_mut().adm.big_inflight += 1;
                    b
                }
                Err(e) => {
                    // A repair withdrawn is no write withdrawn: a repeat
                    // of that version's write is still done.
                    let write = (mode != Mode::Repair).then_some(version);
                    self.withdraw(&oid, write);
                    return Err(e);
                }
            };
            // The data write runs as its own task so it overlaps the journal
            // write; the writer waits for it before the fsync that covers both.
            let (dtx, drx) = oneshot();
            let this = self.clone();
            let pos = self.g.block_offset(block);
            rt::spawn(async move {
                let r = match block_buf {
                    SendBuf::Owned(b) => this.dev.write_at(b, pos).await.map(drop),
                    SendBuf::Shared(b) => this.dev.write_shared_at(b, pos).await,
                };
                dtx.send(r);
            });
            self.st.borrow_mut().stats.big_writes += 1;
            if let Some(before) = undo {
                self.enqueue_undo(oid, version, before, durable, false);
            }
            self.enqueue(Queued {
                rec: Record {
                    kind: crate::format::RecordKind::Big,
                    oid,
                    version,
                    offset: 0,
                    len: self.g.block_bytes,
                    block,
                    csums,
                    data_pos: 0,
                    entry,
                },
                data: None,
                data_done: Some(drx),
                durable,
                checkpoint: false,
                done: tx,
            });
        } else {
            let csums = chunk_csums(&data);
            self.st.borrow_mut().stats.small_writes += 1;
            if let Some(before) = undo {
                // A kept block goes with a whole-block write alone.
                if matches!(before, crate::undo::Before::Block) {
                    self.withdraw(&oid, Some(version));
                    return Err(Error::Invalid(format!(
                        "{oid}: a partial write keeps no block"
                    )));
                }
                self.enqueue_undo(oid, version, before, durable, false);
            }
            self.enqueue(Queued {
                rec: Record {
                    kind: crate::format::RecordKind::Small,
                    oid,
                    version,
                    offset,
                    len,
                    block: 0,
                    csums,
                    data_pos: 0,
                    entry,
                },
                data: Some(data.into_owned()),
                data_done: None,
                durable,
                checkpoint: false,
                done: tx,
            });
        }
        rx.await
            .unwrap_or_else(|| Err(Error::Failed("journal writer stopped".into())))
    }

    pub(crate) async fn delete(
        &self,
        oid: ObjectId,
        version: u64,
        entry: Option<LogEntry>,
    ) -> Result<()> {
        check_visible(&oid)?;
        let Some(_hold) = self.hold_pg(entry.as_ref())? else {
            return Ok(());
        };
        if self.current_version(&oid).is_none() {
            return Err(Error::NotFound(oid));
        }
        // A delete is never a repeat: at the version of the last write it
        // is still a delete (a logged one was checked against the log).
        self.admit(oid, version, Admit::Delete).await?;
        if self.st.borrow().index.version(&oid).is_none() {
            self.withdraw(&oid, None);
            return Err(Error::NotFound(oid));
        }
        self.submit(Record::bare(RecordKind::Delete, oid, version, entry))
            .await
    }

    /// A free block (for a write other than `recovery`, one beyond the
    /// reserve); when none is free but some wait for a checkpoint (or are
    /// being returned by the running one), waits for it and tries again.
    /// `NoSpace` only when no block can come back.
    async fn alloc_block(&self, recovery: bool) -> Result<u32> {
        loop {
            let wait_for_applied = {
                let mut st = self.st.borrow_mut();
                let keep = if recovery { 0 } else { st.adm.reserve_blocks };
                if st.alloc.free_count() > keep {
                    if let Some(b) = st.alloc.alloc() {
                        return Ok(b);
                    }
                }
                if st.alloc.deferred_count() == 0
                    && st.ckpt.releasing == 0
                    && st.adm.big_inflight == 0
                {
                    return Err(Error::NoSpace);
                }
                // Whole-block writes in flight free their old blocks when
                // applied; blocks already freed come back at a checkpoint.
                st.alloc.deferred_count() == 0 && st.ckpt.releasing == 0
            };
            if wait_for_applied {
                self.applied.wait().await;
            } else {
                self.wait_for_next_checkpoint().await?;
            }
        }
    }
}
