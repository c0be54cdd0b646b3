//! The journal writer: group commit, and applying records to the index.
//!
//! PERF-CRITICAL. One task owns the journal's head. Each turn it takes every
//! queued record (up to the batch limits), writes them as one batch with one
//! gathered write, waits for the data blocks of its full-block writes,
//! issues one fsync (unless the device commits immediately, or no writer in
//! the batch asked for durability), applies the batch to the index in
//! order, and answers every writer. While it waits, new writers queue up and
//! form the next batch, so the fsync cost is shared by everyone who arrived
//! during the previous one.

use std::rc::Rc;

use nacre_io::{AlignedBuf, BlockDev};
use std::rc::Rc as StdRc;

use crate::error::{Error, Result};
use crate::format::{RecordKind, RECORDS_PER_BATCH_MAX};
use crate::index::Overlay;
use crate::journal::{self, batch_bytes_max, BatchId, Record, BATCH_HDR_BYTES_MAX};
use crate::store::{Inner, Queued, State};

fn pad(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Applies one record to the index. During replay nothing is freed (the
/// allocator is rebuilt from the index afterwards).
pub(crate) fn apply_record(st: &mut State, rec: &Record, data: Option<AlignedBuf>, replay: bool) {
    if rec.kind == RecordKind::Fold {
        // Live, the checkpointer applies its own folds; at replay they are
        // redone once the journal is read.
        if replay && st.index.block_of(&rec.oid) == Some(rec.block) {
            st.replay_folds.push(crate::store::ReplayFold {
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
            // Folds met earlier were for the content this write replaces.
            if replay {
                st.replay_folds.retain(|f| f.oid != rec.oid);
            }
            let old = st.index.clear_block(&rec.oid);
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
            if let Some(old) = old.filter(|&o| o != rec.block) {
                if !replay {
                    st.alloc.defer(old);
                }
            }
        }
        RecordKind::Fold => unreachable!("handled above"),
        RecordKind::Delete => {
            if cur.is_none() {
                return;
            }
            if replay {
                st.replay_folds.retain(|f| f.oid != rec.oid);
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
fn take_batch(st: &mut State, block_bytes: u32, sector: u64) -> (Vec<Queued>, bool) {
    let exempt = !st.ckpt_queue.is_empty();
    let queue = if exempt {
        &mut st.ckpt_queue
    } else {
        &mut st.queue
    };
    let max_total = batch_bytes_max(block_bytes);
    let mut hdr = std::mem::size_of::<crate::format::BatchHeader>() as u64;
    let mut data = 0u64;
    let mut out = Vec::new();
    while let Some(q) = queue.front() {
        let h = 48 + 4 * q.rec.csums.len() as u64;
        let d = if q.rec.kind == RecordKind::Small {
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

pub(crate) async fn journal_task<D: BlockDev + 'static>(inner: Rc<Inner<D>>) {
    loop {
        let (mut batch, exempt, waiters) = loop {
            {
                let mut st = inner.st.borrow_mut();
                let work = !st.queue.is_empty()
                    || !st.ckpt_queue.is_empty()
                    || !st.sync_waiters.is_empty();
                if work {
                    let sector = u64::from(inner.g.sector_bytes);
                    let (b, exempt) = take_batch(&mut st, inner.g.block_bytes, sector);
                    let w = std::mem::take(&mut st.sync_waiters);
                    break (b, exempt, w);
                }
                if st.closing {
                    return;
                }
            }
            inner.journal_kick.wait().await;
        };
        let mut result = write_batch(&inner, &mut batch, exempt, !waiters.is_empty(), false).await;
        if let Err(Error::JournalFull) = result {
            // Put everything back and wait for a checkpoint to trim the
            // journal; checkpoint records jump the queue meanwhile.
            {
                let mut st = inner.st.borrow_mut();
                for q in batch.into_iter().rev() {
                    st.queue.push_front(q);
                }
                let mut w = waiters;
                w.append(&mut st.sync_waiters);
                st.sync_waiters = w;
                st.ckpt_wanted = true;
            }
            inner.ckpt_kick.notify();
            inner.journal_kick.wait().await;
            continue;
        }
        if result.is_ok() && waiters.iter().any(|(_, marker)| *marker) {
            result = write_marker(&inner).await;
        }
        finish_batch(&inner, batch, waiters, result);
    }
}

/// Writes, waits for, and fsyncs one batch; applies it on success. An
/// empty batch is written only as a `marker` (a header recording the sync).
/// `Err(JournalFull)` means nothing was written: the batch must wait.
async fn write_batch<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    batch: &mut [Queued],
    exempt: bool,
    sync_asked: bool,
    marker: bool,
) -> Result<()> {
    if let Some(why) = &inner.st.borrow().failed {
        return Err(Error::Failed(why.clone()));
    }
    let g = &inner.g;
    let sector = u64::from(g.sector_bytes);
    let wants_durable = sync_asked || batch.iter().any(|q| q.durable);
    let writes = !batch.is_empty() || marker;
    if writes {
        let refs: Vec<&Record> = batch.iter().map(|q| &q.rec).collect();
        let data_bytes: u64 = refs
            .iter()
            .filter(|r| r.kind == RecordKind::Small)
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
            (
                st.gen,
                st.synced_upto,
                u64::from_le_bytes(g.uuid[..8].try_into().expect("8 bytes")),
            )
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
        let phys = g.journal_offset + pos % g.journal_bytes;
        let res = inner.dev.writev_at(bufs, phys).await;
        // Hand each small write's buffer back to its record: the index may
        // keep it for folding and reads.
        let res = res.map(|bufs| {
            let mut it = bufs.into_iter().skip(1);
            for q in batch.iter_mut().filter(|q| q.rec.kind == RecordKind::Small) {
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
        st.head = pos + total;
        st.recorded_synced = st.recorded_synced.max(synced_upto);
        st.stats.batches += 1;
        st.stats.records += batch.len() as u64;
    }
    let needs_fsync = wants_durable && (inner.st.borrow().unsynced || writes);
    if needs_fsync && !inner.opts.immediate_commit {
        if let Err(e) = inner.dev.sync().await {
            inner.fail(format!("journal fsync: {e}"));
            return Err(Error::Failed(format!("fsync: {e}")));
        }
        inner.st.borrow_mut().stats.syncs += 1;
    }
    let mut st = inner.st.borrow_mut();
    if wants_durable || inner.opts.immediate_commit {
        st.synced_upto = st.head;
        st.unsynced = false;
    } else if writes {
        st.unsynced = true;
    }
    for q in batch.iter_mut() {
        let data = q.data.take();
        apply_record(&mut st, &q.rec, data, false);
    }
    st.completed = st.head;
    Ok(())
}

/// Writes an empty batch whose header records `synced_upto`, if the newest
/// header on disk records less, and makes it durable.
async fn write_marker<D: BlockDev + 'static>(inner: &Rc<Inner<D>>) -> Result<()> {
    let (synced, recorded) = {
        let st = inner.st.borrow();
        (st.synced_upto, st.recorded_synced)
    };
    if recorded >= synced {
        return Ok(());
    }
    write_batch(inner, &mut [], true, true, true).await
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
    // Client writes leave a fifth of the ring (at least two batches) to the
    // checkpointer, whose fold records must always fit: they are far
    // smaller than the writes they fold, so the reserve never runs out.
    let limit = if exempt {
        g.journal_bytes
    } else {
        g.journal_bytes - (g.journal_bytes / 5).max(2 * batch_bytes_max(g.block_bytes))
    };
    let (head, tail, gen, synced) = {
        let st = inner.st.borrow();
        (st.head, st.tail, st.gen, st.synced_upto)
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
        uuid_lo: u64::from_le_bytes(g.uuid[..8].try_into().expect("8 bytes")),
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
    st.head = head + lap_left;
    Ok(Some(st.head))
}

fn finish_batch<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    batch: Vec<Queued>,
    waiters: Vec<(nacre_io::sync::Sender<Result<()>>, bool)>,
    result: Result<()>,
) {
    {
        let mut st = inner.st.borrow_mut();
        for q in batch.iter().filter(|q| !q.checkpoint) {
            if q.rec.kind == RecordKind::Big {
                st.big_inflight -= 1;
            }
            if let Some(f) = st.inflight.get_mut(&q.rec.oid) {
                f.count -= 1;
                if f.count == 0 {
                    st.inflight.remove(&q.rec.oid);
                }
            }
        }
        let used = st.head - st.tail;
        // Checkpoint when the journal fills, or when freed blocks waiting
        // for one make up a good part of what is left.
        let deferred = st.alloc.deferred_count() as u64;
        let blocks_waiting = deferred >= 64 && deferred * 4 >= u64::from(st.alloc.free_count());
        if blocks_waiting
            || used * 100 >= inner.g.journal_bytes * u64::from(inner.opts.checkpoint_at_percent)
        {
            st.ckpt_wanted = true;
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
