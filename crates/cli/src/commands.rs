//! The cluster commands: `up`, `osd start`, `volume`, `status`, `bench`,
//! `demo`.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use nacre_bench::suite::{self, SuiteOpts, SuiteResult};
use nacre_client::{Cluster, Volume};
use nacre_io::net::Addr;
use nacre_io::{rt, AlignedBuf, FileDev, OpenFlags};
use nacre_meta::map;
use nacre_meta::MetaStore;
use nacre_nbd::client::NbdClient;

use crate::args::{parse_duration, parse_rate, parse_ratio, parse_size};
use crate::at::{ask_leader_now, Ask, At};
use crate::cluster::{self, UpOpts};
use crate::targets::{NbdTarget, VolumeTarget};
use crate::Format;
use nacre_types::PgId;

/// Blocks SIGINT and SIGTERM in this thread and every thread it starts
/// later, so that [`wait_for_signal`] can take them synchronously.
pub(crate) fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain signal-mask calls on a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

pub(crate) fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: sigwait on a set of blocked signals.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

#[derive(Args)]
pub struct UpArgs {
    /// The cluster's directory: its meta store, OSD files (osd.N.img),
    /// sockets and pid files. Created on the first start; give the same
    /// one to restart the cluster with its data.
    #[arg(long)]
    dir: PathBuf,
    /// Number of OSDs (one file and one process each); default 3 for a
    /// new cluster. On a cluster that exists, leave it out to keep its
    /// OSDs, or give more to add OSDs: placement gives them their share of
    /// the PGs and the data moves to them in the background.
    #[arg(long)]
    osds: Option<u32>,
    /// Size of each OSD's file when it is created: a number and a unit
    /// (B, K, M, G, T; binary), e.g. 4G or 1.5T; default 4G. A store
    /// cannot grow: on a cluster that exists it must match, or be left
    /// out.
    #[arg(long, value_parser = parse_size)]
    osd_size: Option<u64>,
    /// Copies of every object, each on its own OSD, set when the cluster
    /// is created. I/O goes on while at least replicas/2 + 1 are up.
    #[arg(long, default_value_t = 3)]
    replicas: u8,
    /// Placement groups of the pool, set when the cluster is created
    /// (1..=16384; default about 64 PG copies per OSD, a power of two, at
    /// least 32). More PGs spread data more evenly and cost memory and
    /// peering time per OSD.
    #[arg(long)]
    pgs: Option<u32>,
    /// Where the NBD gateway listens (default unix:DIR/nbd.sock).
    #[arg(long)]
    nbd: Option<String>,
    /// Journal size of each OSD's store when it is created (default
    /// 1/64 of the OSD, 64 MiB..1 GiB). A small journal folds and
    /// checkpoints often.
    #[arg(long, value_parser = parse_size)]
    journal_size: Option<u64>,
    /// Leave an OSD process that dies stopped (by default it is
    /// restarted after 5 s, later ones after longer delays while it
    /// keeps dying); `nacre osd start` starts it.
    #[arg(long)]
    no_restart: bool,
    /// Bytes per second each OSD pushes to copies of its PGs that lack
    /// objects (an OSD back after missing writes, a replaced disk), while
    /// the PGs serve clients: e.g. 50M. Higher finishes sooner and slows
    /// client I/O more.
    #[arg(long, value_parser = parse_rate, default_value = "100M")]
    recovery_rate: u64,
    /// Used fraction of an OSD at which `nacre status` warns (OSD_NEARFULL,
    /// HEALTH_WARN), e.g. 0.85 or 85%.
    #[arg(long, value_parser = parse_ratio, default_value = "0.85")]
    nearfull_ratio: f64,
    /// Used fraction of an OSD beyond which writes that need new space are
    /// refused with ENOSPC (OSD_FULL, HEALTH_ERR) while reads, overwrites,
    /// deletes, trims and recovery go on: the rest is kept so that a full
    /// cluster can still recover and be emptied.
    #[arg(long, value_parser = parse_ratio, default_value = "0.95")]
    full_ratio: f64,
    #[command(flatten)]
    scrub: crate::args::ScrubArgs,
    /// How long an OSD may be down before it is marked out and its PGs
    /// move to the others (it is marked in again when it comes back), e.g.
    /// 10m or 30s; 0 never.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    out_delay: Duration,
    /// What the leader does with an OSD whose store writes stand far above
    /// the others' (SLOW_OSD): demote it from leading PGs, or only warn.
    #[arg(long, value_enum, default_value = "demote")]
    slow_osd_action: crate::args::SlowOsdAction,
    /// `nacre status` warns (VOLUMES_OVERCOMMITTED) when the volumes'
    /// sizes add up to more than this many times what the cluster can
    /// hold at its replicas and full ratio (volumes are thin: writes fail
    /// with ENOSPC once the OSDs are full); 0 never.
    #[arg(long, value_parser = crate::args::parse_factor, default_value = "1")]
    overcommit_ratio: f64,
    /// How often the cluster looks for objects of deleted volumes (left by
    /// a purge that missed a down OSD) and deletes them, e.g. 60s.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    reclaim_interval: Duration,
    /// Serve Prometheus metrics of the whole cluster (every OSD, the map,
    /// the NBD gateway) on http://HOST:PORT/metrics, e.g. 127.0.0.1:9283.
    #[arg(long, value_parser = crate::args::parse_metrics_addr)]
    metrics: Option<String>,
}

/// `nacre up --osd-size` when it is not given.
const OSD_SIZE_DEFAULT: u64 = 4 << 30;
/// Repairs of damaged copies on one OSD since it started from which
/// `nacre status` warns that its disk may be failing (Ceph warns at 10 too).
const REPAIRS_WARN: u64 = 10;

pub fn up(a: UpArgs) -> anyhow::Result<()> {
    // Absolute, so that what it prints (attach URIs, sockets) works from
    // anywhere.
    let dir = std::path::absolute(&a.dir).with_context(|| format!("--dir {}", a.dir.display()))?;
    let replicas = a.replicas;
    let nbd: Addr = match a.nbd {
        Some(s) => s.parse().map_err(anyhow::Error::msg)?,
        None => Addr::Unix(dir.join("nbd.sock")),
    };
    let set = block_stop_signals();
    let o = UpOpts {
        dir: dir.clone(),
        osds: a.osds,
        pgs: a.pgs,
        osd_size_bytes: a.osd_size.unwrap_or(OSD_SIZE_DEFAULT),
        osd_size_given: a.osd_size.is_some(),
        journal_bytes: a.journal_size,
        replicas,
        nbd: nbd.clone(),
        restart: !a.no_restart,
        recovery_bytes_per_s: a.recovery_rate,
        ratios: crate::args::check_ratios(a.nearfull_ratio, a.full_ratio)?,
        scrub: a.scrub.config(),
        out_delay: a.out_delay,
        demote_slow: a.slow_osd_action == crate::args::SlowOsdAction::Demote,
        config: map::ClusterConfig {
            overcommit_ratio: a.overcommit_ratio,
        },
        reclaim_interval: a.reclaim_interval,
        metrics: a.metrics.clone(),
    };
    let mut running = cluster::start(&o)?;
    let vols = map::list_volumes(&*running.meta)?;
    let osds = map::load(&*running.meta)?.osds.len();
    println!(
        "nacre up: {osds} OSDs in {}, {replicas} replicas; NBD on {nbd}; meta on unix:{}",
        dir.display(),
        cluster::meta_socket(&dir).display()
    );
    println!(
        "volumes: {}",
        if vols.is_empty() {
            "none yet (nacre volume create NAME --size SIZE --dir DIR)".to_string()
        } else {
            vols.iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    if let Addr::Unix(p) = &nbd {
        println!("attach: nbd+unix:///VOLUME?socket={}", p.display());
    } else if let Addr::Tcp(hp) = &nbd {
        println!("attach: nbd://{hp}/VOLUME");
    }
    if let Some(m) = &running.metrics {
        println!("metrics: http://{}/metrics", m.addr);
    }
    let sig = wait_for_signal(&set);
    eprintln!("nacre up: {}, stopping", signal_name(sig));
    running.stop();
    eprintln!("nacre up: stopped");
    Ok(())
}

/// What the operator sent, by name.
pub(crate) fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT (Ctrl-C)".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGBUS => "SIGBUS".into(),
        s => format!("signal {s}"),
    }
}

/// The meta store of the cluster running in `dir`.
fn remote(dir: &Path) -> anyhow::Result<Arc<dyn MetaStore>> {
    At::of_dir(dir).meta()
}

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Create a thin volume.
    Create {
        /// Name of the new volume: 1 to 128 of A-Z a-z 0-9 . _ - (not
        /// starting with '.'); NBD clients ask for it as the export name.
        name: String,
        /// Size: a number and a unit (B, K, M, G, T; binary), e.g. 20G or
        /// 1.5T. Thin: nothing is allocated until written.
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// The pool to keep it in (default: the only pool, else `rbd`).
        #[arg(long)]
        pool: Option<String>,
        #[command(flatten)]
        at: At,
        /// Output: text for people, or JSON for scripts (the volume made).
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// List volumes.
    Ls {
        #[command(flatten)]
        at: At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show one volume.
    Info {
        /// The volume.
        name: String,
        #[command(flatten)]
        at: At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Grow or shrink a volume. Shrinking deletes the data past the new
    /// end (a later grow reads zeros there) and is refused while clients
    /// have the volume open, unless --force. Open connections see a new
    /// size at once, but NBD clients learn it only when they reconnect.
    Resize {
        /// The volume.
        name: String,
        /// New size: a number and a unit (B, K, M, G, T; binary).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Shrink even while clients have the volume open: their writes
        /// past the new end fail (ENOSPC) from then on.
        #[arg(long)]
        force: bool,
        /// A shrink returns once the new size is recorded: the monitor's
        /// sweep (every --reclaim-interval) deletes the data past the new
        /// end, as it finishes a shrink whose command was stopped. A later
        /// grow deletes it first if the sweep has not. (A grow always
        /// waits.)
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        at: At,
        /// Output: text for people, or JSON for scripts (the volume as
        /// resized).
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Delete a volume and its data. Refused while clients have it open,
    /// unless --force.
    Rm {
        /// The volume.
        name: String,
        /// Delete even while clients have the volume open: their
        /// connections are cut first, and their later I/O fails.
        #[arg(long)]
        force: bool,
        /// Return once the volume is marked deleting (new connections are
        /// refused from then on): the monitor's sweep deletes its data and
        /// its record, as it finishes a delete whose command was stopped.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        at: At,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

/// A volume's record in JSON; its pool by name (`pool`) and id
/// (`pool_id`); `cutting`: data past its end still being deleted.
fn volume_record_json(v: &map::VolumeRecord, m: &map::ClusterMap) -> serde_json::Value {
    serde_json::json!({
        "name": v.name, "id": v.id, "size_bytes": v.size_bytes,
        "object_bytes": v.object_bytes, "pool": pool_name(m, v.pool), "pool_id": v.pool,
        "created_unix_s": v.created_unix_s, "deleting": v.deleting,
        "cutting": v.stale_until > v.size_bytes,
    })
}

/// [`volume_record_json`] and what the volume holds (`used_bytes`, one
/// copy; `raw_used_bytes`, every copy).
fn volume_json(v: &map::VolumeRecord, m: &map::ClusterMap, u: &Usage) -> serde_json::Value {
    let used = u.of(v.id);
    let mut j = volume_record_json(v, m);
    j["used_bytes"] = used.bytes.into();
    j["raw_used_bytes"] = used.raw_bytes.into();
    j["objects"] = used.objects.into();
    j["usage_missing_osds"] = serde_json::json!(u.missing);
    j
}

/// What the volumes hold, over the OSDs that answered.
struct Usage {
    per: std::collections::BTreeMap<u64, nacre_client::VolumeUse>,
    /// OSDs down or silent: their copies are not counted.
    missing: Vec<u32>,
}

impl Usage {
    fn load(meta: Arc<dyn nacre_meta::MetaStore>) -> anyhow::Result<Usage> {
        rt::block_on(async {
            let (per, missing) = Cluster::connect(meta)?.volume_usage().await;
            anyhow::Ok(Usage { per, missing })
        })
    }

    fn of(&self, id: u64) -> nacre_client::VolumeUse {
        self.per.get(&id).copied().unwrap_or_default()
    }

    /// A note under a table when some OSD was not counted.
    fn note(&self) -> Option<String> {
        (!self.missing.is_empty()).then(|| {
            let m: Vec<String> = self.missing.iter().map(|o| format!("osd.{o}")).collect();
            format!(
                "(used: {} did not answer; their primaries' objects are not counted)",
                m.join(", ")
            )
        })
    }
}

fn pool_name(m: &map::ClusterMap, id: u32) -> String {
    m.pool(id)
        .map_or_else(|| format!("(pool {id}, gone)"), |p| p.name.clone())
}

pub(crate) fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// `nacre osd start ID --dir DIR`.
pub fn osd_start(dir: &Path, id: u32, format: Format) -> anyhow::Result<()> {
    let dir = std::path::absolute(dir)?;
    let (pid, already) = crate::osds::start(&dir, id, &*remote(&dir)?)?;
    match format {
        Format::Json => println!(
            "{}",
            serde_json::json!({ "osd": id, "pid": pid, "already_running": already })
        ),
        Format::Table if already => println!("osd.{id} already runs (pid {pid})"),
        Format::Table => println!("osd.{id} started (pid {pid})"),
    }
    Ok(())
}

/// `nacre osd add --dir DIR [--size S]`: a new OSD (file, store, process)
/// in the running cluster, which then takes its share of the PGs; their
/// data moves to it in the background while they serve.
pub fn osd_add(dir: &Path, size: Option<u64>, format: Format) -> anyhow::Result<()> {
    let dir = std::path::absolute(dir)?;
    let meta = remote(&dir)?;
    let m = map::load(&*meta)?;
    let bytes = match size.or_else(|| cluster::store_bytes(&dir)) {
        Some(b) => b,
        None => bail!(
            "give --size: no OSD file in {} to take the size from",
            dir.display()
        ),
    };
    let pgs = cluster::all_pgs(&m);
    cluster::plan_store(bytes, None, pgs).map_err(|e| {
        anyhow::anyhow!("--size {}: an OSD store cannot be made: {e}", human(bytes))
    })?;
    let id = m.next_osd_id();
    let rec = cluster::osd_record(&dir, id, bytes, pgs);
    map::add_osd(&*meta, &rec)?;
    // Out at first: it holds no PG until it runs, then is marked in.
    let leader = cluster::leader_addr(&dir);
    let add = Ask {
        op: nacre_wire::Op::AddOsd,
        id,
        arg: 0,
        body: Some(rec.addr.as_bytes()),
    };
    ask_leader_now(&leader, &add)?;
    crate::osds::start_sized(&dir, id, &*meta, Some(bytes))?;
    let mark_in = Ask {
        op: nacre_wire::Op::MarkOut,
        id,
        arg: 0,
        body: None,
    };
    ask_leader_now(&leader, &mark_in)?;
    match format {
        Format::Json => println!(
            "{}",
            serde_json::json!({ "osd": id, "size_bytes": bytes, "addr": rec.addr, "weight": rec.weight })
        ),
        Format::Table => println!(
            "osd.{id} added ({}): its share of the PGs moves to it while they serve (nacre status shows the recovery)",
            human(bytes)
        ),
    }
    Ok(())
}

/// `nacre osd out|in ID`: asks the leader of the cluster in `dir` to move
/// OSD `id`'s PGs to the others (`out`) or to place PGs on it again.
pub fn osd_mark(at: &At, id: u32, out: bool, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    // The map names the OSDs; this also says when no cluster runs there.
    let m = map::load(&*meta)?;
    let was_out = m.state.out.contains(&id);
    let mark = Ask {
        op: nacre_wire::Op::MarkOut,
        id,
        arg: u64::from(out),
        body: None,
    };
    ask_leader_now(&at.leader(&*meta)?, &mark)?;
    let what = if out { "out" } else { "in" };
    if format == Format::Json {
        // `changed`: false if it already was.
        println!(
            "{}",
            serde_json::json!({ "osd": id, "in": !out, "changed": was_out != out })
        );
    } else if was_out == out {
        println!("osd.{id} is already {what}");
    } else if out {
        println!("osd.{id} marked out: its PGs move to the other OSDs while they serve (nacre status shows the recovery)");
    } else {
        println!("osd.{id} marked in: PGs move back to it while they serve (nacre status shows the recovery)");
    }
    Ok(())
}

/// `nacre osd rm`: the leader takes the OSD out of the map (it refuses
/// unless the OSD is down, out, and no PG counts on its copies), then its
/// record is marked removed (its id is never given again).
pub fn osd_rm(at: &At, id: u32, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    let m = map::load(&*meta)?;
    // `changed`: false if it already was removed.
    let json =
        |changed: bool| serde_json::json!({ "osd": id, "removed": true, "changed": changed });
    if m.removed.contains(&id) {
        match format {
            Format::Json => println!("{}", json(false)),
            Format::Table => println!("osd.{id} is already removed"),
        }
        return Ok(());
    }
    if m.osd(id).is_none() {
        let ids: Vec<String> = m.osds.iter().map(|o| format!("osd.{}", o.id)).collect();
        bail!("no osd.{id}; the OSDs are {}", ids.join(", "));
    }
    let rm = Ask {
        op: nacre_wire::Op::RmOsd,
        id,
        arg: 0,
        body: None,
    };
    ask_leader_now(&at.leader(&*meta)?, &rm)?;
    map::retire_osd(&*meta, id)?;
    if format == Format::Json {
        println!("{}", json(true));
        return Ok(());
    }
    println!("osd.{id} removed: its id is not given again; its device holds nothing the cluster needs (nacre osd init --force formats it for a new OSD)");
    Ok(())
}

/// `nacre osd ls`: every OSD registered, where it is, whether it is up
/// and in, and how many PGs placement gives it (and leads).
pub fn osd_ls(at: &At, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    let m = map::load(&*meta)?;
    let mut rows = Vec::new();
    let outs = map::out_osds(&*meta, &m)?;
    for o in &m.osds {
        let (mut pgs, mut primary) = (0, 0);
        for t in &m.tables {
            for pg in 0..t.pg_count() {
                pgs += usize::from(t.placement(pg).contains(&o.id));
                primary += usize::from(t.primary(pg, &m.state) == Some(o.id));
            }
        }
        let out = outs.contains(&o.id);
        rows.push(serde_json::json!({
            "id": o.id,
            "host": o.host,
            "rack": o.rack,
            "weight": o.weight,
            "addr": o.addr,
            "up": m.is_up(o.id),
            "in": !out,
            "pgs": pgs,
            "primary_pgs": primary,
        }));
    }
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Format::Table => {
            println!(
                "{:<7} {:<12} {:<10} {:>6} {:<5} {:<4} {:>5} {:>8}  addr",
                "osd", "host", "rack", "weight", "up", "in", "pgs", "primary"
            );
            for r in &rows {
                println!(
                    "{:<7} {:<12} {:<10} {:>6} {:<5} {:<4} {:>5} {:>8}  {}",
                    format!("osd.{}", r["id"]),
                    r["host"].as_str().unwrap_or(""),
                    r["rack"].as_str().unwrap_or(""),
                    r["weight"].to_string(),
                    if r["up"] == true { "up" } else { "down" },
                    if r["in"] == true { "in" } else { "out" },
                    r["pgs"].to_string(),
                    r["primary_pgs"].to_string(),
                    r["addr"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(())
}

pub fn volume(cmd: VolumeCmd) -> anyhow::Result<()> {
    match cmd {
        VolumeCmd::Create {
            name,
            size,
            pool,
            at,
            format,
        } => {
            let meta = at.meta()?;
            let (v, m) = rt::block_on(async {
                let c = Cluster::connect(meta)?;
                let v = c.create_volume(&name, pool.as_deref(), size)?;
                anyhow::Ok((v, c.map()))
            })?;
            match format {
                Format::Json => println!("{}", volume_record_json(&v, &m)),
                Format::Table => println!(
                    "created volume {} ({}, id {:#x}, pool {})",
                    v.name,
                    human(v.size_bytes),
                    v.id,
                    pool_name(&m, v.pool)
                ),
            }
        }
        VolumeCmd::Ls { at, format } => {
            let meta = at.meta()?;
            let vols = map::list_volumes(&*meta)?;
            let m = map::load(&*meta)?;
            let u = Usage::load(meta)?;
            match format {
                Format::Json => println!(
                    "{}",
                    serde_json::Value::Array(vols.iter().map(|v| volume_json(v, &m, &u)).collect())
                ),
                Format::Table => {
                    println!(
                        "{:<32} {:>12} {:>12} {:>8}  pool",
                        "name", "size", "used", "id"
                    );
                    for v in vols {
                        println!(
                            "{:<32} {:>12} {:>12} {:>8}  {}{}",
                            v.name,
                            human(v.size_bytes),
                            human(u.of(v.id).bytes),
                            v.id,
                            pool_name(&m, v.pool),
                            if v.deleting { " (being deleted)" } else { "" }
                        );
                    }
                    if let Some(n) = u.note() {
                        println!("{n}");
                    }
                }
            }
        }
        VolumeCmd::Info { name, at, format } => {
            let meta = at.meta()?;
            let v = map::get_volume(&*meta, &name)?
                .ok_or_else(|| nacre_client::ClientError::NoVolume(name.clone()))?;
            let m = map::load(&*meta)?;
            let open = map::list_sessions(&*meta, v.id)?;
            let u = Usage::load(meta)?;
            let used = u.of(v.id);
            match format {
                Format::Json => {
                    let mut j = volume_json(&v, &m, &u);
                    j["open_connections"] = serde_json::json!(open);
                    println!("{j}");
                }
                Format::Table => {
                    println!("name     {}", v.name);
                    println!("id       {}", v.id);
                    println!("size     {} ({} bytes)", human(v.size_bytes), v.size_bytes);
                    println!(
                        "used     {} in {} objects ({} raw, every copy or shard)",
                        human(used.bytes),
                        used.objects,
                        human(used.raw_bytes)
                    );
                    println!("objects  {} KiB each, thin", v.object_bytes >> 10);
                    println!("pool     {}", pool_name(&m, v.pool));
                    println!("open     {} connection(s)", open.len());
                    for s in &open {
                        println!(
                            "         {}, since {} s",
                            s.client,
                            map::now_s().saturating_sub(s.since_unix_s)
                        );
                    }
                    if v.deleting {
                        println!("state    being deleted");
                    } else if v.stale_until > v.size_bytes {
                        println!("state    data past its end being deleted (a shrink)");
                    }
                    if let Some(n) = u.note() {
                        println!("{n}");
                    }
                }
            }
        }
        VolumeCmd::Resize {
            name,
            size,
            force,
            no_wait,
            at,
            format,
        } => {
            let meta = at.meta()?;
            let (v, m) = rt::block_on(async {
                let c = Cluster::connect(meta)?;
                let v = c.resize_volume(&name, size, force, !no_wait).await?;
                anyhow::Ok((v, c.map()))
            })?;
            match format {
                Format::Json => println!("{}", volume_record_json(&v, &m)),
                Format::Table => {
                    println!("volume {} is now {}", v.name, human(v.size_bytes));
                    if v.stale_until > v.size_bytes {
                        println!("the data past its end is deleted in the background");
                    }
                }
            }
        }
        VolumeCmd::Rm {
            name,
            force,
            no_wait,
            at,
            format,
        } => {
            let meta = at.meta()?;
            rt::block_on(async {
                anyhow::Ok(
                    Cluster::connect(meta)?
                        .delete_volume(&name, force, !no_wait)
                        .await?,
                )
            })?;
            match format {
                // `deleted`: its data and record are gone; else the
                // monitor's sweep finishes.
                Format::Json => println!(
                    "{}",
                    serde_json::json!({ "name": name, "deleted": !no_wait })
                ),
                Format::Table if no_wait => {
                    println!("volume {name} is being deleted in the background")
                }
                Format::Table => println!("deleted volume {name}"),
            }
        }
    }
    Ok(())
}

/// The raw space the cluster can fill: the OSDs that are in, up to their
/// full ratio (a pool holds `PoolRecord::data_fraction` of it as data).
/// `None` while an OSD that is in did not report.
pub fn raw_usable(stats: &[(u32, Option<serde_json::Value>)], out: &[u32]) -> Option<u64> {
    let mut raw = 0f64;
    for (_, v) in stats.iter().filter(|(id, _)| !out.contains(id)) {
        let r: nacre_osd::OsdReport = serde_json::from_value(v.clone()?).ok()?;
        raw += r.capacity_bytes as f64 * r.full_ratio;
    }
    Some(raw as u64)
}

/// `VOLUMES_OVERCOMMITTED` when the raw space the volumes would take full
/// at their pools' schemes (`raw_provisioned`; `provisioned` is their
/// sizes) is more than `ratio` times the raw space the cluster can fill
/// (`ratio` 0: never).
fn overcommit_check(
    provisioned: u64,
    raw_provisioned: u64,
    raw: Option<u64>,
    ratio: f64,
) -> Option<serde_json::Value> {
    let raw = raw?;
    if ratio <= 0.0 || raw == 0 || (raw_provisioned as f64) <= ratio * raw as f64 {
        return None;
    }
    Some(serde_json::json!({
        "code": "VOLUMES_OVERCOMMITTED",
        "severity": "HEALTH_WARN",
        "message": format!(
            "volumes provision {} ({} of raw space at their pools' copies or shards), {:.2}× the {} the cluster can fill (warns above {ratio}×, nacre up --overcommit-ratio): they are thin, and writes fail with ENOSPC once the OSDs are full",
            human(provisioned),
            human(raw_provisioned),
            raw_provisioned as f64 / raw as f64,
            human(raw)
        ),
    }))
}

/// Health checks for OSDs that are near full (a warning) or full (writes
/// that need new space are refused with ENOSPC), at the ratios each OSD
/// reports.
fn space_checks(stats: &[(u32, Option<serde_json::Value>)]) -> Vec<serde_json::Value> {
    let (mut full, mut near) = (Vec::new(), Vec::new());
    for (id, v) in stats {
        let Some(r) = (v.as_ref())
            .and_then(|v| serde_json::from_value::<nacre_osd::OsdReport>(v.clone()).ok())
        else {
            continue;
        };
        if r.capacity_bytes == 0 {
            continue;
        }
        let used = r.used_bytes as f64 / r.capacity_bytes as f64;
        let what = format!("osd.{id} {:.1}% used", used * 100.0);
        if r.full_ratio > 0.0 && used >= r.full_ratio {
            full.push(format!("{what} (full at {:.0}%)", r.full_ratio * 100.0));
        } else if r.nearfull_ratio > 0.0 && used >= r.nearfull_ratio {
            near.push(format!(
                "{what} (near full at {:.0}%)",
                r.nearfull_ratio * 100.0
            ));
        }
    }
    let mut out = Vec::new();
    if !full.is_empty() {
        out.push(serde_json::json!({
            "code": "OSD_FULL",
            "severity": "HEALTH_ERR",
            "message": format!("{} full: writes that need new space are refused (ENOSPC); delete or trim data, or add space ({})", full.len(), full.join(", ")),
        }));
    }
    if !near.is_empty() {
        out.push(serde_json::json!({
            "code": "OSD_NEARFULL",
            "severity": "HEALTH_WARN",
            "message": format!("{} near full ({})", near.len(), near.join(", ")),
        }));
    }
    out
}

/// `SLOW_OSD` for each OSD whose own store writes stood far above the
/// others' in each recent window (`nacre_osd::slow`), saying what was
/// measured, and for each the leader demoted from leading PGs.
fn slow_checks(
    stats: &[(u32, Option<serde_json::Value>)],
    demoted: &[u32],
) -> Vec<serde_json::Value> {
    let reports: Vec<(u32, Vec<Option<f64>>)> = (stats.iter())
        .filter_map(|(id, v)| {
            let w = v.as_ref()?["store_write_us_p99"].as_array()?;
            Some((*id, w.iter().map(|x| x.as_f64()).collect()))
        })
        .collect();
    let demotion = |id: u32| match demoted.contains(&id) {
        true => "; demoted: it leads no PG while another member is up",
        false => "",
    };
    let slow = nacre_osd::slow::slow_osds(&reports);
    let mut out: Vec<serde_json::Value> = (slow.iter())
        .map(|s| {
            serde_json::json!({
                "code": "SLOW_OSD",
                "severity": "HEALTH_WARN",
                "osd": s.osd,
                "message": format!("{}{}", s.message(), demotion(s.osd)),
                "measured": s,
                "demoted": demoted.contains(&s.osd),
            })
        })
        .collect();
    for &id in demoted
        .iter()
        .filter(|id| !slow.iter().any(|s| s.osd == **id))
    {
        out.push(serde_json::json!({
            "code": "SLOW_OSD",
            "severity": "HEALTH_WARN",
            "osd": id,
            "message": format!("osd.{id}: demoted for slow store writes until they are calm for 30 s (demoted again within the hour: held a minute at least, doubled each time up to 32; the leader's log says how long): it leads no PG while another member is up"),
            "demoted": true,
        }));
    }
    out
}

/// `SLOW_LINK` for each link between two hosts whose OSDs' pings stand
/// out ([`nacre_osd::slow::slow_links`]; `stats`: each OSD's `Op::Stat`
/// answer).
fn link_checks(
    stats: &[(u32, Option<serde_json::Value>)],
    m: &map::ClusterMap,
) -> Vec<serde_json::Value> {
    let reports: Vec<(u32, nacre_osd::slow::PeerPings)> = (stats.iter())
        .filter_map(|(id, v)| {
            let peers = v.as_ref()?.get("peer_ping_us_p50")?.clone();
            Some((*id, serde_json::from_value(peers).ok()?))
        })
        .collect();
    // OSDs on unix sockets share one machine (`nacre up`): no network
    // link between them, whatever their hosts are called.
    let host_of = |id: u32| {
        (m.osd(id))
            .filter(|o| !o.addr.starts_with("unix:"))
            .map(|o| o.host.clone())
    };
    (nacre_osd::slow::slow_links(&reports, host_of).iter())
        .map(|l| {
            serde_json::json!({
                "code": "SLOW_LINK",
                "severity": "HEALTH_WARN",
                "hosts": l.hosts,
                "message": l.message(),
                "measured": l,
            })
        })
        .collect()
}

/// Health checks for OSDs that hold damaged data: reads that failed their
/// checksum and were not repaired from another copy, or a journal whose
/// replay stopped before its end; and for OSDs whose copies needed
/// [`REPAIRS_WARN`] repairs or more since they started, or that found
/// [`nacre_types::DAMAGED_OBJECTS_OUT`] objects damaged (a failing disk).
fn damage_checks(stats: &[(u32, Option<serde_json::Value>)]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for (id, v) in stats {
        let Some(v) = v else { continue };
        let unrepaired = v["damaged_unrepaired"].as_u64().unwrap_or(0);
        let repaired = v["repaired"].as_u64().unwrap_or(0);
        let last = v["last_damage"].as_str().unwrap_or("?");
        if unrepaired > 0 {
            out.push(serde_json::json!({
                "code": "OSD_DAMAGED",
                "severity": "HEALTH_ERR",
                "osd": id,
                "message": format!("osd.{id} holds damaged data: {unrepaired} objects found damaged (a checksum that failed, a read error) since it started that no other copy has repaired yet (last: {last}); a deep scrub repairs what another copy holds whole: nacre pg scrub --all --deep")
            }));
        }
        if repaired >= REPAIRS_WARN {
            out.push(serde_json::json!({
                "code": "OSD_TOO_MANY_REPAIRS",
                "severity": "HEALTH_WARN",
                "osd": id,
                "message": format!("osd.{id}: {repaired} damaged copies repaired from other copies since it started: its disk may be failing (last: {last})")
            }));
        }
        let objects = v["damaged_objects"].as_u64().unwrap_or(0);
        if objects >= nacre_types::DAMAGED_OBJECTS_OUT {
            out.push(serde_json::json!({
                "code": "OSD_DISK_FAILING",
                "severity": "HEALTH_WARN",
                "osd": id,
                "message": format!("osd.{id}: reads found {objects} of its objects damaged since it started: it has asked to be marked out, so that its PGs move to other OSDs; replace its disk, then `nacre osd in {id}` (last: {last})")
            }));
        }
        if let Some(why) = v["replay_stopped"].as_str() {
            out.push(serde_json::json!({
                "code": "OSD_JOURNAL_DAMAGED",
                "severity": "HEALTH_ERR",
                "osd": id,
                "message": format!("osd.{id}: journal replay stopped before its end at open: {why}")
            }));
        }
    }
    out
}

/// How far past its interval a PG's scrub may be before `nacre status`
/// warns (a busy OSD scrubs one PG at a time, a PG not clean waits).
const SCRUB_LATE_FACTOR: f64 = 1.5;

/// The PGs whose last scrub (light, and deep) is more than
/// [`SCRUB_LATE_FACTOR`] times their primary's interval ago, at `now`
/// (Unix s); a PG never scrubbed counts from its first plan, one never
/// planned (never clean) is left to the PG checks.
fn late_scrubs(
    m: &map::ClusterMap,
    stats: &[(u32, Option<serde_json::Value>)],
    stamps: &std::collections::BTreeMap<PgId, map::ScrubStamp>,
    now: u64,
) -> (Vec<PgId>, Vec<PgId>) {
    // Each reporting OSD's light and deep intervals.
    let by_osd: std::collections::HashMap<u32, (u64, u64)> = (stats.iter())
        .filter_map(|(id, v)| {
            let v = v.as_ref()?;
            let i = |k: &str| v[k].as_u64();
            Some((*id, (i("scrub_interval_s")?, i("deep_scrub_interval_s")?)))
        })
        .collect();
    let intervals = |osd: u32| by_osd.get(&osd).copied();
    let late = |last: u64, interval: u64| {
        interval > 0
            && last > 0
            && now.saturating_sub(last) as f64 > SCRUB_LATE_FACTOR * interval as f64
    };
    let (mut light, mut deep) = (Vec::new(), Vec::new());
    for t in &m.tables {
        for n in 0..t.pg_count() {
            let pg = PgId::new(t.pool, n);
            let (Some(s), Some((li, di))) =
                (stamps.get(&pg), t.primary(n, &m.state).and_then(intervals))
            else {
                continue;
            };
            let since = |t: u64| if t > 0 { t } else { s.first_unix_s };
            if late(since(s.light_unix_s.max(s.deep_unix_s)), li) {
                light.push(pg);
            }
            if late(since(s.deep_unix_s), di) {
                deep.push(pg);
            }
        }
    }
    (light, deep)
}

/// What the OSDs' scrubs found since they started (`stats`: each OSD's
/// `Op::Stat` answer), and the health checks of objects left unrepaired
/// and of the `late` scrubs ([`late_scrubs`]).
fn scrub_summary(
    stats: &[(u32, Option<serde_json::Value>)],
    late: (Vec<PgId>, Vec<PgId>),
) -> (serde_json::Value, Vec<serde_json::Value>) {
    let sum = |k: &str| -> u64 {
        (stats.iter())
            .filter_map(|(_, v)| v.as_ref()?[k].as_u64())
            .sum()
    };
    let mut unrepaired_pgs = Vec::new();
    let mut running = Vec::new();
    let mut last = None;
    for (id, v) in stats {
        let Some(v) = v else { continue };
        for p in v["pgs_scrub_unrepaired"].as_array().into_iter().flatten() {
            if let (Some(pg), Some(n)) = (p[0].as_str(), p[1].as_u64()) {
                unrepaired_pgs.push(format!("{pg} ({n} objects, osd.{id})"));
            }
        }
        if let Some(s) = v["scrubbing"].as_str() {
            running.push(format!("{s} on osd.{id}"));
        }
        if let Some(f) = v["last_scrub_finding"].as_str() {
            last = Some(format!("osd.{id}: {f}"));
        }
    }
    let mut checks = Vec::new();
    let names = |pgs: &[PgId]| -> String {
        let mut s: Vec<String> = pgs.iter().take(16).map(|p| p.to_string()).collect();
        if pgs.len() > 16 {
            s.push(format!("and {} more", pgs.len() - 16));
        }
        s.join(", ")
    };
    for (pgs, code, what) in [
        (&late.0, "PG_NOT_SCRUBBED", "scrubbed"),
        (&late.1, "PG_NOT_DEEP_SCRUBBED", "deep-scrubbed"),
    ] {
        if !pgs.is_empty() {
            checks.push(serde_json::json!({
                "code": code,
                "severity": "HEALTH_WARN",
                "message": format!(
                    "{} PGs not {what} within {SCRUB_LATE_FACTOR} times their primary's interval: {} (`nacre pg ls` shows when each was; `nacre pg scrub` runs one now)",
                    pgs.len(),
                    names(pgs)
                ),
            }));
        }
    }
    if !unrepaired_pgs.is_empty() {
        checks.push(serde_json::json!({
            "code": "PG_INCONSISTENT",
            "severity": "HEALTH_ERR",
            "message": format!(
                "scrubs found copies that differ and could not repair them (no copy could be read, or the rewrite failed): {}; see the OSDs' logs, then `nacre pg scrub --deep PG`",
                unrepaired_pgs.join(", ")
            ),
        }));
    }
    let json = serde_json::json!({
        "scrubs": sum("scrubs"),
        "deep_scrubs": sum("deep_scrubs"),
        "objects": sum("scrub_objects"),
        "inconsistent": sum("scrub_inconsistent"),
        "repaired": sum("scrub_repaired"),
        "unrepaired": sum("scrub_unrepaired"),
        "unrepaired_pgs": unrepaired_pgs,
        "late_pgs": late.0.len(),
        "late_deep_pgs": late.1.len(),
        "scrubbing": running,
        "last_finding": last,
    });
    (json, checks)
}

/// The PGs of a pool of `total` as their primaries report them (`stats`:
/// each OSD's `Op::Stat` answer), and the health checks their states
/// raise: a PG no primary reports (its primary is down or unreachable)
/// counts as unknown, and like an inactive one cannot serve I/O.
fn pg_summary(
    total: u32,
    epoch: u64,
    stats: &[(u32, Option<serde_json::Value>)],
) -> (serde_json::Value, Vec<serde_json::Value>) {
    let mut counts: std::collections::BTreeMap<String, u32> = Default::default();
    let mut named: Vec<nacre_osd::PgReport> = Vec::new();
    let (mut left, mut degraded_left, mut misplaced_left) = (0u64, 0u64, 0u64);
    let mut waiting = 0u64;
    let (mut objects_per_s, mut bytes_per_s, mut object_bytes) = (0.0, 0.0, 0u64);
    let (mut moved_objects_per_s, mut moved_bytes_per_s) = (0.0, 0.0);
    for v in stats.iter().filter_map(|(_, v)| v.as_ref()) {
        let Ok(r) = serde_json::from_value::<nacre_osd::OsdReport>(v.clone()) else {
            continue;
        };
        objects_per_s += r.recovery_objects_per_s;
        bytes_per_s += r.recovery_bytes_per_s;
        moved_objects_per_s += r.rebalance_objects_per_s;
        moved_bytes_per_s += r.rebalance_bytes_per_s;
        object_bytes = object_bytes.max(r.object_bytes);
        // A report from an epoch before the stored map's speaks for PGs
        // that may have another primary now.
        if r.epoch < epoch {
            continue;
        }
        for (state, n) in r.pg_states {
            *counts.entry(state).or_default() += n;
        }
        left += r.recovery_objects_left;
        degraded_left += r.degraded_objects_left;
        misplaced_left += r.misplaced_objects_left;
        waiting += r.degraded_waiting_objects;
        named.extend(r.pgs_not_clean);
    }
    // At the pace of the last second: degraded PGs recover first, at the
    // pace of recovery proper (moves aside). Copies that wait for a down
    // OSD to return or be marked out have no estimate.
    let eta =
        |objects: u64, per_s: f64| (objects > 0 && per_s > 0.0).then(|| objects as f64 / per_s);
    let recovering_per_s = (objects_per_s - moved_objects_per_s).max(0.0);
    let degraded = degraded_left + waiting;
    let recovery = serde_json::json!({
        "degraded_objects": degraded,
        "degraded_waiting_objects": waiting,
        "misplaced_objects": misplaced_left,
        "degraded_bytes": degraded * object_bytes,
        "misplaced_bytes": misplaced_left * object_bytes,
        "objects_per_s": objects_per_s,
        "bytes_per_s": bytes_per_s,
        "recovery_objects_per_s": recovering_per_s,
        "recovery_bytes_per_s": (bytes_per_s - moved_bytes_per_s).max(0.0),
        "rebalance_objects_per_s": moved_objects_per_s,
        "rebalance_bytes_per_s": moved_bytes_per_s,
        "full_redundancy_eta_s": if waiting > 0 { None } else { eta(degraded_left, recovering_per_s) },
        "clean_eta_s": if waiting > 0 { None } else { eta(left, objects_per_s) },
    });
    named.sort_by_key(|p| p.pg);
    named.truncate(nacre_osd::PG_REPORT_MAX);
    let n = |s: &str| counts.get(s).copied().unwrap_or(0);
    // Briefly, two OSDs may both report a PG whose primary just changed.
    let unknown = total.saturating_sub(counts.values().sum());
    let (inactive, peering, degraded) = (n("inactive"), n("peering"), n("active+degraded"));
    let recovering = n("active+recovering");
    let (remapped, backfilling) = (n("active+remapped"), n("active+remapped+backfilling"));
    let list = |state: &str| {
        let some: Vec<String> = (named.iter().filter(|p| p.state == state).take(3))
            .map(|p| format!("PG {} {}", p.pg, p.detail.as_deref().unwrap_or(state)))
            .collect();
        if some.is_empty() {
            String::new()
        } else {
            format!(" ({})", some.join("; "))
        }
    };
    let mut checks = Vec::new();
    if inactive + unknown > 0 {
        let mut what = Vec::new();
        if inactive > 0 {
            what.push(format!("{inactive} inactive{}", list("inactive")));
        }
        if unknown > 0 {
            what.push(format!("{unknown} with no primary reporting"));
        }
        checks.push(serde_json::json!({
            "code": "PG_INACTIVE",
            "severity": "HEALTH_ERR",
            "message": format!("{} PGs cannot serve I/O: {}", inactive + unknown, what.join(", ")),
        }));
    }
    if peering > 0 {
        checks.push(serde_json::json!({
            "code": "PG_PEERING",
            "severity": "HEALTH_WARN",
            "message": format!("{peering} PGs peering{}", list("peering")),
        }));
    }
    if degraded + recovering > 0 {
        let mut what = Vec::new();
        if degraded > 0 {
            what.push(format!(
                "{degraded} with copies down{}",
                list("active+degraded")
            ));
        }
        if recovering > 0 {
            what.push(format!(
                "{recovering} recovering, {left} object copies left{}",
                list("active+recovering")
            ));
        }
        checks.push(serde_json::json!({
            "code": "PG_DEGRADED",
            "severity": "HEALTH_WARN",
            "message": format!(
                "{} PGs active with fewer complete copies than the pool's size: {}",
                degraded + recovering,
                what.join(", ")
            ),
        }));
    }
    if remapped + backfilling > 0 {
        let mut what = Vec::new();
        if backfilling > 0 {
            what.push(format!(
                "{backfilling} filling their new OSDs{}",
                list("active+remapped+backfilling")
            ));
        }
        if remapped > 0 {
            what.push(format!("{remapped} filled{}", list("active+remapped")));
        }
        checks.push(serde_json::json!({
            "code": "PG_REMAPPED",
            "severity": "HEALTH_WARN",
            "message": format!(
                "{} PGs moving to other OSDs, every copy kept meanwhile: {}",
                remapped + backfilling,
                what.join(", ")
            ),
        }));
    }
    let json = serde_json::json!({
        "total": total,
        "active_clean": n("active+clean"),
        "degraded": degraded,
        "recovering": recovering,
        "remapped": remapped + backfilling,
        "recovery_objects_left": left,
        "recovery": recovery,
        "peering": peering,
        "inactive": inactive,
        "unknown": unknown,
        "not_clean": named,
    });
    (json, checks)
}

pub fn status(at: &At, format: Format) -> anyhow::Result<()> {
    let meta = at.meta()?;
    let (m, stats) = rt::block_on(async {
        let c = Cluster::connect(meta.clone())?;
        let stats = c.osd_stats().await;
        anyhow::Ok((c.map(), stats))
    })?;
    // Which OSDs are up now, not when the answers were asked for.
    let m = map::ClusterMap {
        up: map::load(&*meta)?.up,
        ..m
    };
    let pg_count = m.tables.iter().map(|t| t.pg_count()).sum();
    let (pgs, pg_checks) = pg_summary(pg_count, m.epoch(), &stats);
    let up_count = m.osds.iter().filter(|o| m.is_up(o.id)).count();
    // Out: marked out, or registered and not yet booted (`nacre osd
    // init`, until the OSD first boots and is marked in).
    let outs = map::out_osds(&*meta, &m)?;
    let mut checks = damage_checks(&stats);
    // A down OSD that is still in holds copies the cluster lacks; one
    // marked out has handed its PGs over.
    let down_in: Vec<String> = (m.osds.iter())
        .filter(|o| !m.is_up(o.id) && !outs.contains(&o.id))
        .map(|o| format!("osd.{}", o.id))
        .collect();
    if !down_in.is_empty() {
        checks.push(serde_json::json!({
            "code": "OSD_DOWN",
            "severity": "HEALTH_WARN",
            "message": format!("{} down and still in: {}", down_in.len(), down_in.join(", ")),
        }));
    }
    checks.extend(space_checks(&stats));
    checks.extend(slow_checks(&stats, &m.state.demoted));
    checks.extend(link_checks(&stats, &m));
    checks.extend(pg_checks);
    let late = late_scrubs(&m, &stats, &map::scrub_stamps(&*meta)?, map::now_s());
    let (scrub, scrub_checks) = scrub_summary(&stats, late);
    checks.extend(scrub_checks);
    // A cluster on etcd: the elected monitor, or none.
    let leader = match &at.etcd {
        Some(_) => Some(crate::at::elected_leader(&*meta)?.map(|a| a.to_string())),
        None => None,
    };
    if let Some(None) = leader {
        checks.push(serde_json::json!({
            "code": "NO_MON_LEADER",
            "severity": "HEALTH_ERR",
            "message": "no monitor leads the cluster: OSDs cannot boot or be marked down (start nacre mon)",
        }));
    }
    let vols = map::list_volumes(&*meta)?;
    let provisioned: u64 = vols.iter().map(|v| v.size_bytes).sum();
    let raw_provisioned: f64 = (vols.iter())
        .map(|v| {
            let fraction = m.pool(v.pool).map_or(1.0, |p| p.data_fraction());
            v.size_bytes as f64 / fraction
        })
        .sum();
    let config = map::get_config(&*meta)?;
    let raw = raw_usable(&stats, &outs);
    if let Some(c) = overcommit_check(
        provisioned,
        raw_provisioned as u64,
        raw,
        config.overcommit_ratio,
    ) {
        checks.push(c);
    }
    let orphans = map::get_orphans(&*meta)?;
    if !orphans.left.is_empty() {
        checks.push(serde_json::json!({
            "code": "ORPHANED_OBJECTS",
            "severity": "HEALTH_WARN",
            "message": format!("what the last sweep could not delete (objects of deleted volumes, data past a volume's end; it tries again): {}", orphans.left.join("; ")),
        }));
    }
    let severity = |s: &str| checks.iter().any(|c| c["severity"] == s);
    let health = if severity("HEALTH_ERR") {
        "HEALTH_ERR"
    } else if severity("HEALTH_WARN") {
        "HEALTH_WARN"
    } else {
        "HEALTH_OK"
    };
    let get = |v: &Option<serde_json::Value>, k: &str| {
        v.as_ref().and_then(|v| v[k].as_f64()).unwrap_or(0.0)
    };
    let sum = |k: &str| stats.iter().map(|(_, v)| get(v, k)).sum::<f64>();
    let json = serde_json::json!({
        "health": health,
        "checks": checks,
        "leader": leader.clone().flatten(),
        "osds": {"total": m.osds.len(), "up": up_count, "in": m.osds.len() - outs.len(), "out": outs},
        "pgs": pgs,
        "scrub": scrub,
        "capacity": {"total_bytes": sum("capacity_bytes") as u64, "used_bytes": sum("used_bytes") as u64, "objects": sum("objects") as u64},
        "client_io": {"read_iops": sum("read_iops"), "write_iops": sum("write_iops"),
                      "read_bytes_per_s": sum("read_bytes_per_s") as u64, "write_bytes_per_s": sum("write_bytes_per_s") as u64},
        "pools": m.pools.iter().map(|p| serde_json::json!({"id": p.id, "name": p.name, "scheme": p.scheme(), "ec": p.ec, "size": p.size, "min_size": p.min_size, "pg_count": p.pg_count, "failure_domain": p.failure_domain, "usable_bytes": raw.map(|r| (r as f64 * p.data_fraction()) as u64)})).collect::<Vec<_>>(),
        "volumes": vols.len(),
        "provisioned_bytes": provisioned,
        "raw_usable_bytes": raw,
        "raw_provisioned_bytes": raw_provisioned as u64,
        "overcommit_ratio": config.overcommit_ratio,
        "orphans": orphans,
        "osd": stats.iter().map(|(id, v)| serde_json::json!({"id": id, "up": m.is_up(*id), "stats": v})).collect::<Vec<_>>(),
    });
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&json)?),
        Format::Table => {
            println!("health    {health}");
            for ch in &checks {
                println!(
                    "          {}: {}",
                    ch["code"].as_str().unwrap_or(""),
                    ch["message"].as_str().unwrap_or("")
                );
            }
            if let Some(l) = &leader {
                println!("leader    {}", l.as_deref().unwrap_or("none"));
            }
            println!(
                "osds      {} total, {up_count} up, {} in{}",
                m.osds.len(),
                m.osds.len() - outs.len(),
                if outs.is_empty() {
                    String::new()
                } else {
                    let out: Vec<String> = outs.iter().map(|o| format!("osd.{o}")).collect();
                    format!(" ({} out)", out.join(", "))
                }
            );
            println!(
                "pgs       {} total: {} active+clean, {} degraded, {} recovering, {} remapped, {} peering, {} inactive, {} unknown",
                pgs["total"], pgs["active_clean"], pgs["degraded"], pgs["recovering"], pgs["remapped"], pgs["peering"], pgs["inactive"], pgs["unknown"]
            );
            let rec = &pgs["recovery"];
            let u = |k: &str| rec[k].as_u64().unwrap_or(0);
            if u("degraded_objects") + u("misplaced_objects") > 0 {
                let eta = |k: &str| {
                    rec[k]
                        .as_f64()
                        .map_or("unknown (no recovery in the last second)".into(), |s| {
                            humantime(Duration::from_secs_f64(s))
                        })
                };
                let f = |k: &str| rec[k].as_f64().unwrap_or(0.0);
                println!(
                    "recovery  {} object copies degraded ({}), {} misplaced ({}); recovery {}/s ({:.0} objects/s), rebalance {}/s ({:.0} objects/s); {} recovered since the OSDs started",
                    u("degraded_objects"),
                    human(u("degraded_bytes")),
                    u("misplaced_objects"),
                    human(u("misplaced_bytes")),
                    human(f("recovery_bytes_per_s") as u64),
                    f("recovery_objects_per_s"),
                    human(f("rebalance_bytes_per_s") as u64),
                    f("rebalance_objects_per_s"),
                    human(sum("recovered_bytes") as u64)
                );
                if u("degraded_waiting_objects") > 0 {
                    let why = if down_in.is_empty() {
                        "an OSD to hold them (fewer OSDs up and in than the pools' copies)"
                            .to_string()
                    } else {
                        format!(
                            "{} to come back or be marked out (nacre osd out, or --out-delay)",
                            down_in.join(", ")
                        )
                    };
                    println!(
                        "          {} of the degraded copies wait for {why}",
                        u("degraded_waiting_objects")
                    );
                } else {
                    if u("degraded_objects") > 0 {
                        println!(
                            "          full redundancy in {}",
                            eta("full_redundancy_eta_s")
                        );
                    }
                    println!("          every PG clean in {}", eta("clean_eta_s"));
                }
            }
            if scrub["scrubs"].as_u64().unwrap_or(0) + scrub["deep_scrubs"].as_u64().unwrap_or(0)
                > 0
                || scrub["scrubbing"].as_array().is_some_and(|a| !a.is_empty())
            {
                let now: Vec<&str> = (scrub["scrubbing"].as_array().into_iter().flatten())
                    .filter_map(|s| s.as_str())
                    .collect();
                println!(
                    "scrub     {} light and {} deep scrubs since the OSDs started, {} objects compared: {} found apart, {} repaired, {} unrepaired{}",
                    scrub["scrubs"],
                    scrub["deep_scrubs"],
                    scrub["objects"],
                    scrub["inconsistent"],
                    scrub["repaired"],
                    scrub["unrepaired"],
                    if now.is_empty() {
                        String::new()
                    } else {
                        format!("; scrubbing {}", now.join(", "))
                    }
                );
                if let Some(f) = scrub["last_finding"].as_str() {
                    println!("          last found: {f}");
                }
            }
            for p in &m.pools {
                println!(
                    "pool      {} (id {}: {}, min_size {}, {} PGs, failure domain {}){}",
                    p.name,
                    p.id,
                    p.scheme(),
                    p.min_size,
                    p.pg_count,
                    p.failure_domain,
                    raw.map_or(String::new(), |r| format!(
                        ": {} usable",
                        human((r as f64 * p.data_fraction()) as u64)
                    ))
                );
            }
            println!(
                "capacity  {} used of {} raw, {} objects, {} volumes",
                human(sum("used_bytes") as u64),
                human(sum("capacity_bytes") as u64),
                sum("objects") as u64,
                vols.len()
            );
            if let Some(r) = raw.filter(|&r| r > 0) {
                println!(
                    "volumes   {} provisioned, {} of raw space at their pools' schemes: {:.2}× the {} the cluster can fill (thin)",
                    human(provisioned),
                    human(raw_provisioned as u64),
                    raw_provisioned / r as f64,
                    human(r),
                );
            }
            if orphans.reclaimed_objects > 0
                || orphans.trimmed_objects > 0
                || orphans.finished > 0
                || !orphans.left.is_empty()
            {
                println!(
                    "orphans   {} object copies of deleted volumes reclaimed, {} objects past volumes' ends deleted, {} interrupted deletes and shrinks finished; last sweep {} s ago",
                    orphans.reclaimed_objects,
                    orphans.trimmed_objects,
                    orphans.finished,
                    map::now_s().saturating_sub(orphans.last_sweep_unix_s)
                );
            }
            println!(
                "client io {:.0} reads/s ({}/s), {:.0} writes/s ({}/s)  (primary ops)",
                sum("read_iops"),
                human(sum("read_bytes_per_s") as u64),
                sum("write_iops"),
                human(sum("write_bytes_per_s") as u64)
            );
            println!(
                "\n{:<6} {:<5} {:>12} {:>12} {:>10} {:>9} {:>9} {:>12} {:>12}",
                "osd",
                "state",
                "used",
                "capacity",
                "objects",
                "reads/s",
                "writes/s",
                "write avg µs",
                "write p99 µs"
            );
            for (id, v) in &stats {
                let state = if v.is_none() {
                    "noans"
                } else if m.is_up(*id) {
                    "up"
                } else {
                    "down"
                };
                // The last complete 10 s window's, if it saw a write.
                let p99 = match get(v, "write_latency_us_p99") {
                    x if x > 0.0 => format!("{x:.0}"),
                    _ => "-".into(),
                };
                println!(
                    "{:<6} {:<5} {:>12} {:>12} {:>10} {:>9.0} {:>9.0} {:>12.1} {:>12}",
                    format!("osd.{id}"),
                    state,
                    human(get(v, "used_bytes") as u64),
                    human(get(v, "capacity_bytes") as u64),
                    get(v, "objects") as u64,
                    get(v, "read_iops"),
                    get(v, "write_iops"),
                    get(v, "write_latency_us_avg"),
                    p99
                );
            }
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct BenchArgs {
    /// The cluster on this machine to measure through the client library
    /// (`nacre up --dir`).
    #[arg(long, conflicts_with_all = ["nbd", "etcd"])]
    dir: Option<PathBuf>,
    /// The cluster on many hosts to measure through the client library:
    /// its etcd's client URLs, comma-separated.
    #[arg(long, conflicts_with = "nbd")]
    etcd: Option<String>,
    /// With --etcd: where the cluster's keys live in etcd.
    #[arg(long, default_value = crate::at::PREFIX_DEFAULT)]
    prefix: String,
    /// Volume to use, with --dir or --etcd (default: a temporary one in
    /// the default pool, deleted afterwards). The tests OVERWRITE its
    /// first --size bytes: refused if they hold data, unless --force.
    #[arg(long, conflicts_with = "nbd")]
    volume: Option<String>,
    /// Measure any NBD export instead: nbd+unix:///NAME?socket=PATH or
    /// nbd://HOST[:PORT]/NAME. The tests OVERWRITE its first --size bytes:
    /// refused if they hold data, unless --force.
    #[arg(long)]
    nbd: Option<String>,
    /// Run even if the --volume or --nbd target holds data (destroying it).
    #[arg(long)]
    force: bool,
    /// Time per test (six tests): a number and ms, s or m.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    runtime: Duration,
    /// Bytes of the volume the tests use (and the temporary volume's size).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    size: u64,
    /// Output: a table for people, or JSON for scripts.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Results of an earlier run (`--format json`) to compare with: each
    /// test's figures beside the old ones, with new ÷ old; drawn in the
    /// --plot too.
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Draw IOPS and latency percentiles over time for each test into
    /// FILE.svg or FILE.png.
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// What `nacre bench` does with its results besides printing them: the
/// comparison with an earlier run, the picture.
fn compare_and_plot(a: &BenchArgs, label: &str, results: &[SuiteResult]) -> anyhow::Result<()> {
    let old = match &a.compare {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("--compare {}", p.display()))?;
            let (col, old) = suite::load_results(&text, label)
                .with_context(|| format!("--compare {}", p.display()))?;
            if a.format == Format::Table {
                println!("\ncompared with {} ({col}):\n", p.display());
                print!("{}", suite::compare_table(results, &old));
            }
            Some(old)
        }
        None => None,
    };
    if let Some(path) = &a.plot {
        let mut runs: Vec<(&str, &[SuiteResult])> = vec![(label, results)];
        if let Some(old) = &old {
            runs.push(("old", old));
        }
        nacre_bench::plot::plot(path, &runs)?;
        if a.format == Format::Table {
            println!("\nplot: {}", path.display());
        }
    }
    Ok(())
}

/// CPU time (user + system) of process `pid`, from /proc.
fn proc_cpu(pid: u32) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = s.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// CPU time of the processes of the cluster in `dir`, by the pid files
/// there now: every OSD, and `nacre up` itself if `with_up`.
fn cluster_cpu(dir: &Path, with_up: bool) -> Option<Rc<dyn Fn() -> Duration>> {
    let pid_in = |f: &Path| -> Option<u32> { std::fs::read_to_string(f).ok()?.trim().parse().ok() };
    let mut files: Vec<PathBuf> = (std::fs::read_dir(dir).ok()?.flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("osd.") && n.ends_with(".pid"))
        })
        .collect();
    if with_up {
        files.push(dir.join("nacre.pid"));
    }
    let pids: Vec<u32> = (files.iter())
        .filter_map(|f| pid_in(f))
        .filter(|&p| proc_cpu(p).is_some())
        .collect();
    if pids.is_empty() {
        return None;
    }
    Some(Rc::new(move || {
        pids.iter().filter_map(|&p| proc_cpu(p)).sum()
    }))
}

fn print_results(
    format: Format,
    cols: &[(&str, &[SuiteResult])],
    header: &str,
) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let obj: serde_json::Map<String, serde_json::Value> = cols
                .iter()
                .map(|(n, r)| Ok((n.to_string(), serde_json::to_value(r)?)))
                .collect::<anyhow::Result<_>>()?;
            println!("{}", serde_json::to_string_pretty(&obj)?);
        }
        Format::Table => {
            println!("{header}\n");
            print!("{}", suite::table(cols));
        }
    }
    Ok(())
}

/// Bytes read at once, and reads in flight, when [`first_data`] looks for
/// data.
const SCAN_READ_BYTES: u64 = 4 << 20;
const SCAN_LANES: u64 = 8;

/// The offset of the first 4 MiB piece of `[0, size)` that holds a
/// non-zero byte, if any (`read(offset, len)`), reading `SCAN_LANES`
/// pieces at a time.
async fn first_data<F, Fut>(read: F, size: u64) -> anyhow::Result<Option<u64>>
where
    F: Fn(u64, u64) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = anyhow::Result<AlignedBuf>> + 'static,
{
    let pieces = size.div_ceil(SCAN_READ_BYTES);
    let lanes: Vec<_> = (0..SCAN_LANES.min(pieces))
        .map(|lane| {
            let read = read.clone();
            rt::spawn(async move {
                let mut p = lane;
                while p < pieces {
                    let off = p * SCAN_READ_BYTES;
                    let b = read(off, SCAN_READ_BYTES.min(size - off)).await?;
                    if b.iter().any(|&x| x != 0) {
                        return anyhow::Ok(Some(off));
                    }
                    p += SCAN_LANES;
                }
                Ok(None)
            })
        })
        .collect();
    let mut first = None;
    for l in lanes {
        if let Some(off) = l.await? {
            first = Some(first.map_or(off, |f: u64| f.min(off)));
        }
    }
    Ok(first)
}

/// Refuses to benchmark on `what` if its first `size` bytes hold data.
fn refuse_data(what: &str, found: Option<u64>, size: u64) -> anyhow::Result<()> {
    if let Some(off) = found {
        bail!(
            "{what} holds data in the {} the benchmark would overwrite (the first at {}); \
             use a scratch volume (the default with --dir), or --force to destroy it",
            human(size),
            human(off)
        );
    }
    Ok(())
}

/// The suite against the NBD export at `uri`, over one connection; unless
/// `force`, only if the bytes it writes hold no data.
fn nbd_suite(uri: &str, opts: &SuiteOpts, force: bool) -> anyhow::Result<Vec<SuiteResult>> {
    rt::block_on(async {
        let c = NbdClient::connect(uri).await?;
        if !force {
            let size = opts.area_bytes.min(c.size_bytes);
            let cc = c.clone();
            let read = move |off: u64, len: u64| {
                let c = cc.clone();
                async move { Ok(c.read(off, len as u32).await?) }
            };
            refuse_data(
                &format!("the export {uri}"),
                first_data(read, size).await?,
                size,
            )?;
        }
        let r = suite::run(Rc::new(NbdTarget(c.clone())), opts).await;
        c.disconnect().await;
        r
    })
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    if let Some(p) = &a.plot {
        nacre_bench::plot::ready(p).context("--plot")?;
    }
    let mut opts = SuiteOpts {
        runtime: a.runtime,
        steps: 6,
        area_bytes: a.size,
        progress: a.format == Format::Table,
        extra_cpu: None,
    };
    if let Some(uri) = &a.nbd {
        // Checked before the run, not after it.
        if let Some(p) = a.compare.as_ref().filter(|p| !p.exists()) {
            bail!("--compare {}: no such file", p.display());
        }
        let r = nbd_suite(uri, &opts, a.force)?;
        print_results(
            a.format,
            &[("nbd", &r)],
            &format!(
                "nacre bench: {uri}, {} per test (CPU: this process only)",
                humantime(a.runtime)
            ),
        )?;
        return compare_and_plot(&a, "nbd", &r);
    }
    if let Some(p) = a.compare.as_ref().filter(|p| !p.exists()) {
        bail!("--compare {}: no such file", p.display());
    }
    let at = At {
        dir: a.dir.clone(),
        etcd: a.etcd.clone(),
        prefix: a.prefix.clone(),
    };
    if at.dir.is_none() && at.etcd.is_none() {
        bail!("give --dir DIR (a running nacre up), --etcd URLS or --nbd URI")
    }
    let meta = at.meta()?;
    // The OSDs' CPU is counted where they are this machine's processes.
    opts.extra_cpu = a.dir.as_deref().and_then(|d| cluster_cpu(d, true));
    let temp = a.volume.is_none();
    let name = a
        .volume
        .clone()
        .unwrap_or_else(|| format!("bench-{}", std::process::id()));
    let r = rt::block_on(async {
        let c = Cluster::connect(meta)?;
        if temp {
            c.create_volume(&name, None, a.size)?;
        }
        let r = async {
            let v = Rc::new(Volume::open(&c, &name)?);
            if !temp && !a.force {
                let size = opts.area_bytes.min(v.size_bytes());
                let vv = v.clone();
                let read = move |off: u64, len: u64| {
                    let v = vv.clone();
                    async move { Ok(v.read(off, len).await?) }
                };
                refuse_data(
                    &format!("volume {name}"),
                    first_data(read, size).await?,
                    size,
                )?;
            }
            suite::run(Rc::new(VolumeTarget(v)), &opts).await
        }
        .await;
        if temp {
            if let Err(e) = c.delete_volume(&name, false, true).await {
                eprintln!("nacre bench: could not delete temporary volume {name}: {e}");
            }
        }
        r
    })?;
    print_results(
        a.format,
        &[("nacre", &r)],
        &format!(
            "nacre bench: volume {name} of {}, client library, {} per test (CPU: {})",
            at.name(),
            humantime(a.runtime),
            if a.dir.is_some() {
                "bench + cluster"
            } else {
                "this process only"
            }
        ),
    )?;
    compare_and_plot(&a, "nacre", &r)
}

fn humantime(d: Duration) -> String {
    let s = d.as_secs_f64().round() as u64;
    match s {
        0..90 => format!("{s}s"),
        90..5400 => format!("{} min", (s + 30) / 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

#[derive(Args)]
pub struct DemoArgs {
    /// Time per test (six tests): a number and ms, s or m.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    runtime: Duration,
    /// Volume size (and bytes used by the tests, on the volume and locally).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    size: u64,
    /// OSDs of the temporary cluster.
    #[arg(long, default_value_t = 3)]
    osds: u32,
    /// Copies of every object in the temporary cluster.
    #[arg(long, default_value_t = 3)]
    replicas: u8,
    /// Where to put the temporary cluster (default: ./nacre-demo-PID).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Output: a table for people, or JSON for scripts.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

pub fn demo(a: DemoArgs) -> anyhow::Result<()> {
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("nacre-demo-{}", std::process::id())));
    if dir.exists() {
        bail!("{} exists; give another --dir", dir.display());
    }
    let dir = std::path::absolute(&dir)?;
    // Ctrl-C or SIGTERM mid-run: remove the cluster's files (GiBs) and say
    // so, instead of leaving them behind.
    let set = block_stop_signals();
    {
        let dir = dir.clone();
        std::thread::Builder::new()
            .name("demo-signals".into())
            .spawn(move || {
                let sig = wait_for_signal(&set);
                let _ = std::fs::remove_dir_all(&dir);
                eprintln!(
                    "nacre demo: {}; removed {}",
                    signal_name(sig),
                    dir.display()
                );
                std::process::exit(130);
            })?;
    }
    let progress = a.format == Format::Table;
    let say = |m: &str| {
        if progress {
            eprintln!("nacre demo: {m}");
        }
    };
    let result = (|| -> anyhow::Result<(Vec<SuiteResult>, Vec<SuiteResult>)> {
        // Each OSD holds a copy of everything at 3 replicas on 3 OSDs.
        let osd_size = (a.size * u64::from(a.replicas)).div_ceil(u64::from(a.osds)) * 2 + (1 << 30);
        let o = UpOpts {
            dir: dir.clone(),
            osds: Some(a.osds),
            pgs: None,
            osd_size_bytes: osd_size,
            // A demo dir used again keeps the stores it has.
            osd_size_given: false,
            journal_bytes: None,
            replicas: a.replicas,
            nbd: Addr::Unix(dir.join("nbd.sock")),
            restart: true,
            recovery_bytes_per_s: nacre_osd::RECOVERY_BYTES_PER_S_DEFAULT,
            ratios: (0.85, 0.95),
            scrub: nacre_osd::ScrubConfig::default(),
            out_delay: Duration::from_secs(nacre_types::OSD_OUT_DELAY_S),
            demote_slow: true,
            config: map::ClusterConfig::default(),
            reclaim_interval: cluster::RECLAIM_INTERVAL_DEFAULT,
            metrics: None,
        };
        say(&format!(
            "starting {} OSDs ({} each, {} replicas) in {}",
            a.osds,
            human(osd_size),
            a.replicas,
            dir.display()
        ));
        let mut running = cluster::start(&o)?;
        let opts = SuiteOpts {
            runtime: a.runtime,
            steps: 6,
            area_bytes: a.size,
            progress,
            // This process runs the gateway, the leader and the meta store;
            // the OSDs are its children.
            extra_cpu: cluster_cpu(&dir, false),
        };
        let uri = format!("nbd+unix:///demo?socket={}", dir.join("nbd.sock").display());
        let nacre = (|| {
            let c = map::create_volume(
                &*running.meta,
                "demo",
                &map::load(&*running.meta)?.pools[0],
                a.size,
            )?;
            say(&format!(
                "volume {} ({}), suite through NBD: {uri}",
                c.name,
                human(c.size_bytes)
            ));
            nbd_suite(&uri, &opts, true)
        })();
        running.stop();
        let nacre = nacre?;
        let local_path = dir.join("local.img");
        say(&format!(
            "the same suite on the local disk: {} (O_DIRECT, fdatasync after each QD1 write)",
            local_path.display()
        ));
        let local = rt::block_on(async {
            let flags = OpenFlags {
                create_bytes: Some(a.size),
                ..OpenFlags::default()
            };
            let dev = Rc::new(FileDev::open(&local_path, &flags)?);
            suite::run(Rc::new(suite::FileTarget::whole(dev)), &opts).await
        })?;
        Ok((nacre, local))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (nacre, local) = result?;
    print_results(
        a.format,
        &[("nacre", &nacre), ("local", &local)],
        &format!(
            "nacre demo: {} OSDs, {} replicas, NBD over a unix socket vs the local disk; {} per test; CPU = whole process (cluster + client)\n\
             What it means: every OSD here shares the one disk the local test uses, so Nacre writes each byte {} times \
             where the local test writes it once; on one disk its writes can reach at most 1/{} of local. \
             '÷ local' is Nacre's operations per second over the local disk's (above 1: faster).",
            a.osds,
            a.replicas,
            humantime(a.runtime),
            a.replicas,
            a.replicas
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::{
        damage_checks, late_scrubs, link_checks, overcommit_check, pg_summary, raw_usable,
        scrub_summary, signal_name, slow_checks,
    };
    use nacre_meta::map;
    use nacre_types::PgId;

    /// `nacre status` reads the figures slow-OSD and slow-link detection
    /// compare from the OSDs' `Stat` answers as the OSDs encode them: a
    /// disk five times the others' in every window is `SLOW_OSD` (and said
    /// demoted when the map says so), a demoted OSD no longer slow is
    /// still named, a link five times the others' is `SLOW_LINK` between
    /// its hosts, and OSDs on unix sockets have no link.
    #[test]
    fn status_names_slow_osds_and_links_from_the_osds_reports() {
        let w = |us: f64| vec![Some(us); nacre_osd::LATENCY_WINDOWS_KEPT];
        let report = |id: u32, disk: f64| {
            let peers = (0..4).filter(|&p| p != id);
            let link = |p: u32| match (id.min(p), id.max(p)) {
                (0, 1) => 20_000.0,
                _ => 200.0,
            };
            let r = nacre_osd::OsdReport {
                store_write_us_p99: w(disk),
                peer_ping_us_p50: peers.map(|p| (p, w(link(p)))).collect(),
                ..Default::default()
            };
            (id, Some(serde_json::to_value(r).unwrap()))
        };
        let stats: Vec<_> = (0..4)
            .map(|id| report(id, if id == 2 { 9_000.0 } else { 500.0 }))
            .collect();
        let codes = |c: &[serde_json::Value]| -> Vec<(String, String)> {
            (c.iter())
                .map(|c| (c["code"].as_str().unwrap().into(), c["message"].to_string()))
                .collect()
        };
        let slow = codes(&slow_checks(&stats, &[2]));
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert_eq!(slow[0].0, "SLOW_OSD");
        assert!(slow[0].1.contains("osd.2") && slow[0].1.contains("9.0 ms"));
        assert!(slow[0].1.contains("demoted"), "{slow:?}");
        let calm = codes(&slow_checks(&stats, &[3]));
        assert_eq!(calm.len(), 2, "{calm:?}");
        assert!(calm[1].1.contains("osd.3: demoted"), "{calm:?}");
        let osd = |id: u32, addr: String| map::OsdRecord {
            id,
            addr,
            host: format!("h{id}"),
            rack: String::new(),
            weight: 1,
            pg_logs: 0,
            store: String::new(),
            removed: false,
        };
        let mut m = map::ClusterMap {
            osds: (0..4)
                .map(|id| osd(id, format!("tcp:10.0.0.{id}:7000")))
                .collect(),
            ..Default::default()
        };
        let links = link_checks(&stats, &m);
        assert_eq!(codes(&links).len(), 1, "{links:?}");
        assert_eq!(links[0]["code"], "SLOW_LINK");
        assert_eq!(links[0]["hosts"], serde_json::json!(["h0", "h1"]));
        m.osds = (0..4).map(|id| osd(id, format!("unix:/s/{id}"))).collect();
        assert!(link_checks(&stats, &m).is_empty());
    }

    /// A PG is late once its last scrub (or, never scrubbed, its first
    /// plan) is 1.5 intervals of its primary's old; a deep scrub counts as
    /// a light one; a PG never planned, a primary that did not report and
    /// an interval of 0 raise nothing.
    #[test]
    fn scrubs_late_by_half_an_interval_are_named() {
        let now = 1_000_000;
        let table = map::PgTable {
            pool: 1,
            size: 1,
            // PGs 1.0 .. 1.6; osd.1 did not report.
            osds: vec![0, 0, 0, 0, 2, 1, 0],
            lead: Vec::new(),
            temp: Default::default(),
        };
        let m = map::ClusterMap {
            tables: vec![table],
            ..Default::default()
        };
        let osd = |light: u64, deep: u64| {
            let r = nacre_osd::OsdReport {
                scrub_interval_s: light,
                deep_scrub_interval_s: deep,
                ..Default::default()
            };
            Some(serde_json::to_value(r).unwrap())
        };
        let stats = vec![(0, osd(100, 1000)), (1, None), (2, osd(0, 0))];
        let stamp = |first: u64, light: u64, deep: u64| map::ScrubStamp {
            first_unix_s: first,
            light_unix_s: light,
            deep_unix_s: deep,
            ..Default::default()
        };
        let stamps = [
            // Scrubbed, deeply, just in time.
            stamp(now - 5000, now - 150, now - 1500),
            // Both a second late.
            stamp(now - 5000, now - 151, now - 1501),
            // Never scrubbed, planned long ago: both late.
            stamp(now - 1600, 0, 0),
            // Never planned (no stamp): PG 1.3.
            map::ScrubStamp::default(),
            // An interval of 0, and a primary that did not report.
            stamp(now - 5000, 0, 0),
            stamp(now - 5000, 0, 0),
            // A light scrub long ago, a deep one since: not late.
            stamp(now - 5000, now - 400, now - 120),
        ];
        let stamps = (stamps.iter().enumerate())
            .filter(|(_, s)| s.first_unix_s > 0)
            .map(|(n, s)| (PgId::new(1, n as u32), *s))
            .collect();
        let (light, deep) = late_scrubs(&m, &stats, &stamps, now);
        assert_eq!(light, vec![PgId::new(1, 1), PgId::new(1, 2)]);
        assert_eq!(deep, vec![PgId::new(1, 1), PgId::new(1, 2)]);
        let (json, checks) = scrub_summary(&stats, (light, deep));
        assert_eq!(
            (json["late_pgs"].as_u64(), json["late_deep_pgs"].as_u64()),
            (Some(2), Some(2))
        );
        let codes: Vec<&str> = checks.iter().map(|c| c["code"].as_str().unwrap()).collect();
        assert_eq!(codes, ["PG_NOT_SCRUBBED", "PG_NOT_DEEP_SCRUBBED"]);
    }

    /// Damage no copy repaired is an error, many repairs a warning, and
    /// the OSD that found `DAMAGED_OBJECTS_OUT` objects damaged is named as
    /// failing; an OSD that did not report raises nothing.
    #[test]
    fn damage_raises_checks_per_osd() {
        let osd = |damaged_reads: u64, repaired: u64| {
            let r = nacre_osd::OsdReport {
                damaged_reads,
                damaged_objects: damaged_reads,
                repaired,
                damaged_unrepaired: damaged_reads - repaired,
                last_damage: Some("object 1.2: chunk 3".into()),
                ..Default::default()
            };
            Some(serde_json::to_value(r).unwrap())
        };
        let out = nacre_types::DAMAGED_OBJECTS_OUT;
        let stats = vec![
            (0, osd(0, 0)),
            (1, osd(3, 1)),
            (2, osd(out, out)),
            (3, None),
        ];
        let checks: Vec<(u64, String)> = (damage_checks(&stats).iter())
            .map(|c| {
                (
                    c["osd"].as_u64().unwrap(),
                    c["code"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want = [
            (1, "OSD_DAMAGED"),
            (2, "OSD_TOO_MANY_REPAIRS"),
            (2, "OSD_DISK_FAILING"),
        ];
        let want: Vec<(u64, String)> = want.iter().map(|(o, c)| (*o, c.to_string())).collect();
        assert_eq!(checks, want);
        let msg = damage_checks(&stats)[0]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(msg.contains("osd.1 holds damaged data: 2 objects"), "{msg}");
        let msg = damage_checks(&stats)[2]["message"].to_string();
        assert!(
            msg.contains("replace its disk, then `nacre osd in 2`"),
            "{msg}"
        );
    }

    /// What the cluster can fill is the in OSDs' capacity up to the full
    /// ratio; provisioning more raw space than the factor times that
    /// warns, factor 0 never, and an OSD that did not report leaves it
    /// unknown.
    #[test]
    fn overcommit_warns_above_the_factor() {
        let osd = |gib: u64| {
            let r = nacre_osd::OsdReport {
                capacity_bytes: gib << 30,
                full_ratio: 0.9,
                ..Default::default()
            };
            Some(serde_json::to_value(r).unwrap())
        };
        let stats = vec![(0, osd(10)), (1, osd(10)), (2, osd(10)), (3, osd(100))];
        // osd.3 is out: 3 × 10 GiB × 0.9.
        let raw = raw_usable(&stats, &[3]).unwrap();
        assert_eq!(raw, 27 << 30);
        // 9 GiB of volumes at 3 copies fill it.
        assert!(overcommit_check(9 << 30, 27 << 30, Some(raw), 1.0).is_none());
        let c = overcommit_check(18 << 30, 54 << 30, Some(raw), 1.5).unwrap();
        assert_eq!(c["code"], "VOLUMES_OVERCOMMITTED");
        let msg = c["message"].as_str().unwrap();
        assert!(
            msg.contains("18.0 GiB (54.0 GiB of raw space at their pools' copies or shards), 2.00× the 27.0 GiB"),
            "{msg}"
        );
        assert!(overcommit_check(18 << 30, 54 << 30, Some(raw), 0.0).is_none());
        assert!(raw_usable(&[(0, osd(10)), (1, None)], &[]).is_none());
    }

    /// PG states add up over the primaries' reports; a PG none reports is
    /// unknown; inactive and unknown PGs are an error, peering and
    /// degraded ones a warning, each named with why.
    #[test]
    fn pg_states_add_up_and_raise_checks() {
        let report = |states: &[(&str, u32)], named: &[(u32, &str, &str)]| {
            let r = nacre_osd::OsdReport {
                pg_states: states.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
                pgs_not_clean: (named.iter())
                    .map(|(pg, state, why)| nacre_osd::PgReport {
                        pg: nacre_types::PgId::new(1, *pg),
                        state: state.to_string(),
                        detail: Some(why.to_string()),
                    })
                    .collect(),
                ..Default::default()
            };
            Some(serde_json::to_value(r).unwrap())
        };
        let clean = vec![
            (0, report(&[("active+clean", 3)], &[])),
            (1, report(&[("active+clean", 3)], &[])),
        ];
        let (pgs, checks) = pg_summary(6, 0, &clean);
        assert_eq!(
            (pgs["active_clean"].as_u64(), pgs["unknown"].as_u64()),
            (Some(6), Some(0))
        );
        assert!(checks.is_empty());
        let bad = vec![
            (
                0,
                report(
                    &[("active+degraded", 2), ("inactive", 1)],
                    &[
                        (1, "active+degraded", "2 of 3 copies up"),
                        (4, "inactive", "waiting for osd.2"),
                        (3, "active+degraded", "2 of 3 copies up"),
                    ],
                ),
            ),
            (1, None),
            (
                2,
                report(&[("peering", 1)], &[(5, "peering", "a write failed")]),
            ),
        ];
        let (pgs, checks) = pg_summary(6, 0, &bad);
        assert_eq!(pgs["degraded"], 2);
        assert_eq!(pgs["inactive"], 1);
        assert_eq!(pgs["peering"], 1);
        assert_eq!(pgs["unknown"], 2);
        assert_eq!(pgs["not_clean"][0]["pg"], "1.1", "sorted by PG");
        let codes: Vec<(&str, &str)> = (checks.iter())
            .map(|c| (c["code"].as_str().unwrap(), c["severity"].as_str().unwrap()))
            .collect();
        assert_eq!(
            codes,
            [
                ("PG_INACTIVE", "HEALTH_ERR"),
                ("PG_PEERING", "HEALTH_WARN"),
                ("PG_DEGRADED", "HEALTH_WARN")
            ]
        );
        let msg = checks[0]["message"].as_str().unwrap();
        assert!(msg.contains("3 PGs cannot serve I/O"), "{msg}");
        assert!(msg.contains("PG 1.4 waiting for osd.2"), "{msg}");
        assert!(msg.contains("2 with no primary reporting"), "{msg}");
        // Recovering PGs serve, and count as degraded with their progress.
        let mut r = nacre_osd::OsdReport {
            pg_states: [("active+clean".into(), 4), ("active+recovering".into(), 2)].into(),
            recovery_objects_left: 17,
            ..Default::default()
        };
        r.pgs_not_clean.push(nacre_osd::PgReport {
            pg: nacre_types::PgId::new(1, 2),
            state: "active+recovering".into(),
            detail: Some("9 of 30 object copies left to recover".into()),
        });
        let (pgs, checks) = pg_summary(6, 0, &[(0, Some(serde_json::to_value(r).unwrap()))]);
        assert_eq!(
            (
                pgs["recovering"].as_u64(),
                pgs["recovery_objects_left"].as_u64()
            ),
            (Some(2), Some(17))
        );
        assert_eq!(checks.len(), 1);
        let msg = checks[0]["message"].as_str().unwrap();
        assert_eq!(checks[0]["code"], "PG_DEGRADED");
        assert!(
            msg.contains("2 recovering, 17 object copies left (PG 1.2 9 of 30"),
            "{msg}"
        );
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(signal_name(libc::SIGINT), "SIGINT (Ctrl-C)");
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(64), "signal 64");
    }
}
