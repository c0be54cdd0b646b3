//! Damage and bad input: flipped bits in data and in every kind of
//! metadata, failing I/O, wrong or foreign superblocks, tiny devices. Each
//! gives a typed error or a clean recovery — never wrong bytes, never a
//! panic.

mod common;

use nacre_blockstore::format::PAGE_BYTES;
use nacre_blockstore::{Error, FormatOptions, Store, StoreOptions};
use nacre_io::rt::block_on;
use nacre_io::{AlignedBuf, BlockDev, FaultDev, FileDev, MemDev, OpenFlags};
use nacre_types::ObjectId;

const MIB: u64 = 1 << 20;
const BLOCK: u32 = 64 << 10;

fn fmt() -> FormatOptions {
    FormatOptions {
        block_bytes: BLOCK,
        journal_bytes: Some(4 * MIB),
        ..FormatOptions::default()
    }
}

fn fill(seed: u8, len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed ^ (i as u8).wrapping_mul(13) ^ (i >> 9) as u8;
    }
    b
}

fn oid(n: u64) -> ObjectId {
    ObjectId::new(3, n)
}

async fn store_with_objects(dev: &FaultDev, n: u64) -> Store<FaultDev> {
    Store::format(dev, &fmt()).await.unwrap();
    let (s, _) = Store::open(dev.clone(), StoreOptions::default())
        .await
        .unwrap();
    for i in 0..n {
        s.write(oid(i), 1, 0, fill(i as u8, BLOCK as usize))
            .await
            .unwrap();
    }
    s
}

#[test]
fn flipped_data_bit_is_reported_not_returned() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        let s = store_with_objects(&dev, 4).await;
        s.write(oid(1), 2, 8192, fill(9, 4096)).await.unwrap();
        s.checkpoint().await.unwrap(); // folds the small write into the block
        let g = s.geometry().clone();
        let b = s.block_of(oid(1)).unwrap();
        dev.flip(g.block_offset(b) + 8192 + 100, 0x04);
        let e = s.read(oid(1), 8192, 4096).await.unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
        // Whole-object reads fail too; other chunks and objects are fine.
        assert!(matches!(
            s.read(oid(1), 0, BLOCK).await,
            Err(Error::Corrupt(_))
        ));
        assert_eq!(
            &s.read(oid(1), 0, 8192).await.unwrap()[..],
            &fill(1, BLOCK as usize)[..8192]
        );
        assert_eq!(
            &s.read(oid(2), 0, BLOCK).await.unwrap()[..],
            &fill(2, BLOCK as usize)[..]
        );
        // The damage survives a restart as damage.
        drop(s);
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert!(matches!(
            s.read(oid(1), 8192, 512).await,
            Err(Error::Corrupt(_))
        ));
        // Rewriting the whole object heals it (a new block).
        s.write(oid(1), 3, 0, fill(7, BLOCK as usize))
            .await
            .unwrap();
        assert_eq!(
            &s.read(oid(1), 0, BLOCK).await.unwrap()[..],
            &fill(7, BLOCK as usize)[..]
        );
    });
}

#[test]
fn a_damaged_object_is_repaired_at_its_version() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        let mut s = store_with_objects(&dev, 3).await;
        // Version 2: the block plus a small write still in the journal.
        s.write(oid(1), 2, 8192, fill(9, 4096)).await.unwrap();
        let mut whole = fill(1, BLOCK as usize);
        whole[8192..12288].copy_from_slice(&fill(9, 4096));
        let g = s.geometry().clone();
        let b = s.block_of(oid(1)).unwrap();
        dev.flip(g.block_offset(b) + 40_000, 0x01);
        assert!(matches!(
            s.read(oid(1), 0, BLOCK).await,
            Err(Error::Corrupt(_))
        ));
        // Only the version the store holds, only whole, only if held.
        for (o, v, len) in [(1, 1, BLOCK), (1, 3, BLOCK), (1, 2, 4096), (7, 1, BLOCK)] {
            let e = s
                .repair(oid(o), v, fill(1, len as usize))
                .await
                .unwrap_err();
            assert!(!matches!(e, Error::Corrupt(_)), "{o} v{v}: {e}");
        }
        assert_eq!(s.version(oid(1)), Some(2));
        s.repair(oid(1), 2, AlignedBuf::from_slice(&whole))
            .await
            .unwrap();
        assert_eq!(s.version(oid(1)), Some(2));
        assert_ne!(s.block_of(oid(1)), Some(b), "written to a new block");
        assert_eq!(&s.read(oid(1), 0, BLOCK).await.unwrap()[..], &whole[..]);
        // A repeat of version 2's write is still a repeat, not a new write.
        s.write(oid(1), 2, 8192, fill(9, 4096)).await.unwrap();
        assert_eq!(&s.read(oid(1), 0, BLOCK).await.unwrap()[..], &whole[..]);
        // The repair is durable: replayed from the journal, and after a
        // checkpoint from the tables.
        for checkpoint in [false, true] {
            let (t, _) = common::reopen(s, &dev, checkpoint).await;
            assert_eq!(t.version(oid(1)), Some(2));
            assert_eq!(&t.read(oid(1), 0, BLOCK).await.unwrap()[..], &whole[..]);
            assert_eq!(
                &t.read(oid(2), 0, BLOCK).await.unwrap()[..],
                &fill(2, BLOCK as usize)[..]
            );
            s = t;
        }
    });
}

#[test]
fn partial_overwrite_of_a_damaged_chunk_keeps_it_unreadable() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        let s = store_with_objects(&dev, 1).await;
        let g = s.geometry().clone();
        let b = s.block_of(oid(0)).unwrap();
        dev.flip(g.block_offset(b) + 4096 + 3000, 0x80);
        // A 512-byte write into the damaged chunk, folded in place: the rest
        // of the chunk is still damaged and must not get a fresh checksum.
        s.write(oid(0), 2, 4096, fill(5, 512)).await.unwrap();
        s.checkpoint().await.unwrap();
        assert!(matches!(
            s.read(oid(0), 4096, 4096).await,
            Err(Error::Corrupt(_))
        ));
        assert_eq!(
            &s.read(oid(0), 8192, 4096).await.unwrap()[..],
            &fill(0, BLOCK as usize)[8192..12288]
        );
    });
}

#[test]
fn damaged_journal_stops_replay_there() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        Store::format(&dev, &fmt()).await.unwrap();
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        let g = s.geometry().clone();
        // Batch 1: marker from open; then one batch per durable write.
        s.write(oid(0), 1, 0, fill(0, BLOCK as usize))
            .await
            .unwrap();
        let before = s.journal_used_bytes();
        s.write(oid(0), 2, 0, fill(1, 4096)).await.unwrap();
        let after_second = s.journal_used_bytes();
        s.write(oid(1), 1, 0, fill(2, BLOCK as usize))
            .await
            .unwrap();
        s.write(oid(0), 3, 4096, fill(3, 4096)).await.unwrap();
        drop(s);
        // Flip one bit in the data of the second batch (a small write).
        let batch = g.journal_offset + before;
        let data_at = batch + (after_second - before) - 4096 + 17;
        dev.flip(data_at, 0x01);
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        let why = rep.replay_stopped.expect("replay must report the damage");
        assert!(why.contains("checksum"), "{why}");
        // Everything before the damage is there, nothing after it.
        assert_eq!(s.version(oid(0)), Some(1));
        assert_eq!(
            &s.read(oid(0), 0, BLOCK).await.unwrap()[..],
            &fill(0, BLOCK as usize)[..]
        );
        assert_eq!(
            s.version(oid(1)),
            None,
            "a batch after the damage was applied"
        );
        // It lost acknowledged writes: a new lineage, durably; and the
        // damage is behind the journal's start now. The store goes on:
        // new writes land where the damage was.
        assert_eq!(s.lineage(), 1);
        let mut s = s;
        for write in [true, false] {
            drop(s);
            let (t, rep) = Store::open(dev.clone(), StoreOptions::default())
                .await
                .unwrap();
            assert_eq!(rep.replay_stopped, None);
            assert_eq!(t.lineage(), 1);
            assert_eq!(t.version(oid(0)), Some(1));
            if write {
                t.write(oid(2), 1, 0, fill(4, 4096)).await.unwrap();
            }
            s = t;
        }
        assert_eq!(
            &s.read(oid(2), 0, 4096).await.unwrap()[..],
            &fill(4, 4096)[..]
        );
        assert_eq!(s.version(oid(1)), None);
    });
}

#[test]
fn damaged_journal_header_stops_replay_there() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        Store::format(&dev, &fmt()).await.unwrap();
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        let g = s.geometry().clone();
        s.write(oid(0), 1, 0, fill(0, BLOCK as usize))
            .await
            .unwrap();
        let at = s.journal_used_bytes();
        s.write(oid(1), 1, 0, fill(1, BLOCK as usize))
            .await
            .unwrap();
        let last = s.journal_used_bytes();
        s.write(oid(2), 1, 0, fill(2, BLOCK as usize))
            .await
            .unwrap();
        drop(s);
        let copy = dev.fork();
        dev.flip(g.journal_offset + at + 70, 0x20); // inside a record header
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert!(rep.replay_stopped.unwrap().contains("header checksum"));
        assert!(s.version(oid(0)).is_some());
        assert_eq!(s.version(oid(1)), None);
        assert_eq!(s.version(oid(2)), None);
        assert_eq!(s.lineage(), 1);
        // The same damage in the last batch, with nothing written after
        // it that says it was durable: the end of the journal (what a
        // crash cutting that batch leaves), not damage.
        copy.flip(g.journal_offset + last + 70, 0x20);
        let (s, rep) = Store::open(copy.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(rep.replay_stopped, None);
        assert!(rep.torn_tail.unwrap().contains("header checksum"));
        assert!(s.version(oid(1)).is_some());
        assert_eq!(s.version(oid(2)), None);
        assert_eq!(s.lineage(), 0);
    });
}

#[test]
fn damaged_checksum_page_fails_reads_of_its_blocks() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        let s = store_with_objects(&dev, 3).await;
        let g = s.geometry().clone();
        s.close().await.unwrap();
        // With nothing cached, the page is read back and checked.
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        let b = s.block_of(oid(0)).unwrap();
        let (page, _) = g.csum_page_of(b);
        for copy in 0..2 {
            dev.flip(g.csumtab_page_pos(page, copy) + 8, 0x01);
        }
        let e = s.read(oid(0), 0, 4096).await.unwrap_err();
        assert!(
            matches!(&e, Error::Corrupt(w) if w.contains("checksum-table page")),
            "{e}"
        );
    });
}

#[test]
fn damaged_object_table_page_fails_open_with_its_name() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        let s = store_with_objects(&dev, 3).await;
        let g = s.geometry().clone();
        s.close().await.unwrap();
        for copy in 0..2 {
            dev.flip(g.objtab_page_pos(0, copy) + 30, 0x10);
        }
        match Store::open(dev.clone(), StoreOptions::default()).await {
            Err(Error::Corrupt(w)) => assert!(w.contains("object-table page 0"), "{w}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("opened a store with a damaged object table"),
        }
    });
}

#[test]
fn damaged_newest_checkpoint_falls_back_to_the_older_one() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        let s = store_with_objects(&dev, 3).await;
        s.checkpoint().await.unwrap();
        s.write(oid(9), 1, 0, fill(9, 4096)).await.unwrap();
        s.checkpoint().await.unwrap();
        let g = s.geometry().clone();
        drop(s);
        // The newest checkpoint is in one of the two slots: damage both
        // headers one at a time and check the store still opens whole.
        for slot in 0..2 {
            let d2 = dev.clone();
            let before = d2.snapshot(g.slot_pos(slot) + 40, 1)[0];
            d2.flip(g.slot_pos(slot) + 40, 0xff);
            let (s, _) = Store::open(d2.clone(), StoreOptions::default())
                .await
                .unwrap();
            for i in 0..3 {
                assert_eq!(
                    &s.read(oid(i), 0, BLOCK).await.unwrap()[..],
                    &fill(i as u8, BLOCK as usize)[..]
                );
            }
            assert_eq!(
                &s.read(oid(9), 0, 4096).await.unwrap()[..],
                &fill(9, 4096)[..]
            );
            drop(s);
            d2.flip(g.slot_pos(slot) + 40, 0xff);
            assert_eq!(d2.snapshot(g.slot_pos(slot) + 40, 1)[0], before);
        }
    });
}

#[test]
fn superblocks_other_stores_and_small_devices() {
    block_on(async {
        // Too small to format, too small to open.
        let tiny = MemDev::new(MIB, 512);
        assert!(matches!(
            Store::format(&tiny, &fmt()).await,
            Err(Error::DeviceTooSmall { .. })
        ));
        assert!(matches!(
            Store::open(MemDev::new(4096, 512), StoreOptions::default()).await,
            Err(Error::DeviceTooSmall { .. })
        ));
        // Not a store at all.
        let blank = MemDev::new(64 * MIB, 512);
        assert!(matches!(
            Store::open(blank.clone(), StoreOptions::default()).await,
            Err(Error::NotAStore(_))
        ));
        // Someone else's store.
        let dev = FaultDev::new(64 * MIB, 512);
        let g = Store::format(&dev, &fmt()).await.unwrap();
        let other = StoreOptions {
            expect_uuid: Some([0xaa; 16]),
            ..StoreOptions::default()
        };
        assert!(matches!(
            Store::open(dev.clone(), other).await,
            Err(Error::WrongStore { .. })
        ));
        let mine = StoreOptions {
            expect_uuid: Some(g.uuid),
            ..StoreOptions::default()
        };
        drop(Store::open(dev.clone(), mine).await.unwrap());
        // A damaged primary superblock: the backup takes over.
        dev.flip(50, 0x01);
        drop(
            Store::open(dev.clone(), StoreOptions::default())
                .await
                .unwrap(),
        );
        // Both damaged: a clear error.
        dev.flip(PAGE_BYTES + 50, 0x01);
        assert!(matches!(
            Store::open(dev.clone(), StoreOptions::default()).await,
            Err(Error::Corrupt(_))
        ));
        dev.flip(50, 0x01);
        dev.flip(PAGE_BYTES + 50, 0x01);
        // Another format version (with a valid checksum): refused by name.
        let mut sb = dev.snapshot(0, 144);
        sb[8..12].copy_from_slice(&99u32.to_le_bytes());
        sb[136..140].fill(0);
        let crc = nacre_types::crc32c(&sb);
        sb[136..140].copy_from_slice(&crc.to_le_bytes());
        let mut page = AlignedBuf::zeroed(4096);
        page[..144].copy_from_slice(&sb);
        for at in [0, PAGE_BYTES] {
            dev.write_at(AlignedBuf::from_slice(&page), at)
                .await
                .unwrap();
        }
        assert!(matches!(
            Store::open(dev.clone(), StoreOptions::default()).await,
            Err(Error::UnsupportedVersion { found: 99, .. })
        ));
    });
}

#[test]
fn io_errors_are_errors() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        let s = store_with_objects(&dev, 2).await;
        let g = s.geometry().clone();
        let b = s.block_of(oid(0)).unwrap();
        dev.fail_range(g.block_offset(b), u64::from(BLOCK), true, false);
        assert!(matches!(s.read(oid(0), 0, 4096).await, Err(Error::Io(_))));
        assert!(s.read(oid(1), 0, 4096).await.is_ok());
        // A journal that cannot be written stops writes, not reads.
        dev.clear_failures();
        dev.fail_range(g.journal_offset, g.journal_bytes, false, true);
        let e = s.write(oid(1), 2, 0, fill(1, 4096)).await.unwrap_err();
        assert!(matches!(e, Error::Failed(_)), "{e}");
        assert!(matches!(
            s.write(oid(5), 1, 0, fill(1, 4096)).await,
            Err(Error::Failed(_))
        ));
        assert_eq!(
            &s.read(oid(1), 0, BLOCK).await.unwrap()[..],
            &fill(1, BLOCK as usize)[..]
        );
        // After a restart the acknowledged data is all there.
        dev.clear_failures();
        drop(s);
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(s.version(oid(1)), Some(1));
        assert_eq!(
            &s.read(oid(0), 0, BLOCK).await.unwrap()[..],
            &fill(0, BLOCK as usize)[..]
        );
    });
}

#[test]
fn replay_is_bounded_by_the_journal_not_the_data() {
    // The same few records after a checkpoint, over 2 000 and 20 000
    // objects: the number of records and bytes replayed does not grow.
    let mut seen = Vec::new();
    for objects in [2_000u64, 20_000] {
        block_on(async {
            let dev = MemDev::new(256 * MIB, 512);
            let f = FormatOptions {
                block_bytes: 4096,
                journal_bytes: Some(8 * MIB),
                ..FormatOptions::default()
            };
            Store::format(&dev, &f).await.unwrap();
            let (s, _) = Store::open(dev.clone(), StoreOptions::default())
                .await
                .unwrap();
            let mut hs = Vec::new();
            for i in 0..objects {
                let s = s.clone();
                hs.push(nacre_io::rt::spawn(async move {
                    s.write(oid(i), 1, 0, fill(i as u8, 4096)).await
                }));
                if hs.len() == 256 {
                    for h in hs.drain(..) {
                        h.await.unwrap();
                    }
                }
            }
            for h in hs {
                h.await.unwrap();
            }
            s.checkpoint().await.unwrap();
            s.checkpoint().await.unwrap();
            for i in 0..10 {
                s.write(oid(i), 2, 0, fill(100, 4096)).await.unwrap();
            }
            drop(s);
            let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
                .await
                .unwrap();
            assert_eq!(rep.objects_loaded, objects);
            assert_eq!(s.object_count() as u64, objects);
            assert_eq!(
                &s.read(oid(objects - 1), 0, 4096).await.unwrap()[..],
                &fill((objects - 1) as u8, 4096)[..]
            );
            assert_eq!(
                &s.read(oid(3), 0, 4096).await.unwrap()[..],
                &fill(100, 4096)[..]
            );
            seen.push((rep.records_replayed, rep.journal_bytes_replayed));
        });
    }
    assert_eq!(
        seen[0].0, seen[1].0,
        "records replayed grew with the data: {seen:?}"
    );
    assert!(seen[1].0 <= 12, "{seen:?}");
    assert!(seen[1].1 <= 2 * seen[0].1.max(4096), "{seen:?}");
}

#[test]
fn store_on_files_with_io_uring_and_pread() {
    for force_pread in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.img");
        block_on(async {
            let flags = OpenFlags {
                create_bytes: Some(64 * MIB),
                force_pread,
                ..OpenFlags::default()
            };
            let dev = FileDev::open(&path, &flags).unwrap();
            Store::format(&dev, &fmt()).await.unwrap();
            let (s, _) = Store::open(dev, StoreOptions::default()).await.unwrap();
            s.write(oid(0), 1, 0, fill(1, BLOCK as usize))
                .await
                .unwrap();
            s.write(oid(0), 2, 512, fill(2, 1024)).await.unwrap();
            s.close().await.unwrap();
            let dev = FileDev::open(&path, &OpenFlags::default()).unwrap();
            let (s, rep) = Store::open(dev, StoreOptions::default()).await.unwrap();
            assert_eq!(rep.records_replayed, 0);
            let r = s.read(oid(0), 0, 2048).await.unwrap();
            assert_eq!(&r[512..1536], &fill(2, 1024)[..]);
            assert_eq!(&r[..512], &fill(1, 512)[..]);
        });
    }
}

/// A whole-block write in flight at a crash can leave its journal record
/// written and its data block not (the block is written beside the
/// record, and the fsync that acknowledges it waits for both): replay ends
/// the journal there as the normal torn tail — the write never happened,
/// what came before is all there, and it is no damage (`replay_stopped`
/// stays empty; an OSD would otherwise report its journal damaged after an
/// ordinary kill -9).
#[test]
fn a_whole_block_write_cut_by_a_crash_ends_the_journal_without_damage() {
    block_on(async {
        let dev = FaultDev::new(64 * MIB, 512);
        Store::format(&dev, &fmt()).await.unwrap();
        let (s, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        s.write(oid(0), 1, 0, fill(1, BLOCK as usize))
            .await
            .unwrap();
        s.write(oid(0), 2, 4096, fill(2, 4096)).await.unwrap();
        s.write(oid(1), 1, 0, fill(3, BLOCK as usize))
            .await
            .unwrap();
        let g = s.geometry().clone();
        let block = s.block_of(oid(1)).unwrap();
        drop(s);
        // The last batch's data block never reached the disk.
        dev.write_at(AlignedBuf::zeroed(BLOCK as usize), g.block_offset(block))
            .await
            .unwrap();
        let (s, rep) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        assert_eq!(rep.replay_stopped, None);
        let why = rep.torn_tail.expect("the torn tail is reported");
        assert!(why.contains("not completely written"), "{why}");
        assert_eq!(s.version(oid(1)), None);
        assert_eq!(s.version(oid(0)), Some(2));
        let got = s.read(oid(0), 0, 8192).await.unwrap();
        assert_eq!(&got[..4096], &fill(1, BLOCK as usize)[..4096]);
        assert_eq!(&got[4096..], &fill(2, 4096)[..]);
    });
}
