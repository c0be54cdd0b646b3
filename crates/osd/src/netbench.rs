//! `nacre net bench`: an OSD measures its link to another through its own
//! connection to it — the one replication and recovery use: 4 KiB round
//! trips one at a time ([`Op::Echo`] with 4 KiB each way), then a stream
//! of 1 MiB messages, several in flight, for throughput one way.

use std::rc::Rc;
use std::time::{Duration, Instant};

use nacre_io::{rt, AlignedBuf, BlockDev};
use nacre_net::{Rpc, Transport};
use nacre_types::ObjectId;
use nacre_wire::{Header, Op, Status, ECHO_REPLY_MAX, SENDER_CLIENT};
use serde::{Deserialize, Serialize};

use crate::Osd;

const PING_BYTES: u32 = 4096;
/// Round trips timed, within [`PING_TIME_MAX`].
const PINGS: usize = 400;
const PING_TIME_MAX: Duration = Duration::from_secs(2);
const STREAM_BYTES: usize = 1 << 20;
const STREAM_QD: usize = 8;
const STREAM_TIME: Duration = Duration::from_secs(1);

/// What an OSD measured of its link to another.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LinkReport {
    pub from: u32,
    pub to: u32,
    /// 4 KiB each way, one at a time.
    pub pings: u64,
    pub rtt_avg_us: f64,
    pub rtt_p50_us: u64,
    pub rtt_p99_us: u64,
    pub rtt_max_us: u64,
    /// 1 MiB messages one way, [`STREAM_QD`] in flight.
    pub stream_bytes: u64,
    pub stream_secs: f64,
    pub mb_per_s: f64,
}

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// `Op::Echo`: `length` zero bytes back (at most [`ECHO_REPLY_MAX`]).
    pub(crate) fn answer_echo(&self, h: &Header) -> (Header, Option<AlignedBuf>) {
        if h.length > ECHO_REPLY_MAX {
            return (h.reply(Status::Invalid), None);
        }
        let body = AlignedBuf::zeroed(h.length as usize);
        (h.reply(Status::Ok).with_payload(&body), Some(body))
    }

    /// `Op::NetBench`: measures the link to OSD `obj_version` and answers
    /// the [`LinkReport`] (JSON); refused (`Invalid`, the reason as text)
    /// for itself or an OSD the map does not have, `Unavailable` if the
    /// link fails.
    pub(crate) async fn answer_net_bench(
        self: &Rc<Self>,
        h: &Header,
    ) -> (Header, Option<AlignedBuf>) {
        let text = |s: Status, why: String| {
            let r = h.reply(s).with_payload(why.as_bytes());
            (r, Some(AlignedBuf::from_slice(why.as_bytes())))
        };
        if h.sender != SENDER_CLIENT || h.obj_version > u64::from(u32::MAX) {
            return (h.reply(Status::Invalid), None);
        }
        let to = h.obj_version as u32;
        if to == self.id || self.map.borrow().addr(to).is_none() {
            return text(
                Status::Invalid,
                format!("osd.{} cannot measure a link to osd.{to}", self.id),
            );
        }
        // One at a time: each holds megabytes in flight.
        if self.benches.measuring_link.replace(true) {
            return text(
                Status::Unavailable,
                format!("osd.{} measures a link already", self.id),
            );
        }
        let r = self.measure_link(to).await;
        self.benches.measuring_link.set(false);
        match r {
            Ok(r) => {
                let body = serde_json::to_vec(&r).expect("a report serialises");
                (
                    h.reply(Status::Ok).with_payload(&body),
                    Some(AlignedBuf::from_slice(&body)),
                )
            }
            Err(why) => text(Status::Unavailable, why),
        }
    }

    async fn measure_link(self: &Rc<Self>, to: u32) -> Result<LinkReport, String> {
        let echo = |out: usize, back: u32| {
            let mut h = Header::request(Op::Echo, 0, ObjectId::default());
            h.length = back;
            let body = AlignedBuf::zeroed(out);
            h = h.with_payload(&body);
            (h, body)
        };
        let fail = |e: String| format!("osd.{} → osd.{to}: {e}", self.id);
        // One round trip first: the connection made, not timed.
        let (h, body) = echo(PING_BYTES as usize, PING_BYTES);
        let conn = self.conn(to).map_err(|e| fail(e.to_string()))?;
        (conn.call(h, Some(body)).await).map_err(|e| fail(e.to_string()))?;
        let mut rtt = Vec::with_capacity(PINGS);
        let t0 = Instant::now();
        while rtt.len() < PINGS && t0.elapsed() < PING_TIME_MAX {
            let (h, body) = echo(PING_BYTES as usize, PING_BYTES);
            let t = Instant::now();
            let f = (conn.call(h, Some(body)).await).map_err(|e| fail(e.to_string()))?;
            if f.h.status != Status::Ok {
                return Err(fail(format!("{:?}", f.h.status)));
            }
            rtt.push(t.elapsed().as_micros() as u64);
        }
        let s = crate::bench::BenchTest::of("rtt", rtt, 0, t0.elapsed());
        let mut r = LinkReport {
            from: self.id,
            to,
            pings: s.ops,
            rtt_avg_us: s.lat_avg_us,
            rtt_p50_us: s.lat_p50_us,
            rtt_p99_us: s.lat_p99_us,
            rtt_max_us: s.lat_max_us,
            ..LinkReport::default()
        };
        // The stream: each sender sends until the time is up.
        let t0 = Instant::now();
        let senders: Vec<rt::JoinHandle<Result<u64, String>>> = (0..STREAM_QD)
            .map(|_| {
                let conn = conn.clone();
                rt::spawn(async move {
                    let mut sent = 0u64;
                    while t0.elapsed() < STREAM_TIME {
                        let (h, body) = echo(STREAM_BYTES, 0);
                        let f = conn.call(h, Some(body)).await.map_err(|e| e.to_string())?;
                        if f.h.status != Status::Ok {
                            return Err(format!("{:?}", f.h.status));
                        }
                        sent += STREAM_BYTES as u64;
                    }
                    Ok(sent)
                })
            })
            .collect();
        for s in rt::join_all(senders).await {
            r.stream_bytes += s.map_err(fail)?;
        }
        r.stream_secs = t0.elapsed().as_secs_f64();
        r.mb_per_s = r.stream_bytes as f64 / r.stream_secs / 1e6;
        Ok(r)
    }
}

/// How often an OSD pings each OSD it shares a PG with (what `SLOW_LINK`
/// compares: [`crate::slow::slow_links`]).
pub const PEER_PING_EVERY: Duration = Duration::from_secs(1);
/// A ping unanswered this long counts as this slow.
const PEER_PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Peers an OSD pings (and reports) at most.
pub const PEERS_PINGED_MAX: usize = 256;

impl<D: BlockDev + 'static, T: Transport> Osd<D, T> {
    /// The OSDs up that share a PG with this one in its map (found again
    /// only when the epoch changes).
    fn ping_peers(&self) -> Vec<u32> {
        let m = self.map.borrow();
        let mut cached = self.benches.pinged.borrow_mut();
        if cached.0 != m.epoch() {
            let mut peers = std::collections::BTreeSet::new();
            for pg in m.pgs() {
                let acting = m.acting(pg);
                if acting.contains(&self.id) {
                    peers.extend(acting.into_iter().filter(|&o| o != self.id && m.is_up(o)));
                }
            }
            *cached = (
                m.epoch(),
                peers.into_iter().take(PEERS_PINGED_MAX).collect(),
            );
        }
        cached.1.clone()
    }

    /// Every [`PEER_PING_EVERY`], an empty [`Op::Echo`] to each peer
    /// through the connection replication uses (if it has one open: a
    /// connect blocks the thread; replication and peering make them), its
    /// round trip timed — a heartbeat between OSDs, as Ceph's: the link,
    /// not the disks, though a link busy with replication's large
    /// messages delays it too. One ping per peer at a time. Holds the OSD
    /// only while it asks.
    pub(crate) async fn ping_loop(me: std::rc::Weak<Self>) {
        loop {
            rt::sleep(PEER_PING_EVERY).await;
            let Some(me) = me.upgrade().filter(|o| !o.halted.get()) else {
                return;
            };
            if matches!(me.up_from.get(), 0 | u64::MAX) {
                continue;
            }
            let peers = me.ping_peers();
            me.stats.keep_peers(&peers);
            for p in peers {
                let open = me
                    .peers
                    .borrow()
                    .get(&p)
                    .filter(|c| !c.is_closed())
                    .cloned();
                let Some(c) = open else { continue };
                if !me.benches.pinging.borrow_mut().insert(p) {
                    continue;
                }
                let o = me.clone();
                rt::spawn(async move {
                    o.ping(p, &c).await;
                    o.benches.pinging.borrow_mut().remove(&p);
                });
            }
        }
    }

    async fn ping(&self, peer: u32, c: &T::Conn) {
        let mut h = Header::request(Op::Echo, 0, ObjectId::default());
        h.sender = self.id;
        h.epoch = self.epoch();
        let t0 = rt::monotonic();
        let took = match rt::timeout(PEER_PING_TIMEOUT, c.call(h, None)).await {
            Some(Ok(f)) if f.h.status == Status::Ok => rt::monotonic().saturating_sub(t0),
            // Unanswered in time (here, or by the connection's own
            // deadline): as slow as the wait.
            None | Some(Err(nacre_net::NetError::Timeout(_))) => PEER_PING_TIMEOUT,
            // Closed, refused: the OSD is going, which the leader sees.
            Some(_) => return,
        };
        self.stats.peer_pinged(peer, took.as_micros() as u64);
    }
}
