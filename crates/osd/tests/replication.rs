//! Three OSDs and a leader on one runtime, talking over unix sockets:
//! epochs, primacy, replication to every copy, and idempotent retries.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use nacre_io::net::{Addr, Listener};
use nacre_io::{rt, AlignedBuf};
use nacre_meta::embedded::Embedded;
use nacre_meta::map::{self, OsdRecord, PoolRecord};
use nacre_net::{Conn, Frame, Handler, Sockets};
use nacre_osd::leader::Leader;
use nacre_osd::{Osd, OsdConfig, OsdMap, PgState};
use nacre_types::{ObjectId, PgId, VolumeId, READ_LEASE_MS};
use nacre_wire::{Header, Op, Status};

fn write_header(oid: ObjectId, pg: PgId, request_id: u64, data: &[u8], epoch: u64) -> Header {
    let mut h = Header::request(Op::Write, request_id, oid).with_payload(data);
    h.length = data.len() as u32;
    h.epoch = epoch;
    h = h.with_pg(pg);
    h.client = 42;
    h
}

/// Three OSDs' records, a 3-replica pool of 8 PGs, its PG table and the
/// OSDs' addresses, in `d`.
struct Setup {
    osds: Vec<OsdRecord>,
    pool: PoolRecord,
    table: map::PgTable,
    addrs: HashMap<u32, Addr>,
}

fn setup(d: &std::path::Path) -> Setup {
    let osds: Vec<OsdRecord> = (0..3)
        .map(|id| {
            let addr = format!("unix:{}", d.join(format!("osd.{id}.sock")).display());
            OsdRecord::local(id, addr, 1)
        })
        .collect();
    let pool = PoolRecord::rbd(3, 2, 8, 64 << 10);
    let meta = Embedded::open(&d.join("meta")).unwrap();
    let table = map::init(&*meta, &osds, &pool).unwrap();
    let addrs = osds
        .iter()
        .map(|o| (o.id, o.addr.parse().unwrap()))
        .collect();
    Setup {
        osds,
        pool,
        table,
        addrs,
    }
}

/// Block `b` of a volume of pool 1.
fn obj(b: u64) -> ObjectId {
    ObjectId {
        volume: VolumeId::new(1, 9),
        block: b,
    }
}

/// PG `pg`'s acting set with every OSD up.
fn acting_of(t: &map::PgTable, pg: PgId) -> Vec<u32> {
    t.acting(pg.pg, &[])
}

fn leader_addr(d: &std::path::Path) -> Addr {
    Addr::Unix(d.join("leader.sock"))
}

/// Starts the cluster map's leader of `s` in `d` (inside `block_on`).
fn start_leader(d: &std::path::Path, s: &Setup) -> Rc<Leader<Sockets>> {
    start_leader_with(d, s, Box::new(|_| Ok(())))
}

/// [`start_leader`] storing its maps with `persist`.
fn start_leader_with(
    d: &std::path::Path,
    s: &Setup,
    persist: nacre_osd::leader::Persist,
) -> Rc<Leader<Sockets>> {
    let map = OsdMap {
        cluster: map::ClusterState {
            epoch: 1,
            ..Default::default()
        },
        pools: [(
            s.pool.id,
            map::PoolState {
                record: s.pool.clone(),
                table: s.table.clone(),
                last_active: Default::default(),
            },
        )]
        .into(),
        addrs: (s.addrs.iter()).map(|(k, a)| (*k, a.to_string())).collect(),
        up_from: Default::default(),
        stores: Default::default(),
        full: Default::default(),
    };
    let leader = Leader::new(map, Sockets, persist).unwrap();
    let l = Listener::bind(&leader_addr(d)).unwrap();
    rt::spawn(nacre_net::serve(l, leader.clone()));
    rt::spawn(leader.clone().run());
    leader
}

/// Opens OSD `id` of `s` in `d`, serves it and boots it.
async fn start_osd(d: &std::path::Path, s: &Setup, id: u32) -> (Rc<Osd>, nacre_osd::Serving) {
    let cfg = OsdConfig {
        id,
        path: d.join(format!("osd.{id}.img")),
        size_bytes: 160 << 20,
        addr: s.addrs[&id].clone(),
        object_bytes: s.pool.object_bytes,
        journal_bytes: None,
        pg_log_slots: s.pool.pg_count,
        direct: true,
        leader: nacre_osd::LeaderAddr::new(leader_addr(d)),
    };
    let osd = Osd::open(&cfg).await.unwrap();
    let serving = osd.serve(Listener::bind(&cfg.addr).unwrap());
    osd.boot().await.unwrap();
    (osd, serving)
}

/// [`start_osd`] for every OSD of `s`, in id order.
async fn start_osds(d: &std::path::Path, s: &Setup) -> Vec<(Rc<Osd>, nacre_osd::Serving)> {
    let mut all = Vec::new();
    for o in &s.osds {
        all.push(start_osd(d, s, o.id).await);
    }
    all
}

/// Waits until `osd` serves PG `pg` in the leader's epoch; that epoch.
async fn active(leader: &Leader<Sockets>, osd: &Osd, pg: PgId) -> u64 {
    for _ in 0..500 {
        let e = leader.map().epoch();
        if osd.epoch() == e && osd.pg_state(pg) == Some(PgState::Active) {
            return e;
        }
        rt::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "PG {pg} not active on osd.{}: {:?}",
        osd.id,
        osd.pg_state(pg)
    );
}

#[test]
fn primary_orders_replicates_and_refuses_what_it_must() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    let (pool, table, addrs) = (&st.pool, &st.table, &st.addrs);
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        let mut running: Vec<Rc<Osd>> = Vec::new();
        let mut serving = Vec::new();
        for o in &st.osds {
            let (osd, srv) = start_osd(d.path(), &st, o.id).await;
            serving.push(srv);
            running.push(osd);
        }
        let oid = obj(3);
        let pg = PgId::of(oid, pool.pg_count);
        let acting = acting_of(table, pg);
        let e = active(&leader, &running[acting[0] as usize], pg).await;
        let primary = Conn::connect(&addrs[&acting[0]]).unwrap();
        let replica = Conn::connect(&addrs[&acting[1]]).unwrap();
        let data = vec![0x5au8; 4096];
        let call = |c: &Rc<Conn>, h: Header, p: Option<&[u8]>| {
            let c = c.clone();
            let p = p.map(AlignedBuf::from_slice);
            async move { c.call(h, p).await.unwrap() }
        };

        // Versions are the PG's `epoch << 32 | seq`.
        let (v1, v2) = ((e << 32) | 1, (e << 32) | 2);
        let wr = |req| write_header(oid, pg, req, &data, e);
        let r = call(&primary, wr(100), Some(&data)).await;
        assert_eq!((r.h.status, r.h.obj_version), (Status::Ok, v1));
        // a retry of the same request is answered, not applied again
        let r = call(&primary, wr(100), Some(&data)).await;
        assert_eq!((r.h.status, r.h.obj_version), (Status::Ok, v1));
        let r = call(&primary, wr(101), Some(&data)).await;
        assert_eq!((r.h.status, r.h.obj_version), (Status::Ok, v2));
        // every copy has the newest version
        for id in &acting {
            assert_eq!(
                running[*id as usize].store().version(oid),
                Some(v2),
                "osd.{id}"
            );
            // ... and both entries in its PG log, with the client's request
            let log = running[*id as usize].store().pg_log(pg.key()).unwrap();
            let reqs: Vec<(u64, u64)> = log
                .entries
                .values()
                .map(|e| (e.version, e.request))
                .collect();
            assert_eq!(reqs, vec![(v1, 100), (v2, 101)], "osd.{id}");
        }

        let mut stale = wr(102);
        stale.epoch = e - 1;
        let r = call(&primary, stale, Some(&data)).await;
        assert_eq!((r.h.status, r.h.epoch), (Status::StaleEpoch, e));
        let r = call(&replica, wr(103), Some(&data)).await;
        assert_eq!(r.h.status, Status::NotPrimary);
        let r = call(
            &primary,
            write_header(oid, PgId::new(1, (pg.pg + 1) % 8), 104, &data, e),
            Some(&data),
        )
        .await;
        assert_eq!(r.h.status, Status::Invalid);
        // client 0 is the OSDs' own (peering's rewrites): no client
        // writes or deletes as it, and nothing of it is applied
        let mut as0 = wr(105);
        as0.client = 0;
        let r = call(&primary, as0, Some(&data)).await;
        assert_eq!(r.h.status, Status::Invalid, "a write as client 0");
        let mut del0 = Header::request(Op::Delete, 106, oid);
        (del0, del0.epoch) = (del0.with_pg(pg), e);
        let r = call(&primary, del0, None).await;
        assert_eq!(r.h.status, Status::Invalid, "a delete as client 0");
        // The pool a frame names must be its object's, and one the map has.
        let mut elsewhere = wr(107);
        elsewhere.pool = 2;
        let r = call(&primary, elsewhere, Some(&data)).await;
        assert_eq!(r.h.status, Status::Invalid, "another pool's PG");
        let stranger = ObjectId {
            volume: VolumeId::new(7, 9),
            block: oid.block,
        };
        let unknown = write_header(stranger, PgId::of(stranger, 8), 108, &data, e);
        let r = call(&primary, unknown, Some(&data)).await;
        assert_eq!(r.h.status, Status::Invalid, "an object of no pool");
        // A pull from the PG's primary, for an object of another PG.
        let other = (0..).map(obj).find(|o| PgId::of(*o, 8) != pg).unwrap();
        let mut pull = Header::request(Op::Pull, 109, other).with_pg(pg);
        (pull.epoch, pull.sender) = (e, acting[0]);
        let r = call(&replica, pull, None).await;
        assert_eq!(r.h.status, Status::Invalid, "a pull of another PG's object");
        assert_eq!(running[acting[0] as usize].store().version(oid), Some(v2));
        // a replica refuses a sub-op from an older epoch too
        let mut sub = wr(0);
        sub.op = Op::RepWrite;
        sub.obj_version = ((e - 1) << 32) | 9;
        sub.epoch = e - 1;
        let r = call(&replica, sub, Some(&data)).await;
        assert_eq!(r.h.status, Status::StaleEpoch);
        // ... and one that does not come from the PG's primary, at any epoch
        sub.epoch = e;
        sub.obj_version = (e << 32) | 9;
        let r = call(&replica, sub, Some(&data)).await;
        assert_eq!(r.h.status, Status::NotPrimary, "a client's RepWrite");
        sub.sender = acting[2];
        let r = call(&replica, sub, Some(&data)).await;
        assert_eq!(r.h.status, Status::NotPrimary, "another replica's RepWrite");
        // from the primary, but at a version of another epoch
        sub.sender = acting[0];
        sub.obj_version = 9;
        let r = call(&replica, sub, Some(&data)).await;
        assert_eq!(r.h.status, Status::Invalid, "a version outside the epoch");
        // a client may not pose as an OSD on a client op
        let mut posing = wr(106);
        posing.sender = acting[1];
        assert_eq!(
            call(&primary, posing, Some(&data)).await.h.status,
            Status::Invalid
        );
        assert_eq!(running[acting[1] as usize].store().version(oid), Some(v2));

        let mut rd = Header::request(Op::Read, 0, oid);
        rd.length = 8192;
        rd.epoch = e;
        rd = rd.with_pg(pg);
        let r = call(&primary, rd, None).await;
        assert_eq!(r.h.status, Status::Ok);
        let got = r.payload.unwrap();
        assert_eq!(&got[..4096], &data[..]);
        assert!(got[4096..].iter().all(|&x| x == 0));
        let mut missing = rd;
        missing.oid = obj(4);
        missing = missing.with_pg(PgId::of(missing.oid, 8));
        let owner_id = acting_of(table, missing.pg_id())[0];
        active(&leader, &running[owner_id as usize], missing.pg_id()).await;
        let owner = Conn::connect(&addrs[&owner_id]).unwrap();
        assert_eq!(call(&owner, missing, None).await.h.status, Status::NotFound);

        // delete reaches every copy
        let mut del = Header::request(Op::Delete, 105, oid);
        del.epoch = e;
        del = del.with_pg(pg);
        del.client = 42;
        let r = call(&primary, del, None).await;
        assert_eq!((r.h.status, r.h.obj_version), (Status::Ok, (e << 32) | 3));
        for id in &acting {
            assert_eq!(running[*id as usize].store().version(oid), None, "osd.{id}");
        }
        // a delete of an object no copy has is still logged on every copy
        // (a tombstone), at a version of its own
        let mut del2 = del;
        del2.request_id = 107;
        let r = call(&primary, del2, None).await;
        assert_eq!((r.h.status, r.h.obj_version), (Status::Ok, (e << 32) | 4));
        for id in &acting {
            let log = running[*id as usize].store().pg_log(pg.key()).unwrap();
            assert_eq!(log.head(), (e << 32) | 4, "osd.{id}");
            assert_eq!(log.entries[&((e << 32) | 4)].request, 107, "osd.{id}");
        }
        drop(serving);
        for o in running {
            o.close().await.unwrap();
        }
    });
}

/// A stand-in for an OSD that takes part in peering (it answers
/// heartbeats, maps and queries, and holds nothing) and then never answers
/// a sub-op.
struct Silent;

impl Handler for Silent {
    async fn handle(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        match f.h.op {
            Op::RepWrite | Op::RepDelete => std::future::pending().await,
            Op::PgQuery => {
                // An empty PG: no tail, no entries, no objects, no flag.
                let body = [0u8; 24];
                (
                    f.h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                )
            }
            _ => (f.h.reply(Status::Ok), None),
        }
    }
}

/// A read on the primary returns only acknowledged data: while a write of
/// the object waits for a replica that does not answer, a read of it waits
/// too (it would otherwise see the primary's own copy of a write that may
/// still fail and vanish at the next failover).
#[test]
fn reads_wait_for_writes_in_flight() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    let oid = obj(3);
    let pg = PgId::of(oid, st.pool.pg_count);
    let acting = acting_of(&st.table, pg);
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        // The third copy boots and peers, and never answers a sub-op.
        let silent = Listener::bind(&st.addrs[&acting[2]]).unwrap();
        rt::spawn(nacre_net::serve(silent, Rc::new(Silent)));
        let to_leader = Conn::connect(&leader_addr(d.path())).unwrap();
        // A boot must name its store (32 hex digits).
        for bad in [&b""[..], b"5111e470", b"5111E47000000000000000000000000A"] {
            let mut boot = Header::request(Op::Boot, 0, ObjectId::default()).with_payload(bad);
            boot.sender = acting[2];
            let r = to_leader
                .call(boot, Some(AlignedBuf::from_slice(bad)))
                .await;
            assert_eq!(r.unwrap().h.status, Status::Invalid);
        }
        let store = b"5111e47000000000000000000000000a";
        let mut boot = Header::request(Op::Boot, 0, ObjectId::default()).with_payload(store);
        boot.sender = acting[2];
        let boot = to_leader.call(boot, Some(AlignedBuf::from_slice(store)));
        assert_eq!(boot.await.unwrap().h.status, Status::Ok);
        let (primary, _s0) = start_osd(d.path(), &st, acting[0]).await;
        let (_replica, _s1) = start_osd(d.path(), &st, acting[1]).await;
        let e = active(&leader, &primary, pg).await;
        let conn = Conn::connect(&st.addrs[&acting[0]]).unwrap();
        let data = vec![0x77u8; 4096];
        let write = {
            let (c, h) = (conn.clone(), write_header(oid, pg, 1, &data, e));
            let p = AlignedBuf::from_slice(&data);
            rt::spawn(async move { c.call(h, Some(p)).await })
        };
        // The primary's own copy is written; the write waits for osd.silent.
        while primary.store().version(oid).is_none() {
            rt::sleep(Duration::from_millis(5)).await;
        }
        let mut rd = Header::request(Op::Read, 0, oid);
        rd.length = 4096;
        rd.epoch = e;
        rd = rd.with_pg(pg);
        let read_done = Rc::new(std::cell::Cell::new(false));
        let read = {
            let (c, done) = (conn.clone(), read_done.clone());
            rt::spawn(async move {
                let r = c.call(rd, None).await;
                done.set(true);
                r
            })
        };
        rt::sleep(Duration::from_millis(300)).await;
        assert!(
            !read_done.get(),
            "a read returned data whose write is not acknowledged"
        );
        drop((write, read));
    });
}

/// After a restart, a primary answers retries of requests it applied
/// before (from its PG logs) and assigns versions only in the epoch it
/// booted in or later, never one it gave out before.
#[test]
fn a_restarted_primary_answers_old_requests_and_never_reuses_a_version() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    let oid = obj(3);
    let pg = PgId::of(oid, st.pool.pg_count);
    let acting = acting_of(&st.table, pg);
    let data = vec![0x33u8; 4096];
    let write = |c: &Rc<Conn>, h: Header| {
        let (c, p) = (c.clone(), AlignedBuf::from_slice(&data));
        async move { c.call(h, Some(p)).await.unwrap() }
    };
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        let mut running = Vec::new();
        for &id in &acting {
            running.push(start_osd(d.path(), &st, id).await);
        }
        let e1 = active(&leader, &running[0].0, pg).await;
        let primary = Conn::connect(&st.addrs[&acting[0]]).unwrap();
        let r = write(&primary, write_header(oid, pg, 500, &data, e1)).await;
        assert_eq!((r.h.status, r.h.obj_version), (Status::Ok, (e1 << 32) | 1));
        // Restart the primary (a clean stop: its store is closed).
        let (osd, serving) = running.remove(0);
        drop(serving);
        primary.close();
        drop(primary);
        osd.close().await.unwrap();
        drop(osd);
        // Its connection tasks notice the closed socket and let go of it;
        // its socket file goes, as `nacre up` removes it at a stop.
        rt::sleep(Duration::from_millis(300)).await;
        let _ = std::fs::remove_file(d.path().join(format!("osd.{}.sock", acting[0])));
        running.insert(0, start_osd(d.path(), &st, acting[0]).await);
        let e2 = active(&leader, &running[0].0, pg).await;
        assert!(e2 > e1, "a new incarnation is up in a new epoch");
        let primary = Conn::connect(&st.addrs[&acting[0]]).unwrap();
        // The retry is answered from the log, with the old version.
        let r = write(&primary, write_header(oid, pg, 500, &data, e2)).await;
        assert_eq!((r.h.status, r.h.obj_version), (Status::Ok, (e1 << 32) | 1));
        // A new write gets a version of the new epoch, on every copy.
        let r = write(&primary, write_header(oid, pg, 501, &data, e2)).await;
        assert_eq!((r.h.status, r.h.obj_version), (Status::Ok, (e2 << 32) | 1));
        for (o, _) in &running {
            assert_eq!(o.store().version(oid), Some((e2 << 32) | 1), "osd.{}", o.id);
        }
    });
}

/// A primary reports the state of each of its PGs (for `nacre status`):
/// active+degraded while a copy is down and `min_size` are up, inactive
/// with the reason once fewer are.
#[test]
fn primaries_report_degraded_and_inactive_pgs() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        // osd.2 never starts.
        let (a, _sa) = start_osd(d.path(), &st, 0).await;
        let (b, sb) = start_osd(d.path(), &st, 1).await;
        let mine = |id: u32| {
            let m = leader.map();
            (m.pgs()).filter(|&pg| m.primary(pg) == Some(id)).count() as u32
        };
        let wait = |osd: Rc<Osd>, state: &'static str, n: u32| async move {
            for _ in 0..500 {
                let r = osd.stat_report();
                if r.pg_states.get(state) == Some(&n) && r.pg_states.len() == 1 {
                    return r;
                }
                rt::sleep(Duration::from_millis(20)).await;
            }
            panic!("osd.{}: {:?}", osd.id, osd.stat_report().pg_states);
        };
        let r = wait(a.clone(), "active+degraded", mine(0)).await;
        assert!(mine(0) > 0);
        assert_eq!(r.pgs_not_clean.len(), mine(0) as usize);
        assert_eq!(
            r.pgs_not_clean[0].detail.as_deref(),
            Some("2 of 3 copies up")
        );
        wait(b.clone(), "active+degraded", mine(1)).await;
        // osd.1 stops: after the heartbeat grace it is down, and osd.0's
        // PGs (now all of them) have one copy of three.
        drop(sb);
        b.halt();
        let r = wait(a.clone(), "inactive", 8).await;
        assert_eq!(
            r.pgs_not_clean[0].detail.as_deref(),
            Some("1 of 3 copies up, min_size 2")
        );
    });
}

/// A slow meta store (every `persist` takes 2 s, this thread held
/// meanwhile, as an etcd that fsyncs slowly holds a monitor's): the PGs'
/// intervals are stored in batches, not one write per PG (which took the
/// leader seconds per thousand PGs), and no OSD is marked down for the
/// heartbeats the leader could not read while it waited.
#[test]
fn a_slow_meta_store_batches_pg_events_and_marks_no_one_down() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    // The epochs stored, one entry per `persist`.
    let stored = Rc::new(std::cell::RefCell::new(Vec::<u64>::new()));
    let persist = {
        let stored = stored.clone();
        Box::new(move |m: &OsdMap| {
            std::thread::sleep(Duration::from_secs(2));
            stored.borrow_mut().push(m.epoch());
            Ok(())
        })
    };
    rt::block_on(async {
        let leader = start_leader_with(d.path(), &st, persist);
        let running = start_osds(d.path(), &st).await;
        let e = leader.map().epoch();
        let all_active = || {
            let m = leader.map();
            let all = (m.pgs()).all(|pg| {
                let osd = &running[m.primary(pg).unwrap() as usize].0;
                osd.epoch() == e && osd.pg_state(pg) == Some(PgState::Active)
            });
            all
        };
        // A bound on the test, not a measure: 8 PGs, one store each, take
        // 16 s of the thread; batched they take a few.
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while !all_active() {
            assert!(
                std::time::Instant::now() < until,
                "the PGs did not all go active in 60 s ({} stores)",
                stored.borrow().len()
            );
            let m = leader.map();
            assert!(
                m.cluster.down.is_empty(),
                "marked down: {:?}",
                m.cluster.down
            );
            assert_eq!(m.epoch(), e, "a new epoch");
            rt::sleep(Duration::from_millis(50)).await;
        }
        let m = leader.map();
        assert_eq!(m.pools[&1].last_active.len(), st.pool.pg_count as usize);
        // Stores of intervals are the ones that start no epoch.
        let s = stored.borrow();
        let actives = s.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(
            actives < st.pool.pg_count as usize / 2,
            "{actives} stores for the intervals of {} PGs: {s:?}",
            st.pool.pg_count
        );
    });
}

/// Malformed `Op::Scrub` frames (wire.md: kinds 0 list, 1 check, 2 deep
/// check, 3/4 start, 5 mend, 6 report) are refused with `Invalid` or the
/// routing status, and harm nothing: the replica answers a well-formed
/// step after them and its copy of the object is unchanged.
#[test]
fn malformed_scrub_frames_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        let running = start_osds(d.path(), &st).await;
        let oid = obj(3);
        let pg = PgId::of(oid, st.pool.pg_count);
        let acting = acting_of(&st.table, pg);
        let e = active(&leader, &running[acting[0] as usize].0, pg).await;
        let primary = Conn::connect(&st.addrs[&acting[0]]).unwrap();
        let replica = Conn::connect(&st.addrs[&acting[1]]).unwrap();
        let data = vec![0x33u8; 4096];
        let w = write_header(oid, pg, 1, &data, e);
        let f = primary
            .call(w, Some(AlignedBuf::from_slice(&data)))
            .await
            .unwrap();
        assert_eq!(f.h.status, Status::Ok);
        // Another PG's object, for frames that name the wrong one.
        let other = (0..)
            .map(obj)
            .find(|o| PgId::of(*o, st.pool.pg_count) != pg)
            .unwrap();
        let oids = nacre_osd::encode_oids;
        let scrub = |kind: u32, to_pg: PgId, sender: u32, oid: ObjectId| {
            let mut h = Header::request(Op::Scrub, 7, oid);
            h = h.with_pg(to_pg);
            h.length = kind;
            h.epoch = e;
            h.sender = sender;
            h
        };
        let by_primary = |kind: u32| scrub(kind, pg, acting[0], oid);
        let block = st.pool.object_bytes as usize;
        let cases: Vec<(&str, Header, Vec<u8>, Status)> = vec![
            ("unknown kind", by_primary(99), vec![], Status::Invalid),
            (
                "PG out of range",
                scrub(0, PgId::new(1, 1000), acting[0], oid),
                vec![],
                Status::Invalid,
            ),
            (
                "list with a payload",
                by_primary(0),
                vec![0; 16],
                Status::Invalid,
            ),
            (
                "list from an unknown place",
                {
                    let mut h = by_primary(0);
                    h.offset = 2;
                    h
                },
                vec![],
                Status::Invalid,
            ),
            (
                "check of a partial id",
                by_primary(1),
                vec![0; 15],
                Status::Invalid,
            ),
            (
                "check of too many objects",
                by_primary(1),
                oids(&vec![oid; 65]),
                Status::Invalid,
            ),
            (
                "deep check of too many objects",
                by_primary(2),
                oids(&[oid; 9]),
                Status::Invalid,
            ),
            (
                "check of another PG's object",
                by_primary(1),
                oids(&[other]),
                Status::Invalid,
            ),
            (
                "mend of a part of an object",
                by_primary(5),
                vec![0; 4096],
                Status::Invalid,
            ),
            (
                "mend of another PG's object",
                scrub(5, pg, acting[0], other),
                vec![0; block],
                Status::Invalid,
            ),
            (
                "a step not from the primary",
                scrub(0, pg, acting[2], oid),
                vec![],
                Status::NotPrimary,
            ),
            (
                "a step from a client",
                scrub(0, pg, nacre_wire::SENDER_CLIENT, oid),
                vec![],
                Status::NotPrimary,
            ),
            (
                "a start from an OSD",
                by_primary(3),
                vec![],
                Status::Invalid,
            ),
            (
                "a report with a payload",
                scrub(6, pg, nacre_wire::SENDER_CLIENT, oid),
                vec![1],
                Status::Invalid,
            ),
        ];
        for (what, h, body, want) in cases {
            let body = (!body.is_empty()).then(|| AlignedBuf::from_slice(&body));
            let h = match &body {
                Some(b) => h.with_payload(b),
                None => h,
            };
            let f = replica.call(h, body).await.unwrap();
            assert_eq!(f.h.status, want, "{what}");
        }
        // The replica still answers, and still holds the object as written.
        let f = replica
            .call(by_primary(1), Some(AlignedBuf::from_slice(&oids(&[oid]))))
            .await;
        assert_eq!(f.unwrap().h.status, Status::Ok);
        let mut r = Header::request(Op::Read, 2, oid);
        r = r.with_pg(pg);
        r.epoch = e;
        r.length = 4096;
        let f = primary.call(r, None).await.unwrap();
        assert_eq!(f.h.status, Status::Ok);
        assert_eq!(f.payload.as_deref(), Some(&data[..]));
    });
}

/// `Dead` (from the supervisor that reaped an OSD's process) marks that
/// incarnation down at once, without waiting for the heartbeat grace, and
/// leaves any other incarnation alone.
#[test]
fn a_dead_report_marks_that_incarnation_down_and_no_other() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        let mut osds = start_osds(d.path(), &st).await;
        let c = Conn::connect(&leader_addr(d.path())).unwrap();
        let dead = |id: u32, up_from: u64| {
            let mut h = Header::request(Op::Dead, 0, ObjectId::default());
            h.sender = id;
            h.obj_version = up_from;
            let c = c.clone();
            async move { c.call(h, None).await.unwrap().h.status }
        };
        let up_from = osds[1].0.up_from();
        assert!(up_from > 0);
        // Another incarnation than the one up: nothing happens.
        assert_eq!(dead(1, up_from - 1).await, Status::Ok);
        assert_eq!(dead(1, up_from + 1).await, Status::Ok);
        assert_eq!(leader.map().up_from.get(&1), Some(&up_from));
        // No such OSD.
        assert_eq!(dead(9, 1).await, Status::Invalid);
        let epoch = leader.map().epoch();
        // osd.1's process is gone: down as soon as the leader hears it.
        let (b, sb) = osds.remove(1);
        drop(sb);
        b.halt();
        assert_eq!(dead(1, up_from).await, Status::Ok);
        let m = leader.map();
        assert!(
            !m.up_from.contains_key(&1),
            "osd.1 still up: {:?}",
            m.up_from
        );
        assert!(m.cluster.down.contains(&1));
        assert_eq!(m.epoch(), epoch + 1);
        // Said twice: no second epoch.
        assert_eq!(dead(1, up_from).await, Status::Ok);
        assert_eq!(leader.map().epoch(), epoch + 1);
    });
}

/// A leader whose term ended (an elected monitor paused past its lease)
/// answers nothing and changes nothing, even to messages queued while it
/// still led; with its authority back it answers again. The read lease
/// its heartbeat answers grant never outlasts its authority.
#[test]
fn a_leader_without_authority_answers_nothing() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        let left = Rc::new(std::cell::Cell::new(Some(Duration::from_secs(60))));
        let l2 = left.clone();
        leader.set_authority(Box::new(move || l2.get()));
        let (osd, _serving) = start_osd(d.path(), &st, 0).await;
        let c = Conn::connect(&leader_addr(d.path())).unwrap();
        let ask_in = |op: Op, epoch: u64| {
            let mut h = Header::request(op, 0, ObjectId::default());
            h.sender = 0;
            h.obj_version = osd.up_from();
            h.epoch = epoch;
            let c = c.clone();
            async move { c.call(h, None).await.unwrap().h }
        };
        let ask = |op: Op| ask_in(op, osd.epoch());
        let call = |op: Op| async move { ask(op).await.status };
        let r = ask(Op::Ping).await;
        assert_eq!((r.status, u64::from(r.length)), (Status::Ok, READ_LEASE_MS));
        // A heartbeat naming an epoch older than this leader's first (or
        // than one a PG went active in) gets no lease: the OSD might serve
        // an interval that ended.
        let r = ask_in(Op::Ping, 1).await;
        assert_eq!((r.status, r.length), (Status::Ok, 0));
        left.set(Some(Duration::from_millis(700)));
        let r = ask(Op::Ping).await;
        assert_eq!((r.status, r.length), (Status::Ok, 700));
        let epoch = leader.map().epoch();
        left.set(None);
        for op in [Op::Ping, Op::GetMap, Op::Boot, Op::MarkOut, Op::Dead] {
            assert_eq!(call(op).await, Status::Unavailable, "{op:?}");
        }
        // Heartbeats stopped counting: the run loop may not mark anyone
        // down either.
        rt::sleep(Duration::from_millis(nacre_types::HEARTBEAT_GRACE_MS + 500)).await;
        assert_eq!(
            leader.map().epoch(),
            epoch,
            "a leader without authority made an epoch"
        );
        left.set(Some(Duration::from_secs(60)));
        assert_eq!(call(Op::GetMap).await, Status::Ok);
    });
}

/// An OSD's read lease lasts what the leader's answer granted, not a whole
/// `READ_LEASE_MS`: with 300 ms granted and the leader then silent (its
/// authority gone), the primary refuses a read 800 ms later, which a
/// 2 s lease would still have served (at most 500 ms passed between its
/// last answered heartbeat and the silence).
#[test]
fn a_read_lease_ends_when_the_grant_does() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    let oid = obj(5);
    let pg = PgId::of(oid, st.pool.pg_count);
    let acting = acting_of(&st.table, pg);
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        let left = Rc::new(std::cell::Cell::new(Some(Duration::from_secs(60))));
        let l2 = left.clone();
        leader.set_authority(Box::new(move || l2.get()));
        let osds = start_osds(d.path(), &st).await;
        let primary = &osds[acting[0] as usize].0;
        let e = active(&leader, primary, pg).await;
        let conn = Conn::connect(&st.addrs[&acting[0]]).unwrap();
        let data = vec![0x5au8; 4096];
        let w = conn.call(
            write_header(oid, pg, 1, &data, e),
            Some(AlignedBuf::from_slice(&data)),
        );
        assert_eq!(w.await.unwrap().h.status, Status::Ok);
        let read = || {
            let mut rd = Header::request(Op::Read, 0, oid);
            rd.length = 4096;
            rd.epoch = e;
            let c = conn.clone();
            async move { c.call(rd.with_pg(pg), None).await.unwrap().h.status }
        };
        assert_eq!(read().await, Status::Ok);
        left.set(Some(Duration::from_millis(300)));
        rt::sleep(Duration::from_millis(1_200)).await;
        left.set(None);
        rt::sleep(Duration::from_millis(800)).await;
        assert_eq!(
            read().await,
            Status::Unavailable,
            "a read served past the grant"
        );
        left.set(Some(Duration::from_secs(60)));
        rt::sleep(Duration::from_millis(1_200)).await;
        assert_eq!(read().await, Status::Ok);
    });
}

/// A new elected leader holds PG events until its predecessor's read
/// leases have ended: OSDs boot and peer meanwhile, but no interval goes
/// active (none is recorded) before the hold ends; then every PG does.
#[test]
fn no_interval_goes_active_while_the_leader_holds_events() {
    let d = tempfile::tempdir().unwrap();
    let st = setup(d.path());
    rt::block_on(async {
        let leader = start_leader(d.path(), &st);
        let hold = Duration::from_millis(1_500);
        leader.hold_events_until(rt::monotonic() + hold);
        let t0 = rt::monotonic();
        let osds = start_osds(d.path(), &st).await;
        rt::sleep(Duration::from_millis(500)).await;
        if rt::monotonic() - t0 < hold {
            assert!(
                leader.map().pools[&1].last_active.is_empty(),
                "an interval went active during the hold: {:?}",
                leader.map().pools[&1]
                    .last_active
                    .keys()
                    .collect::<Vec<_>>()
            );
        }
        for pg in leader.map().pgs() {
            let primary = leader.map().primary(pg).unwrap();
            let osd = &osds.iter().find(|(o, _)| o.id == primary).unwrap().0;
            active(&leader, osd, pg).await;
        }
        assert_eq!(
            leader.map().pools[&1].last_active.len(),
            st.pool.pg_count as usize
        );
    });
}
