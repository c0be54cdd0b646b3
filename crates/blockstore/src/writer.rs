//! The journal writer and syncer: group commit, and applying records to the
//! index.
//!
//! PERF-CRITICAL. Two tasks form a pipeline. The writer owns the journal's
//! head: each turn it takes every queued record (up to the batch limits),
//! writes them as one batch with one gathered write, waits for the data
//! blocks of its full-block writes, and hands the batch to the syncer
//! without waiting for durability. The syncer takes every batch handed
//! over since its last turn, issues one fsync for all of them (unless the
//! device commits immediately, or nobody asked for durability), applies
//! them to the index in journal order and answers every writer. While one
//! fsync runs, the next batch is already being written, and writers
//! arriving meanwhile share the next fsync.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use nacre_io::sync::Sender;
use nacre_io::{AlignedBuf, BlockDev};
use std::rc::Rc as StdRc;

use crate::error::{Error, Result};
use crate::format::{
    batch_bytes_max, Geometry, RecordKind, BATCH_HDR_BYTES_MAX, RECORDS_PER_BATCH_MAX,
};
use crate::index::Overlay;
use crate::journal::{self, BatchId, Record};
use crate::state::{Inner, Queued, State, Written};

fn pad(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Applies one record to the index. During replay nothing is freed (the
/// allocator is rebuilt from the index afterwards).
pub(crate) fn apply_record(st: &mut State, rec: &Record, data: Option<AlignedBuf>, replay: bool) {
    // The entry first: it is history even where the data is stale.
    if let Some(e) = &rec.entry {
        st.pglogs.insert(e, replay);
    }
    match rec.kind {
        RecordKind::Log => return,
        RecordKind::PgRewind => return st.pglogs.rewind(rec.oid.volume.0, rec.version),
        RecordKind::PgRemove => return st.pglogs.remove(rec.oid.volume.0),
        RecordKind::PgForget => return st.pglogs.forget(rec.oid.volume.0, rec.version),
        RecordKind::PgMark => return st.pglogs.mark(rec.oid.volume.0, rec.version != 0),
        RecordKind::PgTail => return st.pglogs.raise_tail(rec.oid.volume.0, rec.version),
        RecordKind::Undo | RecordKind::UndoBlock => return st.apply_undo(rec, data, replay),
        RecordKind::Release => {
            if st.undos.on_release(&rec.oid, rec.version) {
                st.drop_hidden(rec.oid, replay);
            }
            return;
        }
        _ => {}
    }
    if rec.kind == RecordKind::Fold {
        // Live, the checkpointer applies its own folds; at replay they are
        // redone once the journal is read.
        if replay && st.index.block_of(&rec.oid) == Some(rec.block) {
            st.ckpt.replay_folds.push(crate::state::ReplayFold {
                oid: rec.oid,
                block: rec.block,
                version: rec.version,
                pairs: rec.csums.clone(),
            });
        }
        return;
    }
    let cur = st.index.version(&rec.oid);
    if cur.is_some_and(|c| rec.version < c) {
        if !replay && rec.kind == RecordKind::Big {
            st.alloc.defer(rec.block);
        }
        return;
    }
    match rec.kind {
        RecordKind::Small => {
            if st.index.block_of(&rec.oid).is_none() {
                // Only in replay: a small write to an object a later record
                // (already captured by the checkpoint) deleted.
                crate::strict_assert!(replay, "small write to {} without a block", rec.oid);
                return;
            }
            if st.undo_on_write(rec.oid, rec.version, replay) {
                // Only a whole-block write keeps a block (a replay of
                // records no live store wrote): nothing to keep here.
                crate::strict_assert!(replay, "a small write of {} kept a block", rec.oid);
                st.undos.drop_held(&rec.oid);
            }
            let cache = data.filter(|_| {
                st.index.overlay_data_bytes + u64::from(rec.len) <= st.overlay_cache_max
            });
            st.index.add_overlay(
                rec.oid,
                rec.version,
                Overlay {
                    offset: rec.offset,
                    len: rec.len,
                    data_pos: rec.data_pos,
                    version: rec.version,
                    csums: rec.csums.clone().into_boxed_slice(),
                    data: cache.map(StdRc::new),
                },
            );
        }
        RecordKind::Big => {
            let keeps_block = st.undo_on_write(rec.oid, rec.version, replay);
            let h = crate::undo::hidden(rec.oid);
            let old = st.index.clear_block(&rec.oid);
            // The block replaced, kept as the write's undo under the
            // object's hidden name (not when replay finds the write
            // applied already: the table has the hidden object then).
            let keep = old.filter(|&o| keeps_block && o != rec.block);
            // Folds met earlier were for the content this write replaces
            // — or, kept, for the hidden object that holds it now.
            if replay {
                st.ckpt.replay_folds.retain_mut(|f| {
                    if f.oid == rec.oid && Some(f.block) == keep {
                        f.oid = h;
                    }
                    f.oid != rec.oid
                });
            }
            if replay && !st.index.blocks[rec.block as usize].is_free() {
                // A stale table entry from a fuzzy checkpoint: the journal
                // is authoritative.
                let stale = st.index.blocks[rec.block as usize].oid();
                tracing::warn!(
                    "replay: block {} moves from {stale} to {}",
                    rec.block,
                    rec.oid
                );
                st.index.clear_block(&stale);
            }
            st.index.set_block(rec.oid, rec.block, rec.version);
            st.index.drop_pending(&rec.oid);
            st.csum.set(rec.block, rec.csums.clone().into_boxed_slice());
            match keep {
                Some(b) => {
                    if st.index.block_of(&h).is_some() {
                        // Only from a stale table in replay.
                        crate::strict_assert!(replay, "{h} holds a block already");
                        st.drop_hidden(rec.oid, replay);
                    }
                    st.index.set_block(h, b, cur.unwrap_or(0));
                }
                None => {
                    if keeps_block && st.index.block_of(&h).is_none() {
                        // Replay: no block to keep (the object had none,
                        // or the write was applied and its undo is gone).
                        st.undos.drop_held(&rec.oid);
                    }
                    if let Some(old) = old.filter(|&o| o != rec.block) {
                        if !replay {
                            st.alloc.defer(old);
                        }
                    }
                }
            }
        }
        RecordKind::Fold
        | RecordKind::Log
        | RecordKind::PgRewind
        | RecordKind::PgRemove
        | RecordKind::PgForget
        | RecordKind::PgMark
        | RecordKind::PgTail
        | RecordKind::Undo
        | RecordKind::UndoBlock
        | RecordKind::Release => unreachable!("handled above"),
        RecordKind::Delete => {
            if st.undos.on_delete(&rec.oid) {
                st.drop_hidden(rec.oid, replay);
            }
            if cur.is_none() {
                return;
            }
            if replay {
                st.ckpt.replay_folds.retain(|f| f.oid != rec.oid);
            }
            let old = st.index.clear_block(&rec.oid);
            st.index.drop_pending(&rec.oid);
            if let (Some(old), false) = (old, replay) {
                st.alloc.defer(old);
            }
        }
    }
}

/// Takes the next batch: checkpoint records first (never mixed with client
/// writes, so they can use the reserved journal space), else client writes.
/// A client batch takes at most an eighth of the room left below the
/// client limit (`client_batch_max`).
fn take_batch(st: &mut State, g: &Geometry) -> (Vec<Queued>, bool) {
    let exempt = !st.writer.ckpt_queue.is_empty();
    let max_total = if exempt {
        batch_bytes_max(g.block_bytes)
    } else {
        client_batch_max(g, st.journal.used())
    };
    let sector = u64::from(g.sector_bytes);
    let queue = if exempt {
        &mut st.writer.ckpt_queue
    } else {
        &mut st.writer.queue
    };
    let mut hdr = std::mem::size_of::<crate::format::BatchHeader>() as u64;
    let mut data = 0u64;
    let mut out = Vec::new();
    while let Some(q) = queue.front() {
        let h = journal::record_bytes(&q.rec) as u64;
        let d = if q.rec.kind.has_data() {
            pad(u64::from(q.rec.len), sector)
        } else {
            0
        };
        let fits = out.len() < RECORDS_PER_BATCH_MAX as usize
            && hdr + h <= BATCH_HDR_BYTES_MAX
            && pad(hdr + h, sector) + data + d <= max_total;
        if !fits && !out.is_empty() {
            break;
        }
        hdr += h;
        data += d;
        out.push(queue.pop_front().expect("front exists"));
    }
    (out, exempt)
}

/// Batches handed from the writer to the syncer at most (bounds the memory
/// and the time between a write and its acknowledgement).
const PIPELINE_BATCHES_MAX: usize = 4;

/// A timer the writer keeps across wake-ups.
type Timer = Pin<Box<dyn Future<Output = ()>>>;

/// The writer: takes batches off the queues and writes them, one after
/// another, without waiting for their fsync.
pub(crate) async fn journal_task<D: BlockDev + 'static>(inner: Rc<Inner<D>>) {
    // Set when client writes did not fit: they wait until a checkpoint
    // moves the journal's tail past this, while sync barriers and the
    // checkpointer's own records are still served (a checkpoint may be
    // waiting for them).
    let mut full_at_tail: Option<u64> = None;
    // The last client batch: when it was taken and the journal bytes it
    // took, which pace the next one (`pace_after`).
    let mut last_client: Option<(Duration, u64)> = None;
    let pacing = nacre_io::rt::has_timers();
    // The timer of the pace being waited out and when it ends: kept across
    // wake-ups (every client write arriving wakes the writer) and while
    // the pace grows (it then fires early and the pace is looked at
    // again), replaced only when the pace shrinks (a checkpoint moved the
    // tail), dropped when client batches go on. A dropped timer's op runs
    // out in the kernel: at most one per commit that ends a pace.
    let mut pace_timer: Option<(Duration, Timer)> = None;
    // Client batches are held back by the pace (counted once per hold).
    let mut holding = false;
    loop {
        let (mut batch, exempt, waiters, taken_at) = loop {
            let mut paced_until = None;
            {
                let mut st = inner.st.borrow_mut();
                if full_at_tail.is_some_and(|t| t != st.journal.tail) {
                    full_at_tail = None;
                }
                let mut clients = !st.writer.queue.is_empty() && full_at_tail.is_none();
                let now = nacre_io::rt::monotonic();
                let pace = clients && pacing && !st.closing && st.failed.is_none();
                if let Some((at, bytes)) = last_client.filter(|_| pace) {
                    let due =
                        at + pace_after(&inner.g, st.journal.used(), bytes, st.ckpt.ns_per_byte);
                    if due > now {
                        clients = false;
                        paced_until = Some((due, now));
                    }
                }
                let work = clients
                    || !st.writer.ckpt_queue.is_empty()
                    || !st.writer.sync_waiters.is_empty();
                if work && st.writer.written.len() < PIPELINE_BATCHES_MAX {
                    let (b, exempt) = if clients || !st.writer.ckpt_queue.is_empty() {
                        take_batch(&mut st, &inner.g)
                    } else {
                        (Vec::new(), false)
                    };
                    let w = std::mem::take(&mut st.writer.sync_waiters);
                    if clients {
                        pace_timer = None;
                        holding = false;
                    }
                    break (b, exempt, w, now);
                }
                if st.writer.drained() && st.closing && !st.ckpt.running {
                    st.writer.done = true;
                    drop(st);
                    inner.written_kick.notify();
                    return;
                }
            }
            // Woken by new work, by the syncer draining, or by a checkpoint
            // (which may end the pacing: it frees journal space).
            let Some((due, now)) = paced_until else {
                pace_timer = None;
                inner.journal_kick.wait().await;
                continue;
            };
            if !holding {
                holding = true;
                inner.st.borrow_mut().stats.paced_waits += 1;
            }
            if pace_timer.as_ref().is_none_or(|(d, _)| due < *d) {
                pace_timer = Some((due, Box::pin(nacre_io::rt::sleep(due - now))));
            }
            let timer = &mut pace_timer.as_mut().expect("set above").1;
            let mut kick = std::pin::pin!(inner.journal_kick.wait());
            let fired = std::future::poll_fn(|cx| {
                if timer.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(true);
                }
                kick.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if fired {
                pace_timer = None;
                inner.st.borrow_mut().stats.paced_timer_ends += 1;
            }
        };
        let head_before = inner.st.borrow().journal.head;
        let mut end_result = write_batch(&inner, &mut batch, exempt, false).await;
        if let Err(Error::JournalFull) = end_result {
            // Put the client batch back; go on with the barriers alone.
            {
                let mut st = inner.st.borrow_mut();
                for q in std::mem::take(&mut batch).into_iter().rev() {
                    st.writer.queue.push_front(q);
                }
                full_at_tail = Some(st.journal.tail);
                st.ckpt.wanted = true;
                st.stats.journal_full_waits += 1;
            }
            inner.ckpt_kick.notify();
            if waiters.is_empty() {
                continue;
            }
            end_result = write_batch(&inner, &mut batch, exempt, false).await;
        }
        let marker = waiters.iter().any(|(_, m)| *m);
        let durable = !waiters.is_empty() || batch.iter().any(|q| q.durable);
        let wrote = !batch.is_empty();
        let end = match end_result {
            Ok(end) => {
                if !exempt && !batch.is_empty() {
                    last_client = Some((taken_at, end.saturating_sub(head_before)));
                }
                end
            }
            Err(e) => {
                hand_over(
                    &inner,
                    Written {
                        batch,
                        waiters,
                        end: 0,
                        durable,
                        wrote,
                        error: Some(e.to_string()),
                    },
                );
                continue;
            }
        };
        if !marker {
            hand_over(
                &inner,
                Written {
                    batch,
                    waiters,
                    end,
                    durable,
                    wrote,
                    error: None,
                },
            );
            continue;
        }
        // A marker records a sync covering everything written so far: hand
        // this batch over, wait until the syncer has made it durable, then
        // write an empty batch whose header says so.
        hand_over(
            &inner,
            Written {
                batch,
                waiters: Vec::new(),
                end,
                durable: true,
                wrote,
                error: None,
            },
        );
        loop {
            {
                let st = inner.st.borrow();
                if st.failed.is_some()
                    || (st.writer.written.is_empty() && st.journal.synced_upto >= end)
                {
                    break;
                }
            }
            inner.applied.wait().await;
        }
        let needed = {
            let st = inner.st.borrow();
            st.journal.recorded_synced < st.journal.synced_upto
        };
        let r = if needed {
            write_batch(&inner, &mut [], true, true).await
        } else {
            Ok(end)
        };
        let (end, error) = match r {
            Ok(e) => (e, None),
            Err(e) => (0, Some(e.to_string())),
        };
        hand_over(
            &inner,
            Written {
                batch: Vec::new(),
                waiters,
                end,
                durable: true,
                wrote: needed,
                error,
            },
        );
    }
}

fn hand_over<D: BlockDev + 'static>(inner: &Rc<Inner<D>>, w: Written) {
    inner.st.borrow_mut().writer.written.push_back(w);
    inner.written_kick.notify();
}

/// The syncer: one fsync for every batch written since the last one, then
/// applies them in order and answers their writers.
pub(crate) async fn sync_task<D: BlockDev + 'static>(inner: Rc<Inner<D>>) {
    loop {
        let group: Vec<Written> = loop {
            {
                let mut st = inner.st.borrow_mut();
                if !st.writer.written.is_empty() {
                    break st.writer.written.drain(..).collect();
                }
                if st.writer.done {
                    return;
                }
            }
            inner.written_kick.wait().await;
        };
        // The writer may go on while we fsync.
        inner.journal_kick.notify();
        let wants = group.iter().any(|w| w.durable);
        let wrote = group.iter().any(|w| w.wrote);
        let needs_fsync = wants && (inner.st.borrow().journal.unsynced || wrote);
        let mut result: std::result::Result<(), String> = match &inner.st.borrow().failed {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        };
        if result.is_ok() && needs_fsync && !inner.opts.immediate_commit {
            match inner.dev.sync().await {
                Ok(()) => inner.st.borrow_mut().stats.syncs += 1,
                Err(e) => {
                    inner.fail(format!("journal fsync: {e}"));
                    result = Err(format!("fsync: {e}"));
                }
            }
        }
        if result.is_ok() {
            let mut st = inner.st.borrow_mut();
            let last = group
                .iter()
                .filter(|w| w.error.is_none())
                .map(|w| w.end)
                .max()
                .unwrap_or(0);
            if wants || inner.opts.immediate_commit {
                st.journal.synced(last);
            } else if wrote {
                st.journal.unsynced = true;
            }
        }
        for mut w in group {
            let r = match (w.error.take(), &result) {
                (Some(e), _) => Err(Error::Failed(e)),
                (None, Err(e)) => Err(Error::Failed(e.clone())),
                (None, Ok(())) => Ok(()),
            };
            if r.is_ok() {
                let mut st = inner.st.borrow_mut();
                for q in w.batch.iter_mut() {
                    let data = q.data.take();
                    apply_record(&mut st, &q.rec, data, false);
                }
                if cfg!(feature = "strict") {
                    let State { undos, index, .. } = &*st;
                    undos.check(index);
                }
                st.journal.complete(w.end);
            }
            finish_batch(&inner, w.batch, w.waiters, r);
        }
    }
}

/// Writes one batch (records, or a header-only `marker` recording the
/// sync) and waits for the data blocks of its full-block records. Returns
/// the journal position after it. `Err(JournalFull)` means nothing was
/// written: the batch must wait for a checkpoint.
async fn write_batch<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    batch: &mut [Queued],
    exempt: bool,
    marker: bool,
) -> Result<u64> {
    if let Some(why) = &inner.st.borrow().failed {
        return Err(Error::Failed(why.clone()));
    }
    if batch.is_empty() && !marker {
        return Ok(inner.st.borrow().journal.head);
    }
    let g = &inner.g;
    let sector = u64::from(g.sector_bytes);
    let refs: Vec<&Record> = batch.iter().map(|q| &q.rec).collect();
    let data_bytes: u64 = refs
        .iter()
        .filter(|r| r.kind.has_data())
        .map(|r| pad(u64::from(r.len), sector))
        .sum();
    let total = pad(journal::header_bytes(&refs) as u64, sector) + data_bytes;
    let Some(pos) = reserve_journal(inner, total, exempt || marker).await? else {
        if exempt || marker {
            inner.fail("journal too full for checkpoint records".into());
            return Err(Error::Failed(
                "journal too full for checkpoint records".into(),
            ));
        }
        return Err(Error::JournalFull);
    };
    let (gen, synced_upto, uuid_lo) = {
        let st = inner.st.borrow();
        (st.journal.gen, st.journal.synced_upto, g.uuid_lo())
    };
    let id = BatchId {
        pos,
        gen,
        synced_upto,
        uuid_lo,
    };
    let mut recs: Vec<&mut Record> = batch.iter_mut().map(|q| &mut q.rec).collect();
    let (hdr, written) = journal::encode_batch(&mut recs, id, g.sector_bytes);
    crate::strict_assert!(written == total);
    let mut bufs = Vec::with_capacity(batch.len() + 1);
    bufs.push(hdr);
    for q in batch.iter_mut() {
        if let Some(mut d) = q.data.take() {
            let l = d.len();
            let padded = pad(l as u64, sector) as usize;
            if padded != l {
                d.set_len(padded);
                d[l..].fill(0);
            }
            bufs.push(d);
        }
    }
    // The batch's end is claimed now, so the next batch can be placed
    // while this one is in flight.
    inner.st.borrow_mut().journal.advance_head(pos + total);
    let phys = g.journal_offset + pos % g.journal_bytes;
    let res = inner.dev.writev_at(bufs, phys).await;
    // Hand each small write's buffer back to its record: the index may
    // keep it for folding and reads.
    let res = res.map(|bufs| {
        let mut it = bufs.into_iter().skip(1);
        for q in (batch.iter_mut()).filter(|q| q.rec.kind.has_data() && q.rec.len > 0) {
            if let Some(mut b) = it.next() {
                b.set_len(q.rec.len as usize);
                q.data = Some(b);
            }
        }
    });
    // The data blocks of full-block writes must be written before the
    // fsync that makes the batch durable.
    let mut data_err = None;
    for q in batch.iter_mut() {
        if let Some(rx) = q.data_done.take() {
            match rx.await {
                Some(Ok(())) => {}
                Some(Err(e)) => data_err = Some(e.to_string()),
                None => data_err = Some("data write task vanished".into()),
            }
        }
    }
    if let Err(e) = res {
        inner.fail(format!("journal write at {pos}: {e}"));
        return Err(Error::Failed(format!("journal write: {e}")));
    }
    if let Some(e) = data_err {
        inner.fail(format!("data block write: {e}"));
        return Err(Error::Failed(format!("data block write: {e}")));
    }
    let mut st = inner.st.borrow_mut();
    st.journal.recorded(synced_upto);
    st.stats.batches += 1;
    st.stats.records += batch.len() as u64;
    Ok(pos + total)
}

/// The journal bytes client writes may fill. They leave a fifth of the
/// ring (at least two batches) to the checkpointer, whose fold records
/// must always fit: they are far smaller than the writes they fold, so the
/// reserve never runs out.
fn client_limit(g: &Geometry) -> u64 {
    g.journal_bytes - (g.journal_bytes / 5).max(2 * batch_bytes_max(g.block_bytes))
}

/// Client writes are paced once the journal is this many quarters of the
/// way to their limit (`client_limit`), so that a checkpoint that folds
/// slower than clients write slows them down gradually instead of
/// stopping them all at the limit until it commits.
const PACE_FROM_QUARTERS: u64 = 3;

/// Journal bytes in use from which client writes are paced; the
/// checkpointer folds and writes pages all-out from here on, since
/// clients are waiting for it.
pub(crate) fn pacing_from(g: &Geometry) -> u64 {
    client_limit(g) / 4 * PACE_FROM_QUARTERS
}

/// Journal bytes in use at which a checkpoint starts: `percent` of the
/// journal, and at the latest where client writes start being paced —
/// the pace is only there to let a running checkpoint commit (on a small
/// journal, or with `checkpoint_at_percent` set high, the paced range
/// would start below the configured trigger).
fn checkpoint_at(g: &Geometry, percent: u8) -> u64 {
    (g.journal_bytes * u64::from(percent) / 100).min(pacing_from(g))
}

/// The largest client batch with `used` journal bytes in use: the most a
/// batch may hold, and no more than an eighth of the room left below the
/// limit (at least one record: a batch always takes one), so that no
/// batch — with the ring's end it may skip — jumps past the paced range
/// to the limit, and the pace can still slow clients down as the room
/// runs out.
fn client_batch_max(g: &Geometry, used: u64) -> u64 {
    batch_bytes_max(g.block_bytes).min(client_limit(g).saturating_sub(used) / 8)
}
/// The pace's scale, in multiples of the time the last checkpoint took
/// per journal byte it covered (`Checkpoints::ns_per_byte`): at the
/// middle of the paced range a client batch delays the next by twice
/// what the checkpoint spends on as many bytes, at nine tenths by nine
/// times that, and more toward the limit (up to 999 times, 10 s at most).
const PACE_PER_CHECKPOINT_NS: f64 = 2.0;
/// The scale before a checkpoint has been timed: 8 ns per byte (125 MB/s
/// at the middle of the range).
const PACE_FIRST_NS_PER_BYTE: f64 = 8.0;

/// How long after a client batch of `bytes` the next one may start, with
/// `used` journal bytes now in use and the last checkpoint's
/// `ns_per_byte`: zero below the paced range, then `bytes · k · x/(1−x)`
/// where `x` in [0, 1) is how far into the range the journal is and `k`
/// is the scale (`PACE_PER_CHECKPOINT_NS`). With batches of at most an
/// eighth of the room left (`client_batch_max`), the time clients take
/// to cross the range grows with the log of its size in records (about
/// k·range·(ln(range/record) − 1)): for 4 KiB records about five times
/// what a checkpoint of half the journal takes at the last one's speed,
/// for 1 MiB records about as long (docs/internals/blockstore.md,
/// *Pacing client writes*). When a checkpoint moves the tail, the pace
/// falls with the fill at once.
fn pace_after(g: &Geometry, used: u64, bytes: u64, ns_per_byte: f64) -> Duration {
    let (from, limit) = (pacing_from(g), client_limit(g));
    if used <= from || limit <= from {
        return Duration::ZERO;
    }
    let k = if ns_per_byte > 0.0 {
        PACE_PER_CHECKPOINT_NS * ns_per_byte
    } else {
        PACE_FIRST_NS_PER_BYTE
    };
    let x = ((used - from) as f64 / (limit - from) as f64).min(0.999);
    Duration::from_nanos((bytes as f64 * k * x / (1.0 - x)).min(1e10) as u64)
}

/// Finds room for `total` bytes at the journal head (writing a wrap marker
/// if the batch would cross the ring's end). Returns the batch's logical
/// position, or `None` when the journal is too full.
async fn reserve_journal<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    total: u64,
    exempt: bool,
) -> Result<Option<u64>> {
    let g = &inner.g;
    let limit = if exempt {
        g.journal_bytes
    } else {
        client_limit(g)
    };
    let (head, tail, gen, synced) = {
        let st = inner.st.borrow();
        (
            st.journal.head,
            st.journal.tail,
            st.journal.gen,
            st.journal.synced_upto,
        )
    };
    let lap_left = g.journal_bytes - head % g.journal_bytes;
    let need = if total > lap_left {
        lap_left + total
    } else {
        total
    };
    if head + need - tail > limit {
        return Ok(None);
    }
    if total <= lap_left {
        return Ok(Some(head));
    }
    let id = BatchId {
        pos: head,
        gen,
        synced_upto: synced,
        uuid_lo: g.uuid_lo(),
    };
    let marker = journal::encode_wrap(id, g.sector_bytes);
    if let Err(e) = inner
        .dev
        .write_at(marker, g.journal_offset + head % g.journal_bytes)
        .await
    {
        inner.fail(format!("journal wrap marker: {e}"));
        return Err(Error::Failed(e.to_string()));
    }
    let mut st = inner.st.borrow_mut();
    st.journal.advance_head(head + lap_left);
    Ok(Some(st.journal.head))
}

fn finish_batch<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    batch: Vec<Queued>,
    waiters: Vec<(Sender<Result<()>>, bool)>,
    result: Result<()>,
) {
    {
        let mut st = inner.st.borrow_mut();
        for q in batch.iter().filter(|q| q.rec.kind.is_object_op()) {
            st.adm.applied(&q.rec.oid, q.rec.kind == RecordKind::Big);
        }
        let used = st.journal.used();
        // Checkpoint when the journal fills, or when freed blocks waiting
        // for one make up a good part of what is left.
        let deferred = st.alloc.deferred_count() as u64;
        let blocks_waiting = deferred >= 64 && deferred * 4 >= u64::from(st.alloc.free_count());
        if blocks_waiting || used >= checkpoint_at(&inner.g, inner.opts.checkpoint_at_percent) {
            st.ckpt.wanted = true;
            inner.ckpt_kick.notify();
        } else if used * 4 >= inner.g.journal_bytes {
            // Time to fold ahead.
            inner.ckpt_kick.notify();
        }
    }
    let err = |e: &Error| Error::Failed(e.to_string());
    for q in batch {
        q.done.send(match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(err(e)),
        });
    }
    for (w, _) in waiters {
        w.send(match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(err(e)),
        });
    }
    inner.applied.notify();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::LogRegion;

    /// Over journal and block sizes, the smallest included: a checkpoint
    /// starts no later than the pace, the pace starts below the limit,
    /// a client batch never exceeds the room left, and the pace is zero
    /// below its range, grows through it and stays finite at the limit.
    #[test]
    fn a_checkpoint_runs_whenever_clients_are_paced() {
        let mut planned = 0;
        for block in [4u32 << 10, 128 << 10, 4 << 20] {
            for journal in [
                None,
                Some(2u64 << 20),
                Some(16 << 20),
                Some(64 << 20),
                Some(1 << 30),
            ] {
                let Ok(g) =
                    Geometry::plan([0; 16], 64 << 30, block, 512, journal, LogRegion::DEFAULT)
                else {
                    continue;
                };
                planned += 1;
                let (from, limit) = (pacing_from(&g), client_limit(&g));
                assert!(checkpoint_at(&g, 50) <= from, "{block} {journal:?}");
                assert!(checkpoint_at(&g, 100) <= from, "{block} {journal:?}");
                assert!(
                    from < limit && limit < g.journal_bytes,
                    "{block} {journal:?}"
                );
                for used in [0, from, (from + limit) / 2, limit - 1] {
                    assert!(client_batch_max(&g, used) <= (limit - used) / 8);
                }
                assert_eq!(pace_after(&g, from, 4096, 1.0), Duration::ZERO);
                let mid = pace_after(&g, (from + limit) / 2, 4096, 1.0);
                let near = pace_after(&g, limit - 1, 4096, 1.0);
                assert!(Duration::ZERO < mid && mid < near, "{mid:?} {near:?}");
                assert!(pace_after(&g, limit, 1 << 30, f64::MAX) <= Duration::from_secs(10));
            }
        }
        assert!(planned >= 10, "{planned} geometries");
    }
}
