//! The store's shared state, below every task that works on it.
//!
//! `State` is everything the store's tasks share (behind one `RefCell` in
//! `Inner`), split where one task owns a part: the journal's positions
//! (`cursor::Cursor`), the journal writer's queues and written batches
//! (`WriterState`), the checkpointer's sequence and fold claims
//! (`Checkpoints`), the undos (`undo::Undos`). `Inner` adds the device, the
//! geometry and the notifications the tasks wait on, and the operations
//! the modules above use on it (queueing a record, a sync barrier, asking
//! for a checkpoint and waiting for it, failing the store, checking an
//! op's range and log entry, waiting until an object is idle).
//!
//! The modules stack without a cycle, lowest first: `error`, then the
//! on-disk formats and in-memory tables (`format`, `alloc`, `cursor`,
//! `oidtable`, `csum`, `index`, `pglog`, `journal`, `undo`), this
//! module, then `read`, `writer`, `checkpoint`, `replay`, and on top
//! `store` (write admission and the public API) and `undoable` (undoable
//! writes, over the write path). `tests/layers.rs` checks the `crate::`
//! paths each module names; a method of `Inner` defined in one module and
//! called from a lower one it cannot see.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use nacre_io::rt;
use nacre_io::sync::{oneshot, Notify, Receiver, Sender};
use nacre_io::{AlignedBuf, BlockDev};
use nacre_types::{ObjectId, SECTOR_BYTES};
use zerocopy::IntoBytes;

use crate::alloc::Allocator;
use crate::csum::CsumTable;
use crate::error::{Error, Result};
use crate::format::{Geometry, PageMeta, RecordKind, PAGE_BYTES};
use crate::index::{Index, OidMap};
use crate::journal::{chunk_csums, Record};
use crate::pglog::{LogEntry, LogOp, PgLogs};
use crate::undo::{hidden, Before, Undos};

/// Options chosen at every open.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// The device has no volatile write cache (or power-loss protection):
    /// a completed write is durable, so the store never fsyncs.
    pub immediate_commit: bool,
    /// RAM for cached checksum-table pages.
    pub csum_cache_bytes: u64,
    /// RAM for small-write data waiting to be folded into blocks (beyond
    /// it, folds and reads fetch the data from the journal).
    pub overlay_cache_bytes: u64,
    /// Refuse to open a store with another id.
    pub expect_uuid: Option<[u8; 16]>,
    /// Discard (TRIM / punch) data blocks when they are freed.
    pub discard_freed: bool,
    /// Start a checkpoint when the journal is this full (percent).
    pub checkpoint_at_percent: u8,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            immediate_commit: false,
            csum_cache_bytes: 64 << 20,
            overlay_cache_bytes: 128 << 20,
            expect_uuid: None,
            discard_freed: false,
            checkpoint_at_percent: 50,
        }
    }
}

/// Counters since open.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    pub batches: u64,
    pub records: u64,
    pub small_writes: u64,
    pub big_writes: u64,
    pub syncs: u64,
    pub checkpoints: u64,
    pub flushed_overlays: u64,
    pub read_retries: u64,
    /// Reads of small-write data served from the overlay cache (memory),
    /// not the journal.
    #[serde(default)]
    pub overlay_cache_reads: u64,
    /// Times the journal writer held client writes back to pace them
    /// while the journal neared its limit (docs/internals/blockstore.md,
    /// *Pacing client writes*).
    #[serde(default)]
    pub paced_waits: u64,
    /// Times a held batch's pace ran out on its timer (a hold whose pace
    /// grew meanwhile can count more than once; one that a checkpoint
    /// ended, by freeing journal space, counts none).
    #[serde(default)]
    pub paced_timer_ends: u64,
    /// Times client writes found the journal at their limit and waited
    /// for a checkpoint to move its tail.
    #[serde(default)]
    pub journal_full_waits: u64,
    /// Objects folded ahead, between checkpoints (docs/internals/
    /// blockstore.md, *Folding ahead*); the rest of `flushed_overlays`
    /// was folded by checkpoints.
    #[serde(default)]
    pub folds_ahead: u64,
}

/// A record waiting for the journal writer: its data, and who waits for
/// it to be applied.
pub(crate) struct Queued {
    pub rec: Record,
    pub data: Option<AlignedBuf>,
    pub data_done: Option<Receiver<std::io::Result<()>>>,
    pub durable: bool,
    /// Written for the checkpointer (not an admitted client op); may use
    /// the journal space kept back from client writes.
    pub checkpoint: bool,
    pub done: Sender<Result<()>>,
}

/// A fold found in the journal at replay: redone before the store opens.
pub(crate) struct ReplayFold {
    pub oid: ObjectId,
    pub block: u32,
    pub version: u64,
    pub pairs: Vec<u32>,
}

/// Write admission: the ops admitted on each object and not yet applied,
/// the write versions withdrawn before they reached the journal, the
/// whole-block writes holding a new block, and the free blocks kept for
/// recovery. Relations, asserted under `strict` where they change: every
/// object in `inflight` has an op in flight (`count ≥ 1`), and no more of
/// them are still being prepared than are in flight
/// (`preparing ≤ count`).
#[derive(Default)]
pub(crate) struct Admission {
    inflight: OidMap<Inflight>,
    /// Per object, the newest write version withdrawn before it reached
    /// the journal (`NoSpace`): a repeat of it is a new attempt.
    withdrawn: OidMap<u64>,
    /// Whole-block writes holding a new block, not yet applied.
    pub big_inflight: usize,
    /// Free blocks only recovery may take ([`Store::set_full_ratio`]).
    pub reserve_blocks: u32,
}

impl Admission {
    /// Whether an op on `oid` is in flight.
    pub fn busy(&self, oid: &ObjectId) -> bool {
        self.inflight.contains_key(oid)
    }

    /// The highest version admitted on `oid` and not yet applied.
    pub fn max_version(&self, oid: &ObjectId) -> Option<u64> {
        self.inflight.get(oid).map(|f| f.max_version)
    }

    /// Admits an op at `version` on `oid` unless `wait` says the ops
    /// already in flight there must finish first; true if admitted.
    pub fn admit(
        &mut self,
        oid: ObjectId,
        version: u64,
        wait: impl FnOnce(&Inflight) -> bool,
    ) -> bool {
        if self.inflight.get(&oid).is_some_and(wait) {
            return false;
        }
        let f = self.inflight.entry(oid).or_default();
        f.max_version = f.max_version.max(version);
        f.count += 1;
        f.preparing += 1;
        true
    }

    /// An admitted op on `oid` reached the journal queue.
    pub fn queued(&mut self, oid: &ObjectId) {
        if let Some(f) = self.inflight.get_mut(oid) {
            crate::strict_assert!(f.preparing > 0, "object {oid}: queued twice");
            f.preparing -= 1;
        }
    }

    /// An admitted op on `oid` was applied (or failed with its batch);
    /// `big` if it was a whole-block write.
    pub fn applied(&mut self, oid: &ObjectId, big: bool) {
        if big {
            self.big_inflight -= 1;
        }
        self.finish(oid);
    }

    /// An admitted op on `oid` that never reached the queue is withdrawn;
    /// `write` is the version of a withdrawn write, which a repeat must
    /// not take as done. `stored` gives an object's stored version, to
    /// forget withdrawn versions no repeat can meet when too many are
    /// remembered.
    pub fn withdraw(
        &mut self,
        oid: &ObjectId,
        write: Option<u64>,
        stored: impl Fn(&ObjectId) -> Option<u64>,
    ) {
        if let Some(v) = write {
            if self.withdrawn.len() >= WITHDRAWN_MAX {
                // Only entries above the stored version can still be met
                // by a repeat (anything at or below it is stale or done).
                self.withdrawn
                    .retain(|o, w| stored(o).is_none_or(|s| s < *w));
                if self.withdrawn.len() >= WITHDRAWN_MAX {
                    tracing::warn!(
                        "{} withdrawn writes remembered; forgetting them",
                        self.withdrawn.len()
                    );
                    self.withdrawn.clear();
                }
            }
            let e = self.withdrawn.entry(*oid).or_default();
            *e = (*e).max(v);
        }
        if let Some(f) = self.inflight.get_mut(oid) {
            crate::strict_assert!(
                f.preparing > 0,
                "object {oid}: withdrawn after it was queued"
            );
            f.preparing -= 1;
        }
        self.finish(oid);
    }

    /// Whether `version` of `oid` was withdrawn (forgetting it: the
    /// repeat asking is the new attempt).
    pub fn take_withdrawn(&mut self, oid: &ObjectId, version: u64) -> bool {
        if self.withdrawn.get(oid) == Some(&version) {
            self.withdrawn.remove(oid);
            return true;
        }
        false
    }

    fn finish(&mut self, oid: &ObjectId) {
        if let Some(f) = self.inflight.get_mut(oid) {
            crate::strict_assert!(
                f.count > 0 && f.preparing < f.count,
                "object {oid}: {} ops in flight, {} preparing",
                f.count,
                f.preparing
            );
            f.count -= 1;
            if f.count == 0 {
                self.inflight.remove(oid);
            }
        }
    }
}

/// Withdrawn writes remembered for their repeats (see `Inner::repeat`).
const WITHDRAWN_MAX: usize = 65_536;

/// Ops admitted on one object and not yet applied.
#[derive(Default)]
pub(crate) struct Inflight {
    pub max_version: u64,
    /// Admitted and not yet finished.
    pub count: u32,
    /// Admitted and not yet in the journal queue.
    pub preparing: u32,
}

/// What the store's tasks share, behind one `RefCell` (`Inner::st`); the
/// parts one task owns are their own types below.
pub(crate) struct State {
    pub index: Index,
    pub alloc: Allocator,
    pub csum: CsumTable,
    pub obj_metas: Vec<PageMeta>,
    /// Write admission: ops in flight per object, withdrawn versions,
    /// space held for whole-block writes and for recovery.
    pub adm: Admission,
    /// The journal's positions and what is durable.
    pub journal: crate::cursor::Cursor,
    /// The journal writer's part: what waits to be written and synced.
    pub writer: WriterState,
    /// The checkpointer's part: checkpoints, folds in flight.
    pub ckpt: Checkpoints,
    /// What the checkpoints record as the store's lineage
    /// ([`Store::lineage`]).
    pub lineage: u32,
    pub overlay_cache_max: u64,
    pub failed: Option<String>,
    pub closing: bool,
    pub pglogs: PgLogs,
    pub undos: Undos,
    pub stats: Stats,
}

/// The store itself: its device, geometry, state and the notifications
/// its tasks wait on. [`Store`] is a handle to it.
pub(crate) struct Inner<D: BlockDev> {
    pub dev: D,
    pub g: Geometry,
    pub opts: StoreOptions,
    pub st: RefCell<State>,
    /// Wakes the journal writer.
    pub journal_kick: Notify,
    /// Wakes the syncer.
    pub written_kick: Notify,
    /// Wakes the checkpointer.
    pub ckpt_kick: Notify,
    /// A checkpoint finished (journal space and freed blocks returned).
    pub ckpt_done: Notify,
    /// A batch was applied to the index (or an op was queued or withdrawn).
    pub applied: Notify,
    /// A fold plan released its block (its rewrite is done or abandoned).
    pub flush_done: Notify,
    /// Raised around every change that can invalidate a read in flight
    /// (in-place folding, journal trimming, block release); reads that see
    /// it move retry.
    pub epoch: Cell<u64>,
}

/// One OSD's store. Cheap to clone; all clones share one state and must
/// stay on the runtime thread that opened it.
pub struct Store<D: BlockDev + 'static>(
    pub(crate) Rc<Inner<D>>,
    /// The store's tasks, joined at close.
    pub(crate) Rc<RefCell<Vec<rt::JoinHandle<()>>>>,
);

impl<D: BlockDev + 'static> Clone for Store<D> {
    fn clone(&self) -> Self {
        Store(self.0.clone(), self.1.clone())
    }
}

/// Reads attempt at most this many times when concurrent maintenance moves
/// the data under them.
pub(crate) const READ_RETRY_MAX: u32 = 64;

/// The journal writer's part of the store's state (`State::writer`).
#[derive(Default)]
pub(crate) struct WriterState {
    /// Client records waiting for the writer.
    pub queue: VecDeque<Queued>,
    /// Records of the checkpointer, written before any client record.
    pub ckpt_queue: VecDeque<Queued>,
    /// Sync barriers waiting; `true` asks for a durable header recording the
    /// sync (a marker), which the checkpointer needs before folding.
    pub sync_waiters: Vec<(Sender<Result<()>>, bool)>,
    /// Batches written and waiting for the syncer.
    pub written: VecDeque<Written>,
    /// The writer has stopped (the store is closing).
    pub done: bool,
}

impl WriterState {
    /// Queues a record for the writer: the checkpointer's ahead of every
    /// client's.
    pub fn push(&mut self, q: Queued) {
        match q.checkpoint {
            true => self.ckpt_queue.push_back(q),
            false => self.queue.push_back(q),
        }
    }

    /// No record waits to be written.
    pub fn drained(&self) -> bool {
        self.queue.is_empty() && self.ckpt_queue.is_empty()
    }
}

/// A batch whose journal write (and data blocks) completed, waiting for the
/// syncer to make it durable, apply it and acknowledge it.
pub(crate) struct Written {
    pub batch: Vec<Queued>,
    pub waiters: Vec<(Sender<Result<()>>, bool)>,
    /// Journal position after this batch.
    pub end: u64,
    /// Someone in it asked for durability.
    pub durable: bool,
    /// Something was written (a marker or records).
    pub wrote: bool,
    /// It could not be written; nothing of it is applied.
    pub error: Option<String>,
}

/// The checkpointer's part of the store's state (`State::ckpt`).
#[derive(Default)]
pub(crate) struct Checkpoints {
    /// The checkpoint task runs: the writer, which journals its records,
    /// stops only after it (a fold ahead may be under way at close).
    pub running: bool,
    /// The newest checkpoint's sequence number and slot (0 or 1): the
    /// next is written to the other slot.
    pub seq: u64,
    pub slot: u32,
    /// A checkpoint is asked for (journal space, a sync, a close).
    pub wanted: bool,
    /// A checkpoint is under way (it commits as `seq + 1`).
    pub in_progress: bool,
    /// Blocks the running checkpoint will return to the allocator.
    pub releasing: usize,
    /// Blocks claimed by a fold plan in flight, one plan per block (see
    /// [`crate::checkpoint::FoldClaim`]); reads of a block whose fold is writing in place
    /// wait for `flush_done`.
    pub folds: std::collections::HashMap<u32, FoldClaimState>,
    pub next_fold_id: u64,
    /// Folds met during replay, in journal order (empty once open).
    pub replay_folds: Vec<ReplayFold>,
    /// How long the last checkpoint that covered at least an eighth of
    /// the journal took, in ns per journal byte it covered (0 before
    /// one): what paces client writes (`writer::pace_after`).
    pub ns_per_byte: f64,
}

/// A claim's entry in `Checkpoints::folds`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FoldClaimState {
    pub id: u64,
    /// The plan's in-place writes have started: reads of the block wait.
    pub writing: bool,
}

impl State {
    /// A write of `oid` at `version` applied ([`crate::undo::Undos::on_write`]): the hidden
    /// object of an undo it dropped goes. Whether the write's own undo keeps
    /// the block it replaces.
    pub fn undo_on_write(&mut self, oid: ObjectId, version: u64, replay: bool) -> bool {
        let changed = self.undos.on_write(oid, version);
        if changed.dropped_block {
            self.drop_hidden(oid, replay);
        }
        changed.keeps_block
    }

    /// Removes `oid`'s hidden object (the block an undo of it kept); the block
    /// is free from the next checkpoint (at once in replay, whose allocator is
    /// built afterwards).
    pub fn drop_hidden(&mut self, oid: ObjectId, replay: bool) {
        if let Some(b) = self.index.clear_block(&hidden(oid)) {
            if !replay {
                self.alloc.defer(b);
            }
        }
    }

    /// Applies an `Undo` or `UndoBlock` record (see [`crate::undo::Undos::on_record`]).
    pub fn apply_undo(&mut self, rec: &Record, data: Option<AlignedBuf>, replay: bool) {
        let stored = self.index.version(&rec.oid);
        let has_hidden = self.index.block_of(&hidden(rec.oid)).is_some();
        self.undos.on_record(stored, rec, data, replay, has_hidden);
    }
}

impl<D: BlockDev + 'static> Inner<D> {
    pub(crate) fn check_writable(&self) -> Result<()> {
        let st = self.st.borrow();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone()));
        }
        if st.closing {
            return Err(Error::Failed("store is closing".into()));
        }
        Ok(())
    }

    /// Marks the store failed after an I/O error on a write path: no more
    /// writes, fsyncs or checkpoints; reads go on.
    pub(crate) fn fail(&self, why: String) {
        tracing::error!("blockstore stopped: {why}");
        let mut st = self.st.borrow_mut();
        if st.failed.is_none() {
            st.failed = Some(why);
        }
        drop(st);
        self.applied.notify();
        self.ckpt_done.notify();
        self.journal_kick.notify();
        self.written_kick.notify();
    }

    pub(crate) fn bump_epoch(&self) {
        self.epoch.set(self.epoch.get() + 1);
    }

    pub(crate) fn check_range(&self, offset: u32, len: u32) -> Result<()> {
        let bb = self.g.block_bytes;
        if len == 0
            || !offset.is_multiple_of(SECTOR_BYTES)
            || !len.is_multiple_of(SECTOR_BYTES)
            || u64::from(offset) + u64::from(len) > u64::from(bb)
        {
            return Err(Error::Invalid(format!(
                "range {offset}+{len} must be non-empty, {SECTOR_BYTES}-byte aligned and inside a {bb}-byte block"
            )));
        }
        Ok(())
    }

    /// Waits until no op on `oid` is in flight.
    pub(crate) async fn wait_idle(&self, oid: &ObjectId) -> Result<()> {
        loop {
            if !self.st.borrow().adm.busy(oid) {
                return Ok(());
            }
            self.check_writable()?;
            self.applied.wait().await;
        }
    }

    pub(crate) fn enqueue(&self, q: Queued) {
        let mut st = self.st.borrow_mut();
        if q.rec.kind.is_object_op() {
            st.adm.queued(&q.rec.oid);
        }
        if st.writer.done {
            drop(st);
            q.done.send(Err(Error::Failed("store closed".into())));
            return;
        }
        st.writer.push(q);
        drop(st);
        self.journal_kick.notify();
        self.applied.notify();
    }

    /// Checks that an entry describes the op it is logged with.
    pub(crate) fn check_entry(&self, e: &LogEntry, op: LogOp) -> Result<()> {
        if e.op != op || e.version == 0 {
            return Err(Error::Invalid(format!(
                "log entry {:?} at version {} does not describe a {op:?}",
                e.op, e.version
            )));
        }
        Ok(())
    }

    pub(crate) async fn sync(&self) -> Result<()> {
        self.sync_barrier(false).await
    }

    /// Makes everything applied so far durable, and, with `marker`, makes a
    /// journal header on disk say so (replay then skips checking the data
    /// blocks of those records, which folding may change).
    pub(crate) async fn sync_barrier(&self, marker: bool) -> Result<()> {
        if let Some(why) = &self.st.borrow().failed {
            return Err(Error::Failed(why.clone()));
        }
        if self.st.borrow().writer.done {
            return Err(Error::Failed("store closed".into()));
        }
        let (tx, rx) = oneshot();
        self.st.borrow_mut().writer.sync_waiters.push((tx, marker));
        self.journal_kick.notify();
        rx.await
            .unwrap_or_else(|| Err(Error::Failed("journal writer stopped".into())))
    }

    /// Asks for a checkpoint and waits until one that began after this
    /// call has committed: the next one, or, if one is under way (its
    /// journal position J may precede the caller's changes, which then
    /// stay in the journal), the one after it. An error once the store
    /// has closed (no checkpoint will come).
    pub(crate) async fn request_checkpoint_and_wait(&self) -> Result<()> {
        self.wait_for_checkpoint(true).await
    }

    /// Waits until the next checkpoint commits (asking for one if none is
    /// under way), whenever it began: enough for a writer waiting for
    /// freed blocks, which looks again after each.
    pub(crate) async fn wait_for_next_checkpoint(&self) -> Result<()> {
        self.wait_for_checkpoint(false).await
    }

    async fn wait_for_checkpoint(&self, begun_after_call: bool) -> Result<()> {
        let target = {
            let st = self.st.borrow();
            st.ckpt.seq + 1 + u64::from(begun_after_call && st.ckpt.in_progress)
        };
        loop {
            {
                let mut st = self.st.borrow_mut();
                if let Some(why) = &st.failed {
                    return Err(Error::Failed(why.clone()));
                }
                if st.ckpt.seq >= target {
                    return Ok(());
                }
                if st.closing && !st.ckpt.running {
                    return Err(Error::Failed("store is closing".into()));
                }
                // Unless the one under way is the target, ask for another.
                if !(st.ckpt.in_progress && st.ckpt.seq + 1 >= target) {
                    st.ckpt.wanted = true;
                }
            }
            self.ckpt_kick.notify();
            self.ckpt_done.wait().await;
        }
    }

    /// Bytes of a table page, for writing.
    pub(crate) fn obj_page_bytes(&self, page: u32) -> AlignedBuf {
        let st = self.st.borrow();
        let per = crate::format::OBJ_ENTRIES_PER_PAGE as usize;
        let start = page as usize * per;
        let end = (start + per).min(st.index.blocks.len());
        let mut buf = AlignedBuf::zeroed(PAGE_BYTES as usize);
        let bytes = st.index.blocks[start..end].as_bytes();
        buf[..bytes.len()].copy_from_slice(bytes);
        buf
    }

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
}
