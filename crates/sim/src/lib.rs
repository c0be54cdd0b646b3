//! The cluster simulator: real OSDs (`nacre_osd::Osd`, the same code as in
//! `nacre up`) on fault-injecting devices, talking over an in-process
//! network that a seed makes drop, delay, duplicate and lose the replies of
//! messages, on virtual time (`rt::block_on_virtual`), with OSDs that crash
//! (power cut of their device) and restart. In the spirit of FoundationDB's
//! simulation and TigerBeetle's VOPR: a seed is a whole history, and the
//! same seed replays the same history.
//!
//! The cluster map's leader (`nacre_osd::leader`, the same code as in
//! `nacre up`) runs as one more node of the network: OSDs boot to it, it
//! heartbeats them and marks silent ones down, and primaries peer and
//! recover their PGs at every new epoch.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use nacre_blockstore::{FormatOptions, Store, StoreOptions};
use nacre_io::fault::SplitMix;
use nacre_io::net::Addr;
use nacre_io::{rt, AlignedBuf, FaultDev, SharedBuf};
use nacre_meta::map::{ClusterState, PgTable, Placed, PoolRecord, PoolState};
use nacre_net::{Frame, Handler, NetError, Rpc, Transport};
use nacre_osd::leader::Leader;
use nacre_osd::{Osd, OsdMap, PgState};
use nacre_types::{ObjectId, PgId};
use nacre_wire::Header;

/// How often (per thousand messages) each fault strikes, and how long a
/// message may be delayed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// The request never arrives.
    pub drop_per_mille: u32,
    /// The request is handled, the reply never arrives.
    pub reply_drop_per_mille: u32,
    /// The request arrives twice.
    pub dup_per_mille: u32,
    /// Each way, a delay up to this.
    pub delay_ms_max: u64,
}

type Handling = Pin<Box<dyn Future<Output = (Header, Option<AlignedBuf>)>>>;
/// A node's request handler, reached weakly: the network must not keep a
/// node alive (a node holds the network as its transport, so a strong
/// reference would be a cycle that leaks every simulated disk). `None`
/// once the node is gone.
type Serve = Rc<dyn Fn(Frame) -> Option<Handling>>;
type Filter = Box<dyn Fn(&str, &str, &Header) -> bool>;
type ReplyEdit = Box<dyn Fn(&str, &str, &mut Header, &mut Option<AlignedBuf>)>;

struct NetState {
    /// What serves each address, with its incarnation (raised at every
    /// attach and detach: a call in flight to an older one fails, as a
    /// connection to a process that died does).
    nodes: RefCell<HashMap<String, (Serve, u64)>>,
    incarnations: Cell<u64>,
    /// Fired at every detach.
    changed: nacre_io::sync::Notify,
    rng: RefCell<SplitMix>,
    faults: Cell<Faults>,
    /// Requests it matches (source address, empty for a client;
    /// destination address; header) are lost.
    filter: RefCell<Option<Filter>>,
    /// Edits every reply (caller's address, empty for a client; the
    /// answering node's; the reply): a node that answers wrongly.
    reply_edit: RefCell<Option<ReplyEdit>>,
    /// Nodes cut off from every other node (not from clients): a call
    /// from or to one of them is lost.
    isolated: RefCell<std::collections::HashSet<String>>,
    /// Pairs of nodes (in address order) whose messages take this long
    /// each way: a slow link.
    slow_links: RefCell<HashMap<(String, String), Duration>>,
    /// How long a caller waits for a reply that does not come.
    deadline: Duration,
    /// Print every message (`NACRE_SIM_TRACE`).
    trace: bool,
    /// The OSDs' recovery rate in this run: slow in half the seeds, so
    /// that client ops meet objects still being recovered (drawn apart
    /// from the fault generator, whose sequence replays older seeds).
    recovery_rate: u64,
    /// Objects per PG query answer (`Cluster::set_query_page`).
    query_page: Cell<usize>,
    /// In half the runs the OSDs scrub their PGs every second or two
    /// (light and deep), through the faults: a scrub must never find the
    /// copies of a clean PG apart, nor repair one into losing a write.
    scrub: Option<nacre_osd::ScrubConfig>,
}

/// The in-process network: a [`Transport`] whose links are function calls
/// into the addressed node, with faults drawn from one seeded generator.
/// A node's own handle ([`Net::for_node`]) also names the sender: once
/// that node is gone (crashed, or started again), its calls fail at once,
/// as a dead process sends nothing.
#[derive(Clone)]
pub struct Net(Rc<NetState>, Option<(String, u64)>);

impl Net {
    pub fn new(seed: u64, deadline: Duration) -> Net {
        Net(
            Rc::new(NetState {
                nodes: RefCell::new(HashMap::new()),
                incarnations: Cell::new(0),
                changed: nacre_io::sync::Notify::new(),
                rng: RefCell::new(SplitMix(seed)),
                faults: Cell::new(Faults::default()),
                filter: RefCell::new(None),
                reply_edit: RefCell::new(None),
                isolated: RefCell::new(Default::default()),
                slow_links: RefCell::new(HashMap::new()),
                deadline,
                trace: std::env::var_os("NACRE_SIM_TRACE").is_some(),
                recovery_rate: match SplitMix(seed ^ 0x7265_636f_7665_7279).below(4) {
                    0 => u64::from(OBJECT_BYTES) * 8,
                    1 => u64::from(OBJECT_BYTES) * 32,
                    _ => nacre_osd::RECOVERY_BYTES_PER_S_DEFAULT,
                },
                query_page: Cell::new(nacre_osd::PG_QUERY_PAGE_OBJECTS),
                scrub: (SplitMix(seed ^ 0x0073_6372_7562).below(2) == 0).then_some(
                    nacre_osd::ScrubConfig {
                        interval: Duration::from_secs(1),
                        deep_interval: Duration::from_secs(2),
                        bytes_per_s: 64 << 20,
                    },
                ),
            }),
            None,
        )
    }

    /// The transport of a new incarnation of the node at `addr`, to be
    /// attached with [`Net::attach_node`].
    pub fn for_node(&self, addr: &Addr) -> Net {
        let n = self.0.incarnations.get() + 1;
        self.0.incarnations.set(n);
        Net(self.0.clone(), Some((addr.to_string(), n)))
    }

    /// Serves requests to the node this handle was made for with `h`.
    pub fn attach_node<H: Handler>(&self, h: Rc<H>) {
        let (addr, n) = self.1.clone().expect("a node's handle (Net::for_node)");
        let node = Rc::downgrade(&h);
        let serve: Serve = Rc::new(move |f| {
            let h = node.upgrade()?;
            Some(Box::pin(h.handle(f)) as Handling)
        });
        self.0.nodes.borrow_mut().insert(addr, (serve, n));
    }

    /// Nothing answers at `addr` any more (a crashed node is silent), and
    /// calls in flight to it fail.
    pub fn detach(&self, addr: &Addr) {
        self.0.nodes.borrow_mut().remove(&addr.to_string());
        self.0.changed.notify();
    }

    fn incarnation(&self, addr: &str) -> Option<u64> {
        self.0.nodes.borrow().get(addr).map(|(_, n)| *n)
    }

    pub fn set_faults(&self, f: Faults) {
        self.0.faults.set(f);
    }

    /// Loses every request `f` matches (by source address — empty for a
    /// client —, destination address and header), until
    /// [`Net::clear_filter`]: a scenario's targeted fault.
    pub fn set_filter(&self, f: impl Fn(&str, &str, &Header) -> bool + 'static) {
        *self.0.filter.borrow_mut() = Some(Box::new(f));
    }

    pub fn clear_filter(&self) {
        *self.0.filter.borrow_mut() = None;
    }

    /// Passes every reply through `f` (the caller's address — empty for a
    /// client —, the answering node's, the reply's header and payload),
    /// until [`Net::clear_reply_edit`]: a node that answers wrongly.
    pub fn set_reply_edit(
        &self,
        f: impl Fn(&str, &str, &mut Header, &mut Option<AlignedBuf>) + 'static,
    ) {
        *self.0.reply_edit.borrow_mut() = Some(Box::new(f));
    }

    pub fn clear_reply_edit(&self) {
        *self.0.reply_edit.borrow_mut() = None;
    }

    /// Every message between the nodes at `a` and `b` (either way) takes
    /// `delay` more, or (`None`) no more: a slow link.
    pub fn slow_link(&self, a: &Addr, b: &Addr, delay: Option<Duration>) {
        let key = link_key(&a.to_string(), &b.to_string());
        let mut links = self.0.slow_links.borrow_mut();
        match delay {
            Some(d) => links.insert(key, d),
            None => links.remove(&key),
        };
    }

    /// The extra delay of the link between `a` and `b`, if it is slow.
    async fn link_delay(&self, a: &str, b: &str) {
        let d = self.0.slow_links.borrow().get(&link_key(a, b)).copied();
        if let Some(d) = d {
            rt::sleep(d).await;
        }
    }

    /// Cuts the node at `addr` off from the other nodes (the leader and
    /// the OSDs; clients still reach it), or (`false`) joins it again: a
    /// partition. The node runs on, and what it sends is lost.
    pub fn isolate(&self, addr: &Addr, cut: bool) {
        let mut i = self.0.isolated.borrow_mut();
        if cut {
            i.insert(addr.to_string());
        } else {
            i.remove(&addr.to_string());
        }
    }

    /// A draw from the simulation's generator.
    pub fn below(&self, n: u64) -> u64 {
        self.0.rng.borrow_mut().below(n)
    }

    /// Gives a device its own speed (0–2 ms per op, drawn from the seed),
    /// so that copies of one write finish at different times.
    fn disk_timing(&self, dev: &FaultDev) {
        dev.set_yields(1);
        dev.set_latency(Some(Duration::from_micros(self.below(2000))));
    }

    fn strikes(&self, per_mille: u32) -> bool {
        per_mille > 0 && self.below(1000) < u64::from(per_mille)
    }

    async fn delay(&self) {
        let max = self.0.faults.get().delay_ms_max;
        if max > 0 {
            rt::sleep(Duration::from_micros(self.below(max * 1000))).await;
        }
    }
}

impl Transport for Net {
    type Conn = SimConn;
    fn connect(&self, addr: &Addr) -> Result<Rc<SimConn>, NetError> {
        Ok(Rc::new(SimConn {
            net: self.clone(),
            to: addr.to_string(),
            next_id: Cell::new(1),
        }))
    }
}

fn link_key(a: &str, b: &str) -> (String, String) {
    match a <= b {
        true => (a.to_string(), b.to_string()),
        false => (b.to_string(), a.to_string()),
    }
}

/// A link to one node of the simulated network.
pub struct SimConn {
    net: Net,
    to: String,
    /// The request ids it gives requests sent with none, as a real
    /// connection does (`nacre_net::OWN_ID_BIT`).
    next_id: Cell<u64>,
}

impl SimConn {
    /// The handler's reply, unless the node goes away first (`Closed`) or
    /// the deadline passes (`Timeout`).
    async fn reply_or_gone<F: Future<Output = (Header, Option<AlignedBuf>)>>(
        &self,
        reply: F,
        inc: u64,
    ) -> Result<(Header, Option<AlignedBuf>), NetError> {
        let mut reply = std::pin::pin!(reply);
        let mut timer = Box::pin(rt::sleep(self.net.0.deadline));
        let mut gone = Box::pin(self.net.0.changed.wait());
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(r) = reply.as_mut().poll(cx) {
                return std::task::Poll::Ready(Ok(r));
            }
            if self.net.incarnation(&self.to) != Some(inc) {
                return std::task::Poll::Ready(Err(NetError::Closed));
            }
            if gone.as_mut().poll(cx).is_ready() {
                gone = Box::pin(self.net.0.changed.wait());
                cx.waker().wake_by_ref();
            }
            if timer.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(Err(NetError::Timeout(
                    self.net.0.deadline.as_millis() as u64,
                )));
            }
            std::task::Poll::Pending
        })
        .await
    }

    async fn time_out(&self) -> Result<Frame, NetError> {
        rt::sleep(self.net.0.deadline).await;
        Err(NetError::Timeout(self.net.0.deadline.as_millis() as u64))
    }
}

impl Rpc for SimConn {
    async fn call(&self, mut h: Header, payload: Option<AlignedBuf>) -> Result<Frame, NetError> {
        if h.request_id == 0 {
            h.request_id = self.next_id.get() | nacre_net::OWN_ID_BIT;
            self.next_id.set(self.next_id.get() + 1);
        }
        let r = self.call_inner(h, payload).await;
        if self.net.0.trace {
            eprintln!(
                "{:>10.3} net: {:?} {} v{} to {} -> {:?}",
                rt::monotonic().as_secs_f64(),
                h.op,
                h.oid,
                h.obj_version,
                self.to,
                r.as_ref().map(|f| f.h.status)
            );
        }
        r
    }

    /// The receiver owns what it is given in the simulation: a copy, taken
    /// when the request leaves (as a socket's send takes its bytes).
    async fn call_shared(&self, h: Header, payload: Option<SharedBuf>) -> Result<Frame, NetError> {
        self.call(h, payload.map(|p| AlignedBuf::from_slice(&p)))
            .await
    }

    fn is_closed(&self) -> bool {
        false
    }
}

impl SimConn {
    async fn call_inner(&self, h: Header, payload: Option<AlignedBuf>) -> Result<Frame, NetError> {
        if let Some((me, n)) = &self.net.1 {
            if self.net.incarnation(me) != Some(*n) {
                return Err(NetError::Closed);
            }
        }
        let f = self.net.0.faults.get();
        let from = self.net.1.as_ref().map_or("", |(me, _)| me.as_str());
        let filtered =
            (self.net.0.filter.borrow().as_ref()).is_some_and(|lose| lose(from, &self.to, &h));
        let cut = self.net.1.as_ref().is_some_and(|(me, _)| {
            let i = self.net.0.isolated.borrow();
            i.contains(me) || i.contains(&self.to)
        });
        if filtered || cut || self.net.strikes(f.drop_per_mille) {
            return self.time_out().await;
        }
        self.net.delay().await;
        self.net.link_delay(from, &self.to).await;
        let serve = self.net.0.nodes.borrow().get(&self.to).cloned();
        let Some((serve, inc)) = serve else {
            return self.time_out().await;
        };
        if self.net.strikes(f.dup_per_mille) {
            let copy = Frame {
                h,
                payload: payload.as_ref().map(|p| AlignedBuf::from_slice(p)),
            };
            if let Some(dup) = serve(copy) {
                rt::spawn(dup);
            }
        }
        // The node handles the request as its own task, as a server does:
        // a caller that stops waiting does not cancel the work (handlers
        // hold per-object locks across awaits).
        let Some(handling) = serve(Frame { h, payload }) else {
            return self.time_out().await;
        };
        let handling = rt::spawn(handling);
        let (mut rh, mut rp) = match self.reply_or_gone(handling, inc).await {
            Ok(r) => r,
            Err(e) => return Err(e),
        };
        if let Some(edit) = self.net.0.reply_edit.borrow().as_ref() {
            edit(from, &self.to, &mut rh, &mut rp);
        }
        if self.net.strikes(f.reply_drop_per_mille) {
            return self.time_out().await;
        }
        self.net.delay().await;
        self.net.link_delay(from, &self.to).await;
        Ok(Frame { h: rh, payload: rp })
    }
}

pub type SimOsd = Osd<FaultDev, Net>;

/// One simulated OSD: its device (which survives crashes, as a disk does)
/// and the running instance, if it is up.
pub struct Node {
    pub id: u32,
    pub addr: Addr,
    pub dev: FaultDev,
    pub osd: Option<Rc<SimOsd>>,
}

/// Store parameters of every simulated OSD: small, so that crashes copy
/// little and journals wrap.
pub const OBJECT_BYTES: u32 = 16 << 10;

/// Block `block` of volume `serial` of pool `pool`.
pub fn object(pool: u32, serial: u64, block: u64) -> ObjectId {
    ObjectId {
        volume: nacre_types::VolumeId::new(pool, serial),
        block,
    }
}

/// Block `block` of volume `serial` of the simulator's pool 1.
pub fn obj(serial: u64, block: u64) -> ObjectId {
    object(1, serial, block)
}
const DEV_BYTES: u64 = 16 << 20;
const JOURNAL_BYTES: u64 = 2_359_296;

/// A cluster of `osds` OSDs with one pool of `pgs` PGs of `size` copies,
/// and its leader. Shared by the tasks of a simulation (`Rc`); no borrow
/// is held across an await.
pub struct Cluster {
    pub net: Net,
    pub leader: Rc<Leader<Net>>,
    pub nodes: RefCell<Vec<Node>>,
    /// `log_delta_misses` of OSD instances that crashed.
    misses: Cell<u64>,
    /// `scrub_inconsistent`, and scrubs finished, of OSD instances that
    /// crashed.
    scrub_found: Cell<u64>,
    scrubs: Cell<u64>,
}

/// The leader's address on the simulated network.
pub fn leader_addr() -> Addr {
    Addr::Tcp("leader:6789".into())
}

/// A new simulated disk with a freshly formatted store on it.
async fn blank_disk(net: &Net) -> FaultDev {
    let dev = FaultDev::new(DEV_BYTES, 512);
    let fo = FormatOptions {
        block_bytes: OBJECT_BYTES,
        journal_bytes: Some(JOURNAL_BYTES),
        zero_journal: false,
        pg_logs: nacre_blockstore::LogRegion {
            slots: 32,
            slot_pages: 2,
        },
        ..FormatOptions::default()
    };
    Store::format(&dev, &fo)
        .await
        .expect("format a simulated OSD");
    net.disk_timing(&dev);
    dev
}

/// Every PG on `size` consecutive OSDs of `osds`, primaries rotating.
/// PG `pg` on `size` consecutive OSDs from the `pg`-th; a positional
/// (erasure-coded) table's lead slots round the row.
fn consecutive(osds: &[u32], pgs: u32, size: u8, positional: bool) -> Placed {
    let n = osds.len();
    Placed {
        osds: (0..pgs as usize)
            .flat_map(|pg| (0..usize::from(size)).map(move |k| osds[(pg + k) % n]))
            .collect(),
        lead: match positional {
            true => (0..pgs).map(|pg| (pg % u32::from(size)) as u8).collect(),
            false => Vec::new(),
        },
    }
}

/// `old`'s rows with each OSD that is not in `inn` replaced, in its slot,
/// by one that is and is not in the row; the leads kept.
fn keep_slots(old: &PgTable, inn: &[u32]) -> Placed {
    let mut osds = Vec::with_capacity(old.osds.len());
    for pg in 0..old.pg_count() {
        let mut row = old.placement(pg).to_vec();
        for s in 0..row.len() {
            if !inn.contains(&row[s]) {
                row[s] = (0..inn.len())
                    .map(|j| inn[(pg as usize + s + j) % inn.len()])
                    .find(|o| !row.contains(o))
                    .expect("as many OSDs in as shards");
            }
        }
        osds.extend(row);
    }
    Placed {
        osds,
        lead: old.lead.clone(),
    }
}

impl Cluster {
    /// Sets how many objects an OSD lists per answer to a PG query, on
    /// every OSD now and later: small pages make peering read listings in
    /// pages.
    pub fn set_query_page(&self, n: usize) {
        self.net.0.query_page.set(n);
        for n_ in self.nodes.borrow().iter() {
            if let Some(o) = &n_.osd {
                o.set_query_page_objects(n);
            }
        }
    }

    /// Marks OSD `id` out (its PGs move to the others) or in again,
    /// through the leader; why not, if it cannot.
    pub fn mark_out(&self, id: u32, out: bool) -> Result<(), String> {
        self.leader.mark_out(id, out)
    }

    /// Formats every OSD's device and starts them with a leader, one pool
    /// (id 1) of `size` copies, `min_size` and `pgs` PGs. Inside
    /// `block_on_virtual`.
    pub async fn new(net: Net, osds: u32, size: u8, min_size: u8, pgs: u32) -> Rc<Cluster> {
        Cluster::with_pools(net, osds, &[(size, min_size, pgs)]).await
    }

    /// [`Cluster::new`] with pools 1, 2, … of `(size, min_size, pgs)`.
    pub async fn with_pools(net: Net, osds: u32, pools: &[(u8, u8, u32)]) -> Rc<Cluster> {
        let specs: Vec<_> = pools
            .iter()
            .map(|&(s, ms, pgs)| (s, ms, pgs, None))
            .collect();
        Cluster::with_specs(net, osds, &specs).await
    }

    /// [`Cluster::new`] with one erasure-coded pool (id 1) of `k + m`
    /// shards, `min_size` and `pgs` PGs: objects of `k` store blocks, each
    /// PG's shards on consecutive OSDs, led from slot `pg mod (k + m)`.
    pub async fn with_ec_pool(
        net: Net,
        osds: u32,
        k: u8,
        m: u8,
        min_size: u8,
        pgs: u32,
    ) -> Rc<Cluster> {
        let ec = nacre_meta::map::EcScheme { k, m };
        Cluster::with_specs(net, osds, &[(k + m, min_size, pgs, Some(ec))]).await
    }

    async fn with_specs(
        net: Net,
        osds: u32,
        pools: &[(u8, u8, u32, Option<nacre_meta::map::EcScheme>)],
    ) -> Rc<Cluster> {
        let addrs: HashMap<u32, Addr> = (0..osds)
            .map(|id| (id, Addr::Tcp(format!("osd{id}:6800"))))
            .collect();
        let all: Vec<u32> = (0..osds).collect();
        let pools = (1..).zip(pools).map(|(id, &(size, min_size, pgs, ec))| {
            let record = PoolRecord {
                id,
                name: if id == 1 {
                    "rbd".into()
                } else {
                    format!("p{id}")
                },
                size,
                min_size,
                pg_count: pgs,
                failure_domain: "osd".into(),
                object_bytes: OBJECT_BYTES * ec.map_or(1, |e| u32::from(e.k)),
                ec,
            };
            let table = PgTable::new(id, size, consecutive(&all, pgs, size, ec.is_some()));
            let state = PoolState {
                record,
                table,
                last_active: Default::default(),
            };
            (id, state)
        });
        let map = OsdMap {
            cluster: ClusterState {
                epoch: 1,
                ..ClusterState::default()
            },
            pools: pools.collect(),
            addrs: (addrs.iter()).map(|(k, a)| (*k, a.to_string())).collect(),
            up_from: Default::default(),
            stores: Default::default(),
            full: Default::default(),
        };
        // The leader is a node too: a partition can cut it off.
        let lnet = net.for_node(&leader_addr());
        let leader = Leader::new(map, lnet.clone(), Box::new(|_| Ok(()))).expect("a leader");
        // Marking an OSD out or in lays every PG of a replicated pool out
        // again over the OSDs that are in: most PGs move, which is what
        // the simulator wants. An erasure-coded pool's rows keep their
        // slots, as real placement's do: only the shards of OSDs marked
        // out move.
        leader.set_placer(Box::new(move |pool, old, inn| {
            if inn.len() < usize::from(pool.size) {
                return Err(format!("{} OSDs in for {} copies", inn.len(), pool.size));
            }
            Ok(match (pool.ec, old) {
                (Some(_), Some(old)) => keep_slots(old, inn),
                _ => consecutive(inn, pool.pg_count, pool.size, pool.ec.is_some()),
            })
        }));
        lnet.attach_node(leader.clone());
        rt::spawn(leader.clone().run());
        let mut nodes = Vec::new();
        for id in 0..osds {
            nodes.push(Node {
                id,
                addr: addrs[&id].clone(),
                dev: blank_disk(&net).await,
                osd: None,
            });
        }
        let c = Rc::new(Cluster {
            net,
            leader,
            nodes: RefCell::new(nodes),
            misses: Cell::new(0),
            scrub_found: Cell::new(0),
            scrubs: Cell::new(0),
        });
        for id in 0..osds {
            c.start(id).await;
        }
        c
    }

    /// Opens OSD `id`'s store (replaying its journal), attaches it and
    /// boots it with the leader.
    pub async fn start(&self, id: u32) {
        let (dev, addr) = {
            let n = &self.nodes.borrow()[id as usize];
            assert!(n.osd.is_none(), "osd.{id} is already up");
            (n.dev.clone(), n.addr.clone())
        };
        let (store, report) = Store::open(dev, StoreOptions::default())
            .await
            .unwrap_or_else(|e| panic!("osd.{id} does not reopen: {e}"));
        let net = self.net.for_node(&addr);
        let osd = Osd::with_store(
            id,
            store,
            &report,
            nacre_osd::LeaderAddr::new(leader_addr()),
            net.clone(),
        );
        osd.set_recovery_rate(self.net.0.recovery_rate);
        osd.set_query_page_objects(self.net.0.query_page.get());
        if let Some(s) = self.net.0.scrub {
            osd.set_scrub(s);
        }
        net.attach_node(osd.clone());
        self.nodes.borrow_mut()[id as usize].osd = Some(osd.clone());
        if let Err(e) = osd.boot().await {
            panic!("{e}");
        }
    }

    /// Stops the leader's heartbeats (the end of a run).
    pub fn stop(&self) {
        self.leader.stop();
    }

    /// Waits until every running OSD is up in the leader's map and every
    /// PG is active on its primary with no copy left to recover, within
    /// `limit`; what is not,
    /// otherwise.
    pub async fn settle(&self, limit: Duration) -> Result<(), String> {
        let until = rt::monotonic() + limit;
        loop {
            let m = self.leader.map();
            let mut waiting: Vec<String> = (self.nodes.borrow().iter())
                .filter(|n| n.osd.is_some() && !m.is_up(n.id))
                .map(|n| format!("osd.{} runs and is down", n.id))
                .collect();
            for pg in m.pgs() {
                let state = (m.primary(pg))
                    .and_then(|p| self.osd(p).filter(|o| o.epoch() == m.epoch()))
                    .and_then(|o| o.pg_state(pg));
                let temp = m.table(pg.pool).and_then(|t| t.temp.get(&pg.pg));
                if state != Some(PgState::Active) {
                    waiting.push(format!("PG {pg}: {state:?}"));
                } else if let Some(t) = temp {
                    waiting.push(format!("PG {pg}: temporary members {t:?}"));
                } else if (m.primary(pg).and_then(|p| self.osd(p)))
                    .is_some_and(|o| o.pg_recovering(pg))
                {
                    waiting.push(format!("PG {pg}: recovering"));
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if rt::monotonic() > until {
                return Err(format!("epoch {}: {}", m.epoch(), waiting.join("; ")));
            }
            rt::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The OSD serving PG `pg` now: the map's primary, active in the map's
    /// epoch (None while the PG peers, or no primary is up).
    pub fn serving_primary(&self, pg: PgId) -> Option<u32> {
        let m = self.leader.map();
        let p = m.primary(pg)?;
        let o = self.osd(p)?;
        (o.epoch() == m.epoch() && o.pg_state(pg) == Some(PgState::Active)).then_some(p)
    }

    /// Cuts OSD `id` off from the leader and the other OSDs (`cut`), or
    /// joins it again; it runs on, and clients still reach it.
    pub fn isolate(&self, id: u32, cut: bool) {
        let addr = self.nodes.borrow()[id as usize].addr.clone();
        self.net.isolate(&addr, cut);
    }

    /// Cuts OSD `id`'s power: it stops answering, its device keeps what a
    /// power cut leaves (`seed` decides the fate of unsynced writes). Its
    /// old instance's tasks find a dead device.
    pub fn crash(&self, id: u32, seed: u64) {
        let mut nodes = self.nodes.borrow_mut();
        let n = &mut nodes[id as usize];
        self.net.detach(&n.addr);
        if let Some(o) = n.osd.take() {
            let r = o.stat_report();
            (self.misses).set(self.misses.get() + r.log_delta_misses);
            (self.scrub_found).set(self.scrub_found.get() + r.scrub_inconsistent);
            (self.scrubs).set(self.scrubs.get() + r.scrubs + r.deep_scrubs);
            o.halt();
        }
        let (dev, _) = n.dev.power_cut(seed);
        self.net.disk_timing(&dev);
        n.dev = dev;
    }

    /// Swaps the disk of OSD `id` (which must not be running) for a blank,
    /// freshly formatted one: a failed disk replaced, or a store
    /// reformatted. The OSD keeps its id and address and holds nothing.
    pub async fn replace_disk(&self, id: u32) {
        assert!(!self.is_up(id), "osd.{id} is running");
        let dev = blank_disk(&self.net).await;
        self.nodes.borrow_mut()[id as usize].dev = dev;
    }

    /// Objects whose copies differed where their PG logs said nothing, as
    /// every OSD instance of the run found them when it peered (checked
    /// under `strict`): a peering from the logs alone would miss them.
    pub fn log_delta_misses(&self) -> u64 {
        let live: u64 = (self.nodes.borrow().iter())
            .filter_map(|n| n.osd.as_ref())
            .map(|o| o.stat_report().log_delta_misses)
            .sum();
        self.misses.get() + live
    }

    /// Scrubs finished, and objects whose copies a scrub found apart,
    /// over every OSD instance of the run; `None` if this run's OSDs do
    /// not scrub.
    pub fn scrubs(&self) -> Option<(u64, u64)> {
        self.net.0.scrub?;
        let live = (self.nodes.borrow().iter())
            .filter_map(|n| n.osd.as_ref())
            .map(|o| o.stat_report())
            .fold((0, 0), |(s, i), r| {
                (s + r.scrubs + r.deep_scrubs, i + r.scrub_inconsistent)
            });
        Some((self.scrubs.get() + live.0, self.scrub_found.get() + live.1))
    }

    pub fn is_up(&self, id: u32) -> bool {
        self.nodes.borrow()[id as usize].osd.is_some()
    }

    /// The running instance of OSD `id`.
    pub fn osd(&self, id: u32) -> Option<Rc<SimOsd>> {
        self.nodes.borrow()[id as usize].osd.clone()
    }

    /// Object `n` of a workload: block `n` of a volume of pool `n mod the
    /// number of pools`, + 1 (so a one-pool cluster's are all pool 1's).
    pub fn object(&self, n: u64) -> ObjectId {
        let pools = self.leader.map().pools.len() as u64;
        object((n % pools.max(1)) as u32 + 1, 1, n)
    }

    /// The PG of `oid` and its acting set, in the leader's map.
    pub fn route(&self, oid: ObjectId) -> (PgId, Vec<u32>) {
        let m = self.leader.map();
        let pg = m.pg_of(oid).expect("an object of a pool of the map");
        (pg, m.acting(pg))
    }

    /// The OSDs placement gives `oid`'s PG, up or not.
    pub fn placement(&self, oid: ObjectId) -> Vec<u32> {
        let m = self.leader.map();
        let pg = m.pg_of(oid).expect("an object of a pool of the map");
        m.placement(pg).to_vec()
    }

    /// A scrub of PG `pg` by its primary (`deep`: every copy read), which
    /// must run to its end; what it found.
    pub async fn scrubbed(&self, pg: PgId, deep: bool) -> nacre_osd::ScrubReport {
        let primary = self.leader.map().primary(pg).expect("a primary");
        let r = self.osd(primary).expect("up").scrub_pg(pg, deep).await;
        assert_eq!(r.error, None, "{r:?}");
        r
    }

    /// Whether the shards of `oid` (of an erasure-coded pool) on the OSDs
    /// of its row are the layout's split of `want`, the whole object, with
    /// the parity its code (an absent shard reads as zeros); where not,
    /// which shard differs.
    pub async fn check_stripe(&self, oid: ObjectId, want: &[u8]) -> Result<(), String> {
        let m = self.leader.map();
        let pg = m.pg_of(oid).ok_or("no such pool")?;
        let ec = (m.pools.get(&pg.pool).and_then(|p| p.record.ec)).ok_or("not an EC pool")?;
        let (k, m_) = (usize::from(ec.k), usize::from(ec.m));
        let layout = nacre_ec::Layout::new(k, m_, OBJECT_BYTES).map_err(|e| e.to_string())?;
        let codec = nacre_ec::Codec::new(k, m_).map_err(|e| e.to_string())?;
        let shards = layout.split(&codec, want).map_err(|e| e.to_string())?;
        for (s, &osd) in m.placement(pg).iter().enumerate() {
            let o = self.osd(osd).ok_or(format!("osd.{osd} is down"))?;
            let got = match o.store().read(oid.shard(s as u8), 0, OBJECT_BYTES).await {
                Ok(b) => b.to_vec(),
                Err(nacre_blockstore::Error::NotFound(_)) => vec![0; OBJECT_BYTES as usize],
                Err(e) => return Err(format!("{oid} shard {s} on osd.{osd}: {e}")),
            };
            if got != shards[s] {
                return Err(format!("{oid}: shard {s} on osd.{osd} differs"));
            }
        }
        Ok(())
    }

    /// Object copies running OSDs hold outside their objects' placement
    /// (stray copies not yet deleted), as `(osd, object)`.
    pub fn stray_copies(&self) -> Vec<(u32, ObjectId)> {
        let mut out = Vec::new();
        for n in self.nodes.borrow().iter() {
            let Some(o) = &n.osd else { continue };
            for (oid, _) in o.store().list() {
                if !self.placement(oid).contains(&n.id) {
                    out.push((n.id, oid));
                }
            }
        }
        out
    }

    /// PG `pg`'s objects of volume 1 (of its pool) at block `from` or
    /// above, as its primary lists them (`Op::List`, pages of `page`):
    /// (block, version), in order.
    pub async fn list(&self, pg: PgId, from: u64, page: u32) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut from = from;
        loop {
            let mut h = Header::request(nacre_wire::Op::List, 0, object(pg.pool, 1, from));
            h.length = page;
            let f = self.call_pg(pg, h, None).await.unwrap();
            assert_eq!(
                f.h.status,
                nacre_wire::Status::Ok,
                "listing PG {pg} from {from}"
            );
            let got = nacre_wire::decode_list(f.payload.as_deref().unwrap_or(&[]));
            assert!(got.len() <= page as usize);
            out.extend(&got);
            match got.last() {
                Some(&(b, _)) if got.len() == page as usize => from = b + 1,
                _ => return out,
            }
        }
    }

    /// A client's direct read (`Op::DirectRead`) of `len` bytes at
    /// `offset` of `oid` (of an EC pool), sent to OSD `osd` in epoch
    /// `epoch`: the status and the bytes (no answer in time:
    /// `Unavailable`).
    pub async fn direct_read(
        &self,
        osd: u32,
        oid: ObjectId,
        offset: u32,
        len: u32,
        epoch: u64,
    ) -> (nacre_wire::Status, Option<Vec<u8>>) {
        let pg = self.route(oid).0;
        let mut h = Header::request(nacre_wire::Op::DirectRead, 0, oid).with_pg(pg);
        (h.offset, h.length, h.epoch) = (offset, len, epoch);
        match self.call_osd(osd, h, None).await {
            Ok(f) => (f.h.status, f.payload.map(|p| p.to_vec())),
            Err(_) => (nacre_wire::Status::Unavailable, None),
        }
    }

    /// Reads each unit of `oid` (of an EC pool of `k` data shards)
    /// directly from its data shard's OSD (up, and not the PG's primary),
    /// in the leader's epoch: each must answer `want`'s bytes (`NotFound`
    /// for zeros) or refuse (`Unavailable`, `StaleEpoch`, `NotPrimary`: the
    /// client asks the primary). The units answered and the OSDs that refused, or
    /// what was wrong.
    pub async fn direct_units(
        &self,
        oid: ObjectId,
        k: usize,
        want: &[u8],
    ) -> Result<(usize, Vec<u32>), String> {
        use nacre_wire::Status;
        let m = self.leader.map();
        let pg = m.pg_of(oid).expect("an object of a pool of the map");
        let row = m.placement(pg).to_vec();
        let (mut answered, mut refused) = (0, Vec::new());
        for u in 0..want.len() / 4096 {
            let osd = row[u % k];
            if !m.is_up(osd) || m.primary(pg) == Some(osd) {
                continue;
            }
            let unit = &want[u * 4096..(u + 1) * 4096];
            match self
                .direct_read(osd, oid, u as u32 * 4096, 4096, m.epoch())
                .await
            {
                (Status::Ok, Some(got)) if got == unit => answered += 1,
                (Status::NotFound, _) if unit.iter().all(|&b| b == 0) => answered += 1,
                (Status::Unavailable | Status::StaleEpoch | Status::NotPrimary, _) => {
                    refused.push(osd)
                }
                (s, got) => {
                    return Err(format!(
                        "{oid} unit {u} read directly from osd.{osd}: {s:?}{}",
                        if got.is_some() {
                            " with other bytes"
                        } else {
                            ""
                        }
                    ))
                }
            }
        }
        Ok((answered, refused))
    }

    /// Sends a client request for `h.oid` to its primary over the
    /// simulated network (with its faults), epoch and PG filled in.
    pub async fn call(&self, h: Header, payload: Option<AlignedBuf>) -> Result<Frame, NetError> {
        let pg = (self.leader.map().pg_of(h.oid))
            .ok_or_else(|| NetError::Protocol(format!("{}: no such pool", h.oid)))?;
        self.call_pg(pg, h, payload).await
    }

    /// `h` sent as it is to OSD `osd` (up or not), as a client or another
    /// OSD would.
    pub async fn call_osd(
        &self,
        osd: u32,
        h: Header,
        payload: Option<AlignedBuf>,
    ) -> Result<Frame, NetError> {
        let addr = self.nodes.borrow()[osd as usize].addr.clone();
        self.net.connect(&addr)?.call(h, payload).await
    }

    /// [`Cluster::call`] to the primary of PG `pg` (a listing's).
    pub async fn call_pg(
        &self,
        pg: PgId,
        mut h: Header,
        payload: Option<AlignedBuf>,
    ) -> Result<Frame, NetError> {
        let m = self.leader.map();
        h = h.with_pg(pg);
        h.epoch = m.epoch();
        let addr = (m.primary(pg).and_then(|p| m.addr(p)))
            .ok_or_else(|| NetError::Protocol(format!("PG {pg} has no primary up")))?;
        let conn = self.net.connect(&addr)?;
        conn.call(h, payload).await
    }
}
