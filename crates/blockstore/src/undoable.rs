//! Undoable writes, the store's API for them ([`Store::write_undoable`],
//! [`Store::undo`], [`Store::release_undo`]), over its write path: what
//! they keep, how, and why it survives crashes and checkpoints is in
//! `undo`, which holds the table of undos.

use nacre_io::sync::oneshot;
use nacre_io::{AlignedBuf, BlockDev};
use nacre_types::ObjectId;

use crate::error::{Error, Result};
use crate::format::RecordKind;
use crate::journal::Record;
use crate::pglog::{LogEntry, LogOp};
use crate::state::{Inner, Queued, Store, READ_RETRY_MAX};
use crate::undo::{hidden, undo_cost, Before, Kept, Undo};

/// How an undoable write gets its new bytes: made from the old ones, or
/// given (then a whole-block write may keep the old block as its undo
/// instead of reading and journaling its bytes).
enum Make<F> {
    From(F),
    Given(AlignedBuf),
}

impl<D: BlockDev + 'static> Store<D> {
    /// A logged write of `len` bytes at `offset` of `entry.oid` at
    /// `entry.version` that can be rolled back: the store reads the range
    /// (`None` if the object does not exist), `make` turns those bytes into
    /// the new ones (`len` of them), and the write is journaled together
    /// with what it replaced ([`Store::undo`]), kept until
    /// [`Store::release_undo`]. Nothing else may write the object
    /// meanwhile: the read and the write are one step (the store waits for
    /// ops in flight on it first, and starts again if one slips in). A
    /// repeat of the version (the log holding this same entry) is done
    /// without calling `make`.
    pub async fn write_undoable(
        &self,
        entry: LogEntry,
        offset: u32,
        len: u32,
        make: impl FnOnce(Option<&[u8]>) -> AlignedBuf,
    ) -> Result<()> {
        self.undoable(entry, offset, len, Make::From(make)).await
    }

    /// [`Store::write_undoable`] of `data`, which does not depend on what
    /// it replaces: a write of a whole block over an object that has one
    /// (and no overlay) keeps that block as its undo — read to check its
    /// checksums, no undo bytes in the journal — while the blocks kept
    /// stay under a sixteenth of the store and the free ones well above
    /// the reserve; any other is made as `write_undoable`.
    pub async fn replace_undoable(
        &self,
        entry: LogEntry,
        offset: u32,
        data: AlignedBuf,
    ) -> Result<()> {
        let len = data.len() as u32;
        self.undoable(
            entry,
            offset,
            len,
            Make::<fn(Option<&[u8]>) -> AlignedBuf>::Given(data),
        )
        .await
    }

    async fn undoable(
        &self,
        entry: LogEntry,
        offset: u32,
        len: u32,
        make: Make<impl FnOnce(Option<&[u8]>) -> AlignedBuf>,
    ) -> Result<()> {
        let inner = &self.0;
        inner.check_entry(&entry, LogOp::Write)?;
        if entry.offset != offset || entry.len != len {
            return Err(Error::Invalid(format!(
                "log entry of {}+{} given with an undoable write of {len} bytes at {offset}",
                entry.offset, entry.len
            )));
        }
        inner.check_range(offset, len)?;
        let oid = entry.oid;
        let given = matches!(make, Make::Given(_));
        let whole = offset == 0 && len == inner.g.block_bytes;
        let fits = |cost: u64| {
            if cost > inner.undo_bytes_max() {
                return Err(Error::Invalid(format!(
                    "an undoable write of {len} bytes: at most {} (a sixteenth of the journal)",
                    inner.undo_bytes_max() - undo_cost(0)
                )));
            }
            Ok(())
        };
        if !given || !whole {
            fits(undo_cost(len))?;
        }
        let mut make = Some(make);
        let mut room: Option<Admitted<'_, D>> = None;
        for _ in 0..READ_RETRY_MAX {
            inner.wait_idle(&oid).await?;
            let stored = inner.st.borrow().index.version(&oid);
            match stored {
                // A repeat (or another op at this version, which the
                // write refuses after checking the log): no undo.
                Some(v) if v >= entry.version => {
                    let data = AlignedBuf::zeroed(len as usize);
                    return self.logged_write(entry, offset, data.into(), None).await;
                }
                _ => {}
            }
            // The old block kept whole: only where the object's content
            // is its block alone (no overlay), while few are kept, and
            // while the free blocks could still take a rollback of each
            // (a rollback writes a new block before its kept one goes).
            let keep = given && whole && {
                let st = inner.st.borrow();
                let few = (inner.g.nblocks / 16) as usize;
                st.index.block_of(&oid).is_some()
                    && !st.index.pending.contains_key(&oid)
                    && st.undos.block_count() < few
                    && st.alloc.free_count() as usize > st.adm.reserve_blocks as usize + 2 * few
            };
            let cost = undo_cost(if keep { 0 } else { len });
            if room.as_ref().map(|r| r.1) != Some(cost) {
                // Waiting for room may let other ops in: look again (with
                // no claim held meanwhile).
                drop(room.take());
                fits(cost)?;
                room = Some(Admitted::reserve(inner, cost).await?);
                continue;
            }
            // A kept block is read too, not copied: an undo whose bytes
            // fail their checksum could never be rolled back to, so a
            // write over damaged bytes is refused (`Corrupt`) either way.
            let before = match stored {
                Some(_) => Some(inner.read(oid, offset, len).await?),
                None => None,
            };
            // Nothing may have changed the object since it was read (nor,
            // for a kept block, put an overlay over it).
            let moved = {
                let st = inner.st.borrow();
                st.index.version(&oid) != stored
                    || st.adm.busy(&oid)
                    || (keep && st.index.pending.contains_key(&oid))
            };
            if moved {
                continue;
            }
            let (data, undo) = match make.take().expect("made once") {
                Make::Given(d) if keep => (d, Before::Block),
                Make::Given(d) => (d, Before::Bytes(before.map(|b| (offset, b)))),
                Make::From(f) => {
                    let d = f(before.as_deref());
                    (d, Before::Bytes(before.map(|b| (offset, b))))
                }
            };
            if data.len() != len as usize {
                return Err(Error::Invalid(format!(
                    "an undoable write of {len} bytes made {}",
                    data.len()
                )));
            }
            return self
                .logged_write(entry, offset, data.into(), Some(undo))
                .await;
        }
        Err(Error::Busy(format!(
            "{oid} kept changing while an undoable write read it"
        )))
    }

    /// What `oid` held before its newest write, if that write was
    /// undoable and its undo is not released.
    pub async fn undo(&self, oid: ObjectId) -> Result<Option<Undo>> {
        let inner = &self.0;
        for _ in 0..READ_RETRY_MAX {
            let epoch = inner.epoch.get();
            let Some(u) = inner.st.borrow().undos.held.get(&oid).cloned() else {
                return Ok(None);
            };
            let (version, bytes) = match &u {
                Kept::Bytes(o) if o.len == 0 => {
                    return Ok(Some(Undo {
                        version: o.version,
                        before: None,
                    }))
                }
                Kept::Bytes(o) => (
                    o.version,
                    match &o.data {
                        Some(d) => Ok((o.offset, AlignedBuf::from_slice(d))),
                        None => (inner.read_overlay(o, 0, o.len).await).map(|(b, _)| (o.offset, b)),
                    },
                ),
                Kept::Block { version, .. } => (
                    *version,
                    (inner.read(hidden(oid), 0, inner.g.block_bytes).await).map(|b| (0, b)),
                ),
            };
            // The undo may have been replaced while it was read (a kept
            // block is read by its hidden name, which a newer undo reuses).
            let same = (inner.st.borrow().undos.held.get(&oid))
                .is_some_and(|n| n.version() == version && n.is_block() == u.is_block());
            match bytes {
                Ok(_) if !same => continue,
                Ok(before) => {
                    return Ok(Some(Undo {
                        version,
                        before: Some(before),
                    }))
                }
                // The journal moved under the read (the undo was
                // re-logged), or the undo went meanwhile.
                Err(_) if inner.epoch.get() != epoch => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Busy(format!("the undo of {oid} kept moving")))
    }

    /// Whether `oid` is settled: no op on it in flight and no undo held
    /// (every write of it that landed here committed).
    pub fn settled(&self, oid: ObjectId) -> bool {
        let st = self.0.st.borrow();
        !st.adm.busy(&oid) && !st.undos.held.contains_key(&oid)
    }

    /// The objects holding an undo, with its version, sorted.
    pub fn undos(&self) -> Vec<(ObjectId, u64)> {
        let st = self.0.st.borrow();
        let mut v: Vec<(ObjectId, u64)> = (st.undos.held.iter())
            .map(|(oid, u)| (*oid, u.version()))
            .collect();
        v.sort();
        v
    }

    /// Drops `oid`'s undo if it is for version `upto` or older: that write
    /// committed and will never be rolled back (a block it kept is freed
    /// at the next checkpoint). In memory: after a crash a released undo
    /// may be back (harmless: the write it undoes is the object's newest,
    /// and the caller decides whether to roll back).
    pub fn release_undo(&self, oid: ObjectId, upto: u64) {
        let mut st = self.0.st.borrow_mut();
        if st.undos.held.get(&oid).is_some_and(|u| u.version() <= upto) {
            if st.undos.drop_held(&oid) {
                st.drop_hidden(oid, false);
            }
            // Journaled with the next batch, without waking the writer
            // (after a crash before it, the undo is back: harmless).
            let (done, _) = oneshot();
            st.writer.queue.push_back(Queued {
                rec: Record::bare(RecordKind::Release, oid, upto, None),
                data: None,
                data_done: None,
                durable: false,
                checkpoint: false,
                done,
            });
            drop(st);
            self.0.applied.notify();
        }
    }
}

/// An undoable write's claim on the undo room, from admission to its end.
struct Admitted<'a, D: BlockDev>(&'a Inner<D>, u64);

impl<'a, D: BlockDev + 'static> Admitted<'a, D> {
    /// Waits until `cost` more fits the room (or nothing else is in it:
    /// one alone always fits), and claims it in the same step.
    async fn reserve(inner: &'a Inner<D>, cost: u64) -> Result<Self> {
        loop {
            {
                let mut st = inner.st.borrow_mut();
                let used = st.undos.bytes + st.undos.admitted;
                if used == 0 || used + cost <= inner.undo_bytes_max() {
                    st.undos.admitted += cost;
                    return Ok(Admitted(inner, cost));
                }
            }
            inner.check_writable()?;
            inner.applied.wait().await;
        }
    }
}

impl<D: BlockDev> Drop for Admitted<'_, D> {
    fn drop(&mut self) {
        self.0.st.borrow_mut().undos.admitted -= self.1;
        self.0.applied.notify();
    }
}
