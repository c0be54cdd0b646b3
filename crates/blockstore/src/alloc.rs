//! Data-block allocator: a free bitmap with next-fit scanning, so a stream
//! of full-block writes lands on consecutive blocks.
//!
//! Crash argument: a block freed by a write or delete is not handed out
//! again until a checkpoint that no longer references it has committed
//! (`defer` → `take_deferred` at checkpoint start → `release` at commit).
//! Until then the last checkpoint or the journal may still point at it, and
//! a reader may be reading it.

pub struct Allocator {
    /// One bit per block, 1 = free.
    bits: Vec<u64>,
    nblocks: u32,
    nfree: u32,
    cursor: u32,
    deferred: Vec<u32>,
}

impl Allocator {
    /// An allocator where every block is in use.
    pub fn all_used(nblocks: u32) -> Self {
        Allocator {
            bits: vec![0; (nblocks as usize).div_ceil(64)],
            nblocks,
            nfree: 0,
            cursor: 0,
            deferred: Vec::new(),
        }
    }

    pub fn is_free(&self, b: u32) -> bool {
        self.bits[(b / 64) as usize] & (1 << (b % 64)) != 0
    }

    pub fn mark_free(&mut self, b: u32) {
        assert!(b < self.nblocks, "block {b} out of range");
        assert!(!self.is_free(b), "block {b} freed twice");
        self.bits[(b / 64) as usize] |= 1 << (b % 64);
        self.nfree += 1;
    }

    pub fn mark_used(&mut self, b: u32) {
        assert!(self.is_free(b), "block {b} allocated twice");
        self.bits[(b / 64) as usize] &= !(1 << (b % 64));
        self.nfree -= 1;
    }

    pub fn free_count(&self) -> u32 {
        self.nfree
    }

    /// Freed blocks waiting for a checkpoint.
    pub fn deferred_count(&self) -> usize {
        self.deferred.len()
    }

    /// The next free block at or after the cursor (wrapping), marked used.
    pub fn alloc(&mut self) -> Option<u32> {
        if self.nfree == 0 {
            return None;
        }
        let words = self.bits.len();
        let start = (self.cursor / 64) as usize;
        for i in 0..=words {
            let w = (start + i) % words;
            let mut word = self.bits[w];
            if i == 0 {
                // Skip bits below the cursor in its own word on the first pass.
                word &= !0u64 << (self.cursor % 64);
            }
            if word != 0 {
                let b = (w * 64) as u32 + word.trailing_zeros();
                if b >= self.nblocks {
                    continue;
                }
                self.mark_used(b);
                self.cursor = (b + 1) % self.nblocks;
                return Some(b);
            }
        }
        // Only bits below the cursor in the first word were free.
        self.cursor = 0;
        self.alloc()
    }

    /// Frees `b` once a later checkpoint commits.
    pub fn defer(&mut self, b: u32) {
        self.deferred.push(b);
    }

    pub fn take_deferred(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.deferred)
    }

    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks {
            self.mark_free(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_in_order_and_wraps() {
        let mut a = Allocator::all_used(130);
        for b in 0..130 {
            a.mark_free(b);
        }
        let got: Vec<u32> = (0..130).map(|_| a.alloc().unwrap()).collect();
        assert_eq!(got, (0..130).collect::<Vec<_>>());
        assert_eq!(a.alloc(), None);
        a.defer(5);
        a.defer(129);
        assert_eq!(a.alloc(), None, "deferred blocks are not reusable yet");
        let d = a.take_deferred();
        a.release(&d);
        assert_eq!(a.free_count(), 2);
        assert_eq!(a.alloc(), Some(5));
        assert_eq!(a.alloc(), Some(129));
    }

    #[test]
    #[should_panic(expected = "freed twice")]
    fn double_free_is_a_bug() {
        let mut a = Allocator::all_used(8);
        a.mark_free(3);
        a.mark_free(3);
    }
}
