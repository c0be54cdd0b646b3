//! The checksum table in memory: a bounded cache of its 4 KiB pages plus the
//! checksums changed since the last checkpoint.
//!
//! Checksums live on disk (one crc32c per 4 KiB of data, 0.1% of the data
//! size), not all in RAM: a page is loaded on first use, verified against
//! the crc in the checkpoint's page table, and evicted when the cache is
//! full. Changes go to `delta` first (so applying a write never waits for a
//! page load); the checkpointer merges them into pages, which stay pinned
//! until written.

use std::collections::{HashMap, VecDeque};

use nacre_io::AlignedBuf;

use crate::format::{Geometry, PageMeta, CSUMS_PER_PAGE, PAGE_BYTES};

struct Page {
    csums: Box<[u32]>,
    /// Holds changes no checkpoint has taken yet.
    dirty: bool,
    /// Taken by a checkpoint that has not committed: the disk copy the
    /// committed checkpoint points at is older than this page.
    pinned: bool,
}

pub struct CsumTable {
    spb: usize,
    delta: HashMap<u32, Box<[u32]>>,
    pages: HashMap<u32, Page>,
    clean_fifo: VecDeque<u32>,
    clean_pages_max: usize,
    /// Where each page's current copy is, as of the committed checkpoint.
    pub metas: Vec<PageMeta>,
}

impl CsumTable {
    pub fn new(g: &Geometry, cache_bytes: u64, metas: Vec<PageMeta>) -> Self {
        CsumTable {
            spb: g.csums_per_block() as usize,
            delta: HashMap::new(),
            pages: HashMap::new(),
            clean_fifo: VecDeque::new(),
            clean_pages_max: (cache_bytes / PAGE_BYTES).max(16) as usize,
            metas,
        }
    }

    /// Copies `block`'s checksums into `out` if they are in memory.
    pub fn get(&self, g: &Geometry, block: u32, out: &mut Vec<u32>) -> bool {
        out.clear();
        if let Some(d) = self.delta.get(&block) {
            out.extend_from_slice(d);
            return true;
        }
        let (page, at) = g.csum_page_of(block);
        match self.pages.get(&page) {
            Some(p) => {
                out.extend_from_slice(&p.csums[at..at + self.spb]);
                true
            }
            None => false,
        }
    }

    pub fn has_page(&self, page: u32) -> bool {
        self.pages.contains_key(&page)
    }

    /// Records new checksums for a block.
    pub fn set(&mut self, block: u32, csums: Box<[u32]>) {
        crate::strict_assert!(csums.len() == self.spb);
        self.delta.insert(block, csums);
    }

    /// Adds a page read from disk (a page already cached wins: it may hold
    /// merged changes the disk copy lacks).
    pub fn insert_page(&mut self, page: u32, bytes: &[u8]) {
        if self.pages.contains_key(&page) {
            return;
        }
        let csums: Box<[u32]> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        crate::strict_assert!(csums.len() == CSUMS_PER_PAGE as usize);
        self.pages.insert(
            page,
            Page {
                csums,
                dirty: false,
                pinned: false,
            },
        );
        self.clean_fifo.push_back(page);
        while self.clean_fifo.len() > self.clean_pages_max {
            let Some(victim) = self.clean_fifo.pop_front() else {
                break;
            };
            if self
                .pages
                .get(&victim)
                .is_some_and(|p| !p.dirty && !p.pinned)
            {
                self.pages.remove(&victim);
            }
        }
    }

    /// Blocks with checksums not yet merged into a page.
    pub fn delta_blocks(&self) -> Vec<u32> {
        self.delta.keys().copied().collect()
    }

    /// Moves `block`'s pending checksums into its (cached) page.
    pub fn merge(&mut self, g: &Geometry, block: u32) {
        let (page, at) = g.csum_page_of(block);
        let Some(p) = self.pages.get_mut(&page) else {
            return;
        };
        if let Some(d) = self.delta.remove(&block) {
            p.csums[at..at + self.spb].copy_from_slice(&d);
            p.dirty = true;
        }
    }

    /// Dirty pages, for a checkpoint to write; they stay pinned in memory
    /// until [`CsumTable::commit`].
    pub fn take_dirty(&mut self) -> Vec<(u32, AlignedBuf)> {
        let mut out = Vec::new();
        for (&n, p) in self.pages.iter_mut().filter(|(_, p)| p.dirty) {
            let mut buf = AlignedBuf::new(PAGE_BYTES as usize);
            for (dst, c) in buf.chunks_exact_mut(4).zip(p.csums.iter()) {
                dst.copy_from_slice(&c.to_le_bytes());
            }
            p.dirty = false;
            p.pinned = true;
            out.push((n, buf));
        }
        out
    }

    /// The checkpoint that took `pages` committed with `metas`.
    pub fn commit(&mut self, metas: Vec<PageMeta>, pages: &[u32]) {
        self.metas = metas;
        for n in pages {
            if let Some(p) = self.pages.get_mut(n) {
                p.pinned = false;
                self.clean_fifo.push_back(*n);
            }
        }
    }

    pub fn memory_bytes(&self) -> u64 {
        let pages = self.pages.len() * (PAGE_BYTES as usize + 48);
        let delta = self.delta.len() * (self.spb * 4 + 48);
        (pages + delta + self.metas.len() * 8) as u64
    }
}
