//! `--metrics ADDR`: a Prometheus text endpoint (`GET /metrics`) on every
//! daemon — `nacre osd run` (its OSD), `nacre mon` (the cluster's map, and
//! whether it leads), `nacre gateway nbd` (its NBD requests), and `nacre up`
//! (all of them). Encoded with `prometheus-client`, served with `tiny_http`
//! on a thread of its own; the metric names are in docs/METRICS.md.
//!
//! A scrape asks each OSD for its counters (`Op::Metrics`) at the moment it
//! comes: OSDs run in their own processes, and only what they say is
//! exported (an OSD that is down, or does not answer, has no series; the
//! map's `nacre_osd_up` says it is down). Counters are the OSDs' own since
//! they started; a restart starts them again at zero, which Prometheus'
//! `rate` takes for a reset. The map's families come from `nacre up` or
//! the leading monitor only, so a cluster exports them once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nacre_io::net::Addr;
use nacre_io::rt;
use nacre_meta::map::{self, ClusterMap};
use nacre_meta::MetaStore;
use nacre_nbd::metrics::{CommandSnapshot, NbdMetrics, NbdSnapshot};
use nacre_net::Conn;
use nacre_osd::OsdMetrics;
use nacre_types::metrics::HistogramSnapshot;
use nacre_types::ObjectId;
use nacre_wire::{Header, Op, Status};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// How long a scrape waits for an OSD's answer.
const OSD_TIMEOUT: Duration = Duration::from_secs(2);

/// Which OSDs an endpoint speaks for.
#[derive(Clone, Debug)]
pub enum Osds {
    None,
    /// Every OSD the map has up (`nacre up`).
    All,
    /// One, at its address (`nacre osd run`: no map needed, so it answers
    /// while the meta store cannot be reached, or the OSD is marked down).
    One(u32, Addr),
}

/// What an endpoint exports.
pub struct Sources {
    pub meta: Arc<dyn MetaStore>,
    pub osds: Osds,
    /// The cluster's map: epoch, OSDs up, in and demoted, pools.
    pub cluster: bool,
    /// A monitor's address: whether it leads (the map's families are
    /// then exported by the leader only: one set of them per cluster).
    pub mon: Option<Addr>,
    pub gateway: Option<Arc<NbdMetrics>>,
}

/// How often the serving thread looks whether it should stop.
const STOP_POLL: Duration = Duration::from_millis(250);

/// A running endpoint; stopped when dropped (after the scrape it is
/// answering, if any: not waited for, a client that reads nothing must
/// not hold a daemon's stop).
pub struct Endpoint {
    stop: Arc<AtomicBool>,
    pub addr: std::net::SocketAddr,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn bind(addr: &str) -> anyhow::Result<tiny_http::Server> {
    tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| {
            format!("metrics endpoint on {addr} (give another address, or port 0 for a free one)")
        })
}

/// Starts serving `sources` on `addr` (HOST:PORT; port 0 picks one, see
/// [`Endpoint::addr`]).
pub fn serve(addr: &str, sources: Sources) -> anyhow::Result<Endpoint> {
    let mut http = bind(addr)?;
    let bound = match http.server_addr() {
        tiny_http::ListenAddr::IP(a) => a,
        tiny_http::ListenAddr::Unix(_) => anyhow::bail!("metrics endpoint: not an IP address"),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            while !stopping.load(Ordering::Acquire) {
                match http.recv_timeout(STOP_POLL) {
                    Ok(Some(req)) => answer(req, &sources),
                    Ok(None) => {}
                    // Its accept failed (out of file descriptors?) and
                    // stopped: serve again on the same address.
                    Err(e) => {
                        tracing::warn!(
                            "metrics: the endpoint on {bound} failed ({e}): opening it again"
                        );
                        drop(http);
                        loop {
                            std::thread::sleep(Duration::from_secs(1));
                            if stopping.load(Ordering::Acquire) {
                                return;
                            }
                            match bind(&bound.to_string()) {
                                Ok(h) => break http = h,
                                Err(e) => tracing::warn!("metrics: {e:#}"),
                            }
                        }
                    }
                }
            }
        })?;
    tracing::info!("metrics: serving Prometheus text on http://{bound}/metrics");
    Ok(Endpoint { stop, addr: bound })
}

fn answer(req: tiny_http::Request, sources: &Sources) {
    let header = |k: &str, v: &str| {
        tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).expect("a valid header")
    };
    let path = req.url().split('?').next().unwrap_or("");
    let get = matches!(
        req.method(),
        tiny_http::Method::Get | tiny_http::Method::Head
    );
    let reply = match (get, path) {
        (true, "/metrics") => {
            // Each scrape on a runtime of its own: whatever it leaves
            // (connections to OSDs) ends with it.
            let scrape = rt::block_on(collect(sources));
            match encode(scrape) {
                Ok(text) => tiny_http::Response::from_string(text).with_header(header(
                    "Content-Type",
                    prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                )),
                Err(e) => tiny_http::Response::from_string(format!("encoding failed: {e}\n"))
                    .with_status_code(500),
            }
        }
        (true, "/") => tiny_http::Response::from_string(
            "Nacre metrics: GET /metrics (Prometheus text format)\n",
        ),
        (true, _) => {
            tiny_http::Response::from_string("not found: try /metrics\n").with_status_code(404)
        }
        (false, _) => tiny_http::Response::from_string("only GET is served\n")
            .with_status_code(405)
            .with_header(header("Allow", "GET, HEAD")),
    };
    if let Err(e) = req.respond(reply) {
        tracing::debug!("metrics: answering a scrape: {e}");
    }
}

/// Everything one scrape exports.
#[derive(Debug, Default)]
struct Scrape {
    /// The OSDs that answered.
    osds: Vec<(u32, OsdMetrics)>,
    map: Option<ClusterMap>,
    /// Whether this monitor leads.
    leading: Option<bool>,
    gateway: Option<NbdSnapshot>,
}

async fn collect(s: &Sources) -> Scrape {
    let mut scrape = Scrape {
        gateway: s.gateway.as_ref().map(|g| g.snapshot()),
        ..Default::default()
    };
    if let Some(addr) = &s.mon {
        // Not said when the meta store cannot tell: a 0 would raise a
        // false "no leader".
        match crate::at::elected_leader(&*s.meta) {
            Ok(leader) => scrape.leading = Some(leader.as_ref() == Some(addr)),
            Err(e) => tracing::warn!("metrics: looking for the leader: {e:#}"),
        }
    }
    let wants_map = (s.cluster && scrape.leading != Some(false)) || matches!(s.osds, Osds::All);
    let m = match wants_map.then(|| map::load(&*s.meta)) {
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            tracing::warn!("metrics: reading the cluster map: {e}");
            None
        }
        None => None,
    };
    let targets: Vec<(u32, Addr)> = match (&s.osds, &m) {
        (Osds::One(id, addr), _) => vec![(*id, addr.clone())],
        (Osds::All, Some(m)) => (m.osds.iter())
            .filter(|o| m.is_up(o.id))
            .filter_map(|o| Some((o.id, o.addr.parse().ok()?)))
            .collect(),
        _ => Vec::new(),
    };
    // (Each connect is made at once, bounded; the answers are awaited
    // together.)
    let asked: Vec<_> = (targets.into_iter())
        .map(|(id, addr)| rt::spawn(async move { (id, ask_osd(&addr).await) }))
        .collect();
    scrape.osds = (rt::join_all(asked).await.into_iter())
        .filter_map(|(id, m)| Some((id, m?)))
        .collect();
    if s.cluster {
        scrape.map = m;
    }
    scrape
}

/// An OSD's answer to `Op::Metrics`, if it gives one in time.
async fn ask_osd(addr: &Addr) -> Option<OsdMetrics> {
    let c = Conn::connect_with_timeout(addr, OSD_TIMEOUT).ok()?;
    let h = Header::request(Op::Metrics, 0, ObjectId::default());
    let f = rt::timeout(OSD_TIMEOUT, c.call(h, None)).await?.ok()?;
    c.close();
    if f.h.status != Status::Ok {
        return None;
    }
    serde_json::from_slice(f.payload.as_deref()?).ok()
}

/// The Prometheus text of `scrape`.
fn encode(scrape: Scrape) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

/// `Read` → `read`, `RepWrite` → `rep_write`: label values as Prometheus
/// writes them.
fn snake(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                s.push('_');
            }
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

type Labels = Vec<(&'static str, String)>;

/// One metric family: its samples, each with its labels.
struct Family<'a> {
    enc: prometheus_client::encoding::MetricEncoder<'a>,
}

impl Family<'_> {
    fn counter(&mut self, labels: &Labels, v: u64) -> std::fmt::Result {
        (self.enc.encode_family(labels)?).encode_counter::<NoLabelSet, _, u64>(&v, None)
    }

    fn gauge(&mut self, labels: &Labels, v: f64) -> std::fmt::Result {
        (self.enc.encode_family(labels)?).encode_gauge(&v)
    }

    fn histogram(&mut self, labels: &Labels, h: &HistogramSnapshot) -> std::fmt::Result {
        let buckets = h.buckets_seconds();
        (self.enc.encode_family(labels)?).encode_histogram::<NoLabelSet>(
            h.sum_us as f64 / 1e6,
            h.count(),
            &buckets,
            None,
        )
    }
}

/// A family whose samples `each` writes, left out when there are none
/// (a family without samples says nothing).
fn family<T>(
    e: &mut DescriptorEncoder<'_>,
    (name, help, t): (&str, &str, MetricType),
    items: &[T],
    mut each: impl FnMut(&mut Family<'_>, &T) -> std::fmt::Result,
) -> std::fmt::Result {
    if items.is_empty() {
        return Ok(());
    }
    // The encoder adds a counter's `_total` itself.
    let name = match t {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    let mut f = Family {
        enc: e.encode_descriptor(name, help, None, t)?,
    };
    for it in items {
        each(&mut f, it)?;
    }
    Ok(())
}

const C: MetricType = MetricType::Counter;
const G: MetricType = MetricType::Gauge;
const H: MetricType = MetricType::Histogram;

fn osd_label(id: u32) -> Labels {
    vec![("osd", id.to_string())]
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> std::fmt::Result {
        self.encode_osds(&mut e)?;
        self.encode_cluster(&mut e)?;
        self.encode_gateway(&mut e)
    }
}

/// An OSD's gauges and counters taken from its report: `(name, help,
/// type, value)`.
type Figure = (
    &'static str,
    &'static str,
    MetricType,
    fn(&OsdMetrics) -> f64,
);

const OSD_FIGURES: &[Figure] = &[
    (
        "nacre_osd_ops_in_flight",
        "Ops the OSD was serving when scraped (its queue depth).",
        G,
        |m| m.ops_in_flight as f64,
    ),
    ("nacre_osd_epoch", "The map epoch the OSD is in.", G, |m| {
        m.report.epoch as f64
    }),
    (
        "nacre_osd_capacity_bytes",
        "The OSD store's size.",
        G,
        |m| m.report.capacity_bytes as f64,
    ),
    (
        "nacre_osd_used_bytes",
        "Bytes of the OSD's store in use.",
        G,
        |m| m.report.used_bytes as f64,
    ),
    (
        "nacre_osd_objects",
        "Objects (copies and shards) the OSD's store holds.",
        G,
        |m| m.report.objects as f64,
    ),
    (
        "nacre_osd_nearfull_ratio",
        "The used fraction at which the OSD is near full.",
        G,
        |m| m.report.nearfull_ratio,
    ),
    (
        "nacre_osd_full_ratio",
        "The used fraction beyond which the OSD refuses writes that need space.",
        G,
        |m| m.report.full_ratio,
    ),
    (
        "nacre_osd_client_reads_total",
        "Client reads the OSD served as primary (or as a shard read directly).",
        C,
        |m| m.report.reads as f64,
    ),
    (
        "nacre_osd_client_writes_total",
        "Client writes the OSD served as primary.",
        C,
        |m| m.report.writes as f64,
    ),
    (
        "nacre_osd_client_read_bytes_total",
        "Bytes of client reads the OSD served as primary.",
        C,
        |m| m.report.read_bytes as f64,
    ),
    (
        "nacre_osd_client_write_bytes_total",
        "Bytes of client writes the OSD served as primary.",
        C,
        |m| m.report.write_bytes as f64,
    ),
    (
        "nacre_osd_recovered_objects_total",
        "Object copies the OSD recovered as primary (rebalance included).",
        C,
        |m| m.report.recovered_objects as f64,
    ),
    (
        "nacre_osd_recovered_bytes_total",
        "Bytes of the object copies the OSD recovered as primary.",
        C,
        |m| m.report.recovered_bytes as f64,
    ),
    (
        "nacre_osd_rebalanced_objects_total",
        "Of the copies recovered, those of PGs that kept every copy (moves).",
        C,
        |m| m.report.rebalanced_objects as f64,
    ),
    (
        "nacre_osd_rebalanced_bytes_total",
        "Bytes of those moves.",
        C,
        |m| m.report.rebalanced_bytes as f64,
    ),
    (
        "nacre_osd_degraded_objects_left",
        "Object copies the OSD's degraded PGs still lack (recovering).",
        G,
        |m| m.report.degraded_objects_left as f64,
    ),
    (
        "nacre_osd_misplaced_objects_left",
        "Object copies the OSD's moving PGs still lack (backfilling).",
        G,
        |m| m.report.misplaced_objects_left as f64,
    ),
    (
        "nacre_osd_degraded_waiting_objects",
        "Object copies missing from the OSD's active PGs whose OSD is down and not replaced yet.",
        G,
        |m| m.report.degraded_waiting_objects as f64,
    ),
    (
        "nacre_osd_stray_objects_removed_total",
        "Objects of stray copies (PGs placed elsewhere) the OSD deleted.",
        C,
        |m| m.report.stray_objects_removed as f64,
    ),
    (
        "nacre_osd_damaged_reads_total",
        "Reads that found the OSD's copy damaged.",
        C,
        |m| m.report.damaged_reads as f64,
    ),
    (
        "nacre_osd_repaired_total",
        "Damaged copies on the OSD rewritten from another copy.",
        C,
        |m| m.report.repaired as f64,
    ),
    (
        "nacre_osd_damaged_unrepaired",
        "Objects found damaged on the OSD that nothing has rewritten yet.",
        G,
        |m| m.report.damaged_unrepaired as f64,
    ),
    (
        "nacre_osd_scrub_objects_total",
        "Objects the OSD's scrubs compared.",
        C,
        |m| m.report.scrub_objects as f64,
    ),
    (
        "nacre_osd_scrub_inconsistent_total",
        "Objects whose copies the OSD's scrubs found different.",
        C,
        |m| m.report.scrub_inconsistent as f64,
    ),
    (
        "nacre_osd_scrub_repaired_total",
        "Of those, the ones rewritten from the authoritative copy.",
        C,
        |m| m.report.scrub_repaired as f64,
    ),
    (
        "nacre_osd_scrub_unrepaired_total",
        "Of those, the ones left alone (no copy could be trusted).",
        C,
        |m| m.report.scrub_unrepaired as f64,
    ),
    (
        "nacre_store_journal_batches_total",
        "Journal batches the OSD's store wrote.",
        C,
        |m| m.store.counters.batches as f64,
    ),
    (
        "nacre_store_journal_records_total",
        "Records in those batches.",
        C,
        |m| m.store.counters.records as f64,
    ),
    (
        "nacre_store_small_writes_total",
        "Writes the store took through its journal.",
        C,
        |m| m.store.counters.small_writes as f64,
    ),
    (
        "nacre_store_big_writes_total",
        "Writes the store took as whole blocks in place.",
        C,
        |m| m.store.counters.big_writes as f64,
    ),
    (
        "nacre_store_syncs_total",
        "Device syncs (flushes) the store issued.",
        C,
        |m| m.store.counters.syncs as f64,
    ),
    (
        "nacre_store_checkpoints_total",
        "Checkpoints the store wrote.",
        C,
        |m| m.store.counters.checkpoints as f64,
    ),
    (
        "nacre_store_paced_waits_total",
        "Times the store held client writes back to pace them while its journal neared the limit for client writes (its checkpoints fold slower than clients write).",
        C,
        |m| m.store.counters.paced_waits as f64,
    ),
    (
        "nacre_store_journal_full_waits_total",
        "Times client writes found the store's journal at their limit and waited for a checkpoint.",
        C,
        |m| m.store.counters.journal_full_waits as f64,
    ),
    (
        "nacre_store_folds_ahead_total",
        "Objects the store folded ahead, between checkpoints (the rest of its folds run in checkpoints).",
        C,
        |m| m.store.counters.folds_ahead as f64,
    ),
    (
        "nacre_store_read_retries_total",
        "Reads the store retried after a checksum mismatch.",
        C,
        |m| m.store.counters.read_retries as f64,
    ),
    (
        "nacre_store_journal_used_bytes",
        "Journal bytes written since the store's last checkpoint.",
        G,
        |m| m.store.journal_used_bytes as f64,
    ),
    (
        "nacre_store_memory_bytes",
        "RAM of the store's index, checksum and overlay caches and undo records.",
        G,
        |m| m.store.memory_bytes as f64,
    ),
];

impl Scrape {
    fn answered(&self) -> Vec<(u32, &OsdMetrics)> {
        self.osds.iter().map(|(id, m)| (*id, m)).collect()
    }

    fn encode_osds(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let answered = self.answered();
        // Per op type.
        let ops: Vec<(u32, &nacre_osd::OpMetrics)> = (answered.iter())
            .flat_map(|(id, m)| m.ops.iter().map(move |o| (*id, o)))
            .collect();
        let op_labels = |id: u32, o: &nacre_osd::OpMetrics| -> Labels {
            vec![("osd", id.to_string()), ("op", snake(&o.op))]
        };
        type OpCounter = (&'static str, &'static str, fn(&nacre_osd::OpMetrics) -> u64);
        const OP_COUNTERS: [OpCounter; 3] = [
            (
                "nacre_osd_ops_total",
                "Ops the OSD answered, by type (any outcome).",
                |o| o.count,
            ),
            (
                "nacre_osd_op_received_bytes_total",
                "Payload bytes the OSD's requests brought, by op type.",
                |o| o.received_bytes,
            ),
            (
                "nacre_osd_op_sent_bytes_total",
                "Payload bytes the OSD's answers carried, by op type.",
                |o| o.sent_bytes,
            ),
        ];
        for (name, help, value) in OP_COUNTERS {
            family(e, (name, help, C), &ops, |f, (id, o)| {
                f.counter(&op_labels(*id, o), value(o))
            })?;
        }
        let errors: Vec<(u32, &nacre_osd::OpMetrics, &String, u64)> = (ops.iter())
            .flat_map(|(id, o)| o.errors.iter().map(move |(s, n)| (*id, *o, s, *n)))
            .collect();
        family(
            e,
            (
                "nacre_osd_op_errors_total",
                "Ops the OSD answered with an error status (not Ok nor NotFound), by type and status.",
                C,
            ),
            &errors,
            |f, (id, o, s, n)| {
                let mut l = op_labels(*id, o);
                l.push(("status", snake(s)));
                f.counter(&l, *n)
            },
        )?;
        family(
            e,
            (
                "nacre_osd_op_latency_seconds",
                "Time from an op's arrival at the OSD to its answer, by type.",
                H,
            ),
            &ops,
            |f, (id, o)| f.histogram(&op_labels(*id, o), &o.latency),
        )?;
        family(
            e,
            (
                "nacre_osd_store_write_latency_seconds",
                "The OSD's writes to its own store (as primary, replica or shard; no network).",
                H,
            ),
            &answered,
            |f, (id, m)| f.histogram(&osd_label(*id), &m.store_write_latency),
        )?;
        let pgs: Vec<(u32, &String, u32)> = (answered.iter())
            .flat_map(|(id, m)| m.report.pg_states.iter().map(move |(s, n)| (*id, s, *n)))
            .collect();
        family(
            e,
            (
                "nacre_osd_pgs",
                "PGs the OSD leads (is primary of), by state.",
                G,
            ),
            &pgs,
            |f, (id, state, n)| {
                let l = vec![("osd", id.to_string()), ("state", state.to_string())];
                f.gauge(&l, f64::from(*n))
            },
        )?;
        family(
            e,
            (
                "nacre_osd_scrubs_total",
                "Scrubs of its PGs the OSD finished as primary, by kind.",
                C,
            ),
            &answered,
            |f, (id, m)| {
                for (kind, n) in [("light", m.report.scrubs), ("deep", m.report.deep_scrubs)] {
                    let l = vec![("osd", id.to_string()), ("kind", kind.to_string())];
                    f.counter(&l, n)?;
                }
                Ok(())
            },
        )?;
        for &(name, help, t, value) in OSD_FIGURES {
            family(e, (name, help, t), &answered, |f, (id, m)| match t {
                MetricType::Counter => f.counter(&osd_label(*id), value(m) as u64),
                _ => f.gauge(&osd_label(*id), value(m)),
            })?;
        }
        Ok(())
    }

    fn encode_cluster(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        if let Some(leading) = self.leading {
            family(
                e,
                (
                    "nacre_mon_leader",
                    "Whether this monitor is the cluster's leader (1) or stands by (0).",
                    G,
                ),
                &[leading],
                |f, l| f.gauge(&Vec::new(), f64::from(u8::from(*l))),
            )?;
        }
        let Some(m) = &self.map else {
            return Ok(());
        };
        family(
            e,
            ("nacre_cluster_epoch", "The cluster map's epoch.", G),
            &[m.epoch()],
            |f, ep| f.gauge(&Vec::new(), *ep as f64),
        )?;
        let osds: Vec<u32> = m.osds.iter().map(|o| o.id).collect();
        for (name, help, of) in [
            (
                "nacre_osd_up",
                "Whether the OSD is up in the cluster map (1) or down (0).",
                (|m: &ClusterMap, id: u32| m.is_up(id)) as fn(&ClusterMap, u32) -> bool,
            ),
            (
                "nacre_osd_in",
                "Whether the OSD is in (1: placement gives it PGs) or marked out (0).",
                |m: &ClusterMap, id: u32| !m.state.out.contains(&id),
            ),
            (
                "nacre_osd_demoted",
                "Whether the leader demoted the OSD as slow (1: it leads no PG while another copy is up).",
                |m: &ClusterMap, id: u32| m.state.demoted.contains(&id),
            ),
        ] {
            family(
                e,
                (name, help, G),
                &osds,
                |f, id| f.gauge(&osd_label(*id), f64::from(u8::from(of(m, *id)))),
            )?;
        }
        let pool_label = |p: &map::PoolRecord| -> Labels { vec![("pool", p.name.clone())] };
        for (name, help, of) in [
            (
                "nacre_pool_pgs",
                "The pool's placement groups.",
                (|p: &map::PoolRecord| f64::from(p.pg_count)) as fn(&map::PoolRecord) -> f64,
            ),
            (
                "nacre_pool_size",
                "The pool's copies (or k + m shards) of each object.",
                |p: &map::PoolRecord| f64::from(p.size),
            ),
            (
                "nacre_pool_min_size",
                "Copies (or shards) of a PG that must be up for it to serve I/O.",
                |p: &map::PoolRecord| f64::from(p.min_size),
            ),
        ] {
            family(e, (name, help, G), &m.pools, |f, p| {
                f.gauge(&pool_label(p), of(p))
            })?;
        }
        Ok(())
    }

    fn encode_gateway(&self, e: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let Some(g) = &self.gateway else {
            return Ok(());
        };
        let cmd = |c: &CommandSnapshot| -> Labels { vec![("command", c.name.to_string())] };
        type CommandCounter = (&'static str, &'static str, fn(&CommandSnapshot) -> u64);
        const COMMAND_COUNTERS: [CommandCounter; 3] = [
            (
                "nacre_nbd_requests_total",
                "NBD requests the gateway answered, by command.",
                |c| c.count,
            ),
            (
                "nacre_nbd_request_errors_total",
                "NBD requests answered with an error, by command.",
                |c| c.errors,
            ),
            (
                "nacre_nbd_bytes_total",
                "Data bytes the gateway's reads returned and its writes took, by command.",
                |c| c.bytes,
            ),
        ];
        for (name, help, value) in COMMAND_COUNTERS {
            family(e, (name, help, C), &g.commands, |f, c| {
                f.counter(&cmd(c), value(c))
            })?;
        }
        family(
            e,
            (
                "nacre_nbd_request_latency_seconds",
                "Time from an NBD request read whole to its reply sent, by command.",
                H,
            ),
            &g.commands,
            |f, c| f.histogram(&cmd(c), &c.latency),
        )?;
        for (name, help, t, v) in [
            (
                "nacre_nbd_requests_in_flight",
                "NBD requests read and not yet answered (the gateway's queue depth).",
                G,
                g.in_flight,
            ),
            (
                "nacre_nbd_connections",
                "NBD connections open.",
                G,
                g.connections,
            ),
            (
                "nacre_nbd_connections_total",
                "NBD connections accepted.",
                C,
                g.connections_total,
            ),
        ] {
            family(e, (name, help, t), &[v], |f, v| match t {
                MetricType::Counter => f.counter(&Vec::new(), *v),
                _ => f.gauge(&Vec::new(), *v as f64),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_become_snake_case_label_values() {
        assert_eq!(snake("Read"), "read");
        assert_eq!(snake("RepWrite"), "rep_write");
        assert_eq!(snake("ShardCommit"), "shard_commit");
    }
}
