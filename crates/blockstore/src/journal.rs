//! The journal ring: batches of records, their encoding and their checks.
//!
//! A batch is one contiguous write: a header region (batch header, record
//! headers with their crc32c lists, padded to the sector) followed by the
//! data of its small writes, each padded to the sector. Positions are
//! logical (they only grow); a batch never straddles the ring's end — the
//! writer leaves a one-sector wrap marker and starts the next lap instead.
//!
//! A batch is valid only if its header crc, magic, store id, logical
//! position and generation all match what replay expects at that point, and
//! every small write's data matches its crc32c list. Replay applies whole
//! batches and stops at the first one that is not valid: a torn or damaged
//! batch ends the journal, and nothing after it is trusted.

use nacre_io::AlignedBuf;
use nacre_types::{ObjectId, CSUM_CHUNK_BYTES, SECTOR_BYTES};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::format::{
    BatchHeader, LogEntryDisk, RecordHeader, RecordKind, BATCH_FLAG_WRAP, BATCH_MAGIC,
    FORMAT_VERSION, RECORDS_PER_BATCH_MAX, REC_FLAG_LOGGED,
};
use crate::pglog::{LogEntry, LogOp};

/// The batch bounds (defined in `format`, which sizes the journal by
/// them), under the path they first had.
pub use crate::format::{batch_bytes_max, BATCH_DATA_BYTES_MAX, BATCH_HDR_BYTES_MAX};

const HDR_BYTES: usize = std::mem::size_of::<BatchHeader>();
const REC_BYTES: usize = std::mem::size_of::<RecordHeader>();
const ENTRY_BYTES: usize = std::mem::size_of::<LogEntryDisk>();

/// crc32c of every 4 KiB chunk of `data` (the last may be shorter).
pub fn chunk_csums(data: &[u8]) -> Vec<u32> {
    data.chunks(CSUM_CHUNK_BYTES as usize)
        .map(nacre_types::crc32c)
        .collect()
}

/// One journal record as the writer and replay see it.
#[derive(Debug)]
pub struct Record {
    pub kind: RecordKind,
    pub oid: ObjectId,
    pub version: u64,
    /// Byte offset inside the object (Small, Undo), 0 otherwise.
    pub offset: u32,
    /// Data bytes (Small, Undo), block bytes (Big), 0 (Delete).
    pub len: u32,
    /// Big: the data block holding the new content.
    pub block: u32,
    /// Small, Undo: crc32c per 4 KiB of the data; Big: the block's
    /// checksums; Fold: (chunk index, new crc32c) pairs.
    pub csums: Vec<u32>,
    /// Small, Undo: logical journal position of the data (set when encoded
    /// or parsed); an Undo without data: its batch's.
    pub data_pos: u64,
    /// The PG log entry of a Small, Big, Delete or Log record (for
    /// the kinds that change only a PG log, the PG is `oid.volume` and
    /// the version the record's).
    pub entry: Option<LogEntry>,
}

impl Record {
    /// A record without data, block or checksums: a `Delete`, or one of
    /// the kinds that change only a PG log.
    pub fn bare(kind: RecordKind, oid: ObjectId, version: u64, entry: Option<LogEntry>) -> Record {
        Record {
            kind,
            oid,
            version,
            offset: 0,
            len: 0,
            block: 0,
            csums: Vec::new(),
            data_pos: 0,
            entry,
        }
    }

    /// A record that only changes a PG log: `Log` (an entry), `PgRewind`
    /// (to `version`), `PgRemove` or `PgForget` (the entry at `version`).
    pub fn pg_op(kind: RecordKind, pg: u64, version: u64, entry: Option<LogEntry>) -> Record {
        let oid = entry.map_or(ObjectId::new(pg, 0), |e| e.oid);
        Record::bare(kind, oid, version, entry)
    }
}

/// Bytes the header region of a batch with these records takes, unpadded.
pub fn header_bytes(records: &[&Record]) -> usize {
    HDR_BYTES + records.iter().map(|r| record_bytes(r)).sum::<usize>()
}

/// Bytes one record takes in a batch's header region.
pub fn record_bytes(r: &Record) -> usize {
    REC_BYTES + r.entry.map_or(0, |_| ENTRY_BYTES) + 4 * r.csums.len()
}

fn pad(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

/// Everything that identifies a batch besides its records.
#[derive(Clone, Copy, Debug)]
pub struct BatchId {
    pub pos: u64,
    pub gen: u64,
    pub synced_upto: u64,
    pub uuid_lo: u64,
}

fn seal(hdr_region: &mut [u8]) {
    let crc = nacre_types::crc32c(hdr_region);
    let (h, _) = BatchHeader::mut_from_prefix(hdr_region).expect("header region holds a header");
    h.crc = U32::new(crc);
}

/// Encodes a batch: returns the header region and the total batch bytes.
/// The data of small records follows the header region in record order,
/// each padded to `sector`; `data_pos` of each small record is filled in.
pub fn encode_batch(records: &mut [&mut Record], id: BatchId, sector: u32) -> (AlignedBuf, u64) {
    let sector = sector as usize;
    let refs: Vec<&Record> = records.iter().map(|r| &**r).collect();
    let hdr_bytes = pad(header_bytes(&refs), sector);
    let mut data_off = hdr_bytes;
    let mut buf = AlignedBuf::zeroed(hdr_bytes);
    let mut at = HDR_BYTES;
    for r in records.iter_mut() {
        let location = match r.kind {
            RecordKind::Undo | RecordKind::UndoBlock if r.len == 0 => {
                r.data_pos = id.pos;
                0
            }
            RecordKind::Small | RecordKind::Undo => {
                r.data_pos = id.pos + data_off as u64;
                let l = data_off as u32;
                data_off += pad(r.len as usize, sector);
                l
            }
            RecordKind::Big | RecordKind::Fold => r.block,
            RecordKind::Delete
            | RecordKind::Log
            | RecordKind::PgRewind
            | RecordKind::PgRemove
            | RecordKind::PgForget
            | RecordKind::PgMark
            | RecordKind::PgTail
            | RecordKind::Release
            | RecordKind::UndoBlock => 0,
        };
        let rh = RecordHeader {
            kind: U32::new(r.kind as u32),
            len: U32::new(r.len),
            volume: U64::new(r.oid.volume.0),
            obj_block: U64::new(r.oid.block),
            version: U64::new(r.version),
            offset: U32::new(r.offset),
            location: U32::new(location),
            ncsum: U32::new(r.csums.len() as u32),
            flags: U32::new(if r.entry.is_some() {
                REC_FLAG_LOGGED
            } else {
                0
            }),
        };
        buf[at..at + REC_BYTES].copy_from_slice(rh.as_bytes());
        at += REC_BYTES;
        if let Some(e) = &r.entry {
            buf[at..at + ENTRY_BYTES].copy_from_slice(e.to_disk().as_bytes());
            at += ENTRY_BYTES;
        }
        for c in &r.csums {
            buf[at..at + 4].copy_from_slice(&c.to_le_bytes());
            at += 4;
        }
    }
    put_header(
        &mut buf,
        id,
        0,
        hdr_bytes as u32,
        data_off as u32,
        records.len() as u32,
    );
    (buf, data_off as u64)
}

/// A one-sector marker telling replay to continue at the next lap.
pub fn encode_wrap(id: BatchId, sector: u32) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(sector as usize);
    put_header(&mut buf, id, BATCH_FLAG_WRAP, sector, sector, 0);
    buf
}

/// Writes the batch header at the start of `region` (the whole header
/// region) and seals the region with its crc.
fn put_header(
    region: &mut [u8],
    id: BatchId,
    flags: u16,
    hdr_bytes: u32,
    total_bytes: u32,
    nrec: u32,
) {
    let h = BatchHeader {
        magic: U32::new(BATCH_MAGIC),
        version: U16::new(FORMAT_VERSION as u16),
        flags: U16::new(flags),
        hdr_bytes: U32::new(hdr_bytes),
        total_bytes: U32::new(total_bytes),
        nrec: U32::new(nrec),
        crc: U32::new(0),
        pos: U64::new(id.pos),
        gen: U64::new(id.gen),
        synced_upto: U64::new(id.synced_upto),
        uuid_lo: U64::new(id.uuid_lo),
    };
    region[..HDR_BYTES].copy_from_slice(h.as_bytes());
    seal(region);
}

/// Why replay stopped where it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchError {
    /// Not a batch of this store at this position: the normal end of a
    /// journal (never-written space, a previous lap, another generation).
    End(String),
    /// A batch of this store and position whose content does not check out:
    /// a torn write or damage.
    Damaged(String),
}

/// What the first sector of a batch says.
#[derive(Clone, Copy, Debug)]
pub struct BatchStart {
    pub wrap: bool,
    pub hdr_bytes: u32,
    pub total_bytes: u32,
    pub gen: u64,
    pub synced_upto: u64,
}

/// Checks the fixed header at the start of a batch, before the rest is read.
pub fn parse_start(
    first: &[u8],
    expect: BatchId,
    min_gen: u64,
    sector: u32,
    max_bytes: u64,
) -> Result<BatchStart, BatchError> {
    let (h, _) =
        BatchHeader::read_from_prefix(first).map_err(|_| BatchError::End("short header".into()))?;
    if h.magic.get() != BATCH_MAGIC
        || h.uuid_lo.get() != expect.uuid_lo
        || h.pos.get() != expect.pos
    {
        return Err(BatchError::End(
            "no batch of this store at this position".into(),
        ));
    }
    if h.gen.get() < min_gen {
        return Err(BatchError::End(format!(
            "batch from an older generation {}",
            h.gen.get()
        )));
    }
    let (hb, tb) = (h.hdr_bytes.get(), h.total_bytes.get());
    let ok = h.version.get() == FORMAT_VERSION as u16
        && hb as usize >= HDR_BYTES
        && hb % sector == 0
        && tb % sector == 0
        && hb <= tb
        && u64::from(tb) <= max_bytes
        && u64::from(hb) <= BATCH_HDR_BYTES_MAX + sector as u64
        && h.nrec.get() <= RECORDS_PER_BATCH_MAX;
    if !ok {
        return Err(BatchError::Damaged(format!(
            "implausible batch header at {}",
            expect.pos
        )));
    }
    Ok(BatchStart {
        wrap: h.flags.get() & BATCH_FLAG_WRAP != 0,
        hdr_bytes: hb,
        total_bytes: tb,
        gen: h.gen.get(),
        synced_upto: h.synced_upto.get(),
    })
}

/// Parses and verifies a whole batch (`buf` holds `total_bytes` from its start).
pub fn parse_batch(
    buf: &[u8],
    pos: u64,
    block_bytes: u32,
    nblocks: u32,
) -> Result<Vec<Record>, BatchError> {
    let damaged = |why: &str| BatchError::Damaged(format!("batch at {pos}: {why}"));
    let (h, _) = BatchHeader::read_from_prefix(buf).map_err(|_| damaged("short"))?;
    let hdr_bytes = h.hdr_bytes.get() as usize;
    let total = h.total_bytes.get() as usize;
    if buf.len() < total || hdr_bytes > total {
        return Err(damaged("shorter than its header says"));
    }
    let mut region = buf[..hdr_bytes].to_vec();
    BatchHeader::mut_from_prefix(&mut region[..])
        .map_err(|_| damaged("short"))?
        .0
        .crc = U32::new(0);
    if nacre_types::crc32c(&region) != h.crc.get() {
        return Err(damaged("header checksum"));
    }
    let spb = block_bytes / CSUM_CHUNK_BYTES;
    let mut at = HDR_BYTES;
    let mut out = Vec::with_capacity(h.nrec.get() as usize);
    for _ in 0..h.nrec.get() {
        let rh = buf
            .get(at..at + REC_BYTES)
            .and_then(|b| RecordHeader::read_from_bytes(b).ok())
            .ok_or_else(|| damaged("record header past the header region"))?;
        at += REC_BYTES;
        let flags = rh.flags.get();
        if flags & !REC_FLAG_LOGGED != 0 {
            return Err(damaged("unknown record flags"));
        }
        let entry = if flags & REC_FLAG_LOGGED != 0 {
            let d = buf
                .get(at..(at + ENTRY_BYTES).min(hdr_bytes))
                .and_then(|b| LogEntryDisk::read_from_bytes(b).ok())
                .ok_or_else(|| damaged("log entry past the header region"))?;
            at += ENTRY_BYTES;
            Some(LogEntry::from_disk(&d).ok_or_else(|| damaged("impossible log entry"))?)
        } else {
            None
        };
        let ncsum = rh.ncsum.get() as usize;
        if at + 4 * ncsum > hdr_bytes {
            return Err(damaged("checksum list past the header region"));
        }
        let csums: Vec<u32> = buf[at..at + 4 * ncsum]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        at += 4 * ncsum;
        let kind =
            RecordKind::from_u32(rh.kind.get()).ok_or_else(|| damaged("unknown record kind"))?;
        let (len, offset, loc) = (rh.len.get(), rh.offset.get(), rh.location.get());
        let valid = match kind {
            RecordKind::Undo if len == 0 => ncsum == 0 && offset == 0 && loc == 0,
            RecordKind::Small | RecordKind::Undo => {
                len > 0
                    && len % SECTOR_BYTES == 0
                    && offset % SECTOR_BYTES == 0
                    && u64::from(offset) + u64::from(len) <= u64::from(block_bytes)
                    && ncsum == len.div_ceil(CSUM_CHUNK_BYTES) as usize
                    && loc as usize >= hdr_bytes
                    && loc as usize + len as usize <= total
            }
            RecordKind::Big => {
                offset == 0 && len == block_bytes && ncsum == spb as usize && loc < nblocks
            }
            RecordKind::Delete
            | RecordKind::Log
            | RecordKind::PgRewind
            | RecordKind::PgRemove
            | RecordKind::PgForget
            | RecordKind::PgMark
            | RecordKind::PgTail
            | RecordKind::Release
            | RecordKind::UndoBlock => len == 0 && ncsum == 0 && offset == 0 && loc == 0,
            RecordKind::Fold => {
                len == 0
                    && offset == 0
                    && loc < nblocks
                    && ncsum >= 2
                    && ncsum.is_multiple_of(2)
                    && ncsum <= 2 * spb as usize
                    && csums.chunks_exact(2).all(|p| p[0] < spb)
            }
        };
        let oid = ObjectId::new(rh.volume.get(), rh.obj_block.get());
        // Which records carry an entry, and that it describes the record.
        let logged_ok = match (kind, &entry) {
            (
                RecordKind::Small
                | RecordKind::Big
                | RecordKind::Delete
                | RecordKind::Fold
                | RecordKind::Undo
                | RecordKind::UndoBlock
                | RecordKind::Release,
                None,
            ) => true,
            (
                RecordKind::Small | RecordKind::Big | RecordKind::Delete | RecordKind::Log,
                Some(e),
            ) => {
                let op_ok = match kind {
                    RecordKind::Small | RecordKind::Big => e.op == LogOp::Write,
                    RecordKind::Delete => e.op == LogOp::Delete,
                    _ => true,
                };
                op_ok && e.oid == oid && e.version == rh.version.get()
            }
            (k, None) if k.is_pg_op() => rh.obj_block.get() == 0,
            _ => false,
        };
        let version_ok = match kind {
            RecordKind::PgRewind | RecordKind::PgRemove => true,
            RecordKind::PgMark => rh.version.get() <= 1,
            _ => rh.version.get() != 0,
        };
        if !valid || !logged_ok || !version_ok {
            return Err(damaged("record fields out of range"));
        }
        if kind.has_data() {
            let data = &buf[loc as usize..loc as usize + len as usize];
            if chunk_csums(data) != csums {
                return Err(damaged("small-write data checksum"));
            }
        }
        out.push(Record {
            kind,
            oid,
            version: rh.version.get(),
            offset,
            len,
            block: if matches!(kind, RecordKind::Big | RecordKind::Fold) {
                loc
            } else {
                0
            },
            csums,
            data_pos: match kind {
                RecordKind::Undo | RecordKind::UndoBlock if len == 0 => pos,
                RecordKind::Small | RecordKind::Undo => pos + u64::from(loc),
                _ => 0,
            },
            entry,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(oid: ObjectId, v: u64, off: u32, data: &[u8]) -> Record {
        Record {
            kind: RecordKind::Small,
            oid,
            version: v,
            offset: off,
            len: data.len() as u32,
            block: 0,
            csums: chunk_csums(data),
            data_pos: 0,
            entry: None,
        }
    }

    /// Undo records: their bytes ride in the batch like a small write's
    /// (checked the same way); one without bytes (the object was new)
    /// takes its batch's position.
    #[test]
    fn undo_records_roundtrip() {
        let id = BatchId {
            pos: 3 << 20,
            gen: 1,
            synced_upto: 0,
            uuid_lo: 5,
        };
        let old = vec![9u8; 4096];
        let mut u1 = Record {
            kind: RecordKind::Undo,
            ..small(ObjectId::new(2, 1), 7, 8192, &old)
        };
        let mut u2 = Record {
            kind: RecordKind::Undo,
            ..small(ObjectId::new(2, 2), 8, 0, &[])
        };
        let new = vec![3u8; 4096];
        let mut w = small(ObjectId::new(2, 1), 7, 8192, &new);
        let (hdr, total) = encode_batch(&mut [&mut u1, &mut u2, &mut w], id, 512);
        let mut batch = hdr.to_vec();
        batch.extend_from_slice(&old);
        batch.extend_from_slice(&new);
        assert_eq!(batch.len() as u64, total);
        let recs = parse_batch(&batch, id.pos, 64 << 10, 100).unwrap();
        assert_eq!(recs[0].kind, RecordKind::Undo);
        assert_eq!((recs[0].offset, recs[0].len), (8192, 4096));
        assert_eq!(recs[0].data_pos, id.pos + hdr.len() as u64);
        assert_eq!((recs[1].len, recs[1].data_pos), (0, id.pos));
        assert_eq!(recs[2].data_pos, id.pos + hdr.len() as u64 + 4096);
        let mut bad = batch.clone();
        bad[hdr.len() + 100] ^= 1;
        assert!(matches!(
            parse_batch(&bad, id.pos, 64 << 10, 100),
            Err(BatchError::Damaged(_))
        ));
    }

    #[test]
    fn batch_roundtrip_and_damage() {
        let id = BatchId {
            pos: 1 << 20,
            gen: 3,
            synced_upto: 1 << 20,
            uuid_lo: 99,
        };
        let d1 = vec![1u8; 512];
        let d2 = vec![2u8; 8192];
        let mut r1 = small(ObjectId::new(1, 2), 5, 1024, &d1);
        let mut r2 = small(ObjectId::new(1, 3), 6, 0, &d2);
        let mut r3 = Record {
            kind: RecordKind::Big,
            oid: ObjectId::new(4, 4),
            version: 9,
            offset: 0,
            len: 128 << 10,
            block: 17,
            csums: vec![7; 32],
            data_pos: 0,
            entry: None,
        };
        let (hdr, total) = encode_batch(&mut [&mut r1, &mut r2, &mut r3], id, 512);
        let mut batch = hdr.to_vec();
        batch.extend_from_slice(&d1);
        batch.extend_from_slice(&d2);
        assert_eq!(batch.len() as u64, total);
        let st = parse_start(&batch, id, 3, 512, 8 << 20).unwrap();
        assert_eq!((st.total_bytes as u64, st.wrap, st.gen), (total, false, 3));
        let recs = parse_batch(&batch, id.pos, 128 << 10, 100).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].data_pos, r1.data_pos);
        assert_eq!(recs[1].csums, r2.csums);
        assert_eq!(recs[2].block, 17);
        // A different position or an older generation is the journal's end.
        assert!(matches!(
            parse_start(&batch, BatchId { pos: 0, ..id }, 3, 512, 8 << 20),
            Err(BatchError::End(_))
        ));
        assert!(matches!(
            parse_start(&batch, id, 4, 512, 8 << 20),
            Err(BatchError::End(_))
        ));
        // Every flipped bit in the header region or the data is damage.
        for i in [60usize, 100, hdr.len() + 3, batch.len() - 1] {
            let mut bad = batch.clone();
            bad[i] ^= 0x10;
            assert!(
                matches!(
                    parse_batch(&bad, id.pos, 128 << 10, 100),
                    Err(BatchError::Damaged(_))
                ),
                "flip at {i}"
            );
        }
        // A block number outside the store is refused.
        assert!(parse_batch(&batch, id.pos, 128 << 10, 10).is_err());
        let w = encode_wrap(id, 512);
        assert!(parse_start(&w, id, 0, 512, 8 << 20).unwrap().wrap);
    }
}

#[cfg(test)]
mod logged {
    use super::*;

    #[test]
    fn logged_records_roundtrip_and_must_match_their_entry() {
        let id = BatchId {
            pos: 0,
            gen: 1,
            synced_upto: 0,
            uuid_lo: 1,
        };
        let oid = ObjectId::new(2, 3);
        let e = LogEntry {
            pg: 9,
            version: 4,
            oid,
            op: LogOp::Delete,
            offset: 0,
            len: 0,
            client: 5,
            request: 6,
        };
        let mk = |kind, entry| Record::bare(kind, oid, 4, entry);
        let mut del = mk(RecordKind::Delete, Some(e));
        let mut log = Record::pg_op(RecordKind::Log, 9, 4, Some(e));
        let mut rew = Record::pg_op(RecordKind::PgRewind, 9, 0, None);
        let mut fgt = Record::pg_op(RecordKind::PgForget, 9, 4, None);
        let (hdr, _) = encode_batch(&mut [&mut del, &mut log, &mut rew, &mut fgt], id, 512);
        let recs = parse_batch(&hdr, 0, 16 << 10, 10).unwrap();
        assert_eq!(recs[0].entry, Some(e));
        assert_eq!(recs[1].entry, Some(e));
        assert_eq!(
            (recs[2].kind, recs[2].oid.volume.0, recs[2].entry),
            (RecordKind::PgRewind, 9, None)
        );
        assert_eq!(
            (recs[3].kind, recs[3].oid.volume.0, recs[3].version),
            (RecordKind::PgForget, 9, 4)
        );
        // A mark set and cleared, a raised tail.
        let mut set = Record::pg_op(RecordKind::PgMark, 9, 1, None);
        let mut clear = Record::pg_op(RecordKind::PgMark, 9, 0, None);
        let mut tail = Record::pg_op(RecordKind::PgTail, 9, 7, None);
        let (hdr, _) = encode_batch(&mut [&mut set, &mut clear, &mut tail], id, 512);
        let recs = parse_batch(&hdr, 0, 16 << 10, 10).unwrap();
        assert_eq!(
            recs.iter().map(|r| (r.kind, r.version)).collect::<Vec<_>>(),
            [
                (RecordKind::PgMark, 1),
                (RecordKind::PgMark, 0),
                (RecordKind::PgTail, 7)
            ]
        );
        // An entry for another version, a Log without an entry, a Fold
        // with one, a mark that is neither set nor clear, a tail of 0:
        // refused.
        for bad in [
            mk(RecordKind::Delete, Some(LogEntry { version: 3, ..e })),
            mk(RecordKind::Log, None),
            Record::pg_op(RecordKind::PgMark, 9, 2, None),
            Record::pg_op(RecordKind::PgTail, 9, 0, None),
            Record {
                block: 1,
                csums: vec![0, 1],
                ..mk(RecordKind::Fold, Some(e))
            },
        ] {
            let mut bad = bad;
            let (hdr, _) = encode_batch(&mut [&mut bad], id, 512);
            assert!(
                parse_batch(&hdr, 0, 16 << 10, 10).is_err(),
                "{:?}",
                bad.kind
            );
        }
    }
}

#[cfg(test)]
mod robustness {
    //! Bytes from the disk are outside input: random and mutated batches
    //! must be refused with an error, never a panic or a huge allocation.
    use super::*;
    use proptest::prelude::*;

    fn valid_batch() -> (Vec<u8>, BatchId) {
        let id = BatchId {
            pos: 4096,
            gen: 2,
            synced_upto: 0,
            uuid_lo: 5,
        };
        let d = vec![3u8; 1536];
        let mut r = Record {
            kind: RecordKind::Small,
            oid: ObjectId::new(1, 1),
            version: 4,
            offset: 512,
            len: 1536,
            block: 0,
            csums: chunk_csums(&d),
            data_pos: 0,
            entry: None,
        };
        let (hdr, _) = encode_batch(&mut [&mut r], id, 512);
        let mut b = hdr.to_vec();
        b.extend_from_slice(&d);
        (b, id)
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
            let id = BatchId { pos: 0, gen: 0, synced_upto: 0, uuid_lo: 0 };
            let _ = parse_start(&bytes, id, 0, 512, 1 << 20);
            let _ = parse_batch(&bytes, 0, 128 << 10, 1000);
        }

        #[test]
        fn mutated_batches_are_refused_or_equal(flips in prop::collection::vec((0usize..2048, any::<u8>()), 1..8)) {
            let (mut b, id) = valid_batch();
            let orig = b.clone();
            for (i, x) in flips {
                let i = i % b.len();
                b[i] ^= x;
            }
            let start = parse_start(&b, id, 0, 512, 1 << 20);
            let parsed = parse_batch(&b, id.pos, 64 << 10, 100);
            if b != orig {
                // Any change to the header region or the data is caught by
                // a checksum (the padding after the header is not covered).
                if let (Ok(_), Ok(recs)) = (start, parsed) {
                    let hdr = u32::from_le_bytes(orig[8..12].try_into().unwrap()) as usize;
                    prop_assert_eq!(&b[..hdr], &orig[..hdr]);
                    prop_assert_eq!(&b[hdr..], &orig[hdr..]);
                    prop_assert_eq!(recs.len(), 1);
                }
            }
        }
    }
}
