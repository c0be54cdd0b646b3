//! Stray copies (docs/internals/replication.md §8.2): what an OSD holds of
//! a PG that placement no longer gives it — it was marked out, or the PG
//! moved to an OSD that was added.
//!
//! A stray copy is needed only until the PG is clean without it: once
//! every member of the current acting set holds every acknowledged write,
//! the next peering takes its authority from them (the leader recorded
//! them complete), never from the stray. So every `STRAY_CHECK_MS` an OSD
//! asks the primary of each PG it holds a stray copy of whether the PG is
//! active+clean in the epoch both know (`Op::PgClean`); if so it deletes
//! the copy: first the PG's log (a copy without a log can never pass for
//! a complete member: peering treats it as a new one), then the objects.
//!
//! If the map makes this OSD a member again meanwhile, the removal stops
//! before the next object; what is left is an incomplete copy that
//! peering plans to recover like any new member's. While it runs, writes
//! into the PG (`RepWrite`, `RepDelete`, `Push`, `LogSync`) and questions
//! about it (`PgQuery`, `Pull`) are refused with `Unavailable` (the peer
//! tries again): nothing lands on an object about to be deleted, and no
//! peering plans from a listing that deletes in flight are about to
//! change (a query of a newer epoch that makes this OSD a member again
//! could otherwise be answered between a delete's check and its end).

use std::rc::Rc;
use std::time::Duration;

use nacre_io::{rt, BlockDev};
use nacre_net::{Rpc, Transport};
use nacre_types::{ObjectId, PgId};
use nacre_wire::{Header, Op, Status};

use crate::Osd;

/// How often an OSD looks for stray copies to delete, while the map keeps
/// changing or strays are left.
pub const STRAY_CHECK_MS: u64 = 5_000;
/// How often it looks all the same once a look in the current epoch found
/// none (a write admitted before the epoch changed may land after that
/// look): every look lists the whole store.
const STRAY_RESCAN_MS: u64 = 60_000;
/// Objects deleted at once while removing a stray copy.
const STRAY_PARALLEL_MAX: usize = 32;

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// Looks for stray copies every [`STRAY_CHECK_MS`] while the OSD runs
    /// (holding it only while it looks).
    pub(crate) async fn stray_loop(me: std::rc::Weak<Self>) {
        loop {
            rt::sleep(Duration::from_millis(STRAY_CHECK_MS)).await;
            let Some(me) = me.upgrade().filter(|o| !o.halted.get()) else {
                return;
            };
            let (epoch, at) = me.strays_none.get();
            let again = Duration::from_millis(STRAY_RESCAN_MS);
            me.purge_removed_pools().await;
            if epoch == me.epoch() && rt::monotonic() < at + again {
                continue;
            }
            me.remove_strays().await;
        }
    }

    /// The PGs of which this OSD holds objects or a log but is not in the
    /// acting set, with their objects, in the current epoch.
    /// Objects and logs of pools the map does not have are left alone.
    fn strays(&self) -> Vec<(PgId, Vec<ObjectId>)> {
        let m = self.map.borrow();
        let stray = |pg: PgId| m.has(pg) && !m.assigned(pg, self.id);
        let mut out: std::collections::BTreeMap<PgId, Vec<ObjectId>> = Default::default();
        for key in self.store.pg_logs() {
            let pg = PgId::from_key(key);
            if stray(pg) {
                out.entry(pg).or_default();
            }
        }
        for (oid, _) in self.store.list() {
            if let Some(pg) = m.pg_of(oid).filter(|pg| stray(*pg)) {
                out.entry(pg).or_default().push(oid);
            }
        }
        out.into_iter().collect()
    }

    /// Deletes every stray copy whose PG its primary calls clean.
    pub(crate) async fn remove_strays(self: &Rc<Self>) {
        let up = self.up_from.get();
        if up == 0 || up == u64::MAX {
            return;
        }
        let (epoch, strays) = (self.epoch(), self.strays());
        if strays.is_empty() {
            self.strays_none.set((epoch, rt::monotonic()));
        }
        for (pg, objects) in strays {
            let epoch = self.epoch();
            let Some(primary) = self.map.borrow().primary(pg) else {
                continue;
            };
            let mut h = Header::request(Op::PgClean, 0, ObjectId::default());
            h.epoch = epoch;
            h = h.with_pg(pg);
            h.sender = self.id;
            let clean = match self.conn(primary) {
                Ok(c) => c
                    .call(h, None)
                    .await
                    .is_ok_and(|f| f.h.status == Status::Ok),
                Err(_) => false,
            };
            if clean && self.epoch() == epoch {
                self.remove_stray(pg, objects).await;
            }
        }
    }

    /// Deletes every PG log and object of the pools the map says were
    /// removed (`nacre pool rm`): no PG of theirs will ever be served
    /// again (pool ids are never given twice), so nothing is asked first.
    /// (A pool still in the map is never purged, whatever the list says.)
    pub(crate) async fn purge_removed_pools(self: &Rc<Self>) {
        let (removed, live): (Vec<u32>, Vec<u32>) = {
            let m = self.map.borrow();
            (
                m.cluster.removed_pools.clone(),
                m.pools.keys().copied().collect(),
            )
        };
        {
            let (done, at) = &*self.purged_pools.borrow();
            let again = Duration::from_millis(STRAY_RESCAN_MS);
            if removed.is_empty() || (*done == removed && rt::monotonic() < *at + again) {
                return;
            }
        }
        let gone = |pool: u32| removed.binary_search(&pool).is_ok() && !live.contains(&pool);
        let logs: Vec<u64> = (self.store.pg_logs().into_iter())
            .filter(|k| gone(PgId::from_key(*k).pool))
            .collect();
        let objects: Vec<ObjectId> = (self.store.list().into_iter())
            .map(|(o, _)| o)
            .filter(|o| gone(o.pool()))
            .collect();
        if logs.is_empty() && objects.is_empty() {
            *self.purged_pools.borrow_mut() = (removed, rt::monotonic());
            return;
        }
        let done = async {
            for key in &logs {
                self.store.pg_remove(*key).await?;
            }
            for chunk in objects.chunks(STRAY_PARALLEL_MAX) {
                self.delete_here(chunk, None).await?;
            }
            Ok::<(), nacre_blockstore::Error>(())
        };
        match done.await {
            Ok(()) => {
                tracing::info!(
                    "osd.{}: deleted what it held of removed pools: {} PG logs, {} objects",
                    self.id,
                    logs.len(),
                    objects.len()
                );
                self.stats.stray_removed(objects.len() as u64);
            }
            Err(e) => tracing::warn!("osd.{}: deleting removed pools' data: {e}", self.id),
        }
    }

    /// Deletes this copy of each of `objects` at once, each under its
    /// object's lock, and returns when every delete has ended; with `pg`,
    /// an object is left alone once the map makes this OSD a member of
    /// `pg` again.
    async fn delete_here(
        self: &Rc<Self>,
        objects: &[ObjectId],
        pg: Option<PgId>,
    ) -> Result<(), nacre_blockstore::Error> {
        let tasks: Vec<_> = (objects.iter())
            .map(|&oid| {
                let me = self.clone();
                rt::spawn(async move {
                    me.lock(oid).await;
                    let r = match me.store.version(oid) {
                        Some(v) if pg.is_none_or(|pg| !me.member(pg)) => {
                            me.store.delete(oid, v + 1).await
                        }
                        _ => Ok(()),
                    };
                    me.unlock(oid);
                    r
                })
            })
            .collect();
        rt::join_all(tasks).await.into_iter().collect()
    }

    /// Whether placement or a temporary membership gives PG `pg` to this
    /// OSD (again).
    fn member(&self, pg: PgId) -> bool {
        self.map.borrow().assigned(pg, self.id)
    }

    async fn remove_stray(self: &Rc<Self>, pg: PgId, objects: Vec<ObjectId>) {
        if self.member(pg) || !self.removing.borrow_mut().insert(pg) {
            return;
        }
        let n = objects.len();
        let key = pg.key();
        // In flight for the PG, like an op of this epoch: if the PG comes
        // back here, its peering waits for the deletes under way before it
        // lists this copy (one landing after the listing would leave the
        // copy taken for whole without the object).
        let _inflight = self.track(pg, self.epoch());
        let done = async {
            // The log goes first: a copy being emptied must not look like
            // the newest history to a peering that asks it, and a log that
            // names ops whose objects are gone would make their recovery
            // pushes pass for repeats and write nothing (replication.md
            // §8.2, simulator seed 978). Then marked
            // recovering while its objects go (they go unlogged): if the PG
            // comes back here meanwhile, peering lists this copy instead of
            // reading it from a blank log that would say it holds nothing.
            if self.store.pg_log(key).is_some() {
                self.store.pg_remove(key).await.map_err(|e| e.to_string())?;
            }
            self.store
                .pg_mark_recovering(key, true)
                .await
                .map_err(|e| e.to_string())?;
            for chunk in objects.chunks(STRAY_PARALLEL_MAX) {
                if self.member(pg) {
                    return Err("this OSD is a member again".to_string());
                }
                // Every delete ends before this does (and before the
                // in-flight guard above drops): none may land after a
                // peering that waited for them.
                self.delete_here(chunk, Some(pg))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            if self.member(pg) {
                return Err("this OSD is a member again".to_string());
            }
            self.store.pg_remove(key).await.map_err(|e| e.to_string())
        }
        .await;
        self.removing.borrow_mut().remove(&pg);
        match done {
            Ok(()) => {
                tracing::info!(
                    "osd.{}: deleted its stray copy of PG {pg} ({n} objects)",
                    self.id
                );
                self.stats.stray_removed(n as u64);
            }
            Err(e) => tracing::info!("osd.{}: stray copy of PG {pg} kept: {e}", self.id),
        }
    }

    /// `Op::PgClean` from a stray: whether the PG it names is active+clean in
    /// `h.epoch` with this OSD as its primary (`Ok`), so the stray's copy
    /// is no longer needed.
    pub(crate) fn answer_pg_clean(&self, h: &Header) -> Status {
        let m = self.map.borrow();
        if !m.has(h.pg_id()) || m.assigned(h.pg_id(), h.sender) {
            return Status::Invalid;
        }
        if h.epoch != m.epoch() {
            return Status::StaleEpoch;
        }
        if m.primary(h.pg_id()) != Some(self.id) {
            return Status::NotPrimary;
        }
        drop(m);
        if self.is_clean(h.pg_id()) {
            Status::Ok
        } else {
            Status::Unavailable
        }
    }
}
