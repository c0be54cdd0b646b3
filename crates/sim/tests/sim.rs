//! Seeded histories on the simulated cluster: clients write and delete
//! whole objects through the primaries while the network drops, delays and
//! duplicates messages and loses replies, and OSDs crash (power cut) and
//! restart; then everything heals and every object is checked against a
//! model of what the clients were told.
//!
//! `NACRE_SIM_SEEDS` (default 128) sets how many seeds run, `NACRE_SIM_SEED`
//! replays one. A failing seed is printed.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use nacre_io::{rt, AlignedBuf};
use nacre_sim::{Cluster, Faults, Net, OBJECT_BYTES};
use nacre_types::ObjectId;
use nacre_wire::{Header, Op, Status};

const OSDS: u32 = 3;
const OBJECTS: u64 = 16;
const CLIENTS: u64 = 4;
const OPS_PER_CLIENT: u32 = 40;
/// Attempts of one client op (same request id) before the client gives up.
const ATTEMPTS: u32 = 4;

/// What one client op tried to leave in its object: content of a write
/// (by its seed), or `None` for a delete; and whether it was acknowledged.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    content: Option<u64>,
    acked: bool,
}

/// With `NACRE_SIM_TRACE` set, what happens, on virtual time.
fn trace(what: &str) {
    if std::env::var_os("NACRE_SIM_TRACE").is_some() {
        eprintln!("{:>10.3} {what}", rt::monotonic().as_secs_f64());
    }
}

fn content(seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..OBJECT_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

type Model = Rc<RefCell<BTreeMap<u64, Vec<Attempt>>>>;

/// One client: ops on its own objects, one at a time, each retried with
/// the same request id.
async fn client(c: Rc<Cluster>, k: u64, model: Model, seed: u64) {
    let mut rng = nacre_io::fault::SplitMix(seed ^ (k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for n in 0..OPS_PER_CLIENT {
        let obj = rng.below(OBJECTS / CLIENTS) * CLIENTS + k;
        let oid = ObjectId::new(1, obj);
        let delete = rng.below(8) == 0;
        let data_seed = rng.next_u64();
        let request_id = u64::from(n) + 1;
        let mut acked = false;
        for _ in 0..ATTEMPTS {
            let (h, p) = if delete {
                (Header::request(Op::Delete, request_id, oid), None)
            } else {
                let d = content(data_seed);
                let mut h = Header::request(Op::Write, request_id, oid).with_payload(&d);
                h.length = OBJECT_BYTES;
                (h, Some(AlignedBuf::from_slice(&d)))
            };
            let mut h = h;
            h.client = 100 + k;
            trace(&format!("client {k}: {:?} {obj} req {request_id}", h.op));
            let r = c.call(h, p).await;
            trace(&format!("client {k}: {:?}", r.as_ref().map(|f| f.h.status)));
            match r {
                Ok(f) if f.h.status == Status::Ok => {
                    acked = true;
                    break;
                }
                _ => rt::sleep(Duration::from_millis(50)).await,
            }
        }
        model.borrow_mut().entry(obj).or_default().push(Attempt {
            content: (!delete).then_some(data_seed),
            acked,
        });
    }
}

/// Crashes a random OSD now and then, and restarts it a little later.
async fn chaos(c: Rc<Cluster>, until: Rc<std::cell::Cell<bool>>) {
    while !until.get() {
        rt::sleep(Duration::from_millis(200 + c.net.below(800))).await;
        let id = c.net.below(u64::from(OSDS)) as u32;
        if !c.is_up(id) {
            continue;
        }
        trace(&format!("crash osd.{id}"));
        c.crash(id, c.net.below(u64::MAX));
        rt::sleep(Duration::from_millis(100 + c.net.below(900))).await;
        trace(&format!("start osd.{id}"));
        c.start(id).await;
        trace(&format!("started osd.{id}"));
    }
}

/// The contents a read of `obj` may return after the history: the last
/// acknowledged op's or any later attempt's; with nothing acknowledged,
/// any attempt's or nothing.
fn allowed(attempts: &[Attempt]) -> Vec<Option<u64>> {
    match attempts.iter().rposition(|a| a.acked) {
        Some(i) => attempts[i..].iter().map(|a| a.content).collect(),
        None => std::iter::once(None)
            .chain(attempts.iter().map(|a| a.content))
            .collect(),
    }
}

async fn read(c: &Cluster, obj: u64) -> Option<Vec<u8>> {
    let oid = ObjectId::new(1, obj);
    let mut last = String::new();
    for _ in 0..20 {
        let mut h = Header::request(Op::Read, 0, oid);
        h.length = OBJECT_BYTES;
        match c.call(h, None).await {
            Ok(f) if f.h.status == Status::Ok => return Some(f.payload.expect("data").to_vec()),
            Ok(f) if f.h.status == Status::NotFound => return None,
            Ok(f) => last = format!("{:?}", f.h.status),
            Err(e) => last = e.to_string(),
        }
        rt::sleep(Duration::from_millis(100)).await;
    }
    let (_, acting) = c.route(oid);
    for id in acting {
        if let Some(o) = c.osd(id) {
            let s = o.store();
            eprintln!(
                "osd.{id}: version {:?}, journal used {}, stats {:?}",
                s.version(oid),
                s.journal_used_bytes(),
                s.stats()
            );
        }
    }
    panic!("object {obj} cannot be read after healing: {last}");
}

/// What a run checks once healed.
#[derive(Clone, Copy)]
enum Check {
    /// Reads through the primaries (invariant 3).
    Reads,
    /// Copies that hold one version hold one content (invariant 1).
    Versions,
}

fn run(seed: u64, check: Check) {
    rt::block_on_virtual(async move {
        let net = Net::new(seed, Duration::from_millis(500));
        let c = Cluster::new(net.clone(), OSDS, 3, 16).await;
        net.set_faults(Faults {
            drop_per_mille: 20,
            reply_drop_per_mille: 20,
            dup_per_mille: 20,
            delay_ms_max: 5,
        });
        let model: Model = Rc::default();
        let done = Rc::new(std::cell::Cell::new(false));
        let chaos = rt::spawn(chaos(c.clone(), done.clone()));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|k| rt::spawn(client(c.clone(), k, model.clone(), seed)))
            .collect();
        for t in clients {
            t.await;
        }
        done.set(true);
        chaos.await;
        // Heal: no more faults, every OSD up, time for retries to settle.
        net.set_faults(Faults::default());
        for id in 0..OSDS {
            if !c.is_up(id) {
                c.start(id).await;
            }
        }
        rt::sleep(Duration::from_secs(10)).await;
        let model = model.borrow().clone();
        if let Check::Versions = check {
            check_versions(&c, seed, &model).await;
            return;
        }
        for (&obj, attempts) in &model {
            let got = read(&c, obj).await;
            let ok = allowed(attempts).iter().any(|a| match (a, &got) {
                (None, None) => true,
                (Some(s), Some(g)) => content(*s) == *g,
                _ => false,
            });
            assert!(
                ok,
                "seed {seed}: object {obj} reads {} — not the last acknowledged op or a later one; history {attempts:?}",
                match &got {
                    None => "nothing".to_string(),
                    Some(g) => format!("{} bytes starting {:02x?}", g.len(), &g[..8]),
                }
            );
        }
    });
}

/// Every two copies of an object that report the same version must hold
/// the same bytes.
async fn check_versions(c: &Cluster, seed: u64, model: &BTreeMap<u64, Vec<Attempt>>) {
    for &obj in model.keys() {
        let oid = ObjectId::new(1, obj);
        let (_, acting) = c.route(oid);
        let mut seen: Vec<(u32, u64, Vec<u8>)> = Vec::new();
        for id in acting {
            let osd = c.osd(id).expect("healed: every OSD is up");
            let Some(v) = osd.store().version(oid) else {
                continue;
            };
            let data = osd
                .store()
                .read(oid, 0, OBJECT_BYTES)
                .await
                .expect("readable")
                .to_vec();
            for (other, ov, od) in &seen {
                assert!(
                    *ov != v || *od == data,
                    "seed {seed}: object {obj} has version {v} on osd.{other} and osd.{id} with different contents"
                );
            }
            seen.push((id, v, data));
        }
    }
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("NACRE_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("NACRE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    (1..=n).collect()
}

/// Invariant 3 of docs/internals/replication.md, as far as today's
/// replication can keep it: after any history of lost, delayed and
/// duplicated messages and OSD power cuts, once healed, every object reads
/// as its last acknowledged write or delete, or a later attempt.
#[test]
fn acknowledged_ops_survive_faults_and_crashes() {
    run_seeds(Check::Reads);
}

/// Invariant 1 (a version names one content on every copy): versions are
/// `epoch << 32 | seq`, every OSD start raises the epoch, and a replica
/// takes a repeated version as done only for the same PG log entry. The
/// clients write whole objects; partial overwrites after a failed write
/// need peering's recovery to keep copies equal, and join the workload
/// with it.
#[test]
fn one_version_one_content_on_every_copy() {
    run_seeds(Check::Versions);
}

fn run_seeds(check: Check) {
    for seed in seeds() {
        let r = std::panic::catch_unwind(|| run(seed, check));
        if let Err(e) = r {
            eprintln!("failing seed: {seed} (replay: NACRE_SIM_SEED={seed})");
            std::panic::resume_unwind(e);
        }
    }
}

/// The first seed that showed invariant 1 broken (found by the simulator,
/// not by hand): a primary crashed after its replicas had a write and
/// before its own copy was durable, came back, gave the same version to
/// the next write, and a replica took that for a repeat.
#[test]
fn regression_seed_42_one_version_two_contents() {
    run(42, Check::Versions);
}
