//! `nacre disk check`: the disk tests an operator runs before trusting a
//! device with an OSD (the team's LESSONS, *How storage is benchmarked*):
//! 4 MiB linear write and read at QD16; 4 KiB random reads at QD128 and
//! QD1; 4 KiB random writes at QD128 and QD1, plain (O_DIRECT), with an
//! fdatasync after each, and through an O_DSYNC descriptor. From the QD1
//! writes it says whether the device behaves as if it has power-loss
//! protection (a durable write barely slower than a plain one), and with
//! the device's volatile write cache setting it recommends the store's
//! `immediate_commit`.
//!
//! Safety, in order:
//! - a directory or a regular file is never written: the tests run on a
//!   scratch file in the directory (or beside the file), removed after;
//! - a block device is opened exclusively (O_EXCL: refused while mounted
//!   or held by LVM, md, swap) and locked (a running OSD holds it);
//! - a block device whose first MiB holds a file system, a partition
//!   table, a Nacre or Ceph store, or any data at all, is refused unless
//!   `destructive`; then what it held is named before anything is written
//!   and its first MiB zeroed after, so no stale signature outlives the
//!   data it described;
//! - the tests write only past the first MiB: a blank device stays blank
//!   where signatures live, and a second check needs no `destructive`.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use anyhow::{bail, Context};
use nacre_io::{rt, AlignedBuf, BlockDev, FileDev, OpenFlags};
use serde::Serialize;

use crate::load::{mix, run_for};
use crate::stats::Summary;

/// The head of a device that is read for signatures and never written by
/// the tests.
pub const HEAD_BYTES: u64 = 1 << 20;
/// The smallest test area worth measuring.
pub const AREA_MIN_BYTES: u64 = 64 << 20;
const LINEAR_BYTES: u64 = 4 << 20;
const SMALL_BYTES: u64 = 4096;

/// What a device's first MiB says it holds.
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
        .then(|| "data of a kind not recognised (non-zero bytes in its first MiB)".into())
}

#[derive(Clone, Debug)]
pub struct DiskCheckOpts {
    pub path: PathBuf,
    /// Bytes of the test area (a scratch file's size).
    pub size_bytes: u64,
    pub runtime: Duration,
    pub destructive: bool,
    /// A progress bar on stderr (drawn only on a terminal).
    pub progress: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DiskTest {
    pub name: &'static str,
    pub summary: Summary,
}

#[derive(Clone, Debug, Serialize)]
pub struct DiskCheckReport {
    /// What was written: the device, or the scratch file (removed).
    pub target: String,
    pub block_device: bool,
    /// The kernel's block device under the target, its volatile write
    /// cache ("write back", "write through") and whether it spins.
    pub device: Option<String>,
    pub write_cache: Option<String>,
    pub rotational: Option<bool>,
    pub area_bytes: u64,
    pub tests: Vec<DiskTest>,
    /// A QD1 4 KiB write with no flush, and durable (the worse of fsync
    /// and O_DSYNC).
    pub plain_write_lat_us: f64,
    pub durable_write_lat_us: f64,
    /// The durable write within twice the plain one (+ 20 µs): the device
    /// acknowledges flushes as if its cache survived power loss.
    pub behaves_as_plp: bool,
    pub immediate_commit: bool,
    pub immediate_commit_why: String,
    /// What a destructive check destroyed.
    pub destroyed: Option<String>,
}

/// The test area and how it was found.
struct Target {
    path: PathBuf,
    block: bool,
    /// Where the tests start (past the head on a device).
    start: u64,
    area: u64,
    scratch: bool,
    destroyed: Option<String>,
}

/// Removes a scratch file however the check ends.
struct Scratch(Option<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
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

fn read_head(path: &Path) -> anyhow::Result<(Vec<u8>, u64)> {
    use std::io::Seek;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
        .with_context(|| {
            format!(
                "open {} exclusively (is it mounted, a swap area, or held by LVM or md?)",
                path.display()
            )
        })?;
    let size = f.seek(std::io::SeekFrom::End(0))?;
    let mut head = vec![0u8; HEAD_BYTES.min(size) as usize];
    f.read_exact_at(&mut head, 0)
        .with_context(|| format!("read the first MiB of {}", path.display()))?;
    Ok((head, size))
}

fn target(o: &DiskCheckOpts) -> anyhow::Result<(Target, Scratch)> {
    let meta = std::fs::metadata(&o.path).with_context(|| {
        format!(
            "{}: give a directory or a file (tested on a scratch file there) or a block device",
            o.path.display()
        )
    })?;
    if meta.file_type().is_block_device() {
        let (head, size) = read_head(&o.path)?;
        let destroyed = match identify(&head) {
            Some(what) if !o.destructive => bail!(
                "{} holds {what}: refusing to write to it (give --destructive to destroy it)",
                o.path.display()
            ),
            other => other,
        };
        if size < HEAD_BYTES + AREA_MIN_BYTES {
            bail!(
                "{}: {size} bytes; the check needs at least {} MiB",
                o.path.display(),
                (HEAD_BYTES + AREA_MIN_BYTES) >> 20
            );
        }
        let area = o.size_bytes.min(size - HEAD_BYTES);
        return Ok((
            Target {
                path: o.path.clone(),
                block: true,
                start: HEAD_BYTES,
                area: area / LINEAR_BYTES * LINEAR_BYTES,
                scratch: false,
                destroyed,
            },
            Scratch(None),
        ));
    }
    let dir = if meta.is_dir() {
        o.path.clone()
    } else if meta.is_file() {
        (o.path.parent())
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()
    } else {
        bail!(
            "{}: neither a directory, a file nor a block device",
            o.path.display()
        );
    };
    if o.size_bytes < AREA_MIN_BYTES {
        bail!("--size: at least {} MiB", AREA_MIN_BYTES >> 20);
    }
    let area = o.size_bytes / LINEAR_BYTES * LINEAR_BYTES;
    let free = free_bytes(&dir)?;
    if free < area + (64 << 20) {
        bail!(
            "{}: {} MiB free, the scratch file needs {} MiB (and 64 MiB to spare): give a smaller --size",
            dir.display(),
            free >> 20,
            area >> 20
        );
    }
    let path = dir.join(format!(".nacre-disk-check.{}", std::process::id()));
    Ok((
        Target {
            path: path.clone(),
            block: false,
            start: 0,
            area,
            scratch: true,
            destroyed: None,
        },
        Scratch(Some(path)),
    ))
}

/// The kernel's block device under `path` (itself, or the one holding
/// its file system), with its write cache and rotational settings.
fn device_of(path: &Path) -> (Option<String>, Option<String>, Option<bool>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return (None, None, None);
    };
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let Ok(sys) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else {
        return (None, None, None);
    };
    // A partition's queue settings are its disk's.
    let disk = if sys.join("partition").exists() {
        sys.parent().map(Path::to_path_buf).unwrap_or(sys.clone())
    } else {
        sys.clone()
    };
    let read = |f: &str| {
        std::fs::read_to_string(disk.join("queue").join(f))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let name = sys.file_name().map(|n| n.to_string_lossy().into_owned());
    (
        name,
        read("write_cache"),
        read("rotational").map(|r| r == "1"),
    )
}

fn stamp(buf: &mut AlignedBuf, n: u64) {
    for chunk in buf.chunks_mut(SMALL_BYTES as usize) {
        chunk[..8].copy_from_slice(&n.to_le_bytes());
        chunk[8..16].copy_from_slice(&mix(7, n).to_le_bytes());
    }
}

/// The tests, in the order they run (the linear write first: it also
/// fills the area, so no read meets a hole).
pub const TEST_NAMES: [&str; 8] = [
    "write-4m-qd16",
    "read-4m-qd16",
    "randread-4k-qd128",
    "randread-4k-qd1",
    "randwrite-4k-qd128",
    "randwrite-4k-qd1",
    "randwrite-4k-qd1-fsync",
    "randwrite-4k-qd1-osync",
];

async fn one(
    dev: &Rc<FileDev>,
    t: &Target,
    name: &str,
    runtime: Duration,
) -> anyhow::Result<Summary> {
    let d = dev.clone();
    let (start, area) = (t.start, t.area);
    let small =
        move |stream: u64, n: u64| start + mix(stream, n) % (area / SMALL_BYTES) * SMALL_BYTES;
    let s = match name {
        "write-4m-qd16" | "read-4m-qd16" => {
            let write = name.starts_with("write");
            run_for(16, runtime, move |n| {
                let d = d.clone();
                async move {
                    let pos = start + n % (area / LINEAR_BYTES) * LINEAR_BYTES;
                    if write {
                        let mut b = AlignedBuf::new(LINEAR_BYTES as usize);
                        stamp(&mut b, n);
                        d.write_at(b, pos).await?;
                    } else {
                        d.read_at(AlignedBuf::new(LINEAR_BYTES as usize), pos)
                            .await?;
                    }
                    Ok(LINEAR_BYTES)
                }
            })
            .await?
        }
        "randread-4k-qd128" | "randread-4k-qd1" => {
            let qd = if name.ends_with("qd1") { 1 } else { 128 };
            run_for(qd, runtime, move |n| {
                let d = d.clone();
                async move {
                    d.read_at(AlignedBuf::new(SMALL_BYTES as usize), small(3, n))
                        .await?;
                    Ok(SMALL_BYTES)
                }
            })
            .await?
        }
        _ => {
            let qd = if name.contains("qd128") { 128 } else { 1 };
            let fsync = name.ends_with("fsync");
            run_for(qd, runtime, move |n| {
                let d = d.clone();
                async move {
                    let mut b = AlignedBuf::new(SMALL_BYTES as usize);
                    stamp(&mut b, n);
                    d.write_at(b, small(2, n)).await?;
                    if fsync {
                        d.sync().await?;
                    }
                    Ok(SMALL_BYTES)
                }
            })
            .await?
        }
    };
    Ok(s)
}

fn open(t: &Target, sync_writes: bool) -> anyhow::Result<Rc<FileDev>> {
    let flags = OpenFlags {
        create_bytes: t.scratch.then_some(t.area),
        sync_writes,
        exclusive_device: true,
        ..OpenFlags::default()
    };
    let dev = FileDev::open(&t.path, &flags).with_context(|| {
        format!(
            "{} (a file system without O_DIRECT, such as tmpfs, cannot be checked)",
            t.path.display()
        )
    })?;
    Ok(Rc::new(dev))
}

/// Fills the area once (so reads meet written blocks, and a scratch file
/// is allocated before anything is timed).
async fn fill(dev: &Rc<FileDev>, t: &Target) -> anyhow::Result<()> {
    let mut pos = t.start;
    while pos < t.start + t.area {
        let mut batch = Vec::new();
        for _ in 0..16 {
            if pos >= t.start + t.area {
                break;
            }
            let d = dev.clone();
            let mut b = AlignedBuf::new(LINEAR_BYTES as usize);
            stamp(&mut b, pos);
            batch.push(rt::spawn(
                async move { d.write_at(b, pos).await.map(|_| ()) },
            ));
            pos += LINEAR_BYTES;
        }
        for h in batch {
            h.await?;
        }
    }
    dev.sync().await?;
    Ok(())
}

fn verdict(
    plain: f64,
    durable: f64,
    block: bool,
    write_cache: Option<&str>,
) -> (bool, bool, String) {
    let plp = durable <= 2.0 * plain + 20.0;
    let (ic, why) = if !block {
        (
            false,
            "a file in a file system: its metadata needs fsync whatever the device".to_string(),
        )
    } else {
        match (write_cache, plp) {
            (Some("write through"), true) => (
                true,
                "no volatile write cache, and a durable write costs no more than a plain one".into(),
            ),
            (Some("write through"), false) => (
                false,
                format!(
                    "the kernel sees no volatile cache, but a durable write takes {durable:.0} µs against {plain:.0} µs: something below flushes; keep fsync"
                ),
            ),
            (Some(wc), _) => (
                false,
                format!(
                    "volatile write cache {wc:?}: only fsync makes a write durable (if the device has power-loss protection, set the cache to write through and check again)"
                ),
            ),
            (None, _) => (
                false,
                "the write cache setting is unknown: keep fsync".into(),
            ),
        }
    };
    (plp, ic, why)
}

/// Runs every test; must not be called inside a runtime.
pub fn run(o: &DiskCheckOpts) -> anyhow::Result<DiskCheckReport> {
    let (t, _scratch) = target(o)?;
    if let Some(what) = &t.destroyed {
        eprintln!(
            "nacre disk check: destroying {what} on {} (--destructive)",
            t.path.display()
        );
    }
    let bar = if o.progress {
        let b = indicatif::ProgressBar::new(TEST_NAMES.len() as u64 + 1);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let (target_path, area, runtime) = (t.path.clone(), t.area, o.runtime);
    let tests = rt::block_on(async {
        bar.set_message(format!("filling {} MiB", area >> 20));
        let dev = open(&t, false)?;
        fill(&dev, &t).await?;
        bar.inc(1);
        let mut out = Vec::new();
        for name in &TEST_NAMES[..TEST_NAMES.len() - 1] {
            bar.set_message(*name);
            let summary = one(&dev, &t, name, runtime).await?;
            out.push(DiskTest { name, summary });
            bar.inc(1);
        }
        if t.destroyed.is_some() {
            // The head is never tested; zero it so no stale signature
            // outlives what it described.
            dev.write_at(AlignedBuf::new(HEAD_BYTES as usize), 0)
                .await?;
            dev.sync().await?;
        }
        // The O_DSYNC test on its own descriptor, the other one closed
        // (both lock the file, and a device is opened exclusively).
        drop(dev);
        let name = TEST_NAMES[TEST_NAMES.len() - 1];
        bar.set_message(name);
        let dsync = open(&t, true)?;
        let summary = one(&dsync, &t, name, runtime).await?;
        out.push(DiskTest { name, summary });
        bar.inc(1);
        anyhow::Ok(out)
    })?;
    bar.finish_and_clear();
    let lat = |n: &str| {
        (tests.iter())
            .find(|x| x.name == n)
            .map_or(0.0, |x| x.summary.lat_us.avg)
    };
    let plain = lat("randwrite-4k-qd1");
    let durable = lat("randwrite-4k-qd1-fsync").max(lat("randwrite-4k-qd1-osync"));
    let (device, write_cache, rotational) = device_of(&o.path);
    let (behaves_as_plp, immediate_commit, immediate_commit_why) =
        verdict(plain, durable, t.block, write_cache.as_deref());
    Ok(DiskCheckReport {
        target: if t.scratch {
            format!("{} (scratch file, removed)", target_path.display())
        } else {
            target_path.display().to_string()
        },
        block_device: t.block,
        device,
        write_cache,
        rotational,
        area_bytes: area,
        tests,
        plain_write_lat_us: plain,
        durable_write_lat_us: durable,
        behaves_as_plp,
        immediate_commit,
        immediate_commit_why,
        destroyed: t.destroyed,
    })
}

pub fn table(r: &DiskCheckReport) -> String {
    let mut out = format!(
        "{:<24} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
        "test", "IOPS", "MiB/s", "avg µs", "p99 µs", "p99.9 µs", "max µs"
    );
    for t in &r.tests {
        let s = &t.summary;
        out.push_str(&format!(
            "{:<24} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1}\n",
            t.name, s.iops, s.mib_s, s.lat_us.avg, s.lat_us.p99, s.lat_us.p999, s.lat_us.max
        ));
    }
    let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "unknown".into());
    out.push_str(&format!(
        "\ntarget: {} ({} MiB tested)\ndevice: {}, write cache {}, {}\n",
        r.target,
        r.area_bytes >> 20,
        opt(&r.device),
        opt(&r.write_cache),
        match r.rotational {
            Some(true) => "rotational",
            Some(false) => "non-rotational",
            None => "rotation unknown",
        }
    ));
    out.push_str(&format!(
        "durable 4 KiB write at QD1: {:.0} µs (the worse of fsync and O_DSYNC) against {:.0} µs plain: {}\n",
        r.durable_write_lat_us,
        r.plain_write_lat_us,
        if r.behaves_as_plp {
            "behaves as if it has power-loss protection"
        } else {
            "no sign of power-loss protection (each durable write waits for the media)"
        }
    ));
    out.push_str(&format!(
        "immediate_commit: {} — {}\n",
        r.immediate_commit, r.immediate_commit_why
    ));
    if let Some(d) = &r.destroyed {
        out.push_str(&format!("destroyed: {d} (first MiB zeroed)\n"));
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
        let cases: [(usize, &[u8], &str); 6] = [
            (1080, b"\x53\xef", "ext2/3/4"),
            (0, b"NACREBS\0", "Nacre store"),
            (512, b"EFI PART", "GPT"),
            (65_600, b"_BHRfS_M", "btrfs"),
            (0, b"XFSB", "XFS"),
            (4086, b"SWAPSPACE2", "swap"),
        ];
        for (off, magic, want) in cases {
            let got = identify(&head_with(off, magic)).unwrap();
            assert!(got.contains(want), "{got} for {want}");
        }
        let mut mbr = head_with(510, b"\x55\xaa");
        mbr[446 + 4] = 0x83;
        assert!(identify(&mbr).unwrap().contains("DOS partition"));
        assert!(identify(&head_with(700_000, b"x"))
            .unwrap()
            .contains("not recognised"));
        // A short head (a tiny device) is read as far as it goes.
        assert_eq!(identify(&[0u8; 100]), None);
    }

    #[test]
    fn recommends_immediate_commit_only_without_a_volatile_cache() {
        assert!(verdict(20.0, 25.0, true, Some("write through")).1);
        assert!(!verdict(20.0, 900.0, true, Some("write through")).1);
        assert!(!verdict(20.0, 25.0, true, Some("write back")).1);
        assert!(!verdict(20.0, 25.0, false, Some("write through")).1);
        assert!(!verdict(20.0, 25.0, true, None).1);
        assert!(verdict(20.0, 50.0, true, None).0);
        assert!(!verdict(20.0, 500.0, true, None).0);
    }
}
