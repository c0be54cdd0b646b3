//! Undoable writes: a write that keeps what it replaced until the caller
//! releases it, so that it can still be rolled back (an erasure-coded
//! shard keeps the previous version of the units a write changed until
//! the write has committed on every shard of its stripe;
//! docs/internals/ec.md).
//!
//! This module holds the table of undos (`Undos`), below the store's
//! state; the store's API for undoable writes is in `undoable`.
//!
//! [`crate::Store::write_undoable`] reads the range it is about to replace (or
//! notes that the object does not exist), and journals an `Undo` record
//! with those bytes immediately before the write's own record. Batches
//! are applied in journal order and replay stops at the first bad one, so
//! after any crash the store holds either the write and its undo, or
//! neither, or the undo alone (then it is dropped: its write never
//! happened).
//!
//! **Invariant** (checked under `strict` at the end of replay, asserted by
//! the crash test against its model): an object with an undo is stored at
//! exactly the undo's version, and the undo's bytes are the object's bytes
//! over its range at the version before (or the undo says it was absent).
//! A later write (or a recovery, at a higher version) or a delete drops
//! the undo; a repair (the same version rewritten) keeps it.
//!
//! Undo bytes live in the journal, which a checkpoint trims: before a
//! checkpoint moves the journal's tail past an undo's record (held, or
//! staged: its write may sit in a later batch), it journals the undo
//! again (`relog_undos`), so an undo lasts until it is released, across
//! any number of checkpoints and restarts. A release is journaled too
//! (a `Release` record, lazily, with the next batch), so a crash brings
//! back only undos released since the last batch was made durable.
//!
//! The journal cost of the undos held (their bytes padded to 4 KiB, plus
//! a record header each: `undo_cost`) is bounded (`undo_bytes_max`, a
//! sixteenth of the journal), and so is what a crash brings back (the
//! undos held then, and those released since the last durable batch,
//! which were held at that time: two sixteenths), so re-logging them
//! always fits the fifth of the journal kept back for the checkpointer;
//! an undoable write that would pass the bound waits for releases.

use std::rc::Rc;

use nacre_io::AlignedBuf;
use nacre_types::ObjectId;

use crate::format::RecordKind;
use crate::index::Overlay;
use crate::journal::Record;

/// What an object held before its newest write, kept for rolling that
/// write back.
#[derive(Debug)]
pub struct Undo {
    /// The version of the write this undoes (the object's version now).
    pub version: u64,
    /// The bytes the write replaced and where they were; `None`: the
    /// object did not exist before the write.
    pub before: Option<(u32, AlignedBuf)>,
}

/// The bit of [`ObjectId::block`] that names an object's *hidden* twin,
/// which holds the block an undo keeps: a volume's block index stays below
/// 2⁵² and a shard's index is in the top byte, so bits 52..56 are free. No
/// op from outside may name it; listings and counts leave it out.
const HIDDEN_BIT: u64 = 1 << 55;

/// The hidden object that holds the block `oid`'s undo keeps.
pub(crate) fn hidden(oid: ObjectId) -> ObjectId {
    ObjectId {
        volume: oid.volume,
        block: oid.block | HIDDEN_BIT,
    }
}

/// Whether `oid` names a hidden object (see [`hidden`]).
pub fn is_hidden(oid: &ObjectId) -> bool {
    oid.block & HIDDEN_BIT != 0
}

/// An undo held in memory.
#[derive(Clone)]
pub(crate) enum Kept {
    /// The bytes the write replaced, in the journal at `data_pos` (and
    /// maybe cached).
    Bytes(Overlay),
    /// The object's whole block as it was, kept under its hidden name;
    /// `pos`: the batch of its record.
    Block { version: u64, pos: u64 },
}

impl Kept {
    pub(crate) fn version(&self) -> u64 {
        match self {
            Kept::Bytes(o) => o.version,
            Kept::Block { version, .. } => *version,
        }
    }

    fn cost(&self) -> u64 {
        match self {
            Kept::Bytes(o) => undo_cost(o.len),
            Kept::Block { .. } => undo_cost(0),
        }
    }

    /// Where its record is in the journal.
    pub(crate) fn pos(&self) -> u64 {
        match self {
            Kept::Bytes(o) => o.data_pos,
            Kept::Block { pos, .. } => *pos,
        }
    }

    pub(crate) fn is_block(&self) -> bool {
        matches!(self, Kept::Block { .. })
    }
}

/// What an applied write did to its object's undos.
#[derive(Default)]
pub(crate) struct Changed {
    /// An older undo that kept a block was dropped: its hidden object goes.
    pub dropped_block: bool,
    /// The write's own undo keeps a block: the block the write replaces
    /// becomes the hidden object instead of being freed.
    pub keeps_block: bool,
}

/// Undos held in memory: per object, the applied one and one whose write
/// has not been applied yet (its `Undo` record is, the write's is not).
#[derive(Default)]
pub(crate) struct Undos {
    pub held: crate::index::OidMap<Kept>,
    pub staged: crate::index::OidMap<Kept>,
    /// Journal cost (`undo_cost`) of `held` and `staged`.
    pub bytes: u64,
    /// Bytes of undoable writes admitted and not yet finished (they are in
    /// `held` or `staged` too once their record is applied: counted
    /// twice for a moment, never missed).
    pub admitted: u64,
    /// Undos in `held` that keep a block (each a hidden object).
    blocks: usize,
}

/// What re-logging an undo of `len` bytes costs the journal, at most: its
/// bytes padded to a 4 KiB sector, and a record header with its checksums.
pub(crate) fn undo_cost(len: u32) -> u64 {
    u64::from(len).div_ceil(4096) * 4096 + 128
}

impl Undos {
    /// Puts `u` in; the undo it replaces, if any.
    fn put(&mut self, staged: bool, oid: ObjectId, u: Kept) -> Option<Kept> {
        self.bytes += u.cost();
        if !staged && u.is_block() {
            self.blocks += 1;
        }
        let map = if staged {
            &mut self.staged
        } else {
            &mut self.held
        };
        let old = map.insert(oid, u)?;
        self.bytes -= old.cost();
        if !staged && old.is_block() {
            self.blocks -= 1;
        }
        Some(old)
    }

    fn take(&mut self, staged: bool, oid: &ObjectId) -> Option<Kept> {
        let map = if staged {
            &mut self.staged
        } else {
            &mut self.held
        };
        let u = map.remove(oid)?;
        self.bytes -= u.cost();
        if !staged && u.is_block() {
            self.blocks -= 1;
        }
        Some(u)
    }

    /// Drops `oid`'s held undo; whether it kept a block (whose hidden
    /// object the caller removes).
    pub(crate) fn drop_held(&mut self, oid: &ObjectId) -> bool {
        self.take(false, oid).is_some_and(|u| u.is_block())
    }

    /// How many held undos keep a block (hidden objects).
    pub(crate) fn block_count(&self) -> usize {
        self.blocks
    }

    /// An `Undo` or `UndoBlock` record applied: ignored if the object is
    /// newer; staged for its write if older; at the object's version
    /// (re-logged by a checkpoint, or, in replay, a write a fuzzy
    /// checkpoint captured) held — but live only in place of the held
    /// undo it copies, so a release made while the copy was being
    /// journaled stands; and one that keeps a block only where the block
    /// is (`has_hidden`: a release or a later write may have removed it).
    pub(crate) fn on_record(
        &mut self,
        stored: Option<u64>,
        rec: &Record,
        data: Option<AlignedBuf>,
        replay: bool,
        has_hidden: bool,
    ) {
        let u = if rec.kind == RecordKind::UndoBlock {
            Kept::Block {
                version: rec.version,
                pos: rec.data_pos,
            }
        } else {
            Kept::Bytes(Overlay {
                offset: rec.offset,
                len: rec.len,
                data_pos: rec.data_pos,
                version: rec.version,
                csums: rec.csums.clone().into_boxed_slice(),
                data: data.filter(|_| rec.len > 0).map(Rc::new),
            })
        };
        match stored {
            Some(v) if v == rec.version => {
                let copies = (self.held.get(&rec.oid))
                    .is_some_and(|h| h.version() == v && h.is_block() == u.is_block());
                if (replay || copies) && (!u.is_block() || has_hidden) {
                    // The same undo again (same version, same block).
                    let _ = self.put(false, rec.oid, u);
                }
            }
            Some(v) if v > rec.version => {}
            _ => {
                let _ = self.put(true, rec.oid, u);
            }
        }
    }

    /// A release of `oid`'s undo at `upto` or older (see
    /// [`crate::Store::release_undo`]); whether it kept a block.
    pub(crate) fn on_release(&mut self, oid: &ObjectId, upto: u64) -> bool {
        if self.held.get(oid).is_some_and(|u| u.version() <= upto) {
            return self.drop_held(oid);
        }
        false
    }

    /// A write of `oid` at `version` applied: its staged undo becomes the
    /// held one; an older undo is dropped.
    pub(crate) fn on_write(&mut self, oid: ObjectId, version: u64) -> Changed {
        let mut out = Changed::default();
        if let Some(s) = self.staged.get(&oid).map(Kept::version) {
            if s <= version {
                let u = self.take(true, &oid).expect("staged undo present");
                if s == version {
                    out.keeps_block = u.is_block();
                    let old = self.put(false, oid, u);
                    out.dropped_block = old.is_some_and(|o| o.is_block());
                    return out;
                }
            }
        }
        if self.held.get(&oid).is_some_and(|u| u.version() < version) {
            out.dropped_block = self.drop_held(&oid);
        }
        out
    }

    /// A delete of `oid` applied; whether its held undo kept a block.
    pub(crate) fn on_delete(&mut self, oid: &ObjectId) -> bool {
        self.take(true, oid);
        self.drop_held(oid)
    }

    /// After replay: staged undos whose write never came are dropped, and
    /// so is any undo whose object is not at its version, or that keeps a
    /// block no hidden object holds; then every hidden object no held
    /// undo names is removed.
    pub(crate) fn settle(&mut self, index: &mut crate::index::Index) {
        let staged: Vec<ObjectId> = self.staged.keys().copied().collect();
        for oid in staged {
            self.take(true, &oid);
        }
        let stale: Vec<ObjectId> = (self.held.iter())
            .filter(|(oid, u)| {
                index.version(oid) != Some(u.version())
                    || (u.is_block() && index.block_of(&hidden(**oid)).is_none())
            })
            .map(|(oid, _)| *oid)
            .collect();
        for oid in stale {
            self.drop_held(&oid);
        }
        let mut orphans = Vec::new();
        index.for_each(|o| {
            if is_hidden(&o) {
                orphans.push(o);
            }
        });
        for h in orphans {
            let base = ObjectId {
                volume: h.volume,
                block: h.block & !HIDDEN_BIT,
            };
            if !self.held.get(&base).is_some_and(Kept::is_block) {
                index.clear_block(&h);
            }
        }
    }

    /// `strict`: every held undo is at its object's version, and one that
    /// keeps a block has its hidden object.
    pub(crate) fn check(&self, index: &crate::index::Index) {
        for (oid, u) in &self.held {
            crate::strict_assert!(
                index.version(oid) == Some(u.version()),
                "undo of {oid} at {} with the object at {:?}",
                u.version(),
                index.version(oid)
            );
            crate::strict_assert!(
                !u.is_block() || index.block_of(&hidden(*oid)).is_some(),
                "the undo of {oid} keeps a block no hidden object holds"
            );
        }
    }

    pub(crate) fn memory_bytes(&self) -> u64 {
        let cached: u64 = (self.held.values().chain(self.staged.values()))
            .filter_map(|u| match u {
                Kept::Bytes(o) if o.data.is_some() => Some(u64::from(o.len)),
                _ => None,
            })
            .sum();
        cached + 64 * (self.held.len() + self.staged.len()) as u64
    }
}

/// What an undoable write's record says it replaced: the bytes of its
/// range (`None`: the object did not exist), or the object's whole block,
/// which the write keeps instead of freeing.
pub(crate) enum Before {
    Bytes(Option<(u32, AlignedBuf)>),
    Block,
}
