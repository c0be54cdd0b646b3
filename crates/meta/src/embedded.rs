//! The embedded meta store: the whole key space in memory, every change
//! appended to a log under the data dir and fsync'd before it is applied
//! or answered.
//!
//! Crash argument: a change is visible (to readers, watchers, the caller)
//! only after its log record is durable, so a restart replays every change
//! anyone saw. A torn record can only be the last one, never acknowledged;
//! replay stops there and truncates it. An append or sync that fails while
//! the store runs is cut back off the log before the change is refused, so
//! no later, acknowledged record ever follows a torn one; if the cut fails
//! too, the store refuses every change until it is reopened. The log is compacted into a
//! snapshot written to a temporary file, fsync'd and renamed over the old
//! one before the log is cut; records at or below the snapshot's revision
//! are skipped, so a crash between the rename and the cut is harmless. The
//! log is opened for appending, so a record always lands at the end of the
//! file as it is after a cut (a torn tail dropped, a compaction): written
//! at the old position, it would leave a hole the next replay stops at.
//!
//! Leases survive restarts with their TTL re-armed (as etcd does when its
//! leader changes); keys of an expired lease are deleted by a reaper thread
//! as one logged change.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::types::*;

/// Revisions of history kept for watches that start in the past.
const HISTORY_MAX_REVISIONS: usize = 10_000;
/// Event batches queued per watcher before it is dropped as too slow.
const WATCH_QUEUE_MAX: usize = 4096;
/// The log is folded into a snapshot when it grows beyond this.
const LOG_COMPACT_BYTES: u64 = 8 << 20;
/// Largest log record accepted at replay (a sanity bound, not a limit on use).
const RECORD_MAX_BYTES: u32 = 64 << 20;
/// Largest value a put may store.
pub const VALUE_MAX_BYTES: usize = 1 << 20;
const REAP_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Serialize, Deserialize, Debug)]
enum Change {
    Put(KeyValue),
    Delete(String),
}

#[derive(Serialize, Deserialize, Debug)]
struct Record {
    rev: Revision,
    changes: Vec<Change>,
    lease_grant: Option<(LeaseId, i64)>,
    lease_revoke: Option<LeaseId>,
}

#[derive(Serialize, Deserialize, Default)]
struct Snapshot {
    rev: Revision,
    next_lease: LeaseId,
    kvs: Vec<KeyValue>,
    leases: Vec<(LeaseId, i64)>,
}

struct Lease {
    ttl_s: i64,
    deadline: Instant,
    keys: BTreeSet<String>,
}

struct Watcher {
    id: u64,
    range: Range,
    tx: SyncSender<Result<Vec<Event>>>,
}

struct State {
    rev: Revision,
    next_lease: LeaseId,
    kvs: BTreeMap<String, KeyValue>,
    leases: HashMap<LeaseId, Lease>,
    history: VecDeque<(Revision, Vec<Event>)>,
    /// Every revision from this one on is in `history`.
    history_from: Revision,
    watchers: Vec<Watcher>,
    next_watcher: u64,
    log: Box<dyn LogFile>,
    log_bytes: u64,
    /// Why the log could not be cut back after a failed append: no record
    /// may follow the torn one, so every later change is refused until a
    /// restart replays the log (and drops the torn tail).
    failed: Option<String>,
    dir: PathBuf,
}

/// The log file as the store writes it (a trait so that tests can make
/// appends, syncs and cuts fail).
trait LogFile: Send {
    /// Writes `bytes` at the end of the file.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Makes what was appended durable.
    fn sync(&mut self) -> std::io::Result<()>;
    /// Cuts the file to `len` bytes, durably.
    fn cut(&mut self, len: u64) -> std::io::Result<()>;
}

impl LogFile for File {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write_all(bytes)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.sync_data()
    }
    fn cut(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)?;
        self.sync_all()
    }
}

pub struct Embedded {
    st: Arc<Mutex<State>>,
    _lock: File,
}

fn storage(what: &str, e: impl std::fmt::Display) -> MetaError {
    MetaError::Storage(format!("{what}: {e}"))
}

fn lock_dir(dir: &Path) -> Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(|e| storage("lock file", e))?;
    // SAFETY: flock on our own descriptor.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(MetaError::Unavailable(format!(
            "{} is in use by another process",
            dir.display()
        )));
    }
    Ok(f)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| storage("sync dir", e))
}

fn frame(rec: &impl Serialize) -> Vec<u8> {
    let body = serde_json::to_vec(rec).expect("records serialise");
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&nacre_types::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Splits a log into records; returns them and the length of the valid prefix.
fn parse_log(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut recs = Vec::new();
    let mut pos = 0;
    while bytes.len() - pos >= 8 {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
        if len > RECORD_MAX_BYTES || bytes.len() - pos - 8 < len as usize {
            break;
        }
        let body = &bytes[pos + 8..pos + 8 + len as usize];
        if nacre_types::crc32c(body) != crc {
            break;
        }
        match serde_json::from_slice::<Record>(body) {
            Ok(r) => recs.push(r),
            Err(_) => break,
        }
        pos += 8 + len as usize;
    }
    (recs, pos)
}

impl Embedded {
    /// Opens (or creates) the store in `dir`, replaying its log.
    pub fn open(dir: &Path) -> Result<Arc<Embedded>> {
        Self::open_with(dir, |f| Box::new(f))
    }

    /// [`Embedded::open`], the log file wrapped by `wrap`.
    fn open_with(dir: &Path, wrap: impl FnOnce(File) -> Box<dyn LogFile>) -> Result<Arc<Embedded>> {
        std::fs::create_dir_all(dir).map_err(|e| storage("create dir", e))?;
        let lock = lock_dir(dir)?;
        let snap: Snapshot = match std::fs::read(dir.join("snapshot")) {
            Ok(b) => {
                // Written whole and renamed into place: any damage is real.
                let len = b
                    .get(..4)
                    .map(|l| u32::from_le_bytes(l.try_into().expect("4 bytes")));
                let body = b.get(8..).filter(|body| Some(body.len() as u32) == len);
                let body = body.ok_or_else(|| storage("snapshot", "truncated"))?;
                let crc = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
                if nacre_types::crc32c(body) != crc {
                    return Err(storage("snapshot", "checksum mismatch"));
                }
                serde_json::from_slice(body).map_err(|e| storage("snapshot", e))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Snapshot::default(),
            Err(e) => return Err(storage("read snapshot", e)),
        };
        let log_path = dir.join("log");
        // Append mode: every record goes to the end of the file as it is,
        // also after a torn tail was cut or a compaction emptied it. (A
        // plain write would go to the file position from before the cut,
        // leaving a hole of zeros that the next replay takes for a torn
        // record at offset 0, dropping everything after it.)
        let mut log = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| storage("open log", e))?;
        let mut bytes = Vec::new();
        log.read_to_end(&mut bytes)
            .map_err(|e| storage("read log", e))?;
        let (recs, valid) = parse_log(&bytes);
        if valid < bytes.len() {
            tracing::warn!(
                "meta log: dropping a torn tail of {} bytes at offset {valid}",
                bytes.len() - valid
            );
            log.set_len(valid as u64)
                .map_err(|e| storage("truncate log", e))?;
            log.sync_all().map_err(|e| storage("sync log", e))?;
        }
        let now = Instant::now();
        let mut st = State {
            rev: snap.rev,
            next_lease: snap.next_lease.max(1),
            kvs: snap
                .kvs
                .into_iter()
                .map(|kv| (kv.key.clone(), kv))
                .collect(),
            leases: snap
                .leases
                .into_iter()
                .map(|(id, ttl_s)| {
                    let l = Lease {
                        ttl_s,
                        deadline: now + Duration::from_secs(ttl_s as u64),
                        keys: BTreeSet::new(),
                    };
                    (id, l)
                })
                .collect(),
            history: VecDeque::new(),
            history_from: 0,
            watchers: Vec::new(),
            next_watcher: 0,
            log: wrap(log),
            log_bytes: valid as u64,
            failed: None,
            dir: dir.to_path_buf(),
        };
        for mut r in recs {
            // Left over from a crash between snapshot and log cut: the
            // snapshot has these changes. Lease grants and revokes replay
            // in order and end where the snapshot is.
            if r.rev <= snap.rev {
                r.changes.clear();
            }
            st.apply(r, now);
        }
        for kv in st.kvs.values() {
            if kv.lease != 0 {
                if let Some(l) = st.leases.get_mut(&kv.lease) {
                    l.keys.insert(kv.key.clone());
                }
            }
        }
        st.history.clear();
        st.history_from = st.rev + 1;
        let st = Arc::new(Mutex::new(st));
        let weak = Arc::downgrade(&st);
        std::thread::Builder::new()
            .name("meta-reaper".into())
            .spawn(move || reaper(weak))
            .map_err(|e| storage("spawn reaper", e))?;
        Ok(Arc::new(Embedded { st, _lock: lock }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves memory that matches the log
        // up to the panic; keep serving.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn reaper(st: Weak<Mutex<State>>) {
    loop {
        std::thread::sleep(REAP_INTERVAL);
        let Some(st) = st.upgrade() else { return };
        let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let expired: Vec<LeaseId> = (st.leases.iter())
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Err(e) = st.revoke(id) {
                tracing::warn!("meta store: expiring lease {id}: {e}");
            }
        }
    }
}

impl State {
    /// Applies a durable record to memory and feeds watchers.
    fn apply(&mut self, r: Record, now: Instant) {
        if let Some((id, ttl_s)) = r.lease_grant {
            self.leases.insert(
                id,
                Lease {
                    ttl_s,
                    deadline: now + Duration::from_secs(ttl_s as u64),
                    keys: BTreeSet::new(),
                },
            );
            self.next_lease = self.next_lease.max(id + 1);
        }
        let mut events = Vec::new();
        for c in r.changes {
            match c {
                Change::Put(kv) => {
                    if let Some(old) = self.kvs.get(&kv.key) {
                        if old.lease != 0 && old.lease != kv.lease {
                            if let Some(l) = self.leases.get_mut(&old.lease) {
                                l.keys.remove(&kv.key);
                            }
                        }
                    }
                    if let Some(l) = self.leases.get_mut(&kv.lease) {
                        l.keys.insert(kv.key.clone());
                    }
                    self.kvs.insert(kv.key.clone(), kv.clone());
                    events.push(Event {
                        kind: EventKind::Put,
                        kv,
                    });
                }
                Change::Delete(k) => {
                    if let Some(mut old) = self.kvs.remove(&k) {
                        if let Some(l) = self.leases.get_mut(&old.lease) {
                            l.keys.remove(&k);
                        }
                        old.mod_revision = r.rev;
                        events.push(Event {
                            kind: EventKind::Delete,
                            kv: old,
                        });
                    }
                }
            }
        }
        if let Some(id) = r.lease_revoke {
            self.leases.remove(&id);
        }
        self.rev = self.rev.max(r.rev);
        if events.is_empty() {
            return;
        }
        self.watchers.retain(|w| {
            let mine: Vec<Event> = (events.iter())
                .filter(|e| w.range.contains(&e.kv.key))
                .cloned()
                .collect();
            if mine.is_empty() {
                return true;
            }
            match w.tx.try_send(Ok(mine)) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    tracing::warn!("meta store: dropping watcher {} (too slow)", w.id);
                    false
                }
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
        self.history.push_back((r.rev, events));
        while self.history.len() > HISTORY_MAX_REVISIONS {
            if let Some((rev, _)) = self.history.pop_front() {
                self.history_from = rev + 1;
            }
        }
    }

    /// Makes `r` durable, then applies it. A record that fails to append
    /// or to sync is cut from the log before the error returns: a torn
    /// record followed by acknowledged ones would make replay stop at it
    /// and drop them (a counter rolled back, an id given out twice). If
    /// the cut fails too, the store takes no more changes.
    fn commit(&mut self, r: Record) -> Result<()> {
        if let Some(why) = &self.failed {
            return Err(storage(
                "meta log",
                format!("failed earlier and takes no more changes until a restart: {why}"),
            ));
        }
        let bytes = frame(&r);
        let written = self.log.append(&bytes).map_err(|e| ("append", e));
        if let Err((what, e)) = written.and_then(|()| self.log.sync().map_err(|e| ("sync", e))) {
            if let Err(cut) = self.log.cut(self.log_bytes) {
                tracing::error!(
                    "meta log: a failed {what} ({e}) could not be cut back ({cut}): no more changes until a restart"
                );
                self.failed = Some(format!("{what}: {e}; cutting it back: {cut}"));
            }
            return Err(storage(&format!("{what} log"), e));
        }
        self.log_bytes += bytes.len() as u64;
        self.apply(r, Instant::now());
        // The change is durable and applied: a compaction that fails
        // leaves a longer log, tried again at the next change.
        if self.log_bytes > LOG_COMPACT_BYTES {
            if let Err(e) = self.compact() {
                tracing::warn!("meta log: compaction: {e}");
            }
        }
        Ok(())
    }

    fn compact(&mut self) -> Result<()> {
        let snap = Snapshot {
            rev: self.rev,
            next_lease: self.next_lease,
            kvs: self.kvs.values().cloned().collect(),
            leases: self.leases.iter().map(|(id, l)| (*id, l.ttl_s)).collect(),
        };
        let tmp = self.dir.join("snapshot.tmp");
        let mut f = File::create(&tmp).map_err(|e| storage("snapshot", e))?;
        f.write_all(&frame(&snap))
            .map_err(|e| storage("snapshot", e))?;
        f.sync_all().map_err(|e| storage("snapshot", e))?;
        std::fs::rename(&tmp, self.dir.join("snapshot")).map_err(|e| storage("snapshot", e))?;
        sync_dir(&self.dir)?;
        // Every record of the log is in the snapshot (replay skips those a
        // failed cut leaves).
        match self.log.cut(0) {
            Ok(()) => {
                self.log_bytes = 0;
                Ok(())
            }
            Err(e) => {
                // Its length is unknown now: no record may be appended
                // where a later cut back could open a hole.
                self.failed = Some(format!("cutting the log after a compaction: {e}"));
                Err(storage("cut log", e))
            }
        }
    }

    fn range(&self, r: &Range) -> Vec<KeyValue> {
        match &r.end {
            None => self.kvs.get(&r.key).cloned().into_iter().collect(),
            Some(end) if end.as_str() > r.key.as_str() => (self.kvs)
                .range::<str, _>((
                    std::ops::Bound::Included(r.key.as_str()),
                    std::ops::Bound::Excluded(end.as_str()),
                ))
                .map(|(_, v)| v.clone())
                .collect(),
            Some(_) => Vec::new(),
        }
    }

    fn txn(&mut self, t: Txn) -> Result<TxnResponse> {
        let ok = t.compare.iter().all(|c| c.holds(self.kvs.get(c.key())));
        let ops = if ok { t.success } else { t.failure };
        let rev = self.rev + 1;
        // Work on a copy of the touched keys so that ops inside one
        // transaction see each other, then commit all changes at once.
        let mut view: BTreeMap<String, Option<KeyValue>> = BTreeMap::new();
        let mut changes = Vec::new();
        let mut results = Vec::new();
        for op in ops {
            match op {
                TxnOp::Put { key, value, lease } => {
                    if key.is_empty() {
                        return Err(MetaError::Invalid("empty key".into()));
                    }
                    if value.len() > VALUE_MAX_BYTES {
                        return Err(MetaError::Invalid(format!(
                            "value of {} bytes exceeds {VALUE_MAX_BYTES}",
                            value.len()
                        )));
                    }
                    if lease != 0 && !self.leases.contains_key(&lease) {
                        return Err(MetaError::LeaseNotFound(lease));
                    }
                    let cur = match view.get(&key) {
                        Some(v) => v.clone(),
                        None => self.kvs.get(&key).cloned(),
                    };
                    let kv = KeyValue {
                        key: key.clone(),
                        value,
                        create_revision: cur.as_ref().map_or(rev, |c| c.create_revision),
                        mod_revision: rev,
                        version: cur.as_ref().map_or(1, |c| c.version + 1),
                        lease,
                    };
                    view.insert(key, Some(kv.clone()));
                    changes.push(Change::Put(kv));
                    results.push(OpResult::Put);
                }
                TxnOp::Delete(r) => {
                    let mut keys: BTreeSet<String> =
                        self.range(&r).into_iter().map(|kv| kv.key).collect();
                    for (k, v) in &view {
                        if r.contains(k) {
                            if v.is_some() {
                                keys.insert(k.clone());
                            } else {
                                keys.remove(k);
                            }
                        }
                    }
                    for k in &keys {
                        view.insert(k.clone(), None);
                        changes.push(Change::Delete(k.clone()));
                    }
                    results.push(OpResult::Delete(keys.len() as u64));
                }
                TxnOp::Get(r) => {
                    let mut got: BTreeMap<String, KeyValue> = self
                        .range(&r)
                        .into_iter()
                        .map(|kv| (kv.key.clone(), kv))
                        .collect();
                    for (k, v) in &view {
                        if r.contains(k) {
                            match v {
                                Some(kv) => got.insert(k.clone(), kv.clone()),
                                None => got.remove(k),
                            };
                        }
                    }
                    results.push(OpResult::Get(got.into_values().collect()));
                }
            }
        }
        if !changes.is_empty() {
            self.commit(Record {
                rev,
                changes,
                lease_grant: None,
                lease_revoke: None,
            })?;
        }
        Ok(TxnResponse {
            succeeded: ok,
            revision: self.rev,
            results,
        })
    }

    fn revoke(&mut self, id: LeaseId) -> Result<()> {
        let l = self.leases.get(&id).ok_or(MetaError::LeaseNotFound(id))?;
        let changes = l.keys.iter().map(|k| Change::Delete(k.clone())).collect();
        self.commit(Record {
            rev: self.rev + 1,
            changes,
            lease_grant: None,
            lease_revoke: Some(id),
        })
    }
}

impl MetaStore for Embedded {
    fn range(&self, r: &Range) -> Result<(Vec<KeyValue>, Revision)> {
        let st = self.state();
        Ok((st.range(r), st.rev))
    }

    fn txn(&self, t: Txn) -> Result<TxnResponse> {
        self.state().txn(t)
    }

    fn watch(&self, r: &Range, start: Revision) -> Result<Watch> {
        let mut st = self.state();
        let (tx, rx) = sync_channel(WATCH_QUEUE_MAX);
        if start != 0 && start <= st.rev {
            if start < st.history_from {
                return Err(MetaError::Compacted {
                    asked: start,
                    oldest: st.history_from,
                });
            }
            for (rev, evs) in &st.history {
                if *rev < start {
                    continue;
                }
                let mine: Vec<Event> = evs
                    .iter()
                    .filter(|e| r.contains(&e.kv.key))
                    .cloned()
                    .collect();
                if !mine.is_empty() && tx.try_send(Ok(mine)).is_err() {
                    return Err(MetaError::Invalid(
                        "watch backlog too long; start later".into(),
                    ));
                }
            }
        }
        let id = st.next_watcher;
        st.next_watcher += 1;
        st.watchers.push(Watcher {
            id,
            range: r.clone(),
            tx,
        });
        let weak = Arc::downgrade(&self.st);
        Ok(Watch {
            rx,
            cancel: Some(Box::new(move || {
                if let Some(st) = weak.upgrade() {
                    let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
                    st.watchers.retain(|w| w.id != id);
                }
            })),
        })
    }

    fn lease_grant(&self, ttl_s: i64) -> Result<LeaseId> {
        if !(1..=86_400).contains(&ttl_s) {
            return Err(MetaError::Invalid(format!(
                "lease TTL {ttl_s} s outside 1..=86400"
            )));
        }
        let mut st = self.state();
        let id = st.next_lease;
        let rev = st.rev;
        st.commit(Record {
            rev,
            changes: Vec::new(),
            lease_grant: Some((id, ttl_s)),
            lease_revoke: None,
        })?;
        Ok(id)
    }

    fn lease_keepalive(&self, id: LeaseId) -> Result<i64> {
        let mut st = self.state();
        let l = st.leases.get_mut(&id).ok_or(MetaError::LeaseNotFound(id))?;
        l.deadline = Instant::now() + Duration::from_secs(l.ttl_s as u64);
        Ok(l.ttl_s)
    }

    fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        self.state().revoke(id)
    }
}

#[cfg(test)]
mod tests;
