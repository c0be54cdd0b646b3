//! Crash consistency against a model: random sequences of writes, deletes,
//! syncs, checkpoints and reads, with concurrent ops, bursts of overwrites
//! that fill the journal (so folds ahead of checkpoints run and their Fold
//! records are in the journal at the crash), and crashes at random points:
//! power cuts (the fault device drops, keeps or tears every write not yet
//! synced) and process kills (every completed write survives, as after
//! `kill -9`). After every reopen, and again once the reopened store's
//! background work (folds, a checkpoint) has run:
//! - every write that was acknowledged durable before the cut reads back;
//! - every object is in a state some sequence of its issued ops produced
//!   (no byte that was never written, no mix of two versions);
//! - versions never go back past an acknowledged one;
//! - odd objects log every op to a PG log (three PGs): an entry is in its
//!   log exactly when its data is in the store (one durable step), every
//!   entry of a durable op is there unless trimmed, and no entry is one
//!   that was never issued;
//! - a quarter of the objects write undoably (`Store::write_undoable`):
//!   the undo the store holds is always for the object's version and
//!   holds exactly the bytes that write replaced, and a write whose undo
//!   was not released still has it after every crash and checkpoint;
//!   half of them are given their bytes (`Store::replace_undoable`), so a
//!   whole-block one keeps the old block as its undo, and no such block
//!   shows in a listing or count, nor leaks once the store is closed
//!   and opened again.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use nacre_blockstore::{
    Error, FormatOptions, LogEntry, LogOp, LogRegion, OpenReport, Store, StoreOptions,
};
use nacre_io::rt::{block_on, spawn, yield_now};
use nacre_io::{AlignedBuf, FaultDev};
use nacre_types::ObjectId;
use proptest::prelude::*;

const BLOCK: u32 = 16 << 10;
const SECTORS: u16 = (BLOCK / 512) as u16;
const OBJECTS: u8 = 12;
const DEV_BYTES: u64 = 8 << 20;
const JOURNAL_BYTES: u64 = 2_359_296; // the smallest journal for 16 KiB blocks
const INFLIGHT_MAX: usize = 6;
const PGS: u8 = 3;
/// Slots of one page (62 entries), so long runs also drop old entries.
const LOG_REGION: LogRegion = LogRegion {
    slots: 4,
    slot_pages: 1,
};

/// Odd objects log their ops, to PG `obj % PGS`.
fn logged(obj: u8) -> bool {
    obj % 2 == 1
}

/// Some logged objects write undoably (few enough that their undos never
/// wait for room: 3 × 16 KiB, the room is 1/16 of the journal).
fn undoable(obj: u8) -> bool {
    obj % 4 == 1
}

fn entry(obj: u8, version: u64, op: LogOp, offset: u32, len: u32) -> LogEntry {
    LogEntry {
        pg: u64::from(obj % PGS),
        version,
        oid: oid(obj),
        op,
        offset,
        len,
        client: 9,
        request: version * 3,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        obj: u8,
        sector: u16,
        sectors: u16,
        seed: u8,
        durable: bool,
    },
    Full {
        obj: u8,
        seed: u8,
        durable: bool,
    },
    Delete {
        obj: u8,
    },
    Sync,
    Checkpoint,
    Read {
        obj: u8,
    },
    /// Releases the object's undo (its newest write committed).
    Release {
        obj: u8,
    },
    /// Trims a PG log to its newest `keep` entries (in memory until the
    /// next checkpoint).
    Trim {
        pg: u8,
        keep: u8,
    },
    /// Many 4 KiB durable overwrites at random chunks of random objects,
    /// several in flight: fills the journal past the point where folding
    /// ahead starts.
    Burst {
        count: u16,
        seed: u64,
    },
    /// A power cut (`kill: false`) or a process kill; with `settle`, the
    /// reopened store also runs a checkpoint and is checked again (without
    /// it, the next crash may find the redo's folds still in the journal).
    Cut {
        after: u8,
        seed: u64,
        kill: bool,
        settle: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..OBJECTS, 0..SECTORS, 1..=16u16, any::<u8>(), prop::bool::weighted(0.75)).prop_map(
            |(obj, sector, n, seed, durable)| Op::Write { obj, sector, sectors: n.min(SECTORS - sector), seed, durable }
        ),
        2 => (0..OBJECTS, any::<u8>(), prop::bool::weighted(0.75)).prop_map(|(obj, seed, durable)| Op::Full { obj, seed, durable }),
        1 => (0..OBJECTS).prop_map(|obj| Op::Delete { obj }),
        1 => Just(Op::Sync),
        1 => Just(Op::Checkpoint),
        2 => (0..OBJECTS).prop_map(|obj| Op::Read { obj }),
        1 => (0..OBJECTS).prop_map(|obj| Op::Release { obj }),
        1 => (0..PGS, 0..20u8).prop_map(|(pg, keep)| Op::Trim { pg, keep }),
        1 => (0..24u8, any::<u64>(), any::<bool>(), any::<bool>()).prop_map(|(after, seed, kill, settle)| Op::Cut { after, seed, kill, settle }),
        1 => (16..400u16, any::<u64>()).prop_map(|(count, seed)| Op::Burst { count, seed }),
    ]
}

fn data(seed: u8, at_sector: u16, sectors: u16) -> Vec<u8> {
    let mut v = vec![0u8; sectors as usize * 512];
    for (i, b) in v.iter_mut().enumerate() {
        let s = at_sector as usize + i / 512;
        *b = seed ^ (s as u8).wrapping_mul(37) ^ ((i % 512) as u8).wrapping_mul(3);
    }
    v
}

#[derive(Clone, Debug)]
struct ObjState {
    version: u64,
    content: Option<Vec<u8>>,
    /// An undoable write's state: the content before it.
    prev: Option<Option<Vec<u8>>>,
    /// Its undo was released (it may come back after a crash).
    released: bool,
}

/// One object's possible states: every op issued appends one. States before
/// `durable` can no longer be the outcome of a crash.
struct ObjModel {
    states: Vec<ObjState>,
    durable: usize,
    completed: usize,
    busy: bool,
}

type Done = Rc<RefCell<Option<Result<(), String>>>>;

struct Pending {
    obj: Option<u8>,
    state: usize,
    durable: bool,
    done: Done,
    sync_snapshot: Option<BTreeMap<u8, usize>>,
}

fn oid(obj: u8) -> ObjectId {
    ObjectId::new(77, u64::from(obj))
}

struct Harness {
    dev: FaultDev,
    store: Store<FaultDev>,
    model: BTreeMap<u8, ObjModel>,
    pending: Vec<Pending>,
    version: u64,
    cuts: u32,
    /// Every entry issued, by version.
    entries: HashMap<u64, LogEntry>,
    /// What the stores of the case did, summed over every open.
    tally: Tally,
}

/// What a case's stores did, summed over every open: lets a regression
/// check that it still reaches the state it was found in.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Objects folded ahead (`Stats::folds_ahead`).
    folds_ahead: u64,
    /// Objects whose journaled folds an open redid
    /// (`OpenReport::folds_redone`).
    folds_redone: u64,
    /// Objects folded ahead by a store whose open redid folds.
    folds_ahead_after_redo: u64,
    /// Whether the store open now redid folds.
    redid: bool,
}

impl Tally {
    /// Counts what `store` did before it is replaced.
    fn done(&mut self, store: &Store<FaultDev>) {
        let n = store.stats().folds_ahead;
        self.folds_ahead += n;
        if self.redid {
            self.folds_ahead_after_redo += n;
        }
    }

    /// Counts what the open of the next store did.
    fn opened(&mut self, report: &OpenReport) {
        self.folds_redone += report.folds_redone;
        self.redid = report.folds_redone > 0;
    }
}

impl Harness {
    fn settle(&mut self, p: Pending, result: Result<(), String>) {
        match (&result, p.obj) {
            (Ok(()), Some(obj)) => {
                let m = self.model.get_mut(&obj).expect("model");
                m.completed = m.completed.max(p.state);
                if p.durable {
                    m.durable = m.durable.max(p.state);
                }
                m.busy = false;
            }
            (Ok(()), None) => {
                if let Some(snap) = p.sync_snapshot {
                    for (obj, idx) in snap {
                        let m = self.model.get_mut(&obj).expect("model");
                        m.durable = m.durable.max(idx);
                    }
                }
            }
            (Err(e), _) => panic!("op failed without a power cut: {e}"),
        }
    }

    async fn drain(&mut self) {
        while !self.pending.is_empty() {
            let p = self.pending.remove(0);
            loop {
                let r = p.done.borrow_mut().take();
                if let Some(r) = r {
                    self.settle(p, r);
                    break;
                }
                yield_now().await;
            }
        }
    }

    fn issue(
        &mut self,
        obj: Option<u8>,
        state: usize,
        durable: bool,
        fut: impl std::future::Future<Output = Result<(), Error>> + 'static,
    ) {
        let done: Done = Rc::new(RefCell::new(None));
        let d = done.clone();
        spawn(async move {
            let r = fut.await.map_err(|e| e.to_string());
            *d.borrow_mut() = Some(r);
        });
        if let Some(o) = obj {
            self.model.get_mut(&o).expect("model").busy = true;
        }
        self.pending.push(Pending {
            obj,
            state,
            durable,
            done,
            sync_snapshot: None,
        });
    }

    async fn make_room(&mut self, obj: Option<u8>) {
        let busy = obj.is_some_and(|o| self.model[&o].busy);
        if busy || self.pending.len() >= INFLIGHT_MAX {
            self.drain().await;
        }
    }

    fn push_state(&mut self, obj: u8, content: Option<Vec<u8>>) -> (usize, u64) {
        self.version += 1;
        let m = self.model.get_mut(&obj).expect("model");
        let before = &m.states.last().expect("state").content;
        let prev = (undoable(obj) && content.is_some()).then(|| before.clone());
        m.states.push(ObjState {
            version: self.version,
            content,
            prev,
            released: false,
        });
        (m.states.len() - 1, self.version)
    }

    async fn cut(&mut self, after: u8, seed: u64, kill: bool, settle: bool) {
        for _ in 0..after {
            yield_now().await;
        }
        let (dev, _report) = if kill {
            (self.dev.kill(), Default::default())
        } else {
            self.dev.power_cut(seed)
        };
        // Ops that finished before the cut count; the rest may or may not
        // have happened.
        for p in std::mem::take(&mut self.pending) {
            let r = p.done.borrow_mut().take();
            match r {
                Some(Ok(())) => self.settle(p, Ok(())),
                Some(Err(e)) => panic!("op failed before the cut: {e}"),
                None => {}
            }
        }
        self.tally.done(&self.store);
        self.dev = dev;
        self.dev.set_yields(2);
        let (store, report) = Store::open(self.dev.clone(), StoreOptions::default())
            .await
            .unwrap_or_else(|e| panic!("reopen after cut {}: {e}", self.cuts));
        if std::env::var_os("NACRE_CRASH_DEBUG").is_some() {
            eprintln!("cut {}: {_report:?}; open: {report:?}", self.cuts);
        }
        self.tally.opened(&report);
        self.store = store;
        self.cuts += 1;
        self.check_after_crash().await;
        if !settle {
            return;
        }
        // What open left running (folds ahead, the redo of replayed folds)
        // must not undo what the first look saw.
        self.store
            .checkpoint()
            .await
            .unwrap_or_else(|e| panic!("checkpoint after cut {}: {e}", self.cuts));
        self.check_live("after the reopened store's first checkpoint")
            .await;
    }

    /// Every object reads back as the model's newest state (nothing in
    /// flight).
    async fn check_live(&mut self, when: &str) {
        for obj in 0..OBJECTS {
            self.check_object(obj, when).await;
        }
    }

    /// `obj` (with no op in flight) reads back as its newest state.
    async fn check_object(&self, obj: u8, when: &str) {
        let state = self.model[&obj].states.last().expect("state");
        self.check_undo(obj, state, when).await;
        let want = &state.content;
        match (want, self.store.read(oid(obj), 0, BLOCK).await) {
            (Some(w), Ok(got)) => assert!(got[..] == w[..], "object {obj} {when}: content differs"),
            (None, Err(Error::NotFound(_))) => {}
            (w, r) => panic!(
                "object {obj} {when}: model {:?}, store {:?}",
                w.is_some(),
                r.map(|_| ())
            ),
        }
    }

    /// The store's undo of `obj`, whose state is `st`: for that version,
    /// with the bytes that version's write replaced; there unless released.
    async fn check_undo(&self, obj: u8, st: &ObjState, when: &str) {
        let u = (self.store.undo(oid(obj)).await)
            .unwrap_or_else(|e| panic!("object {obj} {when}: undo: {e}"));
        match (u, &st.prev) {
            (None, Some(_)) if !st.released => {
                panic!(
                    "object {obj} {when}: the undo of version {} is gone",
                    st.version
                )
            }
            (None, _) => {}
            (Some(u), Some(prev)) => {
                assert_eq!(u.version, st.version, "object {obj} {when}: undo version");
                match (&u.before, prev) {
                    (None, None) => {}
                    (Some((off, b)), Some(p)) => assert!(
                        b[..] == p[*off as usize..*off as usize + b.len()],
                        "object {obj} {when}: the undo of version {} holds other bytes",
                        st.version
                    ),
                    (b, p) => panic!(
                        "object {obj} {when}: undo before {:?}, model {:?}",
                        b.is_some(),
                        p.is_some()
                    ),
                }
            }
            (Some(u), None) => panic!(
                "object {obj} {when}: an undo at {} for a state not written undoably ({})",
                u.version, st.version
            ),
        }
    }

    /// Issues `count` durable 4 KiB overwrites at random chunks.
    async fn burst(&mut self, count: u16, seed: u64) {
        let mut rng = nacre_io::fault::SplitMix(seed);
        let chunks = SECTORS / 8;
        for _ in 0..count {
            let obj = rng.below(u64::from(OBJECTS)) as u8;
            let sector = rng.below(u64::from(chunks)) as u16 * 8;
            self.write(obj, sector, 8, rng.next_u64() as u8, true).await;
        }
    }

    async fn write(&mut self, obj: u8, sector: u16, sectors: u16, seed: u8, durable: bool) {
        self.make_room(Some(obj)).await;
        let m = &self.model[&obj];
        let mut content = m
            .states
            .last()
            .expect("state")
            .content
            .clone()
            .unwrap_or_else(|| vec![0; BLOCK as usize]);
        let d = data(seed, sector, sectors);
        let off = sector as usize * 512;
        content[off..off + d.len()].copy_from_slice(&d);
        let (idx, v) = self.push_state(obj, Some(content));
        self.issue_write(obj, idx, v, off as u32, d, durable);
    }

    /// Writes `d` at `off` of `obj` as version `v`: logged (always
    /// durable) for odd objects.
    fn issue_write(&mut self, obj: u8, idx: usize, v: u64, off: u32, d: Vec<u8>, durable: bool) {
        let s = self.store.clone();
        let buf = AlignedBuf::from_slice(&d);
        if undoable(obj) {
            let e = entry(obj, v, LogOp::Write, off, d.len() as u32);
            self.entries.insert(v, e);
            // Half of them given their bytes: a whole-block one keeps the
            // old block as its undo (hidden), instead of its bytes.
            self.issue(Some(obj), idx, true, async move {
                if v.is_multiple_of(2) {
                    s.replace_undoable(e, off, buf).await
                } else {
                    s.write_undoable(e, off, e.len, move |_| buf).await
                }
            });
            return;
        }
        if logged(obj) {
            let e = entry(obj, v, LogOp::Write, off, d.len() as u32);
            self.entries.insert(v, e);
            self.issue(Some(obj), idx, true, async move {
                s.write_logged(e, off, buf).await
            });
            return;
        }
        self.issue(Some(obj), idx, durable, async move {
            if durable {
                s.write(oid(obj), v, off, buf).await
            } else {
                s.write_unsynced(oid(obj), v, off, buf).await
            }
        });
    }

    /// For logged objects: the log and the data agree. Returns, per
    /// object, the newest version its PG log holds for it (if above the
    /// tail), after checking every entry in the logs was issued and every
    /// entry of a durable op is there.
    fn check_logs(&self) -> BTreeMap<u8, (Option<u64>, u64)> {
        let mut newest = BTreeMap::new();
        for pg in 0..PGS {
            let log = self.store.pg_log(u64::from(pg)).unwrap_or_default();
            for (v, e) in &log.entries {
                assert_eq!(
                    self.entries.get(v),
                    Some(e),
                    "PG {pg} holds an entry at version {v} that was never issued"
                );
            }
            for obj in (0..OBJECTS).filter(|&o| logged(o) && o % PGS == pg) {
                let m = &self.model[&obj];
                for st in m.states.iter().take(m.durable + 1).skip(1) {
                    assert!(
                        st.version <= log.tail || log.entries.contains_key(&st.version),
                        "object {obj}: durable version {} is not in PG {pg}'s log (tail {})",
                        st.version,
                        log.tail
                    );
                }
                let top = (log.entries.values())
                    .filter(|e| e.oid == oid(obj))
                    .map(|e| e.version)
                    .max();
                newest.insert(obj, (top, log.tail));
            }
        }
        newest
    }

    async fn check_after_crash(&mut self) {
        let listed: BTreeMap<ObjectId, u64> = self.store.list().into_iter().collect();
        let newest = self.check_logs();
        for obj in 0..OBJECTS {
            let m = &self.model[&obj];
            let found = listed.get(&oid(obj)).copied();
            // A logged object's state is the one its newest entry names
            // (unless trimmed away): entry and data are one durable step.
            let named = |k: usize| match newest.get(&obj) {
                Some(&(Some(top), _)) => m.states[k].version == top,
                Some(&(None, tail)) => m.states[k].version <= tail,
                None => true,
            };
            let k = (m.durable..m.states.len())
                .rev()
                .find(|&k| {
                    named(k)
                        && match (&m.states[k].content, found) {
                            (Some(_), Some(v)) => m.states[k].version == v,
                            (None, None) => true,
                            _ => false,
                        }
                })
                .unwrap_or_else(|| {
                    panic!(
                        "object {obj}: store has version {found:?}, which is none of the states since the last durable one {:?}",
                        m.states[m.durable..].iter().map(|s| (s.version, s.content.is_some())).collect::<Vec<_>>()
                    )
                });
            let state = m.states[k].clone();
            self.check_undo(obj, &state, "after a crash").await;
            let m = self.model.get_mut(&obj).expect("model");
            if let Some(want) = &m.states[k].content {
                let got = self
                    .store
                    .read(oid(obj), 0, BLOCK)
                    .await
                    .unwrap_or_else(|e| panic!("object {obj}: {e}"));
                assert!(
                    got[..] == want[..],
                    "object {obj} version {}: content differs",
                    m.states[k].version
                );
            }
            let s = m.states[k].clone();
            m.states = vec![s];
            m.durable = 0;
            m.completed = 0;
            m.busy = false;
        }
        assert_eq!(
            listed.len(),
            self.model
                .values()
                .filter(|m| m.states[0].content.is_some())
                .count()
        );
        assert_eq!(self.store.object_count(), listed.len(), "the count");
    }

    async fn run(&mut self, ops: Vec<Op>) {
        for op in ops {
            match op {
                Op::Write {
                    obj,
                    sector,
                    sectors,
                    seed,
                    durable,
                } => self.write(obj, sector, sectors, seed, durable).await,
                Op::Full { obj, seed, durable } => {
                    self.make_room(Some(obj)).await;
                    let d = data(seed, 0, SECTORS);
                    let (idx, v) = self.push_state(obj, Some(d.clone()));
                    self.issue_write(obj, idx, v, 0, d, durable);
                }
                Op::Delete { obj } => {
                    self.make_room(Some(obj)).await;
                    let absent = (self.model[&obj].states.last())
                        .expect("state")
                        .content
                        .is_none();
                    // A logged delete of an absent object is a tombstone.
                    if absent && !logged(obj) {
                        continue;
                    }
                    let (idx, v) = self.push_state(obj, None);
                    let s = self.store.clone();
                    if logged(obj) {
                        let e = entry(obj, v, LogOp::Delete, 0, 0);
                        self.entries.insert(v, e);
                        self.issue(
                            Some(obj),
                            idx,
                            true,
                            async move { s.delete_logged(e).await },
                        );
                        continue;
                    }
                    self.issue(
                        Some(obj),
                        idx,
                        true,
                        async move { s.delete(oid(obj), v).await },
                    );
                }
                Op::Release { obj } => {
                    let m = self.model.get_mut(&obj).expect("model");
                    if m.busy {
                        continue;
                    }
                    let st = m.states.last_mut().expect("state");
                    st.released = true;
                    self.store.release_undo(oid(obj), st.version);
                }
                Op::Trim { pg, keep } => {
                    let log = self.store.pg_log(u64::from(pg)).unwrap_or_default();
                    let n = log.entries.len().saturating_sub(usize::from(keep));
                    // Never past an op of the PG issued and not yet done
                    // (its entry may not be admitted yet: the store would
                    // rightly refuse it as older than the tail), as an OSD
                    // trims only what every op in flight is above.
                    let inflight = (self.pending.iter())
                        .filter_map(|p| Some((p.obj?, p.state)))
                        .filter(|&(o, _)| logged(o) && o % PGS == pg)
                        .map(|(o, s)| self.model[&o].states[s].version)
                        .min();
                    if let Some((&v, _)) = log.entries.iter().nth(n.saturating_sub(1)) {
                        if n > 0 && inflight.is_none_or(|f| v < f) {
                            self.store.pg_trim(u64::from(pg), v);
                        }
                    }
                }
                Op::Sync => {
                    self.make_room(None).await;
                    let snap: BTreeMap<u8, usize> =
                        self.model.iter().map(|(&o, m)| (o, m.completed)).collect();
                    let s = self.store.clone();
                    self.issue(None, 0, true, async move { s.sync().await });
                    self.pending.last_mut().expect("just pushed").sync_snapshot = Some(snap);
                }
                Op::Checkpoint => {
                    self.make_room(None).await;
                    let s = self.store.clone();
                    self.issue(None, 0, false, async move { s.checkpoint().await });
                }
                Op::Read { obj } => {
                    if self.model[&obj].busy {
                        continue;
                    }
                    self.check_object(obj, "in a live read").await;
                }
                Op::Burst { count, seed } => self.burst(count, seed).await,
                Op::Cut {
                    after,
                    seed,
                    kill,
                    settle,
                } => self.cut(after, seed, kill, settle).await,
            }
        }
        self.drain().await;
        self.cut(0, 1, false, true).await;
        // A clean close of the store opened after the cut (whatever open
        // left running: folds ahead, the redo) ends, and keeps everything.
        self.store
            .clone()
            .close()
            .await
            .unwrap_or_else(|e| panic!("close after the last cut: {e}"));
        self.tally.done(&self.store);
        let (store, report) = Store::open(self.dev.clone(), StoreOptions::default())
            .await
            .unwrap_or_else(|e| panic!("reopen after a clean close: {e}"));
        self.tally.opened(&report);
        self.store = store;
        self.check_live("after a clean close").await;
        // Every block in use is an object's or one an undo keeps.
        let used = self.store.space().used_bytes / u64::from(BLOCK);
        let (objects, undos) = (self.store.object_count(), self.store.undos().len());
        assert!(
            used >= objects as u64 && used <= (objects + undos) as u64,
            "{used} blocks in use for {objects} objects and {undos} undos"
        );
    }
}

fn run_case(ops: Vec<Op>) -> Tally {
    block_on(async {
        let dev = FaultDev::new(DEV_BYTES, 512);
        let fmt = FormatOptions {
            block_bytes: BLOCK,
            journal_bytes: Some(JOURNAL_BYTES),
            zero_journal: false,
            pg_logs: LOG_REGION,
            ..FormatOptions::default()
        };
        Store::format(&dev, &fmt).await.unwrap();
        dev.set_yields(2);
        let (store, _) = Store::open(dev.clone(), StoreOptions::default())
            .await
            .unwrap();
        let model = (0..OBJECTS)
            .map(|o| {
                (
                    o,
                    ObjModel {
                        states: vec![ObjState {
                            version: 0,
                            content: None,
                            prev: None,
                            released: false,
                        }],
                        durable: 0,
                        completed: 0,
                        busy: false,
                    },
                )
            })
            .collect();
        let mut h = Harness {
            dev,
            store,
            model,
            pending: Vec::new(),
            version: 0,
            cuts: 0,
            entries: HashMap::new(),
            tally: Tally::default(),
        };
        h.run(ops).await;
        h.tally.done(&h.store);
        h.tally
    })
}

fn cases() -> u32 {
    std::env::var("NACRE_CRASH_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn acknowledged_writes_survive_power_cuts(ops in prop::collection::vec(op(), 1..220)) {
        run_case(ops);
    }
}

/// A one-sector write at the start of `obj`.
fn w(obj: u8, seed: u8, durable: bool) -> Op {
    Op::Write {
        obj,
        sector: 0,
        sectors: 1,
        seed,
        durable,
    }
}

#[test]
fn regression_checkpoint_cut() {
    let ops = vec![
        w(0, 0, false),
        Op::Full {
            obj: 7,
            seed: 0,
            durable: false,
        },
        w(7, 0, true),
        Op::Cut {
            after: 6,
            seed: 0,
            kill: false,
            settle: true,
        },
        Op::Checkpoint,
        Op::Cut {
            after: 15,
            seed: 4558793306598448228,
            kill: false,
            settle: true,
        },
        Op::Delete { obj: 7 },
        Op::Cut {
            after: 4,
            seed: 8955983295970897578,
            kill: false,
            settle: true,
        },
        w(7, 0, true),
        Op::Read { obj: 0 },
    ];
    run_case(ops);
}

/// Issue 7: the final power cut (everything synced, so nothing lost) came
/// after folds ahead ran; at reopen the checkpointer (then started before
/// open redid the journaled folds) folded the same blocks as the redo, and
/// an acknowledged overwrite came back rolled back.
#[test]
fn regression_fold_redo_raced_fold_ahead() {
    let t = run_case(vec![
        w(0, 0, false),
        w(0, 0, false),
        Op::Burst {
            count: 172,
            seed: 126155958250775327,
        },
        Op::Read { obj: 0 },
    ]);
    // The case still reaches what it was found in: an open that redid
    // journaled folds, and folds ahead by that store.
    assert!(t.folds_ahead_after_redo > 0, "{t:?}");
}

/// A clean close raced the checkpointer: after close's two checkpoints it
/// began another (asked for meanwhile; a fold ahead would do the same),
/// the writer stopped meanwhile (nothing queued, closing), and the
/// checkpoint's records waited for it for ever (the runtime: deadlock). Found by the
/// clean close added at the end of every case; CI met it as `nacre store
/// info` hanging on a killed OSD's store. The writer now outlives the
/// checkpointer.
#[test]
fn regression_close_raced_fold_ahead() {
    let w0 = |n| std::iter::repeat_n(w(0, 0, false), n);
    let long = |obj, sectors| Op::Write {
        obj,
        sector: 0,
        sectors,
        seed: 0,
        durable: false,
    };
    let full = |obj| Op::Full {
        obj,
        seed: 0,
        durable: false,
    };
    let ops = (w0(7).chain([full(9)]).chain(w0(6)))
        .chain([w(7, 0, false)].into_iter().chain(w0(2)))
        .chain([full(11), Op::Sync].into_iter().chain(w0(8)))
        .chain([w(3, 0, false), w(0, 0, false), Op::Sync, w(0, 0, false)])
        .chain([Op::Sync].into_iter().chain(w0(2)))
        .chain(
            [long(9, 9), w(0, 0, false), w(5, 0, false)]
                .into_iter()
                .chain(w0(2)),
        )
        .chain([w(6, 0, false), w(4, 0, false), long(0, 13), Op::Sync])
        .chain([w(1, 0, false), w(2, 0, false), long(3, 3), Op::Checkpoint])
        .chain([long(0, 15), long(0, 13)])
        .chain([Op::Burst {
            count: 198,
            seed: 18104245450515041700,
        }])
        .chain([long(0, 8), long(0, 5), Op::Delete { obj: 3 }])
        .chain([Op::Delete { obj: 6 }, long(1, 7)]);
    let t = run_case(ops.collect());
    // The case still folds ahead.
    assert!(t.folds_ahead > 0, "{t:?}");
}
