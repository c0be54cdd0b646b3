//! Checkpoints: fold journal overlays into their blocks, write changed
//! table pages to their shadow copies, commit a checkpoint header, and
//! trim the journal.
//!
//! Crash argument. Let J be the journal position when the checkpoint
//! starts (every record before J is applied to the index).
//! 1. Overlays before J are written into their blocks in place. Until this
//!    checkpoint commits, the committed one still replays those records, so
//!    a torn in-place write is rewritten by replay.
//! 2. Changed pages go to the copy the committed checkpoint does not use,
//!    so its pages stay intact whatever happens here. Pages may already
//!    contain changes from after J: replay from J re-applies them
//!    idempotently.
//! 3. After an fsync, the header and page table go to the other slot in one
//!    write, then another fsync. A torn slot fails its crc and open uses
//!    the older slot, whose pages and journal are both still there.
//! 4. Only then does the journal tail move to J and do blocks freed before
//!    J become allocatable.
//!
//! PG logs (see `pglog`) follow the same steps: every log changed since the
//! last checkpoint is captured after J and written whole to the copy of
//! its slot that the committed checkpoint does not use.

use std::rc::Rc;

use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_types::{ObjectId, CSUM_CHUNK_BYTES, SECTOR_BYTES};
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

use crate::error::{Error, Result};
use crate::format::RecordKind;
use crate::format::{
    page_crc, CheckpointHeader, Geometry, LogSlotMeta, PageMeta, CKPT_MAGIC, FORMAT_VERSION,
    PAGE_BYTES,
};
use crate::index::Overlay;
use crate::journal::Record;
use crate::state::{FoldClaimState, Inner, Queued};
use crate::undo::{Before, Kept};
use nacre_io::sync::oneshot;

/// Table-page and fold writes in flight at once during a checkpoint: when
/// the journal is full enough that client writes are paced
/// (`writer::pacing_from`, 60% of a journal of ten batches or more), and
/// otherwise.
const PAGE_WRITES_INFLIGHT_MAX: usize = 64;
const PAGE_WRITES_GENTLE_MAX: usize = 4;
/// Journal fill at which folding ahead of checkpoints starts.
const FOLD_AHEAD_PERCENT: u64 = 25;
/// Objects, and bytes of new chunk content, planned before one group of
/// folds is journaled and written.
const FOLD_GROUP_OBJECTS_MAX: usize = 1024;
const FOLD_GROUP_BYTES_MAX: usize = 16 << 20;
/// Fold plans computed at once.
const FOLD_PLANS_INFLIGHT_MAX: usize = 64;
/// XOR-ed into the checksum of a chunk whose old content failed its check
/// while an overlay was folded into part of it: the chunk keeps failing
/// reads instead of getting a fresh checksum over damaged bytes.
const POISON: u32 = 0xdead_beef;

/// The checkpointer: checkpoints when asked, and in between folds journal
/// data into blocks ahead of time (gently), once the journal is a quarter
/// full, so a checkpoint finds little left to fold and client writes rarely
/// wait for one.
pub(crate) async fn checkpoint_task<D: BlockDev + 'static>(inner: Rc<Inner<D>>) {
    enum Next {
        Checkpoint,
        FoldAhead,
        Wait,
    }
    // Journal position before which another look for lagging overlays
    // would find nothing new (a look costs a pass over the pending map).
    let mut next_look_at = 0u64;
    loop {
        let next = {
            let mut st = inner.st.borrow_mut();
            if st.closing {
                // The writer waits for this before it stops; so does
                // anyone still waiting for a checkpoint (it gets an error).
                st.ckpt.running = false;
                drop(st);
                inner.journal_kick.notify();
                inner.ckpt_done.notify();
                return;
            }
            let used = st.journal.used();
            if st.failed.is_some() {
                Next::Wait
            } else if st.ckpt.wanted {
                Next::Checkpoint
            } else if st.journal.completed >= next_look_at
                && !st.index.pending.is_empty()
                && used * 100 >= inner.g.journal_bytes * FOLD_AHEAD_PERCENT
            {
                Next::FoldAhead
            } else {
                Next::Wait
            }
        };
        match next {
            Next::Checkpoint => {
                {
                    let mut st = inner.st.borrow_mut();
                    st.ckpt.wanted = false;
                    st.ckpt.in_progress = true;
                }
                let r = run_checkpoint(&inner).await;
                inner.st.borrow_mut().ckpt.in_progress = false;
                if let Err(e) = r {
                    inner.fail(format!("checkpoint: {e}"));
                }
                next_look_at = 0;
                inner.ckpt_done.notify();
                inner.journal_kick.notify();
            }
            Next::FoldAhead => match fold_ahead(&inner).await {
                // A whole group: more lags behind; look again at once.
                Ok(n) if n >= FOLD_GROUP_OBJECTS_MAX => {}
                // Part of one: let a 64th of the journal pass before the
                // next, so a group's fixed costs (a sync barrier, a batch
                // of Fold records and its flush) are shared by the folds
                // of many writes, not of the few that one group's own
                // latency lets in (at QD1, a flush per ten writes).
                Ok(n) if n > 0 => {
                    next_look_at = inner.st.borrow().journal.completed + inner.g.journal_bytes / 64
                }
                Ok(_) => {
                    next_look_at = inner.st.borrow().journal.completed + inner.g.journal_bytes / 32
                }
                Err(e) => inner.fail(format!("folding ahead: {e}")),
            },
            Next::Wait => inner.ckpt_kick.wait().await,
        }
    }
}

/// Folds one group of objects whose overlays lag the journal head by an
/// eighth of the journal (recent writes stay, to be folded together with
/// the writes that follow them). Returns how many objects it folded.
async fn fold_ahead<D: BlockDev + 'static>(inner: &Rc<Inner<D>>) -> Result<usize> {
    let (j, oids) = {
        let st = inner.st.borrow();
        let j = st
            .journal
            .completed
            .saturating_sub(inner.g.journal_bytes / 8);
        let oids: Vec<ObjectId> = st
            .index
            .pending
            .iter()
            .filter(|(_, p)| p.overlays.first().is_some_and(|o| o.data_pos < j))
            .map(|(oid, _)| *oid)
            .take(FOLD_GROUP_OBJECTS_MAX)
            .collect();
        (j, oids)
    };
    if oids.is_empty() {
        return Ok(0);
    }
    let n = oids.len();
    inner.sync_barrier(true).await?;
    fold_all(inner, oids, j).await?;
    inner.st.borrow_mut().stats.folds_ahead += n as u64;
    Ok(n)
}

/// Encodes a checkpoint slot: header page, then the page table.
pub(crate) fn encode_slot(
    g: &Geometry,
    seq: u64,
    (journal_start, gen, lineage): (u64, u64, u32),
    obj: &[PageMeta],
    csum: &[PageMeta],
    pglog: &[LogSlotMeta],
) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(g.slot_bytes as usize);
    let table_at = PAGE_BYTES as usize;
    let mut at = table_at;
    for m in obj.iter().chain(csum.iter()) {
        buf[at..at + 8].copy_from_slice(m.as_bytes());
        at += 8;
    }
    for m in pglog {
        buf[at..at + 8].copy_from_slice(m.as_bytes());
        at += 8;
    }
    let mut h = CheckpointHeader {
        magic: CKPT_MAGIC,
        format_version: U32::new(FORMAT_VERSION),
        hdr_bytes: U32::new(std::mem::size_of::<CheckpointHeader>() as u32),
        uuid: g.uuid,
        seq: U64::new(seq),
        journal_start: U64::new(journal_start),
        gen: U64::new(gen),
        objtab_pages: U32::new(g.objtab_pages),
        csumtab_pages: U32::new(g.csumtab_pages),
        pglog_slots: U32::new(g.pglog.slots),
        pagetab_crc: U32::new(nacre_types::crc32c(&buf[table_at..at])),
        crc: U32::new(0),
        lineage: U32::new(lineage),
    };
    h.crc = U32::new(nacre_types::crc32c(h.as_bytes()));
    buf[..std::mem::size_of::<CheckpointHeader>()].copy_from_slice(h.as_bytes());
    buf
}

/// Writes pages (or folded chunks), keeping a sliding window in flight.
async fn write_pages<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    writes: Vec<(u64, AlignedBuf)>,
) -> Result<()> {
    let mut inflight = std::collections::VecDeque::with_capacity(PAGE_WRITES_INFLIGHT_MAX);
    for (pos, buf) in writes {
        // Gentle while the journal has room (client I/O keeps its latency),
        // all-out when writers are about to wait for this checkpoint.
        let urgent = inner.st.borrow().journal.used() >= crate::writer::pacing_from(&inner.g);
        let window = if urgent {
            PAGE_WRITES_INFLIGHT_MAX
        } else {
            PAGE_WRITES_GENTLE_MAX
        };
        while inflight.len() >= window {
            let h: rt::JoinHandle<std::io::Result<()>> =
                inflight.pop_front().expect("window is full");
            if let Err(e) = h.await {
                // Let the writes already sent land before the caller
                // releases the blocks they write (readers would see them).
                for h in inflight {
                    let _ = h.await;
                }
                return Err(e.into());
            }
        }
        let this = inner.clone();
        inflight.push_back(rt::spawn(async move {
            this.dev.write_at(buf, pos).await.map(drop)
        }));
    }
    let mut result = Ok(());
    for h in inflight {
        if let Err(e) = h.await {
            result = Err(e.into());
        }
    }
    result
}

async fn run_checkpoint<D: BlockDev + 'static>(inner: &Rc<Inner<D>>) -> Result<()> {
    let g = &inner.g;
    let (j, releasing, to_fold) = {
        let mut st = inner.st.borrow_mut();
        let fold: Vec<ObjectId> = st.index.pending.keys().copied().collect();
        let releasing = st.alloc.take_deferred();
        st.ckpt.releasing = releasing.len();
        (st.journal.completed, releasing, fold)
    };
    let started = rt::monotonic();
    let objects = to_fold.len();
    // Folding rewrites blocks that full-block records before J point at;
    // replay must know those records are durable and not check their blocks.
    inner.sync_barrier(true).await?;
    fold_all(inner, to_fold, j).await?;
    let folded = rt::monotonic();
    // Undos whose bytes lie before J are journaled again after it.
    inner.relog_undos(j).await?;
    // Merge checksum changes into their pages (loading pages as needed).
    let blocks = inner.st.borrow().csum.delta_blocks();
    for b in blocks {
        inner.ensure_csum_page(g.csum_page_of(b).0).await?;
        inner.st.borrow_mut().csum.merge(g, b);
    }
    // Changed pages to their shadow copies.
    let (writes, obj_metas, csum_metas, csum_pages, pglog_metas) = {
        let mut st = inner.st.borrow_mut();
        let mut writes = Vec::new();
        let mut obj_metas = st.obj_metas.clone();
        let obj_pages = st.index.take_dirty_pages();
        drop(st);
        for p in obj_pages {
            let buf = inner.obj_page_bytes(p);
            let copy = 1 - obj_metas[p as usize].copy.get();
            obj_metas[p as usize] = PageMeta {
                crc: U32::new(page_crc(&buf)),
                copy: U32::new(copy),
            };
            writes.push((g.objtab_page_pos(p, copy), buf));
        }
        let mut st = inner.st.borrow_mut();
        let mut csum_metas = st.csum.metas.clone();
        let dirty = st.csum.take_dirty();
        let mut csum_pages = Vec::with_capacity(dirty.len());
        for (p, buf) in dirty {
            let copy = 1 - csum_metas[p as usize].copy.get();
            csum_metas[p as usize] = PageMeta {
                crc: U32::new(page_crc(&buf)),
                copy: U32::new(copy),
            };
            writes.push((g.csumtab_page_pos(p, copy), buf));
            csum_pages.push(p);
        }
        let (slots, pglog_metas) = st.pglogs.checkpoint();
        for (slot, copy, buf) in slots {
            writes.push((g.pglog_slot_pos(slot, copy), buf));
        }
        (writes, obj_metas, csum_metas, csum_pages, pglog_metas)
    };
    let pages = writes.len();
    write_pages(inner, writes).await?;
    if !inner.opts.immediate_commit {
        inner.dev.sync().await?;
    }
    let (slot, seq, gen, lineage) = {
        let st = inner.st.borrow();
        (
            1 - st.ckpt.slot,
            st.ckpt.seq + 1,
            st.journal.gen,
            st.lineage,
        )
    };
    let buf = encode_slot(
        g,
        seq,
        (j, gen, lineage),
        &obj_metas,
        &csum_metas,
        &pglog_metas,
    );
    inner.dev.write_at(buf, g.slot_pos(slot)).await?;
    if !inner.opts.immediate_commit {
        inner.dev.sync().await?;
    }
    // Committed: blocks freed before J may go to new owners. Discard them
    // first, while no one else can be given them.
    if inner.opts.discard_freed {
        inner.bump_epoch();
        for &b in &releasing {
            inner
                .dev
                .discard(g.block_offset(b), u64::from(g.block_bytes))
                .await?;
        }
    }
    let mut st = inner.st.borrow_mut();
    st.ckpt.slot = slot;
    st.ckpt.seq = seq;
    st.obj_metas = obj_metas;
    st.csum.commit(csum_metas, &csum_pages);
    st.pglogs.metas = pglog_metas;
    let covered = j.saturating_sub(st.journal.tail);
    if covered >= g.journal_bytes / 8 {
        let took = (rt::monotonic() - started).as_nanos() as f64;
        st.ckpt.ns_per_byte = took / covered as f64;
    }
    st.journal.raise_tail(j);
    st.alloc.release(&releasing);
    st.ckpt.releasing = 0;
    st.stats.checkpoints += 1;
    let used_percent = st.journal.used() * 100 / g.journal_bytes;
    drop(st);
    inner.bump_epoch();
    tracing::debug!(
        "checkpoint {seq}: sync barrier and folds of {objects} objects {:?}, {pages} pages, {:?} in all; journal {used_percent}% used after",
        folded - started,
        rt::monotonic() - started
    );
    Ok(())
}

/// Which overlays of an object a fold takes.
#[derive(Clone, Copy)]
pub(crate) enum Bound {
    /// Journal data before this position (a live checkpoint).
    Before(u64),
    /// Versions up to this one (redoing a fold found at replay).
    UpTo(u64),
}

impl Bound {
    fn takes(self, o: &Overlay) -> bool {
        match self {
            Bound::Before(j) => o.data_pos < j,
            Bound::UpTo(v) => o.version <= v,
        }
    }
}

/// A block claimed by one fold plan, from the snapshot of its checksums
/// until its in-place writes are done and its checksums replaced (or the
/// plan is dropped). At most one plan holds a block at any time: two plans
/// of one block, each writing its chunks and then the block's whole
/// checksum array, could land one's data with the other's checksums (a
/// read fails) or the older plan last (an acknowledged write rolled back).
pub(crate) struct FoldClaim<D: BlockDev + 'static> {
    inner: Rc<Inner<D>>,
    block: u32,
    id: u64,
}

impl<D: BlockDev + 'static> FoldClaim<D> {
    /// Claims the block `oid` lives in (`claim.block`). `Ok(None)` if the
    /// object has no block.
    ///
    /// Folds are planned by one task at a time (the redo at open, then the
    /// checkpointer, which plans each group's objects once and applies a
    /// group before planning the next), so a block is never found claimed:
    /// `strict` builds assert it, and other builds fail the fold (which
    /// stops the store's writes) rather than wait — the claim may belong to
    /// the very group that is waiting, and folding anyway could tear data.
    fn take(inner: &Rc<Inner<D>>, oid: ObjectId) -> Result<Option<FoldClaim<D>>> {
        let mut st = inner.st.borrow_mut();
        let Some(block) = st.index.block_of(&oid) else {
            return Ok(None);
        };
        if let Some(other) = st.ckpt.folds.get(&block) {
            crate::strict_assert!(
                false,
                "object {oid}: block {block} already has fold plan {} in flight",
                other.id
            );
            return Err(Error::Failed(format!(
                "object {oid}: block {block} already has a fold in flight"
            )));
        }
        st.ckpt.next_fold_id += 1;
        let id = st.ckpt.next_fold_id;
        st.ckpt
            .folds
            .insert(block, FoldClaimState { id, writing: false });
        Ok(Some(FoldClaim {
            inner: inner.clone(),
            block,
            id,
        }))
    }

    /// Asserts that this claim still holds its block (a pair with `take`).
    fn check_held(&self, st: &crate::state::State) {
        let held = st.ckpt.folds.get(&self.block).map(|c| c.id);
        crate::strict_assert!(
            held == Some(self.id),
            "fold plan {} of block {} lost its claim (held by {held:?})",
            self.id,
            self.block
        );
    }
}

impl<D: BlockDev + 'static> Drop for FoldClaim<D> {
    fn drop(&mut self) {
        let mut st = self.inner.st.borrow_mut();
        if st
            .ckpt
            .folds
            .get(&self.block)
            .is_some_and(|c| c.id == self.id)
        {
            st.ckpt.folds.remove(&self.block);
        }
        drop(st);
        self.inner.flush_done.notify();
    }
}

/// A computed fold: the new content of an object's dirty chunks.
pub(crate) struct FoldPlan<D: BlockDev + 'static> {
    /// Holds the block (`claim.block`) until the plan is applied or dropped.
    claim: FoldClaim<D>,
    oid: ObjectId,
    top: u64,
    bound: Bound,
    /// (device offset, bytes) of each run of dirty chunks.
    runs: Vec<(u64, RunData)>,
    csums: Vec<u32>,
    /// (chunk, crc32c) of every changed chunk, for the Fold record.
    pairs: Vec<u32>,
}

/// The new content of a run of chunks.
enum RunData {
    /// Built from the block's old bytes and the overlays over them.
    Built(AlignedBuf),
    /// Exactly the bytes of one overlay (the newest over the run, covering
    /// all of it), held in memory: written from where they are when the
    /// index lets go of them, not copied.
    Overlay { data: Rc<AlignedBuf>, data_pos: u64 },
}

impl RunData {
    fn len(&self) -> usize {
        match self {
            RunData::Built(b) => b.len(),
            RunData::Overlay { data, .. } => data.len(),
        }
    }
}

impl<D: BlockDev + 'static> FoldPlan<D> {
    fn bytes(&self) -> usize {
        self.runs.iter().map(|(_, r)| r.len()).sum()
    }
}

/// Computes the fold of `oid`'s overlays within `bound`: claims the
/// object's block (see [`FoldClaim::take`]), reads what it needs and checks
/// it, touching nothing on disk.
///
/// A chunk only partly covered by overlays keeps its other sectors. Its old
/// bytes must match the chunk's checksum — either as read (not folded yet)
/// or with the overlays laid over them (already folded, or torn half-way:
/// sectors outside the overlays are the same before and after, so the
/// patched chunk is the folded one in every case). A chunk that matches
/// neither is damaged and gets a poisoned checksum, so it keeps failing
/// reads instead of being blessed with a fresh one.
pub(crate) async fn plan_fold<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    oid: ObjectId,
    bound: Bound,
) -> Result<Option<FoldPlan<D>>> {
    let g = &inner.g;
    if !inner.st.borrow().index.pending.contains_key(&oid) {
        return Ok(None);
    }
    let Some(claim) = FoldClaim::take(inner, oid)? else {
        return Ok(None);
    };
    let block = claim.block;
    // With the claim held, the overlays and checksums snapshotted here are
    // the only fold of this block in flight.
    let ovs: Vec<Overlay> = {
        let st = inner.st.borrow();
        let Some(p) = st.index.pending.get(&oid) else {
            return Ok(None);
        };
        p.overlays
            .iter()
            .filter(|o| bound.takes(o))
            .cloned()
            .collect()
    };
    if ovs.is_empty() {
        return Ok(None);
    }
    let mut datas: Vec<Rc<AlignedBuf>> = Vec::with_capacity(ovs.len());
    for o in &ovs {
        match &o.data {
            Some(d) => datas.push(d.clone()),
            None => datas.push(Rc::new(inner.read_overlay(o, 0, o.len).await?.0)),
        }
    }
    let mut csums = inner.block_csums(block).await?;
    let chunk = CSUM_CHUNK_BYTES as usize;
    let spc = chunk / SECTOR_BYTES as usize;
    let mut covered = vec![false; (g.block_bytes / SECTOR_BYTES) as usize];
    for o in &ovs {
        let s0 = (o.offset / SECTOR_BYTES) as usize;
        covered[s0..s0 + (o.len / SECTOR_BYTES) as usize].fill(true);
    }
    let nchunks = csums.len();
    let dirty = |c: usize| covered[c * spc..(c + 1) * spc].iter().any(|&x| x);
    let full = |c: usize| covered[c * spc..(c + 1) * spc].iter().all(|&x| x);
    let mut runs = Vec::new();
    let mut pairs = Vec::new();
    let mut c = 0;
    while c < nchunks {
        if !dirty(c) {
            c += 1;
            continue;
        }
        let c0 = c;
        while c < nchunks && dirty(c) {
            c += 1;
        }
        let (off, len) = (c0 * chunk, (c - c0) * chunk);
        let pos = g.block_offset(block) + off as u64;
        // The newest overlay over the run: if it covers the run exactly,
        // the run is its bytes, whose checksums were taken when it was
        // written (or checked when it was read back from the journal).
        let newest = (ovs.iter())
            .rposition(|o| (o.offset as usize) < off + len && (o.offset + o.len) as usize > off);
        if let Some(k) = newest.filter(|&k| {
            let o = &ovs[k];
            o.offset as usize == off && o.len as usize == len && o.csums.len() == c - c0
        }) {
            for (i, cc) in (c0..c).enumerate() {
                csums[cc] = ovs[k].csums[i];
                pairs.extend_from_slice(&[cc as u32, csums[cc]]);
            }
            let (data, data_pos) = (datas[k].clone(), ovs[k].data_pos);
            runs.push((pos, RunData::Overlay { data, data_pos }));
            continue;
        }
        let mut buf = if (c0..c).all(full) {
            AlignedBuf::new(len)
        } else {
            inner.dev.read_at(AlignedBuf::new(len), pos).await?
        };
        let raw_ok: Vec<bool> = (c0..c)
            .map(|cc| {
                full(cc)
                    || nacre_types::crc32c(&buf[(cc - c0) * chunk..(cc - c0 + 1) * chunk])
                        == csums[cc]
            })
            .collect();
        for (o, d) in ovs.iter().zip(&datas) {
            let (o0, o1) = (o.offset as usize, (o.offset + o.len) as usize);
            let (r0, r1) = (o0.max(off), o1.min(off + len));
            if r0 < r1 {
                buf[r0 - off..r1 - off].copy_from_slice(&d[r0 - o0..r1 - o0]);
            }
        }
        for cc in c0..c {
            let crc = nacre_types::crc32c(&buf[(cc - c0) * chunk..(cc - c0 + 1) * chunk]);
            let ok = raw_ok[cc - c0] || crc == csums[cc];
            if !ok {
                tracing::error!("object {oid}: block {block} chunk {cc} was damaged under a partial overwrite; it stays unreadable");
            }
            csums[cc] = if ok { crc } else { crc ^ POISON };
            pairs.extend_from_slice(&[cc as u32, csums[cc]]);
        }
        runs.push((pos, RunData::Built(buf)));
    }
    let top = ovs.iter().map(|o| o.version).max().expect("non-empty");
    Ok(Some(FoldPlan {
        claim,
        oid,
        top,
        bound,
        runs,
        csums,
        pairs,
    }))
}

/// Writes planned folds in place and records them in the index. Readers of
/// these blocks wait meanwhile (their content changes under them).
pub(crate) async fn apply_folds<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    plans: Vec<FoldPlan<D>>,
) -> Result<()> {
    {
        let mut st = inner.st.borrow_mut();
        for p in &plans {
            p.claim.check_held(&st);
            st.ckpt
                .folds
                .get_mut(&p.claim.block)
                .expect("claim held")
                .writing = true;
        }
    }
    inner.bump_epoch();
    let mut plans = plans;
    let writes: Vec<(u64, AlignedBuf)> = {
        let mut st = inner.st.borrow_mut();
        let mut writes = Vec::new();
        for p in &mut plans {
            for (pos, run) in std::mem::take(&mut p.runs) {
                let buf = match run {
                    RunData::Built(b) => b,
                    // This fold is the overlay's last (after it the overlay
                    // goes, and a failed write fails the store), a read of
                    // the block meanwhile waits for this write, and one
                    // that took the overlay before holds its own
                    // reference (then the buffer is copied). Let go
                    // of the index's copy now, so the buffer is most often
                    // ours alone.
                    RunData::Overlay { data, data_pos } => {
                        st.index.uncache_overlay(&p.oid, data_pos);
                        Rc::try_unwrap(data).unwrap_or_else(|d| AlignedBuf::from_slice(&d))
                    }
                };
                writes.push((pos, buf));
            }
        }
        writes
    };
    let result = write_pages(inner, writes).await;
    if result.is_ok() {
        let mut st = inner.st.borrow_mut();
        for p in &mut plans {
            p.claim.check_held(&st);
            st.csum.set(
                p.claim.block,
                std::mem::take(&mut p.csums).into_boxed_slice(),
            );
            let bound = p.bound;
            let folded = st.index.retain_overlays(&p.oid, |o| !bound.takes(o));
            if st.index.block_of(&p.oid) == Some(p.claim.block)
                && st.index.blocks[p.claim.block as usize].version.get() < p.top
            {
                st.index.set_version(p.claim.block, p.top);
            }
            st.stats.flushed_overlays += folded as u64;
        }
    }
    // Dropping the plans (on either path) releases their claims and wakes
    // the readers and planners waiting for these blocks.
    drop(plans);
    inner.bump_epoch();
    result
}

/// Waits for every planning task (also after one failed, so that no plan,
/// and no claim, outlives the group) and adds their plans to `plans`.
async fn collect_plans<D: BlockDev + 'static>(
    planning: Vec<rt::JoinHandle<Result<Option<FoldPlan<D>>>>>,
    plans: &mut Vec<FoldPlan<D>>,
) -> Result<()> {
    let mut result = Ok(());
    for h in planning {
        match h.await {
            Ok(Some(p)) => plans.push(p),
            Ok(None) => {}
            Err(e) => result = result.and(Err(e)),
        }
    }
    result
}

/// Folds every object's overlays before `j`, journaling each group of folds
/// (durably) before writing it in place.
async fn fold_all<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    oids: Vec<ObjectId>,
    j: u64,
) -> Result<()> {
    let mut oids = oids.into_iter().peekable();
    while oids.peek().is_some() {
        // Plan a group concurrently (each plan may read from the disk).
        let mut plans = Vec::new();
        let mut planning = Vec::new();
        for oid in oids.by_ref() {
            let this = inner.clone();
            planning.push(rt::spawn(async move {
                plan_fold(&this, oid, Bound::Before(j)).await
            }));
            if planning.len() >= FOLD_PLANS_INFLIGHT_MAX {
                collect_plans(std::mem::take(&mut planning), &mut plans).await?;
                let bytes: usize = plans.iter().map(FoldPlan::bytes).sum();
                if plans.len() >= FOLD_GROUP_OBJECTS_MAX || bytes >= FOLD_GROUP_BYTES_MAX {
                    break;
                }
            }
        }
        collect_plans(planning, &mut plans).await?;
        if plans.is_empty() {
            continue;
        }
        let mut acks = Vec::with_capacity(plans.len());
        for p in &plans {
            let (tx, rx) = oneshot();
            inner.enqueue(Queued {
                rec: Record {
                    kind: RecordKind::Fold,
                    oid: p.oid,
                    version: p.top,
                    offset: 0,
                    len: 0,
                    block: p.claim.block,
                    csums: p.pairs.clone(),
                    data_pos: 0,
                    entry: None,
                },
                data: None,
                data_done: None,
                durable: true,
                checkpoint: true,
                done: tx,
            });
            acks.push(rx);
        }
        for rx in acks {
            rx.await
                .unwrap_or_else(|| Err(Error::Failed("journal writer stopped".into())))?;
        }
        apply_folds(inner, plans).await?;
    }
    Ok(())
}

/// Redoes the folds replay found in the journal (their in-place writes may
/// be missing or torn), before the store serves anything. Returns how many
/// objects it folded again.
pub(crate) async fn redo_replay_folds<D: BlockDev + 'static>(inner: &Rc<Inner<D>>) -> Result<u64> {
    let folds = std::mem::take(&mut inner.st.borrow_mut().ckpt.replay_folds);
    let mut last: crate::index::OidMap<u64> = Default::default();
    for f in folds {
        if inner.st.borrow().index.block_of(&f.oid) != Some(f.block) {
            continue;
        }
        let mut cs = inner.block_csums(f.block).await?;
        for p in f.pairs.chunks_exact(2) {
            cs[p[0] as usize] = p[1];
        }
        let mut st = inner.st.borrow_mut();
        // Nothing else folds while open redoes (the checkpointer starts
        // after): no plan can hold checksums this patch would outdate.
        crate::strict_assert!(
            st.ckpt.folds.is_empty(),
            "a fold plan is in flight during the redo at open"
        );
        st.csum.set(f.block, cs.into_boxed_slice());
        let top = last.entry(f.oid).or_default();
        *top = (*top).max(f.version);
    }
    let mut plans = Vec::new();
    for (oid, v) in last {
        if let Some(p) = plan_fold(inner, oid, Bound::UpTo(v)).await? {
            plans.push(p);
        }
    }
    let n = plans.len() as u64;
    if !plans.is_empty() {
        apply_folds(inner, plans).await?;
    }
    Ok(n)
}

impl<D: BlockDev + 'static> Inner<D> {
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
