//! On-disk formats: superblock, checkpoint slots, paged tables, journal
//! batches. All little-endian, fixed-size `#[repr(C)]` records checked by
//! crc32c; layouts are documented in docs/internals/blockstore.md and pinned
//! by the golden tests below.
//!
//! Device layout (offsets in bytes, all multiples of 4 KiB):
//!
//! ```text
//! 0       superblock            (4 KiB)
//! 4096    superblock backup     (4 KiB)
//! 8192    checkpoint slot 0     (header + page table)
//!         checkpoint slot 1
//!         object table          (2 shadow copies of every page)
//!         checksum table        (2 shadow copies of every page)
//!         PG log region         (2 shadow copies of every slot)
//!         journal ring
//!         data blocks           (aligned to min(block size, 1 MiB))
//! ```

use nacre_types::{ObjectId, BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, CSUM_CHUNK_BYTES};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::{Error, Result};

pub const FORMAT_VERSION: u32 = 2;
pub const SB_MAGIC: [u8; 8] = *b"NACREBS\0";
pub const CKPT_MAGIC: [u8; 8] = *b"NACRECKP";
pub const BATCH_MAGIC: u32 = 0x4e4a_524e; // "NRJN"
pub const PGLOG_MAGIC: [u8; 8] = *b"NACREPGL";
pub const PAGE_BYTES: u64 = 4096;
/// Where the owner's label sits in the superblock page, after the
/// superblock: magic, length, crc (of the store's uuid, the length and the
/// bytes), then the bytes.
pub const LABEL_OFFSET: usize = 2048;
pub const LABEL_MAGIC: [u8; 8] = *b"NACRELBL";
const LABEL_HEADER_BYTES: usize = 16;
pub const LABEL_BYTES_MAX: usize = PAGE_BYTES as usize - LABEL_OFFSET - LABEL_HEADER_BYTES;
/// Object-table entries per 4 KiB page (170 × 24 = 4080; 16 bytes unused).
pub const OBJ_ENTRIES_PER_PAGE: u32 = 170;
/// Checksums per 4 KiB page of the checksum table.
pub const CSUMS_PER_PAGE: u32 = 1024;
/// A page-table crc of 0 means "never written: the page is all zeros";
/// real crcs of 0 are stored as 1 (see [`page_crc`]).
pub const PAGE_NEVER_WRITTEN: u32 = 0;

/// Smallest journal that still fits a few full batches.
pub const JOURNAL_BYTES_MIN: u64 = 2 << 20;
pub const JOURNAL_BYTES_MAX: u64 = 16 << 30;
/// Fewest data blocks a store may have.
pub const DATA_BLOCKS_MIN: u64 = 16;

/// crc32c of a table page as kept in the page table (never 0).
pub fn page_crc(page: &[u8]) -> u32 {
    nacre_types::crc32c(page).max(1)
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct Superblock {
    pub magic: [u8; 8],
    pub format_version: U32,
    pub sb_bytes: U32,
    pub uuid: [u8; 16],
    pub block_bytes: U32,
    pub sector_bytes: U32,
    pub device_bytes: U64,
    pub nblocks: U64,
    pub slot_offset: U64,
    pub slot_bytes: U64,
    pub objtab_offset: U64,
    pub objtab_pages: U32,
    pub csumtab_pages: U32,
    pub csumtab_offset: U64,
    pub journal_offset: U64,
    pub journal_bytes: U64,
    pub data_offset: U64,
    pub pglog_offset: U64,
    pub pglog_slots: U32,
    pub pglog_slot_pages: U32,
    pub crc: U32,
    pub pad: U32,
}
const _: () = assert!(std::mem::size_of::<Superblock>() == 144);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct CheckpointHeader {
    pub magic: [u8; 8],
    pub format_version: U32,
    pub hdr_bytes: U32,
    pub uuid: [u8; 16],
    /// Checkpoint number; the valid slot with the higher one is current.
    pub seq: U64,
    /// Logical journal position where replay starts.
    pub journal_start: U64,
    /// Journal generation current when the checkpoint was taken.
    pub gen: U64,
    pub objtab_pages: U32,
    pub csumtab_pages: U32,
    pub pglog_slots: U32,
    pub pagetab_crc: U32,
    pub crc: U32,
    /// The store's lineage ([`crate::Store::lineage`]): 0 from format,
    /// raised each time the store lost writes it had acknowledged.
    pub lineage: U32,
}
const _: () = assert!(std::mem::size_of::<CheckpointHeader>() == 80);

/// Where the current copy of one table page is, and its crc.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct PageMeta {
    pub crc: U32,
    pub copy: U32,
}
const _: () = assert!(std::mem::size_of::<PageMeta>() == 8);

/// One object-table entry: which object owns a data block, at which version.
/// `version == 0` marks a free block.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct BlockEntry {
    pub volume: U64,
    pub obj_block: U64,
    pub version: U64,
}
const _: () = assert!(std::mem::size_of::<BlockEntry>() == 24);

impl BlockEntry {
    pub fn new(oid: ObjectId, version: u64) -> Self {
        BlockEntry {
            volume: U64::new(oid.volume.0),
            obj_block: U64::new(oid.block),
            version: U64::new(version),
        }
    }
    pub fn oid(&self) -> ObjectId {
        ObjectId::new(self.volume.get(), self.obj_block.get())
    }
    pub fn is_free(&self) -> bool {
        self.version.get() == 0
    }
}

pub const BATCH_FLAG_WRAP: u16 = 1;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct BatchHeader {
    pub magic: U32,
    pub version: U16,
    pub flags: U16,
    /// Bytes of header + record headers, a multiple of the sector size.
    pub hdr_bytes: U32,
    /// Bytes of the whole batch including data.
    pub total_bytes: U32,
    pub nrec: U32,
    /// crc32c of the first `hdr_bytes` bytes with this field zeroed.
    pub crc: U32,
    /// Logical journal position of this batch (guards against stale laps).
    pub pos: U64,
    /// Journal generation: raised at every open, never lower than the
    /// batch before (guards against batches left from before a restart).
    pub gen: U64,
    /// Every write before this logical position was durable when this batch
    /// was written; data blocks of later full-block writes are verified at
    /// replay.
    pub synced_upto: U64,
    pub uuid_lo: U64,
}
const _: () = assert!(std::mem::size_of::<BatchHeader>() == 56);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RecordKind {
    /// Data inside the batch, to be folded into the object's block later.
    Small = 1,
    /// A whole block written to a fresh data block (`location`).
    Big = 2,
    Delete = 3,
    /// The checkpointer is about to fold the object's overlays up to
    /// `version` into block `location`; the checksum list holds
    /// (chunk index, new crc32c) pairs of the chunks that change.
    Fold = 4,
    /// A PG log entry alone (no data): a tombstone for an object this copy
    /// lacks, or history adopted from another copy.
    Log = 5,
    /// Drops the entries of PG `volume` newer than `version`.
    PgRewind = 6,
    /// Drops the whole log of PG `volume`.
    PgRemove = 7,
    /// Drops the one entry of PG `volume` at `version`: an op that peering
    /// undid (its write never reached the authoritative copy).
    PgForget = 8,
    /// Sets (`version` 1) or clears (0) PG `volume`'s *recovering* mark
    /// ([`crate::PgLog::recovering`]).
    PgMark = 9,
    /// Drops PG `volume`'s entries at or below `version` and raises its
    /// tail to it (durably, unlike a trim).
    PgTail = 10,
    /// What the object held before the write at `version` (the record that
    /// follows it in the journal, or, re-logged by a checkpoint, one
    /// already applied): its bytes at `offset..offset + len`, in the batch
    /// like a `Small` record's, or (`len` 0) that it did not exist. Kept
    /// until the OSD releases it, so a write can be rolled back
    /// ([`crate::Undo`]).
    Undo = 11,
    /// The undo of the object's write at `version` or older was released
    /// ([`crate::Store::release_undo`]): written lazily, with the next
    /// batch, so a crash may still bring a released undo back.
    Release = 12,
    /// The undo of the write at `version` is the object's whole block as
    /// it was: the `Big` record that follows keeps it, under the object's
    /// hidden name, instead of freeing it (re-logged by a checkpoint: the
    /// object at `version` holds that undo). No bytes: they stay in the
    /// kept block ([`crate::undo`], *whole blocks*).
    UndoBlock = 13,
}

impl RecordKind {
    /// A client op on an object, admitted (and counted in flight) per
    /// object; the other kinds are the checkpointer's or change only a
    /// PG log.
    pub fn is_object_op(self) -> bool {
        matches!(
            self,
            RecordKind::Small | RecordKind::Big | RecordKind::Delete
        )
    }

    /// A record whose bytes are in the batch (after the header region).
    pub fn has_data(self) -> bool {
        matches!(self, RecordKind::Small | RecordKind::Undo)
    }

    /// A record that changes a PG log and nothing else, with no entry of
    /// its own.
    pub fn is_pg_op(self) -> bool {
        matches!(
            self,
            RecordKind::PgRewind
                | RecordKind::PgRemove
                | RecordKind::PgForget
                | RecordKind::PgMark
                | RecordKind::PgTail
        )
    }

    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(RecordKind::Small),
            2 => Some(RecordKind::Big),
            3 => Some(RecordKind::Delete),
            4 => Some(RecordKind::Fold),
            5 => Some(RecordKind::Log),
            6 => Some(RecordKind::PgRewind),
            7 => Some(RecordKind::PgRemove),
            8 => Some(RecordKind::PgForget),
            9 => Some(RecordKind::PgMark),
            10 => Some(RecordKind::PgTail),
            11 => Some(RecordKind::Undo),
            12 => Some(RecordKind::Release),
            13 => Some(RecordKind::UndoBlock),
            _ => None,
        }
    }
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct RecordHeader {
    pub kind: U32,
    pub len: U32,
    pub volume: U64,
    pub obj_block: U64,
    pub version: U64,
    pub offset: U32,
    /// Small: offset of the data from the batch start. Big: data block number.
    pub location: U32,
    /// Number of crc32c values that follow this header (after the log
    /// entry, if there is one).
    pub ncsum: U32,
    /// `REC_FLAG_LOGGED`: a [`LogEntryDisk`] follows this header.
    pub flags: U32,
}
const _: () = assert!(std::mem::size_of::<RecordHeader>() == 48);

pub const REC_FLAG_LOGGED: u32 = 1;

/// One PG log entry as stored, in a journal record and in a log slot.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct LogEntryDisk {
    pub pg: U64,
    pub version: U64,
    pub volume: U64,
    pub obj_block: U64,
    pub client: U64,
    pub request: U64,
    pub offset: U32,
    pub len: U32,
    pub op: U32,
    pub pad: U32,
}
const _: () = assert!(std::mem::size_of::<LogEntryDisk>() == 64);

/// The head of a PG log slot; the entries follow it, sorted by version.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug)]
#[repr(C)]
pub struct LogSlotHeader {
    pub magic: [u8; 8],
    pub pg: U64,
    /// Versions at or below this were trimmed.
    pub tail: U64,
    pub count: U32,
    /// Bit 0: the log is marked recovering ([`crate::PgLog::recovering`]).
    pub flags: U32,
    /// Kept for per-PG state of the OSD (zero today).
    pub reserved: [u8; 96],
}
const _: () = assert!(std::mem::size_of::<LogSlotHeader>() == 128);

/// Where the current copy of one PG log slot is: its crc (of the pages
/// written), which copy, and how many pages (0: the slot is free).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct LogSlotMeta {
    pub crc: U32,
    pub copy: U16,
    pub pages: U16,
}
const _: () = assert!(std::mem::size_of::<LogSlotMeta>() == 8);

/// The PG log region's shape, fixed at format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRegion {
    /// PG logs the store can hold (one slot each).
    pub slots: u32,
    /// 4 KiB pages per slot: the longest log a slot holds is
    /// `(pages × 4096 − 128) / 64` entries.
    pub slot_pages: u32,
}

impl LogRegion {
    /// 256 PGs of 510 entries each: 16 MiB with both copies.
    pub const DEFAULT: LogRegion = LogRegion {
        slots: 256,
        slot_pages: 8,
    };
    pub const SLOTS_MAX: u32 = 65_536;
    pub const SLOT_PAGES_MAX: u32 = 64;

    /// Entries one slot holds.
    pub fn entries_per_slot(&self) -> usize {
        (self.slot_pages as usize * PAGE_BYTES as usize - std::mem::size_of::<LogSlotHeader>())
            / std::mem::size_of::<LogEntryDisk>()
    }
}

/// The store's geometry, derived from the superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub uuid: [u8; 16],
    pub block_bytes: u32,
    pub sector_bytes: u32,
    pub device_bytes: u64,
    pub nblocks: u32,
    pub slot_offset: u64,
    pub slot_bytes: u64,
    pub objtab_offset: u64,
    pub objtab_pages: u32,
    pub csumtab_offset: u64,
    pub csumtab_pages: u32,
    pub journal_offset: u64,
    pub journal_bytes: u64,
    pub data_offset: u64,
    pub pglog_offset: u64,
    pub pglog: LogRegion,
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl Geometry {
    /// The store id's first 8 bytes, stamped on every journal batch.
    pub fn uuid_lo(&self) -> u64 {
        u64::from_le_bytes(self.uuid[..8].try_into().expect("uuid has 16 bytes"))
    }

    /// Checksums per data block.
    pub fn csums_per_block(&self) -> u32 {
        self.block_bytes / CSUM_CHUNK_BYTES
    }

    pub fn block_offset(&self, block: u32) -> u64 {
        self.data_offset + u64::from(block) * u64::from(self.block_bytes)
    }

    pub fn slot_pos(&self, slot: u32) -> u64 {
        self.slot_offset + u64::from(slot) * self.slot_bytes
    }

    /// Device offset of copy `copy` of object-table page `page`.
    pub fn objtab_page_pos(&self, page: u32, copy: u32) -> u64 {
        self.objtab_offset
            + (u64::from(copy) * u64::from(self.objtab_pages) + u64::from(page)) * PAGE_BYTES
    }

    pub fn csumtab_page_pos(&self, page: u32, copy: u32) -> u64 {
        self.csumtab_offset
            + (u64::from(copy) * u64::from(self.csumtab_pages) + u64::from(page)) * PAGE_BYTES
    }

    /// The checksum page holding block `block`'s checksums, and the index of
    /// its first checksum inside that page.
    pub fn csum_page_of(&self, block: u32) -> (u32, usize) {
        let blocks_per_page = CSUMS_PER_PAGE / self.csums_per_block();
        (
            block / blocks_per_page,
            ((block % blocks_per_page) * self.csums_per_block()) as usize,
        )
    }

    /// Device offset of copy `copy` of PG log slot `slot`.
    pub fn pglog_slot_pos(&self, slot: u32, copy: u32) -> u64 {
        let pages = u64::from(self.pglog.slot_pages);
        self.pglog_offset
            + (u64::from(copy) * u64::from(self.pglog.slots) + u64::from(slot)) * pages * PAGE_BYTES
    }

    pub fn obj_page_of(block: u32) -> u32 {
        block / OBJ_ENTRIES_PER_PAGE
    }

    /// Lays out a store of `block_bytes` blocks on a device of `device_bytes`.
    pub fn plan(
        uuid: [u8; 16],
        device_bytes: u64,
        block_bytes: u32,
        sector_bytes: u32,
        journal_bytes: Option<u64>,
        pglog: LogRegion,
    ) -> Result<Geometry> {
        if !(1..=LogRegion::SLOTS_MAX).contains(&pglog.slots)
            || !(1..=LogRegion::SLOT_PAGES_MAX).contains(&pglog.slot_pages)
        {
            return Err(Error::Invalid(format!(
                "PG log region of {} slots of {} pages: slots must be 1..={}, pages 1..={}",
                pglog.slots,
                pglog.slot_pages,
                LogRegion::SLOTS_MAX,
                LogRegion::SLOT_PAGES_MAX
            )));
        }
        if !block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
        {
            return Err(Error::Invalid(format!(
                "block size {block_bytes} must be a power of two from {BLOCK_BYTES_MIN} to {BLOCK_BYTES_MAX}"
            )));
        }
        if !sector_bytes.is_power_of_two() || !(512..=4096).contains(&sector_bytes) {
            return Err(Error::Invalid(format!(
                "device sector size {sector_bytes} is not 512..4096"
            )));
        }
        let journal_min = JOURNAL_BYTES_MIN.max(4 * batch_bytes_max(block_bytes));
        let journal = match journal_bytes {
            Some(j) => {
                if !(journal_min..=JOURNAL_BYTES_MAX).contains(&j) {
                    return Err(Error::Invalid(format!(
                        "journal size {j} must be from {journal_min} to {JOURNAL_BYTES_MAX} bytes"
                    )));
                }
                round_up(j, PAGE_BYTES)
            }
            // 1/64 of the device, at least 64 MiB, at most 1 GiB: big enough
            // to absorb bursts, small enough that replay stays short; on
            // small devices at most a quarter of the device.
            None => round_up(
                (device_bytes / 64)
                    .clamp(64 << 20, 1 << 30)
                    .min(device_bytes / 4),
                1 << 20,
            )
            .max(journal_min),
        };
        let layout = |nblocks: u64| -> Geometry {
            let spb = u64::from(block_bytes / CSUM_CHUNK_BYTES);
            let objtab_pages = nblocks.div_ceil(u64::from(OBJ_ENTRIES_PER_PAGE)).max(1);
            let csumtab_pages = (nblocks * spb).div_ceil(u64::from(CSUMS_PER_PAGE)).max(1);
            let slots = u64::from(pglog.slots);
            let slot_bytes =
                PAGE_BYTES + round_up((objtab_pages + csumtab_pages + slots) * 8, PAGE_BYTES);
            let slot_offset = 2 * PAGE_BYTES;
            let objtab_offset = slot_offset + 2 * slot_bytes;
            let csumtab_offset = objtab_offset + 2 * objtab_pages * PAGE_BYTES;
            let pglog_offset = csumtab_offset + 2 * csumtab_pages * PAGE_BYTES;
            let journal_offset =
                pglog_offset + 2 * slots * u64::from(pglog.slot_pages) * PAGE_BYTES;
            let data_offset = round_up(
                journal_offset + journal,
                u64::from(block_bytes).min(1 << 20),
            );
            Geometry {
                uuid,
                block_bytes,
                sector_bytes,
                device_bytes,
                nblocks: nblocks as u32,
                slot_offset,
                slot_bytes,
                objtab_offset,
                objtab_pages: objtab_pages as u32,
                csumtab_offset,
                csumtab_pages: csumtab_pages as u32,
                journal_offset,
                journal_bytes: journal,
                data_offset,
                pglog_offset,
                pglog,
            }
        };
        let fixed = layout(DATA_BLOCKS_MIN);
        let need = fixed.data_offset + DATA_BLOCKS_MIN * u64::from(block_bytes);
        if device_bytes < need {
            return Err(Error::DeviceTooSmall {
                have: device_bytes,
                need,
            });
        }
        let mut n = ((device_bytes - fixed.data_offset) / u64::from(block_bytes))
            .min(u64::from(u32::MAX - 1));
        loop {
            let g = layout(n);
            if g.data_offset + n * u64::from(block_bytes) <= device_bytes {
                return Ok(g);
            }
            // Tables grew with n; shrink by what the overshoot costs.
            let over = g.data_offset + n * u64::from(block_bytes) - device_bytes;
            n -= over.div_ceil(u64::from(block_bytes)).max(1);
        }
    }

    pub fn to_superblock(&self) -> Superblock {
        let mut sb = Superblock {
            magic: SB_MAGIC,
            format_version: U32::new(FORMAT_VERSION),
            sb_bytes: U32::new(std::mem::size_of::<Superblock>() as u32),
            uuid: self.uuid,
            block_bytes: U32::new(self.block_bytes),
            sector_bytes: U32::new(self.sector_bytes),
            device_bytes: U64::new(self.device_bytes),
            nblocks: U64::new(u64::from(self.nblocks)),
            slot_offset: U64::new(self.slot_offset),
            slot_bytes: U64::new(self.slot_bytes),
            objtab_offset: U64::new(self.objtab_offset),
            objtab_pages: U32::new(self.objtab_pages),
            csumtab_pages: U32::new(self.csumtab_pages),
            csumtab_offset: U64::new(self.csumtab_offset),
            journal_offset: U64::new(self.journal_offset),
            journal_bytes: U64::new(self.journal_bytes),
            data_offset: U64::new(self.data_offset),
            pglog_offset: U64::new(self.pglog_offset),
            pglog_slots: U32::new(self.pglog.slots),
            pglog_slot_pages: U32::new(self.pglog.slot_pages),
            crc: U32::new(0),
            pad: U32::new(0),
        };
        sb.crc = U32::new(nacre_types::crc32c(sb.as_bytes()));
        sb
    }

    /// Parses and checks a superblock read from disk.
    pub fn from_superblock(bytes: &[u8]) -> Result<Geometry> {
        let (sb, _) = Superblock::read_from_prefix(bytes)
            .map_err(|_| Error::NotAStore("superblock shorter than its header".into()))?;
        if sb.magic != SB_MAGIC {
            return Err(Error::NotAStore("no Nacre superblock magic".into()));
        }
        // Format 1 had a 128-byte superblock (crc at 120): a store of that
        // format is named as such, not called damaged.
        if sb.format_version.get() == 1 && bytes.len() >= 128 {
            let mut v1 = bytes[..128].to_vec();
            let crc = u32::from_le_bytes(v1[120..124].try_into().expect("4 bytes"));
            v1[120..124].fill(0);
            if nacre_types::crc32c(&v1) == crc {
                return Err(Error::UnsupportedVersion {
                    found: 1,
                    supported: FORMAT_VERSION,
                });
            }
        }
        let mut check = sb;
        check.crc = U32::new(0);
        if nacre_types::crc32c(check.as_bytes()) != sb.crc.get() {
            return Err(Error::Corrupt("superblock checksum".into()));
        }
        if sb.format_version.get() != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                found: sb.format_version.get(),
                supported: FORMAT_VERSION,
            });
        }
        let g = Geometry::plan(
            sb.uuid,
            sb.device_bytes.get(),
            sb.block_bytes.get(),
            sb.sector_bytes.get(),
            Some(sb.journal_bytes.get()),
            LogRegion {
                slots: sb.pglog_slots.get(),
                slot_pages: sb.pglog_slot_pages.get(),
            },
        )
        .map_err(|e| Error::Corrupt(format!("superblock geometry: {e}")))?;
        // The stored layout must be exactly what this build computes from
        // the stored parameters: a crafted or damaged superblock cannot point
        // tables outside the device or on top of each other.
        if g.to_superblock().as_bytes() != sb.as_bytes() {
            return Err(Error::Corrupt(
                "superblock geometry does not match its parameters".into(),
            ));
        }
        Ok(g)
    }
}

/// Writes `label` into the superblock page `page` of store `uuid`.
pub fn put_label(page: &mut [u8], uuid: &[u8; 16], label: &[u8]) -> Result<()> {
    if label.len() > LABEL_BYTES_MAX {
        return Err(Error::Invalid(format!(
            "a label of {} bytes; at most {LABEL_BYTES_MAX}",
            label.len()
        )));
    }
    let at = LABEL_OFFSET;
    let len = (label.len() as u32).to_le_bytes();
    page[at..at + 8].copy_from_slice(&LABEL_MAGIC);
    page[at + 8..at + 12].copy_from_slice(&len);
    page[at + 12..at + 16].copy_from_slice(&label_crc(uuid, &len, label).to_le_bytes());
    page[at + 16..at + 16 + label.len()].copy_from_slice(label);
    Ok(())
}

fn label_crc(uuid: &[u8; 16], len: &[u8; 4], label: &[u8]) -> u32 {
    let mut b = Vec::with_capacity(20 + label.len());
    b.extend_from_slice(uuid);
    b.extend_from_slice(len);
    b.extend_from_slice(label);
    nacre_types::crc32c(&b)
}

/// The label in superblock page `page` of store `uuid`: `None` if the
/// store was formatted without one; an error if it is damaged.
pub fn get_label(page: &[u8], uuid: &[u8; 16]) -> Result<Option<Vec<u8>>> {
    let at = LABEL_OFFSET;
    let h = &page[at..at + LABEL_HEADER_BYTES];
    if h.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    if h[..8] != LABEL_MAGIC {
        return Err(Error::Corrupt("label: no label magic".into()));
    }
    let len: [u8; 4] = h[8..12].try_into().expect("4 bytes");
    let n = u32::from_le_bytes(len) as usize;
    if n > LABEL_BYTES_MAX {
        return Err(Error::Corrupt(format!("label: length {n}")));
    }
    let label = &page[at + LABEL_HEADER_BYTES..at + LABEL_HEADER_BYTES + n];
    let crc = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
    if label_crc(uuid, &len, label) != crc {
        return Err(Error::Corrupt("label checksum".into()));
    }
    Ok(Some(label.to_vec()))
}

/// Record-header region of one batch, at most.
pub const BATCH_HDR_BYTES_MAX: u64 = 64 << 10;
/// Small-write data in one batch, at most (unless one write is bigger):
/// 128 queued 4 KiB writes fit in one batch.
pub const BATCH_DATA_BYTES_MAX: u64 = 512 << 10;

/// Largest batch (header region + data) for a store of `block_bytes` blocks.
pub fn batch_bytes_max(block_bytes: u32) -> u64 {
    u64::from(block_bytes).max(BATCH_DATA_BYTES_MAX) + BATCH_HDR_BYTES_MAX
}

/// Records per journal batch, at most.
pub const RECORDS_PER_BATCH_MAX: u32 = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_reads_back_and_damage_or_another_store_is_caught() {
        let mut page = vec![0u8; PAGE_BYTES as usize];
        assert_eq!(get_label(&page, &[1; 16]).unwrap(), None);
        put_label(&mut page, &[1; 16], b"{\"osd\":3}").unwrap();
        assert_eq!(
            get_label(&page, &[1; 16]).unwrap().as_deref(),
            Some(&b"{\"osd\":3}"[..])
        );
        // The label names its store: copied beside another, it is refused.
        assert!(get_label(&page, &[2; 16]).is_err());
        for at in [LABEL_OFFSET, LABEL_OFFSET + 9, LABEL_OFFSET + 17] {
            let mut bad = page.clone();
            bad[at] ^= 1;
            assert!(get_label(&bad, &[1; 16]).is_err(), "flip at {at}");
        }
        let mut big = page.clone();
        big[LABEL_OFFSET + 8..LABEL_OFFSET + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(get_label(&big, &[1; 16]).is_err());
        assert!(put_label(&mut page, &[1; 16], &vec![0; LABEL_BYTES_MAX + 1]).is_err());
        put_label(&mut page, &[1; 16], &vec![7; LABEL_BYTES_MAX]).unwrap();
        assert_eq!(
            get_label(&page, &[1; 16]).unwrap().unwrap().len(),
            LABEL_BYTES_MAX
        );
    }

    #[test]
    fn golden_superblock_bytes() {
        let g = Geometry::plan(
            [7; 16],
            1 << 30,
            128 << 10,
            512,
            Some(16 << 20),
            LogRegion::DEFAULT,
        )
        .unwrap();
        let sb = g.to_superblock();
        let b = sb.as_bytes();
        assert_eq!(&b[..8], b"NACREBS\0");
        assert_eq!(&b[8..12], &2u32.to_le_bytes());
        assert_eq!(&b[32..36], &(128u32 << 10).to_le_bytes());
        assert_eq!(Geometry::from_superblock(b).unwrap(), g);
        // Any flipped bit is caught.
        let mut bad = b.to_vec();
        bad[40] ^= 1;
        assert!(matches!(
            Geometry::from_superblock(&bad),
            Err(Error::Corrupt(_))
        ));
        // A format-1 superblock (128 bytes, crc at 120) is named.
        let mut v1 = b[..128].to_vec();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        v1[120..128].fill(0);
        let crc = nacre_types::crc32c(&v1);
        v1[120..124].copy_from_slice(&crc.to_le_bytes());
        v1.resize(4096, 0); // as read: a whole page
        assert!(matches!(
            Geometry::from_superblock(&v1),
            Err(Error::UnsupportedVersion { found: 1, .. })
        ));
        let mut other = b.to_vec();
        other[..8].copy_from_slice(b"XFSB\0\0\0\0");
        assert!(matches!(
            Geometry::from_superblock(&other),
            Err(Error::NotAStore(_))
        ));
    }

    #[test]
    fn layouts_fit_and_do_not_overlap() {
        for (dev, bs) in [
            (64u64 << 20, 4096u32),
            (1 << 30, 128 << 10),
            (4 << 30, 4 << 20),
            (100 << 20, 1 << 20),
        ] {
            let g = Geometry::plan([0; 16], dev, bs, 512, None, LogRegion::DEFAULT).unwrap();
            assert!(g.objtab_offset >= g.slot_pos(1) + g.slot_bytes);
            assert!(g.csumtab_offset >= g.objtab_page_pos(g.objtab_pages - 1, 1) + PAGE_BYTES);
            assert!(g.pglog_offset >= g.csumtab_page_pos(g.csumtab_pages - 1, 1) + PAGE_BYTES);
            assert!(
                g.journal_offset
                    >= g.pglog_slot_pos(g.pglog.slots - 1, 1)
                        + u64::from(g.pglog.slot_pages) * PAGE_BYTES
            );
            assert!(g.data_offset >= g.journal_offset + g.journal_bytes);
            assert!(g.block_offset(g.nblocks) <= dev);
            assert!(
                u64::from(g.objtab_pages) * u64::from(OBJ_ENTRIES_PER_PAGE) >= u64::from(g.nblocks)
            );
            let (last_page, idx) = g.csum_page_of(g.nblocks - 1);
            assert!(last_page < g.csumtab_pages);
            assert!(idx + g.csums_per_block() as usize <= CSUMS_PER_PAGE as usize);
        }
    }

    #[test]
    fn small_devices_and_bad_sizes_are_refused() {
        assert!(matches!(
            Geometry::plan([0; 16], 1 << 20, 128 << 10, 512, None, LogRegion::DEFAULT),
            Err(Error::DeviceTooSmall { .. })
        ));
        assert!(matches!(
            Geometry::plan([0; 16], 1 << 30, 3000, 512, None, LogRegion::DEFAULT),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            Geometry::plan([0; 16], 1 << 30, 8 << 20, 512, None, LogRegion::DEFAULT),
            Err(Error::Invalid(_))
        ));
    }
}

#[cfg(test)]
mod robustness {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn damaged_superblocks_are_refused(at in 0usize..144, x in 1u8..=255) {
            let g = Geometry::plan([9; 16], 1 << 30, 128 << 10, 512, None, LogRegion::DEFAULT).unwrap();
            let mut b = g.to_superblock().as_bytes().to_vec();
            b[at] ^= x;
            prop_assert!(Geometry::from_superblock(&b).is_err());
        }

        #[test]
        fn random_superblocks_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = Geometry::from_superblock(&bytes);
        }
    }
}
