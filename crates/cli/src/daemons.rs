//! A cluster on many hosts around etcd (docs/internals/cluster.md
//! *Running on many hosts*): `nacre cluster init`, `nacre pool create`,
//! `nacre osd init` and `nacre osd run --dev` (an OSD on its own device),
//! `nacre gateway nbd`. The monitors are in `crate::mon`.
//!
//! A device knows its cluster and OSD id: `osd init` writes them as the
//! store's label (`nacre_blockstore::read_label`), and `osd run` refuses a
//! device whose label names another cluster, or none.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nacre_blockstore::{FormatOptions, Store};
use nacre_io::net::Addr;
use nacre_io::{rt, FileDev, OpenFlags};
use nacre_meta::map::{self, OsdRecord, PoolRecord};
use nacre_meta::{MetaError, MetaStore, Range};
use nacre_osd::{LeaderAddr, OsdConfig};
use serde::{Deserialize, Serialize};

use crate::at::{elected_leader, EtcdArgs};
use crate::commands::{block_stop_signals, human, signal_name, wait_for_signal};
use crate::osds::{self, Serve};
use crate::Format;

/// PG logs of a store `nacre osd init` makes when no pool exists yet (64
/// MiB of the device).
pub const PG_LOGS_DEFAULT: u32 = 1024;
/// How often a waiting daemon looks again (for a pool, for a leader), and
/// an OSD for a new leader's address.
const POLL: Duration = Duration::from_millis(250);

/// What `nacre osd init` writes into the store's label.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Label {
    cluster: String,
    osd: u32,
}

/// `nacre cluster init --etcd URLS`.
pub fn cluster_init(e: &EtcdArgs, format: Format) -> anyhow::Result<()> {
    let meta = e.meta()?;
    let uuid = nacre_blockstore::uuid_string(&nacre_blockstore::random_uuid());
    map::init_cluster(&*meta, &uuid)
        .with_context(|| format!("under prefix {} of etcd {}", e.prefix, e.etcd))?;
    if format == Format::Json {
        let j = serde_json::json!({"cluster": uuid, "prefix": e.prefix, "etcd": e.etcd});
        println!("{j}");
        return Ok(());
    }
    println!(
        "created cluster {uuid} under prefix {} of etcd {}",
        e.prefix, e.etcd
    );
    println!("next: nacre osd init on each OSD's host, nacre pool create, then nacre mon, nacre osd run, nacre gateway nbd");
    Ok(())
}

/// The id of the cluster on `meta`: one made by `nacre cluster init`.
fn cluster_id(meta: &dyn MetaStore, e: &EtcdArgs) -> anyhow::Result<String> {
    map::cluster_uuid(meta)
        .with_context(|| format!("prefix {} of etcd {}", e.prefix, e.etcd))?
        .with_context(|| {
            format!(
                "the cluster under prefix {} of etcd {} has no id (not made by nacre cluster init)",
                e.prefix, e.etcd
            )
        })
}

pub struct PoolCreate {
    pub name: String,
    pub replicas: u8,
    /// Erasure coding instead of `replicas` copies.
    pub ec: Option<map::EcScheme>,
    pub min_size: Option<u8>,
    pub pgs: u32,
    pub failure_domain: String,
}

/// `nacre pool create NAME ...`: the pool and its PG table over the OSDs
/// that are in. A running leader (`nacre up`'s, an elected monitor's)
/// makes it, in a new epoch; with none, it is written to the meta store,
/// where the next leader finds it.
pub fn pool_create(at: &crate::at::At, p: &PoolCreate, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    map::cluster_uuid(&*meta)?;
    if !(1..=crate::cluster::PGS_MAX).contains(&p.pgs) {
        bail!("--pgs {}: give 1..={}", p.pgs, crate::cluster::PGS_MAX);
    }
    let (size, min_low, min_default) = match p.ec {
        // A write at min_size survives one more loss.
        Some(e) => (e.k + e.m, e.k, (e.k + 1).min(e.k + e.m)),
        None => {
            if !(1..=16).contains(&p.replicas) {
                bail!("--replicas {}: give 1..=16", p.replicas);
            }
            (p.replicas, 1, p.replicas / 2 + 1)
        }
    };
    let min_size = p.min_size.unwrap_or(min_default);
    if !(min_low..=size).contains(&min_size) {
        bail!("--min-size {min_size}: give {min_low}..={size}");
    }
    let m = map::load(&*meta)?;
    if let Some(q) = m.pool_named(&p.name) {
        bail!("a pool named {:?} exists already (id {})", p.name, q.id);
    }
    // Every copy or shard in its own failure domain, among the OSDs not
    // marked out (as placement counts them: an OSD registered that has
    // not booted yet counts).
    let outs = &m.state.out;
    let domains: std::collections::BTreeSet<String> = (m.osds.iter())
        .filter(|o| !outs.contains(&o.id) && o.weight > 0)
        .map(|o| match p.failure_domain.as_str() {
            "host" => o.host.clone(),
            "rack" => o.rack.clone(),
            _ => o.id.to_string(),
        })
        .collect();
    let have = domains.len();
    if have < usize::from(size) {
        let what = match p.ec {
            Some(e) => format!("erasure coding {e} puts its {size} shards"),
            None => format!("{size} replicas go"),
        };
        bail!(
            "{what} in {size} different failure domains ({}), and the cluster has {have} with OSDs in: add OSDs{}",
            p.failure_domain,
            if p.failure_domain == "osd" { "" } else { ", or give --failure-domain osd (a lost host then loses several)" }
        );
    }
    // An object is one store block per copy or shard: every pool's is the
    // stores'.
    let block = m
        .pools
        .first()
        .map_or(crate::cluster::OBJECT_BYTES, |q| q.shard_bytes());
    let mut pool = PoolRecord {
        id: 0,
        name: p.name.clone(),
        size,
        min_size,
        pg_count: p.pgs,
        failure_domain: p.failure_domain.clone(),
        object_bytes: block * p.ec.map_or(1, |e| u32::from(e.k)),
        ec: p.ec,
    };
    map::check_pool(&PoolRecord {
        id: 1,
        ..pool.clone()
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    map::check_pg_logs(&m, &pool)?;
    let leader = match &at.dir {
        Some(_) => Some(at.leader(&*meta)?),
        None => crate::at::elected_leader(&*meta)?,
    };
    let id = match leader {
        Some(addr) => {
            pool.id = map::reserve_pool_id(&*meta)?;
            pool_change(&addr, &nacre_osd::PoolChange::Create(pool.clone()))?;
            pool.id
        }
        None => map::create_pool(&*meta, &pool)?.record.id,
    };
    if format == Format::Json {
        pool.id = id;
        println!("{}", pool_json(&pool, &map::load(&*meta)?, None));
        return Ok(());
    }
    println!(
        "created pool {} (id {id}: {}, min_size {min_size}, {} PGs, failure domain {})",
        p.name,
        pool.scheme(),
        p.pgs,
        p.failure_domain,
    );
    Ok(())
}

/// Sends `change` to the cluster's leader at `leader` (`At::leader`).
fn pool_change(leader: &Addr, change: &nacre_osd::PoolChange) -> anyhow::Result<()> {
    let body = serde_json::to_vec(change)?;
    let ask = crate::at::Ask {
        op: nacre_wire::Op::PoolChange,
        id: 0,
        arg: 0,
        body: Some(&body),
    };
    crate::at::ask_leader_now(leader, &ask)
}

/// The pool named `name` of `m`, or an error naming the pools there are.
fn pool_named<'a>(
    m: &'a map::ClusterMap,
    name: &str,
    at: &crate::at::At,
) -> anyhow::Result<&'a PoolRecord> {
    m.pool_named(name).with_context(|| {
        let names: Vec<&str> = m.pools.iter().map(|p| p.name.as_str()).collect();
        format!(
            "no pool {name} in {}; the pools are: {}",
            at.name(),
            names.join(", ")
        )
    })
}

/// `nacre pool set NAME [--replicas N] [--min-size M]`.
pub fn pool_set(
    at: &crate::at::At,
    name: &str,
    replicas: Option<u8>,
    min_size: Option<u8>,
    format: Format,
) -> anyhow::Result<()> {
    if replicas.is_none() && min_size.is_none() {
        bail!("give --replicas N, --min-size M or both");
    }
    let meta = at.meta()?;
    let m = map::load(&*meta)?;
    let p = pool_named(&m, name, at)?;
    let size = replicas.unwrap_or(p.size);
    let min = min_size.unwrap_or(p.min_size);
    if let Some(e) = p.ec {
        // A shard's slot is its place in the code: the row is fixed.
        if replicas.is_some() {
            bail!("pool {name} is erasure-coded ({e}): its {} shards are fixed; --min-size may change (within {}..={})", e.k + e.m, e.k, e.k + e.m);
        }
        if !(e.k..=e.k + e.m).contains(&min) {
            bail!("pool {name} is erasure-coded ({e}): give {} <= min_size <= {} (below {} shards nothing reads back)", e.k, e.k + e.m, e.k);
        }
    } else if !(1..=16).contains(&size) || !(1..=size).contains(&min) {
        bail!("{size} copies and min_size {min}: give 1 <= min_size <= replicas <= 16");
    }
    let change = nacre_osd::PoolChange::Set {
        id: p.id,
        size: replicas,
        min_size,
    };
    pool_change(&at.leader(&*meta)?, &change)?;
    if format == Format::Json {
        let j = serde_json::json!({"name": name, "id": p.id, "replicas": p.ec.is_none().then_some(size), "min_size": min, "moving": size != p.size});
        println!("{j}");
        return Ok(());
    }
    println!(
        "pool {name}: {}, min_size {min}{}",
        PoolRecord { size, ..p.clone() }.scheme(),
        if size != p.size {
            " (its PGs move to their new members in the background; nacre status shows it)"
        } else {
            ""
        }
    );
    Ok(())
}

/// `nacre pool rm NAME`: refused while a volume uses the pool (the
/// volumes are listed). The pool is first marked as being removed, in a
/// transaction that sees no volume in it (so no volume is created in it
/// after), then the leader drops it.
pub fn pool_rm(at: &crate::at::At, name: &str, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    let m = map::load(&*meta)?;
    let p = pool_named(&m, name, at)?.clone();
    let vols = map::mark_pool_removing(&*meta, p.id)?;
    if !vols.is_empty() {
        bail!(
            "pool {name} holds volumes {}: remove them first (nacre volume rm)",
            vols.join(", ")
        );
    }
    let remove = nacre_osd::PoolChange::Remove { id: p.id };
    (at.leader(&*meta).and_then(|l| pool_change(&l, &remove))).with_context(|| {
        format!("pool {name} is marked for removal (no volume can be created in it): run nacre pool rm {name} again")
    })?;
    if format == Format::Json {
        println!(
            "{}",
            serde_json::json!({"name": name, "id": p.id, "removed": true})
        );
        return Ok(());
    }
    println!("pool {name} removed: the OSDs delete what they hold of it");
    Ok(())
}

/// A pool in JSON: `replicas` for a replicated pool, `ec` for an
/// erasure-coded one, `size` the copies or shards either way;
/// `usable_bytes` what it could hold if it had the raw space `raw` (the
/// OSDs in, up to their full ratio) alone.
fn pool_json(p: &PoolRecord, m: &map::ClusterMap, raw: Option<u64>) -> serde_json::Value {
    serde_json::json!({
        "name": p.name, "id": p.id, "scheme": p.scheme(), "size": p.size,
        "replicas": p.ec.is_none().then_some(p.size), "ec": p.ec, "min_size": p.min_size,
        "pgs": p.pg_count, "failure_domain": p.failure_domain, "object_bytes": p.object_bytes,
        "shard_bytes": p.shard_bytes(), "data_fraction": p.data_fraction(),
        "usable_bytes": raw.map(|r| (r as f64 * p.data_fraction()) as u64),
        "epoch": m.table(p.id).map(|_| m.epoch()),
    })
}

/// The raw space the OSDs in can fill (`commands::raw_usable`), if every
/// one of them answers.
fn raw_space(meta: &Arc<dyn MetaStore>, m: &map::ClusterMap) -> Option<u64> {
    let outs = map::out_osds(&**meta, m).ok()?;
    let stats = rt::block_on(async {
        let c = nacre_client::Cluster::connect(meta.clone()).ok()?;
        Some(c.osd_stats().await)
    })?;
    crate::commands::raw_usable(&stats, &outs)
}

/// `nacre pool ls` and `nacre pool info NAME`.
pub fn pool_show(
    at: &crate::at::At,
    name: Option<&str>,
    format: crate::Format,
) -> anyhow::Result<()> {
    let meta = at.meta()?;
    let m = map::load(&*meta)?;
    let pools: Vec<&PoolRecord> = match name {
        Some(n) => vec![pool_named(&m, n, at)?],
        None => m.pools.iter().collect(),
    };
    let raw = raw_space(&meta, &m);
    match format {
        crate::Format::Json => {
            let j: Vec<_> = pools.iter().map(|p| pool_json(p, &m, raw)).collect();
            if name.is_some() {
                println!("{}", j[0]);
            } else {
                println!("{}", serde_json::Value::Array(j));
            }
        }
        crate::Format::Table => {
            println!(
                "{:<20} {:>4} {:>10} {:>8} {:>6} {:>10}  failure domain",
                "name", "id", "scheme", "min_size", "pgs", "usable"
            );
            for p in pools {
                let usable = raw.map_or("unknown".into(), |r| {
                    crate::commands::human((r as f64 * p.data_fraction()) as u64)
                });
                let scheme = match p.ec {
                    Some(e) => format!("EC {e}"),
                    None => format!("{}×", p.size),
                };
                println!(
                    "{:<20} {:>4} {:>10} {:>8} {:>6} {:>10}  {}",
                    p.name, p.id, scheme, p.min_size, p.pg_count, usable, p.failure_domain
                );
            }
            if raw.is_some() && m.pools.len() > 1 {
                println!("(usable: what each pool could hold alone; the pools share the OSDs)");
            }
        }
    }
    Ok(())
}

pub struct OsdInit {
    pub dev: PathBuf,
    pub addr: Addr,
    pub host: Option<String>,
    pub rack: String,
    pub weight: Option<u32>,
    /// Create `dev` as a file of this size if it does not exist.
    pub size_bytes: Option<u64>,
    pub journal_bytes: Option<u64>,
    pub pg_logs: Option<u32>,
    /// Format a device that holds a Nacre store.
    pub force: bool,
}

/// This machine's host name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Can `path` (a file, or a block device) be opened with O_DIRECT?
fn direct_works(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .is_ok()
}

/// `nacre osd init --dev PATH ...`: registers an OSD, then formats its
/// device with the cluster's id and the OSD's in the store's label.
pub fn osd_init(e: &EtcdArgs, o: &OsdInit, format: Format) -> anyhow::Result<()> {
    let meta = e.meta()?;
    let cluster = cluster_id(&*meta, e)?;
    let m = map::load(&*meta)?;
    let pool_pgs = crate::cluster::all_pgs(&m);
    let pg_logs = o.pg_logs.unwrap_or(pool_pgs.max(PG_LOGS_DEFAULT));
    if pool_pgs > pg_logs {
        bail!("--pg-logs {pg_logs}: the pools have {pool_pgs} PGs in all; give at least that");
    }
    let created = !o.dev.exists();
    if created && o.size_bytes.is_none() {
        bail!(
            "{} does not exist: give a block device, or --size to create a file",
            o.dev.display()
        );
    }
    let flags = OpenFlags {
        create_bytes: o.size_bytes.filter(|_| created),
        ..OpenFlags::default()
    };
    rt::block_on(format_osd(e, o, &*meta, &flags, &cluster, pg_logs, format))
}

/// The device part of [`osd_init`], on the runtime.
async fn format_osd(
    e: &EtcdArgs,
    o: &OsdInit,
    meta: &dyn MetaStore,
    flags: &OpenFlags,
    cluster: &str,
    pg_logs: u32,
    format: Format,
) -> anyhow::Result<()> {
    let created = flags.create_bytes.is_some();
    let dev = FileDev::open(&o.dev, flags).with_context(|| format!("{}", o.dev.display()))?;
    let bytes = nacre_io::BlockDev::size_bytes(&dev);
    if !created {
        if let Some(what) = held_by(&dev).await? {
            if !o.force {
                bail!(
                    "{} holds {what}; give --force to destroy it",
                    o.dev.display()
                );
            }
            tracing::warn!("{}: destroying {what}", o.dev.display());
        }
    }
    crate::cluster::plan_store(bytes, o.journal_bytes, pg_logs)
        .map_err(|err| anyhow::anyhow!("{} ({}): {err}", o.dev.display(), human(bytes)))?;
    let uuid = nacre_blockstore::random_uuid();
    let logs = nacre_osd::pg_log_region(pg_logs);
    let rec = map::register_osd(
        meta,
        OsdRecord {
            id: 0,
            addr: o.addr.to_string(),
            host: o.host.clone().unwrap_or_else(hostname),
            rack: o.rack.clone(),
            weight: o.weight.unwrap_or(((bytes >> 30) as u32).max(1)),
            pg_logs: logs.slots,
            store: nacre_blockstore::uuid_string(&uuid),
            removed: false,
        },
    )?;
    let label = serde_json::to_vec(&Label {
        cluster: cluster.to_string(),
        osd: rec.id,
    })?;
    let fo = FormatOptions {
        block_bytes: crate::cluster::OBJECT_BYTES,
        journal_bytes: o.journal_bytes,
        pg_logs: logs,
        uuid: Some(uuid),
        label,
        ..FormatOptions::default()
    };
    // The key that has it marked in at its first boot goes first: once
    // the device is formatted there is nothing left to undo.
    let formatted = async {
        meta.put(&map::fresh_key(rec.id), Vec::new(), 0)?;
        Store::format(&dev, &fo).await?;
        anyhow::Ok(())
    };
    if let Err(err) = formatted.await {
        // The id goes back: no device carries it. (A record left behind
        // names a store no device holds: `osd run` would refuse any.)
        let _ = meta.delete(&Range::key(&map::fresh_key(rec.id)));
        let _ = meta.delete(&Range::key(&map::osd_key(rec.id)));
        return Err(err.context(format!("formatting {}", o.dev.display())));
    }
    if format == Format::Json {
        let j = serde_json::json!({
            "osd": rec.id, "cluster": cluster, "dev": o.dev, "bytes": bytes,
            "host": rec.host, "rack": rec.rack, "weight": rec.weight, "addr": rec.addr,
        });
        println!("{j}");
        return Ok(());
    }
    println!(
        "osd.{} of cluster {cluster} on {} ({}, host {}, rack {}); start it with: nacre osd run --etcd {} --dev {}",
        rec.id,
        o.dev.display(),
        human(bytes),
        rec.host,
        rec.rack,
        e.etcd,
        o.dev.display()
    );
    Ok(())
}

/// How many bytes at each end of a device must be zeros for `osd init` to
/// take it as empty: file systems, partition tables and volume managers
/// write their labels within the first MiB (btrfs at 64 KiB), and some at
/// the end (the backup GPT, md 0.90 and 1.0).
const EMPTY_PROBE_BYTES: usize = 1 << 20;

/// What `dev` holds, if anything: a Nacre store (by its label), or data in
/// its first or last [`EMPTY_PROBE_BYTES`].
async fn held_by(dev: &FileDev) -> anyhow::Result<Option<String>> {
    if let Ok((g, label)) = nacre_blockstore::read_label(dev).await {
        return Ok(Some(
            match label.as_deref().map(serde_json::from_slice::<Label>) {
                Some(Ok(l)) => format!("osd.{} of cluster {}", l.osd, l.cluster),
                _ => format!("Nacre store {}", nacre_blockstore::uuid_string(&g.uuid)),
            },
        ));
    }
    let size = nacre_io::BlockDev::size_bytes(dev);
    let n = (EMPTY_PROBE_BYTES as u64).min(size);
    let n = n - n % 4096;
    for at in [0, (size - n) & !4095] {
        if n == 0 {
            break;
        }
        let b = nacre_io::BlockDev::read_at(dev, nacre_io::AlignedBuf::new(n as usize), at).await?;
        if !b.iter().all(|&x| x == 0) {
            return Ok(Some(
                "data (its first or last MiB is not zeros: a file system, a partition table, another store?)"
                    .into(),
            ));
        }
    }
    Ok(None)
}

/// Waits until `get` gives something, saying once what it waits for. A
/// meta store that cannot be reached (an etcd member restarting, a
/// network cut) counts as "not yet": a daemon waits for it rather than
/// exit.
pub fn wait_for<T>(
    what: &str,
    mut get: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let t0 = Instant::now();
    let mut said = false;
    loop {
        match get() {
            Ok(Some(x)) => return Ok(x),
            Ok(None) => {}
            Err(e) if unreachable_store(&e) => tracing::debug!("waiting for {what}: {e:#}"),
            Err(e) => return Err(e),
        }
        if !said && t0.elapsed() > Duration::from_secs(2) {
            tracing::warn!("waiting for {what}");
            said = true;
        }
        std::thread::sleep(POLL);
    }
}

/// Whether `e` says the meta store could not be reached (worth waiting
/// for), not that it refused.
fn unreachable_store(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<MetaError>(),
            Some(MetaError::Unavailable(_))
        )
    })
}

/// The cluster's id, waiting while etcd cannot be reached (a daemon's
/// first call).
pub fn cluster_id_waiting(meta: &dyn MetaStore, e: &EtcdArgs) -> anyhow::Result<String> {
    wait_for("etcd", || cluster_id(meta, e).map(Some))
}

pub struct OsdRun {
    pub dev: PathBuf,
    pub recovery_bytes_per_s: u64,
    pub ratios: (f64, f64),
    pub scrub: nacre_osd::ScrubConfig,
    /// Where to serve the OSD's metrics (HOST:PORT).
    pub metrics: Option<String>,
}

/// `nacre osd run --etcd URLS --dev PATH`: the OSD whose id the device's
/// label holds, in the foreground until SIGTERM or SIGINT.
pub fn osd_run(e: &EtcdArgs, o: &OsdRun) -> anyhow::Result<()> {
    let set = block_stop_signals();
    let meta = e.meta_waiting()?;
    let cluster = cluster_id_waiting(&*meta, e)?;
    let direct = direct_works(&o.dev);
    let flags = OpenFlags {
        direct,
        ..OpenFlags::default()
    };
    let (g, label) = rt::block_on(async {
        let dev = FileDev::open(&o.dev, &flags)?;
        anyhow::Ok(nacre_blockstore::read_label(&dev).await?)
    })
    .with_context(|| {
        format!(
            "{}: no OSD store (nacre osd init makes one)",
            o.dev.display()
        )
    })?;
    let label: Label = match label.as_deref().map(serde_json::from_slice) {
        Some(Ok(l)) => l,
        Some(Err(err)) => bail!(
            "{}: the store's label is not an OSD's: {err}",
            o.dev.display()
        ),
        None => bail!(
            "{}: a store without an OSD label (not made by nacre osd init)",
            o.dev.display()
        ),
    };
    if label.cluster != cluster {
        bail!(
            "{} is osd.{} of cluster {}, not of this cluster {cluster} (prefix {} of etcd {}): refusing to serve it here",
            o.dev.display(),
            label.osd,
            label.cluster,
            e.prefix,
            e.etcd
        );
    }
    let id = label.osd;
    let m = wait_for("etcd", || Ok(Some(map::load(&*meta)?)))?;
    if m.removed.contains(&id) {
        bail!(
            "osd.{id} of {} was removed from the cluster (nacre osd rm): refusing to serve it; `nacre osd init --force` makes the device a new OSD",
            o.dev.display()
        );
    }
    let rec = (m.osd(id).cloned()).with_context(|| {
        format!(
            "osd.{id} of {} is not registered in the cluster (removed?)",
            o.dev.display()
        )
    })?;
    let store = nacre_blockstore::uuid_string(&g.uuid);
    if !rec.store.is_empty() && rec.store != store {
        bail!(
            "{} holds store {store}, but osd.{id} was formatted as store {} (another device labelled osd.{id}?): refusing to serve it",
            o.dev.display(),
            rec.store
        );
    }
    let leader = wait_for("an elected monitor (nacre mon)", || elected_leader(&*meta))?;
    let leader = LeaderAddr::new(leader);
    follow_leader(meta.clone(), leader.clone())?;
    let cfg = OsdConfig {
        id,
        path: o.dev.clone(),
        size_bytes: 0,
        addr: rec.addr.parse().map_err(anyhow::Error::msg)?,
        // The store exists (`osd init` formatted it): these only check it.
        object_bytes: g.block_bytes,
        journal_bytes: None,
        pg_log_slots: rec.pg_logs,
        direct,
        leader,
    };
    tracing::info!("osd.{id}: {} at {}", o.dev.display(), rec.addr);
    osds::serve(
        Serve {
            meta,
            cfg,
            recovery_bytes_per_s: o.recovery_bytes_per_s,
            ratios: o.ratios,
            scrub: o.scrub,
            joins: true,
            metrics: o.metrics.clone(),
        },
        set,
    )
}

/// Keeps `leader` at the elected monitor's address, from a thread that
/// lives as long as the process.
fn follow_leader(meta: Arc<dyn MetaStore>, leader: LeaderAddr) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("leader-addr".into())
        .spawn(move || loop {
            match elected_leader(&*meta) {
                Ok(Some(a)) if a != leader.get() => {
                    tracing::info!("the leader is now at {a}");
                    leader.set(a);
                }
                Ok(_) => {}
                Err(err) => tracing::debug!("looking for the leader: {err:#}"),
            }
            std::thread::sleep(POLL);
        })?;
    Ok(())
}

/// `nacre gateway nbd --etcd URLS --listen ADDR`: an NBD gateway in the
/// foreground until SIGTERM or SIGINT.
pub fn gateway_nbd(e: &EtcdArgs, listen: &Addr, metrics: Option<&str>) -> anyhow::Result<()> {
    let set = block_stop_signals();
    let meta = e.meta_waiting()?;
    cluster_id_waiting(&*meta, e)?;
    wait_for("a pool (nacre pool create)", || {
        Ok(map::load(&*meta)?.pools.first().cloned())
    })?;
    let (tx, rx) = std::sync::mpsc::channel();
    let counters = Arc::new(nacre_nbd::metrics::NbdMetrics::default());
    let w = crate::cluster::spawn_gateway(meta.clone(), listen.clone(), counters.clone(), tx)?;
    rx.recv()
        .context("the gateway thread died while starting")??;
    let sources = crate::metrics::Sources {
        meta,
        osds: crate::metrics::Osds::None,
        cluster: false,
        mon: None,
        gateway: Some(counters),
    };
    let endpoint = metrics
        .map(|a| crate::metrics::serve(a, sources))
        .transpose()?;
    tracing::info!("gateway: serving NBD on {listen}");
    let sig = wait_for_signal(&set);
    tracing::info!("gateway: {}, stopping", signal_name(sig));
    w.stop();
    drop(endpoint);
    if let Addr::Unix(p) = listen {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}
