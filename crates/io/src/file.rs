//! Devices backed by a file or a raw block device, opened with O_DIRECT.
//!
//! [`FileDev::open`] picks the io_uring backend when the runtime has a ring
//! and plain pread/pwrite otherwise (and logs that it fell back). Both go
//! around the page cache, so what the store measures is what the disk does.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use io_uring::{opcode, types};

use crate::buf::{AlignedBuf, SharedBuf};
use crate::dev::{check_range, total_len, BlockDev};
use crate::rt::{self, Resources};

/// How to open a device.
#[derive(Clone, Debug)]
pub struct OpenFlags {
    /// Create the file if missing and grow it to this size (ignored for
    /// block devices).
    pub create_bytes: Option<u64>,
    /// Bypass the page cache (O_DIRECT). Off only for file systems that
    /// refuse it (tmpfs); measurements are then meaningless.
    pub direct: bool,
    /// Use pread/pwrite even when io_uring is available.
    pub force_pread: bool,
    /// With `create_bytes`: the file must not exist yet, and the last part
    /// of the path must not be a symlink (O_EXCL, O_NOFOLLOW).
    pub create_new: bool,
    /// A block device only: refuse it while the kernel has it open
    /// exclusively — mounted, a swap area, an active LVM or md member
    /// (O_EXCL).
    pub exclusive_device: bool,
}

impl Default for OpenFlags {
    fn default() -> Self {
        OpenFlags {
            create_bytes: None,
            direct: true,
            force_pread: false,
            create_new: false,
            exclusive_device: false,
        }
    }
}

/// A file or block device, through io_uring or pread/pwrite.
pub struct FileDev {
    file: File,
    size: u64,
    align: u32,
    uring: bool,
    is_block: bool,
}

fn dio_align(file: &File, is_block: bool) -> u32 {
    let fd = file.as_raw_fd();
    if is_block {
        let mut ssz: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int.
        if unsafe { libc::ioctl(fd, libc::BLKSSZGET, &mut ssz) } == 0 && ssz > 0 {
            return ssz as u32;
        }
        return 4096;
    }
    // SAFETY: statx fills the struct we pass; the path is empty with AT_EMPTY_PATH.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0 {
        stx.stx_dio_offset_align.max(stx.stx_dio_mem_align).max(512)
    } else {
        4096
    }
}

fn block_dev_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// How long a lock held by a process that no longer exists may take to go:
/// after `kill -9` the kernel closes a dead process's files only once its
/// io_uring has finished the I/O it had in flight.
const LOCK_DEAD_HOLDER_WAIT_MS: u64 = 10_000;
const LOCK_RETRY_MS: u64 = 20;

/// Takes an exclusive `flock` on `file`. Held by a live process: an error
/// naming it, at once. Held by a process that has died (its io_uring still
/// tearing down) or by one we cannot identify: waits up to
/// `LOCK_DEAD_HOLDER_WAIT_MS` for the kernel to release it.
fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    let t0 = std::time::Instant::now();
    loop {
        // SAFETY: flock on our own fd.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())));
        }
        let holder = file.metadata().ok().and_then(|m| flock_holder(m.ino()));
        let live = holder.filter(|&pid| process_alive(pid));
        if live.is_some() || t0.elapsed().as_millis() as u64 >= LOCK_DEAD_HOLDER_WAIT_MS {
            let who = match live.or(holder) {
                Some(pid) => format!("in use by another process (pid {pid})"),
                None => "in use by another process".to_string(),
            };
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{}: {who}", path.display()),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(LOCK_RETRY_MS));
    }
}

/// The pid `/proc/locks` names for an flock on inode `ino`, if any.
fn flock_holder(ino: u64) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 4242 08:01:123456 0 EOF"
        let f: Vec<&str> = l.split_whitespace().collect();
        let inode = f.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
        (f.get(1) == Some(&"FLOCK") && inode == ino).then(|| f.get(4)?.parse().ok())?
    })
}

/// Whether `pid` is a process that still runs (not gone, not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

impl FileDev {
    /// Opens `path`; must be called inside [`rt::block_on`].
    pub fn open(path: &Path, flags: &OpenFlags) -> io::Result<FileDev> {
        let mut oo = OpenOptions::new();
        oo.read(true).write(true);
        if flags.create_bytes.is_some() {
            if flags.create_new {
                oo.create_new(true);
            } else {
                oo.create(true);
            }
        }
        let mut custom = 0;
        if flags.direct {
            custom |= libc::O_DIRECT;
        }
        if flags.create_new {
            custom |= libc::O_NOFOLLOW;
        }
        if flags.exclusive_device && is_block_device(path) {
            custom |= libc::O_EXCL;
        }
        oo.custom_flags(custom);
        let file = oo
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
        // One user at a time: a second store (or benchmark) on the same
        // file would overwrite the first one's data under it.
        lock_exclusive(&file, path)?;
        let meta = file.metadata()?;
        let is_block = meta.file_type().is_block_device();
        let size = if is_block {
            block_dev_size(&file)?
        } else {
            if let Some(want) = flags.create_bytes {
                if meta.len() < want {
                    file.set_len(want)?;
                }
            }
            file.metadata()?.len()
        };
        let align = if flags.direct {
            dio_align(&file, is_block)
        } else {
            512
        };
        let uring = rt::has_uring() && !flags.force_pread;
        if !uring {
            tracing::info!("{}: using pread/pwrite (no io_uring)", path.display());
        }
        Ok(FileDev {
            file,
            size: size / u64::from(align) * u64::from(align),
            align,
            uring,
            is_block,
        })
    }

    pub fn uses_uring(&self) -> bool {
        self.uring
    }

    fn fd(&self) -> types::Fd {
        types::Fd(self.file.as_raw_fd())
    }

    /// Writes `buf` at `offset`, durable when it completes (RWF_DSYNC: on
    /// a device with a volatile cache, a FUA write or a flush after it).
    pub async fn write_dsync_at(&self, buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        check_range(self.size, self.align, offset, buf.len() as u64)?;
        if self.uring {
            return self.uring_op(buf, offset, true, libc::RWF_DSYNC).await;
        }
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: one iovec over the buffer, which outlives the call.
        let n = unsafe {
            libc::pwritev2(
                self.file.as_raw_fd(),
                &iov,
                1,
                offset as libc::off_t,
                libc::RWF_DSYNC,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != buf.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
        }
        Ok(buf)
    }

    async fn uring_rw(&self, buf: AlignedBuf, offset: u64, write: bool) -> io::Result<AlignedBuf> {
        self.uring_op(buf, offset, write, 0).await
    }

    async fn uring_op(
        &self,
        mut buf: AlignedBuf,
        offset: u64,
        write: bool,
        rw_flags: i32,
    ) -> io::Result<AlignedBuf> {
        let len = buf.len();
        let mut done = 0usize;
        while done < len {
            // SAFETY: pointer stays inside the buffer, which the op owns.
            let ptr = unsafe { buf.as_mut_ptr().add(done) };
            let n = (len - done) as u32;
            let pos = offset + done as u64;
            let entry = if write {
                opcode::Write::new(self.fd(), ptr, n)
                    .offset(pos)
                    .rw_flags(rw_flags)
                    .build()
            } else {
                opcode::Read::new(self.fd(), ptr, n).offset(pos).build()
            };
            let (res, r) = rt::submit(entry, Resources::Buf(buf)).await;
            buf = match r {
                Resources::Buf(b) => b,
                _ => unreachable!("op returned other resources"),
            };
            if res < 0 {
                return Err(io::Error::from_raw_os_error(-res));
            }
            if res == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "short I/O at device end",
                ));
            }
            done += res as usize;
        }
        Ok(buf)
    }
}

impl BlockDev for FileDev {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn align_bytes(&self) -> u32 {
        self.align
    }

    async fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        check_range(self.size, self.align, offset, buf.len() as u64)?;
        if self.uring {
            return self.uring_rw(buf, offset, false).await;
        }
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> io::Result<AlignedBuf> {
        check_range(self.size, self.align, offset, buf.len() as u64)?;
        if self.uring {
            return self.uring_rw(buf, offset, true).await;
        }
        self.file.write_all_at(&buf, offset)?;
        Ok(buf)
    }

    async fn write_shared_at(&self, mut buf: SharedBuf, offset: u64) -> io::Result<()> {
        let len = buf.len();
        check_range(self.size, self.align, offset, len as u64)?;
        if !(buf.as_ptr() as usize).is_multiple_of(self.align as usize) {
            return self.write_at(buf.into_owned(), offset).await.map(drop);
        }
        if !self.uring {
            return self.file.write_all_at(&buf, offset);
        }
        let mut done = 0usize;
        while done < len {
            // SAFETY: the pointer stays inside the buffer, which the op
            // holds (a reference to it) until it completes; nobody writes
            // to a shared buffer.
            let ptr = unsafe { buf.as_ptr().add(done) };
            let entry = opcode::Write::new(self.fd(), ptr, (len - done) as u32)
                .offset(offset + done as u64)
                .build();
            let (res, r) = rt::submit(entry, Resources::Shared(buf)).await;
            let Resources::Shared(b) = r else {
                unreachable!("op returned other resources")
            };
            buf = b;
            if res <= 0 {
                return Err(match res {
                    0 => io::Error::new(io::ErrorKind::WriteZero, "short write at device end"),
                    _ => io::Error::from_raw_os_error(-res),
                });
            }
            done += res as usize;
        }
        Ok(())
    }

    async fn writev_at(&self, bufs: Vec<AlignedBuf>, offset: u64) -> io::Result<Vec<AlignedBuf>> {
        let total = total_len(&bufs);
        check_range(self.size, self.align, offset, total)?;
        if !self.uring {
            let mut o = offset;
            for b in &bufs {
                self.file.write_all_at(b, o)?;
                o += b.len() as u64;
            }
            return Ok(bufs);
        }
        let iov: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let entry = opcode::Writev::new(self.fd(), iov.as_ptr(), iov.len() as u32)
            .offset(offset)
            .build();
        let (res, r) = rt::submit(entry, Resources::Bufs(bufs, iov)).await;
        let bufs = match r {
            Resources::Bufs(b, _) => b,
            _ => unreachable!("op returned other resources"),
        };
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        if res as u64 == total {
            return Ok(bufs);
        }
        // A short gathered write is rare (a signal, a full disk): finish the
        // rest buffer by buffer.
        let mut skip = res as u64;
        let mut o = offset;
        let mut out = Vec::with_capacity(bufs.len());
        for b in bufs {
            let bl = b.len() as u64;
            if skip >= bl {
                skip -= bl;
                o += bl;
                out.push(b);
                continue;
            }
            let mut rest = AlignedBuf::new((bl - skip) as usize);
            rest.copy_from_slice(&b[skip as usize..]);
            self.uring_rw(rest, o + skip, true).await?;
            skip = 0;
            o += bl;
            out.push(b);
        }
        Ok(out)
    }

    async fn sync(&self) -> io::Result<()> {
        if !self.uring {
            return self.file.sync_data();
        }
        let entry = opcode::Fsync::new(self.fd())
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        let (res, _) = rt::submit_on_worker(entry, Resources::None).await;
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        Ok(())
    }

    async fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, self.align, offset, len)?;
        let fd = self.file.as_raw_fd();
        let rc = if self.is_block {
            const BLKDISCARD: libc::c_ulong = 0x1277;
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: plain syscall on our fd.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // Devices and file systems without discard lose nothing by it.
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return Ok(());
            }
            return Err(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new file is created only where nothing (no file, no symlink) has
    /// the name.
    #[test]
    fn create_new_refuses_what_exists() {
        let dir = tempfile::tempdir().unwrap();
        let (file, link) = (dir.path().join("f"), dir.path().join("l"));
        std::fs::write(&file, b"keep").unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
        rt::block_on(async {
            let flags = OpenFlags {
                create_bytes: Some(1 << 20),
                create_new: true,
                ..OpenFlags::default()
            };
            for p in [&file, &link] {
                let e = FileDev::open(p, &flags).err().expect("refused");
                assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
            }
            assert!(!dir.path().join("elsewhere").exists());
            assert_eq!(std::fs::read(&file).unwrap(), b"keep");
            FileDev::open(&dir.path().join("new"), &flags).unwrap();
        });
    }

    fn roundtrip(force_pread: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        rt::block_on(async {
            let flags = OpenFlags {
                create_bytes: Some(1 << 20),
                force_pread,
                ..OpenFlags::default()
            };
            let dev = FileDev::open(&path, &flags).unwrap();
            assert_eq!(dev.uses_uring(), !force_pread);
            assert_eq!(dev.size_bytes(), 1 << 20);
            let mut w = AlignedBuf::new(8192);
            w.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            dev.write_at(w, 4096).await.unwrap();
            let parts = vec![
                AlignedBuf::from_slice(&[7u8; 4096]),
                AlignedBuf::from_slice(&[9u8; 4096]),
            ];
            dev.writev_at(parts, 65536).await.unwrap();
            let d = AlignedBuf::from_slice(&[5u8; 4096]);
            dev.write_dsync_at(d, 8192 * 16).await.unwrap();
            // From a buffer another holder keeps: all of it, an aligned
            // part, a part that is not aligned in memory (written from a
            // copy).
            let mut s = AlignedBuf::new(3 * 4096 + 512);
            s.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i / 7) as u8);
            let s = SharedBuf::new(s);
            let kept = s.clone();
            dev.write_shared_at(s.slice(0..3 * 4096), 1 << 18)
                .await
                .unwrap();
            dev.write_shared_at(s.slice(4096..8192), 1 << 19)
                .await
                .unwrap();
            // Half the device's alignment off: not aligned in memory.
            let off = dev.align_bytes() as usize / 2;
            dev.write_shared_at(s.slice(off..off + 4096), 3 << 18)
                .await
                .unwrap();
            let e = dev.write_shared_at(s.slice(0..100), 0).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            for (at, range) in [
                (1 << 18, 0..3 * 4096),
                (1 << 19, 4096..8192),
                (3 << 18, off..off + 4096),
            ] {
                let r = dev.read_at(AlignedBuf::new(range.len()), at).await.unwrap();
                assert_eq!(&r[..], &kept[range], "shared write at {at}");
            }
            dev.sync().await.unwrap();
            let r = dev.read_at(AlignedBuf::new(4096), 8192 * 16).await.unwrap();
            assert!(r.iter().all(|&b| b == 5));
            let r = dev.read_at(AlignedBuf::new(8192), 4096).await.unwrap();
            assert!(r.iter().enumerate().all(|(i, &b)| b == i as u8));
            let r = dev.read_at(AlignedBuf::new(8192), 65536).await.unwrap();
            assert!(r[..4096].iter().all(|&b| b == 7) && r[4096..].iter().all(|&b| b == 9));
            let e = dev
                .read_at(AlignedBuf::new(4096), 1 << 20)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            let e = dev.write_at(AlignedBuf::new(100), 0).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            dev.discard(65536, 8192).await.unwrap();
            let r = dev.read_at(AlignedBuf::new(8192), 65536).await.unwrap();
            assert!(r.iter().all(|&b| b == 0));
        });
    }

    #[test]
    fn a_file_has_one_user_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        rt::block_on(async {
            let flags = OpenFlags {
                create_bytes: Some(1 << 20),
                ..OpenFlags::default()
            };
            let first = FileDev::open(&path, &flags).unwrap();
            let e = FileDev::open(&path, &flags)
                .err()
                .expect("second open must fail");
            // Held by a live process (this one): refused at once, naming it.
            let me = std::process::id();
            assert!(
                e.to_string()
                    .contains(&format!("in use by another process (pid {me})")),
                "{e}"
            );
            drop(first);
            FileDev::open(&path, &flags).unwrap();
        });
    }

    #[test]
    fn lock_holders_are_found_and_judged() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("l")).unwrap();
        // SAFETY: flock on our own fd.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        let ino = f.metadata().unwrap().ino();
        assert_eq!(flock_holder(ino), Some(std::process::id()));
        assert!(process_alive(std::process::id()));
        // No such process. (Not a child we spawn: a fork would hold the
        // other tests' locked files until its exec.)
        assert!(!process_alive(u32::MAX));
    }

    #[test]
    fn uring_roundtrip() {
        roundtrip(false);
    }

    #[test]
    fn pread_roundtrip() {
        roundtrip(true);
    }
}
