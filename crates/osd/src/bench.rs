//! `nacre osd bench`: an OSD measures its own store, through the write
//! and read paths client I/O takes there (the journal, group commit, the
//! index), without replication or the network: a fixed amount written
//! whole, object by object, then 4 KiB random writes and reads at QD1 and
//! QD32 over it, then read back whole. The objects live in a volume of
//! pool 0, which no pool, PG, peering, scrub or stray check ever names,
//! and are deleted when the run ends (and at the next start of any bench,
//! should the OSD have stopped in one). The run competes with the OSD's
//! client I/O: on a busy cluster it measures what is left.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_net::Transport;
use nacre_types::{ObjectId, VolumeId};
use nacre_wire::{Header, Status, SENDER_CLIENT};
use serde::{Deserialize, Serialize};

use crate::Osd;

/// The volume a bench writes its objects to: pool 0, which no pool has.
pub const BENCH_VOLUME: VolumeId = VolumeId::new(0, 1);
/// Least and most bytes a bench writes.
pub const BENCH_BYTES_MIN: u64 = 4 << 20;
pub const BENCH_BYTES_MAX: u64 = 64 << 30;
/// Ops of each random 4 KiB test, at QD1 and at QD32.
const QD1_OPS: u64 = 1000;
const QDN_OPS: u64 = 8000;
const QD_RANDOM: usize = 32;
/// Whole-object writes and reads in flight.
const QD_LINEAR: usize = 16;
/// Longest one test runs: it ends early with what it measured (a slow
/// disk answers in bounded time).
const TEST_TIME_MAX: Duration = Duration::from_secs(10);
const SMALL_BYTES: u32 = 4096;
/// Reports an OSD keeps for their tickets.
const REPORTS_KEPT: usize = 8;

/// One test of a bench: what it did and how long its ops took.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct BenchTest {
    pub name: String,
    pub ops: u64,
    pub bytes: u64,
    pub secs: f64,
    pub iops: f64,
    pub mb_per_s: f64,
    pub lat_avg_us: f64,
    pub lat_p50_us: u64,
    pub lat_p99_us: u64,
    pub lat_max_us: u64,
}

impl BenchTest {
    /// The summary of `lat` (each op's latency, µs), `bytes` moved in
    /// `elapsed`.
    pub(crate) fn of(name: &str, mut lat: Vec<u64>, bytes: u64, elapsed: Duration) -> BenchTest {
        lat.sort_unstable();
        let n = lat.len() as u64;
        let secs = elapsed.as_secs_f64().max(1e-9);
        let at = |q: f64| -> u64 {
            match lat.len() {
                0 => 0,
                l => lat[((l as f64 * q).ceil() as usize).clamp(1, l) - 1],
            }
        };
        BenchTest {
            name: name.into(),
            ops: n,
            bytes,
            secs,
            iops: n as f64 / secs,
            mb_per_s: bytes as f64 / secs / 1e6,
            lat_avg_us: if n == 0 {
                0.0
            } else {
                lat.iter().sum::<u64>() as f64 / n as f64
            },
            lat_p50_us: at(0.5),
            lat_p99_us: at(0.99),
            lat_max_us: lat.last().copied().unwrap_or(0),
        }
    }
}

/// What one OSD's bench measured (`error`: why it stopped short; the
/// tests then hold what ran).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct BenchReport {
    pub osd: u32,
    pub bytes: u64,
    pub object_bytes: u32,
    pub tests: Vec<BenchTest>,
    pub error: Option<String>,
}

/// Tickets of the benches asked of this OSD: the one running, and the
/// reports of those done.
#[derive(Default)]
pub(crate) struct Benches {
    last: Cell<u64>,
    /// The ticket of the bench running, or 0 while the objects an earlier
    /// bench left are deleted (no bench starts meanwhile: its objects
    /// have the same names).
    running: Cell<Option<u64>>,
    reports: RefCell<std::collections::BTreeMap<u64, BenchReport>>,
    /// A link measure runs (`Op::NetBench`: one at a time, each holding
    /// megabytes in flight).
    pub(crate) measuring_link: Cell<bool>,
    /// The peers pinged (`Osd::ping_loop`) and the epoch they were found
    /// in; those with a ping in flight.
    pub(crate) pinged: RefCell<(u64, Vec<u32>)>,
    pub(crate) pinging: RefCell<std::collections::HashSet<u32>>,
}

type OpFut = Pin<Box<dyn Future<Output = Result<(), String>>>>;
/// Op `n` of a test.
type NthOp = Rc<dyn Fn(u64) -> OpFut>;
/// An I/O of `len` bytes at `offset` of bench object `n`.
type ObjectIo = Rc<dyn Fn(u64, u32, u32) -> OpFut>;

/// Runs `op(0)`, `op(1)`, … `qd` at a time until `ops` of them ended or
/// [`TEST_TIME_MAX`] passed; each op moves `bytes_per_op`. The first
/// error ends the test.
async fn run_test(
    name: &str,
    ops: u64,
    qd: usize,
    bytes_per_op: u64,
    op: NthOp,
) -> Result<BenchTest, String> {
    let next = Rc::new(Cell::new(0u64));
    let lat = Rc::new(RefCell::new(Vec::with_capacity(ops as usize)));
    let t0 = Instant::now();
    let workers: Vec<rt::JoinHandle<Result<(), String>>> = (0..qd.min(ops as usize).max(1))
        .map(|_| {
            let (next, lat, op) = (next.clone(), lat.clone(), op.clone());
            rt::spawn(async move {
                loop {
                    let n = next.get();
                    if n >= ops || t0.elapsed() >= TEST_TIME_MAX {
                        return Ok(());
                    }
                    next.set(n + 1);
                    let t = Instant::now();
                    op(n).await?;
                    lat.borrow_mut().push(t.elapsed().as_micros() as u64);
                }
            })
        })
        .collect();
    let mut first_err = None;
    for r in rt::join_all(workers).await {
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    if let Some(e) = first_err {
        return Err(format!("{name}: {e}"));
    }
    let lat = std::mem::take(&mut *lat.borrow_mut());
    let bytes = lat.len() as u64 * bytes_per_op;
    Ok(BenchTest::of(name, lat, bytes, t0.elapsed()))
}

/// Refuses a bench of `bytes` on a store with `space` and the nearfull
/// ratio `nearfull`: out of bounds, or it would take the store past
/// nearfull.
pub fn bench_refusal(
    bytes: u64,
    object_bytes: u32,
    space: &nacre_blockstore::Space,
    nearfull: f64,
) -> Option<String> {
    if !(BENCH_BYTES_MIN..=BENCH_BYTES_MAX).contains(&bytes) {
        return Some(format!(
            "a bench writes {BENCH_BYTES_MIN}..={BENCH_BYTES_MAX} bytes, not {bytes}"
        ));
    }
    let ob = u64::from(object_bytes);
    let need = bytes.div_ceil(ob) * ob;
    let room = (space.total_bytes as f64 * nearfull) as u64;
    if space.used_bytes + need > room {
        return Some(format!(
            "{need} bytes would take the store past its nearfull ratio ({} of {} bytes used, nearfull at {room})",
            space.used_bytes, space.total_bytes
        ));
    }
    None
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// `Op::Bench`: [`nacre_wire::BENCH_START`] (`obj_version` the bytes)
    /// answers at once with a ticket in `obj_version`, or refuses (one
    /// runs already: `Unavailable`; out of bounds, or the store too full:
    /// `Invalid` with the reason as text); [`nacre_wire::BENCH_REPORT`]
    /// (`obj_version` the ticket) answers the report (JSON) once done, no
    /// payload while it runs, `NotFound` for a ticket it does not know.
    pub(crate) fn answer_bench(self: &Rc<Self>, h: &Header) -> (Header, Option<AlignedBuf>) {
        let text = |s: Status, why: &str| {
            let r = h.reply(s).with_payload(why.as_bytes());
            (r, Some(AlignedBuf::from_slice(why.as_bytes())))
        };
        if h.sender != SENDER_CLIENT {
            return (h.reply(Status::Invalid), None);
        }
        match h.length {
            nacre_wire::BENCH_START => {
                let (nearfull, _) = self.ratios.get();
                let space = self.store.space();
                let ob = self.store.block_bytes();
                if let Some(why) = bench_refusal(h.obj_version, ob, &space, nearfull) {
                    return text(Status::Invalid, &why);
                }
                if self.benches.running.get().is_some() {
                    return text(
                        Status::Unavailable,
                        "a bench runs on this OSD already (or what one left is being deleted)",
                    );
                }
                let ticket = self.benches.last.get() + 1;
                self.benches.last.set(ticket);
                self.benches.running.set(Some(ticket));
                let me = self.clone();
                let bytes = h.obj_version;
                rt::spawn(async move {
                    let r = me.bench(bytes).await;
                    me.benches.running.set(None);
                    let mut reports = me.benches.reports.borrow_mut();
                    reports.insert(ticket, r);
                    while reports.len() > REPORTS_KEPT {
                        reports.pop_first();
                    }
                });
                let mut r = h.reply(Status::Ok);
                r.obj_version = ticket;
                (r, None)
            }
            nacre_wire::BENCH_REPORT => {
                let ticket = h.obj_version;
                if let Some(r) = self.benches.reports.borrow().get(&ticket) {
                    let body = serde_json::to_vec(r).expect("a report serialises");
                    return (
                        h.reply(Status::Ok).with_payload(&body),
                        Some(AlignedBuf::from_slice(&body)),
                    );
                }
                if self.benches.running.get() == Some(ticket) {
                    return (h.reply(Status::Ok), None);
                }
                (h.reply(Status::NotFound), None)
            }
            _ => (h.reply(Status::Invalid), None),
        }
    }

    /// Deletes every object of [`BENCH_VOLUME`] this store holds; how
    /// many.
    async fn bench_clean(&self) -> Result<usize, String> {
        let all = self.store.list_where(|o| o.volume == BENCH_VOLUME);
        for &(oid, v) in &all {
            match self.store.delete(oid, v + 1).await {
                Ok(()) | Err(nacre_blockstore::Error::NotFound(_)) => {}
                Err(e) => return Err(format!("deleting {oid}: {e}")),
            }
        }
        Ok(all.len())
    }

    /// Deletes what a bench this OSD was running when it stopped left
    /// (at its first boot; a bench started since keeps its own).
    pub(crate) async fn bench_leftovers(self: Rc<Self>) {
        if self.benches.running.get().is_some() {
            return;
        }
        self.benches.running.set(Some(0));
        let r = self.bench_clean().await;
        self.benches.running.set(None);
        match r {
            Ok(0) => {}
            Ok(n) => tracing::info!("osd.{}: deleted {n} objects an earlier bench left", self.id),
            Err(e) => tracing::warn!("osd.{}: deleting what an earlier bench left: {e}", self.id),
        }
    }

    /// Runs the bench over `bytes` and deletes its objects.
    async fn bench(self: &Rc<Self>, bytes: u64) -> BenchReport {
        let ob = self.store.block_bytes();
        let mut report = BenchReport {
            osd: self.id,
            bytes,
            object_bytes: ob,
            ..BenchReport::default()
        };
        let r = self.bench_tests(bytes, &mut report.tests).await;
        let cleaned = self.bench_clean().await;
        report.error = r.err().or(cleaned.err());
        tracing::info!(
            "osd.{}: bench of {bytes} bytes: {}",
            self.id,
            match &report.error {
                None => "done".to_string(),
                Some(e) => format!("stopped: {e}"),
            }
        );
        report
    }

    async fn bench_tests(
        self: &Rc<Self>,
        bytes: u64,
        tests: &mut Vec<BenchTest>,
    ) -> Result<(), String> {
        self.bench_clean().await?;
        let ob = self.store.block_bytes();
        let objects = bytes.div_ceil(u64::from(ob));
        let oid = |n: u64| ObjectId {
            volume: BENCH_VOLUME,
            block: n,
        };
        // Every write a version above the last.
        let version = Rc::new(Cell::new(0u64));
        let store = self.store.clone();
        let err = |e: nacre_blockstore::Error| e.to_string();
        let write = {
            let (store, version) = (store.clone(), version.clone());
            Rc::new(move |n: u64, off: u32, len: u32| -> OpFut {
                let (store, v) = (store.clone(), version.get() + 1);
                version.set(v);
                let mut data = AlignedBuf::zeroed(len as usize);
                for c in data.chunks_mut(SMALL_BYTES as usize) {
                    c[..8].copy_from_slice(&v.to_le_bytes());
                }
                Box::pin(async move { store.write(oid(n), v, off, data).await.map_err(err) })
            })
        };
        let read = {
            let store = store.clone();
            Rc::new(move |n: u64, off: u32, len: u32| -> OpFut {
                let store = store.clone();
                Box::pin(async move { store.read(oid(n), off, len).await.map(drop).map_err(err) })
            })
        };
        // The objects the first test wrote (all, unless its time ran out):
        // the others use those only.
        let written = Rc::new(Cell::new(objects));
        let small = {
            let written = written.clone();
            Rc::new(move |seed: u64, n: u64| -> (u64, u32) {
                // The `n`th pseudo-random number of stream `seed`.
                let r = nacre_types::SplitMix((seed << 32) ^ n).next_u64();
                let slots = u64::from(ob / SMALL_BYTES).max(1);
                (r % written.get(), ((r >> 32) % slots) as u32 * SMALL_BYTES)
            })
        };
        let whole = |f: ObjectIo| -> NthOp { Rc::new(move |n| f(n, 0, ob)) };
        let random = |f: ObjectIo, seed: u64| -> NthOp {
            let small = small.clone();
            Rc::new(move |n| {
                let (o, off) = small(seed, n);
                f(o, off, SMALL_BYTES)
            })
        };
        let (ob64, small64) = (u64::from(ob), u64::from(SMALL_BYTES));
        let first = run_test(
            "write-objects",
            objects,
            QD_LINEAR,
            ob64,
            whole(write.clone()),
        );
        let first = first.await?;
        written.set(first.ops);
        tests.push(first);
        if written.get() == 0 {
            return Err("no object written".into());
        }
        let plan: [(&str, u64, usize, NthOp); 4] = [
            ("randwrite-4k-qd1", QD1_OPS, 1, random(write.clone(), 1)),
            ("randwrite-4k-qd32", QDN_OPS, QD_RANDOM, random(write, 2)),
            ("randread-4k-qd1", QD1_OPS, 1, random(read.clone(), 3)),
            (
                "randread-4k-qd32",
                QDN_OPS,
                QD_RANDOM,
                random(read.clone(), 4),
            ),
        ];
        for (name, ops, qd, op) in plan {
            tests.push(run_test(name, ops, qd, small64, op).await?);
        }
        let last = run_test("read-objects", written.get(), QD_LINEAR, ob64, whole(read));
        tests.push(last.await?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Percentiles are of the sorted latencies (nearest rank), rates of
    /// the elapsed time; an empty test reports zeros, never a panic.
    #[test]
    fn a_test_summarises_its_latencies() {
        let lat: Vec<u64> = (1..=100).rev().collect();
        let t = BenchTest::of("x", lat, 100 * 4096, Duration::from_secs(2));
        assert_eq!(
            (t.ops, t.lat_p50_us, t.lat_p99_us, t.lat_max_us),
            (100, 50, 99, 100)
        );
        assert_eq!(t.lat_avg_us, 50.5);
        assert_eq!(t.iops, 50.0);
        assert!((t.mb_per_s - 0.2048).abs() < 1e-9);
        let e = BenchTest::of("e", Vec::new(), 0, Duration::ZERO);
        assert_eq!((e.ops, e.lat_p99_us, e.lat_avg_us), (0, 0, 0.0));
    }

    /// A bench is refused out of its bounds and where it would take the
    /// store past nearfull (whole objects counted).
    #[test]
    fn a_bench_that_would_fill_the_store_is_refused() {
        let space = |used: u64| nacre_blockstore::Space {
            total_bytes: 1 << 30,
            used_bytes: used,
            free_bytes: (1 << 30) - used,
            pending_free_bytes: 0,
        };
        let ob = 128 << 10;
        assert!(bench_refusal(4 << 20, ob, &space(0), 0.85).is_none());
        assert!(bench_refusal((4 << 20) - 1, ob, &space(0), 0.85).is_some());
        assert!(bench_refusal(BENCH_BYTES_MAX + 1, ob, &space(0), 0.85).is_some());
        // 0.85 GiB nearfull: 800 MiB used leaves 70.4 MiB.
        assert!(bench_refusal(64 << 20, ob, &space(800 << 20), 0.85).is_none());
        assert!(bench_refusal(72 << 20, ob, &space(800 << 20), 0.85).is_some());
        // 64 MiB + 1 byte takes 65 objects: refused where 64 MiB fits exactly.
        let room = (((1u64 << 30) as f64 * 0.85) as u64) - (64 << 20);
        assert!(bench_refusal(64 << 20, ob, &space(room), 0.85).is_none());
        assert!(bench_refusal((64 << 20) + 1, ob, &space(room), 0.85).is_some());
    }
}
