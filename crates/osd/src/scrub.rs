//! Scrub (docs/internals/replication.md §8.6): the primary of an
//! active+clean PG compares its members' copies object by object and
//! rewrites every object whose copies differ.
//!
//! - A *light* scrub compares, per object, the version each copy holds and
//!   the newest entry each copy's PG log has for it (above the highest log
//!   tail among the members, the part every log still holds). A *deep*
//!   scrub also reads every copy whole, each 4 KiB checked against its
//!   checksum, and compares a crc32c of the bytes.
//! - The primary walks the union of the members' objects, and of the
//!   objects their logs name, in pages (`Op::Scrub` 0), and compares a
//!   chunk at a time (`Op::Scrub` 1 and 2) under the chunk's object locks:
//!   no write of those objects is in flight or starts meanwhile (a write
//!   holds its object's lock until every copy has it, or the PG stops), so
//!   copies that hold the same history agree exactly.
//! - The authority for an object is the state (absent, or a version with
//!   its digest when deep) that a strict majority of the copies that could
//!   be read hold; without one, the primary's (it holds the history
//!   peering settled on). A copy whose checksums failed, or that could not
//!   be read, has no say.
//! - An object whose copies differ is rewritten on every copy at a new
//!   version, from the authority's bytes (deleted on every copy if the
//!   authority is absent), as peering undoes a divergent write: the copies
//!   then agree on version, bytes and log entry. With no copy readable it
//!   is reported and left alone (`unrepaired`; `nacre status` warns).
//! - A scrub stops, and says why, when the PG stops being active+clean or
//!   the epoch moves; a rewrite that fails ends the interval like a
//!   failed write. One scrub runs at a time per OSD; deep scrubs read at
//!   most `ScrubConfig::bytes_per_s`.
//! - Each primary schedules its own PGs: a light scrub every
//!   `ScrubConfig::interval` and a deep one every `deep_interval` after
//!   the PG's last (a deep scrub counts as a light one too); a PG never
//!   scrubbed comes due a fraction of the intervals after a primary first
//!   planned it, the fraction fixed per PG so that PGs do not all come
//!   due together. When it was scrubbed and first planned outlives the
//!   OSD: the OSD hands each complete scrub and each first plan out
//!   ([`ScrubNews`]) for its daemon to record in the cluster's stamps
//!   (`map::ScrubStamp`), and takes the stamps back when it starts
//!   ([`Osd::load_scrub_stamps`]), and again for a PG it plans first that
//!   the cluster has a stamp of. An OSD restarted more often than the
//!   intervals thus still scrubs every PG in time; a stamp another
//!   primary wrote after this OSD read them makes a scrub come early.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::Duration;

use nacre_blockstore::LogOp;
use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_net::Transport;
use nacre_types::{crc32c, ObjectId, PgId};
use nacre_wire::{Header, Op, Status, SENDER_CLIENT};
use serde::{Deserialize, Serialize};

use crate::{Osd, PgState};

/// `Op::Scrub` kinds (in `length`).
const LIST: u32 = 0;
const CHECK: u32 = 1;
const CHECK_DEEP: u32 = 2;
use nacre_wire::{SCRUB_REPORT as REPORT, SCRUB_START as START, SCRUB_START_DEEP as START_DEEP};
const MEND: u32 = 5;

/// Objects per listing page (16 bytes each in the answer).
const LIST_PAGE: usize = 2048;
/// Objects compared under one hold of their locks: writes to them wait
/// that long (a deep chunk reads every copy of each).
const CHUNK_LIGHT: usize = 64;
const CHUNK_DEEP: usize = 8;
/// Scrubs an admin asked for that may wait their turn on one OSD, and
/// reports of them it keeps for the asker to fetch.
const ASKED_MAX: usize = 256;
const REPORTS_KEPT: usize = 256;
/// Findings a report names (the rest are counted).
const FINDINGS_MAX: usize = 16;
/// How often the schedule looks for a PG that is due, and how long a PG
/// whose scrub could not run waits before it is tried again.
const SCHEDULE_TICK: Duration = Duration::from_millis(500);
const SCHEDULE_RETRY: Duration = Duration::from_secs(60);
/// The longest a scrub waits for a member's answer (it holds the chunk's
/// object locks meanwhile).
pub(crate) const SCRUB_CALL_MAX: Duration = Duration::from_secs(5);

pub const SCRUB_INTERVAL_DEFAULT: Duration = Duration::from_secs(24 * 3600);
pub const DEEP_SCRUB_INTERVAL_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
pub const SCRUB_BYTES_PER_S_DEFAULT: u64 = 50 << 20;

/// When and how fast an OSD scrubs the PGs it is primary of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubConfig {
    /// Between light scrubs of a PG (zero: none scheduled).
    pub interval: Duration,
    /// Between deep scrubs of a PG (zero: none scheduled).
    pub deep_interval: Duration,
    /// Bytes per second a deep scrub reads, over every copy.
    pub bytes_per_s: u64,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        ScrubConfig {
            interval: SCRUB_INTERVAL_DEFAULT,
            deep_interval: DEEP_SCRUB_INTERVAL_DEFAULT,
            bytes_per_s: SCRUB_BYTES_PER_S_DEFAULT,
        }
    }
}

/// When a PG was first planned and last scrubbed, in seconds of
/// [`rt::monotonic`] (below zero: before this OSD started).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct History {
    first: f64,
    light: Option<f64>,
    deep: Option<f64>,
}

impl History {
    /// First planned at `first`, never scrubbed.
    fn planned(first: f64) -> History {
        History {
            first,
            ..History::default()
        }
    }
}

/// What an OSD hands its daemon to record in the cluster's scrub stamps
/// ([`Osd::take_scrub_news`]).
#[derive(Clone, Debug, PartialEq)]
pub enum ScrubNews {
    /// A PG with no stamp known here was planned at `at_unix_s`: its
    /// first scrubs are due from then (unless the cluster's stamp says
    /// otherwise: [`Osd::load_scrub_stamps`] with it).
    Planned { pg: PgId, at_unix_s: u64 },
    /// A scrub that covered the whole PG, finished at `at_unix_s`.
    Scrubbed {
        pg: PgId,
        deep: bool,
        at_unix_s: u64,
        objects: u64,
        inconsistent: u64,
        unrepaired: u64,
    },
}

/// The later of two times, either of which may be missing.
fn latest(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// News kept for the daemon to take; the oldest go beyond (a daemon that
/// takes none, as in the simulator).
const NEWS_MAX: usize = 4096;

/// What one scrub of a PG found (the answer to an admin's `Op::Scrub`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScrubReport {
    pub pg: PgId,
    pub deep: bool,
    pub epoch: u64,
    /// The copies compared (the acting set, primary first).
    pub osds: Vec<u32>,
    /// Objects compared, and bytes read (deep: over every copy).
    pub objects: u64,
    pub bytes: u64,
    /// Objects whose copies differed; of them, those rewritten from the
    /// authority and those left alone (no copy could be read, or the
    /// rewrite failed).
    pub inconsistent: u64,
    pub repaired: u64,
    pub unrepaired: u64,
    /// The first differences, each with what every copy held.
    pub findings: Vec<String>,
    /// Why the scrub stopped before the end (not clean, epoch moved, a
    /// member did not answer); `None` if it covered the whole PG.
    pub error: Option<String>,
    /// When it ended (seconds since the Unix epoch), and how long it took.
    pub finished_unix_s: u64,
    pub seconds: f64,
}

/// One copy's state of an object, as a check found it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Its version; 0 if the copy does not hold it.
    pub version: u64,
    /// The version of the newest entry the copy's log has for it (0:
    /// none above the log's tail).
    pub logged: u64,
    /// crc32c of the whole object (deep checks of a held object).
    pub digest: u32,
    /// `DAMAGED`, `UNREADABLE`, `MOVED` (the copy cannot be read: it has
    /// no say), `LOGGED_DELETE`, `PURGED`.
    pub flags: u32,
}

/// Its checksums failed (or the device failed the read).
const DAMAGED: u32 = 1;
/// The read failed otherwise.
const UNREADABLE: u32 = 2;
/// The object changed while it was read.
const MOVED: u32 = 4;
const UNREAD: u32 = DAMAGED | UNREADABLE | MOVED;
/// The newest log entry for it (`logged`) is a delete.
const LOGGED_DELETE: u32 = 8;
/// Its volume is being deleted: the copies may differ while the purge
/// goes from OSD to OSD (each deletes its objects unlogged), so the
/// object is not judged.
const PURGED: u32 = 16;
const SEEN_BYTES: usize = 32;

impl Seen {
    fn encode(&self, b: &mut Vec<u8>) {
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.logged.to_le_bytes());
        b.extend_from_slice(&self.digest.to_le_bytes());
        b.extend_from_slice(&self.flags.to_le_bytes());
        b.extend_from_slice(&[0; 8]);
    }

    fn decode(c: &[u8]) -> Result<Seen, String> {
        let u64_at = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(c[i..i + 4].try_into().expect("4 bytes"));
        let s = Seen {
            version: u64_at(0),
            logged: u64_at(8),
            digest: u32_at(16),
            flags: u32_at(20),
        };
        if s.flags & !(UNREAD | LOGGED_DELETE | PURGED) != 0 || u64_at(24) != 0 {
            return Err(format!("scrub check: flags {:#x}", s.flags));
        }
        Ok(s)
    }

    fn readable(&self) -> bool {
        self.flags & UNREAD == 0
    }

    /// Whether the copy contradicts its own log: the newest entry for the
    /// object is a write of a version it does not hold (it lost the
    /// write), or a delete of a version it still holds.
    fn contradicts_log(&self) -> bool {
        match (self.logged, self.flags & LOGGED_DELETE != 0) {
            (0, _) => false,
            (l, false) => self.version < l,
            (l, true) => self.version != 0 && self.version <= l,
        }
    }

    /// Whether this copy has a say in the authority: it could be read and
    /// agrees with its own log.
    fn votes(&self) -> bool {
        self.readable() && !self.contradicts_log()
    }

    fn describe(&self, deep: bool) -> String {
        let mut s = match self.version {
            _ if self.flags & DAMAGED != 0 => format!("v{:#x} damaged", self.version),
            _ if self.flags & UNREADABLE != 0 => format!("v{:#x} unreadable", self.version),
            _ if self.flags & MOVED != 0 => format!("v{:#x} changed while read", self.version),
            0 => "absent".to_string(),
            v if deep => format!("v{v:#x} crc {:08x}", self.digest),
            v => format!("v{v:#x}"),
        };
        if self.logged != 0 {
            let op = if self.flags & LOGGED_DELETE != 0 {
                "delete"
            } else {
                "write"
            };
            s += &format!(" (log: {op} v{:#x})", self.logged);
        }
        if self.contradicts_log() {
            s += " contradicting its log";
        }
        s
    }
}

/// What scrub decided about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Consistent,
    /// The copies differ (`why`): every copy becomes the authority, which
    /// is absent (`version` 0) or `version` with `digest`, read from
    /// OSD `source`'s copy. With `mend`, the copies that differ are those
    /// OSDs', damaged or unreadable at the authority's version, the rest
    /// agreeing: each is rewritten in place at that version
    /// (`Store::repair`); else the object is rewritten on every copy at a
    /// new version.
    Repair {
        why: String,
        version: u64,
        digest: u32,
        source: u32,
        mend: Option<Vec<u32>>,
    },
    /// The copies differ and none can be the authority.
    Unrepairable {
        why: String,
    },
}

/// Judges one object from what each copy (`(osd, seen)`, the primary
/// `primary` among them) holds; `floor` is the highest among the copies'
/// log floors: entries at or below it some log may no longer hold.
///
/// A copy has a say only if it could be read and agrees with its own log
/// (`Seen::contradicts_log`: a copy that lost a write its log names must
/// not outvote the copies that hold it). The authority is the state a
/// strict majority of those copies hold; without one, the primary's —
/// but never "absent" over a copy that holds the object. With no
/// authority the object is left alone.
pub(crate) fn judge(copies: &[(u32, Seen)], floor: u64, primary: u32, deep: bool) -> Verdict {
    let state = |s: &Seen| (s.version, if deep && s.version != 0 { s.digest } else { 0 });
    let logged = |s: &Seen| {
        if s.logged > floor {
            (s.logged, s.flags & LOGGED_DELETE != 0)
        } else {
            (0, false)
        }
    };
    let Some((_, first)) = copies.first() else {
        return Verdict::Consistent;
    };
    if (copies.iter())
        .all(|(_, s)| s.votes() && state(s) == state(first) && logged(s) == logged(first))
    {
        return Verdict::Consistent;
    }
    let why = (copies.iter())
        .map(|(o, s)| format!("osd.{o} {}", s.describe(deep)))
        .collect::<Vec<_>>()
        .join(", ");
    let voters: Vec<(u32, (u64, u32))> = (copies.iter())
        .filter(|(_, s)| s.votes())
        .map(|(o, s)| (*o, state(s)))
        .collect();
    let mut votes: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    for (_, st) in &voters {
        *votes.entry(*st).or_default() += 1;
    }
    let majority = (votes.iter())
        .find(|(_, &n)| n * 2 > voters.len())
        .map(|(st, _)| *st);
    let auth = majority.or_else(|| {
        let mine = (voters.iter())
            .find(|(o, _)| *o == primary)
            .map(|(_, st)| *st)?;
        let held = voters.iter().any(|(_, st)| st.0 != 0);
        (mine.0 != 0 || !held).then_some(mine)
    });
    let Some(auth) = auth else {
        return Verdict::Unrepairable {
            why: format!("{why}: no copy can be the authority"),
        };
    };
    // The primary's own copy if it is the authority's (no pull), else
    // the first that is.
    let source = (voters.iter())
        .filter(|(_, st)| *st == auth)
        .map(|(o, _)| *o)
        .min_by_key(|&o| o != primary)
        .expect("the authority is some voting copy's state");
    let auth_logged = (copies.iter())
        .find(|(o, _)| *o == source)
        .map_or((0, false), |(_, s)| logged(s));
    let in_place = auth.0 != 0
        && (copies.iter()).all(|(_, s)| {
            logged(s) == auth_logged
                && if s.readable() {
                    state(s) == auth && !s.contradicts_log()
                } else {
                    s.version == auth.0 && s.flags & MOVED == 0
                }
        });
    let mend = in_place.then(|| {
        (copies.iter())
            .filter(|(_, s)| !s.readable())
            .map(|(o, _)| *o)
            .collect()
    });
    Verdict::Repair {
        why,
        version: auth.0,
        digest: auth.1,
        source,
        mend,
    }
}

/// Keeps the end of a string past `n` bytes off a report.
fn clip(mut s: String, n: usize) -> String {
    if s.len() > n {
        let mut cut = n;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s += "…";
    }
    s
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Marks the OSD as scrubbing while held.
struct Running<'a, D: BlockDev + 'static, T: Transport>(&'a Osd<D, T>);

impl<D: BlockDev + 'static, T: Transport> Drop for Running<'_, D, T> {
    fn drop(&mut self) {
        self.0.scrubbing.set(None);
        self.0.scrub_idle.notify();
    }
}

/// Holds the locks of a chunk's objects while held.
pub(crate) struct Locked<'a, D: BlockDev + 'static, T: Transport>(
    pub &'a Osd<D, T>,
    pub Vec<ObjectId>,
);

impl<D: BlockDev + 'static, T: Transport> Drop for Locked<'_, D, T> {
    fn drop(&mut self) {
        for &o in &self.1 {
            self.0.unlock(o);
        }
    }
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// Sets when and how fast this OSD scrubs (its PGs' next scrubs are
    /// planned again from it).
    pub fn set_scrub(&self, cfg: ScrubConfig) {
        self.scrub_cfg.set(cfg);
        self.scrub_due.borrow_mut().clear();
    }

    /// Takes the cluster's record of when PGs were scrubbed (the PGs'
    /// schedules are planned again from it; a later stamp than this OSD's
    /// own wins).
    pub fn load_scrub_stamps(&self, stamps: &BTreeMap<PgId, nacre_meta::map::ScrubStamp>) {
        // Unix seconds to this OSD's clock; a stamp from the future (a
        // clock ahead somewhere) counts as now.
        let (now_unix, now) = (unix_now_s(), rt::monotonic().as_secs_f64());
        let at = |unix: u64| (unix > 0).then_some(now - now_unix.saturating_sub(unix) as f64);
        let mut hist = self.scrub_hist.borrow_mut();
        for (&pg, s) in stamps {
            let Some(first) = at(s.first_unix_s).or(at(s.light_unix_s)) else {
                continue;
            };
            let h = hist.entry(pg).or_insert(History::planned(first));
            h.first = h.first.min(first);
            h.light = latest(h.light, at(s.light_unix_s));
            h.deep = latest(h.deep, at(s.deep_unix_s));
            // Planned again from it.
            self.scrub_due.borrow_mut().remove(&pg);
        }
    }

    /// The scrub news since the last call, oldest first.
    pub fn take_scrub_news(&self) -> Vec<ScrubNews> {
        self.scrub_news.borrow_mut().drain(..).collect()
    }

    fn scrub_tell(&self, n: ScrubNews) {
        let mut news = self.scrub_news.borrow_mut();
        if news.len() >= NEWS_MAX {
            news.pop_front();
        }
        news.push_back(n);
    }

    /// The PG being scrubbed now, and whether deeply.
    pub fn scrubbing(&self) -> Option<(PgId, bool)> {
        self.scrubbing.get()
    }

    /// Whether PG `pg`, of which this OSD is primary, is active+clean in
    /// the current epoch: active, every member of the placement up and
    /// complete, nothing left to recover.
    pub(crate) fn is_clean(&self, pg: PgId) -> bool {
        matches!(self.pgs.borrow().get(&pg), Some(PgState::Active))
            && self.recovery_progress(pg).is_none()
            && self.map.borrow().whole(pg)
    }

    /// Scrubs PG `pg` (this OSD must be its primary), after any scrub
    /// running here; what it found.
    pub async fn scrub_pg(self: &Rc<Self>, pg: PgId, deep: bool) -> ScrubReport {
        while self.scrubbing.get().is_some() {
            self.scrub_idle.wait().await;
        }
        self.scrubbing.set(Some((pg, deep)));
        let running = Running(self);
        let t = rt::monotonic();
        let mut r = ScrubReport {
            pg,
            deep,
            epoch: self.epoch(),
            ..Default::default()
        };
        if let Err(why) = self.scrub_walk(pg, deep, &mut r).await {
            r.error = Some(clip(why, 512));
        }
        drop(running);
        r.seconds = (rt::monotonic() - t).as_secs_f64();
        r.finished_unix_s = unix_now_s();
        self.stats.scrubbed(&r);
        if r.error.is_none() {
            let now = rt::monotonic().as_secs_f64();
            let mut hist = self.scrub_hist.borrow_mut();
            let h = hist.entry(pg).or_insert(History::planned(now));
            h.light = Some(now);
            if deep {
                h.deep = Some(now);
            }
            drop(hist);
            // The next ones of its kind are planned from now (the other
            // kind's due time, a retry's included, stands).
            let plan = self.scrub_plan(pg, self.scrub_cfg.get());
            if let Some(d) = self.scrub_due.borrow_mut().get_mut(&pg) {
                d.0 = plan.0;
                if deep {
                    d.1 = plan.1;
                }
            }
            self.scrub_tell(ScrubNews::Scrubbed {
                pg,
                deep,
                at_unix_s: r.finished_unix_s,
                objects: r.objects,
                inconsistent: r.inconsistent,
                unrepaired: r.unrepaired,
            });
        }
        let kind = if deep { "deep scrub" } else { "scrub" };
        match &r.error {
            None if r.inconsistent == 0 => tracing::info!(
                "osd.{}: PG {pg} {kind}: {} objects, all copies agree",
                self.id,
                r.objects
            ),
            None => tracing::warn!(
                "osd.{}: PG {pg} {kind}: {} objects, {} inconsistent, {} repaired, {} unrepaired",
                self.id,
                r.objects,
                r.inconsistent,
                r.repaired,
                r.unrepaired
            ),
            Some(why) => tracing::warn!(
                "osd.{}: PG {pg} {kind} stopped after {} objects ({} inconsistent, {} repaired): {why}",
                self.id,
                r.objects,
                r.inconsistent,
                r.repaired
            ),
        }
        r
    }

    /// Queues a scrub of PG `pg` an admin asked for; its ticket, which
    /// `Op::Scrub` `SCRUB_REPORT` answers with its report once it is done.
    /// One already queued or running for the PG (as deep) takes the ask
    /// instead; `None` when too many wait.
    fn scrub_ask(self: &Rc<Self>, pg: PgId, deep: bool) -> Option<u64> {
        let mut asked = self.scrub_asked.borrow_mut();
        if let Some(a) = asked.iter().find(|a| a.1 == pg && (a.2 || !deep)) {
            return Some(a.0);
        }
        if asked.len() >= ASKED_MAX {
            return None;
        }
        let ticket = self.scrub_tickets.get() + 1;
        self.scrub_tickets.set(ticket);
        asked.push((ticket, pg, deep));
        let me = self.clone();
        rt::spawn(async move {
            let r = me.scrub_pg(pg, deep).await;
            me.scrub_asked.borrow_mut().retain(|a| a.0 != ticket);
            let mut reports = me.scrub_reports.borrow_mut();
            reports.insert(ticket, r);
            while reports.len() > REPORTS_KEPT {
                reports.pop_first();
            }
        });
        Some(ticket)
    }

    /// Why PG `pg` cannot be scrubbed (on) in `epoch`, if it cannot.
    pub(crate) fn scrub_blocked(&self, pg: PgId, epoch: u64) -> Result<(), String> {
        if self.halted.get() {
            return Err("the OSD is stopping".into());
        }
        if self.epoch() != epoch {
            return Err(format!("the epoch moved from {epoch}"));
        }
        if !self.is_clean(pg) {
            return Err(format!("PG {pg} is not active+clean"));
        }
        Ok(())
    }

    async fn scrub_walk(
        self: &Rc<Self>,
        pg: PgId,
        deep: bool,
        r: &mut ScrubReport,
    ) -> Result<(), String> {
        let epoch = self.epoch();
        if !self.pgs.borrow().contains_key(&pg) {
            return Err(format!("osd.{} is not PG {pg}'s primary", self.id));
        }
        self.scrub_blocked(pg, epoch)?;
        // Its copies are shards, not copies to compare (ec/scrub.rs).
        if self.scheme(pg.pool).is_some() {
            return self.ec_scrub_walk(pg, epoch, deep, r).await;
        }
        let acting = self.map.borrow().acting(pg);
        r.osds = acting.clone();
        let chunk = if deep { CHUNK_DEEP } else { CHUNK_LIGHT };
        let mut after = None;
        loop {
            let (oids, end) = self.scrub_page(pg, epoch, &acting, after).await?;
            let oids: Vec<ObjectId> = oids.into_iter().collect();
            for c in oids.chunks(chunk) {
                self.scrub_blocked(pg, epoch)?;
                let mut locked = Locked(self, Vec::with_capacity(c.len()));
                for &o in c {
                    self.lock(o).await;
                    locked.1.push(o);
                }
                let bytes = self.scrub_chunk(pg, epoch, &acting, c, deep, r).await;
                drop(locked);
                self.scrub_pace(bytes?).await;
            }
            match end {
                Some(e) => after = Some(e),
                None => return Ok(()),
            }
        }
    }

    /// A page of the union of `members`' objects of PG `pg` after
    /// `after`: up to the first end of a member's page that has more after
    /// it (the page's end, where the next starts; `None`: the last page).
    pub(crate) async fn scrub_page(
        &self,
        pg: PgId,
        epoch: u64,
        members: &[u32],
        after: Option<ObjectId>,
    ) -> Result<(BTreeSet<ObjectId>, Option<ObjectId>), String> {
        let mut oids = BTreeSet::new();
        let mut end: Option<ObjectId> = None;
        for &m in members {
            let (page, more) = self.scrub_list_on(m, pg, epoch, after).await?;
            if more {
                let last = *page.last().expect("a page with more is not empty");
                end = Some(end.map_or(last, |e| e.min(last)));
            }
            oids.extend(page);
        }
        if let Some(e) = end {
            oids.retain(|o| *o <= e);
        }
        Ok((oids, end))
    }

    /// Compares the copies of the objects `oids` (their locks held) and
    /// repairs those that differ; the bytes read.
    async fn scrub_chunk(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        acting: &[u32],
        oids: &[ObjectId],
        deep: bool,
        r: &mut ScrubReport,
    ) -> Result<u64, String> {
        let asks: Vec<_> = (acting.iter())
            .map(|&m| {
                rt::spawn(
                    self.clone()
                        .scrub_check_on(m, pg, epoch, oids.to_vec(), deep),
                )
            })
            .collect();
        let mut floor = 0;
        let mut seen: Vec<Vec<Seen>> = Vec::new();
        for a in asks {
            let (f, s) = a.await?;
            floor = floor.max(f);
            seen.push(s);
        }
        // A write of another object failed meanwhile, or the epoch moved:
        // the copies may differ for that reason.
        self.scrub_blocked(pg, epoch)?;
        let bb = u64::from(self.store.block_bytes());
        let mut bytes = 0;
        for (k, &oid) in oids.iter().enumerate() {
            let copies: Vec<(u32, Seen)> = (acting.iter().zip(&seen))
                .map(|(&o, s)| (o, s[k]))
                .collect();
            if deep {
                bytes += bb * copies.iter().filter(|(_, s)| s.version != 0).count() as u64;
            }
            r.objects += 1;
            if copies.iter().any(|(_, s)| s.flags & PURGED != 0) {
                continue;
            }
            let verdict = judge(&copies, floor, self.id, deep);
            if !matches!(verdict, Verdict::Consistent) {
                // Nothing is rewritten once the PG stopped.
                self.scrub_blocked(pg, epoch)?;
            }
            let (why, fixed) = match verdict {
                Verdict::Consistent => continue,
                Verdict::Unrepairable { why } => (why, Err("left alone".to_string())),
                Verdict::Repair {
                    why,
                    version,
                    digest,
                    source,
                    mend,
                } => {
                    let fixed = self
                        .scrub_repair(
                            pg,
                            epoch,
                            acting,
                            oid,
                            (version, deep.then_some(digest), source),
                            mend,
                        )
                        .await;
                    (why, fixed)
                }
            };
            self.scrub_found(pg, oid, &why, &fixed, r);
            if fixed.is_err() {
                // A failed rewrite ended the interval.
                self.scrub_blocked(pg, epoch)?;
            }
        }
        r.bytes += bytes;
        Ok(bytes)
    }

    /// Counts and reports object `oid` of PG `pg` found inconsistent
    /// (`why`), and whether it was repaired.
    pub(crate) fn scrub_found(
        &self,
        pg: PgId,
        oid: ObjectId,
        why: &str,
        fixed: &Result<(), String>,
        r: &mut ScrubReport,
    ) {
        r.inconsistent += 1;
        let what = match fixed {
            Ok(()) => {
                r.repaired += 1;
                "repaired".to_string()
            }
            Err(e) => {
                r.unrepaired += 1;
                format!("not repaired: {e}")
            }
        };
        let line = clip(format!("{oid}: {why}; {what}"), 400);
        tracing::warn!("osd.{}: PG {pg} scrub: {line}", self.id);
        self.stats.scrub_found(format!("PG {pg}: {line}"));
        if r.findings.len() < FINDINGS_MAX {
            r.findings.push(line);
        }
    }

    /// Makes every copy of `oid` the authority `(version, digest,
    /// source)`: absent (`version` 0), or `version` read from OSD `source`
    /// (with `digest`, if deep, checked). With `mend` (see
    /// [`Verdict::Repair`]), only those copies, in place.
    async fn scrub_repair(
        self: &Rc<Self>,
        pg: PgId,
        epoch: u64,
        acting: &[u32],
        oid: ObjectId,
        (version, digest, source): (u64, Option<u32>, u32),
        mend: Option<Vec<u32>>,
    ) -> Result<(), String> {
        let data = if version == 0 {
            None
        } else {
            let d = (self.fetch_copy(source, pg, epoch, oid, version).await)
                .map_err(|(e, _)| e.to_string())?;
            if let Some(want) = digest.filter(|&w| crc32c(&d) != w) {
                return Err(format!(
                    "osd.{source}'s copy changed: crc {:08x}, not {want:08x}",
                    crc32c(&d)
                ));
            }
            Some(d)
        };
        if let (Some(osds), Some(d)) = (mend, &data) {
            for o in osds {
                self.scrub_mend_on(o, pg, epoch, oid, version, d).await?;
            }
            return Ok(());
        }
        // A whole-object rewrite takes a new block on every copy: where
        // one is full it would fail there and end the interval.
        if data.is_some() {
            let full = {
                let m = self.map.borrow();
                acting.iter().copied().find(|o| m.full.contains(o))
            };
            if let Some(o) = full.or_else(|| (self.store.spare_blocks() == 0).then_some(self.id)) {
                return Err(format!("osd.{o} is full"));
            }
        }
        match self.rewrite(pg, epoch, acting, oid, data).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // Some copies may hold the rewrite and some not.
                self.fail_pg(pg, epoch, format!("scrub's rewrite of {oid}: {e}"));
                Err(e.to_string())
            }
        }
    }

    /// Waits for the scrub budget to cover `bytes`.
    pub(crate) async fn scrub_pace(&self, bytes: u64) {
        if bytes != 0 {
            let rate = self.scrub_cfg.get().bytes_per_s;
            crate::recovery::pace(&self.scrub_next, rate, bytes).await;
        }
    }

    /// Rewrites OSD `o`'s damaged copy of `oid` at `version` in place
    /// with `data`, that version's bytes.
    pub(crate) async fn scrub_mend_on(
        &self,
        o: u32,
        pg: PgId,
        epoch: u64,
        oid: ObjectId,
        version: u64,
        data: &AlignedBuf,
    ) -> Result<(), String> {
        if o == self.id {
            let d = AlignedBuf::from_slice(data);
            return match self.repair(oid, version, d, self.id).await {
                true => Ok(()),
                false => Err(format!("osd.{o}'s copy was not rewritten")),
            };
        }
        let mut h = self.scrub_header(MEND, pg, epoch, oid).with_payload(data);
        h.obj_version = version;
        match self.scrub_call(o, h, Some(data)).await?.h.status {
            Status::Ok => Ok(()),
            s => Err(format!("osd.{o}'s copy was not rewritten: {s:?}")),
        }
    }

    /// `call_osd` for a scrub step, which holds object locks meanwhile:
    /// bounded by [`SCRUB_CALL_MAX`] (a member that died is not waited
    /// for through every retry).
    async fn scrub_call(
        &self,
        m: u32,
        h: Header,
        data: Option<&AlignedBuf>,
    ) -> Result<nacre_net::Frame, String> {
        match rt::timeout(SCRUB_CALL_MAX, self.call_osd(m, h, data)).await {
            Some(r) => r,
            None => Err(format!("osd.{m} did not answer within {SCRUB_CALL_MAX:?}")),
        }
    }

    /// The request for a scrub step on another member.
    fn scrub_header(&self, kind: u32, pg: PgId, epoch: u64, oid: ObjectId) -> Header {
        let mut h = Header::request(Op::Scrub, 0, oid);
        h.length = kind;
        h = h.with_pg(pg);
        h.epoch = epoch;
        h.sender = self.id;
        h
    }

    /// A page of member `m`'s objects of PG `pg` after `after`, and
    /// whether more follow.
    async fn scrub_list_on(
        &self,
        m: u32,
        pg: PgId,
        epoch: u64,
        after: Option<ObjectId>,
    ) -> Result<(Vec<ObjectId>, bool), String> {
        if m == self.id {
            return Ok(self.scrub_list(pg, after));
        }
        let mut h = self.scrub_header(LIST, pg, epoch, after.unwrap_or_default());
        h.offset = u32::from(after.is_some());
        let f = self.scrub_call(m, h, None).await?;
        if f.h.status != Status::Ok {
            return Err(format!("osd.{m} listing PG {pg}: {:?}", f.h.status));
        }
        let b = f.payload.as_deref().unwrap_or(&[]);
        let count = self.map.borrow().pg_count(pg.pool);
        let bad = |why: String| Err(format!("osd.{m} listing PG {pg}: {why}"));
        if !b.len().is_multiple_of(16) || b.len() / 16 > LIST_PAGE {
            return bad(format!("{} bytes", b.len()));
        }
        let oids = decode_oids(b);
        let mut prev = after;
        for &o in &oids {
            if !pg.holds(o, count) || prev.is_some_and(|p| o <= p) {
                return bad(format!("{o} out of place"));
            }
            prev = Some(o);
        }
        let more = f.h.obj_version != 0;
        if more && oids.is_empty() {
            return bad("an empty page with more after it".into());
        }
        Ok((oids, more))
    }

    /// Member `m`'s state of each of `oids` and its log's floor (entries
    /// at or below it it may lack).
    async fn scrub_check_on(
        self: Rc<Self>,
        m: u32,
        pg: PgId,
        epoch: u64,
        oids: Vec<ObjectId>,
        deep: bool,
    ) -> Result<(u64, Vec<Seen>), String> {
        if m == self.id {
            return Ok(self.scrub_check(pg, &oids, deep).await);
        }
        let body = encode_oids(&oids);
        let h = self
            .scrub_header(
                if deep { CHECK_DEEP } else { CHECK },
                pg,
                epoch,
                ObjectId::default(),
            )
            .with_payload(&body);
        let f = self
            .scrub_call(m, h, Some(&AlignedBuf::from_slice(&body)))
            .await?;
        if f.h.status != Status::Ok {
            return Err(format!("osd.{m} checking PG {pg}: {:?}", f.h.status));
        }
        let b = f.payload.as_deref().unwrap_or(&[]);
        if b.len() != 8 + oids.len() * SEEN_BYTES {
            return Err(format!("osd.{m} checking PG {pg}: {} bytes", b.len()));
        }
        let tail = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        let seen = (b[8..].chunks_exact(SEEN_BYTES))
            .map(Seen::decode)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("osd.{m}: {e}"))?;
        Ok((tail, seen))
    }

    /// This copy's objects of PG `pg` (and those its log names) after
    /// `after`, a page of them, and whether more follow.
    fn scrub_list(&self, pg: PgId, after: Option<ObjectId>) -> (Vec<ObjectId>, bool) {
        let (key, count) = (pg.key(), self.map.borrow().pg_count(pg.pool));
        let mut all: BTreeSet<ObjectId> = (self.store.list().into_iter())
            .map(|(o, _)| o)
            .filter(|&o| pg.holds(o, count) && after.is_none_or(|a| o > a))
            .collect();
        if let Some(log) = self.store.pg_log(key) {
            all.extend(
                (log.entries.values())
                    .map(|e| e.oid)
                    .filter(|&o| after.is_none_or(|a| o > a)),
            );
        }
        let more = all.len() > LIST_PAGE;
        (all.into_iter().take(LIST_PAGE).collect(), more)
    }

    /// This copy's state of each of `oids` of PG `pg` (deep: each read
    /// whole), and its log's floor.
    async fn scrub_check(
        self: &Rc<Self>,
        pg: PgId,
        oids: &[ObjectId],
        deep: bool,
    ) -> (u64, Vec<Seen>) {
        let key = pg.key();
        let log = self.store.pg_log(key).unwrap_or_default();
        // Entries are in version order: the last one of an object is its
        // newest.
        let mut logged: HashMap<ObjectId, (u64, bool)> = HashMap::new();
        for e in log.entries.values() {
            logged.insert(e.oid, (e.version, e.op == LogOp::Delete));
        }
        // Below its first entry a log may lack entries above its tail (a
        // recovered copy's log keeps only what fits).
        let floor = (log.entries.keys().next()).map_or(log.tail, |&v| log.tail.max(v - 1));
        let bb = self.store.block_bytes();
        let mut out = Vec::with_capacity(oids.len());
        for &oid in oids {
            let (l, delete) = logged.get(&oid).copied().unwrap_or((0, false));
            let mut s = Seen {
                version: self.store.version(oid).unwrap_or(0),
                logged: l,
                ..Default::default()
            };
            if delete {
                s.flags |= LOGGED_DELETE;
            }
            if self.purged.borrow().contains(&oid.volume.0) {
                s.flags |= PURGED;
            }
            if deep && s.version != 0 {
                match self.store.read(oid, 0, bb).await {
                    Ok(_) if self.store.version(oid) != Some(s.version) => s.flags |= MOVED,
                    Ok(d) => s.digest = crc32c(&d),
                    Err(e) if self.note_damage(oid, &e) => s.flags |= DAMAGED,
                    Err(e) => {
                        tracing::warn!("osd.{}: scrub read of {oid}: {e}", self.id);
                        s.flags |= UNREADABLE;
                    }
                }
            }
            out.push(s);
        }
        (floor, out)
    }

    /// Answers `Op::Scrub`: a scrub an admin asks for, or a step of one
    /// from the PG's primary.
    pub(crate) async fn answer_scrub(
        self: &Rc<Self>,
        h: &Header,
        payload: Option<AlignedBuf>,
    ) -> (Header, Option<AlignedBuf>) {
        let count = self.map.borrow().pg_count(h.pool);
        let refuse = |s: Status| {
            let mut r = h.reply(s);
            r.epoch = self.epoch();
            (r, None)
        };
        let b = payload.as_deref().unwrap_or(&[]);
        if h.pg >= count {
            return refuse(Status::Invalid);
        }
        match h.length {
            START | START_DEEP => {
                if h.sender != SENDER_CLIENT || !b.is_empty() {
                    return refuse(Status::Invalid);
                }
                if !self.pgs.borrow().contains_key(&h.pg_id()) {
                    return refuse(Status::NotPrimary);
                }
                match self.scrub_ask(h.pg_id(), h.length == START_DEEP) {
                    Some(ticket) => {
                        let mut r = h.reply(Status::Ok);
                        r.obj_version = ticket;
                        (r, None)
                    }
                    None => refuse(Status::Unavailable),
                }
            }
            REPORT => {
                if h.sender != SENDER_CLIENT || !b.is_empty() {
                    return refuse(Status::Invalid);
                }
                let ticket = h.obj_version;
                if let Some(r) = self.scrub_reports.borrow().get(&ticket) {
                    let body = serde_json::to_vec(r).expect("a report serialises");
                    return (
                        h.reply(Status::Ok).with_payload(&body),
                        Some(AlignedBuf::from_slice(&body)),
                    );
                }
                if self.scrub_asked.borrow().iter().any(|a| a.0 == ticket) {
                    // Queued or running: no payload yet.
                    return (h.reply(Status::Ok), None);
                }
                refuse(Status::NotFound)
            }
            LIST | CHECK | CHECK_DEEP | MEND => {
                if let Some(s) = self.check_peer_op(h).await {
                    return refuse(s);
                }
                if h.length == MEND {
                    let whole = b.len() == self.store.block_bytes() as usize;
                    if !whole || !h.pg_id().holds(h.oid, count) {
                        return refuse(Status::Invalid);
                    }
                    let d = AlignedBuf::from_slice(b);
                    return match self.repair(h.oid, h.obj_version, d, h.sender).await {
                        true => (h.reply(Status::Ok), None),
                        false => refuse(Status::Unavailable),
                    };
                }
                if h.length == LIST {
                    if !b.is_empty() || h.offset > 1 {
                        return refuse(Status::Invalid);
                    }
                    let after = (h.offset == 1).then_some(h.oid);
                    let (oids, more) = self.scrub_list(h.pg_id(), after);
                    let body = encode_oids(&oids);
                    let mut r = h.reply(Status::Ok).with_payload(&body);
                    r.obj_version = u64::from(more);
                    return (r, Some(AlignedBuf::from_slice(&body)));
                }
                let most = if h.length == CHECK_DEEP {
                    CHUNK_DEEP
                } else {
                    CHUNK_LIGHT
                };
                if !b.len().is_multiple_of(16) || b.len() / 16 > most {
                    return refuse(Status::Invalid);
                }
                let oids = decode_oids(b);
                if oids.iter().any(|&o| !h.pg_id().holds(o, count)) {
                    return refuse(Status::Invalid);
                }
                let (tail, seen) = self
                    .scrub_check(h.pg_id(), &oids, h.length == CHECK_DEEP)
                    .await;
                let mut body = Vec::with_capacity(8 + seen.len() * SEEN_BYTES);
                body.extend_from_slice(&tail.to_le_bytes());
                for s in &seen {
                    s.encode(&mut body);
                }
                (
                    h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                )
            }
            _ => refuse(Status::Invalid),
        }
    }

    /// Scrubs the PGs this OSD is primary of as they come due, while it
    /// runs (holding it only while it looks or scrubs).
    pub(crate) async fn scrub_loop(me: std::rc::Weak<Self>) {
        loop {
            rt::sleep(SCHEDULE_TICK).await;
            let Some(me) = me.upgrade().filter(|o| !o.halted.get()) else {
                return;
            };
            if me.scrubbing.get().is_some() {
                continue;
            }
            let Some((pg, deep)) = me.scrub_next_due() else {
                continue;
            };
            // A complete scrub plans the PG's next ones (`scrub_pg`).
            if me.scrub_pg(pg, deep).await.error.is_some() {
                let later = rt::monotonic() + SCHEDULE_RETRY;
                let plan = me.scrub_plan(pg, me.scrub_cfg.get());
                let mut due = me.scrub_due.borrow_mut();
                let d = due.entry(pg).or_insert(plan);
                if deep {
                    d.1 = later;
                } else {
                    d.0 = later;
                }
            }
        }
    }

    /// When PG `pg`'s next light and deep scrubs are due, from when it
    /// was scrubbed (or first planned, which a PG with no history here
    /// is now).
    fn scrub_plan(&self, pg: PgId, cfg: ScrubConfig) -> (Duration, Duration) {
        let now = rt::monotonic().as_secs_f64();
        let h = *self.scrub_hist.borrow_mut().entry(pg).or_insert_with(|| {
            self.scrub_tell(ScrubNews::Planned {
                pg,
                at_unix_s: unix_now_s(),
            });
            History::planned(now)
        });
        // The fraction of an interval after its first plan that a PG
        // never scrubbed comes due: the same on every primary.
        let spread = f64::from(crc32c(&pg.key().to_le_bytes()) % 1000) / 1000.0;
        let due = |last: Option<f64>, i: Duration| {
            let at = last.map_or(h.first + spread * i.as_secs_f64(), |l| l + i.as_secs_f64());
            Duration::from_secs_f64(at.max(0.0))
        };
        // A deep scrub is a light one too.
        (
            due(latest(h.light, h.deep), cfg.interval),
            due(h.deep, cfg.deep_interval),
        )
    }

    /// The clean PG most overdue for a scrub, deep ones first.
    fn scrub_next_due(&self) -> Option<(PgId, bool)> {
        let cfg = self.scrub_cfg.get();
        if cfg.interval.is_zero() && cfg.deep_interval.is_zero() {
            // Nothing scheduled: nothing planned either (a first plan
            // recorded now would make every PG due at once the day
            // scrubs are turned on).
            return None;
        }
        let now = rt::monotonic();
        let pgs: Vec<PgId> = self.pgs.borrow().keys().copied().collect();
        let mut due = self.scrub_due.borrow_mut();
        let mut best: Option<(bool, Duration, PgId)> = None;
        for pg in pgs {
            if !self.is_clean(pg) {
                continue;
            }
            let d = *due.entry(pg).or_insert_with(|| self.scrub_plan(pg, cfg));
            let deep = !cfg.deep_interval.is_zero() && d.1 <= now;
            let light = !cfg.interval.is_zero() && d.0 <= now;
            if !deep && !light {
                continue;
            }
            let at = if deep { d.1 } else { d.0 };
            if best.is_none_or(|(bd, ba, _)| {
                (deep, std::cmp::Reverse(at)) > (bd, std::cmp::Reverse(ba))
            }) {
                best = Some((deep, at, pg));
            }
        }
        best.map(|(deep, _, pg)| (pg, deep))
    }
}

/// Object ids on the wire: 16 bytes each (volume, block; little-endian).
pub fn encode_oids(oids: &[ObjectId]) -> Vec<u8> {
    let mut b = Vec::with_capacity(oids.len() * 16);
    for o in oids {
        b.extend_from_slice(&o.volume.0.to_le_bytes());
        b.extend_from_slice(&o.block.to_le_bytes());
    }
    b
}

/// [`encode_oids`]'s bytes back (a length not a multiple of 16 is the
/// caller's to refuse; the rest is ignored).
pub(crate) fn decode_oids(b: &[u8]) -> Vec<ObjectId> {
    let at = |c: &[u8], i: usize| u64::from_le_bytes(c[i..i + 8].try_into().expect("8 bytes"));
    (b.chunks_exact(16))
        .map(|c| ObjectId::new(at(c, 0), at(c, 8)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(version: u64, digest: u32) -> Seen {
        Seen {
            version,
            logged: version,
            digest,
            flags: 0,
        }
    }

    fn damaged(version: u64) -> Seen {
        Seen {
            flags: DAMAGED,
            ..seen(version, 0)
        }
    }

    #[test]
    fn copies_that_agree_are_consistent_and_logs_below_the_tail_do_not_count() {
        let a = seen(0x105, 7);
        assert_eq!(
            judge(&[(0, a), (1, a), (2, a)], 0, 0, true),
            Verdict::Consistent
        );
        // One log trimmed the entry, the others not: at or below the
        // highest tail, the logs are not compared.
        let trimmed = Seen { logged: 0, ..a };
        assert_eq!(
            judge(&[(0, a), (1, trimmed), (2, a)], 0x105, 0, true),
            Verdict::Consistent
        );
        assert!(matches!(
            judge(&[(0, a), (1, trimmed), (2, a)], 0x104, 0, true),
            Verdict::Repair {
                version: 0x105,
                source: 0,
                ..
            }
        ));
        // Light: the bytes are not compared.
        let other = seen(0x105, 8);
        assert_eq!(
            judge(&[(0, a), (1, other)], 0, 0, false),
            Verdict::Consistent
        );
    }

    #[test]
    fn the_majority_of_readable_copies_is_the_authority_else_the_primary() {
        let good = seen(0x105, 7);
        let bad = seen(0x105, 9);
        // The primary's bytes are the odd ones: a replica's copy is read.
        assert!(matches!(
            judge(&[(0, bad), (1, good), (2, good)], 0, 0, true),
            Verdict::Repair {
                version: 0x105,
                digest: 7,
                source: 1,
                ..
            }
        ));
        // A damaged copy has no say; one each: the primary's.
        assert!(matches!(
            judge(&[(0, bad), (1, good), (2, damaged(0x105))], 0, 0, true),
            Verdict::Repair {
                digest: 9,
                source: 0,
                mend: None,
                ..
            }
        ));
        // Only a damaged copy differs: it is mended in place.
        assert!(matches!(
            judge(&[(0, good), (1, damaged(0x105)), (2, good)], 0, 0, true),
            Verdict::Repair { digest: 7, source: 0, mend: Some(m), .. } if m == [1]
        ));
        // Damaged at another version: every copy is rewritten.
        assert!(matches!(
            judge(&[(0, good), (1, damaged(0x104)), (2, good)], 0, 0, true),
            Verdict::Repair { mend: None, .. }
        ));
        // The primary damaged, the others split: no authority.
        assert!(matches!(
            judge(&[(0, damaged(0x105)), (1, good), (2, bad)], 0, 0, true),
            Verdict::Unrepairable { .. }
        ));
        // Only damaged copies.
        assert!(matches!(
            judge(&[(0, damaged(0x105)), (1, damaged(0x105))], 0, 0, true),
            Verdict::Unrepairable { .. }
        ));
        // A copy that lost the object: the others hold it, from the primary.
        assert!(matches!(
            judge(&[(0, good), (1, Seen::default()), (2, good)], 0, 0, true),
            Verdict::Repair {
                version: 0x105,
                source: 0,
                ..
            }
        ));
        // An object only one replica holds: absent is the authority.
        assert!(matches!(
            judge(
                &[(0, Seen::default()), (1, Seen::default()), (2, good)],
                0,
                0,
                false
            ),
            Verdict::Repair { version: 0, .. }
        ));
        // Two copies at different versions: the primary's.
        assert!(matches!(
            judge(&[(0, seen(0x106, 1)), (1, good)], 0, 0, false),
            Verdict::Repair {
                version: 0x106,
                source: 0,
                ..
            }
        ));
    }

    #[test]
    fn a_copy_that_contradicts_its_log_has_no_say() {
        let good = seen(0x105, 7);
        // The primary lost an object its log says it wrote: the replica's
        // copy is the authority, though one each.
        let lost = Seen { version: 0, ..good };
        assert!(matches!(
            judge(&[(0, lost), (1, good)], 0, 0, false),
            Verdict::Repair {
                version: 0x105,
                source: 1,
                mend: None,
                ..
            }
        ));
        // Or holds an older version than its log's write.
        let behind = Seen {
            version: 0x104,
            ..good
        };
        assert!(matches!(
            judge(&[(0, behind), (1, good), (2, behind)], 0, 0, false),
            Verdict::Repair {
                version: 0x105,
                source: 1,
                ..
            }
        ));
        // One each, no log to tell: never "absent" over a held copy.
        let unlogged = Seen { logged: 0, ..good };
        assert!(matches!(
            judge(&[(0, Seen::default()), (1, unlogged)], 0, 0, false),
            Verdict::Unrepairable { .. }
        ));
        // A copy still holding what its log says was deleted.
        let deleted = Seen {
            version: 0,
            logged: 0x106,
            flags: LOGGED_DELETE,
            ..Seen::default()
        };
        let kept = Seen {
            version: 0x105,
            ..deleted
        };
        assert!(kept.contradicts_log() && !deleted.contradicts_log());
        assert!(matches!(
            judge(&[(0, deleted), (1, kept)], 0, 0, false),
            Verdict::Repair { version: 0, .. }
        ));
        // Logs at or below the floor are not compared.
        assert_eq!(
            judge(&[(0, good), (1, unlogged)], 0x105, 0, false),
            Verdict::Consistent
        );
    }

    #[test]
    fn check_answers_round_trip_and_refuse_unknown_flags() {
        let s = Seen {
            version: 0x2_0000_0005,
            logged: 0x2_0000_0004,
            digest: 0xdead_beef,
            flags: DAMAGED | MOVED,
        };
        let mut b = Vec::new();
        s.encode(&mut b);
        assert_eq!(b.len(), SEEN_BYTES);
        assert_eq!(Seen::decode(&b), Ok(s));
        b[20] = 0x80;
        assert!(Seen::decode(&b).is_err());
        let oids = [ObjectId::new(1, 2), ObjectId::new(3, u64::MAX)];
        assert_eq!(decode_oids(&encode_oids(&oids)), oids);
    }
}
