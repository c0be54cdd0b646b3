//! An in-memory device: for tests and for measuring the store's CPU cost
//! without a disk. `sync` is free and nothing survives the process.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;

use crate::buf::AlignedBuf;
use crate::dev::{check_range, total_len, BlockDev};

#[derive(Clone)]
pub struct MemDev {
    data: Rc<RefCell<Vec<u8>>>,
    align: u32,
}

impl MemDev {
    pub fn new(size_bytes: u64, align: u32) -> Self {
        MemDev {
            data: Rc::new(RefCell::new(vec![0; size_bytes as usize])),
            align,
        }
    }
}

impl BlockDev for MemDev {
    fn size_bytes(&self) -> u64 {
        self.data.borrow().len() as u64
    }
    fn align_bytes(&self) -> u32 {
        self.align
    }
    async fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        check_range(self.size_bytes(), self.align, offset, buf.len() as u64)?;
        let o = offset as usize;
        let n = buf.len();
        buf.copy_from_slice(&self.data.borrow()[o..o + n]);
        Ok(buf)
    }
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        check_range(self.size_bytes(), self.align, offset, buf.len() as u64)?;
        let o = offset as usize;
        self.data.borrow_mut()[o..o + buf.len()].copy_from_slice(&buf);
        Ok(buf)
    }
    async fn writev_at(&self, bufs: Vec<AlignedBuf>, offset: u64) -> io::Result<Vec<AlignedBuf>> {
        check_range(self.size_bytes(), self.align, offset, total_len(&bufs))?;
        let mut o = offset as usize;
        let mut d = self.data.borrow_mut();
        for b in &bufs {
            d[o..o + b.len()].copy_from_slice(b);
            o += b.len();
        }
        Ok(bufs)
    }
    async fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    async fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes(), self.align, offset, len)?;
        let o = offset as usize;
        self.data.borrow_mut()[o..o + len as usize].fill(0);
        Ok(())
    }
}
