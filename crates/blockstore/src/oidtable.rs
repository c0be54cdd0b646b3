//! Object id → data block, in 4 bytes per slot.
//!
//! An open-addressing table of block numbers with linear probing, sized
//! once at open for every data block (objects never outnumber blocks), so
//! it never grows and stays at most 80% full. The key of a slot is the
//! object id in the object table entry it points at, so the table itself
//! holds nothing but block numbers. Deletion shifts later entries back
//! (no tombstones), so probe sequences stay short after any history.

use nacre_types::ObjectId;

use crate::format::BlockEntry;

const EMPTY: u32 = u32::MAX;

pub struct OidTable {
    slots: Vec<u32>,
    len: usize,
}

pub fn hash_oid(oid: &ObjectId) -> u64 {
    let mut z = oid.volume.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ oid.block;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl OidTable {
    /// A table for up to `nblocks` objects.
    pub fn new(nblocks: u32) -> Self {
        let n = (nblocks as usize + nblocks as usize / 4 + 1).max(8);
        OidTable {
            slots: vec![EMPTY; n],
            len: 0,
        }
    }

    fn home(&self, oid: &ObjectId) -> usize {
        ((u128::from(hash_oid(oid)) * self.slots.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    fn slot_of(&self, oid: &ObjectId, blocks: &[BlockEntry]) -> Option<usize> {
        let mut i = self.home(oid);
        loop {
            match self.slots[i] {
                EMPTY => return None,
                b if blocks[b as usize].oid() == *oid => return Some(i),
                _ => i = self.next(i),
            }
        }
    }

    pub fn get(&self, oid: &ObjectId, blocks: &[BlockEntry]) -> Option<u32> {
        self.slot_of(oid, blocks).map(|i| self.slots[i])
    }

    /// Adds `oid` → `block`; `blocks[block]` must already name `oid`, and
    /// `oid` must not be in the table.
    pub fn insert(&mut self, oid: &ObjectId, block: u32) {
        assert!(
            self.len < self.slots.len() - 1,
            "object table over capacity"
        );
        let mut i = self.home(oid);
        while self.slots[i] != EMPTY {
            i = self.next(i);
        }
        self.slots[i] = block;
        self.len += 1;
    }

    /// Removes `oid`, returning its block.
    pub fn remove(&mut self, oid: &ObjectId, blocks: &[BlockEntry]) -> Option<u32> {
        let mut hole = self.slot_of(oid, blocks)?;
        let block = self.slots[hole];
        self.slots[hole] = EMPTY;
        self.len -= 1;
        // Shift back every entry after the hole that may live in it.
        let mut j = self.next(hole);
        while self.slots[j] != EMPTY {
            let home = self.home(&blocks[self.slots[j] as usize].oid());
            // Can the entry at j move to the hole? Only if its home is not
            // cyclically in (hole, j].
            let in_between = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !in_between {
                self.slots[hole] = self.slots[j];
                self.slots[j] = EMPTY;
                hole = j;
            }
            j = self.next(j);
        }
        Some(block)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots.iter().copied().filter(|&b| b != EMPTY)
    }

    pub fn memory_bytes(&self) -> usize {
        self.slots.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in prop::collection::vec((0u64..40, any::<bool>()), 1..400)) {
            let nblocks = 48u32;
            let mut blocks = vec![BlockEntry::default(); nblocks as usize];
            let mut t = OidTable::new(nblocks);
            let mut model: HashMap<ObjectId, u32> = HashMap::new();
            let mut free: Vec<u32> = (0..nblocks).rev().collect();
            for (k, insert) in ops {
                let oid = ObjectId::new(k % 3, k);
                if insert {
                    if model.contains_key(&oid) { continue; }
                    let b = free.pop().unwrap();
                    blocks[b as usize] = BlockEntry::new(oid, 1);
                    t.insert(&oid, b);
                    model.insert(oid, b);
                } else {
                    let got = t.remove(&oid, &blocks);
                    prop_assert_eq!(got, model.remove(&oid));
                    if let Some(b) = got {
                        blocks[b as usize] = BlockEntry::default();
                        free.push(b);
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                for (o, b) in &model {
                    prop_assert_eq!(t.get(o, &blocks), Some(*b));
                }
            }
        }
    }
}
