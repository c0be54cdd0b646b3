//! `nacre store bench`: the standard suite's six tests on a fresh store over
//! a file or device, each beside the same I/O pattern issued raw to the same
//! file (O_DIRECT through the same io_uring runtime; fdatasync after every
//! write in the durable QD1 test), so the store's overhead is one ratio.
//!
//! Order, chosen so each pair runs close together on a noisy machine: prefill
//! the data area raw (so no test pays for file allocation); the three raw
//! write tests; format; the three store write tests (the 4 MiB linear write
//! first, which fills the store); then each read test raw and on the store
//! back to back (raw reads of the store's data area harm nothing).

use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use nacre_blockstore::{FormatOptions, Geometry, Store, StoreOptions};
use nacre_io::{rt, AlignedBuf, BlockDev, FileDev, OpenFlags};
use nacre_types::ObjectId;
use serde::Serialize;

use crate::load::{join_all, mix, run_for};
use crate::stats::Summary;

pub const TEST_NAMES: [&str; 6] = [
    "randwrite-4k-qd1",
    "randwrite-4k-qd128",
    "randread-4k-qd1",
    "randread-4k-qd128",
    "write-4m-qd16",
    "read-4m-qd16",
];

const LINEAR_BYTES: u64 = 4 << 20;
const SMALL_BYTES: u64 = 4096;

#[derive(Clone, Debug)]
pub struct StoreBenchOpts {
    pub path: PathBuf,
    pub size_bytes: u64,
    pub runtime: Duration,
    pub block_bytes: u32,
    pub journal_bytes: Option<u64>,
    pub immediate_commit: bool,
    /// Print progress lines on stderr.
    pub progress: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct TestResult {
    pub name: String,
    pub store: Summary,
    pub raw: Summary,
    /// What the store did for it beyond the client's I/O.
    pub store_work: StoreWork,
}

/// The store's own work during one test, per op of the test (a 4 MiB op
/// is one op): journal flushes (fdatasync), journal batches written,
/// overlays folded in place; and in all, the checkpoints, the times the
/// writer paced client writes as the journal neared its limit, and the
/// times client writes met the limit and waited for a checkpoint. It
/// tells where a store/raw ratio goes: a durable QD1 write needs one
/// flush, and each fold is a device write of its own; and where a tail
/// latency comes from.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct StoreWork {
    pub flushes_per_op: f64,
    pub batches_per_op: f64,
    pub folds_per_op: f64,
    pub checkpoints: u64,
    pub paced_waits: u64,
    pub journal_full_waits: u64,
}

impl StoreWork {
    fn between(a: &nacre_blockstore::Stats, b: &nacre_blockstore::Stats, ops: u64) -> StoreWork {
        let per = |x: u64, y: u64| (y - x) as f64 / ops.max(1) as f64;
        StoreWork {
            flushes_per_op: per(a.syncs, b.syncs),
            batches_per_op: per(a.batches, b.batches),
            folds_per_op: per(a.flushed_overlays, b.flushed_overlays),
            checkpoints: b.checkpoints - a.checkpoints,
            paced_waits: b.paced_waits - a.paced_waits,
            journal_full_waits: b.journal_full_waits - a.journal_full_waits,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    pub objects: u64,
    pub index_bytes: u64,
    pub index_bytes_per_object: f64,
    /// Index RAM scaled to 1 TiB of data at this block size and fill.
    pub index_mib_per_tib: f64,
    pub csum_cache_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct StoreBenchReport {
    pub tests: Vec<TestResult>,
    pub memory: MemoryReport,
    pub block_bytes: u32,
    pub data_bytes: u64,
    pub working_set_bytes: u64,
    pub journal_bytes: u64,
    pub io_engine: &'static str,
}

/// Where the benchmark's objects live, shared by the raw and store runs.
#[derive(Clone, Copy)]
struct Layout {
    data_offset: u64,
    block_bytes: u64,
    objects: u64,
}

impl Layout {
    /// Blocks one 4 MiB op spans.
    fn per_linear(&self) -> u64 {
        (LINEAR_BYTES / self.block_bytes).max(1)
    }
    /// Object and byte offset of random 4 KiB op `n`.
    fn small(&self, stream: u64, n: u64) -> (u64, u64) {
        let r = mix(stream, n);
        let obj = r % self.objects;
        let off = (r >> 32) % (self.block_bytes / SMALL_BYTES) * SMALL_BYTES;
        (obj, off)
    }
    /// First object of linear 4 MiB op `n` (wrapping over the working set).
    fn linear(&self, n: u64) -> u64 {
        let per = self.per_linear();
        let slots = (self.objects / per).max(1);
        (n % slots) * per
    }
    fn raw_pos(&self, obj: u64, off: u64) -> u64 {
        self.data_offset + obj * self.block_bytes + off
    }
}

fn stamp(buf: &mut AlignedBuf, n: u64) {
    for chunk in buf.chunks_mut(4096) {
        chunk[..8].copy_from_slice(&n.to_le_bytes());
    }
}

fn say(opts: &StoreBenchOpts, msg: &str) {
    if opts.progress {
        eprintln!("nacre store bench: {msg}");
    }
}

async fn raw_test(
    dev: &Rc<FileDev>,
    l: Layout,
    name: &str,
    runtime: Duration,
) -> anyhow::Result<Summary> {
    let d = dev.clone();
    let s = match name {
        "randwrite-4k-qd1" => {
            run_for(1, runtime, move |n| {
                let d = d.clone();
                async move {
                    let (obj, off) = l.small(1, n);
                    let mut b = AlignedBuf::new(SMALL_BYTES as usize);
                    stamp(&mut b, n);
                    d.write_at(b, l.raw_pos(obj, off)).await?;
                    d.sync().await?;
                    Ok(SMALL_BYTES)
                }
            })
            .await?
        }
        "randwrite-4k-qd128" => {
            run_for(128, runtime, move |n| {
                let d = d.clone();
                async move {
                    let (obj, off) = l.small(2, n);
                    let mut b = AlignedBuf::new(SMALL_BYTES as usize);
                    stamp(&mut b, n);
                    d.write_at(b, l.raw_pos(obj, off)).await?;
                    Ok(SMALL_BYTES)
                }
            })
            .await?
        }
        "randread-4k-qd1" | "randread-4k-qd128" => {
            let qd = if name.ends_with("qd1") { 1 } else { 128 };
            run_for(qd, runtime, move |n| {
                let d = d.clone();
                async move {
                    let (obj, off) = l.small(3, n);
                    d.read_at(AlignedBuf::new(SMALL_BYTES as usize), l.raw_pos(obj, off))
                        .await?;
                    Ok(SMALL_BYTES)
                }
            })
            .await?
        }
        "write-4m-qd16" | "read-4m-qd16" => {
            let write = name.starts_with("write");
            run_for(16, runtime, move |n| {
                let d = d.clone();
                async move {
                    let pos = l.raw_pos(l.linear(n), 0);
                    let len = LINEAR_BYTES.min(l.objects * l.block_bytes);
                    if write {
                        let mut b = AlignedBuf::new(len as usize);
                        stamp(&mut b, n);
                        d.write_at(b, pos).await?;
                    } else {
                        d.read_at(AlignedBuf::new(len as usize), pos).await?;
                    }
                    Ok(len)
                }
            })
            .await?
        }
        other => anyhow::bail!("unknown test {other}"),
    };
    Ok(s)
}

/// One 4 MiB op on the store: the blocks it spans, written or read at once.
async fn store_linear(
    s: &Store<Rc<FileDev>>,
    l: Layout,
    n: u64,
    version: u64,
    write: bool,
) -> anyhow::Result<u64> {
    let first = l.linear(n);
    let per = l.per_linear().min(l.objects);
    let mut futs = Vec::with_capacity(per as usize);
    for i in 0..per {
        let s = s.clone();
        let oid = ObjectId::new(1, first + i);
        let bb = l.block_bytes as usize;
        futs.push(async move {
            if write {
                let mut b = AlignedBuf::new(bb);
                stamp(&mut b, version);
                s.write(oid, version, 0, b).await?;
            } else {
                s.read(oid, 0, bb as u32).await?;
            }
            Ok(())
        });
    }
    join_all(futs).await?;
    Ok(per * l.block_bytes)
}

/// One test on the store: its figures, and the store's own work during it.
async fn store_test(
    s: &Store<Rc<FileDev>>,
    l: Layout,
    name: &str,
    runtime: Duration,
    version: Rc<std::cell::Cell<u64>>,
) -> anyhow::Result<(Summary, StoreWork)> {
    let before = s.stats();
    let st = s.clone();
    let next = move || {
        let v = version.get() + 1;
        version.set(v);
        v
    };
    let sum = match name {
        "randwrite-4k-qd1" | "randwrite-4k-qd128" => {
            let qd = if name.ends_with("qd1") { 1 } else { 128 };
            let stream = if qd == 1 { 1 } else { 2 };
            run_for(qd, runtime, move |n| {
                let (st, v) = (st.clone(), next());
                async move {
                    let (obj, off) = l.small(stream, n);
                    let mut b = AlignedBuf::new(SMALL_BYTES as usize);
                    stamp(&mut b, n);
                    st.write(ObjectId::new(1, obj), v, off as u32, b).await?;
                    Ok(SMALL_BYTES)
                }
            })
            .await?
        }
        "randread-4k-qd1" | "randread-4k-qd128" => {
            let qd = if name.ends_with("qd1") { 1 } else { 128 };
            run_for(qd, runtime, move |n| {
                let st = st.clone();
                async move {
                    let (obj, off) = l.small(3, n);
                    st.read(ObjectId::new(1, obj), off as u32, SMALL_BYTES as u32)
                        .await?;
                    Ok(SMALL_BYTES)
                }
            })
            .await?
        }
        "write-4m-qd16" | "read-4m-qd16" => {
            let write = name.starts_with("write");
            run_for(16, runtime, move |n| {
                let (st, v) = (st.clone(), next());
                async move { store_linear(&st, l, n, v, write).await }
            })
            .await?
        }
        other => anyhow::bail!("unknown test {other}"),
    };
    Ok((sum, StoreWork::between(&before, &s.stats(), sum.ops)))
}

/// Runs the whole comparison. Destroys what `opts.path` held.
pub fn run(opts: &StoreBenchOpts) -> anyhow::Result<StoreBenchReport> {
    rt::block_on(run_async(opts))
}

async fn run_async(opts: &StoreBenchOpts) -> anyhow::Result<StoreBenchReport> {
    if let Ok(meta) = std::fs::metadata(&opts.path) {
        if meta.is_file() && meta.len() > opts.size_bytes {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&opts.path)?
                .set_len(opts.size_bytes)?;
        }
    }
    let flags = OpenFlags {
        create_bytes: Some(opts.size_bytes),
        ..OpenFlags::default()
    };
    let dev = Rc::new(FileDev::open(&opts.path, &flags)?);
    let io_engine = if dev.uses_uring() {
        "io_uring"
    } else {
        "pread/pwrite"
    };
    let g = Geometry::plan(
        [0; 16],
        dev.size_bytes(),
        opts.block_bytes,
        dev.align_bytes().max(512),
        opts.journal_bytes,
        nacre_blockstore::LogRegion::DEFAULT,
    )?;
    // Leave 1/16 of the blocks free: whole-block rewrites go to fresh
    // blocks, and the old ones return only at the next checkpoint.
    let objects = u64::from(g.nblocks) - u64::from(g.nblocks) / 16;
    // Whole 4 MiB ops only, so the linear fill covers every object.
    let per = (LINEAR_BYTES / u64::from(g.block_bytes)).max(1);
    let objects = (objects / per).max(1) * per;
    let l = Layout {
        data_offset: g.data_offset,
        block_bytes: u64::from(g.block_bytes),
        objects,
    };
    let ws = objects * l.block_bytes;
    say(
        opts,
        &format!(
            "prefilling {} MiB of {} ({io_engine})",
            ws >> 20,
            opts.path.display()
        ),
    );
    let mut at = 0;
    while at < ws {
        let len = LINEAR_BYTES.min(ws - at);
        let mut futs = Vec::new();
        for _ in 0..16 {
            if at >= ws {
                break;
            }
            let len = len.min(ws - at);
            let d = dev.clone();
            let pos = g.data_offset + at;
            futs.push(async move {
                d.write_at(AlignedBuf::zeroed(len as usize), pos).await?;
                Ok(())
            });
            at += len;
        }
        join_all(futs).await?;
    }
    dev.sync().await?;
    let writes = ["write-4m-qd16", "randwrite-4k-qd128", "randwrite-4k-qd1"];
    let reads = ["randread-4k-qd1", "randread-4k-qd128", "read-4m-qd16"];
    let mut raw = Vec::new();
    for name in writes {
        say(opts, &format!("raw   {name}"));
        raw.push((name, raw_test(&dev, l, name, opts.runtime).await?));
    }
    say(opts, "formatting the store");
    let fmt = FormatOptions {
        block_bytes: opts.block_bytes,
        journal_bytes: opts.journal_bytes,
        ..FormatOptions::default()
    };
    Store::format(&dev, &fmt).await?;
    let sopts = StoreOptions {
        immediate_commit: opts.immediate_commit,
        ..StoreOptions::default()
    };
    let (store, _) = Store::open(dev.clone(), sopts).await?;
    anyhow::ensure!(
        store.geometry().data_offset == g.data_offset,
        "layout changed between plan and format"
    );
    let version = Rc::new(std::cell::Cell::new(0u64));
    let mut store_results = Vec::new();
    for name in writes {
        say(opts, &format!("store {name}"));
        let (s, work) = store_test(&store, l, name, opts.runtime, version.clone()).await?;
        store_results.push((name, s, work));
        if name == "write-4m-qd16" {
            // Every object must exist before anything reads it.
            let slots = objects / per;
            for n in (s.ops..slots).collect::<Vec<_>>().chunks(16) {
                let futs: Vec<_> = n
                    .iter()
                    .map(|&n| {
                        let (st, v) = (store.clone(), version.get() + 1 + n);
                        async move { store_linear(&st, l, n, v, true).await }
                    })
                    .collect();
                join_all(futs).await?;
            }
            version.set(version.get() + slots + 1);
        }
        // Background work a test leaves behind (folding its journal) is
        // finished before the next test, outside any measurement; a test
        // much longer than one checkpoint interval pays its own share.
        store.checkpoint().await?;
    }
    for name in reads {
        say(opts, &format!("raw   {name}"));
        raw.push((name, raw_test(&dev, l, name, opts.runtime).await?));
        say(opts, &format!("store {name}"));
        let (s, work) = store_test(&store, l, name, opts.runtime, version.clone()).await?;
        store_results.push((name, s, work));
    }
    let mem = store.memory();
    let (index_bytes, csum_bytes) = (mem.index_bytes, mem.csum_cache_bytes);
    let nobj = store.object_count() as u64;
    let data_bytes = u64::from(g.nblocks) * l.block_bytes;
    let memory = MemoryReport {
        objects: nobj,
        index_bytes,
        index_bytes_per_object: index_bytes as f64 / nobj.max(1) as f64,
        index_mib_per_tib: index_bytes as f64 * ((1u64 << 40) as f64 / data_bytes as f64)
            / (1 << 20) as f64,
        csum_cache_bytes: csum_bytes,
    };
    store.close().await?;
    let tests = TEST_NAMES
        .iter()
        .map(|&name| {
            let (_, store, store_work) = *(store_results.iter())
                .find(|(n, ..)| *n == name)
                .expect("every test ran");
            let (_, raw) = *raw
                .iter()
                .find(|(n, _)| *n == name)
                .expect("every test ran");
            TestResult {
                name: name.to_string(),
                store,
                raw,
                store_work,
            }
        })
        .collect();
    Ok(StoreBenchReport {
        tests,
        memory,
        block_bytes: g.block_bytes,
        data_bytes,
        working_set_bytes: ws,
        journal_bytes: g.journal_bytes,
        io_engine,
    })
}

/// The report as a plain-text table.
pub fn table(r: &StoreBenchReport) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "store bench: {} MiB working set, {} KiB blocks, {} MiB journal, {}\n\n",
        r.working_set_bytes >> 20,
        r.block_bytes >> 10,
        r.journal_bytes >> 20,
        r.io_engine
    ));
    out.push_str(&format!(
        "{:<20} {:>5} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
        "test",
        "",
        "IOPS",
        "MiB/s",
        "avg µs",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "CPU µs/op",
        "store/raw"
    ));
    for t in &r.tests {
        let ratio = if t.raw.iops > 0.0 {
            t.store.iops / t.raw.iops
        } else {
            0.0
        };
        for (who, s) in [("store", &t.store), ("raw", &t.raw)] {
            let name = if who == "store" { t.name.as_str() } else { "" };
            out.push_str(&format!(
                "{:<20} {:>5} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.2} {:>7}\n",
                name,
                who,
                s.iops,
                s.mib_s,
                s.lat_us.avg,
                s.lat_us.p50,
                s.lat_us.p99,
                s.lat_us.p999,
                s.cpu_us_per_op,
                if who == "store" {
                    format!("{ratio:.2}")
                } else {
                    String::new()
                }
            ));
        }
    }
    out.push_str(&format!(
        "\n{:<20} {:>11} {:>9} {:>9} {:>12} {:>7} {:>10}\n",
        "store work per op", "flushes", "batches", "folds", "checkpoints", "paced", "full waits"
    ));
    for t in &r.tests {
        let w = &t.store_work;
        out.push_str(&format!(
            "{:<20} {:>11.3} {:>9.3} {:>9.3} {:>12} {:>7} {:>10}\n",
            t.name,
            w.flushes_per_op,
            w.batches_per_op,
            w.folds_per_op,
            w.checkpoints,
            w.paced_waits,
            w.journal_full_waits
        ));
    }
    let m = &r.memory;
    out.push_str(&format!(
        "\nindex: {} objects, {:.1} bytes/object, {:.0} MiB per TiB of data; checksum cache {} KiB\n",
        m.objects,
        m.index_bytes_per_object,
        m.index_mib_per_tib,
        m.csum_cache_bytes >> 10
    ));
    out
}
