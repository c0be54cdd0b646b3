//! Formatting a device, and opening a store: superblock, newest valid
//! checkpoint, object table, then journal replay.
//!
//! Replay reads at most one ring of journal, so its cost is bounded by the
//! journal's size, not by the data's. It runs in two passes: the first
//! finds every valid batch after the checkpoint's position (stopping at the
//! first that is not); the second checks, for batches written after the last
//! known fsync, that the data blocks their full-block records point at hold
//! what the records say (the data write and the journal write raced, and
//! neither was acknowledged if the crash came between them), then applies
//! batches in order. A batch that fails either check ends the journal there.

use std::cell::{Cell, RefCell};

use nacre_io::sync::Notify;
use nacre_io::{AlignedBuf, BlockDev};
use nacre_types::BLOCK_BYTES_DEFAULT;
use zerocopy::FromBytes;

use crate::alloc::Allocator;
use crate::checkpoint::encode_slot;
use crate::csum::CsumTable;
use crate::error::{Error, Result};
use crate::format::batch_bytes_max;
use crate::format::LogRegion;
use crate::format::{
    page_crc, BlockEntry, CheckpointHeader, Geometry, LogSlotMeta, PageMeta, RecordKind,
    CKPT_MAGIC, FORMAT_VERSION, OBJ_ENTRIES_PER_PAGE, PAGE_BYTES, PAGE_NEVER_WRITTEN,
};
use crate::index::Index;
use crate::journal::{self, BatchError, BatchId, Record};
use crate::pglog::PgLogs;
use crate::state::{Checkpoints, Inner, State, Stats, StoreOptions};
use crate::writer::apply_record;

/// Options fixed when a store is formatted.
#[derive(Clone, Debug)]
pub struct FormatOptions {
    pub block_bytes: u32,
    /// Journal ring size; default 1/64 of the device within 64 MiB..1 GiB.
    pub journal_bytes: Option<u64>,
    /// Store id; random if not given.
    pub uuid: Option<[u8; 16]>,
    /// Write zeros over the journal at format, so that a file-backed store
    /// has its journal allocated before the first fsync'd write.
    pub zero_journal: bool,
    /// How many PG logs the store holds, and how long each may be.
    pub pg_logs: LogRegion,
    /// Bytes the store's owner keeps in the superblock page (at most
    /// [`crate::format::LABEL_BYTES_MAX`]): fixed at format, read back
    /// with [`crate::read_label`] without opening the store (an OSD's
    /// cluster and id).
    pub label: Vec<u8>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            block_bytes: BLOCK_BYTES_DEFAULT,
            journal_bytes: None,
            uuid: None,
            zero_journal: true,
            pg_logs: LogRegion::DEFAULT,
            label: Vec::new(),
        }
    }
}

/// What open found and did.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    pub checkpoint_seq: u64,
    pub objects_loaded: u64,
    pub batches_replayed: u64,
    pub records_replayed: u64,
    pub journal_bytes_replayed: u64,
    /// Why replay stopped before the end of what was written, if it did
    /// (torn or damaged batch); `None` for a clean end of the journal.
    pub replay_stopped: Option<String>,
    /// The journal ended at a whole-block write whose data block was not
    /// completely written: a write in flight at a crash, never
    /// acknowledged (its fsync waits for the block, and every later batch
    /// waits for that fsync), so the normal end of the journal, not damage.
    pub torn_tail: Option<String>,
    /// Objects whose folds replay found in the journal (Fold records) and
    /// open wrote again before serving anything.
    pub folds_redone: u64,
}

/// Bytes zeroed per write when clearing the journal at format.
const ZERO_CHUNK_BYTES: u64 = 4 << 20;

/// 16 random bytes: a new store's id (and other ids that must not repeat).
pub fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut u).is_ok() {
            return u;
        }
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    u.copy_from_slice(&(t ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
    u
}

pub fn uuid_string(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) async fn format<D: BlockDev>(dev: &D, opts: &FormatOptions) -> Result<Geometry> {
    if opts.label.len() > crate::format::LABEL_BYTES_MAX {
        return Err(Error::Invalid(format!(
            "a label of {} bytes; at most {}",
            opts.label.len(),
            crate::format::LABEL_BYTES_MAX
        )));
    }
    let sector = dev.align_bytes().max(512);
    let uuid = opts.uuid.unwrap_or_else(random_uuid);
    let g = Geometry::plan(
        uuid,
        dev.size_bytes(),
        opts.block_bytes,
        sector,
        opts.journal_bytes,
        opts.pg_logs,
    )?;
    let empty_obj = vec![PageMeta::default(); g.objtab_pages as usize];
    let empty_csum = vec![PageMeta::default(); g.csumtab_pages as usize];
    let empty_logs = vec![LogSlotMeta::default(); g.pglog.slots as usize];
    dev.write_at(
        encode_slot(&g, 1, (0, 1, 0), &empty_obj, &empty_csum, &empty_logs),
        g.slot_pos(0),
    )
    .await?;
    dev.write_at(AlignedBuf::zeroed(PAGE_BYTES as usize), g.slot_pos(1))
        .await?;
    // The journal's first sectors must not look like batches of this store;
    // zeroing all of it also makes a file allocate it now.
    let zero_to = if opts.zero_journal {
        g.journal_bytes
    } else {
        ZERO_CHUNK_BYTES.min(g.journal_bytes)
    };
    let mut at = 0;
    while at < zero_to {
        let n = ZERO_CHUNK_BYTES.min(zero_to - at);
        dev.write_at(AlignedBuf::zeroed(n as usize), g.journal_offset + at)
            .await?;
        at += n;
    }
    let mut sb = AlignedBuf::zeroed(PAGE_BYTES as usize);
    let sbb = g.to_superblock();
    sb[..std::mem::size_of_val(&sbb)].copy_from_slice(zerocopy::IntoBytes::as_bytes(&sbb));
    crate::format::put_label(&mut sb, &g.uuid, &opts.label)?;
    dev.write_at(AlignedBuf::from_slice(&sb), PAGE_BYTES)
        .await?;
    dev.sync().await?;
    dev.write_at(sb, 0).await?;
    dev.sync().await?;
    Ok(g)
}

async fn read_superblock<D: BlockDev>(dev: &D) -> Result<Geometry> {
    Ok(read_superblock_page(dev).await?.0)
}

/// The store's geometry and the superblock page it came from (the
/// backup's if the primary is damaged).
async fn read_superblock_page<D: BlockDev>(dev: &D) -> Result<(Geometry, AlignedBuf)> {
    if dev.size_bytes() < 2 * PAGE_BYTES {
        return Err(Error::DeviceTooSmall {
            have: dev.size_bytes(),
            need: 2 * PAGE_BYTES,
        });
    }
    let primary = dev.read_at(AlignedBuf::new(PAGE_BYTES as usize), 0).await?;
    match Geometry::from_superblock(&primary) {
        Ok(g) => Ok((g, primary)),
        Err(Error::Corrupt(why)) => {
            tracing::warn!("primary superblock damaged ({why}); trying the backup");
            let backup = dev
                .read_at(AlignedBuf::new(PAGE_BYTES as usize), PAGE_BYTES)
                .await?;
            Ok((Geometry::from_superblock(&backup)?, backup))
        }
        Err(e) => Err(e),
    }
}

/// The store on `dev`'s geometry and its owner's label
/// ([`FormatOptions::label`]; `None` if formatted without one), read from
/// its superblock without opening it. A damaged primary label falls back
/// to the backup page's.
pub async fn read_label<D: BlockDev>(dev: &D) -> Result<(Geometry, Option<Vec<u8>>)> {
    let (g, page) = read_superblock_page(dev).await?;
    match crate::format::get_label(&page, &g.uuid) {
        Ok(l) => Ok((g, l)),
        Err(e) => {
            tracing::warn!("store label damaged ({e}); trying the backup");
            let backup = dev
                .read_at(AlignedBuf::new(PAGE_BYTES as usize), PAGE_BYTES)
                .await?;
            Ok((g.clone(), crate::format::get_label(&backup, &g.uuid)?))
        }
    }
}

struct Checkpoint {
    seq: u64,
    slot: u32,
    journal_start: u64,
    gen: u64,
    lineage: u32,
    obj: Vec<PageMeta>,
    csum: Vec<PageMeta>,
    pglog: Vec<LogSlotMeta>,
}

async fn read_checkpoint<D: BlockDev>(dev: &D, g: &Geometry) -> Result<Checkpoint> {
    let mut best: Option<Checkpoint> = None;
    for slot in 0..2 {
        let buf = dev
            .read_at(AlignedBuf::new(g.slot_bytes as usize), g.slot_pos(slot))
            .await?;
        let Ok((h, _)) = CheckpointHeader::read_from_prefix(&buf[..]) else {
            continue;
        };
        if h.magic != CKPT_MAGIC {
            continue;
        }
        let mut check = h;
        check.crc = 0.into();
        let npages = (g.objtab_pages + g.csumtab_pages + g.pglog.slots) as usize;
        let table = &buf[PAGE_BYTES as usize..PAGE_BYTES as usize + 8 * npages];
        let valid = nacre_types::crc32c(zerocopy::IntoBytes::as_bytes(&check)) == h.crc.get()
            && h.format_version.get() == FORMAT_VERSION
            && h.uuid == g.uuid
            && h.objtab_pages.get() == g.objtab_pages
            && h.csumtab_pages.get() == g.csumtab_pages
            && h.pglog_slots.get() == g.pglog.slots
            && nacre_types::crc32c(table) == h.pagetab_crc.get();
        if !valid {
            tracing::warn!("checkpoint slot {slot} is damaged or torn; ignoring it");
            continue;
        }
        if best.as_ref().is_some_and(|b| b.seq >= h.seq.get()) {
            continue;
        }
        let (pages, logs) = table.split_at(8 * (g.objtab_pages + g.csumtab_pages) as usize);
        let metas: Vec<PageMeta> = pages
            .chunks_exact(8)
            .map(|c| PageMeta::read_from_bytes(c).expect("8 bytes"))
            .collect();
        let pglog: Vec<LogSlotMeta> = logs
            .chunks_exact(8)
            .map(|c| LogSlotMeta::read_from_bytes(c).expect("8 bytes"))
            .collect();
        if metas.iter().any(|m| m.copy.get() > 1)
            || pglog
                .iter()
                .any(|m| m.copy.get() > 1 || u32::from(m.pages.get()) > g.pglog.slot_pages)
        {
            tracing::warn!("checkpoint slot {slot} has an impossible page copy; ignoring it");
            continue;
        }
        let (obj, csum) = metas.split_at(g.objtab_pages as usize);
        best = Some(Checkpoint {
            seq: h.seq.get(),
            slot,
            journal_start: h.journal_start.get(),
            gen: h.gen.get(),
            lineage: h.lineage.get(),
            obj: obj.to_vec(),
            csum: csum.to_vec(),
            pglog,
        });
    }
    best.ok_or_else(|| Error::Corrupt("no valid checkpoint in either slot".into()))
}

async fn load_object_table<D: BlockDev>(
    dev: &D,
    g: &Geometry,
    metas: &[PageMeta],
    index: &mut Index,
) -> Result<()> {
    let per = OBJ_ENTRIES_PER_PAGE as usize;
    for (p, m) in metas.iter().enumerate() {
        if m.crc.get() == PAGE_NEVER_WRITTEN {
            continue;
        }
        let buf = dev
            .read_at(
                AlignedBuf::new(PAGE_BYTES as usize),
                g.objtab_page_pos(p as u32, m.copy.get()),
            )
            .await?;
        if page_crc(&buf) != m.crc.get() {
            return Err(Error::Corrupt(format!(
                "object-table page {p} (blocks {}..{})",
                p * per,
                (p + 1) * per
            )));
        }
        let start = p * per;
        let end = (start + per).min(index.blocks.len());
        let entries = <[BlockEntry]>::ref_from_prefix_with_elems(&buf[..], end - start)
            .map_err(|_| Error::Corrupt(format!("object-table page {p}")))?
            .0;
        index.blocks[start..end].copy_from_slice(entries);
    }
    // Build the hash; with a fuzzy checkpoint an object can appear twice
    // (moved after the checkpoint began): the newer version wins, and
    // replay settles the rest.
    for b in 0..index.blocks.len() as u32 {
        let e = index.blocks[b as usize];
        if e.is_free() {
            continue;
        }
        let oid = e.oid();
        match index.block_of(&oid) {
            Some(other) if index.blocks[other as usize].version.get() >= e.version.get() => {
                index.blocks[b as usize] = BlockEntry::default();
                index.mark_page_dirty(Geometry::obj_page_of(b));
            }
            Some(_) => {
                index.clear_block(&oid);
                index.blocks[b as usize] = BlockEntry::default();
                index.set_block(oid, b, e.version.get());
            }
            None => {
                index.blocks[b as usize] = BlockEntry::default();
                index.set_block(oid, b, e.version.get());
            }
        }
    }
    // Loading is not a change: only the duplicates dropped above are dirty.
    Ok(())
}

/// Loads every PG log slot the checkpoint holds.
async fn load_pg_logs<D: BlockDev>(dev: &D, g: &Geometry, metas: &[LogSlotMeta]) -> Result<PgLogs> {
    let mut logs = PgLogs::new(g.pglog, metas.to_vec());
    for (slot, m) in metas.iter().enumerate() {
        let pages = u64::from(m.pages.get());
        if pages == 0 {
            continue;
        }
        let slot = slot as u32;
        let buf = dev
            .read_at(
                AlignedBuf::new((pages * PAGE_BYTES) as usize),
                g.pglog_slot_pos(slot, u32::from(m.copy.get())),
            )
            .await?;
        if page_crc(&buf) != m.crc.get() {
            return Err(Error::Corrupt(format!("PG log slot {slot}: checksum")));
        }
        let (pg, log) = crate::pglog::decode_slot(&buf, g.pglog)
            .map_err(|why| Error::Corrupt(format!("PG log slot {slot}: {why}")))?;
        logs.load(slot, pg, log)?;
    }
    Ok(logs)
}

struct Parsed {
    pos: u64,
    total: u64,
    synced_upto: u64,
    gen: u64,
    records: Vec<Record>,
}

pub(crate) async fn open<D: BlockDev + 'static>(
    dev: D,
    opts: StoreOptions,
) -> Result<(Inner<D>, OpenReport)> {
    let g = read_superblock(&dev).await?;
    if g.device_bytes > dev.size_bytes() {
        return Err(Error::DeviceTooSmall {
            have: dev.size_bytes(),
            need: g.device_bytes,
        });
    }
    if dev.align_bytes() > g.sector_bytes {
        return Err(Error::Invalid(format!(
            "device needs {}-byte I/O but the store was formatted for {}-byte sectors",
            dev.align_bytes(),
            g.sector_bytes
        )));
    }
    if let Some(want) = opts.expect_uuid {
        if want != g.uuid {
            return Err(Error::WrongStore {
                expected: uuid_string(&want),
                found: uuid_string(&g.uuid),
            });
        }
    }
    let ck = read_checkpoint(&dev, &g).await?;
    let mut index = Index::new(&g);
    load_object_table(&dev, &g, &ck.obj, &mut index).await?;
    let pglogs = load_pg_logs(&dev, &g, &ck.pglog).await?;
    let mut report = OpenReport {
        checkpoint_seq: ck.seq,
        objects_loaded: index.object_count() as u64,
        ..OpenReport::default()
    };
    let uuid_lo = g.uuid_lo();
    // Pass 1: find the valid batches.
    let mut parsed: Vec<Parsed> = Vec::new();
    let mut pos = ck.journal_start;
    let mut gen = ck.gen;
    let max_batch = batch_bytes_max(g.block_bytes);
    let sector = g.sector_bytes;
    // Where a batch of this store failed its checks, and why.
    let mut stopped: Option<String> = None;
    while pos - ck.journal_start < g.journal_bytes {
        let phys = g.journal_offset + pos % g.journal_bytes;
        let first = dev.read_at(AlignedBuf::new(sector as usize), phys).await?;
        let id = BatchId {
            pos,
            gen,
            synced_upto: 0,
            uuid_lo,
        };
        let start = match journal::parse_start(&first, id, gen, sector, max_batch) {
            Ok(s) => s,
            Err(BatchError::End(_)) => break,
            Err(BatchError::Damaged(why)) => {
                stopped = Some(why);
                break;
            }
        };
        let lap_left = g.journal_bytes - pos % g.journal_bytes;
        if start.wrap {
            gen = start.gen;
            pos += lap_left;
            continue;
        }
        if u64::from(start.total_bytes) > lap_left {
            stopped = Some(format!("batch at {pos} crosses the end of the ring"));
            break;
        }
        let buf = dev
            .read_at(AlignedBuf::new(start.total_bytes as usize), phys)
            .await?;
        match journal::parse_batch(&buf, pos, g.block_bytes, g.nblocks) {
            Ok(records) => {
                parsed.push(Parsed {
                    pos,
                    total: u64::from(start.total_bytes),
                    synced_upto: start.synced_upto,
                    gen: start.gen,
                    records,
                });
                gen = start.gen;
                pos += u64::from(start.total_bytes);
            }
            Err(BatchError::End(why)) | Err(BatchError::Damaged(why)) => {
                stopped = Some(why);
                break;
            }
        }
    }
    // A batch that fails its checks is damage only if a later batch says
    // it was durable; else it may be a write a crash cut, which nothing
    // acknowledged (see `durable_per_later_batch`).
    if let Some(why) = stopped {
        let id = BatchId {
            pos,
            gen,
            synced_upto: 0,
            uuid_lo,
        };
        let end = ck.journal_start + g.journal_bytes;
        match durable_per_later_batch(&dev, &g, id, end).await? {
            Some(later) => {
                report.replay_stopped = Some(format!(
                "{why} (the batch at {later} says it was durable: writes it acknowledged are lost)"
            ))
            }
            None => {
                tracing::info!(
                    "journal ends at {pos}: {why}; no later batch says it was durable (a write cut by a crash)"
                );
                report.torn_tail = Some(why);
            }
        }
    }
    // Pass 2: verify the unsynced tail's data blocks, then apply.
    let synced = parsed.iter().map(|p| p.synced_upto).max().unwrap_or(0);
    let csum = CsumTable::new(&g, opts.csum_cache_bytes, ck.csum.clone());
    let mut st = State {
        index,
        alloc: Allocator::all_used(g.nblocks),
        csum,
        obj_metas: ck.obj.clone(),
        adm: Default::default(),
        // Filled in as replay finds the journal's end (below).
        journal: crate::cursor::Cursor {
            ring: g.journal_bytes,
            head: pos,
            completed: pos,
            tail: ck.journal_start,
            gen: 0,
            synced_upto: 0,
            unsynced: false,
            recorded_synced: synced,
        },
        writer: Default::default(),
        ckpt: Checkpoints {
            seq: ck.seq,
            slot: ck.slot,
            ..Default::default()
        },
        lineage: ck.lineage,
        overlay_cache_max: opts.overlay_cache_bytes,
        failed: None,
        closing: false,
        pglogs,
        undos: Default::default(),
        stats: Stats::default(),
    };
    let mut max_gen = ck.gen;
    for p in &parsed {
        if p.pos >= synced {
            if let Some(why) = verify_big_blocks(&dev, &g, &p.records).await? {
                tracing::info!(
                    "journal ends at batch {}: {why} (a write in flight at a crash)",
                    p.pos
                );
                report.torn_tail = Some(format!("batch at {}: {why}", p.pos));
                st.journal.head = p.pos;
                break;
            }
        }
        for r in &p.records {
            apply_record(&mut st, r, None, true);
        }
        max_gen = max_gen.max(p.gen);
        report.batches_replayed += 1;
        report.records_replayed += p.records.len() as u64;
        report.journal_bytes_replayed += p.total;
    }
    if let Some(why) = &report.replay_stopped {
        tracing::warn!("journal replay stopped early: {why}");
        // Acknowledged writes after the damage are lost: a new lineage
        // (Store::lineage), recorded by the next checkpoint.
        st.lineage = (st.lineage.checked_add(1))
            .ok_or_else(|| Error::Corrupt("the store's lineage is at its end".into()))?;
    }
    {
        let State { undos, index, .. } = &mut st;
        undos.settle(index);
    }
    for b in 0..g.nblocks {
        if st.index.blocks[b as usize].is_free() {
            st.alloc.mark_free(b);
        }
    }
    st.journal.completed = st.journal.head;
    st.journal.synced_upto = st.journal.head;
    st.journal.gen = max_gen + 1;
    st.journal.check();
    // What replay applied must be durable before new writes rely on it.
    dev.sync().await?;
    let inner = Inner {
        dev,
        g,
        opts,
        st: RefCell::new(st),
        journal_kick: Notify::new(),
        written_kick: Notify::new(),
        ckpt_kick: Notify::new(),
        ckpt_done: Notify::new(),
        applied: Notify::new(),
        flush_done: Notify::new(),
        epoch: Cell::new(0),
    };
    Ok((inner, report))
}

/// The position of a valid batch after the one at `at.pos` (which failed
/// its checks) whose `synced_upto` passes `at.pos`: that batch was written
/// once the failed one was durable, so the failure is damage to writes
/// that may have been acknowledged. Without one, the failed batch may be
/// the last one written before a crash, cut short, and never acknowledged
/// (its writers wait for an fsync after it, and every batch written after
/// that fsync records it). Damage to the very last batch with nothing
/// written after it looks the same, and is taken as such a cut. Scans
/// every sector of the journal after `at.pos` up to `end` (where replay
/// would stop anyway), for batches of generation `at.gen` or later.
async fn durable_per_later_batch<D: BlockDev>(
    dev: &D,
    g: &Geometry,
    at: BatchId,
    end: u64,
) -> Result<Option<u64>> {
    const CHUNK: u64 = 1 << 20;
    let sector = u64::from(g.sector_bytes);
    let max_batch = batch_bytes_max(g.block_bytes);
    let mut pos = at.pos + sector;
    while pos < end {
        let phys = pos % g.journal_bytes;
        let n = CHUNK.min(g.journal_bytes - phys).min(end - pos);
        let buf = (dev.read_at(AlignedBuf::new(n as usize), g.journal_offset + phys)).await?;
        for k in (0..n).step_by(sector as usize) {
            let p = pos + k;
            let id = BatchId { pos: p, ..at };
            let first = &buf[k as usize..(k + sector) as usize];
            let Ok(s) = journal::parse_start(first, id, at.gen, g.sector_bytes, max_batch) else {
                continue;
            };
            let total = u64::from(s.total_bytes);
            if s.wrap || s.synced_upto <= at.pos || total > g.journal_bytes - p % g.journal_bytes {
                continue;
            }
            let whole = dev
                .read_at(
                    AlignedBuf::new(total as usize),
                    g.journal_offset + p % g.journal_bytes,
                )
                .await?;
            if journal::parse_batch(&whole, p, g.block_bytes, g.nblocks).is_ok() {
                return Ok(Some(p));
            }
        }
        pos += n;
    }
    Ok(None)
}

/// For full-block records whose fsync may not have happened: does each data
/// block hold what its record says? Returns why not, if not.
async fn verify_big_blocks<D: BlockDev>(
    dev: &D,
    g: &Geometry,
    records: &[Record],
) -> Result<Option<String>> {
    for r in records.iter().filter(|r| r.kind == RecordKind::Big) {
        let buf = dev
            .read_at(
                AlignedBuf::new(g.block_bytes as usize),
                g.block_offset(r.block),
            )
            .await?;
        if journal::chunk_csums(&buf) != r.csums {
            return Ok(Some(format!(
                "data block {} of {} was not completely written",
                r.block, r.oid
            )));
        }
    }
    Ok(None)
}
