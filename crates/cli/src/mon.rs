//! `nacre mon`: a monitor of a cluster on etcd. Any number run; one is
//! elected through an etcd lease and runs the cluster map's leader (the
//! same `Leader` as `nacre up`'s) and the sweep for objects of deleted
//! volumes; the others stand by and take over when its lease ends.
//!
//! The election and why it is safe (docs/internals/cluster.md *Monitors*):
//! - A monitor wins by creating [`map::MON_LEADER_KEY`] under a lease of
//!   [`MON_LEASE_TTL_S`]; the key's value is its address and a nonce of
//!   this term. OSDs and commands find the leader there.
//! - Every map it stores is fenced: the transaction compares the key's
//!   value with its own, so a leader whose lease ran out (etcd deleted the
//!   key) stores nothing more, and an OSD hears only of stored maps.
//! - It acts as leader only until its *authority* ends: the send time of
//!   the last keepalive etcd answered, plus the TTL etcd gave, less
//!   [`AUTHORITY_MARGIN`]. etcd counts the TTL from when the keepalive
//!   arrived, which is later, so its authority ends before etcd can hand
//!   the key to another. It then stops answering anything (a heartbeat it
//!   answered would extend an OSD's read lease).
//! - No read lease it grants outlasts its authority (`Leader::read_lease_ms`
//!   caps each at the time its authority has left), and a new leader
//!   lets no interval go active until [`TAKEOVER_WAIT`] after winning
//!   (`Leader::hold_events_until`; OSDs boot and peer meanwhile): every
//!   read lease the old leader granted has ended by then, so no old
//!   primary serves a read once a new interval can go active. It starts
//!   from the stored map in a new epoch, every OSD down until it boots
//!   with it (as `nacre up` after a restart).
//! - A monitor that stops (SIGTERM) steps down first, waits out the read
//!   leases it granted (at most `READ_LEASE_MS`, none past its authority),
//!   then revokes its lease, so a standby takes over then instead of
//!   after the TTL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use nacre_io::net::Addr;
use nacre_meta::map;
use nacre_meta::{CmpOp, Compare, MetaError, MetaStore, Range, Txn, TxnOp};

use crate::cluster::{self, LeaderStart, Worker};
use crate::commands::{block_stop_signals, signal_name, wait_for_signal};

/// TTL of the elected monitor's lease: a monitor that dies or is cut off
/// from etcd is replaced within about this long. (Reads pause from when
/// the OSDs' read leases run out, `READ_LEASE_MS` after their last
/// answered heartbeat or at the dead leader's authority's end, until the
/// next leader has won, waited [`TAKEOVER_WAIT`], and they booted with it
/// and peered.)
pub const MON_LEASE_TTL_S: i64 = 3;
/// How often the leader renews its lease: two renewals may fail (an etcd
/// election) before its authority lapses.
const KEEPALIVE_EVERY: Duration = Duration::from_millis(500);
/// How far before its lease could end, by its own clock, a leader stops
/// acting: covers the drift between its clock's rate and etcd's.
pub const AUTHORITY_MARGIN: Duration = Duration::from_millis(500);
/// Covers the drift between the clock rates of the OSDs and the monitors.
const DRIFT_MARGIN: Duration = Duration::from_millis(500);
/// Deadline of one keepalive call: one sent to a member that died must
/// fail, and the next go elsewhere, well within the lease.
const KEEPALIVE_CALL_TIMEOUT: Duration = Duration::from_millis(1_000);
/// How long after winning a new leader lets no interval go active. Every
/// read lease the old leader granted ended by its authority's end (a
/// lease runs from the heartbeat's sending, before the leader's answer,
/// for at most the authority it had left then), at least
/// [`AUTHORITY_MARGIN`] before etcd could give the key away; the wait
/// adds [`DRIFT_MARGIN`] for the rates of the OSDs' clocks. (Before the
/// cap, it had to wait out a whole `READ_LEASE_MS` less the margin: 2 s.)
pub const TAKEOVER_WAIT: Duration = DRIFT_MARGIN;
/// How often a standby looks at the election key, and the leader at its
/// authority.
const POLL: Duration = Duration::from_millis(200);

/// The store for [`MonOpts::keepalive_meta`].
pub fn keepalive_meta(e: &crate::at::EtcdArgs) -> anyhow::Result<Arc<dyn MetaStore>> {
    crate::daemons::wait_for("etcd", || e.meta_with(KEEPALIVE_CALL_TIMEOUT).map(Some))
}

pub struct MonOpts {
    pub etcd: crate::at::EtcdArgs,
    pub meta: Arc<dyn MetaStore>,
    /// The same store, its calls' deadline [`KEEPALIVE_CALL_TIMEOUT`]: for
    /// the lease's keepalives.
    pub keepalive_meta: Arc<dyn MetaStore>,
    /// Where the leader listens when this monitor leads; OSDs and commands
    /// reach it there.
    pub addr: Addr,
    pub out_delay: Duration,
    /// Whether an OSD named slow is demoted from leading PGs.
    pub demote_slow: bool,
    pub reclaim_interval: Duration,
    /// Where to serve metrics (HOST:PORT).
    pub metrics: Option<String>,
}

/// One term of leadership: the lease and the election key's value.
struct Term {
    lease: i64,
    value: Vec<u8>,
    /// Until when this monitor may act, by [`boottime`].
    until: Arc<Mutex<Duration>>,
    /// When it won, by [`boottime`].
    won: Duration,
    lost: Arc<AtomicBool>,
}

/// The time since boot, suspended time included (CLOCK_BOOTTIME): a
/// machine that was suspended must not take its pause for time in office,
/// and `Instant` (CLOCK_MONOTONIC) stops while it is suspended.
fn boottime() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(r, 0, "CLOCK_BOOTTIME");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// How long etcd says a lease lives, as a duration no longer than asked
/// (an answer out of range shortens the term, never lengthens it).
fn ttl_of(ttl_s: i64) -> Duration {
    Duration::from_secs(ttl_s.clamp(0, MON_LEASE_TTL_S) as u64)
}

/// Runs a monitor until SIGTERM or SIGINT.
pub fn run(o: &MonOpts) -> anyhow::Result<()> {
    let set = block_stop_signals();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = wait_for_signal(&set);
            tracing::info!("mon: {}, stopping", signal_name(sig));
            stop2.store(true, Ordering::Release);
        })?;
    crate::daemons::cluster_id_waiting(&*o.meta, &o.etcd)?;
    let _metrics = (o.metrics.as_deref())
        .map(|a| {
            let sources = crate::metrics::Sources {
                meta: o.meta.clone(),
                osds: crate::metrics::Osds::None,
                cluster: true,
                mon: Some(o.addr.clone()),
                gateway: None,
            };
            crate::metrics::serve(a, sources)
        })
        .transpose()?;
    let mut said = None::<String>;
    while !stop.load(Ordering::Acquire) {
        match campaign(o) {
            Ok(Ok(term)) => {
                said = None;
                if let Err(e) = lead(o, &term, &stop) {
                    tracing::error!("mon: while leading: {e:#}");
                }
                // Whatever is left of this term acts no more: its leader
                // has stopped, and answers nothing from now on.
                term.lost.store(true, Ordering::Release);
                // The read leases it granted end at most `READ_LEASE_MS`
                // from now and not past its authority: wait them out
                // before the next may take over (it holds PG events only
                // `TAKEOVER_WAIT`, which covers leases that end with the
                // authority, not one cut short by a revoke). A term that
                // lost its authority waits no more.
                let stopped = boottime();
                let granted = Duration::from_millis(nacre_types::READ_LEASE_MS);
                let until = *term.until.lock().unwrap_or_else(|p| p.into_inner());
                let leases_end = (stopped + granted).min(until) + DRIFT_MARGIN;
                while boottime() < leases_end {
                    std::thread::sleep(POLL.min(leases_end.saturating_sub(boottime())));
                }
                // Stepped down: the next may take over at once.
                if let Err(e) = o.meta.lease_revoke(term.lease) {
                    tracing::warn!("mon: revoking lease {}: {e}", term.lease);
                }
            }
            Ok(Err(leader)) => {
                if said.as_ref() != Some(&leader) {
                    tracing::info!("mon: standing by; the leader is at {leader}");
                    said = Some(leader);
                }
                std::thread::sleep(POLL);
            }
            Err(e) => {
                tracing::warn!("mon: campaign: {e}");
                std::thread::sleep(POLL * 5);
            }
        }
    }
    Ok(())
}

/// Tries to take the election key: the term if won, else the leader's
/// address.
fn campaign(o: &MonOpts) -> anyhow::Result<Result<Term, String>> {
    if let Some(kv) = o.meta.get(map::MON_LEADER_KEY)? {
        return Ok(Err(map::leader_addr_of(&kv.value).unwrap_or_default()));
    }
    let sent = boottime();
    let lease = o.meta.lease_grant(MON_LEASE_TTL_S)?;
    let value = format!("{} {:016x}", o.addr, nacre_client::random_u64()).into_bytes();
    let t = Txn {
        compare: vec![Compare::Version(
            map::MON_LEADER_KEY.into(),
            CmpOp::Equal,
            0,
        )],
        success: vec![TxnOp::Put {
            key: map::MON_LEADER_KEY.into(),
            value: value.clone(),
            lease,
        }],
        failure: vec![TxnOp::Get(Range::key(map::MON_LEADER_KEY))],
    };
    match o.meta.txn(t) {
        Ok(r) if r.succeeded => {}
        Ok(r) => {
            let _ = o.meta.lease_revoke(lease);
            let leader = match r.results.first() {
                Some(nacre_meta::OpResult::Get(kvs)) => kvs.first().cloned(),
                _ => None,
            };
            let addr = leader.and_then(|kv| map::leader_addr_of(&kv.value));
            return Ok(Err(addr.unwrap_or_default()));
        }
        Err(e) => {
            let _ = o.meta.lease_revoke(lease);
            return Err(e.into());
        }
    }
    let until = (sent + ttl_of(MON_LEASE_TTL_S)).saturating_sub(AUTHORITY_MARGIN);
    Ok(Ok(Term {
        lease,
        value,
        won: boottime(),
        until: Arc::new(Mutex::new(until)),
        lost: Arc::new(AtomicBool::new(false)),
    }))
}

/// Renews the term's lease from a thread of its own until `done`,
/// advancing its authority with every answer.
fn keep_alive(meta: Arc<dyn MetaStore>, term: &Term, done: Arc<AtomicBool>) -> std::io::Result<()> {
    let (lease, until, lost) = (term.lease, term.until.clone(), term.lost.clone());
    std::thread::Builder::new()
        .name("mon-lease".into())
        .spawn(move || {
            while !done.load(Ordering::Acquire) && !lost.load(Ordering::Acquire) {
                let sent = boottime();
                match meta.lease_keepalive(lease) {
                    Ok(ttl) if ttl > 0 => {
                        let t = (sent + ttl_of(ttl)).saturating_sub(AUTHORITY_MARGIN);
                        let mut u = until.lock().unwrap_or_else(|p| p.into_inner());
                        *u = (*u).max(t);
                    }
                    Ok(_) | Err(MetaError::LeaseNotFound(_)) => {
                        tracing::error!("mon: lease {lease} ended");
                        lost.store(true, Ordering::Release);
                    }
                    Err(e) => tracing::warn!("mon: renewing lease {lease}: {e}"),
                }
                let next = sent + KEEPALIVE_EVERY;
                while boottime() < next && !done.load(Ordering::Acquire) {
                    std::thread::sleep(POLL.min(next.saturating_sub(boottime())));
                }
            }
        })?;
    Ok(())
}

impl Term {
    fn holds(&self) -> bool {
        time_left(&self.lost, &self.until).is_some()
    }

    /// [`time_left`], for the leader to check at every message and to cap
    /// the read leases it grants with.
    fn authority(&self) -> Box<dyn Fn() -> Option<Duration> + Send> {
        let (lost, until) = (self.lost.clone(), self.until.clone());
        Box::new(move || time_left(&lost, &until))
    }
}

/// How long a term may still act: until `until` (by [`boottime`]) unless
/// `lost`; `None` once it may not.
fn time_left(lost: &AtomicBool, until: &Mutex<Duration>) -> Option<Duration> {
    let left = (until.lock().unwrap_or_else(|p| p.into_inner())).checked_sub(boottime());
    left.filter(|l| !l.is_zero() && !lost.load(Ordering::Acquire))
}

/// Leads for one term: waits out the old leader's read leases, loads the
/// map, runs the leader and the reclaim sweep until the term ends or the
/// monitor stops; then stops them (they answer nothing more) and returns.
fn lead(o: &MonOpts, term: &Term, stop: &AtomicBool) -> anyhow::Result<()> {
    tracing::info!("mon: elected leader (lease {})", term.lease);
    let done = Arc::new(AtomicBool::new(false));
    keep_alive(o.keepalive_meta.clone(), term, done.clone())?;
    let r = lead_term(o, term, stop);
    done.store(true, Ordering::Release);
    if !stop.load(Ordering::Acquire) {
        tracing::error!("mon: leadership lost (etcd unreachable or the lease ended); standing by");
    }
    r
}

fn lead_term(o: &MonOpts, term: &Term, stop: &AtomicBool) -> anyhow::Result<()> {
    let ending = || stop.load(Ordering::Acquire) || !term.holds();
    let fence = vec![Compare::Value(
        map::MON_LEADER_KEY.into(),
        CmpOp::Equal,
        term.value.clone(),
    )];
    // OSDs registered while no leader ran are out until they boot and
    // ask to be marked in.
    let new = map::out_new_osds(&*o.meta, &fence)?;
    if !new.is_empty() {
        tracing::info!("mon: OSDs new to the PG table, out until they first boot: {new:?}");
    }
    let start = LeaderStart {
        meta: o.meta.clone(),
        map: cluster::leader_map(&*o.meta)?,
        out_delay: o.out_delay,
        demote_slow: o.demote_slow,
        addr: o.addr.clone(),
        fence,
        stored: true,
        authority: Some(term.authority()),
        // Every read lease granted by an earlier leader ends before this
        // one lets an interval go active (module doc).
        hold_events: TAKEOVER_WAIT.saturating_sub(boottime().saturating_sub(term.won)),
    };
    let (tx, rx) = mpsc::channel();
    let leader = cluster::spawn_leader(start, tx)?;
    rx.recv()
        .context("the leader thread died while starting")??;
    let workers: Vec<Worker> = vec![
        cluster::spawn_reclaimer(o.meta.clone(), o.reclaim_interval)?,
        leader,
    ];
    tracing::info!("mon: leading at {}", o.addr);
    while !ending() {
        std::thread::sleep(POLL);
    }
    for w in workers {
        w.stop();
    }
    Ok(())
}
