//! PG logs: per placement group, the recent operations on its objects, as
//! the OSD's replication needs them (docs/internals/replication.md §4).
//!
//! An entry rides in the journal record of the write or delete it
//! describes, so replay finds both or neither. The store keeps each PG's
//! log in memory, sorted by version, and a checkpoint writes every log that
//! changed to a slot of the log region (two shadow copies per slot, like
//! the tables: the committed checkpoint's copy is never overwritten).
//! Replay re-applies the records after the checkpoint on top of the slots
//! it loaded; inserting an entry, rewinding and removing a log are
//! idempotent in journal order, so a log captured at any moment after the
//! checkpoint's journal position comes out right ("fuzzy", as the tables).
//!
//! The store interprets an entry only through its PG and version; the
//! rest (object, op, range, client request) is the OSD's.

use std::collections::{BTreeMap, HashMap};

use nacre_io::AlignedBuf;
use nacre_types::ObjectId;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{Error, Result};
use crate::format::{
    page_crc, LogEntryDisk, LogRegion, LogSlotHeader, LogSlotMeta, PAGE_BYTES, PGLOG_MAGIC,
};

/// What an entry's operation did to its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogOp {
    Write = 1,
    Delete = 2,
}

impl LogOp {
    fn from_u32(v: u32) -> Option<LogOp> {
        match v {
            1 => Some(LogOp::Write),
            2 => Some(LogOp::Delete),
            _ => None,
        }
    }
}

/// One PG log entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogEntry {
    /// The PG's key (the OSD's choice, e.g. pool << 32 | pg).
    pub pg: u64,
    pub version: u64,
    pub oid: ObjectId,
    pub op: LogOp,
    /// Byte range of a write inside the object.
    pub offset: u32,
    pub len: u32,
    /// The client request that caused it, for retries.
    pub client: u64,
    pub request: u64,
}

impl LogEntry {
    pub(crate) fn to_disk(self) -> LogEntryDisk {
        LogEntryDisk {
            pg: U64::new(self.pg),
            version: U64::new(self.version),
            volume: U64::new(self.oid.volume.0),
            obj_block: U64::new(self.oid.block),
            client: U64::new(self.client),
            request: U64::new(self.request),
            offset: U32::new(self.offset),
            len: U32::new(self.len),
            op: U32::new(self.op as u32),
            pad: U32::new(0),
        }
    }

    /// Parses a stored entry; `None` if a field is impossible.
    pub(crate) fn from_disk(d: &LogEntryDisk) -> Option<LogEntry> {
        let op = LogOp::from_u32(d.op.get())?;
        if d.version.get() == 0 || d.pad.get() != 0 {
            return None;
        }
        Some(LogEntry {
            pg: d.pg.get(),
            version: d.version.get(),
            oid: ObjectId::new(d.volume.get(), d.obj_block.get()),
            op,
            offset: d.offset.get(),
            len: d.len.get(),
            client: d.client.get(),
            request: d.request.get(),
        })
    }

    /// The entry's 64 bytes as stored (and as peers exchange logs).
    pub fn to_bytes(self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b.copy_from_slice(self.to_disk().as_bytes());
        b
    }

    /// Parses [`LogEntry::to_bytes`]; `None` if a field is impossible.
    pub fn from_bytes(b: &[u8]) -> Option<LogEntry> {
        LogEntryDisk::read_from_bytes(b.get(..64)?)
            .ok()
            .and_then(|d| LogEntry::from_disk(&d))
    }
}

/// A PG's log as the store holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PgLog {
    /// Entries above `tail`, by version.
    pub entries: BTreeMap<u64, LogEntry>,
    /// Versions at or below this were trimmed (0: nothing was).
    pub tail: u64,
    /// The copy is being recovered: objects were written to it out of the
    /// log's order (whole objects of the authoritative copy, some with
    /// their entry, some without), so its objects are not its log's ops
    /// applied, until the authoritative log is made its own
    /// (`Store::pg_mark_recovering`; the OSD sets it before the first
    /// object recovery brings and clears it with the log sync after the
    /// last). Peering compares such a copy object by object.
    pub recovering: bool,
}

impl PgLog {
    /// The newest version the log knows of (`last_update`).
    pub fn head(&self) -> u64 {
        self.entries
            .last_key_value()
            .map_or(self.tail, |(&v, _)| v.max(self.tail))
    }

    fn is_blank(&self) -> bool {
        self.entries.is_empty() && self.tail == 0 && !self.recovering
    }
}

#[derive(Default)]
struct PgState {
    log: PgLog,
    /// The slot it is written to, once a checkpoint gave it one.
    slot: Option<u32>,
    dirty: bool,
    /// Logged ops admitted and not finished; the log stays while any is.
    holds: u32,
    /// Their entries by version (with a count for duplicates in flight).
    pending: HashMap<u64, (LogEntry, u32)>,
}

/// What a logged op may do, given its PG's log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Go on: the op holds its PG's log until [`PgLogs::release`].
    Go,
    /// The log already holds this very entry: the op was applied.
    Done,
}

/// Every PG log of a store, and where they are on disk.
pub(crate) struct PgLogs {
    region: LogRegion,
    pgs: HashMap<u64, PgState>,
    /// Per slot, what the committed checkpoint holds there.
    pub metas: Vec<LogSlotMeta>,
    /// Per slot, the PG it belongs to now (in memory).
    owner: Vec<Option<u64>>,
}

/// A slot's pages for a checkpoint: (slot, copy, bytes).
pub(crate) type SlotWrite = (u32, u32, AlignedBuf);

impl PgLogs {
    pub fn new(region: LogRegion, metas: Vec<LogSlotMeta>) -> PgLogs {
        PgLogs {
            region,
            pgs: HashMap::new(),
            owner: vec![None; metas.len()],
            metas,
        }
    }

    pub fn get(&self, pg: u64) -> Option<&PgLog> {
        self.pgs.get(&pg).map(|s| &s.log)
    }

    pub fn keys(&self) -> Vec<u64> {
        let mut k: Vec<u64> = self.pgs.keys().copied().collect();
        k.sort_unstable();
        k
    }

    pub fn memory_bytes(&self) -> u64 {
        let entries: usize = self.pgs.values().map(|s| s.log.entries.len()).sum();
        (entries * (std::mem::size_of::<LogEntry>() + 24)
            + self.pgs.len() * (std::mem::size_of::<PgState>() + 16)
            + self.owner.len() * 24) as u64
    }

    /// Admits a logged op's entry before the op is: one version names one
    /// op in a PG (another op at a logged or in-flight version is
    /// `Invalid`; the same entry already logged is `Done`), an entry must
    /// be newer than what the log trimmed or would drop, and a store holds
    /// at most as many logs as it has slots. On `Go` the op holds the log
    /// (it cannot be dropped under it) until `release`.
    pub fn hold(&mut self, e: &LogEntry) -> Result<Admission> {
        let cap = self.region.entries_per_slot();
        if !self.pgs.contains_key(&e.pg) && self.pgs.len() >= self.region.slots as usize {
            return Err(Error::PgLogsFull {
                slots: self.region.slots,
            });
        }
        let s = self.pgs.entry(e.pg).or_default();
        let refuse = |why: String| Err(Error::Invalid(format!("PG {:#x}: {why}", e.pg)));
        if let Some(l) = s.log.entries.get(&e.version) {
            if l == e {
                return Ok(Admission::Done);
            }
            return refuse(format!(
                "version {} is already another op's ({l:?})",
                e.version
            ));
        }
        if e.version <= s.log.tail {
            return refuse(format!(
                "version {} is at or below the log's tail {}",
                e.version, s.log.tail
            ));
        }
        let oldest = s.log.entries.first_key_value().map(|(&v, _)| v);
        if s.log.entries.len() >= cap && oldest.is_some_and(|v| e.version < v) {
            return refuse(format!(
                "version {} is older than every entry of a full log",
                e.version
            ));
        }
        match s.pending.get_mut(&e.version) {
            Some((p, _)) if p != e => {
                return refuse(format!("version {} is in flight for another op", e.version))
            }
            Some((_, n)) => *n += 1,
            None => {
                s.pending.insert(e.version, (*e, 1));
            }
        }
        s.holds += 1;
        Ok(Admission::Go)
    }

    /// Ends the hold of an op admitted with `hold` (applied or not); a log
    /// left blank and unheld is forgotten.
    pub fn release(&mut self, e: &LogEntry) {
        let Some(s) = self.pgs.get_mut(&e.pg) else {
            return;
        };
        s.holds -= 1;
        if let Some((_, n)) = s.pending.get_mut(&e.version) {
            *n -= 1;
            if *n == 0 {
                s.pending.remove(&e.version);
            }
        }
        if s.holds == 0 && s.log.is_blank() {
            self.remove(e.pg);
        }
    }

    fn state(&mut self, pg: u64) -> &mut PgState {
        // Replay may briefly hold more logs than slots (a log removed after
        // the checkpoint's position comes back until its removal is
        // replayed); slots are only given out at checkpoints.
        self.pgs.entry(pg).or_default()
    }

    /// Adds an entry (from a journal record being applied). An entry at or
    /// below the tail is history already trimmed. A full log drops its
    /// oldest entry.
    pub fn insert(&mut self, e: &LogEntry, replay: bool) {
        let cap = self.region.entries_per_slot();
        let s = self.state(e.pg);
        if e.version <= s.log.tail {
            return;
        }
        let old = s.log.entries.insert(e.version, *e);
        // Invariant 1 at the store: a version names one op. Live, the
        // admission checks keep it; replay re-applies what is already there.
        crate::strict_assert!(
            replay || old.is_none_or(|o| o == *e),
            "PG {:#x} version {} given to two ops: {old:?} and {e:?}",
            e.pg,
            e.version
        );
        while s.log.entries.len() > cap {
            let (v, _) = s.log.entries.pop_first().expect("log is not empty");
            s.log.tail = v;
        }
        s.dirty = true;
    }

    /// Whether `pg_rewind(pg, to)` may run: never below what was trimmed.
    pub fn check_rewind(&self, pg: u64, to: u64) -> Result<()> {
        match self.pgs.get(&pg) {
            Some(s) if to < s.log.tail => Err(Error::Invalid(format!(
                "PG {pg:#x}: cannot rewind to {to}, below the log's tail {}",
                s.log.tail
            ))),
            _ => Ok(()),
        }
    }

    /// Drops the entries newer than `to` (nothing for a PG without a log).
    pub fn rewind(&mut self, pg: u64, to: u64) {
        let Some(s) = self.pgs.get_mut(&pg) else {
            return;
        };
        let Some(above) = to.checked_add(1) else {
            return;
        };
        let gone = s.log.entries.split_off(&above);
        if !gone.is_empty() {
            s.dirty = true;
        }
    }

    /// Whether `pg_forget(pg, version)` may run: not while an op at that
    /// version is in flight (it would log the entry right after).
    pub fn check_forget(&self, pg: u64, version: u64) -> Result<()> {
        if version == 0 {
            return Err(Error::Invalid(format!("PG {pg:#x}: version 0 names no op")));
        }
        match self.pgs.get(&pg) {
            Some(s) if s.pending.contains_key(&version) => Err(Error::Invalid(format!(
                "PG {pg:#x}: cannot forget version {version}, an op at it is in flight"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether `e` is older than what its PG's log keeps: at or below the
    /// tail, or before every entry of a full log.
    pub fn too_old(&self, e: &LogEntry) -> bool {
        let cap = self.region.entries_per_slot();
        self.pgs.get(&e.pg).is_some_and(|s| {
            e.version <= s.log.tail
                || (s.log.entries.len() >= cap
                    && s.log
                        .entries
                        .first_key_value()
                        .is_some_and(|(&v, _)| e.version < v))
        })
    }

    /// Whether `pg_mark_recovering(pg, ..)` or `pg_raise_tail` may run:
    /// they may make a log, and a store holds at most as many logs as it
    /// has slots.
    pub fn check_new(&self, pg: u64) -> Result<()> {
        if !self.pgs.contains_key(&pg) && self.pgs.len() >= self.region.slots as usize {
            return Err(Error::PgLogsFull {
                slots: self.region.slots,
            });
        }
        Ok(())
    }

    /// Sets or clears PG `pg`'s recovering mark; a log left blank and
    /// unheld is forgotten.
    pub fn mark(&mut self, pg: u64, recovering: bool) {
        let s = self.state(pg);
        if s.log.recovering != recovering {
            s.log.recovering = recovering;
            s.dirty = true;
        }
        if s.holds == 0 && s.log.is_blank() {
            self.remove(pg);
        }
    }

    /// Drops the entry at `version`, if there is one.
    pub fn forget(&mut self, pg: u64, version: u64) {
        if let Some(s) = self.pgs.get_mut(&pg) {
            if s.log.entries.remove(&version).is_some() {
                s.dirty = true;
            }
        }
    }

    /// Trims the entries at or below `upto` (in memory; the next
    /// checkpoint persists it, a crash before it only keeps more history).
    pub fn trim(&mut self, pg: u64, upto: u64) {
        if self.pgs.contains_key(&pg) {
            self.raise_tail(pg, upto);
        }
    }

    /// Raises PG `pg`'s tail to `upto`, dropping the entries at or below
    /// it (a `PgTail` record); on a PG without a log, makes one.
    pub fn raise_tail(&mut self, pg: u64, upto: u64) {
        let s = self.state(pg);
        if upto > s.log.tail {
            s.log.tail = upto;
            s.log.entries = match upto.checked_add(1) {
                Some(above) => s.log.entries.split_off(&above),
                None => BTreeMap::new(),
            };
            s.dirty = true;
        }
    }

    /// Forgets PG `pg`'s log; its slot is free from the next checkpoint.
    /// While ops hold it, it is emptied instead (they may still log to it).
    pub fn remove(&mut self, pg: u64) {
        if let Some(s) = self.pgs.get_mut(&pg).filter(|s| s.holds > 0) {
            s.log = PgLog::default();
            s.dirty = true;
            return;
        }
        if let Some(s) = self.pgs.remove(&pg) {
            if let Some(slot) = s.slot {
                self.owner[slot as usize] = None;
            }
        }
    }

    /// Puts a log loaded from slot `slot` in place (at open).
    pub fn load(&mut self, slot: u32, pg: u64, log: PgLog) -> Result<()> {
        if self.pgs.contains_key(&pg) {
            return Err(Error::Corrupt(format!(
                "PG log of {pg:#x} in two slots (the second is {slot})"
            )));
        }
        self.owner[slot as usize] = Some(pg);
        self.pgs.insert(
            pg,
            PgState {
                log,
                slot: Some(slot),
                ..PgState::default()
            },
        );
        Ok(())
    }

    /// The slot writes of a checkpoint and the slot metas it commits: every
    /// log changed since the last one goes to the copy of its slot the
    /// committed checkpoint does not use; a slot whose log is gone (or was
    /// never more than a reservation) is marked free.
    pub fn checkpoint(&mut self) -> (Vec<SlotWrite>, Vec<LogSlotMeta>) {
        let mut metas = self.metas.clone();
        let mut writes = Vec::new();
        // Slots of removed logs first, so that their slots can be reused.
        for (slot, m) in metas.iter_mut().enumerate() {
            if m.pages.get() != 0 && self.owner[slot].is_none() {
                m.pages = U16::new(0);
                m.crc = U32::new(0);
            }
        }
        let mut free: Vec<u32> = (0..self.owner.len() as u32)
            .rev()
            .filter(|&s| self.owner[s as usize].is_none())
            .collect();
        let mut keys: Vec<u64> = (self.pgs.iter())
            .filter(|(_, s)| s.dirty)
            .map(|(&k, _)| k)
            .collect();
        keys.sort_unstable();
        for pg in keys {
            let s = self.pgs.get_mut(&pg).expect("key from the map");
            s.dirty = false;
            if s.log.is_blank() {
                if let Some(slot) = s.slot.take() {
                    self.owner[slot as usize] = None;
                    metas[slot as usize].pages = U16::new(0);
                    metas[slot as usize].crc = U32::new(0);
                    free.push(slot);
                }
                continue;
            }
            let slot = match s.slot {
                Some(slot) => slot,
                None => {
                    let slot = free.pop().expect("no more logs than slots outside replay");
                    s.slot = Some(slot);
                    self.owner[slot as usize] = Some(pg);
                    slot
                }
            };
            let buf = encode_slot(pg, &s.log);
            let copy = 1 - u32::from(self.metas[slot as usize].copy.get());
            metas[slot as usize] = LogSlotMeta {
                crc: U32::new(page_crc(&buf)),
                copy: U16::new(copy as u16),
                pages: U16::new((buf.len() as u64 / PAGE_BYTES) as u16),
            };
            writes.push((slot, copy, buf));
        }
        (writes, metas)
    }
}

/// A log's slot bytes: header, then entries by version, padded to a page.
fn encode_slot(pg: u64, log: &PgLog) -> AlignedBuf {
    let hdr = std::mem::size_of::<LogSlotHeader>();
    let esz = std::mem::size_of::<LogEntryDisk>();
    let bytes = (hdr + log.entries.len() * esz).div_ceil(PAGE_BYTES as usize) * PAGE_BYTES as usize;
    let mut buf = AlignedBuf::zeroed(bytes);
    let h = LogSlotHeader {
        magic: PGLOG_MAGIC,
        pg: U64::new(pg),
        tail: U64::new(log.tail),
        count: U32::new(log.entries.len() as u32),
        flags: U32::new(u32::from(log.recovering)),
        reserved: [0; 96],
    };
    buf[..hdr].copy_from_slice(h.as_bytes());
    for (i, e) in log.entries.values().enumerate() {
        let at = hdr + i * esz;
        buf[at..at + esz].copy_from_slice(e.to_disk().as_bytes());
    }
    buf
}

/// Parses a slot's pages (whose crc matched): its PG and log.
pub(crate) fn decode_slot(
    buf: &[u8],
    region: LogRegion,
) -> std::result::Result<(u64, PgLog), String> {
    let (h, _) = LogSlotHeader::read_from_prefix(buf).map_err(|_| "short slot".to_string())?;
    if h.magic != PGLOG_MAGIC {
        return Err("no PG log magic".into());
    }
    let pg = h.pg.get();
    let count = h.count.get() as usize;
    let hdr = std::mem::size_of::<LogSlotHeader>();
    let esz = std::mem::size_of::<LogEntryDisk>();
    if count > region.entries_per_slot() || hdr + count * esz > buf.len() {
        return Err(format!("{count} entries do not fit the slot"));
    }
    if h.flags.get() > 1 {
        return Err(format!("unknown flags {:#x}", h.flags.get()));
    }
    let mut log = PgLog {
        entries: BTreeMap::new(),
        tail: h.tail.get(),
        recovering: h.flags.get() == 1,
    };
    let mut last = log.tail;
    for i in 0..count {
        let at = hdr + i * esz;
        let d = LogEntryDisk::read_from_bytes(&buf[at..at + esz]).expect("64 bytes");
        let e = LogEntry::from_disk(&d)
            .filter(|e| e.pg == pg && e.version > last)
            .ok_or_else(|| format!("entry {i} of PG {pg:#x} is impossible"))?;
        last = e.version;
        log.entries.insert(e.version, e);
    }
    Ok((pg, log))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(pg: u64, v: u64, obj: u64) -> LogEntry {
        LogEntry {
            pg,
            version: v,
            oid: ObjectId::new(1, obj),
            op: LogOp::Write,
            offset: 0,
            len: 4096,
            client: 7,
            request: v * 10,
        }
    }

    const REGION: LogRegion = LogRegion {
        slots: 2,
        slot_pages: 1,
    };

    #[test]
    fn slots_roundtrip_and_refuse_damage() {
        let mut log = PgLog {
            tail: 3,
            ..PgLog::default()
        };
        for v in [4, 9, 12] {
            log.entries.insert(v, e(5, v, v));
        }
        let buf = encode_slot(5, &log);
        assert_eq!(buf.len(), 4096);
        assert_eq!(decode_slot(&buf, REGION).unwrap(), (5, log.clone()));
        assert_eq!(log.head(), 12);
        // Entries out of order, of another PG, or too many are refused.
        let mut bad = buf.to_vec();
        bad[128 + 64 + 8] = 1; // second entry's version → 1 (below the first)
        assert!(decode_slot(&bad, REGION).is_err());
        let mut bad = buf.to_vec();
        bad[128] ^= 1; // first entry's PG
        assert!(decode_slot(&bad, REGION).is_err());
        let mut bad = buf.to_vec();
        bad[24] = 200; // count
        assert!(decode_slot(&bad, REGION).is_err());
        // The recovering flag round-trips; other flags are refused.
        let mut marked = log.clone();
        marked.recovering = true;
        assert_eq!(
            decode_slot(&encode_slot(5, &marked), REGION).unwrap(),
            (5, marked)
        );
        let mut bad = buf.to_vec();
        bad[28] = 2; // flags
        assert!(decode_slot(&bad, REGION).is_err());
    }

    #[test]
    fn insert_rewind_trim_and_cap() {
        let mut logs = PgLogs::new(REGION, vec![LogSlotMeta::default(); 2]);
        let cap = REGION.entries_per_slot();
        assert_eq!(cap, 62);
        for v in 1..=70 {
            logs.insert(&e(1, v, v), false);
        }
        let l = logs.get(1).unwrap();
        assert_eq!((l.entries.len(), l.tail, l.head()), (cap, 8, 70));
        logs.rewind(1, 60);
        assert_eq!(logs.get(1).unwrap().head(), 60);
        logs.trim(1, 50);
        let l = logs.get(1).unwrap();
        assert_eq!((l.entries.len(), l.tail), (10, 50));
        // An entry at or below the tail is old history.
        logs.insert(&e(1, 40, 1), true);
        assert_eq!(logs.get(1).unwrap().entries.len(), 10);
        // Rewinds and trims at the ends of u64 do not overflow; a rewind
        // of a PG without a log creates none.
        logs.rewind(1, u64::MAX);
        logs.rewind(9, 3);
        assert!(logs.get(9).is_none());
        // Two slots: a third PG has no room while the second is held,
        // and gets it once that hold ends on a blank log.
        assert_eq!(logs.hold(&e(2, 1, 1)).unwrap(), Admission::Go);
        assert!(matches!(
            logs.hold(&e(3, 1, 1)),
            Err(Error::PgLogsFull { slots: 2 })
        ));
        logs.release(&e(2, 1, 1));
        assert!(logs.get(2).is_none());
        assert_eq!(logs.hold(&e(3, 1, 1)).unwrap(), Admission::Go);
        // One version, one op: another op at an in-flight or logged
        // version is refused; the same logged entry is done.
        assert!(logs.hold(&e(3, 1, 2)).is_err());
        logs.insert(&e(3, 1, 1), false);
        logs.release(&e(3, 1, 1));
        assert_eq!(logs.hold(&e(3, 1, 1)).unwrap(), Admission::Done);
        assert!(logs.hold(&e(3, 1, 5)).is_err());
        // Below the tail: refused, and no rewind below it.
        logs.trim(3, 1);
        assert!(logs.hold(&e(3, 1, 1)).is_err());
        assert!(logs.check_rewind(3, 0).is_err());
        logs.trim(1, u64::MAX);
        assert_eq!(logs.get(1).unwrap().head(), u64::MAX);
    }

    #[test]
    fn checkpoints_alternate_copies_and_free_slots() {
        let mut logs = PgLogs::new(REGION, vec![LogSlotMeta::default(); 2]);
        logs.insert(&e(1, 1, 1), false);
        logs.insert(&e(2, 1, 1), false);
        let (w, metas) = logs.checkpoint();
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|(_, copy, _)| *copy == 1));
        logs.metas = metas;
        // Nothing changed: nothing written.
        assert!(logs.checkpoint().0.is_empty());
        logs.insert(&e(1, 2, 1), false);
        let (w, metas) = logs.checkpoint();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].1, 0);
        logs.metas = metas;
        // A removed log frees its slot, which a new PG takes.
        logs.remove(2);
        logs.insert(&e(3, 1, 1), false);
        let (w, metas) = logs.checkpoint();
        assert_eq!(w.len(), 1);
        let slot = w[0].0;
        assert_eq!(metas.iter().filter(|m| m.pages.get() > 0).count(), 2);
        let (pg, _) = decode_slot(&w[0].2, REGION).unwrap();
        assert_eq!(pg, 3);
        assert_eq!(logs.owner[slot as usize], Some(3));
    }
}
