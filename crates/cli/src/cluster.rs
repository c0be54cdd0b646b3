//! A whole cluster on one machine (`nacre up`, `nacre demo`): the embedded
//! meta store (served on `DIR/meta.sock` for other commands), the cluster
//! map's leader (on `DIR/leader.sock`; it stores every map it makes in the
//! meta store) and an NBD gateway, each on a thread of this process, and
//! one process per OSD on `DIR/osd.N.img` (`crate::osds`). The OSDs and the
//! gateway talk over unix sockets with the same wire protocol, client
//! library and code as a multi-host cluster; only the meta store backend
//! and the addresses differ.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nacre_io::net::{Addr, Event, Listener};
use nacre_io::rt;
use nacre_meta::embedded::Embedded;
use nacre_meta::map::{self, OsdRecord, PoolRecord};
use nacre_meta::MetaStore;
use nacre_osd::leader::Leader;
use nacre_osd::OsdMap;

use crate::osds::{RunOpts, Supervisor};

/// Objects of a pool, and blocks of an OSD's store.
pub const OBJECT_BYTES: u32 = 128 << 10;
/// Most PGs `nacre up --pgs` makes.
pub const PGS_MAX: u32 = 16384;
/// OSDs of a new cluster when `--osds` is not given.
pub const OSDS_DEFAULT: u32 = 3;

#[derive(Clone, Debug)]
pub struct UpOpts {
    pub dir: PathBuf,
    /// OSDs: a new cluster's (`None`: 3); on one that exists, more than it
    /// has adds OSDs, `None` keeps them.
    pub osds: Option<u32>,
    /// The pool's PG count for a new cluster (`None`: [`pg_count_for`]).
    pub pgs: Option<u32>,
    pub osd_size_bytes: u64,
    /// `--osd-size` was given (not the default): on an existing cluster it
    /// must match the stores' size.
    pub osd_size_given: bool,
    /// Journal size of each new OSD store (`None`: the store's default).
    pub journal_bytes: Option<u64>,
    pub replicas: u8,
    pub nbd: Addr,
    /// Restart an OSD process that dies (after `osds::RESTART_DELAY`).
    pub restart: bool,
    /// Each OSD's background recovery pace, in bytes per second.
    pub recovery_bytes_per_s: u64,
    /// The used fractions at which an OSD is near full and full.
    pub ratios: (f64, f64),
    pub scrub: nacre_osd::ScrubConfig,
    /// An OSD down this long is marked out (zero: never).
    pub out_delay: Duration,
    /// Whether an OSD named slow is demoted from leading PGs (else only
    /// named).
    pub demote_slow: bool,
    /// Written into the meta store at start, for `nacre status`.
    pub config: map::ClusterConfig,
    /// How often the objects of deleted volumes are looked for.
    pub reclaim_interval: Duration,
    /// Where to serve the cluster's metrics (HOST:PORT).
    pub metrics: Option<String>,
}

/// `nacre up --reclaim-interval` when it is not given.
pub const RECLAIM_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// A thread of the cluster's (the leader, the gateway, the sweep); stopped
/// and joined when dropped, so no error path leaves one running (a leader
/// left running past its term would answer as leader beside the next).
pub struct Worker {
    name: String,
    stop: Arc<Event>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Signals the thread to stop and waits for it.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let Some(t) = self.thread.take() else {
            return;
        };
        self.stop.signal();
        if t.join().is_err() {
            tracing::error!("{} panicked", self.name);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// A running cluster; [`Running::stop`] shuts it down cleanly.
pub struct Running {
    pub meta: Arc<Embedded>,
    pub nbd: Addr,
    pub dir: PathBuf,
    /// The leader and the gateway, in start order.
    workers: Vec<Worker>,
    osds: Option<Supervisor>,
    /// The metrics endpoint (`--metrics`).
    pub metrics: Option<crate::metrics::Endpoint>,
    /// The OSDs' unix sockets, removed at stop.
    sockets: Vec<PathBuf>,
}

pub fn meta_socket(dir: &Path) -> PathBuf {
    dir.join("meta.sock")
}

pub fn leader_addr(dir: &Path) -> Addr {
    Addr::Unix(dir_socket(dir, "leader.sock"))
}

fn dir_socket(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Can files in `dir` be opened with O_DIRECT? (tmpfs says no.)
pub fn direct_io_works(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join(".direct-probe");
    let r = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p);
    let _ = std::fs::remove_file(&p);
    r.is_ok()
}

fn pg_count_for(osds: u32, replicas: u8) -> u32 {
    // About 64 PG replicas per OSD, a power of two, at least 32.
    (osds * 64 / u32::from(replicas).max(1))
        .next_power_of_two()
        .max(32)
}

/// The record of OSD `id` of the cluster in `dir`, on a store of `bytes`
/// with PG logs for `pgs` PGs (at least the store's default).
pub fn osd_record(dir: &Path, id: u32, bytes: u64, pgs: u32) -> OsdRecord {
    OsdRecord {
        pg_logs: nacre_osd::pg_log_region(pgs).slots,
        ..OsdRecord::local(
            id,
            Addr::Unix(dir.join(format!("osd.{id}.sock"))).to_string(),
            (bytes >> 30).max(1) as u32,
        )
    }
}

/// PGs over every pool of `m`: what a new store's PG logs must hold.
pub fn all_pgs(m: &map::ClusterMap) -> u32 {
    m.pools.iter().map(|p| p.pg_count).sum()
}

/// The size of the stores of the cluster in `dir` (its first OSD file's),
/// if it has one.
pub fn store_bytes(dir: &Path) -> Option<u64> {
    let first = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            let id: u32 = n.strip_prefix("osd.")?.strip_suffix(".img")?.parse().ok()?;
            Some((id, e.path()))
        })
        .min()?;
    Some(std::fs::metadata(first.1).ok()?.len())
}

/// The size of new OSD files: `--osd-size` if given, else that of the
/// stores the cluster has.
fn create_bytes(o: &UpOpts) -> u64 {
    if o.osd_size_given {
        o.osd_size_bytes
    } else {
        store_bytes(&o.dir).unwrap_or(o.osd_size_bytes)
    }
}

/// Creates the map on first start; checks it against `o` afterwards, and
/// adds the OSDs a larger `--osds` asks for (placement gives them their
/// share of the PGs; the data moves in the background once they run).
fn init_or_check(meta: &dyn MetaStore, o: &UpOpts) -> anyhow::Result<()> {
    if !map::initialised(meta)? {
        let n = o.osds.unwrap_or(OSDS_DEFAULT);
        let pool = PoolRecord::rbd(
            o.replicas,
            o.replicas / 2 + 1,
            o.pgs.unwrap_or_else(|| pg_count_for(n, o.replicas)),
            OBJECT_BYTES,
        );
        let osds: Vec<OsdRecord> = (0..n)
            .map(|id| osd_record(&o.dir, id, o.osd_size_bytes, pool.pg_count))
            .collect();
        map::init(meta, &osds, &pool)?;
        return Ok(());
    }
    let m = map::load(meta)?;
    let have = m.osds.len() as u32;
    let want = o.osds.unwrap_or(have);
    if want < have {
        bail!(
            "the cluster in {} has {have} OSDs; --osds {want} would remove some, which is not built: leave --osds out, or give {have} or more (mark an OSD out with `nacre osd out` to empty it)",
            o.dir.display(),
        );
    }
    let pool = m.pools.first().context("no pool in the map")?;
    if o.pgs.is_some_and(|p| p != pool.pg_count) {
        bail!(
            "the cluster in {} has {} PGs, fixed when it was made; leave --pgs out",
            o.dir.display(),
            pool.pg_count
        );
    }
    if pool.size != o.replicas {
        bail!(
            "the cluster in {} keeps {} replicas, not {}",
            o.dir.display(),
            pool.size,
            o.replicas
        );
    }
    let next = m.next_osd_id();
    for id in next..next + (want - have) {
        map::add_osd(meta, &osd_record(&o.dir, id, create_bytes(o), all_pgs(&m)))?;
        tracing::info!("osd.{id} added");
    }
    let moved = map::place_new_osds(meta)?;
    if moved > 0 {
        tracing::info!("new OSDs placed: {moved} PG copies move to them");
    }
    Ok(())
}

/// The map a leader starts from: the stored epoch, OSDs down and out, and
/// every pool with its PG table and history; the OSDs' addresses from
/// their records. Every OSD counts as down until it boots with this
/// leader (`Leader::new` starts a new epoch).
pub fn leader_map(meta: &dyn MetaStore) -> anyhow::Result<OsdMap> {
    let m = map::load(meta)?;
    Ok(OsdMap {
        cluster: m.state.clone(),
        pools: map::pools_of(meta, &m)?,
        addrs: m.osds.iter().map(|r| (r.id, r.addr.clone())).collect(),
        up_from: Default::default(),
        stores: Default::default(),
        full: Default::default(),
    })
}

/// What a leader's thread needs.
pub struct LeaderStart {
    pub meta: Arc<dyn MetaStore>,
    pub map: OsdMap,
    /// An OSD down this long is marked out (zero: never).
    pub out_delay: Duration,
    /// Whether an OSD named slow is demoted from leading PGs.
    pub demote_slow: bool,
    pub addr: Addr,
    /// The compare every map write carries (an elected monitor's hold on
    /// its election key; none in `nacre up`).
    pub fence: Vec<nacre_meta::Compare>,
    /// `map` is exactly what the store holds (a monitor just loaded it):
    /// only what changes is written. Else everything is written at start.
    pub stored: bool,
    /// While the leader may act (an elected monitor's term); none: always.
    pub authority: Option<Box<dyn Fn() -> Option<Duration> + Send>>,
    /// For how long from its start the leader takes no PG event
    /// (`Leader::hold_events_until`).
    pub hold_events: Duration,
}

/// The leader's thread: it serves on `addr`, persists every map to `meta`
/// before anyone hears of it, and places the pools' PGs on the OSDs when
/// one is marked out or in.
pub fn spawn_leader(
    s: LeaderStart,
    ready: mpsc::Sender<anyhow::Result<()>>,
) -> anyhow::Result<Worker> {
    let stop = Arc::new(Event::new()?);
    let stop2 = stop.clone();
    let LeaderStart {
        meta,
        map,
        out_delay,
        demote_slow,
        addr,
        fence,
        stored,
        authority,
        hold_events,
    } = s;
    let thread = std::thread::Builder::new()
        .name("leader".into())
        .spawn(move || {
            rt::block_on(async move {
                let records = meta.clone();
                // What was stored last: only what changed is written.
                let last = std::cell::RefCell::new(
                    stored.then(|| (map.cluster.clone(), map.pools.clone())),
                );
                let persist = move |m: &OsdMap| {
                    let saved = {
                        let stored = last.borrow();
                        let prev = stored.as_ref().map(|(c, p)| (c, p));
                        map::save_map(&*meta, &m.cluster, &m.pools, prev, &fence)
                    };
                    if let Err(e) = saved {
                        // Part of it may be stored (a store that took it
                        // in pieces, or a call whose answer was lost): the
                        // next change writes everything.
                        *last.borrow_mut() = None;
                        return Err(e.to_string());
                    }
                    *last.borrow_mut() = Some((m.cluster.clone(), m.pools.clone()));
                    Ok(())
                };
                let start = || -> anyhow::Result<_> {
                    let leader = Leader::new(map, nacre_net::Sockets, Box::new(persist))
                        .map_err(anyhow::Error::msg)?;
                    if let Some(a) = authority {
                        leader.set_authority(a);
                    }
                    leader.hold_events_until(rt::monotonic() + hold_events);
                    Ok((leader, Listener::bind(&addr)?))
                };
                let (leader, l) = match start() {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = ready.send(Err(e.context("leader")));
                        return;
                    }
                };
                // The OSD records come from the meta store each time:
                // `nacre osd add` stores one before the leader hears of it.
                leader.set_placer(Box::new(move |pool, prev, inn| {
                    let m = map::load(&*records).map_err(|e| e.to_string())?;
                    if prev.is_none() {
                        // A new pool: its PGs must fit every store's PG logs.
                        map::check_pg_logs(&m, pool).map_err(|e| e.to_string())?;
                    }
                    let osds = m.osds;
                    // An OSD registered but not yet added to the map (`nacre
                    // osd init` while this leader runs) holds no PG until it
                    // boots and asks to be marked in.
                    let out: Vec<u32> = (osds.iter().map(|o| o.id))
                        .filter(|id| !inn.contains(id))
                        .collect();
                    map::place(&osds, pool, &out, prev).map_err(|e| e.to_string())
                }));
                leader.set_out_delay(out_delay);
                leader.set_slow_osd_action(demote_slow);
                let serving = rt::spawn(nacre_net::serve(l, leader.clone()));
                let beating = rt::spawn(leader.clone().run());
                let _ = ready.send(Ok(()));
                if let Err(e) = stop2.wait().await {
                    tracing::error!("leader: stop event: {e}");
                }
                leader.stop();
                drop(serving);
                drop(beating);
            })
        })?;
    Ok(Worker {
        name: "leader".into(),
        stop,
        thread: Some(thread),
    })
}

/// The gateway's thread: the NBD server, counting in `metrics`.
pub fn spawn_gateway(
    meta: Arc<dyn MetaStore>,
    addr: Addr,
    metrics: Arc<nacre_nbd::metrics::NbdMetrics>,
    ready: mpsc::Sender<anyhow::Result<()>>,
) -> anyhow::Result<Worker> {
    let stop = Arc::new(Event::new()?);
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("nbd".into())
        .spawn(move || {
            rt::block_on(async move {
                let start = || -> anyhow::Result<_> {
                    let cluster = nacre_client::Cluster::connect(meta)?;
                    let l = Listener::bind(&addr)?;
                    Ok((cluster, l))
                };
                let (cluster, l) = match start() {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = ready.send(Err(e.context("nbd gateway")));
                        return;
                    }
                };
                let stopping = nacre_io::sync::Latch::default();
                let serving = rt::spawn(nacre_nbd::server::serve(
                    l,
                    cluster,
                    stopping.clone(),
                    metrics,
                ));
                let _ = ready.send(Ok(()));
                let _ = stop2.wait().await;
                // Requests already read finish and are answered first.
                stopping.set();
                let drain = Duration::from_millis(nacre_nbd::server::DRAIN_TIMEOUT_MS);
                if rt::timeout(drain, serving).await.is_none() {
                    tracing::warn!(
                        "nbd: requests still running after {} s: closing their connections",
                        drain.as_secs()
                    );
                }
            })
        })?;
    Ok(Worker {
        name: "nbd".into(),
        stop,
        thread: Some(thread),
    })
}

/// The sweep for objects of deleted volumes, every `every`, on a thread of
/// its own (in `nacre up`, and in the elected monitor).
pub fn spawn_reclaimer(meta: Arc<dyn MetaStore>, every: Duration) -> anyhow::Result<Worker> {
    let stop = Arc::new(Event::new()?);
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("reclaim".into())
        .spawn(move || {
            rt::block_on(async move {
                let sweeping = async move {
                    // The map may lack a pool yet: try again later.
                    loop {
                        match nacre_client::Cluster::connect(meta.clone()) {
                            Ok(c) => break reclaim_orphans(c, every).await,
                            Err(e) => tracing::debug!("reclaim: {e}"),
                        }
                        rt::sleep(every).await;
                    }
                };
                let sweeping = rt::spawn(sweeping);
                let _ = stop2.wait().await;
                drop(sweeping);
            })
        })?;
    Ok(Worker {
        name: "reclaim".into(),
        stop,
        thread: Some(thread),
    })
}

/// Every `every`, deletes the objects of deleted volumes the OSDs that are
/// up still hold, and finishes interrupted deletes and shrinks
/// ([`nacre_client::Cluster::reclaim_orphans`]).
async fn reclaim_orphans(cluster: std::rc::Rc<nacre_client::Cluster>, every: Duration) {
    let mut seen = nacre_client::Unfinished::new();
    loop {
        rt::sleep(every).await;
        match cluster.reclaim_orphans(&mut seen).await {
            Ok(r) if !r.left.is_empty() => {
                tracing::warn!("orphaned objects left: {}", r.left.join("; "))
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("looking for orphaned objects: {e}"),
        }
    }
}

/// Starts everything; returns once the OSDs and the gateway listen.
/// Refuses, with a message that says what to do, options that cannot make
/// a cluster — before anything is created.
fn check_opts(o: &UpOpts) -> anyhow::Result<()> {
    if o.osds == Some(0) {
        bail!("--osds 0: a cluster needs at least one OSD (the default is 3)");
    }
    if o.pgs.is_some_and(|p| !(1..=PGS_MAX).contains(&p)) {
        bail!(
            "--pgs {}: a pool has 1 to {PGS_MAX} PGs",
            o.pgs.unwrap_or(0)
        );
    }
    // A cluster that exists checks its own count (init_or_check).
    let osds = o.osds.unwrap_or(OSDS_DEFAULT);
    if !o.dir.join("meta").exists() && (o.replicas == 0 || u32::from(o.replicas) > osds) {
        bail!(
            "--replicas {}: each copy needs its own OSD, so it must be between 1 and --osds ({osds})",
            o.replicas,
        );
    }
    // The gateway listens last: a TCP address taken by another program
    // must be refused before any file is made.
    // (Unless it is this cluster's own gateway, running: said below.)
    if let (Addr::Tcp(hp), None) = (&o.nbd, running_pid(&o.dir)) {
        if let Err(e) = std::net::TcpListener::bind(hp.as_str()) {
            bail!("--nbd {}: cannot listen there: {e}", o.nbd);
        }
    }
    // A store's size is fixed when it is made: a different --osd-size on a
    // cluster that exists would grow nothing.
    if o.osd_size_given && o.dir.join("meta").exists() {
        if let Some(have) = store_bytes(&o.dir).filter(|&b| b != o.osd_size_bytes) {
            bail!(
                "--osd-size {}: the stores in {} were made with {} and cannot grow or shrink; leave --osd-size out (new OSD files are made as large as the others; `nacre osd add --size` makes one of another size)",
                crate::commands::human(o.osd_size_bytes),
                o.dir.display(),
                crate::commands::human(have)
            );
        }
    }
    if o.dir.exists() && !o.dir.is_dir() {
        bail!(
            "--dir {} is a file; give a directory (it is created if missing)",
            o.dir.display()
        );
    }
    // A new cluster: its OSD stores must be possible at these sizes (the
    // same layout check formatting does, before any file exists).
    if !o.dir.join("meta").exists() {
        let pgs = o
            .pgs
            .unwrap_or_else(|| pg_count_for(o.osds.unwrap_or(OSDS_DEFAULT), o.replicas));
        plan_store(o.osd_size_bytes, o.journal_bytes, pgs).map_err(|e| {
            anyhow::anyhow!(
                "--osd-size {} / --journal-size {}: an OSD store cannot be made: {e}",
                o.osd_size_bytes,
                o.journal_bytes.map_or("default".into(), |j| j.to_string())
            )
        })?;
    }
    Ok(())
}

/// Whether an OSD store of `bytes` (and journal) for a pool of `pgs` PGs
/// can be made: the layout check formatting does, before any file exists.
pub fn plan_store(
    bytes: u64,
    journal_bytes: Option<u64>,
    pgs: u32,
) -> Result<(), nacre_blockstore::Error> {
    nacre_blockstore::Geometry::plan(
        [0; 16],
        bytes,
        OBJECT_BYTES,
        4096,
        journal_bytes,
        nacre_osd::pg_log_region(pgs),
    )
    .map(drop)
}

/// The pid in `DIR/nacre.pid`, if that process still runs.
fn running_pid(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("nacre.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    nacre_io::file::process_alive(pid).then_some(pid)
}

pub fn start(o: &UpOpts) -> anyhow::Result<Running> {
    check_opts(o)?;
    std::fs::create_dir_all(&o.dir).with_context(|| format!("create {}", o.dir.display()))?;
    let meta = match Embedded::open(&o.dir.join("meta")) {
        Ok(m) => m,
        Err(e) => {
            if let Some(pid) = running_pid(&o.dir) {
                bail!(
                    "a cluster is already running in {} (nacre up, pid {pid}); use it, or stop it first",
                    o.dir.display()
                );
            }
            return Err(anyhow::Error::new(e).context(format!("cluster in {}", o.dir.display())));
        }
    };
    // This process holds the directory's lock: no other cluster runs here,
    // so its sockets are stale. A killed predecessor's may still accept
    // connections for a moment (its io_uring's teardown holds the
    // listening socket after the process is gone), which the stale-socket
    // check of `Listener::bind` would take for a live server.
    for s in [
        dir_socket(&o.dir, "leader.sock"),
        dir_socket(&o.dir, "nbd.sock"),
    ] {
        let _ = std::fs::remove_file(s);
    }
    init_or_check(&*meta, o)?;
    map::put_config(&*meta, &o.config)?;
    nacre_meta::remote::serve(meta.clone(), &meta_socket(&o.dir)).context("meta socket")?;
    let m = map::load(&*meta)?;
    // The leader starts from the stored map in a new epoch: every OSD
    // restarted and boots again.
    let osd_map = leader_map(&*meta)?;
    let leader_addr = leader_addr(&o.dir);
    if !direct_io_works(&o.dir) {
        tracing::warn!(
            "{} does not support O_DIRECT (tmpfs?): OSDs use the page cache",
            o.dir.display()
        );
    }
    // Bound first: an address taken stops the start before anything runs.
    let gateway = Arc::new(nacre_nbd::metrics::NbdMetrics::default());
    let metrics = (o.metrics.as_deref())
        .map(|addr| {
            let sources = crate::metrics::Sources {
                meta: meta.clone(),
                osds: crate::metrics::Osds::All,
                cluster: true,
                mon: None,
                gateway: Some(gateway.clone()),
            };
            crate::metrics::serve(addr, sources)
        })
        .transpose()?;
    let (tx, rx) = mpsc::channel();
    let mut running = Running {
        meta: meta.clone(),
        nbd: o.nbd.clone(),
        dir: o.dir.clone(),
        workers: Vec::new(),
        osds: None,
        metrics,
        sockets: (m.osds.iter())
            .filter_map(|r| match r.addr.parse::<Addr>() {
                Ok(Addr::Unix(p)) => Some(p),
                _ => None,
            })
            .chain([o.dir.join("leader.sock")])
            .collect(),
    };
    let run = || -> anyhow::Result<()> {
        let start = LeaderStart {
            meta: meta.clone(),
            map: osd_map,
            out_delay: o.out_delay,
            demote_slow: o.demote_slow,
            addr: leader_addr,
            fence: Vec::new(),
            stored: false,
            authority: None,
            hold_events: Duration::ZERO,
        };
        running.workers.push(spawn_leader(start, tx.clone())?);
        rx.recv()
            .context("the leader thread died while starting")??;
        let opts = (m.osds.iter())
            .map(|r| RunOpts {
                dir: o.dir.clone(),
                id: r.id,
                create_bytes: create_bytes(o),
                journal_bytes: o.journal_bytes,
                recovery_bytes_per_s: o.recovery_bytes_per_s,
                ratios: o.ratios,
                scrub: o.scrub,
                metrics: None,
            })
            .collect();
        let sup = running
            .osds
            .insert(Supervisor::start(meta.clone(), opts, o.restart)?);
        wait_osds_up(
            &*meta,
            sup,
            &m.osds.iter().map(|r| r.id).collect::<Vec<_>>(),
        )?;
        running.workers.push(spawn_gateway(
            meta.clone(),
            o.nbd.clone(),
            gateway.clone(),
            tx.clone(),
        )?);
        rx.recv()
            .context("the gateway thread died while starting")??;
        running
            .workers
            .push(spawn_reclaimer(meta.clone(), o.reclaim_interval)?);
        Ok(())
    };
    if let Err(e) = run() {
        running.stop();
        return Err(e);
    }
    std::fs::write(o.dir.join("nacre.pid"), std::process::id().to_string())?;
    Ok(running)
}

/// How long `nacre up` waits for its OSDs to open their stores and boot
/// (a journal replay of a large store takes a while).
const OSDS_UP_WAIT: Duration = Duration::from_secs(600);

/// Waits until every OSD of `ids` runs and holds its `up` key (each opens
/// its store, replaying its journal, and boots with the leader first).
fn wait_osds_up(meta: &dyn MetaStore, sup: &Supervisor, ids: &[u32]) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let mut said = false;
    loop {
        let procs = sup.procs.lock().unwrap().clone();
        let mut waiting = Vec::new();
        for &id in ids {
            let p = procs.get(&id).cloned().unwrap_or_default();
            if let Some(why) = &p.last_exit {
                bail!("osd.{id} {why} while starting (its error is above)");
            }
            let up = meta.get(&map::up_key(id))?;
            let is_up = match (p.pid, up) {
                (Some(pid), Some(kv)) => {
                    crate::osds::parse_up(&kv.value).is_some_and(|(p, _)| p == pid)
                }
                _ => false,
            };
            if !is_up {
                waiting.push(format!("osd.{id}"));
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if !said && t0.elapsed() > Duration::from_secs(10) {
            tracing::warn!(
                "waiting for {} to open their stores and boot",
                waiting.join(", ")
            );
            said = true;
        }
        if t0.elapsed() > OSDS_UP_WAIT {
            bail!(
                "{} did not come up within {} s (their logs above say why)",
                waiting.join(", "),
                OSDS_UP_WAIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Running {
    /// Stops the gateway, then the OSDs (each closes its store with a
    /// checkpoint), then the leader.
    pub fn stop(&mut self) {
        self.metrics = None;
        // Workers are in start order: the gateway stops first, the leader
        // after the OSDs.
        while let Some(w) = self.workers.pop() {
            if w.name == "leader" {
                if let Some(mut s) = self.osds.take() {
                    s.stop();
                }
            }
            w.stop();
        }
        if let Some(mut s) = self.osds.take() {
            s.stop();
        }
        let _ = std::fs::remove_file(self.dir.join("nacre.pid"));
        let _ = std::fs::remove_file(meta_socket(&self.dir));
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
        if let Addr::Unix(p) = &self.nbd {
            let _ = std::fs::remove_file(p);
        }
    }
}
