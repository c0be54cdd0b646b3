//! A fault-injecting in-memory device for crash and error tests.
//!
//! It keeps two images: what a reader sees now, and what would survive a
//! power cut (everything written before the last completed `sync`).
//! [`FaultDev::power_cut`] decides the fate of every write since that sync —
//! lost, kept, or torn at a sector boundary — and returns a new device
//! holding what a restarted machine would find. It can also fail chosen
//! ranges with EIO, add latency to every op, and flip bits.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::time::Duration;

use crate::buf::AlignedBuf;
use crate::dev::{check_range, total_len, BlockDev};
use crate::rt;

/// Granularity at which a power cut can tear a write.
pub const TEAR_SECTOR_BYTES: usize = 512;

#[derive(Clone, Copy, Debug)]
struct EioRange {
    offset: u64,
    len: u64,
    reads: bool,
    writes: bool,
}

struct State {
    now: RefCell<Vec<u8>>,
    durable: RefCell<Vec<u8>>,
    unsynced: RefCell<Vec<(u64, Vec<u8>)>>,
    eio: RefCell<Vec<EioRange>>,
    latency: Cell<Option<Duration>>,
    /// Each small write this long, served by a fixed number of servers
    /// (`set_small_write_time`): when each server's write ends.
    small_write_time: Cell<Option<Duration>>,
    busy_until: RefCell<Vec<Duration>>,
    yields: Cell<u32>,
    dead: Cell<bool>,
    align: u32,
    syncs: Cell<u64>,
}

/// What a power cut did to the writes that were not yet synced.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CutReport {
    pub lost: usize,
    pub kept: usize,
    pub torn: usize,
}

#[derive(Clone)]
pub struct FaultDev(Rc<State>);

pub use nacre_types::SplitMix;

impl FaultDev {
    pub fn new(size_bytes: u64, align: u32) -> Self {
        Self::from_image(vec![0; size_bytes as usize], align)
    }

    fn from_image(image: Vec<u8>, align: u32) -> Self {
        FaultDev(Rc::new(State {
            now: RefCell::new(image.clone()),
            durable: RefCell::new(image),
            unsynced: RefCell::new(Vec::new()),
            eio: RefCell::new(Vec::new()),
            latency: Cell::new(None),
            small_write_time: Cell::new(None),
            busy_until: RefCell::new(Vec::new()),
            yields: Cell::new(0),
            dead: Cell::new(false),
            align,
            syncs: Cell::new(0),
        }))
    }

    /// Cuts the power: this device fails every later op with EIO, and the
    /// returned device holds what survived. Each unsynced write is lost,
    /// kept, or torn (only a prefix of its sectors reaches the disk).
    pub fn power_cut(&self, seed: u64) -> (FaultDev, CutReport) {
        let mut rng = SplitMix(seed);
        let mut image = self.0.durable.borrow().clone();
        let mut report = CutReport::default();
        for (off, data) in self.0.unsynced.borrow().iter() {
            let o = *off as usize;
            match rng.below(3) {
                0 => report.lost += 1,
                1 => {
                    image[o..o + data.len()].copy_from_slice(data);
                    report.kept += 1;
                }
                _ => {
                    let sectors = data.len() / TEAR_SECTOR_BYTES;
                    let keep = rng.below(sectors as u64 + 1) as usize * TEAR_SECTOR_BYTES;
                    image[o..o + keep].copy_from_slice(&data[..keep]);
                    report.torn += 1;
                }
            }
        }
        self.0.dead.set(true);
        (FaultDev::from_image(image, self.0.align), report)
    }

    /// Kills the process (`kill -9`), not the machine: this device fails
    /// every later op with EIO, and the returned device reads every write
    /// that completed, synced or not (the page cache survives). What was
    /// not synced is still not durable there: a later power cut decides
    /// its fate. Writes still in flight never land.
    pub fn kill(&self) -> FaultDev {
        self.0.dead.set(true);
        let d = FaultDev::from_image(self.0.now.borrow().clone(), self.0.align);
        *d.0.durable.borrow_mut() = self.0.durable.borrow().clone();
        *d.0.unsynced.borrow_mut() = self.0.unsynced.borrow().clone();
        d
    }

    /// A second device holding what this one holds (durable or not), to
    /// try two fates of one disk; this one goes on untouched.
    pub fn fork(&self) -> FaultDev {
        let d = FaultDev::from_image(self.0.now.borrow().clone(), self.0.align);
        *d.0.durable.borrow_mut() = self.0.durable.borrow().clone();
        *d.0.unsynced.borrow_mut() = self.0.unsynced.borrow().clone();
        d
    }

    /// Fails reads and/or writes that touch `[offset, offset + len)` with EIO.
    pub fn fail_range(&self, offset: u64, len: u64, reads: bool, writes: bool) {
        self.0.eio.borrow_mut().push(EioRange {
            offset,
            len,
            reads,
            writes,
        });
    }

    pub fn clear_failures(&self) {
        self.0.eio.borrow_mut().clear();
    }

    /// Delays every op by `d` (a runtime timer, so other tasks keep running).
    pub fn set_latency(&self, d: Option<Duration>) {
        self.0.latency.set(d);
    }

    /// Makes every write of at most 4 KiB take `d` (a runtime timer),
    /// at most `servers` of them at once, the others waiting in arrival
    /// order; larger writes, reads and syncs are not slowed. A device on
    /// which small random writes are the bottleneck (a disk's seeks, a
    /// flash device's read-modify-write, a hybrid OSD's slow data device)
    /// while large sequential writes stream.
    pub fn set_small_write_time(&self, d: Option<Duration>, servers: usize) {
        self.0.small_write_time.set(d);
        *self.0.busy_until.borrow_mut() = vec![Duration::ZERO; servers.max(1)];
    }

    /// Makes every op give way to other tasks `n` times before it runs:
    /// concurrent ops interleave, deterministically and without wall time.
    pub fn set_yields(&self, n: u32) {
        self.0.yields.set(n);
    }

    /// XORs `mask` into the byte at `offset`, now and in the durable image:
    /// media corruption that no write caused.
    pub fn flip(&self, offset: u64, mask: u8) {
        self.0.now.borrow_mut()[offset as usize] ^= mask;
        self.0.durable.borrow_mut()[offset as usize] ^= mask;
    }

    /// A copy of the bytes a reader sees now.
    pub fn snapshot(&self, offset: u64, len: usize) -> Vec<u8> {
        self.0.now.borrow()[offset as usize..offset as usize + len].to_vec()
    }

    pub fn sync_count(&self) -> u64 {
        self.0.syncs.get()
    }

    async fn delay(&self) {
        if let Some(d) = self.0.latency.get() {
            rt::sleep(d).await;
        }
        for _ in 0..self.0.yields.get() {
            rt::yield_now().await;
        }
    }

    async fn small_write_delay(&self, len: u64) {
        if len > 4096 {
            return;
        }
        if let Some(d) = self.0.small_write_time.get() {
            let now = rt::monotonic();
            let done = {
                let mut busy = self.0.busy_until.borrow_mut();
                let first_free = busy.iter_mut().min().expect("at least one server");
                *first_free = (*first_free).max(now) + d;
                *first_free
            };
            rt::sleep(done - now).await;
        }
    }

    async fn gate(&self, offset: u64, len: u64, write: bool) -> io::Result<()> {
        self.delay().await;
        if write {
            self.small_write_delay(len).await;
        }
        if self.0.dead.get() {
            return Err(io::Error::other("device lost power"));
        }
        check_range(self.size_bytes(), self.0.align, offset, len)?;
        let hit = self.0.eio.borrow().iter().any(|r| {
            (if write { r.writes } else { r.reads })
                && offset < r.offset + r.len
                && r.offset < offset + len
        });
        if hit {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    fn apply(&self, offset: u64, data: &[u8]) {
        let o = offset as usize;
        self.0.now.borrow_mut()[o..o + data.len()].copy_from_slice(data);
        self.0.unsynced.borrow_mut().push((offset, data.to_vec()));
    }
}

impl BlockDev for FaultDev {
    fn size_bytes(&self) -> u64 {
        self.0.now.borrow().len() as u64
    }
    fn align_bytes(&self) -> u32 {
        self.0.align
    }
    async fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        self.gate(offset, buf.len() as u64, false).await?;
        let o = offset as usize;
        let n = buf.len();
        buf.copy_from_slice(&self.0.now.borrow()[o..o + n]);
        Ok(buf)
    }
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        self.gate(offset, buf.len() as u64, true).await?;
        self.apply(offset, &buf);
        Ok(buf)
    }
    async fn writev_at(&self, bufs: Vec<AlignedBuf>, offset: u64) -> io::Result<Vec<AlignedBuf>> {
        self.gate(offset, total_len(&bufs), true).await?;
        // One request, so one unit for tearing: a prefix of it may survive.
        let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        self.apply(offset, &joined);
        Ok(bufs)
    }
    async fn sync(&self) -> io::Result<()> {
        self.delay().await;
        if self.0.dead.get() {
            return Err(io::Error::other("device lost power"));
        }
        let pending = std::mem::take(&mut *self.0.unsynced.borrow_mut());
        let mut durable = self.0.durable.borrow_mut();
        for (off, data) in pending {
            durable[off as usize..off as usize + data.len()].copy_from_slice(&data);
        }
        self.0.syncs.set(self.0.syncs.get() + 1);
        Ok(())
    }
    async fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.gate(offset, len, true).await?;
        // A discarded range reads back as zeros, and it is not durable
        // until the next sync, like any other write.
        self.apply(offset, &vec![0; len as usize]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_cut_keeps_synced_and_decides_unsynced() {
        rt::block_on(async {
            let d = FaultDev::new(1 << 16, 512);
            d.write_at(AlignedBuf::from_slice(&[1; 4096]), 0)
                .await
                .unwrap();
            d.sync().await.unwrap();
            for i in 1..16u64 {
                d.write_at(AlignedBuf::from_slice(&[2; 4096]), i * 4096)
                    .await
                    .unwrap();
            }
            let (after, rep) = d.power_cut(42);
            assert_eq!(rep.lost + rep.kept + rep.torn, 15);
            assert!(
                d.read_at(AlignedBuf::new(512), 0).await.is_err(),
                "old device is dead"
            );
            let r = after.read_at(AlignedBuf::new(4096), 0).await.unwrap();
            assert!(r.iter().all(|&b| b == 1), "synced data survives");
            for i in 1..16u64 {
                let r = after
                    .read_at(AlignedBuf::new(4096), i * 4096)
                    .await
                    .unwrap();
                // A torn write leaves a prefix of new sectors, then old ones.
                let first_old = r.iter().position(|&b| b == 0).unwrap_or(4096);
                assert_eq!(first_old % TEAR_SECTOR_BYTES, 0);
                assert!(r[first_old..].iter().all(|&b| b == 0));
                assert!(r[..first_old].iter().all(|&b| b == 2));
            }
        });
    }

    #[test]
    fn eio_ranges_and_latency() {
        rt::block_on(async {
            let d = FaultDev::new(1 << 16, 512);
            d.fail_range(8192, 512, true, false);
            assert!(d.read_at(AlignedBuf::new(4096), 8192).await.is_err());
            assert!(d.write_at(AlignedBuf::new(4096), 8192).await.is_ok());
            assert!(d.read_at(AlignedBuf::new(4096), 0).await.is_ok());
            d.clear_failures();
            d.set_latency(Some(Duration::from_millis(2)));
            let t = std::time::Instant::now();
            d.read_at(AlignedBuf::new(4096), 8192).await.unwrap();
            assert!(t.elapsed() >= Duration::from_millis(2));
        });
    }
}
