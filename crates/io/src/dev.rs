//! The `BlockDev` trait: what the blockstore needs from a disk.
//!
//! Every offset, length and buffer address is a multiple of
//! [`BlockDev::align_bytes`]; a request that is not, or that reaches past the
//! end, fails with `InvalidInput` before touching the device. Buffers move by
//! ownership (io_uring keeps them until the kernel is done) and come back on
//! success.

use std::io;

use crate::buf::{AlignedBuf, SharedBuf};

#[allow(async_fn_in_trait)] // single-threaded runtime: futures need not be Send
pub trait BlockDev {
    /// Usable size of the device in bytes.
    fn size_bytes(&self) -> u64;
    /// Required alignment of offsets, lengths and buffers (512 or 4096).
    fn align_bytes(&self) -> u32;
    /// Reads exactly `buf.len()` bytes at `offset`.
    async fn read_at(&self, buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf>;
    /// Writes all of `buf` at `offset`. Not durable until [`BlockDev::sync`].
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf>;
    /// [`BlockDev::write_at`] from a buffer others hold too (a payload
    /// also being sent to other copies): a device that can write from it
    /// where it is does; by default, from a copy.
    async fn write_shared_at(&self, buf: SharedBuf, offset: u64) -> io::Result<()> {
        self.write_at(buf.into_owned(), offset).await.map(drop)
    }
    /// Writes the buffers back to back starting at `offset`, as one request.
    async fn writev_at(&self, bufs: Vec<AlignedBuf>, offset: u64) -> io::Result<Vec<AlignedBuf>>;
    /// Makes every write that completed before this call durable.
    async fn sync(&self) -> io::Result<()>;
    /// Tells the device a range no longer holds data (TRIM / hole punch).
    async fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
}

/// Checks that `[offset, offset + len)` is aligned and inside the device.
pub fn check_range(size: u64, align: u32, offset: u64, len: u64) -> io::Result<()> {
    let a = u64::from(align);
    if !offset.is_multiple_of(a) || !len.is_multiple_of(a) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("I/O at {offset}+{len} is not aligned to {align} bytes"),
        ));
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("I/O at {offset}+{len} reaches past the device end {size}"),
        )),
    }
}

/// Total length of a gathered write.
pub fn total_len(bufs: &[AlignedBuf]) -> u64 {
    bufs.iter().map(|b| b.len() as u64).sum()
}

/// A shared device is a device (the store and a benchmark's raw load can
/// use one open file).
impl<D: BlockDev> BlockDev for std::rc::Rc<D> {
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn align_bytes(&self) -> u32 {
        (**self).align_bytes()
    }
    async fn read_at(&self, buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        (**self).read_at(buf, offset).await
    }
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        (**self).write_at(buf, offset).await
    }
    async fn write_shared_at(&self, buf: SharedBuf, offset: u64) -> io::Result<()> {
        (**self).write_shared_at(buf, offset).await
    }
    async fn writev_at(&self, bufs: Vec<AlignedBuf>, offset: u64) -> io::Result<Vec<AlignedBuf>> {
        (**self).writev_at(bufs, offset).await
    }
    async fn sync(&self) -> io::Result<()> {
        (**self).sync().await
    }
    async fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).discard(offset, len).await
    }
}
