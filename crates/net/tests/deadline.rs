//! Every request has a deadline: a peer that accepts and then never
//! answers fails the request with `Timeout` (and the connection is torn
//! down), instead of holding the caller for ever; a peer that answers in
//! time is not affected.

use std::rc::Rc;
use std::time::{Duration, Instant};

use nacre_io::net::{Addr, Listener};
use nacre_io::{rt, AlignedBuf};
use nacre_net::{Conn, Frame, Handler, NetError};
use nacre_types::ObjectId;
use nacre_wire::{Header, Op, Status};

struct Answers;

impl Handler for Answers {
    async fn handle(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        (f.h.reply(Status::Ok), None)
    }
}

fn stat() -> Header {
    Header::request(Op::Stat, 0, ObjectId::default())
}

#[test]
fn a_silent_peer_times_out_and_an_answering_one_does_not() {
    let d = tempfile::tempdir().unwrap();
    rt::block_on(async {
        let silent = Addr::Unix(d.path().join("silent.sock"));
        let l = Listener::bind(&silent).unwrap();
        // Accepts, keeps the connection open, reads nothing, answers nothing.
        let _hold = rt::spawn(async move {
            let mut kept = Vec::new();
            loop {
                kept.push(l.accept().await.unwrap());
            }
        });
        let c = Conn::connect_with_timeout(&silent, Duration::from_millis(200)).unwrap();
        let t0 = Instant::now();
        let r = c.call(stat(), None).await;
        assert!(
            matches!(r, Err(NetError::Timeout(200))),
            "{:?}",
            r.map(|f| f.h.status)
        );
        assert!(
            c.is_closed(),
            "a connection with a late request is torn down"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));

        let talking = Addr::Unix(d.path().join("talking.sock"));
        let _serving = rt::spawn(nacre_net::serve(
            Listener::bind(&talking).unwrap(),
            Rc::new(Answers),
        ));
        let c = Conn::connect_with_timeout(&talking, Duration::from_millis(200)).unwrap();
        for _ in 0..3 {
            assert_eq!(c.call(stat(), None).await.unwrap().h.status, Status::Ok);
            rt::sleep(Duration::from_millis(150)).await;
        }
        assert!(!c.is_closed());
    });
}

/// A budget gives out shares up to its cap, makes the next taker wait
/// until one comes back, and lets a request larger than the cap run alone.
#[test]
fn a_budget_waits_when_spent_and_never_exceeds_its_cap() {
    rt::block_on(async {
        let b = nacre_net::Budget::new(100);
        let first = b.take(60).await;
        let second = b.take(40).await;
        assert_eq!(b.used(), 100);
        let waiter = {
            let b = b.clone();
            rt::spawn(async move {
                let p = b.take(30).await;
                (b.used(), p)
            })
        };
        rt::sleep(Duration::from_millis(50)).await;
        assert_eq!(b.used(), 100, "the third share was given out past the cap");
        drop(first);
        let (used, third) = waiter.await;
        assert_eq!(used, 70);
        drop((second, third));
        assert_eq!(b.used(), 0);
        let whole = b.take(1_000).await;
        assert_eq!(
            b.used(),
            100,
            "a request larger than the cap takes all of it"
        );
        drop(whole);
        assert_eq!(b.used(), 0);
    });
}

/// Answers client 1 late and every other at once, saying in the reply's
/// version whose request it answers.
struct SaysWhose;

impl Handler for SaysWhose {
    async fn handle(self: Rc<Self>, f: Frame) -> (Header, Option<AlignedBuf>) {
        if f.h.client == 1 {
            rt::sleep(Duration::from_millis(100)).await;
        }
        let mut r = f.h.reply(Status::Ok);
        r.obj_version = f.h.client;
        (r, None)
    }
}

/// Two clients' requests forwarded over one connection may carry the same
/// request id (a primary's sub-ops keep each client's ids): each caller
/// gets its own reply, whatever order they come in; the same request twice
/// at once is sent again only once the first is answered. (Replies were
/// matched by request id alone: a replica's answer to one client's write
/// could be taken for another's.)
#[test]
fn replies_go_to_their_own_request_when_clients_share_ids() {
    let d = tempfile::tempdir().unwrap();
    rt::block_on(async {
        let a = Addr::Unix(d.path().join("whose.sock"));
        let _serving = rt::spawn(nacre_net::serve(
            Listener::bind(&a).unwrap(),
            Rc::new(SaysWhose),
        ));
        let c = Conn::connect(&a).unwrap();
        let ask = |client: u64| {
            let c = c.clone();
            rt::spawn(async move {
                let mut h = stat();
                h.client = client;
                h.request_id = 5;
                c.call(h, None).await.unwrap().h.obj_version
            })
        };
        let (slow, fast) = (ask(1), ask(2));
        assert_eq!(fast.await, 2, "client 2 got another's reply");
        assert_eq!(slow.await, 1, "client 1 got another's reply");
        let (x, y) = (ask(1), ask(1));
        assert_eq!((x.await, y.await), (1, 1));
        assert!(!c.is_closed());
    });
}
