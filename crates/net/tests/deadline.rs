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
