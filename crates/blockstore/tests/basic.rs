//! Behaviour of one store on the in-memory and fault devices.

mod common;

use nacre_blockstore::{Error, FormatOptions, LogEntry, LogOp, LogRegion, Store, StoreOptions};
use nacre_io::rt::block_on;
use nacre_io::{AlignedBuf, BlockDev, FaultDev, MemDev};
use nacre_types::ObjectId;

const MIB: u64 = 1 << 20;

fn fmt(block: u32) -> FormatOptions {
    FormatOptions {
        block_bytes: block,
        journal_bytes: Some(4 * MIB),
        pg_logs: LogRegion {
            slots: 16,
            slot_pages: 2,
        },
        ..FormatOptions::default()
    }
}

fn pattern(seed: u8, len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed.wrapping_mul(31).wrapping_add((i / 512) as u8) ^ (i as u8);
    }
    b
}

async fn fresh<D: BlockDev + Clone + 'static>(dev: &D, block: u32) -> Store<D> {
    Store::format(dev, &fmt(block)).await.unwrap();
    Store::open(dev.clone(), StoreOptions::default())
        .await
        .unwrap()
        .0
}

/// A fresh store of 64 KiB blocks holding objects `0..objs` of volume 5,
/// each written whole (version 1, `pattern(0, …)`).
async fn fresh_with_objects<D: BlockDev + Clone + 'static>(dev: &D, objs: u64) -> Store<D> {
    let s = fresh(dev, 64 << 10).await;
    for i in 0..objs {
        s.write(ObjectId::new(5, i), 1, 0, pattern(0, 64 << 10))
            .await
            .unwrap();
    }
    s
}

#[test]
fn write_read_partial_and_full() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 64 << 10).await;
        let a = ObjectId::new(1, 0);
        assert!(matches!(s.read(a, 0, 4096).await, Err(Error::NotFound(_))));
        // First write to an object: the rest reads as zeros.
        s.write(a, 1, 4096, pattern(1, 8192)).await.unwrap();
        let r = s.read(a, 0, 64 << 10).await.unwrap();
        assert!(r[..4096].iter().all(|&b| b == 0));
        assert_eq!(&r[4096..12288], &pattern(1, 8192)[..]);
        assert!(r[12288..].iter().all(|&b| b == 0));
        // Small overlapping writes through the journal, 512-byte granular.
        s.write(a, 2, 4096 + 512, pattern(2, 1024)).await.unwrap();
        s.write(a, 3, 0, pattern(3, 512)).await.unwrap();
        let r = s.read(a, 4096, 2048).await.unwrap();
        assert_eq!(&r[..512], &pattern(1, 8192)[..512]);
        assert_eq!(&r[512..1536], &pattern(2, 1024)[..]);
        assert_eq!(&r[1536..], &pattern(1, 8192)[1536..2048]);
        assert_eq!(&s.read(a, 0, 512).await.unwrap()[..], &pattern(3, 512)[..]);
        assert_eq!(s.version(a), Some(3));
        // A full-block write replaces everything.
        s.write(a, 4, 0, pattern(4, 64 << 10)).await.unwrap();
        assert_eq!(
            &s.read(a, 0, 64 << 10).await.unwrap()[..],
            &pattern(4, 64 << 10)[..]
        );
        // Fold the journal into blocks and read again.
        s.write(a, 5, 8192, pattern(5, 4096)).await.unwrap();
        s.checkpoint().await.unwrap();
        let r = s.read(a, 0, 64 << 10).await.unwrap();
        let mut want = pattern(4, 64 << 10).to_vec();
        want[8192..12288].copy_from_slice(&pattern(5, 4096));
        assert_eq!(&r[..], &want[..]);
        assert_eq!(s.list(), vec![(a, 5)]);
    });
}

#[test]
fn versions_are_monotonic_and_repeats_idempotent() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 64 << 10).await;
        let a = ObjectId::new(7, 7);
        s.write(a, 10, 0, pattern(1, 4096)).await.unwrap();
        let e = s.write(a, 9, 0, pattern(2, 4096)).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::StaleVersion {
                    given: 9,
                    current: 10,
                    ..
                }
            ),
            "{e}"
        );
        // Same version again: accepted, not applied twice.
        s.write(a, 10, 0, pattern(3, 4096)).await.unwrap();
        assert_eq!(
            &s.read(a, 0, 4096).await.unwrap()[..],
            &pattern(1, 4096)[..]
        );
        assert!(matches!(
            s.write(a, 0, 0, pattern(1, 512)).await,
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            s.delete(a, 9).await,
            Err(Error::StaleVersion { .. })
        ));
        s.delete(a, 11).await.unwrap();
        assert_eq!(s.version(a), None);
        assert!(matches!(s.delete(a, 12).await, Err(Error::NotFound(_))));
    });
}

#[test]
fn bad_requests_are_refused() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 64 << 10).await;
        let a = ObjectId::new(1, 1);
        for (off, len) in [
            (1u32, 512usize),
            (0, 100),
            (64 << 10, 512),
            ((64 << 10) - 512, 1024),
        ] {
            let e = s
                .write(a, 1, off, AlignedBuf::zeroed(len))
                .await
                .unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{off}+{len}: {e}");
        }
        s.write(a, 1, 0, pattern(1, 512)).await.unwrap();
        for (off, len) in [(0u32, 0u32), (3, 512), (0, (64 << 10) + 512)] {
            assert!(matches!(s.read(a, off, len).await, Err(Error::Invalid(_))));
        }
    });
}

#[test]
fn reopen_keeps_everything() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 16 << 10).await;
        for i in 0..200u64 {
            let oid = ObjectId::new(2, i);
            s.write(oid, i + 1, 0, pattern(i as u8, 16 << 10))
                .await
                .unwrap();
            s.write(oid, i + 2, 1024, pattern(i as u8 + 1, 2048))
                .await
                .unwrap();
            if i % 3 == 0 {
                s.checkpoint().await.unwrap();
            }
        }
        s.delete(ObjectId::new(2, 5), 100).await.unwrap();
        let before = s.list();
        drop(s); // no close: replay does the work
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert!(rep.records_replayed > 0);
        assert_eq!(rep.replay_stopped, None);
        assert_eq!(s.list(), before);
        for i in (0..200u64).filter(|&i| i != 5) {
            let mut want = pattern(i as u8, 16 << 10).to_vec();
            want[1024..3072].copy_from_slice(&pattern(i as u8 + 1, 2048));
            assert_eq!(
                &s.read(ObjectId::new(2, i), 0, 16 << 10).await.unwrap()[..],
                &want[..],
                "object {i}"
            );
        }
        // A clean close leaves nothing to replay.
        s.close().await.unwrap();
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(rep.records_replayed, 0);
        assert_eq!(s.list(), before);
    });
}

#[test]
fn full_store_reports_no_space_and_recovers_after_deletes() {
    block_on(async {
        let dev = MemDev::new(16 * MIB, 512);
        let s = fresh(&dev, 64 << 10).await;
        let mut n = 0u64;
        loop {
            match s
                .write(ObjectId::new(3, n), 1, 0, pattern(n as u8, 64 << 10))
                .await
            {
                Ok(()) => n += 1,
                Err(Error::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(n >= 16);
        assert_eq!(s.space().free_bytes, 0);
        // Still readable, and small writes to existing objects still work.
        assert_eq!(
            &s.read(ObjectId::new(3, 0), 0, 4096).await.unwrap()[..],
            &pattern(0, 4096)[..]
        );
        s.write(ObjectId::new(3, 0), 2, 0, pattern(9, 4096))
            .await
            .unwrap();
        for i in 0..4 {
            s.delete(ObjectId::new(3, i), 5).await.unwrap();
        }
        // Space returns (after the checkpoint the store takes by itself).
        for i in 0..4 {
            s.write(ObjectId::new(4, i), 1, 0, pattern(1, 64 << 10))
                .await
                .unwrap();
        }
        assert!(matches!(
            s.write(ObjectId::new(4, 99), 1, 0, pattern(1, 4096)).await,
            Err(Error::NoSpace)
        ));
        assert_eq!(
            &s.read(ObjectId::new(3, 5), 0, 4096).await.unwrap()[..],
            &pattern(5, 4096)[..]
        );
    });
}

/// With a full ratio, the last blocks are kept back from writes: a write
/// that needs a new block fails NoSpace once only they are free, while
/// recovery (logged or not) takes them, overwrites of allocated blocks go
/// on, and deleting makes room for writes again.
#[test]
fn a_full_ratio_keeps_blocks_for_recovery() {
    block_on(async {
        let dev = MemDev::new(16 * MIB, 512);
        let s = fresh(&dev, 64 << 10).await;
        let blocks = s.space().total_bytes / (64 << 10);
        s.set_full_ratio(0.75);
        let mut n = 0u64;
        let err = loop {
            match s
                .write(ObjectId::new(3, n), 1, 0, pattern(n as u8, 64 << 10))
                .await
            {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::NoSpace), "{err}");
        let kept = s.space().free_bytes / (64 << 10);
        assert_eq!(kept, (blocks as f64 * 0.25).floor() as u64, "{n} written");
        // Overwriting an object's allocated block in place still works.
        s.write(ObjectId::new(3, 0), 2, 4096, pattern(7, 4096))
            .await
            .unwrap();
        // Recovery takes the kept blocks, with and without a log entry.
        s.recover(ObjectId::new(5, 0), 9, pattern(5, 64 << 10))
            .await
            .unwrap();
        let e = LogEntry {
            pg: 1,
            version: 10,
            oid: ObjectId::new(5, 1),
            op: LogOp::Write,
            offset: 0,
            len: 4096,
            client: 0,
            request: 0,
        };
        s.recover_logged(e, pattern(6, 64 << 10)).await.unwrap();
        assert_eq!(s.space().free_bytes / (64 << 10), kept - 2);
        assert_eq!(
            &s.read(ObjectId::new(5, 1), 0, 4096).await.unwrap()[..],
            &pattern(6, 4096)[..]
        );
        assert!(matches!(
            s.write(ObjectId::new(4, 0), 1, 0, pattern(1, 4096)).await,
            Err(Error::NoSpace)
        ));
        // A whole-object recovery write of the size of a block only.
        assert!(matches!(
            s.recover(ObjectId::new(5, 2), 9, pattern(5, 4096)).await,
            Err(Error::Invalid(_))
        ));
        // Deleting makes room for writes again.
        for i in 0..4 {
            s.delete(ObjectId::new(3, i), 5).await.unwrap();
        }
        s.write(ObjectId::new(4, 0), 1, 0, pattern(1, 64 << 10))
            .await
            .unwrap();
    });
}

/// A write refused with NoSpace leaves nothing behind: the same version
/// tried again (the client's retry) is a new attempt, never taken as a
/// repeat of a write that happened — also while another write of the
/// object is still in flight.
#[test]
fn a_retry_after_no_space_is_not_a_repeat() {
    block_on(async {
        let dev = FaultDev::new(16 * MIB, 512);
        dev.set_yields(4);
        let s = fresh(&dev, 64 << 10).await;
        let mut n = 0u64;
        while s
            .write(ObjectId::new(3, n), 1, 0, pattern(1, 64 << 10))
            .await
            .is_ok()
        {
            n += 1;
        }
        let o = ObjectId::new(3, 0);
        // A small write in flight, then a whole-block write that finds no
        // free block, then its retry while the small one is still in flight.
        let small = {
            let s = s.clone();
            nacre_io::rt::spawn(async move { s.write(o, 2, 0, pattern(2, 4096)).await })
        };
        nacre_io::rt::yield_now().await;
        assert!(matches!(
            s.write(o, 3, 0, pattern(3, 64 << 10)).await,
            Err(Error::NoSpace)
        ));
        let retry = s.write(o, 3, 0, pattern(3, 64 << 10)).await;
        small.await.unwrap();
        match retry {
            Err(Error::NoSpace) => {}
            Ok(()) => assert!(
                s.read(o, 0, 64 << 10).await.unwrap()[..] == pattern(3, 64 << 10)[..],
                "the retry was acknowledged without being written"
            ),
            Err(e) => panic!("retry: {e}"),
        }
        assert_eq!(s.version(o), Some(if retry.is_ok() { 3 } else { 2 }));
    });
}

/// A repeat of a write that raced a delete of the object is not a new
/// write: the object stays deleted.
#[test]
fn a_repeat_racing_a_delete_does_not_resurrect() {
    block_on(async {
        let dev = FaultDev::new(16 * MIB, 512);
        dev.set_yields(4);
        let s = fresh(&dev, 64 << 10).await;
        let o = ObjectId::new(3, 0);
        s.write(o, 4, 0, pattern(1, 64 << 10)).await.unwrap();
        let spawn = |f: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>>>>| {
            nacre_io::rt::spawn(f)
        };
        let (a, b, c) = (s.clone(), s.clone(), s.clone());
        let write = spawn(Box::pin(
            async move { a.write(o, 5, 0, pattern(2, 4096)).await },
        ));
        nacre_io::rt::yield_now().await;
        let delete = spawn(Box::pin(async move { b.delete(o, 6).await }));
        nacre_io::rt::yield_now().await;
        let retry = spawn(Box::pin(
            async move { c.write(o, 5, 0, pattern(2, 4096)).await },
        ));
        write.await.unwrap();
        delete.await.unwrap();
        let _ = retry.await;
        assert_eq!(s.version(o), None, "a deleted object came back");
    });
}

/// Small writes one at a time (QD1) through a journal that folds ahead:
/// each write's own flush is about all the flushing there is, the folds
/// sharing theirs in groups (a group of the few writes one fold's latency
/// lets in cost a sync barrier and a flushed batch of Fold records each:
/// 1.2 flushes per write on a file, more here). Every write reads back.
#[test]
fn folding_ahead_at_qd1_shares_its_flushes() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let objs = 512u64;
        let s = fresh_with_objects(&dev, objs).await;
        let before = s.stats();
        // 16 MiB of 4 KiB writes through a 4 MiB journal.
        let ops = 4096u64;
        let mut last = std::collections::HashMap::new();
        let mut x = 12345u64;
        for n in 0..ops {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let (obj, chunk) = ((x >> 33) % objs, (x >> 20) % 16);
            let seed = n as u8;
            s.write(
                ObjectId::new(5, obj),
                n + 2,
                chunk as u32 * 4096,
                pattern(seed, 4096),
            )
            .await
            .unwrap();
            last.insert((obj, chunk), seed);
        }
        let after = s.stats();
        let syncs = after.syncs - before.syncs;
        assert!(
            after.flushed_overlays > before.flushed_overlays,
            "{after:?}"
        );
        assert!(
            syncs <= ops + ops / 20,
            "{syncs} flushes for {ops} writes: {after:?}"
        );
        for ((obj, chunk), seed) in last {
            assert_eq!(
                &s.read(ObjectId::new(5, obj), chunk as u32 * 4096, 4096)
                    .await
                    .unwrap()[..],
                &pattern(seed, 4096)[..]
            );
        }
    });
}

/// Many writers overwriting small pieces faster than the device folds
/// them: as the journal nears the space client writes may fill, the
/// writer paces them (`Stats::paced_waits`) so that the checkpoint catches
/// up before they reach it, instead of stopping every writer at the limit
/// until the checkpoint commits (`Stats::journal_full_waits`). Every
/// acknowledged byte reads back, and the writers finish about when the
/// device has done their folds. Virtual time, on a device whose 4 KiB
/// writes take 100 µs, 16 at once, while larger ones stream: the journal
/// (one write per batch of many writes) outruns the in-place folds (one
/// write per chunk).
#[test]
fn writers_faster_than_folds_are_paced_before_the_journal_fills() {
    nacre_io::rt::block_on_virtual(async {
        let small_write = std::time::Duration::from_micros(100);
        let (s, before, took) = paced_overwrites(small_write).await;
        let after = s.stats();
        // The store sustains what its folds allow: the writers finish
        // within 1.5 times the device's time for the in-place writes
        // alone (each 100 µs, 16 at once; measured 1.13 times). Virtual
        // time: deterministic. A pace that held writers back while the
        // checkpointer idled, or a stall, would fail this.
        let folds = after.flushed_overlays - before.flushed_overlays;
        let device = small_write * folds as u32 / 16;
        assert!(
            took <= device * 3 / 2,
            "{took:?} for {folds} folds ({device:?} of device time)"
        );
        assert_eq!(
            after.journal_full_waits, before.journal_full_waits,
            "writers met the journal's limit: {after:?}"
        );
    });
}

/// The same on the real runtime, where a paced writer waits on an
/// io_uring timer (virtual time runs none): writers are paced, paces run
/// out on their timers (not only when a checkpoint frees space), and
/// every acknowledged byte reads back. What depends on the machine's
/// speed (waits at the limit, throughput) is the virtual-time test's to
/// check.
#[test]
fn paced_writers_wake_on_real_timers() {
    block_on(async {
        if !nacre_io::rt::has_timers() {
            eprintln!("skipped: no io_uring timers here (pacing needs them)");
            return;
        }
        // Folds of 5 ms, 16 at once: slow enough that writers from memory
        // outrun them on a loaded machine and in a debug build (they need
        // about 3 200 writes a second; the device's time for the folds is
        // about 4 s).
        let small_write = std::time::Duration::from_millis(5);
        let run = paced_overwrites(small_write);
        let (s, before, _) = nacre_io::rt::timeout(std::time::Duration::from_secs(120), run)
            .await
            .expect("paced writers stalled");
        let after = s.stats();
        assert!(
            after.paced_timer_ends > before.paced_timer_ends,
            "no pace ended on its timer: {after:?}"
        );
    });
}

/// 512 writers, one per object, each overwriting 24 random 4 KiB chunks
/// of its 64 KiB object, on a fault device whose 4 KiB writes take
/// `small_write`, 16 at once (larger ones stream). Checks that the
/// journal cycled and every acknowledged byte reads back; gives the
/// store, its stats before the writes, and how long they took.
async fn paced_overwrites(
    small_write: std::time::Duration,
) -> (
    Store<FaultDev>,
    nacre_blockstore::Stats,
    std::time::Duration,
) {
    let dev = FaultDev::new(64 * MIB, 512);
    let objs = 512u64;
    let s = fresh_with_objects(&dev, objs).await;
    dev.set_small_write_time(Some(small_write), 16);
    let before = s.stats();
    let started = nacre_io::rt::monotonic();
    let last = std::rc::Rc::new(std::cell::RefCell::new(std::collections::HashMap::new()));
    let mut hs = Vec::new();
    // One writer per object: its versions rise without coordination.
    for w in 0..objs {
        let (s, last) = (s.clone(), last.clone());
        hs.push(nacre_io::rt::spawn(async move {
            let mut x = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for n in 0..24u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let chunk = (x >> 20) % 16;
                let seed = (w * 24 + n) as u8;
                let version = 2 + n;
                s.write(
                    ObjectId::new(5, w),
                    version,
                    chunk as u32 * 4096,
                    pattern(seed, 4096),
                )
                .await
                .unwrap();
                last.borrow_mut().insert((w, chunk), seed);
            }
        }));
    }
    for h in hs {
        h.await;
    }
    let took = nacre_io::rt::monotonic() - started;
    let after = s.stats();
    assert!(
        after.checkpoints > before.checkpoints + 2,
        "the test must cycle the journal: {after:?}"
    );
    assert!(after.paced_waits > before.paced_waits, "{after:?}");
    for ((obj, chunk), seed) in last.take() {
        assert_eq!(
            &s.read(ObjectId::new(5, obj), chunk as u32 * 4096, 4096)
                .await
                .unwrap()[..],
            &pattern(seed, 4096)[..]
        );
    }
    (s, before, took)
}

/// `checkpoint()` returns only once a checkpoint that began after the
/// call has committed: asked for while another runs (which may have
/// started before the caller's writes), it waits for the next one too.
/// Every op of the device gives way to other tasks first, so the second
/// call lands while the first checkpoint is under way.
#[test]
fn a_checkpoint_asked_for_during_another_waits_for_the_next() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 4096);
        let s = fresh_with_objects(&dev, 4).await;
        s.write(ObjectId::new(5, 0), 2, 4096, pattern(1, 4096))
            .await
            .unwrap();
        dev.set_yields(20);
        let before = s.stats().checkpoints;
        let first = nacre_io::rt::spawn({
            let s = s.clone();
            async move { s.checkpoint().await }
        });
        // Until the first checkpoint is under way (it has not committed).
        for _ in 0..50 {
            nacre_io::rt::yield_now().await;
        }
        assert_eq!(
            s.stats().checkpoints,
            before,
            "the first one committed already"
        );
        s.write(ObjectId::new(5, 1), 2, 4096, pattern(2, 4096))
            .await
            .unwrap();
        // Still under way as the second call comes (else this test shows
        // nothing).
        assert_eq!(
            s.stats().checkpoints,
            before,
            "the first one committed already"
        );
        s.checkpoint().await.unwrap();
        let after = s.stats().checkpoints;
        assert!(
            after >= before + 2,
            "checkpoint() returned after {} checkpoints committed, one of them begun before the call",
            after - before
        );
        first.await.unwrap();
    });
}

/// A checkpoint asked for on a clone of a store that has closed is an
/// error, not a wait for a checkpointer that has stopped.
#[test]
fn a_checkpoint_after_close_is_an_error() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh_with_objects(&dev, 2).await;
        let other = s.clone();
        s.close().await.unwrap();
        let r = other.checkpoint().await;
        assert!(
            matches!(&r, Err(Error::Failed(why)) if why.contains("closing")),
            "{r:?}"
        );
    });
}

#[test]
fn journal_wraps_many_times() {
    block_on(async {
        let dev = MemDev::new(32 * MIB, 512);
        let objs = 40u64;
        let s = fresh_with_objects(&dev, objs).await;
        // ~24 MiB of small writes through a 4 MiB journal.
        let mut last = vec![0u8; objs as usize];
        for round in 0..150u64 {
            let v = round + 2;
            let mut hs = Vec::new();
            for i in 0..objs {
                let s = s.clone();
                let seed = (round * 7 + i) as u8;
                last[i as usize] = seed;
                hs.push(nacre_io::rt::spawn(async move {
                    s.write(ObjectId::new(5, i), v, 4096, pattern(seed, 4096))
                        .await
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
        }
        assert!(s.stats().checkpoints >= 4, "{:?}", s.stats());
        for i in 0..objs {
            assert_eq!(
                &s.read(ObjectId::new(5, i), 4096, 4096).await.unwrap()[..],
                &pattern(last[i as usize], 4096)[..]
            );
        }
        drop(s);
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(rep.replay_stopped, None);
        for i in 0..objs {
            assert_eq!(
                &s.read(ObjectId::new(5, i), 4096, 4096).await.unwrap()[..],
                &pattern(last[i as usize], 4096)[..]
            );
        }
    });
}

#[test]
fn group_commit_shares_fsyncs() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        dev.set_latency(Some(std::time::Duration::from_micros(200)));
        let s = fresh(&dev, 64 << 10).await;
        for i in 0..64 {
            s.write(ObjectId::new(6, i), 1, 0, pattern(1, 64 << 10))
                .await
                .unwrap();
        }
        let syncs0 = dev.sync_count();
        let mut hs = Vec::new();
        for i in 0..64u64 {
            let s = s.clone();
            hs.push(nacre_io::rt::spawn(async move {
                s.write(ObjectId::new(6, i), 2, 0, pattern(2, 4096)).await
            }));
        }
        for h in hs {
            h.await.unwrap();
        }
        let used = dev.sync_count() - syncs0;
        assert!(used <= 8, "64 concurrent writes used {used} fsyncs");
    });
}

#[test]
fn unsynced_writes_and_barrier() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        let s = fresh(&dev, 64 << 10).await;
        let a = ObjectId::new(8, 0);
        s.write(a, 1, 0, pattern(1, 64 << 10)).await.unwrap();
        let syncs = dev.sync_count();
        s.write_unsynced(a, 2, 0, pattern(2, 4096)).await.unwrap();
        assert_eq!(dev.sync_count(), syncs, "an unsynced write does not fsync");
        assert_eq!(
            &s.read(a, 0, 4096).await.unwrap()[..],
            &pattern(2, 4096)[..]
        );
        s.sync().await.unwrap();
        assert_eq!(dev.sync_count(), syncs + 1);
        s.sync().await.unwrap();
        assert_eq!(dev.sync_count(), syncs + 1, "nothing new to make durable");
        let (dev2, _) = dev.power_cut(1);
        let (s2, _) = Store::open(dev2, StoreOptions::default()).await.unwrap();
        assert_eq!(
            &s2.read(a, 0, 4096).await.unwrap()[..],
            &pattern(2, 4096)[..]
        );
    });
}

#[test]
fn immediate_commit_never_fsyncs() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        Store::format(&dev, &fmt(64 << 10)).await.unwrap();
        let opts = StoreOptions {
            immediate_commit: true,
            ..StoreOptions::default()
        };
        let (s, _) = Store::open(dev.clone(), opts).await.unwrap();
        let syncs = dev.sync_count();
        for i in 0..50 {
            s.write(ObjectId::new(9, i), 1, 0, pattern(1, 8192))
                .await
                .unwrap();
            s.write(ObjectId::new(9, i), 2, 0, pattern(2, 4096))
                .await
                .unwrap();
        }
        s.checkpoint().await.unwrap();
        assert_eq!(dev.sync_count(), syncs);
    });
}

#[test]
fn freed_blocks_are_discarded_when_asked() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        Store::format(&dev, &fmt(64 << 10)).await.unwrap();
        let opts = StoreOptions {
            discard_freed: true,
            ..StoreOptions::default()
        };
        let (s, _) = Store::open(dev.clone(), opts).await.unwrap();
        let a = ObjectId::new(10, 1);
        s.write(a, 1, 0, pattern(7, 64 << 10)).await.unwrap();
        let g = s.geometry().clone();
        let b = s.block_of(a).unwrap();
        let used = s.space().used_bytes;
        s.delete(a, 2).await.unwrap();
        assert_eq!(s.space().pending_free_bytes, 64 << 10);
        s.checkpoint().await.unwrap();
        assert_eq!(s.space().pending_free_bytes, 0);
        assert_eq!(s.space().used_bytes, used - (64 << 10));
        let raw = dev
            .read_at(AlignedBuf::new(64 << 10), g.block_offset(b))
            .await
            .unwrap();
        assert!(
            raw.iter().all(|&x| x == 0),
            "the freed block was not discarded"
        );
    });
}

#[test]
fn a_full_journal_under_heavy_load_makes_progress() {
    // 128 writers on a minimal journal: client batches hit the journal's
    // limit while the checkpointer folds ahead and checkpoints. Every write
    // must complete (a deadlock panics the runtime) and read back.
    block_on(async {
        let dev = FaultDev::new(32 * MIB, 512);
        dev.set_yields(1);
        let f = FormatOptions {
            block_bytes: 16 << 10,
            journal_bytes: Some(2_359_296),
            ..FormatOptions::default()
        };
        Store::format(&dev, &f).await.unwrap();
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        for i in 0..256u64 {
            s.write(ObjectId::new(11, i), 1, 0, pattern(0, 16 << 10))
                .await
                .unwrap();
        }
        let version = std::rc::Rc::new(std::cell::Cell::new(10u64));
        let mut workers = Vec::new();
        for w in 0..128u64 {
            let (s, version) = (s.clone(), version.clone());
            workers.push(nacre_io::rt::spawn(async move {
                for k in 0..40u64 {
                    let v = version.get() + 1;
                    version.set(v);
                    let obj = (w * 37 + k * 11) % 256;
                    s.write(
                        ObjectId::new(11, obj),
                        v,
                        ((k % 4) * 4096) as u32,
                        pattern(v as u8, 4096),
                    )
                    .await
                    .unwrap();
                }
            }));
        }
        for h in workers {
            h.await;
        }
        assert!(s.stats().checkpoints >= 2, "{:?}", s.stats());
        s.close().await.unwrap();
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(rep.records_replayed, 0);
        assert_eq!(s.object_count(), 256);
    });
}

/// Small-write data not yet folded is read from the overlay cache, not the
/// journal: with every journal read failing, a read of it still returns
/// the bytes written (checked against their write-time checksums); with no
/// cache the same read goes to the journal, and fails.
#[test]
fn reads_of_unfolded_small_writes_come_from_memory() {
    for cache in [true, false] {
        block_on(async move {
            let dev = FaultDev::new(64 * MIB, 512);
            Store::format(&dev, &fmt(64 << 10)).await.unwrap();
            let opts = StoreOptions {
                overlay_cache_bytes: if cache { 1 << 20 } else { 0 },
                ..StoreOptions::default()
            };
            let (s, _) = Store::open(dev.clone(), opts).await.unwrap();
            let a = ObjectId::new(1, 0);
            s.write(a, 1, 0, pattern(1, 64 << 10)).await.unwrap();
            s.write(a, 2, 4096 + 512, pattern(2, 8192)).await.unwrap();
            let mut want = pattern(1, 64 << 10).to_vec();
            want[4096 + 512..4096 + 512 + 8192].copy_from_slice(&pattern(2, 8192));
            let g = s.geometry().clone();
            dev.fail_range(g.journal_offset, g.journal_bytes, true, false);
            let r = s.read(a, 0, 16384).await;
            match cache {
                true => {
                    assert_eq!(&r.unwrap()[..], &want[..16384]);
                    assert_eq!(s.stats().overlay_cache_reads, 1);
                }
                false => {
                    assert!(r.is_err(), "read the journal's data without the journal");
                    assert_eq!(s.stats().overlay_cache_reads, 0);
                }
            }
            dev.clear_failures();
            // The journal readable again, both read the same.
            assert_eq!(&s.read(a, 0, 16384).await.unwrap()[..], &want[..16384]);
            s.close().await.unwrap();
        });
    }
}

#[test]
fn reads_under_folding_always_see_the_latest_write() {
    // Workers own disjoint objects and check every read against their own
    // model while the journal keeps filling: folds ahead, checkpoints and
    // block rewrites run under them all the time.
    for seed in 0..4u64 {
        block_on(async move {
            let dev = FaultDev::new(48 * MIB, 512);
            dev.set_yields((seed % 3) as u32);
            let f = FormatOptions {
                block_bytes: 16 << 10,
                journal_bytes: Some(2_359_296),
                ..FormatOptions::default()
            };
            Store::format(&dev, &f).await.unwrap();
            let (s, _) = Store::open(dev.clone(), StoreOptions::default())
                .await
                .unwrap();
            const WORKERS: u64 = 48;
            const OBJS: u64 = 4; // per worker
            let mut hs = Vec::new();
            for w in 0..WORKERS {
                let s = s.clone();
                hs.push(nacre_io::rt::spawn(async move {
                    let mut model = vec![vec![0u8; 16 << 10]; OBJS as usize];
                    let mut rng = nacre_io::fault::SplitMix(seed * 1000 + w);
                    let mut v = 1u64;
                    for o in 0..OBJS {
                        s.write(ObjectId::new(w, o), v, 0, AlignedBuf::from_slice(&model[o as usize])).await.unwrap();
                    }
                    for step in 0..150u64 {
                        v += 1;
                        let o = rng.below(OBJS);
                        let m = &mut model[o as usize];
                        match rng.below(10) {
                            0 => {
                                // Whole-block rewrite (a new block).
                                let b = pattern((v + w) as u8, 16 << 10);
                                m.copy_from_slice(&b);
                                s.write(ObjectId::new(w, o), v, 0, b).await.unwrap();
                            }
                            1..=6 => {
                                let sectors = 1 + rng.below(8) as usize;
                                let at = rng.below(32 - sectors as u64) as usize * 512;
                                let b = pattern((v * 7 + w + step) as u8, sectors * 512);
                                m[at..at + b.len()].copy_from_slice(&b);
                                s.write(ObjectId::new(w, o), v, at as u32, b).await.unwrap();
                            }
                            _ => {
                                let at = rng.below(4) as u32 * 4096;
                                let got = s.read(ObjectId::new(w, o), at, 4096).await.unwrap_or_else(|e| {
                                    panic!("seed {seed} worker {w} object {o} step {step}: {e}")
                                });
                                assert!(got[..] == m[at as usize..at as usize + 4096], "seed {seed} worker {w} object {o} step {step}: stale or wrong data");
                            }
                        }
                    }
                    for o in 0..OBJS {
                        let got = s.read(ObjectId::new(w, o), 0, 16 << 10).await.unwrap();
                        assert!(got[..] == model[o as usize][..], "seed {seed} worker {w} object {o}: final read");
                    }
                }));
            }
            for h in hs {
                h.await;
            }
            assert!(s.stats().checkpoints >= 1, "{:?}", s.stats());
        });
    }
}

fn entry(pg: u64, version: u64, obj: u64, op: LogOp, request: u64) -> LogEntry {
    let (offset, len) = match op {
        LogOp::Write => (0, 4096),
        LogOp::Delete => (0, 0),
    };
    LogEntry {
        pg,
        version,
        oid: ObjectId::new(3, obj),
        op,
        offset,
        len,
        client: 11,
        request,
    }
}

/// PG logs: entries ride with their ops, survive replay, checkpoints and
/// a clean close; rewinds, trims, removals and forgotten entries persist;
/// tombstones of absent objects are logged.
#[test]
fn pg_logs_survive_replay_checkpoints_and_close() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 16 << 10).await;
        for v in 1..=6u64 {
            let e = entry(1, v, v % 3, LogOp::Write, v);
            s.write_logged(e, 0, pattern(v as u8, 4096)).await.unwrap();
        }
        // A delete of an object this copy has, and a tombstone of one it
        // never had.
        s.delete_logged(entry(1, 7, 0, LogOp::Delete, 7))
            .await
            .unwrap();
        s.delete_logged(entry(1, 8, 40, LogOp::Delete, 8))
            .await
            .unwrap();
        s.log_only(entry(2, 5, 9, LogOp::Write, 1)).await.unwrap();
        assert_eq!(s.pg_logs(), vec![1, 2]);
        let want1 = s.pg_log(1).unwrap();
        assert_eq!((want1.entries.len(), want1.head()), (8, 8));
        assert!(s.read(ObjectId::new(3, 0), 0, 4096).await.is_err());
        // Replay only.
        drop(s);
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(s.pg_log(1).unwrap(), want1);
        assert_eq!(s.pg_log(2).unwrap().head(), 5);
        // Checkpointed, then changed: trim, rewind, forget, remove.
        s.checkpoint().await.unwrap();
        s.pg_trim(1, 2);
        s.pg_rewind(1, 6).await.unwrap();
        s.pg_forget(1, 4).await.unwrap();
        // Forgetting what the log lacks changes nothing; version 0 names
        // no op (the journal would refuse such a record at replay).
        s.pg_forget(1, 7).await.unwrap();
        s.pg_forget(3, 1).await.unwrap();
        assert!(matches!(s.pg_forget(1, 0).await, Err(Error::Invalid(_))));
        s.pg_remove(2).await.unwrap();
        let want1 = s.pg_log(1).unwrap();
        assert_eq!(want1.tail, 2);
        assert_eq!(
            want1.entries.keys().copied().collect::<Vec<_>>(),
            vec![3, 5, 6]
        );
        // The object of a forgotten entry stays: only history changes.
        assert_eq!(s.version(ObjectId::new(3, 1)), Some(4));
        s.checkpoint().await.unwrap();
        drop(s);
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(rep.replay_stopped, None);
        assert_eq!(s.pg_logs(), vec![1]);
        assert_eq!(s.pg_log(1).unwrap(), want1);
        // Changes after the checkpoint come back from the journal, on top
        // of the slots.
        s.write_logged(entry(1, 9, 1, LogOp::Write, 9), 0, pattern(9, 4096))
            .await
            .unwrap();
        s.log_only(entry(4, 1, 1, LogOp::Write, 1)).await.unwrap();
        s.pg_forget(1, 5).await.unwrap();
        let want1 = s.pg_log(1).unwrap();
        assert_eq!(
            want1.entries.keys().copied().collect::<Vec<_>>(),
            vec![3, 6, 9]
        );
        drop(s);
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(s.pg_logs(), vec![1, 4]);
        assert_eq!(s.pg_log(1).unwrap(), want1);
        s.close().await.unwrap();
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(rep.records_replayed, 0);
        assert_eq!(s.pg_log(1).unwrap(), want1);
        assert_eq!(
            &s.read(ObjectId::new(3, 1), 0, 4096).await.unwrap()[..],
            &pattern(9, 4096)[..]
        );
    });
}

/// A PG's recovering mark and a raised tail are durable: through the
/// journal and checkpoints; the mark goes with the log; either makes a
/// log for a PG without one (counted against the slots), and a log that
/// holds nothing but the mark is not forgotten.
#[test]
fn the_recovering_mark_and_a_raised_tail_survive_replay_and_checkpoints() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 16 << 10).await;
        s.write_logged(entry(1, 1, 1, LogOp::Write, 1), 0, pattern(1, 4096))
            .await
            .unwrap();
        s.pg_mark_recovering(1, true).await.unwrap();
        s.pg_mark_recovering(2, true).await.unwrap();
        assert!(s.pg_recovering(1) && s.pg_recovering(2) && !s.pg_recovering(3));
        assert_eq!(s.pg_logs(), vec![1, 2]);
        let mut s = s;
        for checkpoint in [false, true] {
            let (t, rep) = common::reopen(s, &dev, checkpoint).await;
            assert_eq!(rep.replay_stopped, None);
            assert!(t.pg_recovering(1) && t.pg_recovering(2), "{checkpoint}");
            assert_eq!(t.pg_log(1).unwrap().head(), 1);
            s = t;
        }
        s.pg_mark_recovering(1, false).await.unwrap();
        s.pg_raise_tail(5, 40).await.unwrap();
        s.pg_remove(2).await.unwrap();
        s.pg_mark_recovering(3, true).await.unwrap();
        s.pg_mark_recovering(3, false).await.unwrap();
        for checkpoint in [false, true] {
            let (t, _) = common::reopen(s, &dev, checkpoint).await;
            assert!(!t.pg_recovering(1) && !t.pg_recovering(2) && !t.pg_recovering(3));
            assert_eq!(t.pg_log(1).unwrap().entries.len(), 1);
            // A raised tail makes a log, durably.
            assert_eq!(t.pg_log(5).unwrap().tail, 40);
            s = t;
        }
        // 16 slots: a mark that would make a 17th log is refused.
        for pg in 10..24 {
            s.log_only(entry(pg, 1, 1, LogOp::Write, 1)).await.unwrap();
        }
        let r = s.pg_mark_recovering(99, true).await;
        assert!(matches!(r, Err(Error::PgLogsFull { slots: 16 })), "{r:?}");
        s.pg_mark_recovering(10, true).await.unwrap();
    });
}

/// One version, one op: a repeat of a logged write is done only when the
/// log gives its version to the same op; another op at that version is
/// refused and changes nothing.
#[test]
fn a_logged_version_repeat_must_be_the_same_op() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 16 << 10).await;
        let e = entry(1, 5, 1, LogOp::Write, 50);
        s.write_logged(e, 0, pattern(1, 4096)).await.unwrap();
        // The same op again (a retry): done.
        s.write_logged(e, 0, pattern(1, 4096)).await.unwrap();
        // Another request at the same version: refused.
        let other = LogEntry { request: 51, ..e };
        assert!(matches!(
            s.write_logged(other, 0, pattern(2, 4096)).await,
            Err(Error::Invalid(_))
        ));
        let del = entry(1, 5, 1, LogOp::Delete, 52);
        assert!(matches!(s.delete_logged(del).await, Err(Error::Invalid(_))));
        assert_eq!(
            &s.read(ObjectId::new(3, 1), 0, 4096).await.unwrap()[..],
            &pattern(1, 4096)[..]
        );
        assert_eq!(s.pg_log(1).unwrap().entries[&5], e);
        // An entry that does not describe its op is refused.
        assert!(matches!(
            s.write_logged(entry(1, 6, 1, LogOp::Delete, 60), 0, pattern(3, 4096))
                .await,
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            s.write_logged(entry(1, 6, 1, LogOp::Write, 60), 512, pattern(3, 4096))
                .await,
            Err(Error::Invalid(_))
        ));
    });
}

/// A store holds as many PG logs as it has slots; a removal frees one.
#[test]
fn pg_log_slots_are_bounded() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 16 << 10).await;
        for pg in 0..16 {
            s.log_only(entry(pg, 1, 1, LogOp::Write, 1)).await.unwrap();
        }
        let r = s
            .write_logged(entry(16, 2, 2, LogOp::Write, 2), 0, pattern(1, 4096))
            .await;
        assert!(matches!(r, Err(Error::PgLogsFull { slots: 16 })), "{r:?}");
        assert!(matches!(
            s.read(ObjectId::new(3, 2), 0, 4096).await,
            Err(Error::NotFound(_))
        ));
        s.pg_remove(3).await.unwrap();
        s.checkpoint().await.unwrap();
        s.log_only(entry(16, 2, 2, LogOp::Write, 2)).await.unwrap();
        s.checkpoint().await.unwrap();
        drop(s);
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        let mut want: Vec<u64> = (0..17).filter(|&p| p != 3).collect();
        want.sort_unstable();
        assert_eq!(s.pg_logs(), want);
    });
}

/// A damaged PG log slot is refused at open, not read as an empty log.
#[test]
fn a_damaged_pg_log_slot_is_refused() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 16 << 10).await;
        s.log_only(entry(7, 1, 1, LogOp::Write, 1)).await.unwrap();
        s.checkpoint().await.unwrap();
        let g = s.geometry().clone();
        drop(s);
        // The first log takes slot 0; flip a byte of its entry in both copies.
        for copy in 0..2 {
            let at = g.pglog_slot_pos(0, copy) + 200;
            let mut b = dev.read_at(AlignedBuf::new(512), at - 200).await.unwrap();
            b[200] ^= 0x40;
            dev.write_at(b, at - 200).await.unwrap();
        }
        match Store::open(dev.clone(), StoreOptions::default()).await {
            Err(Error::Corrupt(why)) => assert!(why.contains("PG log slot 0"), "{why}"),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a damaged PG log opened"),
        }
    });
}

/// The admission rules of logged ops (from an adversarial review): a
/// version is one op across every object of a PG, a late retry of an op
/// the log already holds is done (it does not bring a deleted object
/// back), entries at or below the tail are refused, no rewind goes below
/// the tail, and a failed op leaves no log behind.
#[test]
fn logged_ops_are_admitted_by_their_log() {
    block_on(async {
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, 16 << 10).await;
        s.write_logged(entry(1, 10, 1, LogOp::Write, 1), 0, pattern(1, 4096))
            .await
            .unwrap();
        // Another object at a version of the PG already taken.
        let r = s
            .write_logged(entry(1, 10, 2, LogOp::Write, 2), 0, pattern(2, 4096))
            .await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
        assert!(matches!(
            s.read(ObjectId::new(3, 2), 0, 4096).await,
            Err(Error::NotFound(_))
        ));
        // A late retry after the object was deleted: done, still deleted.
        s.delete_logged(entry(1, 11, 1, LogOp::Delete, 3))
            .await
            .unwrap();
        s.write_logged(entry(1, 10, 1, LogOp::Write, 1), 0, pattern(1, 4096))
            .await
            .unwrap();
        assert!(matches!(
            s.read(ObjectId::new(3, 1), 0, 4096).await,
            Err(Error::NotFound(_))
        ));
        // Trimmed history is closed.
        s.pg_trim(1, 11);
        let r = s
            .write_logged(entry(1, 11, 5, LogOp::Write, 5), 0, pattern(5, 4096))
            .await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
        assert!(matches!(s.pg_rewind(1, 3).await, Err(Error::Invalid(_))));
        // A logged op that fails leaves no log for its PG.
        s.write(ObjectId::new(3, 7), 50, 0, pattern(7, 4096))
            .await
            .unwrap();
        let r = s
            .write_logged(entry(9, 20, 7, LogOp::Write, 9), 0, pattern(8, 4096))
            .await;
        assert!(matches!(r, Err(Error::StaleVersion { .. })), "{r:?}");
        assert_eq!(s.pg_logs(), vec![1]);
    });
}

/// An undoable write at `version` of `len` bytes at `offset` of object
/// `obj` (PG 100 + `obj`).
fn undo_entry(version: u64, obj: u64, offset: u32, len: u32) -> LogEntry {
    LogEntry {
        offset,
        len,
        ..entry(100 + obj, version, obj, LogOp::Write, version)
    }
}

/// Undoable writes: what each replaced is kept, with its version, across
/// checkpoints and a reopen, until released; a later write or a delete
/// drops it, a repair keeps it; the bytes kept are bounded; repeats and
/// stale or malformed writes are answered without a new undo.
#[test]
fn undoable_writes_keep_what_they_replaced_until_released() {
    block_on(async {
        const B: u32 = 64 << 10;
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, B).await;
        let a = ObjectId::new(3, 0);
        // A new object: the undo says it did not exist.
        let e1 = undo_entry(1, 0, 0, 4096);
        s.write_undoable(e1, 0, 4096, |old| {
            assert!(old.is_none());
            pattern(1, 4096)
        })
        .await
        .unwrap();
        let u = s.undo(a).await.unwrap().expect("undo");
        assert_eq!((u.version, u.before.is_none()), (1, true));
        // An overwrite: `make` sees the old bytes, the undo keeps them.
        let e2 = undo_entry(2, 0, 0, 8192);
        s.write_undoable(e2, 0, 8192, |old| {
            let old = old.expect("old bytes");
            assert_eq!(&old[..4096], &pattern(1, 4096)[..]);
            assert!(old[4096..].iter().all(|&b| b == 0));
            pattern(2, 8192)
        })
        .await
        .unwrap();
        let check = |u: nacre_blockstore::Undo| {
            assert_eq!(u.version, 2);
            let (off, b) = u.before.expect("bytes");
            assert_eq!(off, 0);
            assert_eq!(&b[..4096], &pattern(1, 4096)[..]);
            assert!(b[4096..].iter().all(|&x| x == 0));
        };
        check(s.undo(a).await.unwrap().expect("undo"));
        // A repeat (of the newest op or an older one) is done without
        // making anything; a stale version, a mismatched entry and another
        // op at the version are refused.
        s.write_undoable(e2, 0, 8192, |_| panic!("a repeat made bytes"))
            .await
            .unwrap();
        s.write_undoable(e1, 0, 4096, |_| panic!("a repeat made bytes"))
            .await
            .unwrap();
        let taken = s
            .write_undoable(LogEntry { request: 98, ..e1 }, 0, 4096, |_| {
                pattern(9, 4096)
            })
            .await;
        assert!(matches!(taken, Err(Error::Invalid(_))), "{taken:?}");
        let stale = s
            .write_undoable(LogEntry { pg: 2, ..e1 }, 0, 4096, |_| pattern(9, 4096))
            .await;
        assert!(
            matches!(stale, Err(Error::StaleVersion { .. })),
            "{stale:?}"
        );
        assert!(matches!(
            s.write_undoable(undo_entry(3, 0, 0, 4096), 512, 4096, |_| pattern(9, 4096))
                .await,
            Err(Error::Invalid(_))
        ));
        let other = LogEntry { request: 99, ..e2 };
        assert!(matches!(
            s.write_undoable(other, 0, 8192, |_| pattern(9, 8192)).await,
            Err(Error::Invalid(_))
        ));
        check(s.undo(a).await.unwrap().expect("undo"));
        // Kept across checkpoints (which journal it again) and a reopen.
        let s = checkpointed_and_reopened(s, &dev).await;
        check(s.undo(a).await.unwrap().expect("undo after reopen"));
        assert_eq!(s.undos(), vec![(a, 2)]);
        // A repair (the same version again) keeps it; a later write drops it.
        let whole = s.read(a, 0, B).await.unwrap();
        s.repair(a, 2, whole).await.unwrap();
        check(s.undo(a).await.unwrap().expect("undo after a repair"));
        s.write(a, 3, 0, pattern(3, 4096)).await.unwrap();
        assert!(s.undo(a).await.unwrap().is_none());
        // A delete drops it.
        let b = ObjectId::new(3, 1);
        s.write(b, 1, 0, pattern(4, B as usize)).await.unwrap();
        s.write_undoable(undo_entry(2, 1, 0, B), 0, B, |_| pattern(5, B as usize))
            .await
            .unwrap();
        assert_eq!(s.undos(), vec![(b, 2)]);
        s.delete(b, 3).await.unwrap();
        assert!(s.undos().is_empty());
        // Released: gone (and not brought back by a checkpoint).
        s.write_undoable(undo_entry(4, 0, 4096, 4096), 4096, 4096, |_| {
            pattern(6, 4096)
        })
        .await
        .unwrap();
        s.release_undo(a, 3);
        assert_eq!(
            s.undos(),
            vec![(a, 4)],
            "a release below the version keeps it"
        );
        s.release_undo(a, 4);
        s.checkpoint().await.unwrap();
        assert!(s.undo(a).await.unwrap().is_none());
        // What the undos held cost the journal is bounded (a sixteenth of
        // the 4 MiB journal: three whole blocks with their headers); the
        // fourth waits for a release.
        for obj in 10..20 {
            s.write(ObjectId::new(3, obj), 1, 0, pattern(7, B as usize))
                .await
                .unwrap();
        }
        let undoable = |obj: u64, v: u64| {
            let s = s.clone();
            nacre_io::rt::spawn(async move {
                s.write_undoable(undo_entry(v, obj, 0, B), 0, B, |_| pattern(8, B as usize))
                    .await
            })
        };
        for obj in 10..13 {
            undoable(obj, 2).await.unwrap();
        }
        let fourth = undoable(13, 2);
        for _ in 0..50 {
            nacre_io::rt::yield_now().await;
        }
        assert_eq!(s.undos().len(), 3, "the fourth undo did not wait for room");
        s.release_undo(ObjectId::new(3, 10), 2);
        fourth.await.unwrap();
        assert_eq!(s.undos().len(), 3);
        // Many waiting at once, more than the room holds together: each
        // goes in as room frees (none waits for the others' claims).
        for obj in 11..14 {
            s.release_undo(ObjectId::new(3, obj), 2);
        }
        let many: Vec<_> = (14..20).map(|obj| undoable(obj, 2)).collect();
        for (i, w) in many.into_iter().enumerate() {
            w.await.unwrap();
            s.release_undo(ObjectId::new(3, 14 + i as u64), 2);
        }
        assert!(s.undos().is_empty());
        s.close().await.unwrap();
    });
}

/// An undoable write larger than the undo room (a sixteenth of the
/// journal) is refused, not left waiting forever.
#[test]
fn an_undo_larger_than_its_room_is_refused() {
    block_on(async {
        const B: u32 = 1 << 20;
        let dev = MemDev::new(64 * MIB, 512);
        let f = FormatOptions {
            journal_bytes: Some(5 * MIB),
            ..fmt(B)
        };
        Store::format(&dev, &f).await.unwrap();
        let s = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap()
            .0;
        let a = ObjectId::new(3, 0);
        s.write(a, 1, 0, pattern(1, B as usize)).await.unwrap();
        let r = s
            .write_undoable(undo_entry(2, 0, 0, B), 0, B, |_| pattern(2, B as usize))
            .await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
        s.write_undoable(undo_entry(2, 0, 0, 256 << 10), 0, 256 << 10, |_| {
            pattern(2, 256 << 10)
        })
        .await
        .unwrap();
        s.close().await.unwrap();
    });
}

/// A whole-block undoable write given its bytes keeps the old block as its
/// undo (no read, no undo bytes journaled): the undo reads as the old
/// block, across checkpoints and a reopen; the kept block shows in no
/// listing or count, no op may name it, and it is freed once released,
/// dropped by a later write or by a delete — the space used comes back.
/// A partial write, or one over an object with overlays, keeps bytes.
#[test]
fn a_whole_block_replaced_undoably_keeps_the_old_block() {
    block_on(async {
        const B: u32 = 64 << 10;
        let dev = MemDev::new(64 * MIB, 512);
        let s = fresh(&dev, B).await;
        let (a, b) = (ObjectId::new(3, 0), ObjectId::new(3, 1));
        s.write(a, 1, 0, pattern(1, B as usize)).await.unwrap();
        s.write(b, 1, 0, pattern(2, B as usize)).await.unwrap();
        let used = s.space().used_bytes;
        let journal = s.journal_used_bytes();
        s.replace_undoable(undo_entry(2, 0, 0, B), 0, pattern(3, B as usize))
            .await
            .unwrap();
        assert!(
            s.journal_used_bytes() - journal < u64::from(B) / 4,
            "the old block's bytes were journaled"
        );
        assert_eq!(s.space().used_bytes, used + u64::from(B), "one block more");
        let check = |u: Option<nacre_blockstore::Undo>, want: u8| {
            let u = u.expect("undo");
            assert_eq!(u.version, 2);
            let (off, bytes) = u.before.expect("bytes");
            assert_eq!((off, &bytes[..]), (0, &pattern(want, B as usize)[..]));
        };
        check(s.undo(a).await.unwrap(), 1);
        assert_eq!(
            s.read(a, 0, B).await.unwrap()[..],
            pattern(3, B as usize)[..]
        );
        assert_eq!(s.list().len(), 2);
        assert_eq!(s.object_count(), 2);
        // The kept block's name (bit 55 of the block index) is refused.
        let h = ObjectId::new(3, 1 << 55);
        assert!(matches!(s.read(h, 0, 4096).await, Err(Error::Invalid(_))));
        assert!(matches!(
            s.write(h, 9, 0, pattern(9, 4096)).await,
            Err(Error::Invalid(_))
        ));
        // Across checkpoints and a reopen.
        let s = checkpointed_and_reopened(s, &dev).await;
        check(s.undo(a).await.unwrap(), 1);
        assert_eq!((s.list().len(), s.object_count()), (2, 2));
        assert_eq!(s.space().used_bytes, used + u64::from(B));
        // Released: the block is free after the next checkpoint.
        s.release_undo(a, 2);
        assert!(s.undo(a).await.unwrap().is_none());
        s.checkpoint().await.unwrap();
        assert_eq!(s.space().used_bytes, used);
        // Dropped by a later write, and by a delete.
        s.replace_undoable(undo_entry(3, 0, 0, B), 0, pattern(4, B as usize))
            .await
            .unwrap();
        check_version(&s, a, 3).await;
        s.write(a, 4, 0, pattern(5, 4096)).await.unwrap();
        assert!(s.undo(a).await.unwrap().is_none());
        s.replace_undoable(undo_entry(2, 1, 0, B), 0, pattern(6, B as usize))
            .await
            .unwrap();
        check(s.undo(b).await.unwrap(), 2);
        s.delete(b, 3).await.unwrap();
        assert!(s.undos().is_empty());
        s.checkpoint().await.unwrap();
        s.checkpoint().await.unwrap();
        assert_eq!(
            s.space().used_bytes,
            used - u64::from(B),
            "b's blocks are free"
        );
        // With an overlay (a 4 KiB write not folded yet) the undo is bytes.
        s.write(a, 5, 0, pattern(8, 4096)).await.unwrap();
        let j = s.journal_used_bytes();
        s.replace_undoable(undo_entry(6, 0, 0, B), 0, pattern(7, B as usize))
            .await
            .unwrap();
        assert!(s.journal_used_bytes() - j >= u64::from(B), "no undo bytes");
        let u = s.undo(a).await.unwrap().expect("undo");
        let mut want = pattern(4, B as usize);
        want[..4096].copy_from_slice(&pattern(8, 4096));
        assert_eq!(u.before.expect("bytes").1[..], want[..]);
    });
}

/// `s` after two checkpoints, closed and opened again.
async fn checkpointed_and_reopened(s: Store<MemDev>, dev: &MemDev) -> Store<MemDev> {
    s.checkpoint().await.unwrap();
    s.checkpoint().await.unwrap();
    s.close().await.unwrap();
    Store::open(dev.clone(), StoreOptions::default())
        .await
        .unwrap()
        .0
}

async fn check_version(s: &Store<MemDev>, oid: ObjectId, v: u64) {
    assert_eq!(s.version(oid), Some(v));
    assert_eq!(s.undo(oid).await.unwrap().map(|u| u.version), Some(v));
}

/// Logged writes from a buffer others hold too (the primary's payload,
/// also being sent to the replicas): a whole block goes to the file from
/// the shared buffer; a part of a new object (a block of its own) and a
/// part of an object with a block (through the journal) are copied; all
/// read back, before and after replay, and the shared buffers are left as
/// they were.
#[test]
fn logged_writes_from_a_shared_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    block_on(async {
        let flags = nacre_io::OpenFlags {
            create_bytes: Some(64 * MIB),
            ..nacre_io::OpenFlags::default()
        };
        let dev = std::rc::Rc::new(nacre_io::FileDev::open(&path, &flags).unwrap());
        let s = fresh(&dev, 64 << 10).await;
        let whole = nacre_io::SharedBuf::new(pattern(3, 64 << 10));
        let part = nacre_io::SharedBuf::new(pattern(4, 8192));
        let kept = (whole.clone(), part.clone());
        let mut e = entry(1, 1, 1, LogOp::Write, 1);
        e.len = 64 << 10;
        s.write_logged(e, 0, whole.clone()).await.unwrap();
        let mut e = entry(1, 2, 2, LogOp::Write, 2);
        (e.offset, e.len) = (4096, 8192);
        s.write_logged(e, 4096, part.clone()).await.unwrap();
        let mut e = entry(1, 3, 1, LogOp::Write, 3);
        (e.offset, e.len) = (8192, 4096);
        s.write_logged(e, 8192, part.slice(4096..8192))
            .await
            .unwrap();
        let check = |s: Store<_>| async move {
            let r = s.read(ObjectId::new(3, 1), 0, 64 << 10).await.unwrap();
            let mut want = pattern(3, 64 << 10).to_vec();
            want[8192..12288].copy_from_slice(&pattern(4, 8192)[4096..]);
            assert_eq!(&r[..], &want[..]);
            let r = s.read(ObjectId::new(3, 2), 4096, 8192).await.unwrap();
            assert_eq!(&r[..], &pattern(4, 8192)[..]);
            s
        };
        let s = check(s).await;
        drop(s); // no close: replay finds both
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        check(s).await.close().await.unwrap();
        assert_eq!(&kept.0[..], &pattern(3, 64 << 10)[..]);
        assert_eq!(&kept.1[..], &pattern(4, 8192)[..]);
    });
}
