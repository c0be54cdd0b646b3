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

use std::rc::Rc;

use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_types::{ObjectId, CSUM_CHUNK_BYTES, SECTOR_BYTES};
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

use crate::error::{Error, Result};
use crate::format::{
    page_crc, CheckpointHeader, Geometry, PageMeta, CKPT_MAGIC, FORMAT_VERSION, PAGE_BYTES,
};
use crate::store::Inner;

/// Table-page writes in flight at once during a checkpoint.
const PAGE_WRITES_INFLIGHT_MAX: usize = 64;
/// XOR-ed into the checksum of a chunk whose old content failed its check
/// while an overlay was folded into part of it: the chunk keeps failing
/// reads instead of getting a fresh checksum over damaged bytes.
const POISON: u32 = 0xdead_beef;

pub(crate) async fn checkpoint_task<D: BlockDev + 'static>(inner: Rc<Inner<D>>) {
    loop {
        loop {
            {
                let st = inner.st.borrow();
                if st.closing {
                    return;
                }
                if st.ckpt_wanted && st.failed.is_none() {
                    break;
                }
            }
            inner.ckpt_kick.wait().await;
        }
        inner.st.borrow_mut().ckpt_wanted = false;
        if let Err(e) = run_checkpoint(&inner).await {
            inner.fail(format!("checkpoint: {e}"));
        }
        inner.ckpt_done.notify();
    }
}

/// Encodes a checkpoint slot: header page, then the page table.
pub(crate) fn encode_slot(
    g: &Geometry,
    seq: u64,
    journal_start: u64,
    gen: u64,
    obj: &[PageMeta],
    csum: &[PageMeta],
) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(g.slot_bytes as usize);
    let table_at = PAGE_BYTES as usize;
    let mut at = table_at;
    for m in obj.iter().chain(csum.iter()) {
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
        pagetab_crc: U32::new(crc32c::crc32c(&buf[table_at..at])),
        crc: U32::new(0),
    };
    h.crc = U32::new(crc32c::crc32c(h.as_bytes()));
    buf[..std::mem::size_of::<CheckpointHeader>()].copy_from_slice(h.as_bytes());
    buf
}

async fn write_pages<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    writes: Vec<(u64, AlignedBuf)>,
) -> Result<()> {
    let mut handles = Vec::new();
    for (pos, buf) in writes {
        let this = inner.clone();
        handles.push(rt::spawn(async move {
            this.dev.write_at(buf, pos).await.map(drop)
        }));
        if handles.len() >= PAGE_WRITES_INFLIGHT_MAX {
            for h in handles.drain(..) {
                h.await?;
            }
        }
    }
    for h in handles {
        h.await?;
    }
    Ok(())
}

async fn run_checkpoint<D: BlockDev + 'static>(inner: &Rc<Inner<D>>) -> Result<()> {
    let g = &inner.g;
    let (j, releasing, to_fold) = {
        let mut st = inner.st.borrow_mut();
        let fold: Vec<ObjectId> = st.index.pending.keys().copied().collect();
        (st.completed, st.alloc.take_deferred(), fold)
    };
    for oid in to_fold {
        fold_object(inner, oid, j).await?;
    }
    // Merge checksum changes into their pages (loading pages as needed).
    let blocks = inner.st.borrow().csum.delta_blocks();
    for b in blocks {
        let (page, _) = g.csum_page_of(b);
        loop {
            let meta = {
                let st = inner.st.borrow();
                if st.csum.has_page(page) {
                    break;
                }
                st.csum.metas[page as usize]
            };
            inner.load_csum_page(page, meta).await?;
        }
        inner.st.borrow_mut().csum.merge(g, b);
    }
    // Changed pages to their shadow copies.
    let (writes, obj_metas, csum_metas, csum_pages) = {
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
        (writes, obj_metas, csum_metas, csum_pages)
    };
    write_pages(inner, writes).await?;
    if !inner.opts.immediate_commit {
        inner.dev.sync().await?;
    }
    let (slot, seq, gen) = {
        let st = inner.st.borrow();
        (1 - st.ckpt_slot, st.ckpt_seq + 1, st.gen)
    };
    let buf = encode_slot(g, seq, j, gen, &obj_metas, &csum_metas);
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
    st.ckpt_slot = slot;
    st.ckpt_seq = seq;
    st.obj_metas = obj_metas;
    st.csum.commit(csum_metas, &csum_pages);
    st.tail = j;
    st.alloc.release(&releasing);
    st.stats.checkpoints += 1;
    drop(st);
    inner.bump_epoch();
    Ok(())
}

/// Writes the overlays of `oid` from before `j` into its block.
async fn fold_object<D: BlockDev + 'static>(
    inner: &Rc<Inner<D>>,
    oid: ObjectId,
    j: u64,
) -> Result<()> {
    let g = &inner.g;
    let (block, ovs) = {
        let st = inner.st.borrow();
        let (Some(p), Some(b)) = (st.index.pending.get(&oid), st.index.block_of(&oid)) else {
            return Ok(());
        };
        let ovs: Vec<_> = p
            .overlays
            .iter()
            .filter(|o| o.data_pos < j)
            .cloned()
            .collect();
        (b, ovs)
    };
    if ovs.is_empty() {
        return Ok(());
    }
    // Everything that can fail a check is read before the block is touched.
    let mut datas = Vec::with_capacity(ovs.len());
    for o in &ovs {
        datas.push(inner.read_overlay(o, 0, o.len).await?.0);
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
    // Readers of this object wait while its block changes under them.
    inner.st.borrow_mut().flushing = Some(oid);
    inner.bump_epoch();
    let result = async {
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
            let whole = covered[c0 * spc..c * spc].iter().all(|&x| x);
            let mut buf = if whole {
                AlignedBuf::new(len)
            } else {
                let pos = g.block_offset(block) + off as u64;
                inner.dev.read_at(AlignedBuf::new(len), pos).await?
            };
            let mut poisoned = vec![false; c - c0];
            if !whole {
                for (i, p) in poisoned.iter_mut().enumerate() {
                    let cc = c0 + i;
                    let full = covered[cc * spc..(cc + 1) * spc].iter().all(|&x| x);
                    *p = !full && crc32c::crc32c(&buf[i * chunk..(i + 1) * chunk]) != csums[cc];
                }
            }
            for (o, d) in ovs.iter().zip(&datas) {
                let (o0, o1) = (o.offset as usize, (o.offset + o.len) as usize);
                let (r0, r1) = (o0.max(off), o1.min(off + len));
                if r0 < r1 {
                    buf[r0 - off..r1 - off].copy_from_slice(&d[r0 - o0..r1 - o0]);
                }
            }
            for (i, &p) in poisoned.iter().enumerate() {
                let crc = crc32c::crc32c(&buf[i * chunk..(i + 1) * chunk]);
                csums[c0 + i] = if p { crc ^ POISON } else { crc };
            }
            if poisoned.iter().any(|&p| p) {
                tracing::error!("object {oid}: block {block} had damaged chunks under a partial overwrite; they stay unreadable");
            }
            inner.dev.write_at(buf, g.block_offset(block) + off as u64).await?;
        }
        Ok::<(), Error>(())
    }
    .await;
    let mut st = inner.st.borrow_mut();
    if result.is_ok() {
        st.csum.set(block, csums.into_boxed_slice());
        let top = ovs.iter().map(|o| o.version).max().expect("non-empty");
        if let Some(p) = st.index.pending.get_mut(&oid) {
            p.overlays.retain(|o| o.data_pos >= j);
            if p.overlays.is_empty() {
                st.index.pending.remove(&oid);
            }
        }
        if st.index.block_of(&oid) == Some(block)
            && st.index.blocks[block as usize].version.get() < top
        {
            st.index.set_version(block, top);
        }
        st.stats.flushed_overlays += ovs.len() as u64;
    }
    st.flushing = None;
    drop(st);
    inner.bump_epoch();
    inner.flush_done.notify();
    result
}
