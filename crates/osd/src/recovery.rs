//! Background recovery (docs/internals/replication.md §8): a PG goes
//! active as soon as one member of its acting set is complete, and its
//! primary brings the others up to date object by object while clients
//! read and write.
//!
//! - Peering plans the recovery ([`plan`]): per object the authoritative
//!   state (a version with its bytes, or a tombstone) and the copies that
//!   lack it. It is taken from the *source*, a complete member of the
//!   acting set, which every write of the interval reaches, so its copy of
//!   an object still in the plan is the planned one.
//! - The leader records the others as *incomplete* members of the
//!   interval: they take every write but cannot vouch for the history
//!   until they hold every object, so the next peering takes its
//!   authority only from a complete member.
//! - A task per PG walks the plan at the OSD's recovery rate
//!   (`recovery_bytes_per_s`), one object at a time under the object's
//!   lock. A client op on an object still in the plan recovers that
//!   object first, unpaced: a write must not land on a copy that lacks the
//!   bytes around it, and a read of the primary's own copy needs them.
//! - A copy that holds every object gets the authoritative log (the log
//!   sync peering computed), and the primary reports the interval again
//!   with it complete; when none is left the PG is clean.
//! - A failed step is tried again later (a full store may get room, a
//!   slow peer answer; a dead one is marked down, and the next epoch plans
//!   again); the client op that needed it fails (`NoSpace` when a store is
//!   full, else `Unavailable`, which the client retries). Every push is a
//!   whole object at its authoritative version and leaves the plan once
//!   applied, so none lands twice and the copies never hold a mix.
//! - An erasure-coded PG's plan names the stale *shards* that lack each
//!   object (`ShardRebuild`): a step reads `k` complete shards, decodes
//!   the stale one's and pushes it, fenced by the version it held; a
//!   client's delete takes the object from the plan instead (ec.rs,
//!   docs/internals/ec.md *Rebuilding in the background*).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use nacre_blockstore::{LogEntry, LogOp, PgLog};
use nacre_io::{rt, BlockDev};
use nacre_net::Transport;
use nacre_types::{ObjectId, PgId};

use crate::peering::{divergent, LogSync, PeerError};
use crate::{Osd, PgEvent, PgState};

/// The recovery rate of a new OSD, in bytes per second (pushes of whole
/// objects, counted once per copy that receives one).
pub const RECOVERY_BYTES_PER_S_DEFAULT: u64 = 100 << 20;
/// Wait before background recovery tries a failed step again, doubled at
/// each failure in a row up to the max.
const RECOVERY_RETRY: Duration = Duration::from_secs(1);
const RECOVERY_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a PG's recovery waits before looking again while PGs with
/// fewer complete copies recover (and how long the OSD's view of the
/// fewest is kept).
const RECOVERY_YIELD: Duration = Duration::from_millis(100);

/// What one object of a PG needs on the copies that lack it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Want {
    /// The authoritative version (the tombstone's, for a delete).
    pub version: u64,
    /// Its entry in the authoritative log, if the log still holds it.
    pub entry: Option<LogEntry>,
    pub delete: bool,
    /// The copies that lack it.
    pub to: Vec<u32>,
}

/// The recovery of one PG this OSD is primary of, in one epoch.
pub(crate) struct Recovery {
    pub epoch: u64,
    /// The complete member objects are read from (an EC PG's plan reads
    /// `k` of `ec`'s sources instead; this OSD there).
    pub source: u32,
    pub wants: BTreeMap<ObjectId, Want>,
    /// Per incomplete copy: the objects it still lacks, and the log sync
    /// it gets once it lacks none.
    pub left: BTreeMap<u32, (usize, LogSync)>,
    /// Object copies to recover when the plan was made.
    pub total: usize,
    /// Its last step failed and it waits to try again: it does not hold
    /// back PGs with more complete copies meanwhile (a degraded PG whose
    /// target is full must not stop every other PG's recovery).
    pub stalled: bool,
    /// An erasure-coded PG's: how its stale shards are rebuilt (each
    /// want's `entry` is then the object's newest in the holders' log,
    /// named whole, and `to` the OSDs whose shard lacks it).
    pub ec: Option<ShardRebuild>,
}

/// The background rebuild of an erasure-coded PG's stale shards
/// (docs/internals/ec.md, *Rebuilding in the background*).
pub(crate) struct ShardRebuild {
    /// The shards complete in their slots, (slot, OSD): the first `k`
    /// are read to rebuild an object.
    pub sources: Vec<(usize, u32)>,
    /// Each stale shard's slot, by OSD.
    pub slots: BTreeMap<u32, usize>,
    /// The version each stale shard held of each planned object when the
    /// plan was made (0: none): its rebuild is fenced by it.
    pub expect: std::collections::HashMap<(ObjectId, u32), u64>,
    /// What each stale shard holds of another slot of the PG, deleted
    /// once it holds every object of its own.
    pub other: BTreeMap<u32, Vec<(ObjectId, u64)>>,
}

impl Recovery {
    /// Takes `oid` from the plan: no copy lacks it any more. Whether it
    /// was there.
    fn drop_object(&mut self, oid: &ObjectId) -> bool {
        let Some(w) = self.wants.remove(oid) else {
            return false;
        };
        for c in w.to {
            if let Some((n, _)) = self.left.get_mut(&c) {
                *n = n.saturating_sub(1);
            }
        }
        true
    }

    /// Object copies still to recover.
    pub fn remaining(&self) -> usize {
        self.left.values().map(|(n, _)| n).sum()
    }
}

/// What peering found: per object, what the copies other than the
/// authoritative one lack of its copy; and the objects a copy holds at a
/// version the authoritative history does not know (divergent: never
/// acknowledged), which must be rewritten on every member at a new version
/// since a store never goes back to an older one.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    wants: BTreeMap<ObjectId, Want>,
    rewrite: Vec<ObjectId>,
}

impl Plan {
    /// Adds what copy `c`, holding `copy` (all its objects, or those
    /// compared) with log `copy_log`, lacks of the authority's: `auth`
    /// (its versions of the same objects) and `log`.
    ///
    /// An object that a divergent entry of the copy's log names (one the
    /// authority's log lacks, above its tail) is rewritten, never pushed,
    /// even when the copy only lacks it or holds it at the authority's
    /// version: a push that undid a divergent delete left the copy's log
    /// naming the delete until the log sync, and an epoch ending between
    /// the two made that copy an authority whose request cache answered
    /// the delete's retry as applied while the object stood. A rewrite
    /// logs a client-0 entry after it, which hides it from the cache
    /// (`ReqCache::of_log`).
    pub(crate) fn compare(
        &mut self,
        log: &PgLog,
        auth: &BTreeMap<ObjectId, u64>,
        c: u32,
        copy: &BTreeMap<ObjectId, u64>,
        copy_log: &PgLog,
    ) {
        let diverged: std::collections::HashSet<ObjectId> =
            divergent(copy_log, log).map(|e| e.oid).collect();
        let (mut x, mut y) = (auth.iter().peekable(), copy.iter().peekable());
        // Both lists are sorted: walk them together.
        loop {
            let (oid, va, vc) = match (x.peek(), y.peek()) {
                (None, None) => break,
                (Some(&(&o, &v)), None) => {
                    x.next();
                    (o, Some(v), None)
                }
                (None, Some(&(&o, &v))) => {
                    y.next();
                    (o, None, Some(v))
                }
                (Some(&(&oa, &va)), Some(&(&oc, &vc))) => {
                    if oa < oc {
                        x.next();
                        (oa, Some(va), None)
                    } else if oc < oa {
                        y.next();
                        (oc, None, Some(vc))
                    } else {
                        x.next();
                        y.next();
                        (oa, Some(va), Some(vc))
                    }
                }
            };
            if diverged.contains(&oid) {
                self.rewrite.push(oid);
                continue;
            }
            let want = match (va, vc) {
                (Some(va), Some(vc)) if vc == va => continue,
                (Some(va), vc) if vc.is_none_or(|vc| vc < va) => Want {
                    version: va,
                    entry: (log.entries.get(&va).copied())
                        .filter(|e| e.oid == oid && e.op == LogOp::Write),
                    delete: false,
                    to: Vec::new(),
                },
                (None, Some(vc)) => match log_last_entry(log, oid) {
                    // Deleted on the authoritative copy after the version
                    // this copy holds: a tombstone.
                    Some(e) if e.op == LogOp::Delete && e.version > vc => Want {
                        version: e.version,
                        entry: Some(*e),
                        delete: true,
                        to: Vec::new(),
                    },
                    _ => {
                        self.rewrite.push(oid);
                        continue;
                    }
                },
                _ => {
                    self.rewrite.push(oid);
                    continue;
                }
            };
            let w = self.wants.entry(oid).or_insert(want.clone());
            // Every copy is compared with the same authoritative copy.
            assert!(
                !nacre_blockstore::strict()
                    || (w.version, w.entry, w.delete) == (want.version, want.entry, want.delete),
                "{oid}: {w:?} and {want:?} for one authoritative copy"
            );
            w.to.push(c);
        }
    }

    /// What each copy lacks, without the objects to rewrite; those; and
    /// the copies that lacked one of those (a rewrite brings it to them,
    /// so they lack nothing else perhaps, but they must be marked
    /// recovering before the first rewrite lands like any copy that lacks
    /// objects: `Osd::try_peer`).
    pub(crate) fn finish(mut self) -> Finished {
        self.rewrite.sort_unstable();
        self.rewrite.dedup();
        let mut behind = std::collections::BTreeSet::new();
        for oid in &self.rewrite {
            if let Some(w) = self.wants.remove(oid) {
                behind.extend(w.to);
            }
        }
        Finished {
            wants: self.wants,
            rewrite: self.rewrite,
            behind,
        }
    }
}

/// A [`Plan`] finished.
pub(crate) struct Finished {
    pub wants: BTreeMap<ObjectId, Want>,
    pub rewrite: Vec<ObjectId>,
    pub behind: std::collections::BTreeSet<u32>,
}

/// The newest entry of `oid` in `log`.
fn log_last_entry(log: &PgLog, oid: ObjectId) -> Option<&LogEntry> {
    log.entries.values().rev().find(|e| e.oid == oid)
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// Whether PG `pg` has copies left to recover in the current epoch.
    pub fn pg_recovering(&self, pg: PgId) -> bool {
        let e = self.epoch();
        (self.recovery.borrow().get(&pg)).is_some_and(|r| r.epoch == e && !r.left.is_empty())
    }

    /// Whether PG `pg` (led here) has fewer complete copies than its
    /// pool's size: redundancy lost, not just a move.
    pub(crate) fn pg_degraded(&self, pg: PgId) -> bool {
        let m = self.map.borrow();
        let complete = m
            .acting(pg)
            .len()
            .saturating_sub(self.incomplete_members(pg));
        complete < usize::from(m.size(pg.pool))
    }

    /// How many members of PG `pg` are still being recovered.
    pub(crate) fn incomplete_members(&self, pg: PgId) -> usize {
        let e = self.epoch();
        (self.recovery.borrow().get(&pg))
            .filter(|r| r.epoch == e)
            .map_or(0, |r| r.left.len())
    }

    /// Object copies left to recover in PG `pg`, and at the start.
    pub(crate) fn recovery_progress(&self, pg: PgId) -> Option<(usize, usize)> {
        let e = self.epoch();
        (self.recovery.borrow().get(&pg))
            .filter(|r| r.epoch == e && !r.left.is_empty())
            .map(|r| (r.remaining(), r.total))
    }

    /// Keeps `r`, PG `pg`'s plan of recovery in its epoch (the PG went
    /// active), and says what it brings to which members.
    pub(crate) fn keep_plan(&self, pg: PgId, r: Recovery) {
        let to = (r.left.keys().map(|o| format!("osd.{o}")))
            .collect::<Vec<_>>()
            .join(", ");
        match r.ec {
            Some(_) => tracing::info!(
                "osd.{}: PG {pg} active in epoch {}, rebuilding {} shard objects on {to} in the background",
                self.id,
                r.epoch,
                r.total
            ),
            None => tracing::info!(
                "osd.{}: PG {pg} active in epoch {}, recovering {} object copies on {to} from osd.{}",
                self.id,
                r.epoch,
                r.total,
                r.source
            ),
        }
        self.recovery.borrow_mut().insert(pg, r);
    }

    /// Sets how fast this OSD recovers its PGs' copies, in bytes per
    /// second (at least 1).
    pub fn set_recovery_rate(&self, bytes_per_s: u64) {
        self.recovery_rate.set(bytes_per_s.max(1));
    }

    /// Whether a client op on `oid` must wait for its recovery: it is in
    /// PG `pg`'s plan, for this copy (`mine`: a read needs only the
    /// primary's own copy) or for any.
    pub(crate) fn must_recover(&self, pg: PgId, epoch: u64, oid: ObjectId, mine: bool) -> bool {
        (self.recovery.borrow().get(&pg))
            .filter(|r| r.epoch == epoch)
            .and_then(|r| r.wants.get(&oid))
            .is_some_and(|w| !mine || w.to.contains(&self.id))
    }

    /// Takes every object of `volume` from the recovery plans (its objects
    /// were purged everywhere: there is nothing left to bring over), then
    /// gives the copies that now lack nothing the authoritative log.
    pub(crate) async fn forget_volume(self: &Rc<Self>, volume: u64) {
        let pgs: Vec<(PgId, u64)> = {
            let mut all = self.recovery.borrow_mut();
            let mut touched = Vec::new();
            for (&pg, r) in all.iter_mut() {
                let gone: Vec<ObjectId> = (r.wants.keys())
                    .filter(|o| o.volume.0 == volume)
                    .copied()
                    .collect();
                for oid in &gone {
                    r.drop_object(oid);
                }
                if !gone.is_empty() {
                    touched.push((pg, r.epoch));
                }
            }
            touched
        };
        for (pg, epoch) in pgs {
            if let Err(e) = self.sync_recovered(pg, epoch).await {
                tracing::warn!("osd.{}: PG {pg}: after a purge: {e}", self.id);
            }
        }
    }

    /// Takes `oid` from PG `pg`'s plan of `epoch` once a client's delete
    /// of it reached every shard (an EC PG's: a delete leaves a stale
    /// shard as it must be, so it needs no rebuild first), then finishes
    /// the shards that lack nothing more. The caller holds its lock.
    pub(crate) async fn deleted_while_planned(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
    ) {
        let dropped = (self.recovery.borrow_mut().get_mut(&pg))
            .filter(|r| r.epoch == epoch)
            .is_some_and(|r| r.drop_object(&oid));
        if dropped {
            if let Err(e) = self.sync_recovered(pg, epoch).await {
                tracing::warn!("osd.{}: PG {pg}: after a delete of {oid}: {e}", self.id);
            }
        }
    }

    /// Recovers `oid` of PG `pg` now, for a client op (which holds the
    /// object's lock); what the op answers if it cannot.
    pub(crate) async fn recover_for_op(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
    ) -> Result<(), nacre_wire::Status> {
        match self.recover_one(pg, epoch, oid).await {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(
                    "osd.{}: PG {pg}: recovering {oid} for a client op: {e}",
                    self.id
                );
                Err(match e {
                    PeerError::Full(_) => nacre_wire::Status::NoSpace,
                    _ => nacre_wire::Status::Unavailable,
                })
            }
        }
    }

    /// Brings every copy that lacks `oid` in PG `pg`'s plan to the
    /// planned state, taking each from the plan once it holds it; a copy
    /// that lacks nothing more gets the authoritative log. The caller
    /// holds `oid`'s lock.
    async fn recover_one(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
    ) -> Result<(), PeerError> {
        let (want, source, ec) = {
            let r = self.recovery.borrow();
            let Some(r) = r.get(&pg).filter(|r| r.epoch == epoch) else {
                return Ok(());
            };
            match r.wants.get(&oid) {
                Some(w) => (w.clone(), r.source, r.ec.is_some()),
                None => return Ok(()),
            }
        };
        let data = match want.delete || ec {
            true => None,
            false => Some(self.fetch(source, pg, epoch, oid, want.version).await?),
        };
        for &to in &want.to {
            let bytes = match ec {
                true => self.rebuild_planned(pg, epoch, oid, &want, to).await?,
                false => {
                    let d = data.as_ref();
                    (self.push(to, pg, epoch, oid, want.version, want.entry, d)).await?;
                    d.map_or(0, |d| d.len() as u64)
                }
            };
            (self.stats).recovered(bytes, 1, !self.pg_degraded(pg));
            let mut r = self.recovery.borrow_mut();
            let Some(r) = r.get_mut(&pg).filter(|r| r.epoch == epoch) else {
                return Ok(());
            };
            // Counted once per (object, copy), even if a purge took the
            // object from the plan meanwhile.
            let counted = match r.wants.get_mut(&oid) {
                Some(w) => {
                    let before = w.to.len();
                    w.to.retain(|&c| c != to);
                    let counted = w.to.len() < before;
                    if w.to.is_empty() {
                        r.wants.remove(&oid);
                    }
                    counted
                }
                None => false,
            };
            if let Some((n, _)) = r.left.get_mut(&to).filter(|_| counted) {
                *n = n.saturating_sub(1);
            }
        }
        self.sync_recovered(pg, epoch).await
    }

    /// Gives every copy of PG `pg` that lacks no object any more the
    /// authoritative log, and tells the leader it is complete.
    async fn sync_recovered(self: &Rc<Self>, pg: PgId, epoch: u64) -> Result<(), PeerError> {
        loop {
            let next = {
                let r = self.recovery.borrow();
                (r.get(&pg).filter(|r| r.epoch == epoch))
                    .and_then(|r| r.left.iter().find(|(_, (n, _))| *n == 0))
                    .map(|(&to, (_, sync))| (to, sync.clone()))
            };
            let Some((to, sync)) = next else {
                return Ok(());
            };
            // Never empty: it clears the recovering mark.
            if self.ec_recovery(pg, epoch) {
                self.finish_shard(to, pg, epoch, sync).await?;
            } else {
                self.log_sync(to, pg, epoch, &sync).await?;
            }
            let removed = (self.recovery.borrow_mut().get_mut(&pg))
                .filter(|r| r.epoch == epoch)
                .and_then(|r| r.left.remove(&to));
            if removed.is_some() {
                tracing::info!("osd.{}: PG {pg}: osd.{to} recovered", self.id);
                self.report_recovered(pg, epoch).await;
            }
        }
    }

    /// Tells the leader which members of PG `pg`'s interval are still
    /// incomplete (fewer than before). Unheard, they stay incomplete in
    /// its record: that only narrows the next peering's choice.
    /// A report the leader did not hear is sent again (the state of then,
    /// at each try) until it is heard or the epoch ends: the leader drops
    /// a moving PG's temporary members only once it knows the new ones
    /// complete, and nothing else would tell it.
    async fn report_recovered(self: &Rc<Self>, pg: PgId, epoch: u64) {
        let Err(why) = self.try_report_recovered(pg, epoch).await else {
            return;
        };
        tracing::warn!(
            "osd.{}: PG {pg}: reporting recovery: {why}; trying again",
            self.id
        );
        let me = self.clone();
        rt::spawn(async move {
            let mut wait = RECOVERY_RETRY;
            loop {
                rt::sleep(wait).await;
                if me.epoch() != epoch || me.halted.get() {
                    return;
                }
                if me.try_report_recovered(pg, epoch).await.is_ok() {
                    return;
                }
                wait = (wait * 2).min(RECOVERY_RETRY_MAX);
            }
        });
    }

    async fn try_report_recovered(self: &Rc<Self>, pg: PgId, epoch: u64) -> Result<(), String> {
        let incomplete: Vec<u32> = {
            let r = self.recovery.borrow();
            match r.get(&pg).filter(|r| r.epoch == epoch) {
                Some(r) => r.left.keys().copied().collect(),
                None => return Ok(()),
            }
        };
        let clean = incomplete.is_empty() && self.map.borrow().whole(pg);
        let ev = PgEvent::Active {
            clean,
            incomplete: incomplete.clone(),
            heard: Vec::new(),
        };
        self.report(pg, epoch, &ev).await?;
        // A shard whose rebuild ended answers direct reads from now on.
        self.grant_direct_reads(pg, epoch, &incomplete);
        Ok(())
    }

    /// Complete copies of PG `pg` in `r`'s plan beyond the fewest its
    /// data needs (one copy; `k` shards of an EC PG): its acting members
    /// but those still being recovered, less that.
    fn complete_copies(&self, pg: PgId, r: &Recovery) -> usize {
        let needed = self.scheme(pg.pool).map_or(1, |s| s.layout.k);
        (self.map.borrow().acting(pg).len())
            .saturating_sub(r.left.len())
            .saturating_sub(needed)
    }

    /// Whether PG `pg`'s background recovery must wait: another PG of
    /// this OSD with fewer complete copies has copies left to recover.
    /// Degraded PGs go first — a PG that lost a copy before one moving
    /// with all of its copies (§8.3), one with a single complete copy
    /// before one with two. (The fewest is recomputed at most every
    /// `RECOVERY_YIELD`: every PG step would otherwise walk every PG.)
    fn outranked(&self, pg: PgId) -> bool {
        let e = self.epoch();
        let now = rt::monotonic();
        let (at, epoch, _) = self.recovery_floor.get();
        if epoch != e || at + RECOVERY_YIELD <= now || at > now {
            let rec = self.recovery.borrow();
            let fewest = (rec.iter())
                .filter(|(_, r)| r.epoch == e && !r.left.is_empty() && !r.stalled)
                .map(|(&p, r)| self.complete_copies(p, r))
                .min()
                .unwrap_or(usize::MAX);
            self.recovery_floor.set((now, e, fewest));
        }
        let fewest = self.recovery_floor.get().2;
        let rec = self.recovery.borrow();
        (rec.get(&pg).filter(|r| r.epoch == e))
            .is_some_and(|r| self.complete_copies(pg, r) > fewest)
    }

    /// Waits for this OSD's recovery budget to cover `bytes`.
    async fn pace(&self, bytes: u64) {
        pace(&self.recovery_next, self.recovery_rate.get(), bytes).await;
    }

    /// Recovers PG `pg`'s plan of `epoch` in the background, paced, until
    /// it is done, the epoch ends or the PG stops.
    pub(crate) async fn recover_pg(self: Rc<Self>, pg: PgId, epoch: u64) {
        let bb = u64::from(self.store.block_bytes());
        let mut backoff = RECOVERY_RETRY;
        loop {
            if self.epoch() != epoch
                || self.halted.get()
                || self.pg_state(pg) != Some(PgState::Active)
            {
                return;
            }
            // What a step moves: a block per copy; an EC rebuild reads
            // `k` shards too.
            let reads = self.scheme(pg.pool).map_or(0, |s| s.layout.k);
            let next = {
                let r = self.recovery.borrow();
                (r.get(&pg).filter(|r| r.epoch == epoch))
                    .and_then(|r| r.wants.iter().next().map(|(o, w)| (*o, reads + w.to.len())))
            };
            let r = match next {
                // Every object is there: the logs of copies whose sync
                // failed, if any.
                None if self.pg_recovering(pg) => self.sync_recovered(pg, epoch).await,
                None => return,
                Some(_) if self.outranked(pg) => {
                    rt::sleep(RECOVERY_YIELD).await;
                    continue;
                }
                Some((oid, copies)) => {
                    self.pace(bb * copies as u64).await;
                    if self.epoch() != epoch || self.pg_state(pg) != Some(PgState::Active) {
                        return;
                    }
                    // A PG with fewer complete copies may have started
                    // recovering while this one waited for its turn.
                    if self.outranked(pg) {
                        continue;
                    }
                    self.lock(oid).await;
                    let r = self.recover_one(pg, epoch, oid).await;
                    self.unlock(oid);
                    r
                }
            };
            let stalled = |s: bool| {
                if let Some(r) =
                    (self.recovery.borrow_mut().get_mut(&pg)).filter(|r| r.epoch == epoch)
                {
                    r.stalled = s;
                }
            };
            match r {
                Ok(()) => backoff = RECOVERY_RETRY,
                Err(e) => {
                    tracing::warn!(
                        "osd.{}: PG {pg}: recovery: {e}; trying again in {backoff:?}",
                        self.id
                    );
                    stalled(true);
                    rt::sleep(backoff).await;
                    stalled(false);
                    backoff = (backoff * 2).min(RECOVERY_RETRY_MAX);
                }
            }
        }
    }
}

/// Waits until a budget of `rate` bytes per second (at least 1) covers
/// `bytes` more; `next` is when the budget next allows anything, moved on
/// by their cost.
pub(crate) async fn pace(next: &std::cell::Cell<Duration>, rate: u64, bytes: u64) {
    let cost = Duration::from_nanos(
        u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(rate.max(1)))
            .unwrap_or(u64::MAX),
    );
    let now = rt::monotonic();
    let start = next.get().max(now);
    next.set(start + cost);
    if start > now {
        rt::sleep(start - now).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nacre_blockstore::PgLog;

    fn entry(version: u64, oid: ObjectId, op: LogOp) -> LogEntry {
        LogEntry {
            pg: 1,
            version,
            oid,
            op,
            offset: 0,
            len: 4096,
            client: 7,
            request: version,
        }
    }

    /// The plan names, per object, what each other copy lacks of the
    /// authority's: a newer version (with its entry while the log holds
    /// it), a tombstone, nothing when they agree; and the divergent ones.
    #[test]
    fn the_plan_names_what_each_copy_lacks_and_what_diverged() {
        let o = |b: u64| ObjectId::new(1, b);
        let objects = |v: &[(u64, u64)]| -> BTreeMap<ObjectId, u64> {
            v.iter().map(|&(b, v)| (o(b), v)).collect()
        };
        let log = PgLog {
            entries: [entry(5, o(1), LogOp::Write), entry(8, o(4), LogOp::Delete)]
                .into_iter()
                .map(|e| (e.version, e))
                .collect(),
            tail: 0,
            recovering: false,
        };
        let auth = objects(&[(1, 5), (2, 3), (3, 9), (5, 4)]);
        let mut plan = Plan::default();
        // Lacks 1 at v5, has 2, lacks 3, has 4 (deleted later), has 5
        // at a version the authority does not know (diverged).
        let none = PgLog::default();
        plan.compare(
            &log,
            &auth,
            1,
            &objects(&[(1, 2), (2, 3), (4, 6), (5, 7)]),
            &none,
        );
        // Lacks everything; holds 6, which the authority never had.
        plan.compare(&log, &auth, 2, &objects(&[(6, 1)]), &none);
        let Finished {
            wants,
            rewrite,
            behind,
        } = plan.finish();
        assert_eq!(rewrite, vec![o(5), o(6)]);
        // 2 lacked 5, which is rewritten: no want, but behind.
        assert_eq!(behind.into_iter().collect::<Vec<_>>(), vec![2]);
        assert_eq!(
            wants[&o(1)],
            Want {
                version: 5,
                entry: Some(entry(5, o(1), LogOp::Write)),
                delete: false,
                to: vec![1, 2]
            }
        );
        assert_eq!(wants[&o(2)].to, vec![2]);
        assert_eq!((wants[&o(3)].version, wants[&o(3)].entry), (9, None));
        assert_eq!(wants[&o(3)].to, vec![1, 2]);
        let tomb = &wants[&o(4)];
        assert_eq!(
            (tomb.version, tomb.delete, tomb.to.clone()),
            (8, true, vec![1])
        );
        assert_eq!(wants.len(), 4);
    }

    /// An object a divergent entry of the copy's log names is rewritten,
    /// not pushed: a delete the authority never had (the copy lacks the
    /// object), or a write whose effect a push already undid (the copy
    /// holds the authority's version). An entry both logs hold, or one at
    /// or below the authority's tail, changes nothing.
    #[test]
    fn objects_of_divergent_entries_are_rewritten() {
        let o = |b: u64| ObjectId::new(1, b);
        let objects = |v: &[(u64, u64)]| -> BTreeMap<ObjectId, u64> {
            v.iter().map(|&(b, v)| (o(b), v)).collect()
        };
        let log_of = |tail: u64, es: &[LogEntry]| PgLog {
            entries: es.iter().map(|e| (e.version, *e)).collect(),
            tail,
            recovering: false,
        };
        let shared = entry(5, o(1), LogOp::Write);
        let log = log_of(2, &[shared]);
        let auth = objects(&[(1, 5), (2, 3), (3, 4), (4, 1)]);
        let copy_log = log_of(
            0,
            &[
                entry(2, o(4), LogOp::Write),
                shared,
                entry(9, o(2), LogOp::Delete),
                entry(10, o(3), LogOp::Write),
            ],
        );
        let mut plan = Plan::default();
        // Lacks 2 (its divergent delete), holds 3 at the authority's
        // version (a push undid its divergent write), lacks 1 (named by a
        // shared entry) and 4 (its entry is below the authority's tail).
        plan.compare(&log, &auth, 1, &objects(&[(3, 4)]), &copy_log);
        let Finished { wants, rewrite, .. } = plan.finish();
        assert_eq!(rewrite, vec![o(2), o(3)]);
        assert_eq!(wants.keys().copied().collect::<Vec<_>>(), vec![o(1), o(4)]);
    }
}
