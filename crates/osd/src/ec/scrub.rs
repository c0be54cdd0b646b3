//! Scrub of an erasure-coded PG (docs/internals/ec.md *Scrub*): its
//! primary walks the objects its shards hold, one at a time under the
//! object's lock (no write is in flight or starts meanwhile), and checks
//! that the shards make one stripe.
//!
//! - First each shard's version of the object (the index, no data read).
//!   Shards that outlived the object's delete (the PG log's newest entry
//!   for it a delete above every version held) are deleted.
//! - A *light* scrub stops there unless a parity shard lacks the object:
//!   every write and delete reaches every parity shard, so that is
//!   inconsistent (a data shard may lack it: its bytes are then zeros),
//!   and the object is checked as a deep scrub checks it.
//! - A *deep* scrub reads every shard whole (each 4 KiB checked against
//!   its checksum; a data shard that lacks the object reads as zeros). A
//!   shard whose checksums failed, or a parity shard that lacks the
//!   object, is *erased* (any other failure stops the scrub, as a member
//!   that does not answer does). The others must be one codeword: `k`
//!   of them decode the stripe, and the rest must equal its re-encoding.
//!   If they do not, each readable shard is tried as the one to blame:
//!   the stripe the others decode to must fit all of them (which needs
//!   `k + 1` others, so that it is checked at all). Exactly one such
//!   shard is rewritten from the stripe; none or several, and the object
//!   is reported and left alone (`unrepaired`).
//! - The repair writes a shard's bytes in place at the version it holds
//!   (`Store::repair`, as a replicated scrub mends a damaged copy), or
//!   rebuilds a shard that lacks the object at the object's newest
//!   version, fenced as peering's rebuilds are (`Osd::rebuild_shard_here`:
//!   it lands only if the shard still lacks it); a rebuild whose outcome
//!   is not known ends the interval (it could land after the object is
//!   unlocked).

use std::collections::BTreeSet;
use std::rc::Rc;

use nacre_blockstore::LogOp;
use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_net::Transport;
use nacre_types::{ObjectId, PgId};
use nacre_wire::{Header, Op, Status};

use super::{same_op, Scheme};
use crate::scrub::{Locked, ScrubReport, SCRUB_CALL_MAX};
use crate::Osd;

/// One shard's state of an object, as the scrub found it.
enum Found {
    /// The shard holds nothing of the object: zeros.
    Absent,
    /// Its bytes.
    Held(AlignedBuf),
    /// Its read failed (a checksum, the device): why.
    Erased(String),
}

/// What a check of one object decided.
enum Verdict {
    Consistent,
    /// Shards `culprits` rewritten as `stripe` says.
    Repair {
        why: String,
        culprits: Vec<usize>,
        stripe: Vec<AlignedBuf>,
    },
    Unrepairable(String),
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// Scrubs erasure-coded PG `pg` (this OSD its primary, active+clean
    /// in `epoch`): its objects, one at a time under its lock.
    pub(crate) async fn ec_scrub_walk(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        deep: bool,
        r: &mut ScrubReport,
    ) -> Result<(), String> {
        let scheme =
            (self.scheme(pg.pool)).ok_or_else(|| format!("PG {pg} is not erasure-coded"))?;
        let row = self.map.borrow().placement(pg).to_vec();
        r.osds = row.clone();
        // The walk is over the shards' names, in which each slot's shards
        // sort apart: an object met again in a later page was checked.
        let mut done: BTreeSet<ObjectId> = BTreeSet::new();
        let mut after = None;
        loop {
            self.scrub_blocked(pg, epoch)?;
            let (names, end) = self.scrub_page(pg, epoch, &row, after).await?;
            let objects: BTreeSet<ObjectId> = (names.iter())
                .map(|o| o.whole())
                .filter(|o| !done.contains(o))
                .collect();
            // One object locked at a time: a write to it waits for its
            // check alone.
            for &oid in &objects {
                self.scrub_blocked(pg, epoch)?;
                self.lock(oid).await;
                let locked = Locked(self, vec![oid]);
                let bytes = (self.ec_scrub_object(pg, epoch, &scheme, &row, oid, deep, r)).await;
                drop(locked);
                let bytes = bytes?;
                r.bytes += bytes;
                self.scrub_pace(bytes).await;
            }
            done.extend(objects);
            match end {
                Some(e) => after = Some(e),
                None => return Ok(()),
            }
        }
    }

    /// Checks object `oid` (locked) and repairs it if it can; the bytes
    /// read. An error stops the scrub (a shard did not answer, the PG
    /// stopped).
    #[allow(clippy::too_many_arguments)]
    async fn ec_scrub_object(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        scheme: &Scheme,
        row: &[u32],
        oid: ObjectId,
        deep: bool,
        r: &mut ScrubReport,
    ) -> Result<u64, String> {
        let n = row.len();
        let k = scheme.layout.k;
        let versions = self.ec_scrub_versions(pg, epoch, row, oid).await?;
        // An op failed meanwhile (the object's own, which let go of its
        // lock: a delete some shard missed), or the epoch moved: the
        // shards may differ for that reason, and peering mends them.
        self.scrub_blocked(pg, epoch)?;
        let Some(newest) = versions.iter().flatten().copied().max() else {
            // Named by a log only: nothing of it is stored.
            return Ok(0);
        };
        r.objects += 1;
        let parity_lacks = (k..n).any(|s| versions[s].is_none());
        // What a delete left behind (a shard that missed it): the PG's
        // history ends the object with a client's delete above every
        // version held. (A rollback's entry, client 0, is a write of the
        // stripe, even where it deleted this shard's part: `same_op`.)
        let deleted = (self.store.pg_log(pg.key()))
            .and_then(|l| {
                (l.entries.values().rev())
                    .find(|e| e.oid.whole() == oid)
                    .cloned()
            })
            .filter(|e| same_op(e).1 == LogOp::Delete && e.version >= newest);
        if let Some(e) = deleted {
            let held: Vec<usize> = (0..n).filter(|&s| versions[s].is_some()).collect();
            let why = format!("shards {held:?} outlived its delete v{:#x}", e.version);
            let mut fixed = Ok(());
            for &s in &held {
                // Nothing is rewritten once the PG stopped (a failed push
                // stops it).
                self.scrub_blocked(pg, epoch)?;
                let v = versions[s].expect("held");
                let name = oid.shard(s as u8);
                // (Fenced at the version found: a delete only raises it.)
                fixed = self
                    .ec_scrub_push(row[s], pg, epoch, name, v, v, None)
                    .await;
                if fixed.is_err() {
                    break;
                }
            }
            self.scrub_found(pg, oid, &why, &fixed, r);
            return Ok(0);
        }
        if !deep && !parity_lacks {
            return Ok(0);
        }
        let found = self
            .ec_scrub_read(pg, epoch, scheme, row, oid, &versions)
            .await?;
        self.scrub_blocked(pg, epoch)?;
        let bytes = u64::from(scheme.layout.shard_bytes) * n as u64;
        let verdict = judge(scheme, &found);
        let (why, fixed) = match verdict {
            Verdict::Consistent => return Ok(bytes),
            Verdict::Unrepairable(why) => (why, Err("left alone".to_string())),
            Verdict::Repair {
                why,
                culprits,
                stripe,
            } => {
                let mut fixed = Ok(());
                for &c in &culprits {
                    // Nothing is rewritten once the PG stopped.
                    self.scrub_blocked(pg, epoch)?;
                    let name = oid.shard(c as u8);
                    fixed = match versions[c] {
                        // In place, at the version it holds.
                        Some(v) => {
                            (self.scrub_mend_on(row[c], pg, epoch, name, v, &stripe[c])).await
                        }
                        None => {
                            let d = AlignedBuf::from_slice(&stripe[c]);
                            (self.ec_scrub_push(row[c], pg, epoch, name, newest, 0, Some(d))).await
                        }
                    };
                    if fixed.is_err() {
                        break;
                    }
                }
                (why, fixed)
            }
        };
        self.scrub_found(pg, oid, &why, &fixed, r);
        Ok(bytes)
    }

    /// Op `op` (a read: of `len` bytes) on every shard of `oid` at once,
    /// each answer's status, bytes and version; an error if one does not
    /// answer in time.
    #[allow(clippy::too_many_arguments)]
    async fn ec_scrub_ask(
        self: &Rc<Self>,
        op: Op,
        pg: PgId,
        epoch: u64,
        row: &[u32],
        oid: ObjectId,
        len: u32,
    ) -> Result<Vec<(Status, Option<AlignedBuf>, u64)>, String> {
        let calls: Vec<_> = (0..row.len())
            .map(|s| {
                let h = self.ec_scrub_header(op, pg, epoch, oid, s, len);
                let call = self.clone().shard_call(row[s], h, None);
                rt::spawn(rt::timeout(SCRUB_CALL_MAX, call))
            })
            .collect();
        let answers = rt::join_all(calls).await.into_iter().enumerate();
        (answers.map(|(s, a)| {
            a.ok_or_else(|| format!("osd.{} did not answer within {SCRUB_CALL_MAX:?}", row[s]))
        }))
        .collect()
    }

    /// The version each shard of `oid` holds (`None`: none).
    async fn ec_scrub_versions(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        row: &[u32],
        oid: ObjectId,
    ) -> Result<Vec<Option<u64>>, String> {
        let answers = (self.ec_scrub_ask(Op::ShardVersion, pg, epoch, row, oid, 0)).await?;
        (answers.into_iter().enumerate())
            .map(|(s, a)| match a {
                (Status::Ok, _, v) => Ok(Some(v)),
                (Status::NotFound, _, _) => Ok(None),
                (st, _, _) => Err(format!("osd.{} (shard {s}) of {oid}: {st:?}", row[s])),
            })
            .collect()
    }

    /// Every shard of `oid` read whole.
    async fn ec_scrub_read(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        scheme: &Scheme,
        row: &[u32],
        oid: ObjectId,
        versions: &[Option<u64>],
    ) -> Result<Vec<Found>, String> {
        let len = scheme.layout.shard_bytes;
        let answers = (self.ec_scrub_ask(Op::ShardRead, pg, epoch, row, oid, len)).await?;
        (answers.into_iter().enumerate())
            .map(|(s, a)| match a {
                (Status::Ok, Some(b), _) if b.len() == len as usize => Ok(Found::Held(b)),
                // (Its index said so too, and nothing wrote meanwhile: the
                // object is locked.) A parity shard lacks no object that
                // exists: every write and delete reaches every parity
                // shard.
                (Status::NotFound, _, _) if versions[s].is_none() => {
                    Ok(match s >= scheme.layout.k {
                        true => Found::Erased("lacks the object".into()),
                        false => Found::Absent,
                    })
                }
                (Status::Corrupt, _, _) => Ok(Found::Erased("its checksums failed".into())),
                // Not an answer about the shard (a lost message, a map
                // change): the scrub stops, and is tried again.
                (st, _, _) => Err(format!("osd.{} (shard {s}) reading {oid}: {st:?}", row[s])),
            })
            .collect()
    }

    /// A shard op of the scrub on shard `s` of `oid` (a read: whole).
    fn ec_scrub_header(
        &self,
        op: Op,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
        s: usize,
        len: u32,
    ) -> Header {
        let mut h = Header::request(op, 0, oid.shard(s as u8)).with_pg(pg);
        (h.epoch, h.sender, h.length) = (epoch, self.id, len);
        h
    }

    /// `push_shard` for the scrub, bounded as its other calls are. One
    /// whose outcome is not known (no answer in time, refused) ends the
    /// interval: the push may still land, and the object is unlocked
    /// after — a push of a shard that lacked the object could otherwise
    /// bring back what a delete since took (the epoch fences it, and the
    /// next peering waits for one already taken in).
    #[allow(clippy::too_many_arguments)]
    async fn ec_scrub_push(
        self: &Rc<Self>,
        to: u32,
        pg: PgId,
        epoch: u64,
        name: ObjectId,
        version: u64,
        expect: u64,
        data: Option<AlignedBuf>,
    ) -> Result<(), String> {
        let push = self.push_shard(to, pg, epoch, name, version, expect, data);
        let why = match rt::timeout(SCRUB_CALL_MAX, push).await {
            Some(Ok(())) => return Ok(()),
            Some(Err(e)) => e.to_string(),
            None => format!("osd.{to} did not answer within {SCRUB_CALL_MAX:?}"),
        };
        self.fail_pg(pg, epoch, format!("scrub's rebuild of {name}: {why}"));
        Err(why)
    }
}

/// Whether the shards `found` make one stripe, and if not which to
/// rewrite (module docs).
fn judge(scheme: &Scheme, found: &[Found]) -> Verdict {
    let (k, n) = (scheme.layout.k, found.len());
    let len = scheme.layout.shard_bytes as usize;
    let zeros = AlignedBuf::zeroed(len);
    let bytes: Vec<Option<&[u8]>> = (found.iter())
        .map(|f| match f {
            Found::Absent => Some(&zeros[..]),
            Found::Held(b) => Some(&b[..]),
            Found::Erased(_) => None,
        })
        .collect();
    let erased: Vec<usize> = (0..n).filter(|&s| bytes[s].is_none()).collect();
    let readable: Vec<usize> = (0..n).filter(|&s| bytes[s].is_some()).collect();
    let said = |s: usize| match &found[s] {
        Found::Erased(why) => format!("shard {s}: {why}"),
        _ => format!("shard {s} disagrees with the others"),
    };
    if readable.len() < k {
        let why: Vec<String> = erased.iter().map(|&s| said(s)).collect();
        return Verdict::Unrepairable(format!(
            "{} of {n} shards readable, {k} needed: {}",
            readable.len(),
            why.join("; ")
        ));
    }
    // The stripe that `k` of the readable shards other than `blamed`
    // decode to, if every other readable shard fits it.
    let fits = |blamed: Option<usize>| -> Option<Vec<AlignedBuf>> {
        let trusted: Vec<usize> = readable
            .iter()
            .copied()
            .filter(|&s| Some(s) != blamed)
            .collect();
        let mut chunks: Vec<Option<&[u8]>> = vec![None; n];
        for &s in &trusted[..k] {
            chunks[s] = bytes[s];
        }
        let want: Vec<usize> = (0..n).filter(|s| !trusted[..k].contains(s)).collect();
        let mut outs: Vec<AlignedBuf> = want.iter().map(|_| AlignedBuf::zeroed(len)).collect();
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|b| &mut b[..]).collect();
        scheme.codec.reconstruct(&chunks, &want, &mut refs).ok()?;
        let mut stripe: Vec<Option<AlignedBuf>> = (0..n).map(|_| None).collect();
        for (&s, b) in want.iter().zip(outs) {
            stripe[s] = Some(b);
        }
        for &s in &trusted[..k] {
            stripe[s] = Some(AlignedBuf::from_slice(bytes[s].expect("readable")));
        }
        let agree = (trusted[k..].iter()).all(|&s| stripe[s].as_deref() == bytes[s]);
        agree.then(|| {
            stripe
                .into_iter()
                .map(|b| b.expect("every shard"))
                .collect()
        })
    };
    if let Some(stripe) = fits(None) {
        if erased.is_empty() {
            return Verdict::Consistent;
        }
        let why: Vec<String> = erased.iter().map(|&s| said(s)).collect();
        return Verdict::Repair {
            why: why.join("; "),
            culprits: erased,
            stripe,
        };
    }
    // One readable shard to blame: the others, `k + 1` at least, must
    // agree without it.
    let mut blamed = Vec::new();
    if readable.len() > k + 1 {
        for &s in &readable {
            if let Some(stripe) = fits(Some(s)) {
                blamed.push((s, stripe));
            }
        }
    }
    if blamed.len() != 1 {
        let mut why: Vec<String> = erased.iter().map(|&s| said(s)).collect();
        why.push(format!(
            "the {} readable shards are no stripe, and {} single shard explains it",
            readable.len(),
            if blamed.is_empty() {
                "no"
            } else {
                "more than one"
            }
        ));
        return Verdict::Unrepairable(why.join("; "));
    }
    let (s, stripe) = blamed.pop().expect("one");
    let mut culprits = erased;
    culprits.push(s);
    culprits.sort_unstable();
    let why: Vec<String> = culprits.iter().map(|&c| said(c)).collect();
    Verdict::Repair {
        why: why.join("; "),
        culprits,
        stripe,
    }
}
