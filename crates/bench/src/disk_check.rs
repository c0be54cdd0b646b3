//! `nacre disk check`: the disk tests an operator runs before trusting a
//! device with an OSD (the team's LESSONS, *How storage is benchmarked*):
//! the standard suite (`suite::run`, O_DIRECT: 4 MiB linear write and
//! read at QD16, 4 KiB random writes and reads at QD128 and QD1, the QD1
//! write with an fdatasync after each), then 4 KiB QD1 writes with no
//! flush and with RWF_DSYNC (O_DSYNC per write) back to back. From the
//! QD1 writes it says whether the device behaves as if it has power-loss
//! protection (a durable write barely slower than one with no flush), and
//! from what the kernel and the device report about the volatile write
//! cache it advises the store's `immediate_commit`.
//!
//! Safety, in order:
//! - a directory or a regular file is never written: the tests run on a
//!   scratch file created there (refused if the name exists, even as a
//!   symlink) and unlinked at once, so it vanishes however the check
//!   ends;
//! - a block device is opened once, exclusively (O_EXCL: refused while
//!   mounted, a swap area, an active LVM or md member) and locked (a
//!   running Nacre OSD holds that lock), and every read and write goes
//!   through that one descriptor;
//! - a device whose first 4 MiB or last MiB hold a file system, a
//!   partition table (the backup GPT sits at the end), a Nacre or Ceph
//!   store, or any data at all, is refused unless `destructive`; then what
//!   it held is named and those regions are zeroed before anything else
//!   is written, so no stale signature outlives its data;
//! - the tests write only between those regions: a blank device stays
//!   blank where signatures live, and a second check needs no
//!   `destructive`.
//!
//! Not seen: users that open a device without O_EXCL (a VM on a logical
//! volume, a raw-device database); compressing or deduplicating devices
//! see mostly-zero blocks and report more than they sustain.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use anyhow::{bail, Context};
use nacre_io::{rt, AlignedBuf, BlockDev, FileDev, OpenFlags};
use serde::Serialize;

use crate::load::mix;
use crate::suite::{self, measure, stamp, BlockTarget, FileTarget, SuiteOpts, SuiteResult};

/// The head and tail of a device, read for signatures and never written
/// by the tests.
pub const HEAD_BYTES: u64 = 4 << 20;
pub const TAIL_BYTES: u64 = 1 << 20;
/// The smallest test area worth measuring (a smaller one fits in caches).
pub const AREA_MIN_BYTES: u64 = 64 << 20;
/// The shortest test, and the fewest QD1 writes a verdict is drawn from.
pub const RUNTIME_MIN: Duration = Duration::from_millis(100);
pub const VERDICT_OPS_MIN: u64 = 50;
const LINEAR_BYTES: u64 = 4 << 20;
const SMALL_BYTES: u64 = 4096;
/// The two tests after the suite's six.
pub const NOFLUSH_QD1: &str = "randwrite-4k-qd1-noflush";
pub const DSYNC_QD1: &str = "randwrite-4k-qd1-dsync";

/// What a device's first bytes say it holds.
pub fn identify(head: &[u8]) -> Option<String> {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    let named = [
        (0, &b"NACREBS\0"[..], "a Nacre store"),
        (0, b"bluestore block device", "a Ceph BlueStore OSD"),
        (0, b"XFSB", "an XFS file system"),
        (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
        (65_600, b"_BHRfS_M", "a btrfs file system"),
        (1_080, b"\x53\xef", "an ext2/3/4 file system"),
        (4_086, b"SWAPSPACE2", "a swap area"),
        (4_086, b"SWAP-SPACE", "a swap area"),
        (512, b"LABELONE", "an LVM physical volume"),
        (512, b"EFI PART", "a GPT partition table"),
        (4_096, b"EFI PART", "a GPT partition table"),
        (3, b"NTFS    ", "an NTFS file system"),
        (82, b"FAT32   ", "a FAT32 file system"),
        (54, b"FAT1", "a FAT file system"),
        (32_769, b"CD001", "an ISO 9660 image"),
        (4_096, b"\xfc\x4e\x2b\xa9", "an md RAID member"),
        (1 << 20, b"\x0d\xd0\x01\xc0", "a VMFS volume"),
    ];
    for (off, magic, what) in named {
        if at(off, magic) {
            return Some(what.to_string());
        }
    }
    // A DOS boot sector with a partition entry in use.
    if at(510, b"\x55\xaa") && (0..4).any(|i| head.get(446 + 16 * i + 4).is_some_and(|&t| t != 0)) {
        return Some("a DOS partition table".into());
    }
    head.iter()
        .any(|&b| b != 0)
        .then(|| "data of a kind not recognised (non-zero bytes in its first 4 MiB)".into())
}

/// What a device's last bytes say it holds (the backup GPT header in its
/// last sector, md 0.90/1.0 superblocks, and anything else not zero).
pub fn identify_tail(tail: &[u8]) -> Option<String> {
    let n = tail.len();
    if n >= 512 && &tail[n - 512..n - 504] == b"EFI PART" {
        return Some("a GPT partition table (its backup header)".into());
    }
    tail.iter()
        .any(|&b| b != 0)
        .then(|| "data of a kind not recognised (non-zero bytes in its last MiB)".into())
}

#[derive(Clone, Debug)]
pub struct DiskCheckOpts {
    pub path: PathBuf,
    /// Bytes of the test area (a scratch file's size).
    pub size_bytes: u64,
    pub runtime: Duration,
    pub destructive: bool,
    /// A progress line on stderr.
    pub progress: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DiskCheckReport {
    /// What was written: the device, or the scratch file (removed).
    pub target: String,
    pub block_device: bool,
    /// `io_uring`, or `pread/pwrite` (then one op at a time: the QD128
    /// and QD16 tests run at QD1).
    pub io_engine: &'static str,
    /// The kernel's block device under the target, its volatile write
    /// cache as the kernel sees it ("write back", "write through"), as
    /// the device reports it where it can be read (SCSI), and whether it
    /// spins.
    pub device: Option<String>,
    pub write_cache: Option<String>,
    pub device_cache: Option<String>,
    pub rotational: Option<bool>,
    pub area_bytes: u64,
    pub tests: Vec<SuiteResult>,
    /// Median QD1 4 KiB write with no flush, and durable (the worse of
    /// fdatasync and RWF_DSYNC).
    pub noflush_write_p50_us: f64,
    pub durable_write_p50_us: f64,
    /// The durable write within twice the one with no flush (+ 20 µs):
    /// the device acknowledges flushes as if its cache survived power
    /// loss. None when it cannot be told: the kernel sends no flush to a
    /// device it sees as write-through, or too few writes completed.
    pub behaves_as_plp: Option<bool>,
    pub immediate_commit: bool,
    pub immediate_commit_why: String,
    /// What a destructive check destroyed.
    pub destroyed: Option<String>,
}

fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid C string and a zeroed out-struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error()).context(format!("statvfs {}", dir.display()));
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

/// The test target, opened: a device (checked, maybe wiped) or a scratch
/// file (already unlinked).
struct Target {
    dev: Rc<FileDev>,
    shown: String,
    block: bool,
    start: u64,
    area: u64,
    /// Where its file system's or its own device is found.
    sys_path: PathBuf,
    destroyed: Option<String>,
}

fn flags(create: Option<u64>) -> OpenFlags {
    OpenFlags {
        create_bytes: create,
        create_new: create.is_some(),
        exclusive_device: true,
        ..OpenFlags::default()
    }
}

/// Opens the device, reads its head and tail through the same descriptor
/// the tests use, and refuses it or wipes them.
async fn open_device(o: &DiskCheckOpts) -> anyhow::Result<Target> {
    let dev = FileDev::open(&o.path, &flags(None)).with_context(|| {
        format!(
            "open {} exclusively (is it mounted, a swap area, held by LVM or md, or a running OSD's?)",
            o.path.display()
        )
    })?;
    let size = dev.size_bytes();
    if size < HEAD_BYTES + TAIL_BYTES + AREA_MIN_BYTES {
        bail!(
            "{}: {} MiB; the check needs at least {} MiB",
            o.path.display(),
            size >> 20,
            (HEAD_BYTES + TAIL_BYTES + AREA_MIN_BYTES) >> 20
        );
    }
    let head = dev.read_at(AlignedBuf::new(HEAD_BYTES as usize), 0).await?;
    let tail_at = size - TAIL_BYTES;
    let tail = dev
        .read_at(AlignedBuf::new(TAIL_BYTES as usize), tail_at)
        .await?;
    let held = identify(&head).or_else(|| identify_tail(&tail));
    if let Some(what) = &held {
        if !o.destructive {
            bail!(
                "{} holds {what}: refusing to write to it (give --destructive to destroy it)",
                o.path.display()
            );
        }
        eprintln!(
            "nacre disk check: destroying {what} on {} (--destructive)",
            o.path.display()
        );
        // Before anything else: no signature survives over test data.
        dev.write_at(AlignedBuf::new(HEAD_BYTES as usize), 0)
            .await?;
        dev.write_at(AlignedBuf::new(TAIL_BYTES as usize), tail_at)
            .await?;
        dev.sync().await?;
    }
    let room = size - HEAD_BYTES - TAIL_BYTES;
    Ok(Target {
        dev: Rc::new(dev),
        shown: o.path.display().to_string(),
        block: true,
        start: HEAD_BYTES,
        area: o.size_bytes.min(room) / LINEAR_BYTES * LINEAR_BYTES,
        sys_path: o.path.clone(),
        destroyed: held,
    })
}

/// Creates the scratch file in `dir` (never an existing name), unlinks
/// it, and writes it once whole (so no test times block allocation, and
/// no read meets a hole).
async fn open_scratch(o: &DiskCheckOpts, dir: &Path) -> anyhow::Result<Target> {
    let area = o.size_bytes / LINEAR_BYTES * LINEAR_BYTES;
    let free = free_bytes(dir)?;
    let need = area.saturating_add(64 << 20);
    if free < need {
        bail!(
            "{}: {} MiB free, the scratch file needs {} MiB and 64 MiB to spare: give a smaller --size",
            dir.display(),
            free >> 20,
            area >> 20
        );
    }
    let path = dir.join(format!(".nacre-disk-check.{}", std::process::id()));
    let dev = FileDev::open(&path, &flags(Some(area))).with_context(|| {
        format!(
            "create {} (a file system without O_DIRECT, such as tmpfs, cannot be checked)",
            path.display()
        )
    })?;
    std::fs::remove_file(&path).with_context(|| format!("unlink {}", path.display()))?;
    let dev = Rc::new(dev);
    let whole: Rc<dyn BlockTarget> = Rc::new(FileTarget::whole(dev.clone()));
    suite::fill(&whole, 0, area / LINEAR_BYTES, false).await?;
    dev.sync().await?;
    Ok(Target {
        dev,
        shown: format!("{} (scratch file, removed)", path.display()),
        block: false,
        start: 0,
        area,
        sys_path: dir.to_path_buf(),
        destroyed: None,
    })
}

/// The kernel's block device under `path` (itself, or the one holding
/// its file system), its write cache as the kernel and (SCSI) the device
/// report it, and whether it spins.
fn device_of(path: &Path) -> (Option<String>, Option<String>, Option<String>, Option<bool>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return (None, None, None, None);
    };
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let Ok(sys) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else {
        return (None, None, None, None);
    };
    // A partition's queue settings are its disk's.
    let disk = if sys.join("partition").exists() {
        sys.parent().map(Path::to_path_buf).unwrap_or(sys.clone())
    } else {
        sys.clone()
    };
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let device_cache = std::fs::read_dir(disk.join("device/scsi_disk"))
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .and_then(|e| read(e.path().join("cache_type")));
    let name = disk.file_name().map(|n| n.to_string_lossy().into_owned());
    (
        name,
        read(disk.join("queue/write_cache")),
        device_cache,
        read(disk.join("queue/rotational")).map(|r| r == "1"),
    )
}

/// 4 KiB QD1 writes over the target's window: with no flush, or each
/// with RWF_DSYNC.
async fn qd1_writes(
    t: &Target,
    name: &str,
    step: usize,
    dsync: bool,
    o: &SuiteOpts,
) -> anyhow::Result<SuiteResult> {
    let (dev, start, slots) = (t.dev.clone(), t.start, t.area / SMALL_BYTES);
    measure(name, step, 1, o, move |n| {
        let d = dev.clone();
        async move {
            let mut b = AlignedBuf::new(SMALL_BYTES as usize);
            stamp(&mut b, n);
            let at = start + mix(5, n) % slots * SMALL_BYTES;
            if dsync {
                d.write_dsync_at(b, at).await?;
            } else {
                d.write_at(b, at).await?;
            }
            Ok(SMALL_BYTES)
        }
    })
    .await
}

/// Whether it behaves as if it had PLP, and the advice on
/// `immediate_commit` with its reason.
fn verdict(
    noflush_us: f64,
    durable_us: f64,
    measured: bool,
    block: bool,
    kernel_cache: Option<&str>,
    device_cache: Option<&str>,
    device: Option<&str>,
) -> (Option<bool>, bool, String) {
    let write_through = kernel_cache == Some("write through");
    let plp = (measured && !write_through).then_some(durable_us <= 2.0 * noflush_us + 20.0);
    if !block {
        return (
            plp,
            false,
            "a file in a file system: its metadata needs fsync whatever the device".into(),
        );
    }
    let why = match (kernel_cache, device_cache) {
        (Some("write through"), Some(d)) if !d.contains("write back") => {
            return (
                plp,
                true,
                format!("the kernel and the device ({d:?}) report no volatile write cache"),
            )
        }
        (Some("write through"), Some(d)) => format!(
            "the device reports a volatile cache ({d:?}) though the kernel was told write through: flushes are dropped; keep fsync"
        ),
        (Some("write through"), None) if device.is_some_and(|d| d.starts_with("nvme")) => {
            return (
                plp,
                true,
                "the NVMe controller reports no volatile write cache (as the kernel read it at probe; a write_cache set by hand would fool this)".into(),
            )
        }
        (Some("write through"), None) => "the kernel sees no volatile cache, but what the device itself does cannot be read here (a loop, virtual or network device): keep fsync".into(),
        (Some(c), _) => format!(
            "volatile write cache ({c:?}): only a flush makes a write durable"
        ),
        (None, _) => "the write cache setting is unknown: keep fsync".into(),
    };
    (plp, false, why)
}

/// Runs every test; must not be called inside a runtime.
pub fn run(o: &DiskCheckOpts) -> anyhow::Result<DiskCheckReport> {
    if o.size_bytes < AREA_MIN_BYTES {
        bail!("--size: at least {} MiB", AREA_MIN_BYTES >> 20);
    }
    if o.runtime < RUNTIME_MIN {
        bail!("--runtime: at least {} ms", RUNTIME_MIN.as_millis());
    }
    let meta = std::fs::metadata(&o.path).with_context(|| {
        format!(
            "{}: give a directory or a file (tested on a scratch file there) or a block device",
            o.path.display()
        )
    })?;
    let scratch_dir = if meta.file_type().is_block_device() {
        None
    } else if meta.is_dir() {
        Some(o.path.clone())
    } else if meta.is_file() {
        Some(
            (o.path.parent())
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
        )
    } else {
        bail!(
            "{}: neither a directory, a file nor a block device",
            o.path.display()
        );
    };
    let opts = SuiteOpts {
        runtime: o.runtime,
        steps: 8,
        area_bytes: u64::MAX,
        progress: o.progress,
        extra_cpu: None,
    };
    let (t, tests) = rt::block_on(async {
        // The device's figures, not those of the loop's polling.
        rt::set_spin_budget(std::time::Duration::ZERO);
        let t = match &scratch_dir {
            Some(dir) => open_scratch(o, dir).await?,
            None => open_device(o).await?,
        };
        let window = FileTarget {
            dev: t.dev.clone(),
            start: t.start,
            len: t.area,
        };
        let mut out = suite::run(Rc::new(window), &opts).await?;
        out.push(qd1_writes(&t, NOFLUSH_QD1, 7, false, &opts).await?);
        out.push(qd1_writes(&t, DSYNC_QD1, 8, true, &opts).await?);
        anyhow::Ok((t, out))
    })?;
    let find = |n: &str| tests.iter().find(|x| x.name == n).map(|x| x.summary);
    let (noflush, fsync, dsync) = (
        find(NOFLUSH_QD1).unwrap_or_default(),
        // The suite's QD1 write is followed by fdatasync.
        find("randwrite-4k-qd1").unwrap_or_default(),
        find(DSYNC_QD1).unwrap_or_default(),
    );
    let measured = [noflush.ops, fsync.ops, dsync.ops]
        .iter()
        .all(|&n| n >= VERDICT_OPS_MIN);
    let durable = fsync.lat_us.p50.max(dsync.lat_us.p50);
    let (device, write_cache, device_cache, rotational) = device_of(&t.sys_path);
    let (behaves_as_plp, immediate_commit, immediate_commit_why) = verdict(
        noflush.lat_us.p50,
        durable,
        measured,
        t.block,
        write_cache.as_deref(),
        device_cache.as_deref(),
        device.as_deref(),
    );
    Ok(DiskCheckReport {
        target: t.shown.clone(),
        block_device: t.block,
        io_engine: if t.dev.uses_uring() {
            "io_uring"
        } else {
            "pread/pwrite"
        },
        device,
        write_cache,
        device_cache,
        rotational,
        area_bytes: t.area,
        tests,
        noflush_write_p50_us: noflush.lat_us.p50,
        durable_write_p50_us: durable,
        behaves_as_plp,
        immediate_commit,
        immediate_commit_why,
        destroyed: t.destroyed.clone(),
    })
}

pub fn table(r: &DiskCheckReport) -> String {
    let mut out = suite::table(&[("disk", &r.tests)]);
    let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "unknown".into());
    out.push_str(&format!(
        "\ntarget: {} ({} MiB tested, {})\ndevice: {}, write cache {} (kernel), {} (device), {}\n",
        r.target,
        r.area_bytes >> 20,
        r.io_engine,
        opt(&r.device),
        opt(&r.write_cache),
        opt(&r.device_cache),
        match r.rotational {
            Some(true) => "rotational",
            Some(false) => "non-rotational",
            None => "rotation unknown",
        }
    ));
    out.push_str(&format!(
        "durable 4 KiB write at QD1: p50 {:.0} µs (the worse of fdatasync and RWF_DSYNC) against {:.0} µs with no flush: {}\n",
        r.durable_write_p50_us,
        r.noflush_write_p50_us,
        match r.behaves_as_plp {
            Some(true) => "behaves as if it has power-loss protection",
            Some(false) => "no sign of power-loss protection (each durable write waits for the media)",
            None => "cannot tell (no flush reaches a device the kernel sees as write-through, or too few writes)",
        }
    ));
    out.push_str(&format!(
        "immediate_commit: {} — {}\n",
        r.immediate_commit, r.immediate_commit_why
    ));
    if let Some(d) = &r.destroyed {
        out.push_str(&format!(
            "destroyed: {d} (its first 4 MiB and last MiB zeroed)\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_with(off: usize, bytes: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; HEAD_BYTES as usize];
        h[off..off + bytes.len()].copy_from_slice(bytes);
        h
    }

    #[test]
    fn identifies_what_a_device_holds() {
        assert_eq!(identify(&vec![0u8; HEAD_BYTES as usize]), None);
        let cases: [(usize, &[u8], &str); 7] = [
            (1080, b"\x53\xef", "ext2/3/4"),
            (0, b"NACREBS\0", "Nacre store"),
            (512, b"EFI PART", "GPT"),
            (65_600, b"_BHRfS_M", "btrfs"),
            (0, b"XFSB", "XFS"),
            (4086, b"SWAPSPACE2", "swap"),
            (1 << 20, b"\x0d\xd0\x01\xc0", "VMFS"),
        ];
        for (off, magic, want) in cases {
            let got = identify(&head_with(off, magic)).unwrap();
            assert!(got.contains(want), "{got} for {want}");
        }
        let mut mbr = head_with(510, b"\x55\xaa");
        mbr[446 + 4] = 0x83;
        assert!(identify(&mbr).unwrap().contains("DOS partition"));
        assert!(identify(&head_with(3_000_000, b"x"))
            .unwrap()
            .contains("not recognised"));
        // A short head (a tiny device) is read as far as it goes.
        assert_eq!(identify(&[0u8; 100]), None);
        let mut tail = vec![0u8; TAIL_BYTES as usize];
        assert_eq!(identify_tail(&tail), None);
        let n = tail.len();
        tail[n - 512..n - 504].copy_from_slice(b"EFI PART");
        assert!(identify_tail(&tail).unwrap().contains("backup"));
    }

    #[test]
    fn recommends_immediate_commit_only_when_the_device_says_so() {
        let v = |kernel, device, name| verdict(20.0, 25.0, true, true, kernel, device, name);
        assert!(v(Some("write through"), Some("write through"), Some("sda")).1);
        assert!(!v(Some("write through"), Some("write back"), Some("sda")).1);
        assert!(v(Some("write through"), None, Some("nvme0n1")).1);
        assert!(!v(Some("write through"), None, Some("loop0")).1);
        assert!(!v(Some("write back"), Some("write back"), Some("sda")).1);
        assert!(!v(None, None, None).1);
        // A file never; and nothing measured where no flush is sent.
        assert!(!verdict(20.0, 25.0, true, false, Some("write through"), None, None).1);
        assert_eq!(v(Some("write through"), None, Some("loop0")).0, None);
        assert_eq!(
            verdict(20.0, 25.0, false, true, Some("write back"), None, None).0,
            None
        );
        assert_eq!(
            verdict(20.0, 50.0, true, true, Some("write back"), None, None).0,
            Some(true)
        );
        assert_eq!(
            verdict(20.0, 500.0, true, true, Some("write back"), None, None).0,
            Some(false)
        );
    }
}
