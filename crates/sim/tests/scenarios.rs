//! Failure scenarios on the simulated cluster, each built step by step
//! with targeted faults (the seeded histories of `sim.rs` find such
//! sequences only by chance).

use std::rc::Rc;
use std::time::Duration;

use nacre_io::{rt, AlignedBuf};
use nacre_net::{Frame, NetError};
use nacre_osd::{PgState, PoolChange};
use nacre_sim::{Cluster, Net, OBJECT_BYTES};
use nacre_types::{ObjectId, PgId};
use nacre_wire::{Header, Op, Status};

const SETTLE: Duration = Duration::from_secs(60);
const CLIENT: u64 = 7;

/// Three OSDs, one pool of 4 PGs with 3 copies (`min_size` 2) and the
/// leader, on a network seeded with `seed`, every PG active.
async fn cluster(seed: u64) -> Rc<Cluster> {
    let c = Cluster::new(Net::new(seed, Duration::from_millis(500)), 3, 3, 2, 4).await;
    c.settle(SETTLE).await.unwrap();
    c
}

/// Writes 4 KiB of `byte` at the start of `oid` as request `request`
/// through its primary; the answer, whatever it is.
async fn send(c: &Cluster, oid: ObjectId, request: u64, byte: u8) -> Result<Frame, NetError> {
    let data = [byte; 4096];
    let mut h = Header::request(Op::Write, request, oid).with_payload(&data);
    h.length = data.len() as u32;
    h.client = CLIENT;
    c.call(h, Some(AlignedBuf::from_slice(&data))).await
}

/// [`send`], which must be acknowledged; its version.
async fn put(c: &Cluster, oid: ObjectId, request: u64, byte: u8) -> u64 {
    let f = send(c, oid, request, byte).await.unwrap();
    assert_eq!(f.h.status, Status::Ok, "write {request}");
    f.h.obj_version
}

/// Waits until an OSD other than `old` is the primary of `oid`'s PG and
/// serves it (the leader marked `old` down and the others peered).
async fn taken_over(c: &Cluster, oid: ObjectId, old: u32) {
    let (pg, _) = c.route(oid);
    for _ in 0..300 {
        let q = c.route(oid).1[0];
        if q != old && c.osd(q).unwrap().pg_state(pg) == Some(PgState::Active) {
            return;
        }
        rt::sleep(Duration::from_millis(100)).await;
    }
    panic!("no other primary serves PG {pg} without osd.{old}");
}

/// The object's bytes through its primary (`None`: absent).
async fn read(c: &Cluster, oid: ObjectId) -> Option<Vec<u8>> {
    let mut h = Header::request(Op::Read, 0, oid);
    h.length = OBJECT_BYTES;
    let f = c.call(h, None).await.expect("a read");
    match f.h.status {
        Status::Ok => Some(f.payload.expect("data").to_vec()),
        Status::NotFound => None,
        s => panic!("read of {oid}: {s:?}"),
    }
}

/// Sends `h` (with `data`) for `h.oid` through its primary with the
/// sub-ops `sub` to its replicas lost, waits until the primary's version
/// of the object satisfies `landed`, then takes the primary's power: the
/// op is on its store alone and never acknowledged. The acting set.
async fn only_on_primary(
    c: &Rc<Cluster>,
    sub: Op,
    h: Header,
    data: Option<Vec<u8>>,
    landed: impl Fn(Option<u64>) -> bool,
) -> Vec<u32> {
    let oid = h.oid;
    let (_, acting) = c.route(oid);
    let p = acting[0];
    let replicas: Vec<String> = (acting[1..].iter())
        .map(|&id| c.nodes.borrow()[id as usize].addr.to_string())
        .collect();
    c.net
        .set_filter(move |_, to, h| h.op == sub && replicas.iter().any(|r| r == to));
    let attempt = {
        let c = c.clone();
        rt::spawn(async move { c.call(h, data.as_deref().map(AlignedBuf::from_slice)).await })
    };
    let primary = c.osd(p).unwrap();
    while !landed(primary.store().version(oid)) {
        rt::sleep(Duration::from_millis(1)).await;
    }
    drop(primary);
    c.crash(p, 3);
    let r = attempt.await;
    assert!(
        r.as_ref().map_or(true, |f| f.h.status != Status::Ok),
        "{:?} was acknowledged without its replicas: {:?}",
        h.op,
        r.map(|f| f.h.status)
    );
    c.net.clear_filter();
    acting
}

/// Request 1, a write of 0x5a over the first 4 KiB of `oid`, through
/// [`only_on_primary`]: divergent. The acting set.
async fn write_only_on_primary(c: &Rc<Cluster>, oid: ObjectId) -> Vec<u32> {
    let data = vec![0x5au8; 4096];
    let mut h = Header::request(Op::Write, 1, oid).with_payload(&data);
    h.length = data.len() as u32;
    h.client = CLIENT;
    only_on_primary(c, Op::RepWrite, h, Some(data), |v| v.is_some()).await
}

/// A write that reached only its primary's store (the sub-ops were lost,
/// then the primary lost power) is divergent: the next interval goes on
/// without it. When the old primary returns, peering undoes the write on
/// its copy and forgets its log entry, so a retry of the request is
/// applied, not answered from history as if it had been.
#[test]
fn a_divergent_write_is_undone_and_its_retry_is_applied() {
    rt::block_on_virtual(async {
        let c = cluster(1).await;
        let oid = nacre_sim::obj(1, 5);
        let (pg, _) = c.route(oid);
        let acting = write_only_on_primary(&c, oid).await;
        let p = acting[0];
        // An interval without the old primary, then one with it again.
        c.settle(SETTLE).await.unwrap();
        c.start(p).await;
        c.settle(SETTLE).await.unwrap();
        assert_eq!(c.route(oid).1[0], p, "osd.{p} is primary again");
        let key = pg.key();
        for &id in &acting {
            let log = c.osd(id).unwrap().store().pg_log(key).unwrap_or_default();
            assert!(
                !(log.entries.values()).any(|e| e.client == CLIENT && e.request == 1),
                "osd.{id} still logs the undone request: {log:?}"
            );
            assert_eq!(c.osd(id).unwrap().store().version(oid), None, "osd.{id}");
        }
        // The retry.
        put(&c, oid, 1, 0x5a).await;
        let got = read(&c, oid).await.expect("the retried write is there");
        assert_eq!(&got[..4096], &[0x5au8; 4096][..]);
        c.stop();
    });
}

/// A delete that reached only its primary's store (the sub-ops were lost,
/// then the primary lost power) is divergent, like the write above; when
/// the old primary returns, peering undoes it with a *rewrite* of the
/// object at a new version on every copy (never a push of the old
/// version: that would leave the copy's log naming the delete with the
/// object back, and a log sync cut off by a new epoch would let that copy
/// answer the delete's retry as applied: `Plan::compare`). The retry is
/// applied.
#[test]
fn a_divergent_delete_is_undone_by_a_rewrite_and_its_retry_is_applied() {
    rt::block_on_virtual(async {
        let c = cluster(2).await;
        let oid = nacre_sim::obj(1, 6);
        let v1 = put(&c, oid, 1, 0x11).await;
        let mut h = Header::request(Op::Delete, 2, oid);
        h.client = CLIENT;
        let acting = only_on_primary(&c, Op::RepDelete, h, None, |v| v.is_none()).await;
        let p = acting[0];
        c.settle(SETTLE).await.unwrap();
        c.start(p).await;
        c.settle(SETTLE).await.unwrap();
        // Every copy holds the object again, rewritten above v1, and logs
        // the same rewrite (an entry that differed between copies would
        // pass for divergent at every later peering, rewritten again).
        let (pg, _) = c.route(oid);
        let mut logged = Vec::new();
        for &id in &acting {
            let o = c.osd(id).unwrap();
            let store = o.store();
            let v = store.version(oid);
            assert!(v.is_some_and(|v| v > v1), "osd.{id}: {v:?}, v1 {v1:#x}");
            let log = store.pg_log(pg.key()).unwrap_or_default();
            logged.push(log.entries.get(&v.unwrap()).copied());
        }
        assert!(logged[0].is_some(), "the rewrite is not logged: {logged:?}");
        assert!(logged.iter().all(|e| *e == logged[0]), "{logged:?}");
        assert_eq!(
            &read(&c, oid).await.expect("back")[..4096],
            &[0x11u8; 4096][..]
        );
        // The retry.
        let mut h = Header::request(Op::Delete, 2, oid);
        h.client = CLIENT;
        assert_eq!(c.call(h, None).await.unwrap().h.status, Status::Ok);
        assert_eq!(read(&c, oid).await, None, "the retried delete is applied");
        c.stop();
    });
}

/// Object 1.9 written (0x11) on its acting set `[x, y, z]`, then, in an
/// interval of x and y alone (z crashed), written again (0x22, 4 KiB).
async fn a_write_z_missed(c: &Cluster) -> (ObjectId, [u32; 3]) {
    let oid = nacre_sim::obj(1, 9);
    let (_, acting) = c.route(oid);
    put(c, oid, 1, 0x11).await;
    c.crash(acting[2], 1);
    c.settle(SETTLE).await.unwrap();
    put(c, oid, 2, 0x22).await;
    (oid, [acting[0], acting[1], acting[2]])
}

/// An OSD whose disk was replaced (a blank store under the same id) holds
/// none of the writes of the intervals it was in. While it is the only
/// member of the PG's last active interval that is up, the PG waits for
/// another (rather than taking the empty store as the authority and
/// erasing every copy); once one is back, everything acknowledged is
/// there and the new disk is filled.
#[test]
fn a_replaced_disk_is_not_taken_for_the_copy_it_replaced() {
    rt::block_on_virtual(async {
        let c = cluster(2).await;
        let (oid, [x, y, z]) = a_write_z_missed(&c).await;
        // y goes; x's disk is replaced; x (blank) and z come back.
        c.crash(y, 2);
        c.crash(x, 3);
        c.replace_disk(x).await;
        c.start(x).await;
        c.start(z).await;
        waits_for_the_copy_that_holds_it(&c, oid, y, 0x22).await;
        c.stop();
    });
}

/// `oid`'s PG, whose last active interval has no member up but `holder`
/// (its other members are back holding none of its history), serves
/// nothing for 10 s; once `holder` is back, it reads as the acknowledged
/// write of `byte` and every copy is at one version.
async fn waits_for_the_copy_that_holds_it(c: &Cluster, oid: ObjectId, holder: u32, byte: u8) {
    let (pg, acting) = c.route(oid);
    rt::sleep(Duration::from_secs(10)).await;
    let primary = acting[0];
    assert_ne!(
        c.osd(primary).unwrap().pg_state(pg),
        Some(PgState::Active),
        "PG {pg} went active with none of its last active copies"
    );
    let mut h = Header::request(Op::Read, 0, oid);
    h.length = OBJECT_BYTES;
    // Refused, or not answered within the network's deadline while
    // the primary waits for the PG: never data, never NotFound.
    if let Ok(f) = c.call(h, None).await {
        assert_eq!(f.h.status, Status::Unavailable);
    }
    // The holder is back: the PG peers from it and fills the others.
    c.start(holder).await;
    c.settle(SETTLE).await.unwrap();
    let got = read(c, oid).await.expect("the acknowledged write");
    assert_eq!(&got[..4096], &[byte; 4096][..]);
    let v = c.osd(holder).unwrap().store().version(oid);
    for id in c.route(oid).1 {
        assert_eq!(c.osd(id).unwrap().store().version(oid), v, "osd.{id}");
    }
}

/// An OSD whose journal was damaged lost, at its restart, the
/// acknowledged writes replay did not reach. It boots as a new lineage of
/// its store: while it is the only member of the PG's last active
/// interval that is up, the PG waits (rather than taking the rolled-back
/// copy as the authority and undoing the lost write everywhere); once
/// another member is back, the write is there on every copy.
#[test]
fn a_store_whose_journal_lost_writes_is_not_taken_for_its_copy() {
    rt::block_on_virtual(async {
        let c = cluster(2).await;
        // (The write z misses is a small one: its data is in the journal.)
        let (oid, [x, y, z]) = a_write_z_missed(&c).await;
        // And one after it (a batch after it in x's journal says it was
        // durable: damage to it is damage, not a write a crash cut).
        put(&c, nacre_sim::obj(1, 10), 3, 0x33).await;
        let g = c.osd(x).unwrap().store().geometry().clone();
        let was = c.osd(x).unwrap().store_id();
        c.crash(y, 2);
        c.crash(x, 3);
        // One bit of that write's data in x's journal flips.
        let dev = c.nodes.borrow()[x as usize].dev.clone();
        let journal = nacre_io::BlockDev::read_at(
            &dev,
            AlignedBuf::new(g.journal_bytes as usize),
            g.journal_offset,
        )
        .await
        .unwrap();
        let at = (journal
            .chunks(512)
            .position(|s| s.iter().all(|&b| b == 0x22)))
        .expect("the write's data in the journal");
        dev.flip(g.journal_offset + at as u64 * 512 + 100, 0x04);
        c.start(x).await;
        c.start(z).await;
        let xo = c.osd(x).unwrap();
        assert!(xo.stat_report().replay_stopped.is_some());
        assert_eq!(xo.store_id(), format!("{was}.1"));
        waits_for_the_copy_that_holds_it(&c, oid, y, 0x22).await;
        c.stop();
    });
}

/// A copy that recovery filled (it missed writes while down) later
/// becomes the authoritative copy. It must hold the whole history of the
/// PG, not only the newest op of each object: otherwise the others forget
/// the older entries, and a retry of a request applied long ago (its
/// reply lost) is applied a second time over a later acknowledged write.
#[test]
fn a_recovered_copy_carries_the_whole_history() {
    rt::block_on_virtual(async {
        let c = cluster(3).await;
        let oid = nacre_sim::obj(1, 7);
        let (_, acting) = c.route(oid);
        let (x, y, z) = (acting[0], acting[1], acting[2]);
        // z misses two writes of the object; recovery brings it the second.
        c.crash(z, 1);
        c.settle(SETTLE).await.unwrap();
        let v1 = put(&c, oid, 1, 0x11).await;
        put(&c, oid, 2, 0x22).await;
        c.start(z).await;
        c.settle(SETTLE).await.unwrap();
        // Then only z is left of the last active interval, and x peers
        // from it.
        c.crash(x, 2);
        c.settle(SETTLE).await.unwrap();
        c.crash(y, 3);
        c.start(x).await;
        c.settle(SETTLE).await.unwrap();
        assert_eq!(c.route(oid).1, vec![x, z]);
        // The first request again (as after a lost reply): answered from
        // history with its version, not applied over the second.
        assert_eq!(put(&c, oid, 1, 0x11).await, v1);
        let got = read(&c, oid).await.expect("the object");
        assert_eq!(&got[..4096], &[0x22u8; 4096][..]);
        c.stop();
    });
}

/// A primary cut off from the other OSDs and the leader (its clients
/// still reach it) acknowledges no write; the others go on without it in
/// a new epoch; once it joins again it learns it was marked down, boots
/// again, and serves what the others acknowledged meanwhile.
#[test]
fn a_partitioned_primary_acknowledges_nothing_and_catches_up() {
    rt::block_on_virtual(async {
        let c = cluster(4).await;
        let oid = nacre_sim::obj(1, 11);
        let (_, acting) = c.route(oid);
        let p = acting[0];
        put(&c, oid, 1, 0x11).await;
        c.isolate(p, true);
        // Straight to the old primary, in the epoch it knows.
        let f = send(&c, oid, 2, 0x22).await;
        assert!(
            f.as_ref().map_or(true, |f| f.h.status != Status::Ok),
            "an isolated primary acknowledged a write"
        );
        // Its answer may come after the client stopped waiting: the primary
        // itself must have given up on the write (each sub-op tried three
        // times) and stopped the PG.
        let (pg, _) = c.route(oid);
        rt::sleep(Duration::from_millis(2000)).await;
        assert_eq!(c.osd(p).unwrap().pg_state(pg), Some(PgState::Failed));
        // The leader marks it down; the others serve the PG.
        taken_over(&c, oid, p).await;
        assert!(!c.leader.map().is_up(p), "osd.{p} is still up");
        put(&c, oid, 3, 0x33).await;
        c.isolate(p, false);
        c.settle(SETTLE).await.unwrap();
        assert_eq!(c.route(oid).1[0], p, "osd.{p} is primary again");
        let got = read(&c, oid).await.expect("the object");
        assert_eq!(&got[..4096], &[0x33u8; 4096][..]);
        c.stop();
    });
}

/// Reads need a lease (§6 of docs/internals/replication.md): a primary
/// cut off from the leader still thinks its PG active and its clients
/// still reach it, while the others take writes in a new epoch. It must
/// stop answering reads before the leader can mark it down, or it would
/// return data older than an acknowledged write.
#[test]
fn a_partitioned_primary_serves_no_stale_read() {
    rt::block_on_virtual(async {
        let c = cluster(5).await;
        let oid = nacre_sim::obj(1, 13);
        let (pg, acting) = c.route(oid);
        let p = acting[0];
        put(&c, oid, 1, 0x11).await;
        c.isolate(p, true);
        taken_over(&c, oid, p).await;
        put(&c, oid, 2, 0x22).await;
        // The old primary has heard of none of this.
        let old = c.osd(p).unwrap();
        assert_eq!(old.pg_state(pg), Some(PgState::Active));
        let mut h = Header::request(Op::Read, 0, oid);
        h.length = 4096;
        h = h.with_pg(pg);
        h.epoch = old.epoch();
        let addr = c.nodes.borrow()[p as usize].addr.clone();
        let conn = nacre_net::Transport::connect(&c.net, &addr).unwrap();
        let f = nacre_net::Rpc::call(&*conn, h, None).await.unwrap();
        assert_eq!(
            f.h.status,
            Status::Unavailable,
            "the old primary answered a read (data {:?})",
            f.payload.as_ref().map(|d| d[0])
        );
        c.isolate(p, false);
        c.settle(SETTLE).await.unwrap();
        let got = read(&c, oid).await.expect("the object");
        assert_eq!(&got[..4096], &[0x22u8; 4096][..]);
        c.stop();
    });
}

/// osd.2 misses writes of 24 objects of volume 1 (one 4 KiB piece each,
/// object k holding byte k + 1), then comes back with every OSD
/// recovering one object a second; returns once every PG is active (some
/// still recovering), with the map of then.
async fn returning_copy(seed: u64) -> (Rc<Cluster>, Vec<ObjectId>, nacre_osd::OsdMap) {
    let c = cluster(seed).await;
    let slow = u64::from(OBJECT_BYTES); // one object a second
    let back = 2;
    c.crash(back, 1);
    c.settle(SETTLE).await.unwrap();
    let oids: Vec<ObjectId> = (0..24).map(|b| nacre_sim::obj(1, b)).collect();
    for (k, &oid) in oids.iter().enumerate() {
        put(&c, oid, k as u64 + 1, k as u8 + 1).await;
    }
    for id in 0..3 {
        if let Some(o) = c.osd(id) {
            o.set_recovery_rate(slow);
        }
    }
    c.start(back).await;
    c.osd(back).unwrap().set_recovery_rate(slow);
    // Every PG active, some still recovering.
    let m = loop {
        let m = c.leader.map();
        let active = m.pgs().all(|pg| c.serving_primary(pg).is_some());
        if active && m.is_up(back) {
            break m;
        }
        rt::sleep(Duration::from_millis(10)).await;
    };
    (c, oids, m)
}

/// A copy that comes back after missing writes is recovered in the
/// background: its PGs serve at once (reads and writes of objects it
/// lacks, which are recovered first), the leader records it as an
/// incomplete member until it holds everything, and recovery, paced, ends
/// with every copy of every object the same. What it lacks comes from the
/// PG logs, not from listings of every object.
#[test]
fn a_returning_copy_is_recovered_while_its_pgs_serve() {
    rt::block_on_virtual(async {
        let (c, oids, m) = returning_copy(6).await;
        let back = 2;
        let recovering: Vec<PgId> = m
            .pgs()
            .filter(|&pg| c.osd(m.primary(pg).unwrap()).unwrap().pg_recovering(pg))
            .collect();
        assert!(!recovering.is_empty(), "no PG recovers in the background");
        for &pg in &recovering {
            let i = m.last_active(pg).unwrap();
            assert_eq!(i.incomplete, vec![back], "PG {pg}'s interval: {i:?}");
            let r = c.osd(m.primary(pg).unwrap()).unwrap().stat_report();
            assert!(r.pg_states.contains_key("active+recovering"), "{r:?}");
            assert!(r.recovery_objects_left > 0);
        }
        // Reads and writes meanwhile, on every object: a write of the
        // second 4 KiB of each keeps the first.
        for (k, &oid) in oids.iter().enumerate() {
            let got = read(&c, oid).await.expect("an acknowledged write");
            assert_eq!(got[0], k as u8 + 1, "{oid}");
            let data = [0xee; 4096];
            let mut h = Header::request(Op::Write, 100 + k as u64, oid).with_payload(&data);
            h.offset = 4096;
            h.length = 4096;
            h.client = CLIENT;
            let f = c
                .call(h, Some(AlignedBuf::from_slice(&data)))
                .await
                .unwrap();
            assert_eq!(f.h.status, Status::Ok, "{oid}");
        }
        c.settle(SETTLE).await.unwrap();
        let m = c.leader.map();
        assert!(
            (m.pools[&1].last_active.values()).all(|i| i.incomplete.is_empty()),
            "{m:?}"
        );
        // Its logs told what it lacked: no PG listed its objects.
        let reports: Vec<_> = (0..3).map(|id| c.osd(id).unwrap().stat_report()).collect();
        assert!(reports.iter().all(|r| r.compared_by_listing == 0));
        assert!(reports.iter().map(|r| r.compared_by_log).sum::<u64>() >= 4);
        for (k, &oid) in oids.iter().enumerate() {
            let copies: Vec<_> = (0..3).map(|id| c.osd(id).unwrap()).collect();
            let v = copies[0].store().version(oid);
            assert!(v.is_some(), "{oid}");
            for o in &copies {
                assert_eq!(o.store().version(oid), v, "osd.{} {oid}", o.id);
                let got = o.store().read(oid, 0, 8192).await.unwrap();
                assert_eq!(
                    (got[0], got[4096]),
                    (k as u8 + 1, 0xee),
                    "osd.{} {oid}",
                    o.id
                );
            }
        }
        c.stop();
    });
}

/// Objects of PG 0 (the first `b`, five more `a`); the acting set's third
/// OSD `z` misses writes of each `a` (byte k + 1 in the k-th) and then so
/// many of `b` that the others' PG logs no longer name the `a`; every OSD
/// then recovers one object a second. Returns `b`, the `a` and the acting
/// set, with `z` down.
async fn a_copy_far_behind(c: &Cluster) -> (ObjectId, Vec<ObjectId>, Vec<u32>) {
    let pgs = c.leader.map().pg_count(1);
    let in_pg: Vec<ObjectId> = (0..)
        .map(|b| nacre_sim::obj(1, b))
        .filter(|&o| PgId::of(o, pgs) == PgId::new(1, 0))
        .take(6)
        .collect();
    let (b, a) = (in_pg[0], in_pg[1..].to_vec());
    let (_, acting) = c.route(b);
    c.crash(acting[2], 1);
    c.settle(SETTLE).await.unwrap();
    let mut req = 1;
    for (k, &o) in a.iter().enumerate() {
        put(c, o, req, k as u8 + 1).await;
        req += 1;
    }
    // More writes of `b` than a PG log holds: the entries of `a` go.
    for _ in 0..140 {
        put(c, b, req, 0xbb).await;
        req += 1;
    }
    let auth_log = c
        .osd(acting[0])
        .unwrap()
        .store()
        .pg_log(PgId::new(1, 0).key())
        .unwrap();
    assert!(a
        .iter()
        .all(|o| auth_log.entries.values().all(|e| e.oid != *o)));
    for id in 0..3 {
        if let Some(o) = c.osd(id) {
            o.set_recovery_rate(u64::from(OBJECT_BYTES));
        }
    }
    (b, a, acting)
}

/// Copies listed (compared on every object) by the running OSDs so far.
fn listings(c: &Cluster) -> u64 {
    (0..3)
        .filter_map(|id| c.osd(id))
        .map(|o| o.stat_report().compared_by_listing)
        .sum()
}

/// The acting set's second OSD `other` crashes: once PG 0 is active in
/// the epoch without it, copy `z` must have been listed again.
async fn listed_in_a_new_epoch(c: &Cluster, z: u32, other: u32) {
    let before = listings(c);
    c.crash(other, 2);
    for _ in 0..600 {
        if !c.leader.map().is_up(other) && c.serving_primary(PgId::new(1, 0)).is_some() {
            break;
        }
        rt::sleep(Duration::from_millis(20)).await;
    }
    assert!(listings(c) > before, "osd.{z}'s copy was not listed again");
}

/// `other` comes back; in the end copy `z` holds every `a`.
async fn whole_in_the_end(c: &Cluster, z: u32, other: u32, a: &[ObjectId]) {
    c.settle(SETTLE).await.unwrap();
    c.start(other).await;
    c.settle(SETTLE).await.unwrap();
    let zo = c.osd(z).unwrap();
    assert!(!zo.store().pg_recovering(PgId::new(1, 0).key()));
    for (k, &o) in a.iter().enumerate() {
        assert_eq!(
            zo.store().read(o, 0, 4096).await.map(|d| d[0]).ok(),
            Some(k as u8 + 1),
            "{o} on osd.{z}"
        );
    }
    assert_eq!(c.log_delta_misses(), 0);
}

/// A copy whose recovery was cut short is compared object by object at
/// the next peering, not from its log. It missed so many writes of a PG
/// that the authoritative log no longer names some objects it lacks, and
/// recovery brought it the newest object first, with that object's
/// entry: its log then overlaps the authority's, but its objects are not
/// its log's ops applied. Its recovering mark says so; without the mark
/// peering would take the logs' word and leave it without those objects
/// for good.
#[test]
fn a_copy_whose_recovery_was_cut_short_is_not_compared_by_its_log() {
    rt::block_on_virtual(async {
        let c = cluster(9).await;
        let (b, a, acting) = a_copy_far_behind(&c).await;
        let z = acting[2];
        c.start(z).await;
        c.osd(z).unwrap().set_recovery_rate(u64::from(OBJECT_BYTES));
        let zo = c.osd(z).unwrap();
        for _ in 0..600 {
            if zo.store().version(b).is_some() {
                break;
            }
            rt::sleep(Duration::from_millis(10)).await;
        }
        assert!(zo.store().version(b).is_some(), "b never recovered");
        assert!(a.iter().any(|&o| zo.store().version(o).is_none()));
        assert!(zo.store().pg_recovering(PgId::new(1, 0).key()));
        listed_in_a_new_epoch(&c, z, acting[1]).await;
        whole_in_the_end(&c, z, acting[1], &a).await;
        c.stop();
    });
}

/// A copy left to background recovery takes the interval's writes at
/// once, logged, before recovery brings it anything: a new object of the
/// PG makes its log overlap the authority's. It is marked recovering
/// before the PG goes active, so the next peering still lists it.
#[test]
fn a_copy_left_to_recover_is_marked_before_it_takes_writes() {
    rt::block_on_virtual(async {
        let c = cluster(10).await;
        let (b, a, acting) = a_copy_far_behind(&c).await;
        let z = acting[2];
        // Nothing recovery sends reaches z before the new epoch.
        let to_z = c.nodes.borrow()[z as usize].addr.to_string();
        c.net
            .set_filter(move |_, to, h| h.op == Op::Push && to == to_z);
        c.start(z).await;
        let zo = c.osd(z).unwrap();
        let new = (0..)
            .map(|k| nacre_sim::obj(2, k))
            .find(|&o| c.route(o).0 == PgId::new(1, 0))
            .unwrap();
        put(&c, new, 1000, 0xcc).await;
        assert!(zo.store().version(new).is_some() && zo.store().version(b).is_none());
        assert!(zo.store().pg_recovering(PgId::new(1, 0).key()));
        listed_in_a_new_epoch(&c, z, acting[1]).await;
        c.net.clear_filter();
        whole_in_the_end(&c, z, acting[1], &a).await;
        c.stop();
    });
}

/// A copy far behind that also holds a divergent write comes back as its
/// PG's primary: peering lists it, plans its recovery and rewrites the
/// divergent object on every copy, itself included. A rewrite that lands
/// before the copy is marked recovering gives its log an entry of the new
/// epoch over objects that are not its log's ops applied: if the peering
/// is then cut short (here one replica's rewrite sub-op is lost, so it is
/// tried again), the next one would take the logs' word and leave the
/// copy without the objects it missed, serving them as absent. The copy
/// is marked before any rewrite reaches it, so it is listed again.
#[test]
fn a_copy_behind_is_marked_before_a_rewrite_reaches_it() {
    rt::block_on_virtual(async {
        let c = cluster(41).await;
        let pgs = c.leader.map().pg_count(1);
        let in_pg: Vec<ObjectId> = (0..)
            .map(|b| nacre_sim::obj(1, b))
            .filter(|&o| PgId::of(o, pgs) == PgId::new(1, 0))
            .take(7)
            .collect();
        let (d, b, a) = (in_pg[0], in_pg[1], in_pg[2..].to_vec());
        let acting = write_only_on_primary(&c, d).await;
        let z = acting[0];
        c.settle(SETTLE).await.unwrap();
        // Without it: each `a`, then more writes of `b` than a PG log holds.
        let mut req = 10;
        for (k, &o) in a.iter().enumerate() {
            put(&c, o, req, k as u8 + 1).await;
            req += 1;
        }
        for _ in 0..140 {
            put(&c, b, req, 0xbb).await;
            req += 1;
        }
        // The rewrite's sub-ops to one replica are lost for a while: the
        // rewrite fails and the peering is tried again.
        let lost = Rc::new(std::cell::Cell::new(0));
        let seen = lost.clone();
        let replica = c.nodes.borrow()[acting[2] as usize].addr.to_string();
        c.net.set_filter(move |_, to, h| {
            let hit = to == replica && h.oid == d && matches!(h.op, Op::RepWrite | Op::RepDelete);
            lost.set(lost.get() + u32::from(hit));
            hit
        });
        c.start(z).await;
        rt::sleep(Duration::from_secs(40)).await;
        c.net.clear_filter();
        c.settle(SETTLE).await.unwrap();
        assert!(seen.get() > 0, "no rewrite sub-op was lost");
        assert_eq!(c.route(d).1[0], z, "osd.{z} is primary again");
        for (k, &o) in a.iter().enumerate() {
            let got = read(&c, o).await;
            assert_eq!(
                got.map(|g| g[0]),
                Some(k as u8 + 1),
                "{o} read through osd.{z}"
            );
            let on_z = c.osd(z).unwrap().store().read(o, 0, 4096).await;
            assert_eq!(on_z.map(|g| g[0]).ok(), Some(k as u8 + 1), "{o} on osd.{z}");
        }
        assert_eq!(read(&c, d).await, None, "the divergent write is undone");
        assert_eq!(c.log_delta_misses(), 0);
        c.stop();
    });
}

/// The case an adversarial review of the mark's fix found: a copy that
/// lacks only objects the peering rewrites. `z` is away while `x2` is
/// written once and `x1` so often that the logs no longer name `x2`; the
/// primary `w` then takes a write of each alone and loses power, and an
/// interval of `y` and a fourth OSD `r` goes on. Back in the first
/// placement with `w`, `z` leads: it lacks `x1` and `x2`, and `w`'s
/// divergent writes make the peering rewrite both, so `z` has no object
/// to recover. The rewrite of `x2` is held up and `w` goes down: the next
/// peering, without `w`, rewrites nothing, and must still list `z` —
/// marked before the first rewrite — rather than take its log's word and
/// serve `x2` as absent.
#[test]
fn a_copy_that_lacks_only_rewritten_objects_is_marked_before_the_rewrites() {
    rt::block_on_virtual(async {
        let c = Cluster::new(Net::new(44, Duration::from_millis(500)), 4, 3, 2, 4).await;
        c.settle(SETTLE).await.unwrap();
        let pgs = c.leader.map().pg_count(1);
        let in_pg: Vec<ObjectId> = (0..)
            .map(|b| nacre_sim::obj(1, b))
            .filter(|&o| PgId::of(o, pgs) == PgId::new(1, 0))
            .take(2)
            .collect();
        let (x1, x2) = (in_pg[0], in_pg[1]);
        let first = c.placement(x1);
        let (z, w, y) = (first[0], first[1], first[2]);
        let r = (0..4).find(|o| !first.contains(o)).unwrap();
        let addr = |id: u32| c.nodes.borrow()[id as usize].addr.to_string();
        c.crash(z, 1);
        c.settle(SETTLE).await.unwrap();
        assert_eq!(c.route(x1).1, vec![w, y], "w leads without z");
        put(&c, x2, 1, 0x22).await;
        for req in 2..142 {
            put(&c, x1, req, 0x11).await;
        }
        // w takes a write of each alone, then loses power.
        let to_y = addr(y);
        c.net
            .set_filter(move |_, to, h| h.op == Op::RepWrite && to == to_y);
        let sends: Vec<_> = [(x1, 0x1du8), (x2, 0x2d)]
            .into_iter()
            .map(|(o, b)| {
                let c = c.clone();
                rt::spawn(async move { send(&c, o, 1000 + u64::from(b), b).await })
            })
            .collect();
        let ahead = |o: ObjectId| {
            let v = |id: u32| c.osd(id).unwrap().store().version(o);
            v(w) > v(y)
        };
        while !(ahead(x1) && ahead(x2)) {
            rt::sleep(Duration::from_millis(1)).await;
        }
        c.crash(w, 3);
        for s in sends {
            assert!(s.await.map_or(true, |f| f.h.status != Status::Ok));
        }
        c.net.clear_filter();
        // An interval of y and r (w, down, stays a temporary member of
        // the PGs that move: no settle).
        c.mark_out(w, true).unwrap();
        let pg0 = PgId::new(1, 0);
        for _ in 0..600 {
            let active = c.serving_primary(pg0).is_some();
            if active && c.route(x1).1.contains(&r) && !c.osd(y).unwrap().pg_recovering(pg0) {
                break;
            }
            rt::sleep(Duration::from_millis(100)).await;
        }
        let (_, acting) = c.route(x1);
        assert!(
            acting.contains(&y) && acting.contains(&r),
            "{acting:?}, y {y}, r {r}"
        );
        assert!(c
            .leader
            .map()
            .last_active(pg0)
            .is_some_and(|i| i.acting.contains(&r)));
        // z and w back in one epoch, no peering in between (the queries
        // of the epochs on the way are lost), z leading.
        c.net.set_filter(|_, _, h| h.op == Op::PgQuery);
        c.start(w).await;
        c.mark_out(w, false).unwrap();
        c.start(z).await;
        // (r stays a temporary member while the PG moves back.)
        let (_, acting) = c.route(x1);
        assert!(acting[0] == z && acting.contains(&w), "{acting:?}");
        let epoch = c.leader.map().epoch();
        // The rewrite of x2 is held up (its bytes cannot be fetched from
        // the authority) until w is gone; the one of x1, first, lands.
        c.net
            .set_filter(move |_, _, h| h.op == Op::Pull && h.oid == x2);
        let zo = c.osd(z).unwrap();
        for _ in 0..3000 {
            if zo.store().version(x1).is_some_and(|v| v >> 32 == epoch) {
                break;
            }
            rt::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            zo.store().version(x1).map(|v| v >> 32),
            Some(epoch),
            "x1 not rewritten"
        );
        assert_eq!(zo.store().version(x2), None);
        drop(zo);
        c.crash(w, 4);
        // The fetch stays stalled until the map has w down (it would
        // otherwise complete the rewrite on z in this epoch).
        while c.leader.map().is_up(w) {
            rt::sleep(Duration::from_millis(10)).await;
        }
        c.net.clear_filter();
        // (r stays a temporary member without w: no settle.)
        for _ in 0..600 {
            let m = c.leader.map();
            if !m.is_up(w)
                && c.osd(z).unwrap().epoch() == m.epoch()
                && c.osd(z).unwrap().pg_state(pg0) == Some(PgState::Active)
                && !c.osd(z).unwrap().pg_recovering(pg0)
            {
                break;
            }
            rt::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(c.route(x2).1[0], z, "z leads");
        let got = read(&c, x2).await;
        assert_eq!(got.map(|d| d[0]), Some(0x22), "x2 through z");
        assert_eq!(c.log_delta_misses(), 0);
        c.stop();
    });
}

/// A volume deleted (its objects purged on every OSD) while its objects are
/// still being recovered leaves nothing for recovery to wait for: the PGs
/// end clean instead of retrying pulls of purged objects for ever.
#[test]
fn a_volume_purged_while_its_objects_recover_leaves_the_pgs_clean() {
    rt::block_on_virtual(async {
        let (c, oids, m) = returning_copy(7).await;
        assert!(m
            .pgs()
            .any(|pg| c.osd(m.primary(pg).unwrap()).unwrap().pg_recovering(pg)));
        for id in 0..3 {
            let addr = c.nodes.borrow()[id as usize].addr.clone();
            let conn = nacre_net::Transport::connect(&c.net, &addr).unwrap();
            let h = Header::request(Op::PurgeVolume, 0, nacre_sim::obj(1, 0));
            let f = nacre_net::Rpc::call(&*conn, h, None).await.unwrap();
            assert_eq!(f.h.status, Status::Ok, "purge on osd.{id}");
        }
        c.settle(SETTLE).await.unwrap();
        for &oid in &oids {
            assert_eq!(read(&c, oid).await, None, "{oid} survived its volume");
        }
        c.stop();
    });
}

/// Degraded PGs recover first. osd.2 misses a round of writes while down,
/// and osd.3 is marked out meanwhile: when osd.2 is back, the PGs osd.3
/// was in keep three complete copies (osd.3 stays in as a temporary
/// member) while osd.2 and the new members are filled, and the others
/// have two. While a primary recovers a PG with two, its PGs with three
/// make no progress (but for a step each already on its way).
#[test]
fn degraded_pgs_recover_before_moving_ones() {
    rt::block_on_virtual(async {
        let c = Cluster::new(Net::new(11, Duration::from_millis(500)), 4, 3, 2, 8).await;
        c.settle(SETTLE).await.unwrap();
        let oids: Vec<ObjectId> = (0..64).map(|b| nacre_sim::obj(1, b)).collect();
        for (k, &oid) in oids.iter().enumerate() {
            put(&c, oid, k as u64 + 1, 1).await;
        }
        let back = 2;
        c.crash(back, 1);
        c.settle(SETTLE).await.unwrap();
        for (k, &oid) in oids.iter().enumerate() {
            put(&c, oid, 100 + k as u64, 2).await;
        }
        let slow = 4 * u64::from(OBJECT_BYTES); // four objects a second
        for id in [0, 1, 3] {
            c.osd(id).unwrap().set_recovery_rate(slow);
        }
        c.mark_out(3, true).unwrap();
        c.start(back).await;
        c.osd(back).unwrap().set_recovery_rate(slow);
        // Per primary and PG moving with every copy: object copies left.
        let mut moving: std::collections::HashMap<(u32, PgId), usize> = Default::default();
        let (mut both, mut slipped) = (0, 0);
        for _ in 0..1200 {
            rt::sleep(Duration::from_millis(50)).await;
            let mut busy = false;
            for id in 0..3 {
                let r = c.osd(id).unwrap().stat_report();
                let left = |p: &nacre_osd::PgReport| -> usize {
                    let d = p.detail.as_deref().unwrap_or("");
                    d.split(' ')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0)
                };
                let degraded = (r.pgs_not_clean.iter()).any(|p| p.state == "active+recovering");
                let mut now: Vec<((u32, PgId), usize)> = Vec::new();
                for p in &r.pgs_not_clean {
                    busy = true;
                    if p.state == "active+remapped+backfilling" {
                        now.push(((id, p.pg), left(p)));
                    }
                }
                if degraded && !now.is_empty() {
                    both += 1;
                    slipped += (now.iter())
                        .filter(|(k, n)| moving.get(k).is_some_and(|was| n < was))
                        .count();
                }
                moving.retain(|k, _| k.0 != id);
                moving.extend(now);
            }
            if !busy {
                break;
            }
        }
        assert!(both > 0, "never a degraded and a moving PG at once");
        assert!(
            slipped <= 4,
            "PGs with every copy recovered {slipped} times while degraded ones waited"
        );
        c.settle(SETTLE).await.unwrap();
        for &oid in &oids {
            assert_eq!(read(&c, oid).await.map(|d| d[0]), Some(2), "{oid}");
        }
        c.stop();
    });
}

/// Writes the whole of `oid` (so that it lives in a block of its own on
/// every copy) with bytes that depend on `request`, which must be
/// acknowledged; the bytes.
async fn put_whole(c: &Cluster, oid: ObjectId, request: u64) -> Vec<u8> {
    let data: Vec<u8> = (0..OBJECT_BYTES)
        .map(|i| ((u64::from(i) + request * 7) % 251) as u8)
        .collect();
    let mut h = Header::request(Op::Write, request, oid).with_payload(&data);
    h.length = OBJECT_BYTES;
    h.client = CLIENT;
    let f = c
        .call(h, Some(AlignedBuf::from_slice(&data)))
        .await
        .unwrap();
    assert_eq!(f.h.status, Status::Ok, "write {request}");
    data
}

/// Flips a bit in OSD `id`'s copy of `oid`, which must be a whole object
/// in a block, and checks that its store now refuses to read it; the
/// block.
async fn damage(c: &Cluster, id: u32, oid: ObjectId) -> u32 {
    let osd = c.osd(id).unwrap();
    let block = (osd.store().block_of(oid)).expect("a whole object has a block");
    let at = osd.store().geometry().block_offset(block) + 8192 + 17;
    c.nodes.borrow()[id as usize].dev.flip(at, 0x10);
    assert!(
        osd.store().read(oid, 0, OBJECT_BYTES).await.is_err(),
        "the flipped bit went unnoticed"
    );
    block
}

/// Once the cluster settles: `primary` still leads `oid`'s PG, found its
/// copy damaged once and repaired it, and its copy and `to`'s hold `data`.
async fn recovered_around_the_damage(
    c: &Cluster,
    oid: ObjectId,
    primary: u32,
    to: u32,
    data: &[u8],
) {
    c.settle(SETTLE).await.unwrap();
    assert_eq!(c.route(oid).1[0], primary, "the primary changed");
    let r = c.osd(primary).unwrap().stat_report();
    assert_eq!((r.damaged_reads, r.repaired), (1, 1));
    for id in [primary, to] {
        let got = c.osd(id).unwrap().store().read(oid, 0, OBJECT_BYTES).await;
        assert_eq!(&got.expect("a whole copy")[..], data, "osd.{id}");
    }
    c.stop();
}

/// A copy that comes back behind is recovered in the background from the
/// primary's copy; when that is damaged, from another copy at the same
/// version (one version names one content), and the primary's copy is
/// repaired with it. Recovery does not stall on the damaged source.
#[test]
fn recovery_from_a_damaged_source_takes_another_copy() {
    rt::block_on_virtual(async {
        let c = cluster(13).await;
        let oid = nacre_sim::obj(1, 6);
        put_whole(&c, oid, 1).await;
        let (_, acting) = c.route(oid);
        let (primary, behind) = (acting[0], acting[2]);
        c.crash(behind, 1);
        c.settle(SETTLE).await.unwrap();
        let data = put_whole(&c, oid, 2).await;
        damage(&c, primary, oid).await;
        c.start(behind).await;
        recovered_around_the_damage(&c, oid, primary, behind, &data).await;
    });
}

/// The same when peering itself recovers the copy (below `min_size`
/// without it): a replaced disk in a PG of 3 copies with `min_size` 3.
#[test]
fn peering_from_a_damaged_source_takes_another_copy() {
    rt::block_on_virtual(async {
        let c = Cluster::new(Net::new(15, Duration::from_millis(500)), 3, 3, 3, 4).await;
        c.settle(SETTLE).await.unwrap();
        let oid = nacre_sim::obj(1, 6);
        let data = put_whole(&c, oid, 1).await;
        let (_, acting) = c.route(oid);
        let (primary, replaced) = (acting[0], acting[2]);
        c.crash(replaced, 1);
        c.replace_disk(replaced).await;
        damage(&c, primary, oid).await;
        c.start(replaced).await;
        recovered_around_the_damage(&c, oid, primary, replaced, &data).await;
    });
}

/// An OSD whose reads found `DAMAGED_OBJECTS_OUT` objects damaged asks to be
/// marked out: its PGs move to the other OSDs, recovered from copies that
/// are whole (its own damaged copies, still sources while the PGs move,
/// are pulled from others), and every object reads back.
#[test]
fn an_osd_whose_reads_keep_finding_damage_is_marked_out() {
    rt::block_on_virtual(async {
        let c = Cluster::new(Net::new(14, Duration::from_millis(500)), 4, 3, 2, 8).await;
        c.settle(SETTLE).await.unwrap();
        let oids: Vec<ObjectId> = (0..160).map(|b| nacre_sim::obj(1, b)).collect();
        let mut data = Vec::new();
        for (k, &oid) in oids.iter().enumerate() {
            data.push(put_whole(&c, oid, k as u64 + 1).await);
        }
        let bad = 0;
        for &oid in oids.iter().filter(|&&o| c.route(o).1.contains(&bad)) {
            damage(&c, bad, oid).await;
        }
        let led: Vec<usize> = (0..oids.len())
            .filter(|&k| c.route(oids[k]).1[0] == bad)
            .collect();
        assert!(led.len() as u64 >= nacre_types::DAMAGED_OBJECTS_OUT);
        // Each read finds the damage, is answered from another copy, and
        // repairs the primary's; from the last one on, the PGs are moving.
        for &k in &led {
            let mut h = Header::request(Op::Read, 0, oids[k]);
            h.length = OBJECT_BYTES;
            let f = c.call(h, None).await.expect("a read");
            match f.h.status {
                Status::Ok => assert_eq!(f.payload.as_deref(), Some(&data[k][..])),
                // Retried by a client: the PGs are moving.
                s @ (Status::Unavailable | Status::NotPrimary | Status::StaleEpoch) => assert!(
                    c.leader.map().cluster.out.contains(&bad),
                    "read of {}: {s:?}",
                    oids[k]
                ),
                s => panic!("read of {}: {s:?}", oids[k]),
            }
        }
        let mut waited = 0;
        while !c.leader.map().cluster.out.contains(&bad) {
            waited += 1;
            assert!(waited < 100, "osd.{bad} was not marked out");
            rt::sleep(Duration::from_millis(100)).await;
        }
        c.settle(SETTLE).await.unwrap();
        let m = c.leader.map();
        for pg in m.pgs() {
            assert!(!m.acting(pg).contains(&bad), "PG {pg} still on osd.{bad}");
        }
        for (k, &oid) in oids.iter().enumerate() {
            assert_eq!(read(&c, oid).await.as_ref(), Some(&data[k]), "{oid}");
        }
        let r = c.osd(bad).unwrap().stat_report();
        assert!(r.damaged_objects >= nacre_types::DAMAGED_OBJECTS_OUT);
        c.stop();
    });
}

/// A read that the primary's own checksums refuse is answered from
/// another copy at the same version: the client gets its bytes, not an
/// I/O error, the primary counts the damage and rewrites its copy.
#[test]
fn a_damaged_primary_copy_is_read_from_another_and_repaired() {
    rt::block_on_virtual(async {
        let c = cluster(12).await;
        let oid = nacre_sim::obj(1, 5);
        let data = put_whole(&c, oid, 1).await;
        let (_, acting) = c.route(oid);
        let primary = c.osd(acting[0]).unwrap();
        let block = damage(&c, acting[0], oid).await;
        assert_eq!(read(&c, oid).await.as_deref(), Some(&data[..]));
        let r = primary.stat_report();
        assert_eq!((r.damaged_reads, r.repaired), (1, 1));
        // The copy was rewritten at the same version: read again, the
        // primary finds no damage.
        assert_ne!(primary.store().block_of(oid), Some(block));
        assert_eq!(
            &primary.store().read(oid, 0, OBJECT_BYTES).await.unwrap()[..],
            &data[..]
        );
        assert_eq!(read(&c, oid).await.as_deref(), Some(&data[..]));
        assert_eq!(primary.stat_report().damaged_reads, 1);
        c.stop();
    });
}

/// A deep scrub reads every copy: a replica's copy with a flipped bit is
/// found and rewritten in place from another copy at the same version
/// (the replica counts it damaged and repaired, so no health check stays
/// raised), a light scrub (versions and logs only) does not see it, and a
/// second deep scrub finds every copy identical.
#[test]
fn deep_scrub_finds_a_damaged_replica_copy_and_repairs_it() {
    rt::block_on_virtual(async {
        let c = cluster(21).await;
        let oids: Vec<ObjectId> = (0..12).map(|b| nacre_sim::obj(1, b)).collect();
        let mut data = Vec::new();
        for (k, &oid) in oids.iter().enumerate() {
            data.push(put_whole(&c, oid, k as u64 + 1).await);
        }
        let oid = oids[3];
        let (pg, acting) = c.route(oid);
        damage(&c, acting[1], oid).await;
        assert_eq!(c.scrubbed(pg, false).await.inconsistent, 0);
        let r = c.scrubbed(pg, true).await;
        let in_pg = oids.iter().filter(|&&o| c.route(o).0 == pg).count() as u64;
        assert_eq!(r.objects, in_pg);
        assert_eq!(
            (r.inconsistent, r.repaired, r.unrepaired),
            (1, 1, 0),
            "{r:?}"
        );
        assert!(r.findings[0].contains("damaged"), "{:?}", r.findings);
        let v = c.osd(acting[0]).unwrap().store().version(oid).unwrap();
        for &id in &acting {
            let s = c.osd(id).unwrap();
            assert_eq!(s.store().version(oid), Some(v), "osd.{id}");
            let got = s.store().read(oid, 0, OBJECT_BYTES).await.unwrap();
            assert_eq!(&got[..], &data[3][..], "osd.{id}");
        }
        assert_eq!(c.scrubbed(pg, true).await.inconsistent, 0);
        for (k, &oid) in oids.iter().enumerate() {
            assert_eq!(read(&c, oid).await.as_ref(), Some(&data[k]), "{oid}");
        }
        let rep = c.osd(acting[0]).unwrap().stat_report();
        assert_eq!((rep.deep_scrubs, rep.scrub_repaired), (2, 1));
        let rep = c.osd(acting[1]).unwrap().stat_report();
        assert_eq!((rep.damaged_reads, rep.repaired), (1, 1));
        c.stop();
    });
}

/// Copies that differ with every checksum intact: bytes rewritten at the
/// same version on one copy (deep scrub: the majority's bytes win), an
/// object one copy lost, and an object only one copy holds (light scrub:
/// versions; the majority's state wins, absent included).
#[test]
fn scrub_makes_copies_that_differ_silently_agree_with_the_majority() {
    rt::block_on_virtual(async {
        let c = cluster(22).await;
        let oids: Vec<ObjectId> = (0..40).map(|b| nacre_sim::obj(1, b)).collect();
        let mut data = Vec::new();
        for (k, &oid) in oids.iter().enumerate() {
            data.push(put_whole(&c, oid, k as u64 + 1).await);
        }
        let pg = c.route(oids[0]).0;
        let mine: Vec<usize> = (0..oids.len())
            .filter(|&k| c.route(oids[k]).0 == pg)
            .collect();
        assert!(mine.len() >= 3, "objects of PG {pg}: {mine:?}");
        let acting = c.route(oids[0]).1;
        let (a, b) = (c.osd(acting[1]).unwrap(), c.osd(acting[2]).unwrap());
        // Other bytes under the same version, checksums to match.
        let k0 = mine[0];
        let v0 = a.store().version(oids[k0]).unwrap();
        let other = AlignedBuf::from_slice(&vec![0x5a; OBJECT_BYTES as usize]);
        a.store().repair(oids[k0], v0, other).await.unwrap();
        // A copy that lost an object.
        let k1 = mine[1];
        let v1 = b.store().version(oids[k1]).unwrap();
        b.store().delete(oids[k1], v1 + 1).await.unwrap();
        // An object of the PG that only one copy holds.
        let stray = (100..)
            .map(|n| nacre_sim::obj(1, n))
            .find(|&o| c.route(o).0 == pg)
            .unwrap();
        let junk = AlignedBuf::from_slice(&vec![0x77; OBJECT_BYTES as usize]);
        b.store().write(stray, 1, 0, junk).await.unwrap();

        let light = c.scrubbed(pg, false).await;
        assert_eq!((light.inconsistent, light.repaired), (2, 2), "{light:?}");
        assert_eq!(b.store().version(stray), None);
        let deep = c.scrubbed(pg, true).await;
        assert_eq!((deep.inconsistent, deep.repaired), (1, 1), "{deep:?}");
        assert_eq!(c.scrubbed(pg, true).await.inconsistent, 0);
        for &id in &acting {
            let s = c.osd(id).unwrap();
            for &k in &mine {
                let got = s.store().read(oids[k], 0, OBJECT_BYTES).await.unwrap();
                assert_eq!(&got[..], &data[k][..], "osd.{id} {}", oids[k]);
            }
            assert_eq!(s.store().version(stray), None, "osd.{id}");
        }
        for (k, &oid) in oids.iter().enumerate() {
            assert_eq!(read(&c, oid).await.as_ref(), Some(&data[k]), "{oid}");
        }
        c.stop();
    });
}

/// A scrub runs only on an active+clean PG: with a copy down it says so
/// and compares nothing; and the schedule scrubs every PG on its own.
#[test]
fn scrub_waits_for_a_clean_pg_and_the_schedule_scrubs_every_pg() {
    rt::block_on_virtual(async {
        let c = cluster(23).await;
        let oid = nacre_sim::obj(1, 1);
        put_whole(&c, oid, 1).await;
        let (pg, acting) = c.route(oid);
        c.crash(acting[2], 1);
        while !c.leader.map().cluster.down.contains(&acting[2]) {
            rt::sleep(Duration::from_millis(100)).await;
        }
        c.settle(SETTLE).await.unwrap();
        let primary = c.leader.map().primary(pg).unwrap();
        let r = c.osd(primary).unwrap().scrub_pg(pg, true).await;
        assert_eq!(r.objects, 0);
        assert!(
            r.error
                .as_deref()
                .is_some_and(|e| e.contains("not active+clean")),
            "{r:?}"
        );
        c.start(acting[2]).await;
        c.settle(SETTLE).await.unwrap();
        let cfg = nacre_osd::ScrubConfig {
            interval: Duration::from_secs(5),
            deep_interval: Duration::from_secs(10),
            bytes_per_s: 1 << 30,
        };
        for id in 0..3 {
            c.osd(id).unwrap().set_scrub(cfg);
        }
        rt::sleep(Duration::from_secs(30)).await;
        let pgs = c.leader.map().pg_count(1);
        let (mut light, mut deep) = (0, 0);
        for id in 0..3 {
            let r = c.osd(id).unwrap().stat_report();
            light += r.scrubs;
            deep += r.deep_scrubs;
            assert_eq!(r.scrub_inconsistent, 0, "osd.{id}");
        }
        assert!(
            deep >= u64::from(pgs) && light >= u64::from(pgs),
            "{light} light, {deep} deep"
        );
        c.stop();
    });
}

/// Two pools on four OSDs. The second goes from 2 copies to 3: it is laid
/// out anew, and once settled every object of it is whole on its 3 new
/// members and nowhere else. Then it is removed: every OSD deletes its
/// objects and PG logs, and the first pool's read back untouched.
#[test]
fn a_pool_resized_keeps_its_data_and_a_removed_one_leaves_nothing() {
    rt::block_on_virtual(async {
        let net = Net::new(31, Duration::from_millis(500));
        let c = Cluster::with_pools(net, 4, &[(3, 2, 8), (2, 1, 8)]).await;
        c.settle(SETTLE).await.unwrap();
        let one: Vec<ObjectId> = (0..16).map(|b| nacre_sim::object(1, 1, b)).collect();
        let two: Vec<ObjectId> = (0..16).map(|b| nacre_sim::object(2, 1, b)).collect();
        for (k, &oid) in one.iter().chain(&two).enumerate() {
            put(&c, oid, k as u64 + 1, k as u8 + 1).await;
        }
        assert!(two.iter().all(|&o| c.route(o).1.len() == 2));
        let set = PoolChange::Set {
            id: 2,
            size: Some(3),
            min_size: None,
        };
        c.leader.pool_change(set).unwrap();
        c.settle(SETTLE).await.unwrap();
        let until = rt::monotonic() + Duration::from_millis(6 * nacre_osd::STRAY_CHECK_MS);
        while !c.stray_copies().is_empty() && rt::monotonic() < until {
            rt::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(c.stray_copies(), vec![]);
        for (k, &oid) in two.iter().enumerate() {
            let byte = (one.len() + k) as u8 + 1;
            let members = c.placement(oid);
            assert_eq!(members.len(), 3, "{oid}");
            let v = c.osd(members[0]).unwrap().store().version(oid);
            for id in members {
                assert_eq!(
                    c.osd(id).unwrap().store().version(oid),
                    v,
                    "{oid} on osd.{id}"
                );
            }
            let got = read(&c, oid).await.expect("written");
            assert_eq!(&got[..4096], &[byte; 4096][..], "{oid}");
        }
        // Removed: nothing of pool 2 stays on any OSD.
        c.leader.pool_change(PoolChange::Remove { id: 2 }).unwrap();
        let held = |c: &Cluster| -> usize {
            (0..4)
                .map(|id| {
                    let s = c.osd(id).unwrap();
                    let s = s.store();
                    let objects = s.list().into_iter().filter(|(o, _)| o.pool() == 2).count();
                    let logs = (s.pg_logs().into_iter())
                        .filter(|k| PgId::from_key(*k).pool == 2)
                        .count();
                    objects + logs
                })
                .sum()
        };
        assert!(held(&c) > 0);
        let until = rt::monotonic() + Duration::from_millis(3 * nacre_osd::STRAY_CHECK_MS);
        while held(&c) > 0 && rt::monotonic() < until {
            rt::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(held(&c), 0, "pool 2's objects and logs stay");
        c.settle(SETTLE).await.unwrap();
        for (k, &oid) in one.iter().enumerate() {
            let got = read(&c, oid).await.expect("written");
            assert_eq!(&got[..4096], &[k as u8 + 1; 4096][..], "{oid}");
        }
        // The map has no route to the removed pool any more.
        let f = send(&c, two[0], 99, 1).await;
        assert!(f.is_err(), "an op for a removed pool was sent");
        c.stop();
    });
}

/// A delete (`Write` of `data` if some) of `oid` conditional on version
/// `up_to`; the status.
async fn only_if(
    c: &Cluster,
    oid: ObjectId,
    request: u64,
    up_to: u64,
    data: Option<&[u8]>,
) -> Status {
    let mut h = Header::request(
        if data.is_some() {
            Op::Write
        } else {
            Op::Delete
        },
        request,
        oid,
    );
    h.client = CLIENT;
    h.obj_version = up_to;
    if let Some(d) = data {
        h = h.with_payload(d);
        h.length = d.len() as u32;
    }
    let f = c.call(h, data.map(AlignedBuf::from_slice)).await.unwrap();
    f.h.status
}

/// A shrink's cut (`Volume::cut_after`): each PG's primary lists the
/// volume's objects past the end at their authoritative versions — those
/// it still lacks while it recovers included — in pages; a delete or
/// zeroing conditional on the listed version removes them, except what
/// was written since (as behind a grow another command published), which
/// it leaves whole, and creates nothing.
#[test]
fn a_cut_lists_what_every_pg_holds_and_spares_what_was_written_since() {
    rt::block_on_virtual(async {
        let (c, oids, _) = returning_copy(6).await;
        let m = c.leader.map();
        let versions: Vec<u64> = (oids.iter())
            .map(|&o| {
                let v = (0..3).filter_map(|id| c.osd(id).unwrap().store().version(o));
                v.max().unwrap()
            })
            .collect();
        // Every PG lists its objects from block 10 on, at the versions its
        // complete copies hold, the ones its primary lacks included; in
        // pages of 2 as in one.
        let mut lacking = 0;
        let mut all = Vec::new();
        for pg in m.pgs() {
            let primary = c.osd(m.primary(pg).unwrap()).unwrap();
            let want: Vec<(u64, u64)> = (10..24)
                .filter(|&b| c.route(oids[b as usize]).0 == pg)
                .map(|b| (b, versions[b as usize]))
                .collect();
            lacking += (want.iter())
                .filter(|&&(b, _)| primary.store().version(oids[b as usize]).is_none())
                .count();
            assert_eq!(c.list(pg, 10, 2).await, want, "PG {pg}");
            assert_eq!(c.list(pg, 10, 4096).await, want, "PG {pg}");
            all.extend(want);
        }
        assert_eq!(all.len(), 14);
        assert!(lacking > 0, "no primary lacked a listed object");
        // A bad page size, or a PG of a pool not the volume's, is refused.
        let other = nacre_sim::object(2, 1, 0);
        for (len, oid) in [(0, oids[0]), (4097, oids[0]), (8, other)] {
            let mut h = Header::request(Op::List, 0, oid);
            h.length = len;
            let f = c.call_pg(PgId::new(1, 0), h, None).await.unwrap();
            assert_eq!(f.h.status, Status::Invalid, "{len} {oid}");
        }
        // Block 12 is written after the listing; the cut deletes the rest
        // and keeps it (and zeroes nothing of it).
        put(&c, oids[12], 500, 0x77).await;
        for (k, &(b, v)) in all.iter().enumerate() {
            let s = only_if(&c, oids[b as usize], 600 + k as u64, v, None).await;
            let expect = if b == 12 { Status::Stale } else { Status::Ok };
            assert_eq!(s, expect, "block {b}");
            let zeros = [0u8; 4096];
            let s = only_if(&c, oids[b as usize], 700 + k as u64, v, Some(&zeros)).await;
            let expect = if b == 12 {
                Status::Stale
            } else {
                Status::NotFound
            };
            assert_eq!(s, expect, "zeroing block {b}");
        }
        for (b, &oid) in oids.iter().enumerate() {
            let got = read(&c, oid).await;
            match b {
                0..10 => assert_eq!(got.unwrap()[0], b as u8 + 1, "{oid}"),
                12 => assert_eq!(got.unwrap()[0], 0x77, "{oid}"),
                _ => assert!(got.is_none(), "{oid} outlived the cut"),
            }
        }
        for pg in m.pgs() {
            let left = c.list(pg, 10, 4096).await;
            let kept = (c.route(oids[12]).0 == pg).then(|| oids[12].block);
            assert_eq!(
                left.iter().map(|e| e.0).collect::<Vec<_>>(),
                Vec::from_iter(kept)
            );
        }
        c.settle(SETTLE).await.unwrap();
        c.stop();
    });
}

/// A client op naming client 0 — the mark of the OSDs' own rewrites and
/// of a peering's rollbacks in the PG logs — is refused (`Invalid`) and
/// changes nothing: a write creates no object, a delete leaves one
/// standing.
#[test]
fn a_client_op_as_client_zero_is_refused() {
    rt::block_on_virtual(async {
        let c = cluster(31).await;
        let oid = c.object(1);
        let as_zero = |op: Op, request: u64| {
            let data = [0x42u8; 4096];
            let mut h = Header::request(op, request, oid);
            if op == Op::Write {
                h = h.with_payload(&data);
                h.length = data.len() as u32;
            }
            h.client = 0;
            (h, (op == Op::Write).then(|| AlignedBuf::from_slice(&data)))
        };
        let (h, d) = as_zero(Op::Write, 1);
        assert_eq!(c.call(h, d).await.unwrap().h.status, Status::Invalid);
        assert_eq!(read(&c, oid).await, None, "a write as client 0 landed");
        put(&c, oid, 2, 7).await;
        let (h, d) = as_zero(Op::Delete, 3);
        assert_eq!(c.call(h, d).await.unwrap().h.status, Status::Invalid);
        let got = read(&c, oid).await.expect("a delete as client 0 landed");
        assert!(got[..4096].iter().all(|&b| b == 7));
    });
}

/// A replicated pool's objects are read through their primary only: a
/// direct read (`Op::DirectRead`, for a data shard of an EC pool) sent to
/// any OSD of the set is refused `Invalid` — a replica could be behind
/// its primary — and `ShardActive` (an EC primary's word) changes that
/// for none of them.
#[test]
fn a_replicated_pool_refuses_direct_reads() {
    rt::block_on_virtual(async {
        let c = cluster(32).await;
        let oid = c.object(2);
        put(&c, oid, 1, 9).await;
        let (pg, acting) = c.route(oid);
        let epoch = c.leader.map().epoch();
        for &o in &acting {
            let mut h = Header::request(Op::ShardActive, 0, ObjectId::default()).with_pg(pg);
            (h.epoch, h.sender) = (epoch, acting[0]);
            let f = c.call_osd(o, h, None).await.unwrap();
            let want = if o == acting[0] {
                Status::NotPrimary
            } else {
                Status::Invalid
            };
            assert_eq!(f.h.status, want, "ShardActive to osd.{o}");
            let got = c.direct_read(o, oid, 0, 4096, epoch).await;
            assert_eq!(got, (Status::Invalid, None), "a direct read from osd.{o}");
        }
        let got = read(&c, oid).await.expect("the object");
        assert!(got[..4096].iter().all(|&b| b == 9));
    });
}

/// A client write naming a block index with a bit at or above 52 (the
/// shard byte, and the bit a store names the blocks its undos keep with)
/// is refused `Invalid` before it gets a version: the PG's interval goes
/// on (a store refusing it after would end the interval, at any client's
/// will).
#[test]
fn a_client_op_on_a_reserved_block_index_is_refused() {
    rt::block_on_virtual(async {
        let c = cluster(33).await;
        let epoch = c.leader.map().epoch();
        let volume = c.object(1).volume.0;
        for (i, block) in [1u64 << 52, 1 << 55, (1 << 55) | 3].into_iter().enumerate() {
            let oid = ObjectId::new(volume, block);
            let f = send(&c, oid, 10 + i as u64, 5).await.unwrap();
            assert_eq!(f.h.status, Status::Invalid, "block {block:#x}");
        }
        rt::sleep(Duration::from_secs(5)).await;
        assert_eq!(c.leader.map().epoch(), epoch, "an interval ended");
    });
}

/// `Op::Echo` and `Op::NetBench` refuse what they cannot do, with the
/// reason, and do what they can: an echo of more than 4 KiB, a link
/// measure to the OSD itself, to one the map does not have or by another
/// OSD are refused; an echo of 100 bytes and a measure to a peer answer.
#[test]
fn link_measures_refuse_what_they_cannot_do() {
    rt::block_on_virtual(async {
        let c = cluster(47).await;
        let ask = |op: Op, length: u32, to: u64, sender: Option<u32>| {
            let c = c.clone();
            async move {
                let mut h = Header::request(op, 0, ObjectId::default());
                (h.length, h.obj_version) = (length, to);
                if let Some(s) = sender {
                    h.sender = s;
                }
                let f = c.call_osd(0, h, None).await.unwrap();
                let text = (f.payload.as_deref()).map(|p| String::from_utf8_lossy(p).into_owned());
                (f.h.status, f.payload.map_or(0, |p| p.len()), text)
            }
        };
        let (s, len, _) = ask(Op::Echo, 100, 0, None).await;
        assert_eq!((s, len), (Status::Ok, 100));
        let (s, _, _) = ask(Op::Echo, nacre_wire::ECHO_REPLY_MAX + 1, 0, None).await;
        assert_eq!(s, Status::Invalid);
        for (to, sender, why) in [
            (0, None, "to osd.0"),
            (99, None, "to osd.99"),
            (1 << 40, None, ""),
            (1, Some(2), ""),
        ] {
            let (s, _, text) = ask(Op::NetBench, 0, to, sender).await;
            assert_eq!(s, Status::Invalid, "to {to}");
            assert!(text.unwrap_or_default().contains(why), "to {to}");
        }
        let (s, _, text) = ask(Op::NetBench, 0, 1, None).await;
        assert_eq!(s, Status::Ok, "{text:?}");
        let r: nacre_osd::LinkReport = serde_json::from_str(&text.unwrap()).unwrap();
        assert_eq!((r.from, r.to), (0, 1));
        assert!(r.pings > 0);
        c.stop();
    });
}

/// Starts a bench of `bytes` on OSD `osd`; its ticket.
async fn bench_start(c: &Cluster, osd: u32, bytes: u64) -> u64 {
    let mut h = Header::request(Op::Bench, 0, ObjectId::default());
    (h.length, h.obj_version) = (nacre_wire::BENCH_START, bytes);
    let f = c.call_osd(osd, h, None).await.unwrap();
    let why = f.payload.as_deref().map(String::from_utf8_lossy);
    assert_eq!(f.h.status, Status::Ok, "{why:?}");
    f.h.obj_version
}

/// The objects of benches OSD `osd` holds.
fn bench_objects(c: &Cluster, osd: u32) -> usize {
    let o = c.osd(osd).unwrap();
    let held = o
        .store()
        .list_where(|o| o.volume == nacre_osd::BENCH_VOLUME);
    held.len()
}

/// `Op::Bench`: an OSD measures its own store — every test runs, its
/// report says what each did — and deletes the objects it wrote, which no
/// PG holds (the PGs stay clean throughout); one bench at a time. An OSD
/// that stops in a bench deletes what it left when it starts again.
#[test]
fn an_osd_bench_leaves_nothing_even_when_cut_short() {
    rt::block_on_virtual(async {
        let c = cluster(43).await;
        let ticket = bench_start(&c, 1, 4 << 20).await;
        let mut h = Header::request(Op::Bench, 0, ObjectId::default());
        (h.length, h.obj_version) = (nacre_wire::BENCH_START, 4 << 20);
        let again = c.call_osd(1, h, None).await.unwrap();
        assert_eq!(
            again.h.status,
            Status::Unavailable,
            "a second bench at once"
        );
        (h.length, h.obj_version) = (nacre_wire::BENCH_REPORT, ticket);
        let report: nacre_osd::BenchReport = loop {
            let f = c.call_osd(1, h, None).await.unwrap();
            assert_eq!(f.h.status, Status::Ok);
            if let Some(body) = f.payload {
                break serde_json::from_slice(&body).unwrap();
            }
            rt::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(report.error, None, "{report:?}");
        assert_eq!(report.tests.len(), 6, "{report:?}");
        assert!(report.tests.iter().all(|t| t.ops > 0), "{report:?}");
        assert_eq!(bench_objects(&c, 1), 0);
        c.settle(SETTLE).await.unwrap();
        // Cut short: the power goes while it writes.
        bench_start(&c, 2, 8 << 20).await;
        for _ in 0..1000 {
            if bench_objects(&c, 2) > 8 {
                break;
            }
            rt::sleep(Duration::from_millis(1)).await;
        }
        assert!(bench_objects(&c, 2) > 8, "the bench wrote nothing");
        // Its objects are no volume's: the orphan sweep neither sees them
        // nor may purge them.
        let usage = c.osd(2).unwrap().volume_usage();
        let bench = nacre_osd::BENCH_VOLUME.0;
        assert!(usage.volumes.iter().all(|v| v[0] != bench), "{usage:?}");
        let purge = Header::request(Op::PurgeVolume, 0, ObjectId::new(bench, 0));
        let f = c.call_osd(2, purge, None).await.unwrap();
        assert_eq!(f.h.status, Status::Invalid);
        assert!(bench_objects(&c, 2) > 8);
        c.crash(2, 5);
        c.start(2).await;
        c.settle(SETTLE).await.unwrap();
        for _ in 0..100 {
            if bench_objects(&c, 2) == 0 {
                break;
            }
            rt::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            bench_objects(&c, 2),
            0,
            "what the bench left is still there"
        );
        // An unknown ticket, a size out of bounds.
        (h.length, h.obj_version) = (nacre_wire::BENCH_REPORT, 99);
        assert_eq!(
            c.call_osd(2, h, None).await.unwrap().h.status,
            Status::NotFound
        );
        (h.length, h.obj_version) = (nacre_wire::BENCH_START, 1 << 20);
        let f = c.call_osd(2, h, None).await.unwrap();
        assert_eq!(f.h.status, Status::Invalid);
        assert!(String::from_utf8_lossy(&f.payload.unwrap()).contains("a bench writes"));
        c.stop();
    });
}

/// The OSDs named slow from their reports (`nacre status`'s `SLOW_OSD`).
fn slow_osds(c: &Cluster) -> Vec<u32> {
    let reports: Vec<(u32, Vec<Option<f64>>)> = (0..3)
        .filter_map(|id| c.osd(id))
        .map(|o| (o.id, o.stat_report().store_write_us_p99))
        .collect();
    (nacre_osd::slow::slow_osds(&reports).iter())
        .map(|s| s.osd)
        .collect()
}

/// The links between hosts (one OSD each here) whose pings stand out.
fn slow_links(c: &Cluster) -> Vec<[String; 2]> {
    let reports: Vec<_> = (0..4)
        .filter_map(|id| c.osd(id))
        .map(|o| (o.id, o.stat_report().peer_ping_us_p50))
        .collect();
    (nacre_osd::slow::slow_links(&reports, |id| Some(format!("host{id}"))).into_iter())
        .map(|l| l.hosts)
        .collect()
}

/// Slow-link detection: every OSD pings the OSDs it shares a PG with
/// every second; the link between two of four hosts turning slow (10 ms
/// more each way, the others instant) is named within a minute — its
/// pings' median five times the median of the six links in each of the
/// last three 10 s windows — and, fast again, cleared within a minute.
/// Seen failing with the pings untimed.
#[test]
fn a_slow_link_is_named_within_a_minute_and_cleared() {
    rt::block_on_virtual(async {
        let c = Cluster::new(Net::new(46, Duration::from_millis(500)), 4, 3, 2, 8).await;
        c.settle(SETTLE).await.unwrap();
        rt::sleep(Duration::from_secs(40)).await;
        assert_eq!(slow_links(&c), Vec::<[String; 2]>::new(), "alike links");
        let addr = |id: usize| c.nodes.borrow()[id].addr.clone();
        let delay = Some(Duration::from_millis(10));
        c.net.slow_link(&addr(0), &addr(1), delay);
        let within = |t0: Duration, s: u64| rt::monotonic() - t0 < Duration::from_secs(s);
        let t0 = rt::monotonic();
        let named = vec![["host0".to_string(), "host1".to_string()]];
        while slow_links(&c) != named {
            assert!(within(t0, 60), "the link not named: {:?}", slow_links(&c));
            rt::sleep(Duration::from_secs(1)).await;
        }
        // Slow, not cut: a write across it is acknowledged.
        put(&c, nacre_sim::obj(1, 1), 1, 1).await;
        c.net.slow_link(&addr(0), &addr(1), None);
        let t0 = rt::monotonic();
        while !slow_links(&c).is_empty() {
            assert!(within(t0, 60), "the link still named");
            rt::sleep(Duration::from_secs(1)).await;
        }
        c.stop();
    });
}

/// Slow-OSD detection: every OSD times its own store's writes; one whose
/// disk turns slow (20 ms on every op of its device, the others 300 µs)
/// is named within a minute — its p99 five times the median in each of
/// the last three 10 s windows — and the leader, hearing the same figures
/// in its heartbeats, demotes it: it leads no PG. Within a minute of its
/// disk being fast again it is neither named nor demoted, and leads its
/// share. Seen failing with the store writes untimed.
#[test]
fn a_slow_disk_is_named_within_a_minute_and_cleared() {
    slow_disk(true);
}

/// With `slow_osd_action = warn` the slow disk is named as before, and
/// never demoted.
#[test]
fn a_slow_disk_is_only_named_when_the_action_is_to_warn() {
    slow_disk(false);
}

/// Gives OSD `id`'s device `us` µs per op.
fn latency(c: &Cluster, id: u32, us: u64) {
    (c.nodes.borrow()[id as usize].dev).set_latency(Some(Duration::from_micros(us)));
}

/// Gives OSDs `0..osds` alike disks (300 µs per op) and the load that
/// slow-OSD detection measures — 4 KiB writes to objects 0..64 of volume
/// 1, one after the other, until the flag returned is set — and returns
/// once it has run 40 s (every kept window filled), with the writer.
async fn alike_disks_under_load(
    c: &Rc<Cluster>,
    osds: u32,
) -> (Rc<std::cell::Cell<bool>>, rt::JoinHandle<()>) {
    for id in 0..osds {
        latency(c, id, 300);
    }
    let stop = Rc::new(std::cell::Cell::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        rt::spawn(async move {
            let mut n = 0u64;
            while !stop.get() {
                let _ = send(&c, nacre_sim::obj(1, n % 64), 10_000 + n, n as u8).await;
                n += 1;
            }
        })
    };
    rt::sleep(Duration::from_secs(40)).await;
    (stop, writer)
}

fn slow_disk(demote: bool) {
    rt::block_on_virtual(async {
        let c = cluster(45).await;
        c.leader.set_slow_osd_action(demote);
        let latency = |id: u32, us: u64| latency(&c, id, us);
        let (stop, writer) = alike_disks_under_load(&c, 3).await;
        assert_eq!(slow_osds(&c), Vec::<u32>::new(), "alike disks");
        assert_eq!(c.leader.map().cluster.demoted, Vec::<u32>::new());
        latency(1, 20_000);
        let within = |t0: Duration, s: u64| rt::monotonic() - t0 < Duration::from_secs(s);
        let t0 = rt::monotonic();
        while slow_osds(&c) != vec![1] {
            assert!(within(t0, 60), "osd.1 not named");
            rt::sleep(Duration::from_secs(1)).await;
        }
        let t0 = rt::monotonic();
        if demote {
            // Demoted: it leads no PG while another member is up.
            while c.leader.map().cluster.demoted != vec![1] {
                assert!(within(t0, 10), "osd.1 not demoted");
                rt::sleep(Duration::from_millis(500)).await;
            }
            let m = c.leader.map();
            let pgs: Vec<PgId> = m.pgs().collect();
            assert!(!pgs.is_empty() && pgs.iter().all(|&pg| m.primary(pg) != Some(1)));
        } else {
            while within(t0, 20) {
                assert_eq!(c.leader.map().cluster.demoted, Vec::<u32>::new());
                assert_eq!(slow_osds(&c), vec![1]);
                rt::sleep(Duration::from_millis(500)).await;
            }
        }
        latency(1, 300);
        let t0 = rt::monotonic();
        while !slow_osds(&c).is_empty() || !c.leader.map().cluster.demoted.is_empty() {
            assert!(within(t0, 60), "osd.1 still named or demoted");
            rt::sleep(Duration::from_secs(1)).await;
        }
        // Leading its share again.
        let m = c.leader.map();
        assert!(m.pgs().any(|pg| m.primary(pg) == Some(1)));
        stop.set(true);
        writer.await;
        c.stop();
    });
}

/// A PG's first member demoted, its second leads; that primary turns full
/// (so that, marked out, it is kept as no temporary member), is cut off
/// from the other OSDs (its heartbeats still reach the leader, the maps
/// it asks for and its leases are lost, its clients still reach it) and
/// marked out, so the PG goes on without it in a newer epoch and takes a
/// write within its last lease.
/// The old primary still thinks its PG active and must not answer a read
/// with the old bytes: before the leader records the new interval it
/// waits out the read lease of the primary that reported the last one
/// active — not of the PG's first member, which the demotion made
/// another. Seen failing (the old bytes answered) with the wait on the
/// first member.
#[test]
fn a_primary_leading_for_a_demoted_member_serves_no_stale_read_once_moved_away() {
    rt::block_on_virtual(async {
        let c = Cluster::new(Net::new(48, Duration::from_millis(500)), 4, 3, 2, 8).await;
        c.settle(SETTLE).await.unwrap();
        let oid = nacre_sim::obj(1, 500);
        let (pg, _) = c.route(oid);
        let row = c.placement(oid);
        let (first, p) = (row[0], row[1]);
        let (stop, writer) = alike_disks_under_load(&c, 4).await;
        latency(&c, first, 20_000);
        let within = |t0: Duration, s: u64| rt::monotonic() - t0 < Duration::from_secs(s);
        let t0 = rt::monotonic();
        loop {
            let led = c.serving_primary(pg) == Some(p);
            if c.leader.map().cluster.demoted == vec![first] && led {
                break;
            }
            assert!(
                within(t0, 90),
                "osd.{first} not demoted for osd.{p} to lead"
            );
            rt::sleep(Duration::from_millis(500)).await;
        }
        put(&c, oid, 1, 0x11).await;
        let old = c.osd(p).unwrap();
        let ask = |old_epoch: u64| {
            let c = &c;
            async move {
                let mut h = Header::request(Op::Read, 0, oid);
                h.length = 4096;
                h = h.with_pg(pg);
                h.epoch = old_epoch;
                let addr = c.nodes.borrow()[p as usize].addr.clone();
                let conn = nacre_net::Transport::connect(&c.net, &addr).unwrap();
                let f = nacre_net::Rpc::call(&*conn, h, None).await.unwrap();
                (f.h.status, f.payload.map(|d| d[0]))
            }
        };
        assert_eq!(
            ask(old.epoch()).await,
            (Status::Ok, Some(0x11)),
            "the primary serves"
        );
        // Full, so that marked out it is no temporary member (which the
        // new interval would have to hear).
        old.set_full_ratios(1e-9, 2e-9);
        let t0 = rt::monotonic();
        while !c.leader.map().full.contains(&p) || old.epoch() != c.leader.map().epoch() {
            assert!(within(t0, 10), "osd.{p} not full");
            rt::sleep(Duration::from_millis(100)).await;
        }
        let old_epoch = old.epoch();
        let pa = c.nodes.borrow()[p as usize].addr.to_string();
        let leader = nacre_sim::leader_addr().to_string();
        c.net.set_filter(move |from, to, h| {
            (from == pa && (to != leader || h.op != Op::Ping)) || (to == pa && !from.is_empty())
        });
        c.mark_out(p, true).unwrap();
        let t0 = rt::monotonic();
        loop {
            let moved = !c.placement(oid).contains(&p) && c.serving_primary(pg).is_some();
            if moved {
                break;
            }
            assert!(within(t0, 30), "PG {pg} not active without osd.{p}");
            rt::sleep(Duration::from_millis(100)).await;
        }
        put(&c, oid, 2, 0x22).await;
        assert_eq!(old.epoch(), old_epoch, "the old primary learnt the new map");
        assert_eq!(old.pg_state(pg), Some(PgState::Active));
        let (s, got) = ask(old_epoch).await;
        assert_eq!(s, Status::Unavailable, "the old primary answered {got:?}");
        stop.set(true);
        writer.await;
        c.net.clear_filter();
        old.set_full_ratios(1.0, 1.0);
        c.mark_out(p, false).unwrap();
        c.settle(SETTLE).await.unwrap();
        let got = read(&c, oid).await.expect("the object");
        assert_eq!(&got[..4096], &[0x22u8; 4096][..]);
        c.stop();
    });
}

/// A disk slow only under a primary's load: osd.1's device takes 20 ms
/// per op while it leads PGs and 300 µs while demoted (the others 300
/// µs). Without a hold-down it is demoted and restored about once a
/// minute (ten times in ten minutes), each change an epoch in which every
/// PG peers. With it, the n-th demotion within the hour lasts at least
/// 2^(n−2) minutes (n ≥ 2) — and not much longer, the disk being calm
/// meanwhile — while the first lasts only until three calm windows; the
/// third is cut by a power loss (the OSD marked down) and a restart,
/// which do not end it. Seen failing without the hold-down, and with a restart ending
/// it.
#[test]
fn a_disk_slow_only_while_it_leads_is_not_demoted_and_restored_every_minute() {
    rt::block_on_virtual(async {
        let c = cluster(49).await;
        let (stop, writer) = alike_disks_under_load(&c, 3).await;
        // Each demotion: when it began, and how long it lasted.
        let mut demotions: Vec<(Duration, Option<Duration>)> = Vec::new();
        let t0 = rt::monotonic();
        while rt::monotonic() - t0 < Duration::from_secs(600) {
            let now = rt::monotonic() - t0;
            let demoted = c.leader.map().cluster.demoted.contains(&1);
            match demotions.last_mut() {
                Some((from, last @ None)) if !demoted => *last = Some(now - *from),
                Some((_, None)) => {}
                _ if demoted => {
                    demotions.push((now, None));
                    // Marked down and restarted while held: still held.
                    if demotions.len() == 3 {
                        c.crash(1, 1);
                        while c.leader.map().is_up(1) {
                            rt::sleep(Duration::from_millis(100)).await;
                        }
                        c.start(1).await;
                    }
                }
                _ => {}
            }
            latency(&c, 1, if demoted { 300 } else { 20_000 });
            rt::sleep(Duration::from_millis(500)).await;
        }
        assert!(demotions.len() >= 3, "{demotions:?}");
        assert!(demotions.len() <= 5, "{demotions:?}");
        for (n, (_, lasted)) in demotions.iter().enumerate() {
            let Some(lasted) = lasted else { continue };
            let hold = match n {
                0 => Duration::ZERO,
                n => Duration::from_secs(60 << (n - 1)),
            };
            // (Seen to within the half-second the loop sleeps.)
            let seen = hold.saturating_sub(Duration::from_secs(1));
            assert!(
                *lasted >= seen && *lasted <= hold + Duration::from_secs(45),
                "demotion {} lasted {lasted:?}, held {hold:?}: {demotions:?}",
                n + 1
            );
        }
        stop.set(true);
        writer.await;
        c.stop();
    });
}
