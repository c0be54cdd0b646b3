//! The `nacre` command: parses, wires, prints. Logic lives in the crates.

/// mimalloc, not glibc's malloc: a replicated 4 KiB write allocates a
/// few buffers and futures on every hop, and glibc's arena bookkeeping
/// (`_int_malloc`, `unlink_chunk`, `malloc_consolidate`) was 14% of the
/// OSDs' CPU under 4 KiB random writes (docs/BENCHMARKS.md, issue 13).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod args;
mod at;
mod cluster;
mod commands;
mod daemons;
mod disk;
mod metrics;
mod mon;
mod net;
mod osd_bench;
mod osds;
mod pg;
mod plan;
mod targets;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use nacre_bench::store_bench::{self, StoreBenchOpts};
use nacre_blockstore::{uuid_string, FormatOptions, Store, StoreOptions};
use nacre_io::{rt, FileDev, OpenFlags};

#[derive(Parser)]
#[command(
    name = "nacre",
    version,
    about = "Nacre: distributed software-defined storage"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a whole cluster on this machine in the foreground: an embedded
    /// meta store, one OSD process per file DIR/osd.N.img (its pid in
    /// DIR/osd.N.pid), an NBD gateway. Stops cleanly on SIGINT/SIGTERM (the
    /// OSDs with it; they also die if this process is killed); restart
    /// with the same DIR to serve the same volumes.
    Up(commands::UpArgs),
    /// The OSD processes of the cluster running in DIR.
    Osd {
        #[command(subcommand)]
        cmd: OsdCmd,
    },
    /// Volumes of the cluster running in DIR.
    Volume {
        #[command(subcommand)]
        cmd: commands::VolumeCmd,
    },
    /// Health, OSDs, PG states, capacity and client I/O of a cluster.
    Status {
        #[command(flatten)]
        at: at::At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// A cluster on many hosts around etcd: create it.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Pools: where volumes' data lives, with how many copies.
    Pool {
        #[command(subcommand)]
        cmd: PoolCmd,
    },
    /// A monitor of a cluster on etcd, in the foreground: any number run,
    /// one is elected (an etcd lease) and leads the cluster map (marks
    /// OSDs up, down, out; places PGs; sweeps deleted volumes' objects),
    /// the others stand by and take over within the lease's TTL. Stops on
    /// SIGTERM/SIGINT, handing over at once.
    Mon {
        #[command(flatten)]
        etcd: at::EtcdArgs,
        /// Where this monitor listens when it leads: HOST:PORT (an address
        /// the OSDs and commands reach) or unix:PATH.
        #[arg(long, value_parser = args::parse_addr)]
        addr: nacre_io::net::Addr,
        /// How long an OSD may be down before it is marked out and its PGs
        /// move to the others, e.g. 10m or 30s; 0 never.
        #[arg(long, value_parser = args::parse_duration, default_value = "10m")]
        out_delay: Duration,
        /// What this monitor, leading, does with an OSD whose store writes
        /// stand far above the others' (SLOW_OSD): demote it from leading
        /// PGs, or only warn.
        #[arg(long, value_enum, default_value = "demote")]
        slow_osd_action: args::SlowOsdAction,
        /// How often the leader looks for objects of deleted volumes and
        /// deletes them.
        #[arg(long, value_parser = args::parse_duration, default_value = "60s")]
        reclaim_interval: Duration,
        /// Serve Prometheus metrics (the cluster's map, whether this
        /// monitor leads) on http://HOST:PORT/metrics.
        #[arg(long, value_parser = args::parse_metrics_addr)]
        metrics: Option<String>,
    },
    /// Placement groups: scrub on demand.
    Pg {
        #[command(subcommand)]
        cmd: pg::PgCmd,
    },
    /// Gateways of a cluster on etcd.
    Gateway {
        #[command(subcommand)]
        cmd: GatewayCmd,
    },
    /// The standard benchmark suite against a volume of the cluster in DIR
    /// (through the client library) or against any NBD export.
    Bench(commands::BenchArgs),
    /// Start a cluster in a temporary dir, run the suite through NBD on a
    /// volume and on the local disk, print both, clean up.
    Demo(commands::DemoArgs),
    /// Estimate a planned cluster from a description (TOML): capacity,
    /// bandwidth, IOPS, QD1 latency, the time to recover a lost disk and
    /// host, and the annual probability of losing data.
    Plan(plan::PlanArgs),
    /// The network between the OSDs' hosts.
    Net {
        #[command(subcommand)]
        cmd: net::NetCmd,
    },
    /// Disks: test one before trusting it with an OSD.
    Disk {
        #[command(subcommand)]
        cmd: disk::DiskCmd,
    },
    /// One OSD's blockstore: format, inspect, benchmark.
    Store {
        #[command(subcommand)]
        cmd: StoreCmd,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Create a cluster under the prefix of an etcd (refused if one is
    /// there); it gets a random id, which every OSD's device records.
    Init {
        #[command(flatten)]
        etcd: at::EtcdArgs,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum PoolCmd {
    /// Create a pool over the OSDs that are in (`nacre up` makes the
    /// first, `rbd`; a real cluster's first is made by this).
    Create {
        /// The pool's name: 1 to 128 of A-Z a-z 0-9 . _ -.
        name: String,
        #[command(flatten)]
        at: at::At,
        /// Copies of every object, each in its own failure domain.
        #[arg(long, default_value_t = 3)]
        replicas: u8,
        /// Erasure coding instead of copies: each object cut into K data
        /// shards and M parity shards, each in its own failure domain
        /// (2 <= K <= 16, 1 <= M <= 4), e.g. 4+2: K/(K+M) of the raw space
        /// holds data, and any M shards may be lost.
        #[arg(long, value_name = "K+M", conflicts_with = "replicas")]
        ec: Option<nacre_meta::map::EcScheme>,
        /// Copies (or shards) that must be up for I/O to go on (default
        /// replicas/2+1, or K+1).
        #[arg(long)]
        min_size: Option<u8>,
        /// Placement groups (1..=16384): more spread data more evenly and
        /// cost memory and peering time per OSD.
        #[arg(long, default_value_t = 128)]
        pgs: u32,
        /// What two copies (or shards) of an object never share: an OSD,
        /// a host, or a rack (as the OSDs were registered with `nacre osd
        /// init`; each of `nacre up`'s OSDs is a host of its own).
        #[arg(long, value_parser = ["osd", "host", "rack"], default_value = "host")]
        failure_domain: String,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// List the pools.
    Ls {
        #[command(flatten)]
        at: at::At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Show one pool.
    Info {
        /// The pool.
        name: String,
        #[command(flatten)]
        at: at::At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Change a pool: its copies (its PGs are laid out anew and their data
    /// moves in the background, every complete copy kept until the new
    /// ones are) or min_size. Its PG count is fixed.
    Set {
        /// The pool.
        name: String,
        #[command(flatten)]
        at: at::At,
        /// Copies of every object.
        #[arg(long)]
        replicas: Option<u8>,
        /// Copies that must be up for I/O to go on.
        #[arg(long)]
        min_size: Option<u8>,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Remove a pool that no volume uses; every OSD deletes what it holds
    /// of it.
    Rm {
        /// The pool.
        name: String,
        #[command(flatten)]
        at: at::At,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum GatewayCmd {
    /// An NBD gateway in the foreground: serves the cluster's volumes as
    /// NBD exports (the export name is the volume's). Any number may run.
    /// Stops on SIGTERM/SIGINT.
    Nbd {
        #[command(flatten)]
        etcd: at::EtcdArgs,
        /// Where it listens: HOST:PORT (10809 is NBD's port) or unix:PATH.
        #[arg(long, value_parser = args::parse_addr)]
        listen: nacre_io::net::Addr,
        /// Serve Prometheus metrics of its NBD requests on
        /// http://HOST:PORT/metrics.
        #[arg(long, value_parser = args::parse_metrics_addr)]
        metrics: Option<String>,
    },
}

#[derive(Subcommand)]
enum OsdCmd {
    /// Register an OSD of a cluster on etcd and format its device; its
    /// store's label records the cluster's id and the OSD's.
    Init {
        #[command(flatten)]
        etcd: at::EtcdArgs,
        /// The OSD's device (a block device, or a file; its contents are
        /// destroyed).
        #[arg(long)]
        dev: PathBuf,
        /// Where the OSD listens: HOST:PORT, an address its peers, the
        /// monitors and the gateways reach.
        #[arg(long, value_parser = args::parse_addr)]
        addr: nacre_io::net::Addr,
        /// Its host, for failure domain host (default this machine's name).
        #[arg(long)]
        host: Option<String>,
        /// Its rack, for failure domain rack.
        #[arg(long, default_value = "default")]
        rack: String,
        /// Its share of the data relative to the others (default its size
        /// in GiB).
        #[arg(long)]
        weight: Option<u32>,
        /// Create DEV as a file of this size if it does not exist.
        #[arg(long, value_parser = args::parse_size)]
        size: Option<u64>,
        /// Journal size of its store (default 1/64 of it, 64 MiB..1 GiB).
        #[arg(long, value_parser = args::parse_size)]
        journal_size: Option<u64>,
        /// The most PGs its store can hold logs of (default the pool's PG
        /// count, at least 1024; 64 KiB of the device each).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
        pg_logs: Option<u32>,
        /// Format DEV even if it holds a Nacre store (named in the
        /// refusal without it).
        #[arg(long)]
        force: bool,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Start a stopped or crashed OSD of the `nacre up` running in DIR and
    /// wait until it is up (stop one with SIGTERM to the pid in
    /// DIR/osd.N.pid).
    Start {
        /// The OSD's number (osd.ID).
        id: u32,
        /// The directory of the running cluster (`nacre up --dir`).
        #[arg(long)]
        dir: PathBuf,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Add an OSD to the running cluster in DIR: a new file DIR/osd.N.img,
    /// its store and its process; placement then gives it its share of the
    /// PGs, whose data moves to it in the background while they serve.
    /// `nacre up` keeps it across restarts.
    Add {
        /// The directory of the running cluster (`nacre up --dir`).
        #[arg(long)]
        dir: PathBuf,
        /// Size of the new OSD's file: a number and a unit (B, K, M, G, T;
        /// binary); default the size of the cluster's other OSD files.
        /// Placement weighs OSDs by size.
        #[arg(long, value_parser = args::parse_size)]
        size: Option<u64>,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Remove an OSD from the cluster for good (a disk taken away): refused
    /// unless it is down (stopped), out (`nacre osd out`) and every PG is
    /// clean without it. Its id is not given again.
    Rm {
        /// The OSD's number (osd.ID).
        id: u32,
        #[command(flatten)]
        at: at::At,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Have each OSD measure its own store, one at a time (or all at once
    /// with --parallel): SIZE written whole, object by object, 4 KiB random
    /// writes (each durable) and reads at QD1 and QD32 over it, then read
    /// back whole; no replication, no network, the OSD's client I/O going
    /// on beside it. Its objects are deleted at the end. A table ranked by
    /// 4 KiB write latency at QD1; an OSD twice as slow as the median on
    /// any figure is marked. Exits non-zero if a bench failed.
    Bench {
        /// The OSD's number (osd.ID), or all (the OSDs that are up).
        #[arg(default_value = "all")]
        osd: String,
        /// Bytes each OSD writes: a number and a unit (B, K, M, G;
        /// binary), 4M to 64G; refused where it would take a store past
        /// its nearfull ratio.
        #[arg(long, value_parser = args::parse_size, default_value = "256M")]
        size: u64,
        /// Every OSD at once (on one machine they then share its disk).
        #[arg(long)]
        parallel: bool,
        #[command(flatten)]
        at: at::At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Every OSD: host, rack, weight, up or down, in or out, the PGs
    /// placement gives it and those it leads, its address.
    Ls {
        #[command(flatten)]
        at: at::At,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Mark an OSD out: the PGs it holds move to the other OSDs (the data
    /// is copied in the background while the PGs serve). Refused if too
    /// few OSDs would be left for the pool's replicas.
    Out {
        /// The OSD's number (osd.ID).
        id: u32,
        #[command(flatten)]
        at: at::At,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Mark an out OSD in again: placement gives it its share of the PGs
    /// back (moving as little as it can).
    In {
        /// The OSD's number (osd.ID).
        id: u32,
        #[command(flatten)]
        at: at::At,
        /// Output: text for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Run one OSD in the foreground: with --dir and --id, one of the
    /// cluster in DIR (what `nacre up` starts for each OSD); with --etcd
    /// and --dev, the OSD `nacre osd init` made on DEV. Stops cleanly on
    /// SIGTERM/SIGINT.
    Run {
        /// The directory of the running cluster (`nacre up --dir`).
        #[arg(
            long,
            required_unless_present = "etcd",
            conflicts_with = "etcd",
            requires = "id"
        )]
        dir: Option<PathBuf>,
        /// The OSD's number (osd.ID), with --dir.
        #[arg(long)]
        id: Option<u32>,
        /// The etcd of a cluster on many hosts: its client URLs,
        /// comma-separated.
        #[arg(long, requires = "dev")]
        etcd: Option<String>,
        /// With --etcd: where the cluster's keys live in etcd.
        #[arg(long, default_value = at::PREFIX_DEFAULT)]
        prefix: String,
        /// With --etcd: the OSD's device, as `nacre osd init` formatted it.
        #[arg(long)]
        dev: Option<PathBuf>,
        /// Size of the OSD's file DIR/osd.ID.img if it does not exist yet.
        #[arg(long, value_parser = args::parse_size, default_value = "4G")]
        create_size: u64,
        /// Journal size of the OSD's store if it does not exist yet.
        #[arg(long, value_parser = args::parse_size)]
        journal_size: Option<u64>,
        /// Bytes per second this OSD pushes to the copies of its PGs that
        /// lack objects (background recovery), e.g. 50M.
        #[arg(long, value_parser = args::parse_rate, default_value = "100M")]
        recovery_rate: u64,
        /// Used fraction of the store at which `nacre status` warns
        /// (OSD_NEARFULL).
        #[arg(long, value_parser = args::parse_ratio, default_value = "0.85")]
        nearfull_ratio: f64,
        /// Used fraction of the store beyond which writes that need new
        /// space are refused (ENOSPC), keeping the rest for recovery.
        #[arg(long, value_parser = args::parse_ratio, default_value = "0.95")]
        full_ratio: f64,
        #[command(flatten)]
        scrub: args::ScrubArgs,
        /// Serve Prometheus metrics of this OSD (ops by type with their
        /// latencies, space, PGs, recovery, its store) on
        /// http://HOST:PORT/metrics.
        #[arg(long, value_parser = args::parse_metrics_addr)]
        metrics: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
pub enum Format {
    Table,
    Json,
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Benchmark a fresh store over FILE against the same I/O issued raw to
    /// FILE (destroys FILE's contents).
    Bench {
        /// The file (or block device) to test on: its contents are
        /// destroyed.
        #[arg(long)]
        path: PathBuf,
        /// Size of FILE (created or resized to this).
        #[arg(long, value_parser = args::parse_size, default_value = "4G")]
        size: u64,
        /// Time per test (12 tests: 6 raw, 6 on the store).
        #[arg(long, value_parser = args::parse_duration, default_value = "10s")]
        runtime: Duration,
        /// The store's block (object) size: writes of a whole block are
        /// written in place, smaller ones go through the journal.
        #[arg(long, value_parser = args::parse_size, default_value = "128K")]
        block_size: u64,
        /// Journal size (default 1/64 of the store, 64 MiB..1 GiB).
        #[arg(long, value_parser = args::parse_size)]
        journal_size: Option<u64>,
        /// Skip fsyncs: only for devices without a volatile write cache.
        #[arg(long)]
        immediate_commit: bool,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
    /// Format FILE (or a block device) as an empty store.
    Format {
        /// The file (created if missing) or block device to format.
        #[arg(long)]
        path: PathBuf,
        /// Create or grow FILE to this size.
        #[arg(long, value_parser = args::parse_size)]
        size: Option<u64>,
        /// The store's block (object) size: writes of a whole block are
        /// written in place, smaller ones go through the journal.
        #[arg(long, value_parser = args::parse_size, default_value = "128K")]
        block_size: u64,
        /// Journal size (default 1/64 of the store, 64 MiB..1 GiB).
        #[arg(long, value_parser = args::parse_size)]
        journal_size: Option<u64>,
    },
    /// Open a store (replaying its journal) and print what it holds.
    Info {
        /// The store's file or block device.
        #[arg(long)]
        path: PathBuf,
        /// Also list every object with its version and where on the device
        /// its data block starts (if it has one; a small write may still
        /// live in the journal only).
        #[arg(long)]
        objects: bool,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

/// Transparent huge pages off for this process and the processes it
/// starts (the flag is inherited through fork and kept across exec).
/// mimalloc asks for huge pages on its arenas (`MADV_HUGEPAGE`), so when a
/// daemon's heap grows — an OSD's cache of unfolded writes filling again
/// after memory went back — the reactor thread takes a page fault that
/// zeroes 2 MiB at once; with `defrag=madvise` the kernel may also compact
/// memory for it first. On the test VM such faults held an OSD's only
/// thread 17–22 ms, some fifty times in 20 s of QD1 writes: p99.9 of a
/// replicated 4 KiB write 17–19 ms, 3.0–3.1 ms without
/// (docs/BENCHMARKS.md, *Huge page faults*). Pages faulted before this
/// runs (mimalloc's first arena) stay as they are. `serves`: a daemon,
/// which says so if it cannot.
fn huge_pages_off(serves: bool) {
    let (disable, unused) = (1 as libc::c_ulong, 0 as libc::c_ulong);
    // SAFETY: prctl with integer arguments; it changes the memory policy
    // of this process and of those it starts.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, disable, unused, unused, unused) };
    if rc != 0 && serves {
        let e = std::io::Error::last_os_error();
        tracing::warn!(
            "transparent huge pages stay on (prctl PR_SET_THP_DISABLE: {e}): a growing heap may stall \
             a daemon for a huge page's fault; turn them off for the machine \
             (/sys/kernel/mm/transparent_hugepage/enabled = never) to avoid it"
        );
    }
}

fn block_bytes(v: u64) -> anyhow::Result<u32> {
    u32::try_from(v).context("block size too large")
}

fn main() {
    let level = std::env::var("NACRE_LOG").unwrap_or_else(|_| "warn".into());
    let level = level.parse().unwrap_or(tracing::Level::WARN);
    // Colours only for a person at a terminal, not in logs and pipes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    let cli = Cli::parse();
    let serves = matches!(
        cli.cmd,
        Cmd::Up(_)
            | Cmd::Demo(_)
            | Cmd::Bench(_)
            | Cmd::Mon { .. }
            | Cmd::Gateway { .. }
            | Cmd::Osd {
                cmd: OsdCmd::Run { .. }
            }
    );
    huge_pages_off(serves);
    if !serves {
        // Short-lived commands die quietly when their output pipe closes
        // (`nacre status | head`), as shell tools do.
        // SAFETY: restoring the default disposition of one signal.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    if let Err(e) = run(cli) {
        eprintln!("nacre: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Store { cmd } => store(cmd),
        Cmd::Up(a) => commands::up(a),
        Cmd::Osd { cmd } => match cmd {
            OsdCmd::Run {
                dir,
                id,
                etcd,
                prefix,
                dev,
                create_size,
                journal_size,
                recovery_rate,
                nearfull_ratio,
                full_ratio,
                scrub,
                metrics,
            } => {
                let ratios = args::check_ratios(nearfull_ratio, full_ratio)?;
                let scrub = scrub.config();
                match (dir, id, etcd, dev) {
                    (Some(dir), Some(id), None, None) => osds::run(&osds::RunOpts {
                        dir,
                        id,
                        create_bytes: create_size,
                        journal_bytes: journal_size,
                        recovery_bytes_per_s: recovery_rate,
                        ratios,
                        scrub,
                        metrics,
                    }),
                    (None, None, Some(etcd), Some(dev)) => daemons::osd_run(
                        &at::EtcdArgs { etcd, prefix },
                        &daemons::OsdRun {
                            dev,
                            recovery_bytes_per_s: recovery_rate,
                            ratios,
                            scrub,
                            metrics,
                        },
                    ),
                    _ => anyhow::bail!("give --dir DIR --id ID, or --etcd URLS --dev PATH"),
                }
            }
            OsdCmd::Init {
                etcd,
                dev,
                addr,
                host,
                rack,
                weight,
                size,
                journal_size,
                pg_logs,
                force,
                format,
            } => daemons::osd_init(
                &etcd,
                &daemons::OsdInit {
                    dev,
                    addr,
                    host,
                    rack,
                    weight,
                    size_bytes: size,
                    journal_bytes: journal_size,
                    pg_logs,
                    force,
                },
                format,
            ),
            OsdCmd::Start { id, dir, format } => commands::osd_start(&dir, id, format),
            OsdCmd::Add { dir, size, format } => commands::osd_add(&dir, size, format),
            OsdCmd::Out { id, at, format } => commands::osd_mark(&at, id, true, format),
            OsdCmd::Ls { at, format } => commands::osd_ls(&at, format),
            OsdCmd::Bench {
                osd,
                size,
                parallel,
                at,
                format,
            } => osd_bench::run(&at, &osd, size, parallel, format),
            OsdCmd::Rm { id, at, format } => commands::osd_rm(&at, id, format),
            OsdCmd::In { id, at, format } => commands::osd_mark(&at, id, false, format),
        },
        Cmd::Volume { cmd } => commands::volume(cmd),
        Cmd::Status { at, format } => commands::status(&at, format),
        Cmd::Cluster {
            cmd: ClusterCmd::Init { etcd, format },
        } => daemons::cluster_init(&etcd, format),
        Cmd::Pg { cmd } => pg::run(cmd),
        Cmd::Pool { cmd } => match cmd {
            PoolCmd::Create {
                name,
                at,
                replicas,
                ec,
                min_size,
                pgs,
                failure_domain,
                format,
            } => daemons::pool_create(
                &at,
                &daemons::PoolCreate {
                    name,
                    replicas,
                    ec,
                    min_size,
                    pgs,
                    failure_domain,
                },
                format,
            ),
            PoolCmd::Ls { at, format } => daemons::pool_show(&at, None, format),
            PoolCmd::Info { name, at, format } => daemons::pool_show(&at, Some(&name), format),
            PoolCmd::Set {
                name,
                at,
                replicas,
                min_size,
                format,
            } => daemons::pool_set(&at, &name, replicas, min_size, format),
            PoolCmd::Rm { name, at, format } => daemons::pool_rm(&at, &name, format),
        },
        Cmd::Mon {
            etcd,
            addr,
            out_delay,
            slow_osd_action,
            reclaim_interval,
            metrics,
        } => mon::run(&mon::MonOpts {
            meta: etcd.meta_waiting()?,
            keepalive_meta: mon::keepalive_meta(&etcd)?,
            etcd,
            addr,
            out_delay,
            demote_slow: slow_osd_action == args::SlowOsdAction::Demote,
            reclaim_interval,
            metrics,
        }),
        Cmd::Gateway {
            cmd:
                GatewayCmd::Nbd {
                    etcd,
                    listen,
                    metrics,
                },
        } => daemons::gateway_nbd(&etcd, &listen, metrics.as_deref()),
        Cmd::Bench(a) => commands::bench(a),
        Cmd::Demo(a) => commands::demo(a),
        Cmd::Plan(a) => plan::run(a),
        Cmd::Disk { cmd } => disk::run(cmd),
        Cmd::Net { cmd } => net::run(cmd),
    }
}

fn store(cmd: StoreCmd) -> anyhow::Result<()> {
    match cmd {
        StoreCmd::Bench {
            path,
            size,
            runtime,
            block_size,
            journal_size,
            immediate_commit,
            format,
        } => {
            let opts = StoreBenchOpts {
                path,
                size_bytes: size,
                runtime,
                block_bytes: block_bytes(block_size)?,
                journal_bytes: journal_size,
                immediate_commit,
                progress: format == Format::Table,
            };
            let report = store_bench::run(&opts)?;
            match format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                Format::Table => print!("{}", store_bench::table(&report)),
            }
            Ok(())
        }
        StoreCmd::Format {
            path,
            size,
            block_size,
            journal_size,
        } => rt::block_on(async {
            let flags = OpenFlags {
                create_bytes: size,
                ..OpenFlags::default()
            };
            let dev = FileDev::open(&path, &flags)?;
            let opts = FormatOptions {
                block_bytes: block_bytes(block_size)?,
                journal_bytes: journal_size,
                ..FormatOptions::default()
            };
            let g = Store::format(&dev, &opts).await?;
            println!(
                "formatted {}: store {}, {} blocks of {} KiB, journal {} MiB",
                path.display(),
                uuid_string(&g.uuid),
                g.nblocks,
                g.block_bytes >> 10,
                g.journal_bytes >> 20
            );
            Ok(())
        }),
        StoreCmd::Info {
            path,
            objects,
            format,
        } => rt::block_on(async {
            let dev = FileDev::open(&path, &OpenFlags::default())?;
            let (s, report) = Store::open(dev, StoreOptions::default()).await?;
            let g = s.geometry().clone();
            let space = s.space();
            let mem = s.memory();
            let listed: Vec<serde_json::Value> = (s.list().into_iter())
                .filter(|_| objects)
                .map(|(oid, version)| {
                    let at = s.block_of(oid).map(|b| g.block_offset(b));
                    serde_json::json!({"volume": oid.volume.0, "block": oid.block, "version": version, "data_at": at})
                })
                .collect();
            let info = serde_json::json!({
                "uuid": uuid_string(&g.uuid),
                "data_offset": g.data_offset,
                "lineage": s.lineage(),
                "block_bytes": g.block_bytes,
                "blocks": g.nblocks,
                "journal_bytes": g.journal_bytes,
                "objects": s.object_count(),
                "space": {
                    "total_bytes": space.total_bytes,
                    "used_bytes": space.used_bytes,
                    "free_bytes": space.free_bytes,
                    "pending_free_bytes": space.pending_free_bytes,
                },
                "open": {
                    "checkpoint_seq": report.checkpoint_seq,
                    "batches_replayed": report.batches_replayed,
                    "records_replayed": report.records_replayed,
                    "journal_bytes_replayed": report.journal_bytes_replayed,
                    "replay_stopped": report.replay_stopped,
                    "torn_tail": report.torn_tail,
                },
                "memory": {
                    "index_bytes": mem.index_bytes,
                    "csum_cache_bytes": mem.csum_cache_bytes,
                    "overlay_cache_bytes": mem.overlay_cache_bytes,
                },
                "objects_listed": listed,
            });
            s.close().await?;
            match format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&info)?),
                Format::Table => {
                    println!(
                        "store        {} (lineage {})",
                        uuid_string(&g.uuid),
                        info["lineage"]
                    );
                    println!("blocks       {} × {} KiB", g.nblocks, g.block_bytes >> 10);
                    println!("journal      {} MiB", g.journal_bytes >> 20);
                    println!("objects      {}", info["objects"]);
                    println!(
                        "space        {} MiB used, {} MiB free, {} MiB freed pending a checkpoint",
                        space.used_bytes >> 20,
                        space.free_bytes >> 20,
                        space.pending_free_bytes >> 20
                    );
                    println!(
                        "replayed     {} records in {} batches ({} KiB)",
                        report.records_replayed,
                        report.batches_replayed,
                        report.journal_bytes_replayed >> 10
                    );
                    if let Some(why) = &report.torn_tail {
                        println!("torn tail    {why} (a write cut by a crash, never acknowledged)");
                    }
                    if let Some(why) = &report.replay_stopped {
                        println!("WARNING      journal replay stopped early: {why}");
                    }
                    for o in &listed {
                        println!(
                            "object       {}/{} v{:#x} data at {}",
                            o["volume"],
                            o["block"],
                            o["version"].as_u64().unwrap_or(0),
                            o["data_at"]
                                .as_u64()
                                .map_or("(journal only)".into(), |a| format!("byte {a}"))
                        );
                    }
                }
            }
            Ok(())
        }),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every option and argument of every command says what it is (and
    /// clap adds its default): `nacre X --help` is the operator's manual.
    #[test]
    fn every_option_is_described() {
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", c.get_name());
            if c.get_about().is_none() && !path.ends_with(" help") {
                missing.push(format!("{path} (the command)"));
            }
            for a in c.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                    missing.push(format!("{path} {id}"));
                }
            }
            for s in c.get_subcommands() {
                walk(s, &path, missing);
            }
        }
        // Every conflict and requirement names an argument that exists.
        super::Cli::command().debug_assert();
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "undescribed:\n{}", missing.join("\n"));
    }

    /// The daemons' `--metrics` and `--slow-osd-action` are parsed and
    /// checked before anything starts.
    #[test]
    fn daemon_options_are_checked() {
        use clap::Parser;
        let parse = |a: &[&str]| super::Cli::try_parse_from([&["nacre"], a].concat());
        let e = "--etcd=http://127.0.0.1:2379";
        for ok in [
            &[
                "up",
                "--dir",
                "d",
                "--metrics",
                "127.0.0.1:0",
                "--slow-osd-action",
                "warn",
            ][..],
            &[
                "mon",
                e,
                "--addr",
                "127.0.0.1:6789",
                "--slow-osd-action",
                "demote",
                "--metrics",
                "[::1]:9283",
            ],
            &[
                "gateway",
                "nbd",
                e,
                "--listen",
                "127.0.0.1:10809",
                "--metrics",
                "127.0.0.1:9284",
            ],
            &[
                "osd",
                "run",
                "--dir",
                "d",
                "--id",
                "0",
                "--metrics",
                "127.0.0.1:9285",
            ],
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            &["up", "--dir", "d", "--slow-osd-action", "ignore"][..],
            &["up", "--dir", "d", "--metrics", "unix:/tmp/m"],
            &["up", "--dir", "d", "--metrics", "9283"],
            &[
                "mon",
                e,
                "--addr",
                "127.0.0.1:6789",
                "--metrics",
                "127.0.0.1:70000",
            ],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
