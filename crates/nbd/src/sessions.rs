//! The gateway's open connections as the cluster sees them.
//!
//! Every connection that has chosen a volume is a session record in the
//! meta store (`map::SessionRecord`), on this gateway's lease, so `nacre
//! volume rm` and a shrink can tell that a volume is in use, and a
//! gateway that dies takes its records with it when the lease runs out.
//!
//! A control thread renews the lease and watches the volume records; the
//! gateway's runtime applies what it reports to the open connections:
//! - a volume deleted, marked deleting or replaced: its connections are
//!   cut (their in-flight I/O ends, later I/O fails with the connection);
//! - a new size: enforced at once (writes past it fail with ENOSPC), and
//!   once no I/O admitted at the old size still runs, written back into
//!   the session record; a shrink deletes the cut-off data only then.
//!
//! Registration happens before the handshake answers, and the record is
//! read again after it, so a volume marked deleting between the two is
//! still cut: no connection escapes a `volume rm`.
//!
//! Meta store calls block; they happen at connect and disconnect and on
//! volume changes, never per I/O.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nacre_client::{ClientError, Cluster, Volume};
use nacre_io::net::{Event, Stream};
use nacre_io::rt;
use nacre_meta::map::{self, SessionRecord, VolumeRecord};
use nacre_meta::{EventKind, MetaStore, Range};

/// Seconds a dead gateway's sessions outlive it.
pub const SESSION_LEASE_TTL_S: i64 = 10;
/// How often the control thread renews the lease and looks for a stop.
const CONTROL_TICK: Duration = Duration::from_secs(2);

/// A change of one volume record, from the control thread.
enum Change {
    Put(VolumeRecord),
    Gone(String),
}

/// What the control thread and the runtime share.
struct Shared {
    meta: Arc<dyn MetaStore>,
    /// Unique among gateways: it names the session keys.
    gateway: String,
    lease: AtomicI64,
    /// The records this gateway keeps, by connection, to put again under a
    /// new lease if the old one was lost.
    records: Mutex<HashMap<u64, SessionRecord>>,
    changes: Mutex<Vec<Change>>,
    wake: Event,
    stop: AtomicBool,
}

struct Open {
    vol: Rc<Volume>,
    stream: Rc<Stream>,
}

/// The sessions of one gateway.
pub struct Sessions {
    shared: Arc<Shared>,
    open: RefCell<HashMap<u64, Open>>,
    next_conn: Cell<u64>,
}

impl Drop for Sessions {
    fn drop(&mut self) {
        // No record is put again after this (see `renew`).
        self.shared.records.lock().expect("sessions lock").clear();
        self.shared.stop.store(true, Ordering::Relaxed);
        // A clean stop ends the sessions at once.
        let _ = self
            .shared
            .meta
            .lease_revoke(self.shared.lease.load(Ordering::Relaxed));
    }
}

impl Sessions {
    /// Takes a lease, starts the control thread and the task that applies
    /// volume changes (on the calling runtime).
    pub fn start(cluster: &Rc<Cluster>) -> std::io::Result<Rc<Sessions>> {
        let meta_err = |e: nacre_meta::MetaError| std::io::Error::other(e.to_string());
        let meta = cluster.meta().clone();
        let lease = meta.lease_grant(SESSION_LEASE_TTL_S).map_err(meta_err)?;
        // Lease ids are unique in the store: so is this name.
        let gateway = format!("nbd{lease}");
        let (_, rev) = (meta.range(&Range::prefix(&map::volume_prefix()))).map_err(meta_err)?;
        let watch =
            (meta.watch(&Range::prefix(&map::volume_prefix()), rev + 1)).map_err(meta_err)?;
        let shared = Arc::new(Shared {
            meta,
            gateway,
            lease: AtomicI64::new(lease),
            records: Mutex::new(HashMap::new()),
            changes: Mutex::new(Vec::new()),
            wake: Event::new()?,
            stop: AtomicBool::new(false),
        });
        {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("nbd-sessions".into())
                .spawn(move || control(&shared, watch))?;
        }
        let s = Rc::new(Sessions {
            shared,
            open: RefCell::new(HashMap::new()),
            next_conn: Cell::new(1),
        });
        rt::spawn(apply_changes(Rc::downgrade(&s)));
        Ok(s)
    }

    /// Registers a connection to `vol` before the handshake answers;
    /// returns its id, or why the volume cannot be served.
    pub fn register(
        &self,
        vol: &Rc<Volume>,
        stream: &Rc<Stream>,
        client: String,
    ) -> Result<u64, ClientError> {
        let id = self.next_conn.get();
        self.next_conn.set(id + 1);
        self.open.borrow_mut().insert(
            id,
            Open {
                vol: vol.clone(),
                stream: stream.clone(),
            },
        );
        let rec = vol.record();
        let s = SessionRecord {
            volume: rec.name.clone(),
            volume_id: rec.id,
            client,
            since_unix_s: map::now_s(),
            size_bytes: vol.size_bytes(),
        };
        let r = (|| {
            put_record(&self.shared, id, s)?;
            // Read again: a delete or resize that ran before the session
            // was visible must still reach this connection.
            let now = map::get_volume(&*self.shared.meta, &rec.name)?;
            match now {
                Some(v) if v.id == rec.id && !v.deleting => {
                    if v.size_bytes != vol.size_bytes() {
                        let g = vol.set_size(v.size_bytes);
                        rt::spawn(settle(vol.clone(), g, self.shared.clone(), id));
                    }
                    Ok(())
                }
                Some(v) if v.deleting => Err(ClientError::InUse(format!(
                    "volume {:?} is being deleted",
                    v.name
                ))),
                _ => Err(ClientError::NoVolume(rec.name.clone())),
            }
        })();
        if let Err(e) = r {
            self.unregister(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Ends a connection's session.
    pub fn unregister(&self, id: u64) {
        let Some(o) = self.open.borrow_mut().remove(&id) else {
            return;
        };
        self.shared
            .records
            .lock()
            .expect("sessions lock")
            .remove(&id);
        let sh = &self.shared;
        if let Err(e) = map::delete_session(&*sh.meta, &sh.gateway, id, o.vol.record().id) {
            tracing::warn!("nbd: ending the session of connection {id}: {e}");
        }
    }
}

/// Puts session `id`'s record under the current lease.
fn put_record(sh: &Shared, id: u64, s: SessionRecord) -> Result<(), ClientError> {
    map::put_session(
        &*sh.meta,
        &sh.gateway,
        id,
        &s,
        sh.lease.load(Ordering::Relaxed),
    )?;
    sh.records.lock().expect("sessions lock").insert(id, s);
    Ok(())
}

/// Once nothing admitted before size generation `g` of `vol` runs, writes
/// the size into session `id`, unless a newer size came meanwhile (its own
/// task writes that one).
async fn settle(vol: Rc<Volume>, g: u64, sh: Arc<Shared>, id: u64) {
    vol.settled(g).await;
    let size = vol.size_bytes();
    if vol.generation() != g {
        return;
    }
    let Some(mut s) = sh.records.lock().expect("sessions lock").get(&id).cloned() else {
        return;
    };
    s.size_bytes = size;
    if let Err(e) = put_record(&sh, id, s) {
        tracing::warn!("nbd: recording the new size of connection {id}: {e}");
    }
}

/// Applies the control thread's volume changes to the open connections,
/// for as long as the sessions live.
async fn apply_changes(s: std::rc::Weak<Sessions>) {
    loop {
        let Some(me) = s.upgrade() else { return };
        let sh = me.shared.clone();
        drop(me);
        if sh.wake.wait().await.is_err() {
            return;
        }
        let Some(me) = s.upgrade() else { return };
        let changes = std::mem::take(&mut *sh.changes.lock().expect("sessions lock"));
        for c in changes {
            let (name, rec) = match c {
                Change::Put(v) => (v.name.clone(), Some(v)),
                Change::Gone(n) => (n, None),
            };
            let open: Vec<(u64, Rc<Volume>, Rc<Stream>)> = (me.open.borrow().iter())
                .filter(|(_, o)| o.vol.record().name == name)
                .map(|(id, o)| (*id, o.vol.clone(), o.stream.clone()))
                .collect();
            for (id, vol, stream) in open {
                match &rec {
                    Some(v) if v.id == vol.record().id && !v.deleting => {
                        if v.size_bytes != vol.size_bytes() {
                            tracing::info!(
                                "nbd {name}: connection {id} now sees {} bytes",
                                v.size_bytes
                            );
                            let g = vol.set_size(v.size_bytes);
                            rt::spawn(settle(vol, g, sh.clone(), id));
                        }
                    }
                    _ => {
                        tracing::info!("nbd {name}: volume deleted; cutting connection {id}");
                        stream.shutdown();
                    }
                }
            }
        }
    }
}

/// The control thread: renews the lease (a lost one is replaced and the
/// sessions put again under the new one) and forwards volume changes.
fn control(sh: &Shared, mut watch: nacre_meta::Watch) {
    let mut last_renew = std::time::Instant::now();
    while !sh.stop.load(Ordering::Relaxed) {
        match watch.next(CONTROL_TICK) {
            Ok(Some(events)) => {
                let mut out = Vec::new();
                for e in events {
                    match e.kind {
                        EventKind::Put => match serde_json::from_slice::<VolumeRecord>(&e.kv.value)
                        {
                            Ok(v) => out.push(Change::Put(v)),
                            Err(err) => tracing::warn!("nbd: volume record {}: {err}", e.kv.key),
                        },
                        EventKind::Delete => {
                            let name = e.kv.key.trim_start_matches(&map::volume_prefix());
                            out.push(Change::Gone(name.to_string()));
                        }
                    }
                }
                sh.changes.lock().expect("sessions lock").extend(out);
                sh.wake.signal();
            }
            Ok(None) => {}
            Err(e) => {
                // Watch again from now, and have every open volume
                // checked against its record.
                tracing::warn!("nbd: volume watch ended ({e}); watching again");
                std::thread::sleep(CONTROL_TICK);
                match rewatch(sh) {
                    Ok(w) => watch = w,
                    Err(e) => tracing::warn!("nbd: volume watch: {e}"),
                }
            }
        }
        if sh.stop.load(Ordering::Relaxed) {
            return;
        }
        if last_renew.elapsed() >= CONTROL_TICK {
            last_renew = std::time::Instant::now();
            renew(sh);
        }
    }
}

/// A new watch, and every current record as a change (what happened
/// between the two watches is in them).
fn rewatch(sh: &Shared) -> nacre_meta::Result<nacre_meta::Watch> {
    let (kvs, rev) = sh.meta.range(&Range::prefix(&map::volume_prefix()))?;
    let w = sh
        .meta
        .watch(&Range::prefix(&map::volume_prefix()), rev + 1)?;
    let mut changes: Vec<Change> = Vec::new();
    let known: Vec<String> = (sh.records.lock().expect("sessions lock").values())
        .map(|s| s.volume.clone())
        .collect();
    for name in known {
        let v = kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<VolumeRecord>(&kv.value).ok())
            .find(|v| v.name == name);
        changes.push(v.map_or(Change::Gone(name), Change::Put));
    }
    sh.changes.lock().expect("sessions lock").extend(changes);
    sh.wake.signal();
    Ok(w)
}

fn renew(sh: &Shared) {
    let lease = sh.lease.load(Ordering::Relaxed);
    if sh.meta.lease_keepalive(lease).is_ok() || sh.stop.load(Ordering::Relaxed) {
        return;
    }
    let Ok(new) = sh.meta.lease_grant(SESSION_LEASE_TTL_S) else {
        tracing::warn!("nbd: cannot renew the sessions' lease");
        return;
    };
    tracing::warn!("nbd: the sessions' lease {lease} was lost; putting them again under {new}");
    sh.lease.store(new, Ordering::Relaxed);
    let _ = sh.meta.lease_revoke(lease);
    let records: Vec<(u64, SessionRecord)> = (sh.records.lock().expect("sessions lock").iter())
        .map(|(id, s)| (*id, s.clone()))
        .collect();
    for (id, s) in records {
        if let Err(e) = map::put_session(&*sh.meta, &sh.gateway, id, &s, new) {
            tracing::warn!("nbd: session of connection {id}: {e}");
        }
    }
}
