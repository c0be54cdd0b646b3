//! The in-memory index: which block holds each object, at which version,
//! and which journal records (overlays) are newer than the block.
//!
//! `blocks` is the object table itself — one 24-byte entry per data block,
//! the same bytes that checkpoints write — so the index costs 24 bytes per
//! block plus 5 bytes per block of hash slots in `by_oid` (4 bytes per
//! slot, 1.25 slots per block). Objects with journal
//! data not yet folded into their block also have a `pending` entry,
//! bounded by the journal's size.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use std::rc::Rc;

use nacre_io::AlignedBuf;
use nacre_types::ObjectId;

use crate::format::{BlockEntry, Geometry};
use crate::oidtable::OidTable;

/// A multiply-mix hasher for object ids (no DoS concern: ids come from the
/// cluster, not from untrusted clients).
#[derive(Default)]
pub struct OidHasher(u64);

impl Hasher for OidHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(23) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        let z = self.0;
        (z ^ (z >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (z >> 29)
    }
}

pub type OidMap<V> = HashMap<ObjectId, V, BuildHasherDefault<OidHasher>>;

/// Journal data that is newer than the object's block.
#[derive(Clone, Debug)]
pub struct Overlay {
    pub offset: u32,
    pub len: u32,
    /// Logical journal position of the data.
    pub data_pos: u64,
    pub version: u64,
    /// crc32c of each 4 KiB of the overlay's own data.
    pub csums: Box<[u32]>,
    /// The data itself while it fits the overlay cache: its fold then
    /// needs no journal read, and neither does a read of it.
    pub data: Option<Rc<AlignedBuf>>,
}

#[derive(Debug, Default)]
pub struct Pending {
    /// Newest version (the block entry holds the version of its content).
    pub version: u64,
    /// Oldest first.
    pub overlays: Vec<Overlay>,
}

pub struct Index {
    pub blocks: Vec<BlockEntry>,
    by_oid: OidTable,
    pub pending: OidMap<Pending>,
    /// Object-table pages changed since the last checkpoint copied them.
    dirty_pages: Vec<u64>,
    /// Bytes of overlay data held in memory.
    pub overlay_data_bytes: u64,
}

impl Index {
    pub fn new(g: &Geometry) -> Self {
        Index {
            blocks: vec![BlockEntry::default(); g.nblocks as usize],
            by_oid: OidTable::new(g.nblocks),
            pending: OidMap::default(),
            dirty_pages: vec![0; (g.objtab_pages as usize).div_ceil(64)],
            overlay_data_bytes: 0,
        }
    }

    /// Adds journal data newer than the object's block.
    pub fn add_overlay(&mut self, oid: ObjectId, version: u64, o: Overlay) {
        if o.data.is_some() {
            self.overlay_data_bytes += u64::from(o.len);
        }
        let p = self.pending.entry(oid).or_default();
        p.version = version;
        p.overlays.push(o);
    }

    /// Forgets the object's overlays (its block was replaced or deleted).
    pub fn drop_pending(&mut self, oid: &ObjectId) {
        if let Some(p) = self.pending.remove(oid) {
            self.overlay_data_bytes -= cached_bytes(&p.overlays);
        }
    }

    /// Lets go of the in-memory data of `oid`'s overlay at journal
    /// position `data_pos` (a fold of it would then read the journal).
    pub fn uncache_overlay(&mut self, oid: &ObjectId, data_pos: u64) {
        let Some(p) = self.pending.get_mut(oid) else {
            return;
        };
        for o in p.overlays.iter_mut().filter(|o| o.data_pos == data_pos) {
            if o.data.take().is_some() {
                self.overlay_data_bytes -= u64::from(o.len);
            }
        }
    }

    /// Keeps only the overlays `keep` accepts; returns how many went.
    pub fn retain_overlays(&mut self, oid: &ObjectId, keep: impl Fn(&Overlay) -> bool) -> usize {
        let Some(p) = self.pending.get_mut(oid) else {
            return 0;
        };
        let before = (p.overlays.len(), cached_bytes(&p.overlays));
        p.overlays.retain(|o| keep(o));
        let after = (p.overlays.len(), cached_bytes(&p.overlays));
        self.overlay_data_bytes -= before.1 - after.1;
        if p.overlays.is_empty() {
            self.pending.remove(oid);
        }
        before.0 - after.0
    }

    pub fn object_count(&self) -> usize {
        self.by_oid.len()
    }

    pub fn block_of(&self, oid: &ObjectId) -> Option<u32> {
        self.by_oid.get(oid, &self.blocks)
    }

    /// The object's newest version, if it exists.
    pub fn version(&self, oid: &ObjectId) -> Option<u64> {
        if let Some(p) = self.pending.get(oid) {
            return Some(p.version);
        }
        self.block_of(oid)
            .map(|b| self.blocks[b as usize].version.get())
    }

    fn dirty(&mut self, block: u32) {
        let p = Geometry::obj_page_of(block) as usize;
        self.dirty_pages[p / 64] |= 1 << (p % 64);
    }

    /// Points `oid` at `block` (which must be free in the table).
    pub fn set_block(&mut self, oid: ObjectId, block: u32, version: u64) {
        crate::strict_assert!(
            self.blocks[block as usize].is_free(),
            "block {block} in use"
        );
        crate::strict_assert!(
            self.block_of(&oid).is_none(),
            "object {oid} already has a block"
        );
        self.blocks[block as usize] = BlockEntry::new(oid, version);
        self.by_oid.insert(&oid, block);
        self.dirty(block);
    }

    /// Records that `block` now holds content of `version`.
    pub fn set_version(&mut self, block: u32, version: u64) {
        self.blocks[block as usize].version = version.into();
        self.dirty(block);
    }

    /// Detaches `oid` from its block; returns the block.
    pub fn clear_block(&mut self, oid: &ObjectId) -> Option<u32> {
        let block = self.by_oid.remove(oid, &self.blocks)?;
        self.blocks[block as usize] = BlockEntry::default();
        self.dirty(block);
        Some(block)
    }

    /// Calls `f` with every object (in no order; nothing is collected).
    pub fn for_each(&self, mut f: impl FnMut(ObjectId)) {
        for b in self.by_oid.iter() {
            f(self.blocks[b as usize].oid());
        }
    }

    /// Every object `keep` accepts, with its newest version, sorted.
    pub fn list(&self, keep: impl Fn(&ObjectId) -> bool) -> Vec<(ObjectId, u64)> {
        let mut out: Vec<(ObjectId, u64)> = self
            .by_oid
            .iter()
            .filter_map(|b| {
                let e = &self.blocks[b as usize];
                let oid = e.oid();
                if !keep(&oid) {
                    return None;
                }
                let v = self
                    .pending
                    .get(&oid)
                    .map_or(e.version.get(), |p| p.version);
                Some((oid, v))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Takes the set of dirty object-table pages (clearing it).
    pub fn take_dirty_pages(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        for (w, word) in self.dirty_pages.iter_mut().enumerate() {
            let mut bits = std::mem::take(word);
            while bits != 0 {
                out.push((w * 64) as u32 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        out
    }

    pub fn mark_page_dirty(&mut self, page: u32) {
        self.dirty_pages[page as usize / 64] |= 1 << (page % 64);
    }

    /// Bytes of RAM the index uses (table, hash slots, pending entries).
    pub fn memory_bytes(&self) -> u64 {
        let table = self.blocks.capacity() * std::mem::size_of::<BlockEntry>();
        let hash = self.by_oid.memory_bytes();
        let pending: usize = self
            .pending
            .values()
            .map(|p| {
                64 + p.overlays.capacity() * std::mem::size_of::<Overlay>()
                    + p.overlays.iter().map(|o| o.csums.len() * 4).sum::<usize>()
            })
            .sum();
        (table + hash + pending + self.dirty_pages.len() * 8) as u64
    }

    /// Bytes of small-write data held for folding (bounded by the cache).
    pub fn overlay_cache_bytes(&self) -> u64 {
        self.overlay_data_bytes
    }
}

fn cached_bytes(ovs: &[Overlay]) -> u64 {
    ovs.iter()
        .filter(|o| o.data.is_some())
        .map(|o| u64::from(o.len))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_move_clear() {
        let g = Geometry::plan(
            [0; 16],
            64 << 20,
            4096,
            512,
            Some(4 << 20),
            crate::LogRegion::DEFAULT,
        )
        .unwrap();
        let mut ix = Index::new(&g);
        let a = ObjectId::new(1, 1);
        ix.set_block(a, 7, 3);
        assert_eq!(ix.block_of(&a), Some(7));
        assert_eq!(ix.version(&a), Some(3));
        assert_eq!(ix.take_dirty_pages(), vec![0]);
        assert_eq!(ix.clear_block(&a), Some(7));
        assert!(ix.blocks[7].is_free());
        ix.set_block(a, 400, 4);
        assert_eq!(ix.list(|_| true), vec![(a, 4)]);
        assert_eq!(ix.take_dirty_pages(), vec![0, 2]);
        for i in 0..1000 {
            ix.set_block(ObjectId::new(2, i), 1000 + i as u32, 1);
        }
        assert_eq!(ix.object_count(), 1001);
        assert_eq!(ix.block_of(&ObjectId::new(2, 999)), Some(1999));
    }
}
