use super::*;

fn put(s: &Embedded, k: &str, v: &str) -> Revision {
    s.put(k, v.as_bytes().to_vec(), 0).unwrap()
}

#[test]
fn revisions_versions_and_ranges() {
    let d = tempfile::tempdir().unwrap();
    let s = Embedded::open(d.path()).unwrap();
    assert_eq!(put(&s, "/a/1", "x"), 1);
    assert_eq!(put(&s, "/a/2", "y"), 2);
    assert_eq!(put(&s, "/a/1", "z"), 3);
    put(&s, "/b", "w");
    let kv = s.get("/a/1").unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (1, 3, 2));
    assert_eq!(kv.value, b"z");
    let (kvs, rev) = s.range(&Range::prefix("/a/")).unwrap();
    assert_eq!(kvs.len(), 2);
    assert_eq!(rev, 4);
    assert_eq!(s.delete(&Range::prefix("/a/")).unwrap(), 2);
    assert!(s.get("/a/2").unwrap().is_none());
    assert_eq!(s.delete(&Range::key("/nope")).unwrap(), 0);
}

#[test]
fn compare_and_swap() {
    let d = tempfile::tempdir().unwrap();
    let s = Embedded::open(d.path()).unwrap();
    let create = |v: &str| Txn {
        compare: vec![Compare::Version("/k".into(), CmpOp::Equal, 0)],
        success: vec![TxnOp::Put {
            key: "/k".into(),
            value: v.into(),
            lease: 0,
        }],
        failure: vec![TxnOp::Get(Range::key("/k"))],
    };
    assert!(s.txn(create("first")).unwrap().succeeded);
    let r = s.txn(create("second")).unwrap();
    assert!(!r.succeeded);
    match &r.results[0] {
        OpResult::Get(kvs) => assert_eq!(kvs[0].value, b"first"),
        o => panic!("{o:?}"),
    }
    let rev = s.get("/k").unwrap().unwrap().mod_revision;
    let t = Txn {
        compare: vec![Compare::ModRevision("/k".into(), CmpOp::Equal, rev)],
        success: vec![
            TxnOp::Put {
                key: "/k".into(),
                value: b"third".to_vec(),
                lease: 0,
            },
            TxnOp::Get(Range::key("/k")),
        ],
        failure: vec![],
    };
    let r = s.txn(t).unwrap();
    assert!(r.succeeded);
    // ops inside one transaction see each other
    match &r.results[1] {
        OpResult::Get(kvs) => assert_eq!(kvs[0].value, b"third"),
        o => panic!("{o:?}"),
    }
    assert!(s
        .txn(Txn {
            success: vec![TxnOp::Put {
                key: "/x".into(),
                value: vec![],
                lease: 99
            }],
            ..Txn::default()
        })
        .is_err());
}

#[test]
fn survives_restart_and_torn_tail() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = Embedded::open(d.path()).unwrap();
        for i in 0..50 {
            put(&s, &format!("/k/{i}"), &format!("v{i}"));
        }
        s.delete(&Range::key("/k/7")).unwrap();
        // a second open of the same dir is refused
        assert!(Embedded::open(d.path()).is_err());
    }
    // a torn record at the end (a crash mid-append) is dropped
    let mut f = OpenOptions::new()
        .append(true)
        .open(d.path().join("log"))
        .unwrap();
    f.write_all(&[200, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(f);
    let s = Embedded::open(d.path()).unwrap();
    let (kvs, rev) = s.range(&Range::prefix("/k/")).unwrap();
    assert_eq!(kvs.len(), 49);
    assert_eq!(rev, 51);
    assert_eq!(put(&s, "/k/new", "n"), 52);
    drop(s);
    // What was written after the torn tail was cut survives the next
    // restart (appended where the cut left the log, not past a hole).
    let s = Embedded::open(d.path()).unwrap();
    assert_eq!(s.get("/k/new").unwrap().unwrap().value, b"n");
    assert_eq!(s.range(&Range::prefix("/k/")).unwrap().1, 52);
}

#[test]
fn compaction_keeps_everything() {
    let d = tempfile::tempdir().unwrap();
    let big = "x".repeat(100_000);
    {
        let s = Embedded::open(d.path()).unwrap();
        let l = s.lease_grant(60).unwrap();
        s.put("/leased", b"1".to_vec(), l).unwrap();
        for i in 0..120 {
            put(&s, &format!("/big/{}", i % 10), &format!("{i}{big}"));
        }
        // Written after the compaction, into the cut log.
        put(&s, "/after", "a");
    }
    assert!(d.path().join("snapshot").exists());
    let s = Embedded::open(d.path()).unwrap();
    let (kvs, _) = s.range(&Range::prefix("/big/")).unwrap();
    assert_eq!(kvs.len(), 10);
    for (k, kv) in kvs.iter().enumerate() {
        let last = format!("{}", 110 + k);
        assert!(
            kv.value.starts_with(last.as_bytes()),
            "/big/{k} is not its last value"
        );
    }
    assert_eq!(s.get("/after").unwrap().unwrap().value, b"a");
    let kv = s.get("/leased").unwrap().unwrap();
    s.lease_keepalive(kv.lease).unwrap();
    s.lease_revoke(kv.lease).unwrap();
    assert!(s.get("/leased").unwrap().is_none());
}

#[test]
fn watches_from_now_and_from_the_past() {
    let d = tempfile::tempdir().unwrap();
    let s = Embedded::open(d.path()).unwrap();
    let r1 = put(&s, "/w/a", "1");
    put(&s, "/other", "1");
    let w = s.watch(&Range::prefix("/w/"), 0).unwrap();
    put(&s, "/w/b", "2");
    s.delete(&Range::key("/w/a")).unwrap();
    let t = Duration::from_secs(1);
    let e = w.next(t).unwrap().unwrap();
    assert_eq!(
        (e[0].kind.clone(), e[0].kv.key.as_str()),
        (EventKind::Put, "/w/b")
    );
    let e = w.next(t).unwrap().unwrap();
    assert_eq!(
        (e[0].kind.clone(), e[0].kv.key.as_str()),
        (EventKind::Delete, "/w/a")
    );
    assert!(w.next(Duration::from_millis(10)).unwrap().is_none());
    // from a past revision: replays what happened since
    let w2 = s.watch(&Range::prefix("/w/"), r1).unwrap();
    let keys: Vec<String> = (0..3)
        .map(|_| w2.next(t).unwrap().unwrap()[0].kv.key.clone())
        .collect();
    assert_eq!(keys, ["/w/a", "/w/b", "/w/a"]);
    drop(s);
    // the old watch ends with the store; after a restart history starts over
    assert!(w.next(t).is_err());
    let s = Embedded::open(d.path()).unwrap();
    assert!(matches!(
        s.watch(&Range::prefix("/w/"), r1),
        Err(MetaError::Compacted { .. })
    ));
}

#[test]
fn leases_expire_and_take_their_keys() {
    let d = tempfile::tempdir().unwrap();
    let s = Embedded::open(d.path()).unwrap();
    let l = s.lease_grant(1).unwrap();
    s.put("/up/1", b"x".to_vec(), l).unwrap();
    let w = s.watch(&Range::prefix("/up/"), 0).unwrap();
    let e = w.next(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(e[0].kind, EventKind::Delete);
    assert!(s.get("/up/1").unwrap().is_none());
    assert!(matches!(
        s.lease_keepalive(l),
        Err(MetaError::LeaseNotFound(_))
    ));
    assert!(s.lease_grant(0).is_err());
}

/// What the next log operations of a [`FaultyLog`] do wrong.
#[derive(Default)]
struct Faults {
    /// The next append writes this many bytes of its record, then fails
    /// (a full disk).
    short_append: Option<usize>,
    /// The next sync fails (and leaves what was appended).
    sync: bool,
    /// Cuts fail.
    cut: bool,
}

struct FaultyLog {
    file: File,
    faults: Arc<Mutex<Faults>>,
}

impl LogFile for FaultyLog {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self.faults.lock().unwrap().short_append.take() {
            Some(n) => {
                self.file.write_all(&bytes[..n.min(bytes.len())])?;
                Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
            }
            None => self.file.write_all(bytes),
        }
    }
    fn sync(&mut self) -> std::io::Result<()> {
        if std::mem::take(&mut self.faults.lock().unwrap().sync) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.sync_data()
    }
    fn cut(&mut self, len: u64) -> std::io::Result<()> {
        if self.faults.lock().unwrap().cut {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        LogFile::cut(&mut self.file, len)
    }
}

fn faulty(dir: &Path) -> (Arc<Embedded>, Arc<Mutex<Faults>>) {
    let faults = Arc::new(Mutex::new(Faults::default()));
    let f = faults.clone();
    let s = Embedded::open_with(dir, move |file| Box::new(FaultyLog { file, faults: f })).unwrap();
    (s, faults)
}

/// A change whose append or sync fails is refused and leaves nothing in
/// the log: the changes acknowledged after it survive a restart (a torn
/// record before them would make replay stop there and drop them), and
/// the failed one is not there. Tried with a short write (a full disk) at
/// several lengths and with a failed sync.
#[test]
fn a_failed_append_leaves_no_torn_record_before_later_ones() {
    let cases: [(Option<usize>, bool); 4] = [
        (Some(0), false),
        (Some(3), false),
        (Some(20), false),
        (None, true),
    ];
    for (k, (short, sync)) in cases.into_iter().enumerate() {
        let d = tempfile::tempdir().unwrap();
        {
            let (s, faults) = faulty(d.path());
            assert_eq!(put(&s, "/a", "1"), 1);
            *faults.lock().unwrap() = Faults {
                short_append: short,
                sync,
                cut: false,
            };
            let e = s.put("/lost", b"x".to_vec(), 0).unwrap_err();
            assert!(matches!(e, MetaError::Storage(_)), "case {k}: {e}");
            assert_eq!(s.get("/lost").unwrap(), None, "case {k}");
            assert_eq!(put(&s, "/b", "2"), 2, "case {k}: the revision was not used");
        }
        let s = Embedded::open(d.path()).unwrap();
        assert_eq!(s.get("/a").unwrap().unwrap().value, b"1", "case {k}");
        assert_eq!(s.get("/b").unwrap().unwrap().value, b"2", "case {k}");
        assert_eq!(s.get("/lost").unwrap(), None, "case {k}");
        assert_eq!(s.range(&Range::prefix("/")).unwrap().1, 2, "case {k}");
    }
}

/// If the failed record cannot be cut back either, the store takes no
/// more changes (reads go on): nothing acknowledged may follow the torn
/// record. A restart drops the torn tail and takes changes again.
#[test]
fn a_log_that_cannot_be_cut_back_takes_no_more_changes() {
    let d = tempfile::tempdir().unwrap();
    {
        let (s, faults) = faulty(d.path());
        put(&s, "/a", "1");
        *faults.lock().unwrap() = Faults {
            short_append: Some(10),
            sync: false,
            cut: true,
        };
        assert!(s.put("/lost", b"x".to_vec(), 0).is_err());
        faults.lock().unwrap().cut = false;
        let e = s.put("/b", b"2".to_vec(), 0).unwrap_err();
        assert!(e.to_string().contains("until a restart"), "{e}");
        assert_eq!(s.get("/a").unwrap().unwrap().value, b"1");
    }
    let s = Embedded::open(d.path()).unwrap();
    assert_eq!(s.get("/a").unwrap().unwrap().value, b"1");
    assert_eq!(s.get("/lost").unwrap(), None);
    assert_eq!(put(&s, "/b", "2"), 2);
}
