//! The etcd meta store against real etcd members: the MetaStore semantics
//! the embedded store has, key prefixes, and calls and watches that carry
//! on across an etcd restart and a lost leader.

mod common;

use std::time::{Duration, Instant};

use common::EtcdCluster;
use nacre_etcd::Etcd;
use nacre_meta::{
    CmpOp, Compare, EventKind, MetaError, MetaStore, OpResult, Range, Txn, TxnOp, Watch,
};

fn put(s: &Etcd, k: &str, v: &str) -> i64 {
    s.put(k, v.as_bytes().to_vec(), 0).unwrap()
}

/// Every event of `w` until `n` have come (within 10 s): (kind, key,
/// value, mod revision).
fn events(w: &Watch, n: usize) -> Vec<(EventKind, String, Vec<u8>, i64)> {
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        assert!(Instant::now() < until, "only {out:?} of {n} events");
        if let Some(b) = w.next(Duration::from_millis(200)).unwrap() {
            out.extend(
                b.into_iter()
                    .map(|e| (e.kind, e.kv.key, e.kv.value, e.kv.mod_revision)),
            );
        }
    }
    out
}

/// Nothing more arrives for a while.
fn quiet(w: &Watch) {
    assert!(w.next(Duration::from_millis(300)).unwrap().is_none());
}

/// Retries `f` while etcd is unavailable (an election), up to 15 s.
fn retry<T>(mut f: impl FnMut() -> Result<T, MetaError>) -> T {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        match f() {
            Ok(v) => return v,
            Err(MetaError::Unavailable(e)) if Instant::now() < until => {
                eprintln!("retrying: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn keys_revisions_and_transactions_behave_as_in_etcd() {
    let e = EtcdCluster::start(1);
    let s = Etcd::connect(&e.urls(), "/nacre/").unwrap();
    let r1 = put(&s, "/nacre/a", "1");
    let r2 = put(&s, "/nacre/a", "2");
    assert_eq!(r2, r1 + 1);
    let kv = s.get("/nacre/a").unwrap().unwrap();
    assert_eq!(
        (
            kv.value.as_slice(),
            kv.version,
            kv.create_revision,
            kv.mod_revision
        ),
        (&b"2"[..], 2, r1, r2)
    );
    put(&s, "/nacre/b/1", "x");
    put(&s, "/nacre/b/2", "y");
    put(&s, "/nacre/c", "z");
    let (kvs, rev) = s.range(&Range::prefix("/nacre/b/")).unwrap();
    assert_eq!(rev, r2 + 3);
    let keys: Vec<&str> = kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["/nacre/b/1", "/nacre/b/2"]);
    assert_eq!(s.range(&Range::prefix("/nacre/")).unwrap().0.len(), 4);
    assert_eq!(s.get("/nacre/none").unwrap(), None);

    // Compare-and-swap: creates only if absent; the loser gets what is.
    let create = |v: &str| Txn {
        compare: vec![Compare::Version("/nacre/lock".into(), CmpOp::Equal, 0)],
        success: vec![TxnOp::Put {
            key: "/nacre/lock".into(),
            value: v.as_bytes().to_vec(),
            lease: 0,
        }],
        failure: vec![TxnOp::Get(Range::key("/nacre/lock"))],
    };
    let won = s.txn(create("me")).unwrap();
    assert!(won.succeeded);
    assert_eq!(won.results, vec![OpResult::Put]);
    let lost = s.txn(create("you")).unwrap();
    assert!(!lost.succeeded);
    assert_eq!(lost.revision, won.revision);
    match &lost.results[..] {
        [OpResult::Get(kvs)] => assert_eq!(kvs[0].value, b"me"),
        r => panic!("{r:?}"),
    }
    // Every kind of comparison, and a delete's count.
    let a = s.get("/nacre/a").unwrap().unwrap();
    let t = Txn {
        compare: vec![
            Compare::ModRevision("/nacre/a".into(), CmpOp::Equal, a.mod_revision),
            Compare::CreateRevision("/nacre/a".into(), CmpOp::Less, a.mod_revision),
            Compare::Value("/nacre/a".into(), CmpOp::Equal, b"2".to_vec()),
            Compare::Version("/nacre/a".into(), CmpOp::Greater, 1),
            Compare::Value("/nacre/c".into(), CmpOp::NotEqual, b"q".to_vec()),
        ],
        success: vec![
            TxnOp::Delete(Range::prefix("/nacre/b/")),
            TxnOp::Get(Range::key("/nacre/c")),
        ],
        failure: vec![],
    };
    let r = s.txn(t).unwrap();
    assert!(r.succeeded);
    assert_eq!(r.results[0], OpResult::Delete(2));
    assert_eq!(s.delete(&Range::key("/nacre/none")).unwrap(), 0);
    // Keys outside the cluster's root are refused, not written.
    assert!(matches!(
        s.put("/other", vec![1], 0),
        Err(MetaError::Invalid(_))
    ));
}

#[test]
fn two_clusters_share_one_etcd_under_their_prefixes() {
    let e = EtcdCluster::start(1);
    let a = Etcd::connect(&e.urls(), "/nacre/").unwrap();
    let b = Etcd::connect(&e.urls(), "/cluster-b/").unwrap();
    put(&a, "/nacre/cluster", "a");
    put(&b, "/nacre/cluster", "b");
    put(&b, "/nacre/volume/x", "bx");
    assert_eq!(a.get("/nacre/cluster").unwrap().unwrap().value, b"a");
    assert_eq!(b.get("/nacre/cluster").unwrap().unwrap().value, b"b");
    let (kvs, _) = a.range(&Range::prefix("/nacre/")).unwrap();
    assert_eq!(kvs.len(), 1, "{kvs:?}");
    let (kvs, _) = b.range(&Range::prefix("/nacre/")).unwrap();
    assert_eq!(kvs.len(), 2);
    // A watch of one sees nothing of the other.
    let w = a.watch(&Range::prefix("/nacre/"), 0).unwrap();
    put(&b, "/nacre/volume/y", "by");
    put(&a, "/nacre/volume/y", "ay");
    let got = events(&w, 1);
    assert_eq!(
        (got[0].1.as_str(), got[0].2.as_slice()),
        ("/nacre/volume/y", &b"ay"[..])
    );
    quiet(&w);
    for bad in ["nacre/", "/nacre", "/", "//", "/a b/", "/nacre/b/"] {
        assert!(
            matches!(Etcd::connect(&e.urls(), bad), Err(MetaError::Invalid(_))),
            "{bad}"
        );
    }
    assert!(matches!(
        Etcd::connect("10.0.0.1:2379", "/nacre/"),
        Err(MetaError::Invalid(_))
    ));
}

#[test]
fn watches_from_now_from_the_past_and_from_a_compacted_revision() {
    let e = EtcdCluster::start(1);
    let s = Etcd::connect(&e.urls(), "/nacre/").unwrap();
    let r1 = put(&s, "/nacre/w/a", "1");
    let now = s.watch(&Range::prefix("/nacre/w/"), 0).unwrap();
    let r2 = put(&s, "/nacre/w/b", "2");
    s.delete(&Range::key("/nacre/w/a")).unwrap();
    put(&s, "/nacre/x", "not watched");
    let got = events(&now, 2);
    assert_eq!(
        got[0],
        (EventKind::Put, "/nacre/w/b".into(), b"2".to_vec(), r2)
    );
    // A delete carries the deleted entry at the deleting revision.
    assert_eq!(
        got[1],
        (
            EventKind::Delete,
            "/nacre/w/a".into(),
            b"1".to_vec(),
            r2 + 1
        )
    );
    quiet(&now);
    let past = s.watch(&Range::prefix("/nacre/w/"), r1).unwrap();
    let got = events(&past, 3);
    let revs: Vec<i64> = got.iter().map(|g| g.3).collect();
    assert_eq!(revs, [r1, r2, r2 + 1]);
    drop(past);
    e.compact(r2 + 1);
    let old = s.watch(&Range::prefix("/nacre/w/"), r1).unwrap();
    match old.next(Duration::from_secs(5)) {
        Err(MetaError::Compacted { asked, oldest }) => assert_eq!((asked, oldest), (r1, r2 + 1)),
        r => panic!("{r:?}"),
    }
}

/// A watch that hears nothing for a long time, while other keys change
/// and the history is compacted, still gets the next event of its range
/// (it is not reopened from an old revision for being quiet).
#[test]
fn a_quiet_watch_outlives_a_compaction() {
    let e = EtcdCluster::start(1);
    let s = Etcd::connect(&e.urls(), "/nacre/").unwrap();
    let w = s.watch(&Range::prefix("/nacre/w/"), 0).unwrap();
    let mut last = 0;
    for i in 0..20 {
        last = put(&s, &format!("/nacre/other/{i}"), "x");
    }
    e.compact(last);
    std::thread::sleep(Duration::from_secs(12));
    quiet(&w);
    let r = put(&s, "/nacre/w/a", "1");
    assert_eq!(events(&w, 1)[0].3, r);
}

#[test]
fn leases_keep_their_keys_alive_and_take_them_when_they_end() {
    let e = EtcdCluster::start(1);
    let s = Etcd::connect(&e.urls(), "/nacre/").unwrap();
    let id = s.lease_grant(4).unwrap();
    s.put("/nacre/up/1", b"x".to_vec(), id).unwrap();
    assert_eq!(s.get("/nacre/up/1").unwrap().unwrap().lease, id);
    for _ in 0..6 {
        std::thread::sleep(Duration::from_secs(1));
        assert!(s.lease_keepalive(id).unwrap() > 0);
    }
    assert!(s.get("/nacre/up/1").unwrap().is_some(), "kept alive");
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(s.get("/nacre/up/1").unwrap(), None, "expired");
    assert!(matches!(s.lease_keepalive(id), Err(MetaError::LeaseNotFound(x)) if x == id));
    assert!(
        matches!(s.put("/nacre/up/1", vec![1], id), Err(MetaError::LeaseNotFound(x)) if x == id)
    );
    let id = s.lease_grant(60).unwrap();
    s.put("/nacre/up/2", b"y".to_vec(), id).unwrap();
    s.lease_revoke(id).unwrap();
    assert_eq!(s.get("/nacre/up/2").unwrap(), None, "revoked");
    assert!(matches!(
        s.lease_revoke(id),
        Err(MetaError::LeaseNotFound(_))
    ));
}

#[test]
fn calls_and_watches_carry_on_across_an_etcd_restart() {
    let mut e = EtcdCluster::start(1);
    let s = Etcd::connect(&e.urls(), "/nacre/").unwrap();
    put(&s, "/nacre/k/0", "before");
    let w = s.watch(&Range::prefix("/nacre/k/"), 0).unwrap();
    put(&s, "/nacre/k/1", "a");
    assert_eq!(events(&w, 1)[0].1, "/nacre/k/1");
    e.kill(0);
    assert!(matches!(
        s.get("/nacre/k/0"),
        Err(MetaError::Unavailable(_))
    ));
    e.run(0);
    e.wait_leader();
    retry(|| s.put("/nacre/k/2", b"b".to_vec(), 0));
    put(&s, "/nacre/k/3", "c");
    // The watch resumed where it was: both, once each, in order.
    let got = events(&w, 2);
    let keys: Vec<&str> = got.iter().map(|g| g.1.as_str()).collect();
    assert_eq!(keys, ["/nacre/k/2", "/nacre/k/3"]);
    quiet(&w);
    assert_eq!(s.get("/nacre/k/0").unwrap().unwrap().value, b"before");
}

#[test]
fn a_three_member_etcd_loses_its_leader_and_nothing_else() {
    let mut e = EtcdCluster::start(3);
    // The leader's URL first: the client's calls and its watch go there
    // until it is gone.
    let leader = e.wait_leader();
    let urls = e.urls();
    let mut urls: Vec<&str> = urls.split(',').collect();
    urls.swap(0, leader);
    let s = Etcd::connect(&urls.join(","), "/nacre/").unwrap();
    let w = s.watch(&Range::prefix("/nacre/"), 0).unwrap();
    for i in 0..5 {
        put(&s, &format!("/nacre/k/{i}"), "x");
    }
    e.kill(leader);
    for i in 5..10 {
        // A put that failed may have been applied (etcd's answer was lost
        // with its leader): put again only if it was not.
        let k = format!("/nacre/k/{i}");
        retry(|| match s.get(&k)? {
            Some(_) => Ok(0),
            None => s.put(&k, b"x".to_vec(), 0),
        });
    }
    assert_ne!(e.wait_leader(), leader);
    let got = events(&w, 10);
    let keys: Vec<String> = got.iter().map(|g| g.1.clone()).collect();
    let want: Vec<String> = (0..10).map(|i| format!("/nacre/k/{i}")).collect();
    assert_eq!(keys, want, "every event once, in order");
    quiet(&w);
    assert_eq!(s.range(&Range::prefix("/nacre/k/")).unwrap().0.len(), 10);
}
