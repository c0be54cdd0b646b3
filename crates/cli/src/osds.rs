//! OSD processes of a one-machine cluster: [`run`] is one OSD in the
//! foreground (`nacre osd run`, what `nacre up` starts for each OSD), and
//! [`Supervisor`] is the part of `nacre up` that starts them, restarts one
//! that dies, starts one again on request (`nacre osd start`) and stops
//! them at the end.
//!
//! Every OSD is a child process, so `kill -9` of one OSD leaves the rest of
//! the cluster and the gateway running, as the loss of one disk's daemon
//! does on a real cluster. The children die with `nacre up` however it
//! ends (`PR_SET_PDEATHSIG`, as after a power cut of the machine), so a
//! restart finds no stragglers; each child's pid is in `DIR/osd.N.pid`
//! while it runs. They run in their own process group: Ctrl-C at the
//! terminal reaches `nacre up` only, which stops them in order.
//!
//! An OSD holds its `up` key in the meta store under a lease it renews
//! while it runs (its value: the pid and the epoch the leader marked it up
//! in, its incarnation); `nacre status` reports it up from that. When the
//! supervisor reaps an OSD's process it deletes the key, so the OSD shows
//! down at once, not when the lease expires, and tells the leader that
//! this incarnation is dead (`Op::Dead`), which marks it down at once
//! instead of after the heartbeat grace: the PGs re-peer without it in
//! well under a second. (A process that is dead serves no read, so its
//! read lease need not run out first.) The key follows the incarnation
//! when the OSD boots again while running, and is put again under a new
//! lease if a stopped process let the old one run out.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nacre_io::net::{Event, Listener};
use nacre_io::rt;
use nacre_meta::map;
use nacre_meta::remote::Remote;
use nacre_meta::{MetaError, MetaStore, Range};
use nacre_osd::{Osd, OsdConfig};
use nacre_types::{ObjectId, PgId};
use nacre_wire::{Header, Op, Status};

use crate::cluster;
use crate::commands::{block_stop_signals, signal_name, wait_for_signal};

/// TTL of an OSD's `up` lease: how long a hung OSD (alive, not renewing)
/// still shows up.
const LEASE_TTL_S: i64 = 10;
const KEEPALIVE_EVERY: Duration = Duration::from_secs(2);
/// Delay before the first restart of an OSD that died; it doubles while
/// the OSD keeps dying within [`RESTART_STABLE`] of its start, up to
/// [`RESTART_DELAY_MAX`].
pub const RESTART_DELAY: Duration = Duration::from_secs(5);
const RESTART_DELAY_MAX: Duration = Duration::from_secs(80);
const RESTART_STABLE: Duration = Duration::from_secs(60);
/// How long a stopping OSD may take to close its store (a checkpoint)
/// after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child of an earlier `nacre up` (killed with it) may take to
/// die before a new start refuses to run beside it.
const STRAGGLER_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(100);
/// How long the supervisor waits for the leader to take a `Dead` report.
const DEAD_REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// The value of an OSD's `up` key: its pid and the epoch it was marked up
/// in (its incarnation).
fn up_value(pid: u32, up_from: u64) -> Vec<u8> {
    format!("{pid} {up_from}").into_bytes()
}

/// The pid and incarnation in an `up` key's value.
pub fn parse_up(v: &[u8]) -> Option<(u32, u64)> {
    let (pid, up_from) = std::str::from_utf8(v).ok()?.split_once(' ')?;
    Some((pid.parse().ok()?, up_from.parse().ok()?))
}

/// Where `nacre osd start` asks the supervisor of `nacre up` to start an
/// OSD (the supervisor deletes the key when it has acted on it).
fn start_key(id: u32) -> String {
    format!("/nacre/ctl/start/osd/{id:05}")
}
const START_PREFIX: &str = "/nacre/ctl/start/osd/";

pub fn pid_file(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("osd.{id}.pid"))
}

/// The pid in `path`, if that process still runs and is a `nacre`.
pub fn live_pid(path: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let nacre = exe
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("nacre"));
    (nacre && nacre_io::file::process_alive(pid)).then_some(pid)
}

fn no_such_osd(dir: &Path, id: u32, m: &map::ClusterMap) -> anyhow::Error {
    let ids: Vec<String> = m.osds.iter().map(|r| format!("osd.{}", r.id)).collect();
    anyhow::anyhow!(
        "the cluster in {} has no osd.{id}; its OSDs are {}",
        dir.display(),
        ids.join(", ")
    )
}

/// What `nacre osd run` needs besides the cluster's map.
#[derive(Clone, Debug)]
pub struct RunOpts {
    pub dir: PathBuf,
    pub id: u32,
    /// Size of the store file if it does not exist yet.
    pub create_bytes: u64,
    pub journal_bytes: Option<u64>,
    /// Background recovery's pace, in bytes per second.
    pub recovery_bytes_per_s: u64,
    /// The used fractions at which the store is near full and full.
    pub ratios: (f64, f64),
    pub scrub: nacre_osd::ScrubConfig,
    /// Where to serve the OSD's metrics (HOST:PORT; `nacre up` serves its
    /// OSDs' on its own endpoint instead).
    pub metrics: Option<String>,
}

impl RunOpts {
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            "osd".into(),
            "run".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--id".into(),
            self.id.to_string(),
            "--create-size".into(),
            self.create_bytes.to_string(),
            "--recovery-rate".into(),
            self.recovery_bytes_per_s.to_string(),
            "--nearfull-ratio".into(),
            self.ratios.0.to_string(),
            "--full-ratio".into(),
            self.ratios.1.to_string(),
        ];
        if let Some(j) = self.journal_bytes {
            a.extend(["--journal-size".into(), j.to_string()]);
        }
        a.extend(crate::args::scrub_flags(&self.scrub));
        a
    }
}

/// Holds an OSD's `up` key under a lease renewed from a thread of its own;
/// revokes it (the key goes with it) when dropped.
struct UpLease {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UpLease {
    /// Puts the key and renews it, from a thread of its own (no call to
    /// the meta store ever waits on the OSD's thread; one that cannot be
    /// reached is tried again every [`KEEPALIVE_EVERY`]). The key follows
    /// the OSD's incarnation (`up_from`, which changes when it boots again
    /// after being marked down while running), and is put again under a
    /// new lease if the old one ran out (a process stopped for longer than
    /// the TTL).
    fn hold(meta: Arc<dyn MetaStore>, id: u32, up_from: Arc<AtomicU64>) -> anyhow::Result<UpLease> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("lease".into())
            .spawn(move || {
                let mut lease = None::<i64>;
                let mut published = None::<u64>;
                let mut last = None::<Instant>;
                while !stop2.load(Ordering::Acquire) {
                    let inc = up_from.load(Ordering::Acquire);
                    let due = last.is_none_or(|t| t.elapsed() >= KEEPALIVE_EVERY);
                    if due || published != Some(inc) {
                        last = Some(Instant::now());
                        if let Err(e) = renew(&*meta, id, &mut lease, &mut published, inc) {
                            tracing::warn!("osd.{id}: up lease: {e:#}");
                        }
                    }
                    std::thread::sleep(POLL);
                }
                if let Some(l) = lease {
                    let _ = meta.lease_revoke(l);
                }
            })?;
        Ok(UpLease {
            stop,
            thread: Some(thread),
        })
    }
}

/// Records an OSD's scrub news in the cluster's scrub stamps
/// (`map::ScrubStamp`), from a thread of its own: the OSD's thread only
/// hands the news over. News the meta store refused is tried again (at
/// most [`NEWS_PENDING_MAX`] kept); what is pending when it is dropped is
/// tried once more, then lost. A first plan of a PG the cluster has a
/// stamp of (another primary's, written since this OSD read them) hands
/// that stamp back, for the OSD to plan from (`known`).
struct StampWriter {
    news: Arc<Mutex<Vec<nacre_osd::ScrubNews>>>,
    known: Arc<Mutex<BTreeMap<PgId, map::ScrubStamp>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

const NEWS_PENDING_MAX: usize = 4096;

impl StampWriter {
    fn spawn(meta: Arc<dyn MetaStore>, id: u32) -> anyhow::Result<StampWriter> {
        let news = Arc::new(Mutex::new(Vec::new()));
        let known = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (news2, known2, stop2) = (news.clone(), known.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("scrub-stamps".into())
            .spawn(move || {
                let mut pending = Vec::new();
                let mut failed_at = None::<Instant>;
                loop {
                    let stopping = stop2.load(Ordering::Acquire);
                    pending.append(&mut news2.lock().expect("news"));
                    let wait = failed_at.is_some_and(|t| t.elapsed() < KEEPALIVE_EVERY);
                    if !pending.is_empty() && (!wait || stopping) {
                        // In order, until the meta store refuses one.
                        let now = map::now_s();
                        let mut done = 0;
                        for n in &pending {
                            match record_scrub(&*meta, id, n, now) {
                                Ok(None) => {}
                                Ok(Some((pg, s))) => {
                                    known2.lock().expect("known").insert(pg, s);
                                }
                                Err(e) => {
                                    if failed_at.is_none() {
                                        tracing::warn!("osd.{id}: scrub stamps: {e}");
                                    }
                                    break;
                                }
                            }
                            done += 1;
                        }
                        failed_at = (done < pending.len()).then(Instant::now);
                        pending.drain(..done);
                        let over = pending.len().saturating_sub(NEWS_PENDING_MAX);
                        pending.drain(..over);
                    }
                    if stopping {
                        return;
                    }
                    std::thread::sleep(POLL);
                }
            })?;
        Ok(StampWriter {
            news,
            known,
            stop,
            thread: Some(thread),
        })
    }

    fn send(&self, mut n: Vec<nacre_osd::ScrubNews>) {
        if !n.is_empty() {
            self.news.lock().expect("news").append(&mut n);
        }
    }
}

impl Drop for StampWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One piece of scrub news in the stamp of its PG, `now` being the time
/// (Unix s): no time in a stamp is later than now (a clock that was
/// ahead, here or on another host, would otherwise hold a PG's scrubs off
/// until then). A first plan of a PG that has a stamp returns it.
fn record_scrub(
    meta: &dyn MetaStore,
    osd: u32,
    n: &nacre_osd::ScrubNews,
    now: u64,
) -> Result<Option<(PgId, map::ScrubStamp)>, MetaError> {
    use nacre_osd::ScrubNews::*;
    let not_ahead = |s: &mut map::ScrubStamp| {
        for t in [&mut s.first_unix_s, &mut s.light_unix_s, &mut s.deep_unix_s] {
            *t = (*t).min(now);
        }
    };
    match *n {
        Planned { pg, at_unix_s } => {
            let at = at_unix_s.min(now);
            let s = map::update_scrub_stamp(meta, pg, |s| {
                let fresh = s.first_unix_s == 0 && s.light_unix_s == 0;
                if fresh {
                    s.first_unix_s = at;
                }
                fresh
            })?;
            Ok((s.first_unix_s != at).then_some((pg, s)))
        }
        Scrubbed {
            pg,
            deep,
            at_unix_s,
            objects,
            inconsistent,
            unrepaired,
        } => {
            let at = at_unix_s.min(now);
            map::update_scrub_stamp(meta, pg, |s| {
                not_ahead(s);
                if s.first_unix_s == 0 {
                    s.first_unix_s = at;
                }
                s.light_unix_s = s.light_unix_s.max(at);
                if deep {
                    s.deep_unix_s = s.deep_unix_s.max(at);
                }
                (s.osd, s.objects, s.inconsistent, s.unrepaired) =
                    (osd, objects, inconsistent, unrepaired);
                true
            })?;
            Ok(None)
        }
    }
}

/// After an OSD's first boot (the key `osd init` left is there), asks the
/// leader to mark it in, then deletes the key. A failure is logged and the
/// OSD serves on: it asks again at its next start.
async fn join_in(meta: &dyn MetaStore, cfg: &OsdConfig) {
    let fresh = map::fresh_key(cfg.id);
    match meta.get(&fresh) {
        Ok(Some(_)) => {}
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(
                "osd.{}: is this its first boot? {e}; it asks to be marked in at its next start",
                cfg.id
            );
            return;
        }
    }
    let mark_in = crate::at::Ask {
        op: Op::MarkOut,
        id: cfg.id,
        arg: 0,
        body: None,
    };
    let r = crate::at::ask_leader_retrying(&cfg.leader, &mark_in).await;
    let r = r.and_then(|()| Ok(meta.delete(&Range::key(&fresh))?));
    match r {
        Ok(_) => tracing::info!("osd.{}: first boot: marked in", cfg.id),
        Err(e) => tracing::warn!(
            "osd.{}: asking to be marked in: {e:#}; it asks again at its next start (or: nacre osd in {})",
            cfg.id,
            cfg.id
        ),
    }
}

/// One round of [`UpLease`]: a lease if there is none (or it ran out), kept
/// alive; the key put again if the incarnation changed or the lease is new.
fn renew(
    meta: &dyn MetaStore,
    id: u32,
    lease: &mut Option<i64>,
    published: &mut Option<u64>,
    inc: u64,
) -> anyhow::Result<()> {
    let l = match *lease {
        Some(l) => match meta.lease_keepalive(l) {
            Ok(_) => l,
            Err(MetaError::LeaseNotFound(_)) => {
                tracing::warn!("osd.{id}: up lease {l} ran out; taking a new one");
                *lease = None;
                *published = None;
                return renew(meta, id, lease, published, inc);
            }
            Err(e) => return Err(e.into()),
        },
        None => {
            let l = meta.lease_grant(LEASE_TTL_S)?;
            *lease = Some(l);
            *published = None;
            l
        }
    };
    if *published != Some(inc) {
        meta.put(&map::up_key(id), up_value(std::process::id(), inc), l)?;
        *published = Some(inc);
    }
    Ok(())
}

impl Drop for UpLease {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One OSD of the cluster in `o.dir`, in the foreground, until SIGTERM or
/// SIGINT ([`serve`]), on `DIR/osd.N.img` (created if missing) and the
/// socket the map gives it.
pub fn run(o: &RunOpts) -> anyhow::Result<()> {
    let set = block_stop_signals();
    let dir = std::path::absolute(&o.dir)?;
    let meta: Arc<dyn MetaStore> = Arc::new(
        Remote::connect(&cluster::meta_socket(&dir))
            .map_err(|e| anyhow::anyhow!("no cluster running in {} ({e})", dir.display()))?,
    );
    let m = map::load(&*meta)?;
    let rec = (m.osds.iter().find(|r| r.id == o.id)).ok_or_else(|| no_such_osd(&dir, o.id, &m))?;
    let pool = m.pools.first().context("no pool in the map")?;
    let cfg = OsdConfig {
        id: o.id,
        path: dir.join(format!("osd.{}.img", o.id)),
        size_bytes: o.create_bytes,
        addr: rec.addr.parse().map_err(anyhow::Error::msg)?,
        object_bytes: pool.object_bytes,
        journal_bytes: o.journal_bytes,
        // What its record says its store holds (0: a record of an earlier
        // build, whose stores fit the one pool there was).
        pg_log_slots: match rec.pg_logs {
            0 => cluster::all_pgs(&m),
            n => n,
        },
        direct: cluster::direct_io_works(&dir),
        leader: nacre_osd::LeaderAddr::new(cluster::leader_addr(&dir)),
    };
    serve(
        Serve {
            meta,
            cfg,
            recovery_bytes_per_s: o.recovery_bytes_per_s,
            ratios: o.ratios,
            scrub: o.scrub,
            joins: false,
            metrics: o.metrics.clone(),
        },
        set,
    )
}

/// An OSD daemon's store, settings and cluster.
pub struct Serve {
    pub meta: Arc<dyn MetaStore>,
    pub cfg: OsdConfig,
    pub recovery_bytes_per_s: u64,
    pub ratios: (f64, f64),
    pub scrub: nacre_osd::ScrubConfig,
    /// A cluster on many hosts: the OSD gives the leader its address
    /// before it boots (it may have been registered while another leader
    /// ran), and after its first boot asks to be marked in
    /// ([`map::fresh_key`]).
    pub joins: bool,
    /// Where to serve the OSD's metrics (HOST:PORT).
    pub metrics: Option<String>,
}

/// Runs the OSD of `s` in the foreground until a signal of `set`: opens
/// its store, serves on its address, boots with the leader, holds its `up`
/// lease; at the signal stops serving and closes its store cleanly.
pub fn serve(s: Serve, set: libc::sigset_t) -> anyhow::Result<()> {
    let Serve {
        meta,
        cfg,
        recovery_bytes_per_s: recovery_rate,
        ratios,
        scrub,
        joins,
        metrics,
    } = s;
    let _metrics = (metrics.as_deref())
        .map(|a| {
            let sources = crate::metrics::Sources {
                meta: meta.clone(),
                osds: crate::metrics::Osds::One(cfg.id, cfg.addr.clone()),
                cluster: false,
                mon: None,
                gateway: None,
            };
            crate::metrics::serve(a, sources)
        })
        .transpose()?;
    let stop = Arc::new(Event::new()?);
    let stop2 = stop.clone();
    let id = cfg.id;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = wait_for_signal(&set);
            tracing::info!("osd.{id}: {}, stopping", signal_name(sig));
            stop2.signal();
        })?;
    rt::block_on(async move {
        let osd = Osd::open(&cfg)
            .await
            .map_err(|e| anyhow::anyhow!("osd.{}: {e}", cfg.id))?;
        osd.set_recovery_rate(recovery_rate);
        osd.set_full_ratios(ratios.0, ratios.1);
        // When its PGs were scrubbed, to plan their next scrubs from.
        match map::scrub_stamps(&*meta) {
            Ok(s) => osd.load_scrub_stamps(&s),
            Err(e) => tracing::warn!(
                "osd.{}: scrub stamps not read ({e}): PGs never scrubbed here are planned from now",
                cfg.id
            ),
        }
        osd.set_scrub(scrub);
        let stamps = StampWriter::spawn(meta.clone(), cfg.id)?;
        let l = Listener::bind(&cfg.addr).with_context(|| format!("osd.{}", cfg.id))?;
        let serving = osd.serve(l);
        if joins {
            let addr = cfg.addr.to_string();
            let add = crate::at::Ask {
                op: Op::AddOsd,
                id: cfg.id,
                arg: 0,
                body: Some(addr.as_bytes()),
            };
            crate::at::ask_leader_retrying(&cfg.leader, &add)
                .await
                .context("registering with the leader")?;
        }
        osd.boot().await.map_err(anyhow::Error::msg)?;
        // The incarnation, for the lease thread to publish.
        let up_from = Arc::new(AtomicU64::new(osd.up_from()));
        let watch = {
            let (osd, up_from) = (osd.clone(), up_from.clone());
            let (news, known) = (stamps.news.clone(), stamps.known.clone());
            rt::spawn(async move {
                loop {
                    rt::sleep(POLL).await;
                    up_from.store(osd.up_from(), Ordering::Release);
                    news.lock()
                        .expect("news")
                        .append(&mut osd.take_scrub_news());
                    let k = std::mem::take(&mut *known.lock().expect("known"));
                    if !k.is_empty() {
                        osd.load_scrub_stamps(&k);
                    }
                }
            })
        };
        let lease = UpLease::hold(meta.clone(), cfg.id, up_from)?;
        // Up (its key put) while it asks to be marked in, which may wait
        // for a leader.
        let joining = joins.then(|| {
            let cfg = cfg.clone();
            rt::spawn(async move { join_in(&*meta, &cfg).await })
        });
        stop.wait().await?;
        drop(joining);
        drop(watch);
        // Serves nothing more, takes no map, boots no more; then down in
        // the map before its key goes (whoever sees it gone sees it down).
        drop(serving);
        osd.halt();
        osd.leave().await;
        drop(lease);
        stamps.send(osd.take_scrub_news());
        let closed = osd.close().await;
        drop(stamps);
        closed.map_err(|e| anyhow::anyhow!("osd.{}: close: {e}", cfg.id))
    })
}

/// `nacre osd start ID --dir DIR`: asks the `nacre up` running in DIR to
/// start a stopped OSD and waits until it is up.
/// Its process id, and whether it already ran.
pub fn start(dir: &Path, id: u32, meta: &dyn MetaStore) -> anyhow::Result<(u32, bool)> {
    start_sized(dir, id, meta, None)
}

/// [`start`]; an OSD whose file does not exist yet gets one of
/// `create_bytes` (else the size of `nacre up`'s OSD files).
pub fn start_sized(
    dir: &Path,
    id: u32,
    meta: &dyn MetaStore,
    create_bytes: Option<u64>,
) -> anyhow::Result<(u32, bool)> {
    let m = map::load(meta)?;
    if !m.osds.iter().any(|r| r.id == id) {
        return Err(no_such_osd(dir, id, &m));
    }
    // A live process runs the OSD only while its up key names it and the
    // map does not mark it down: one otherwise (booting, or stopping — the
    // leader marks it down, then it gives up its key and closes its store)
    // is waited for, and started again if it goes. Taken for running, a
    // stopping OSD was left stopped.
    let t0 = Instant::now();
    while let Some(pid) = live_pid(&pid_file(dir, id)) {
        let keyed = (meta.get(&map::up_key(id))?)
            .is_some_and(|kv| parse_up(&kv.value).is_some_and(|(p, _)| p == pid));
        if keyed && !map::load(meta)?.state.down.contains(&id) {
            return Ok((pid, true));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("osd.{id} (pid {pid}) neither came up nor stopped within 60 s; the log of nacre up says why");
        }
        std::thread::sleep(POLL);
    }
    let value = create_bytes.map_or_else(Vec::new, |b| b.to_string().into_bytes());
    meta.put(&start_key(id), value, 0)?;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        let asked = meta.get(&start_key(id))?.is_some();
        let up = meta.get(&map::up_key(id))?;
        if let (false, Some(kv)) = (asked, up) {
            if let Some(pid) = live_pid(&pid_file(dir, id)) {
                if parse_up(&kv.value).is_some_and(|(p, _)| p == pid) {
                    return Ok((pid, false));
                }
            }
        }
        std::thread::sleep(POLL);
    }
    bail!("osd.{id} did not come up within 60 s; the log of nacre up says why")
}

/// The state of one OSD's process, as the supervisor last saw it.
#[derive(Clone, Debug, Default)]
pub struct OsdProc {
    pub pid: Option<u32>,
    /// How it last ended.
    pub last_exit: Option<String>,
}

struct Slot {
    opts: RunOpts,
    child: Option<Child>,
    started: Instant,
    restart_at: Option<Instant>,
    delay: Duration,
}

/// Starts, watches, restarts and stops the OSD processes of `nacre up`.
/// The children are spawned from its own thread: `PR_SET_PDEATHSIG` fires
/// when the thread that forked a child ends, so they die with it.
pub struct Supervisor {
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
    pub procs: Arc<Mutex<HashMap<u32, OsdProc>>>,
}

impl Supervisor {
    /// Starts every OSD of `osds` (first waiting for any child of an
    /// earlier run to die), then watches them from its own thread.
    pub fn start(
        meta: Arc<dyn MetaStore>,
        osds: Vec<RunOpts>,
        restart: bool,
    ) -> anyhow::Result<Supervisor> {
        for o in &osds {
            let t0 = Instant::now();
            while let Some(pid) = live_pid(&pid_file(&o.dir, o.id)) {
                if t0.elapsed() > STRAGGLER_WAIT {
                    bail!(
                        "osd.{} of an earlier run still runs (pid {pid}); stop it first",
                        o.id
                    );
                }
                std::thread::sleep(POLL);
            }
        }
        let exe = std::env::current_exe().context("where is the nacre binary?")?;
        let procs = Arc::new(Mutex::new(HashMap::new()));
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let procs2 = procs.clone();
        let thread = std::thread::Builder::new()
            .name("osds".into())
            .spawn(move || {
                let mut s = Supervise {
                    exe,
                    meta,
                    restart,
                    procs: procs2,
                    slots: osds
                        .into_iter()
                        .map(|opts| Slot {
                            opts,
                            child: None,
                            started: Instant::now(),
                            restart_at: Some(Instant::now()),
                            delay: RESTART_DELAY,
                        })
                        .collect(),
                };
                s.tick();
                let _ = ready_tx.send(());
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(POLL) {
                    s.tick();
                }
                s.stop_all();
            })?;
        ready_rx
            .recv()
            .context("the OSD supervisor died while starting")?;
        Ok(Supervisor {
            stop: tx,
            thread: Some(thread),
            procs,
        })
    }

    /// SIGTERM to every OSD, and waits for them to close their stores.
    pub fn stop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the OSD supervisor panicked");
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Supervise {
    exe: PathBuf,
    meta: Arc<dyn MetaStore>,
    restart: bool,
    procs: Arc<Mutex<HashMap<u32, OsdProc>>>,
    slots: Vec<Slot>,
}

/// Tells the leader that incarnation `up_from` of OSD `id` is dead (its
/// process was reaped), before anything can start it again.
fn report_dead(dir: &Path, id: u32, up_from: u64) {
    let leader = cluster::leader_addr(dir);
    let r = rt::block_on(async {
        let c = nacre_net::Conn::connect_with_timeout(&leader, DEAD_REPORT_TIMEOUT)?;
        let mut h = Header::request(Op::Dead, 0, ObjectId::default());
        h.sender = id;
        h.obj_version = up_from;
        c.call(h, None).await
    });
    match r {
        Ok(f) if f.h.status == Status::Ok => {}
        Ok(f) => tracing::warn!("osd.{id}: the leader refused its death report: {:?}", f.h.status),
        Err(e) => tracing::warn!(
            "osd.{id}: the leader did not take its death report ({e}); it marks it down after the heartbeat grace"
        ),
    }
}

fn describe(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by {}", signal_name(s)),
        _ => st.to_string(),
    }
}

impl Supervise {
    fn tick(&mut self) {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            self.reap(i, now);
        }
        self.take_requests();
        for i in 0..self.slots.len() {
            let s = &self.slots[i];
            if s.child.is_none() && s.restart_at.is_some_and(|t| t <= now) {
                // Not an OSD removed from the cluster (`nacre osd rm`).
                let id = s.opts.id;
                if map::load(&*self.meta).is_ok_and(|m| m.removed.contains(&id)) {
                    tracing::warn!("osd.{id} was removed from the cluster: not started again");
                    self.slots[i].restart_at = None;
                    continue;
                }
                self.spawn(i);
            }
        }
    }

    /// Notices an OSD that exited: shows it down at once and schedules its
    /// restart.
    fn reap(&mut self, i: usize, now: Instant) {
        let s = &mut self.slots[i];
        let Some(child) = s.child.as_mut() else {
            return;
        };
        let st = match child.try_wait() {
            Ok(Some(st)) => st,
            Ok(None) => return,
            Err(e) => {
                tracing::error!("osd.{}: wait: {e}", s.opts.id);
                return;
            }
        };
        let id = s.opts.id;
        let pid = child.id();
        s.child = None;
        let _ = std::fs::remove_file(pid_file(&s.opts.dir, id));
        // Down now, not when its lease runs out or the leader's heartbeat
        // grace ends; only its own key (a process started since would have
        // put its own pid there).
        if let Ok(Some(kv)) = self.meta.get(&map::up_key(id)) {
            if let Some((_, up_from)) = parse_up(&kv.value).filter(|(p, _)| *p == pid) {
                let _ = self.meta.delete(&Range::key(&map::up_key(id)));
                report_dead(&s.opts.dir, id, up_from);
            }
        }
        let why = describe(st);
        // This restart waits `delay`; the next one twice as long if this
        // run was short.
        if s.started.elapsed() >= RESTART_STABLE {
            s.delay = RESTART_DELAY;
        }
        let delay = s.delay;
        s.delay = (delay * 2).min(RESTART_DELAY_MAX);
        if st.success() {
            // Stopped by SIGTERM or SIGINT: the operator's choice.
            s.restart_at = None;
            tracing::warn!(
                "osd.{id} (pid {pid}) stopped; nacre osd start {id} --dir {} starts it again",
                s.opts.dir.display()
            );
            let mut p = self.procs.lock().unwrap();
            let e = p.entry(id).or_default();
            e.pid = None;
            e.last_exit = Some(why);
            return;
        }
        if self.restart {
            s.restart_at = Some(now + delay);
            tracing::warn!(
                "osd.{id} (pid {pid}) {why}; restarting it in {} s",
                delay.as_secs()
            );
        } else {
            s.restart_at = None;
            tracing::warn!(
                "osd.{id} (pid {pid}) {why}; not restarted (--no-restart): nacre osd start {id} --dir {} starts it",
                s.opts.dir.display()
            );
        }
        let mut p = self.procs.lock().unwrap();
        let e = p.entry(id).or_default();
        e.pid = None;
        e.last_exit = Some(why);
    }

    /// Acts on `nacre osd start` requests.
    fn take_requests(&mut self) {
        let Ok((kvs, _)) = self.meta.range(&Range::prefix(START_PREFIX)) else {
            return;
        };
        for kv in kvs {
            let id = kv.key[START_PREFIX.len()..].parse::<u32>().ok();
            if let Some(id) = id.filter(|&id| !self.slots.iter().any(|s| s.opts.id == id)) {
                self.add_slot(id, &kv.value);
            }
            if let Some(i) = self.slots.iter().position(|s| Some(s.opts.id) == id) {
                // A child that exited since this tick's reaping (`osd
                // start` saw it gone) is reaped now, so the request starts
                // it rather than finding it still there.
                self.reap(i, Instant::now());
                let s = &mut self.slots[i];
                if s.child.is_none() {
                    s.restart_at = Some(Instant::now());
                    s.delay = RESTART_DELAY;
                }
            }
            let _ = self.meta.delete(&Range::key(&kv.key));
        }
    }

    /// A slot for OSD `id`, added to the map after this supervisor
    /// started (`nacre osd add`): run like the others, its file made at the
    /// size the request gives (`value`: bytes in decimal), if any.
    fn add_slot(&mut self, id: u32, value: &[u8]) {
        let Some(mut opts) = self.slots.first().map(|s| s.opts.clone()) else {
            return;
        };
        if !map::load(&*self.meta).is_ok_and(|m| m.osd(id).is_some()) {
            tracing::warn!("asked to start osd.{id}, which is not in the map");
            return;
        }
        opts.id = id;
        if let Some(b) = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok()) {
            opts.create_bytes = b;
        }
        self.slots.push(Slot {
            opts,
            child: None,
            started: Instant::now(),
            restart_at: None,
            delay: RESTART_DELAY,
        });
    }

    fn spawn(&mut self, i: usize) {
        let s = &mut self.slots[i];
        let id = s.opts.id;
        let parent = std::process::id();
        let mut cmd = Command::new(&self.exe);
        cmd.args(s.opts.args()).process_group(0);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before the line above.
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        s.started = Instant::now();
        s.restart_at = None;
        match cmd.spawn() {
            Ok(c) => {
                let pid = c.id();
                if let Err(e) = std::fs::write(pid_file(&s.opts.dir, id), pid.to_string()) {
                    tracing::error!("osd.{id}: pid file: {e}");
                }
                tracing::info!("osd.{id}: started, pid {pid}");
                s.child = Some(c);
                self.procs.lock().unwrap().entry(id).or_default().pid = Some(pid);
            }
            Err(e) => {
                tracing::error!("osd.{id}: cannot start {}: {e}", self.exe.display());
                s.restart_at = Some(Instant::now() + s.delay);
            }
        }
    }

    /// SIGTERM to every OSD, then waits for each (killing one that takes
    /// longer than [`STOP_TIMEOUT`]).
    fn stop_all(&mut self) {
        for s in &self.slots {
            if let Some(c) = &s.child {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
        }
        let t0 = Instant::now();
        for s in &mut self.slots {
            let Some(mut c) = s.child.take() else {
                continue;
            };
            loop {
                match c.try_wait() {
                    Ok(Some(st)) if !st.success() => {
                        tracing::error!("osd.{} stopped with {}", s.opts.id, describe(st));
                        break;
                    }
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if t0.elapsed() > STOP_TIMEOUT => {
                        tracing::error!(
                            "osd.{} did not stop within {} s of SIGTERM; killed",
                            s.opts.id,
                            STOP_TIMEOUT.as_secs()
                        );
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            let _ = std::fs::remove_file(pid_file(&s.opts.dir, s.opts.id));
        }
    }
}
