//! The API types, matching etcd v3's: a store-wide revision that every
//! change increments; per key its create/mod revision, version and lease.

use serde::{Deserialize, Serialize};

pub type Revision = i64;
pub type LeaseId = i64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    /// Number of puts since the key was created (1 after the first).
    pub version: i64,
    /// The lease the key dies with; 0 for none.
    pub lease: LeaseId,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmpOp {
    Equal,
    NotEqual,
    Less,
    Greater,
}

impl CmpOp {
    fn holds<T: Ord>(self, a: &T, b: &T) -> bool {
        match self {
            CmpOp::Equal => a == b,
            CmpOp::NotEqual => a != b,
            CmpOp::Less => a < b,
            CmpOp::Greater => a > b,
        }
    }
}

/// What a transaction compares; a missing key has version, create and mod
/// revision 0 (as in etcd) and, here, an empty value (etcd makes any
/// `Value` comparison of a missing key false).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compare {
    Version(String, CmpOp, i64),
    CreateRevision(String, CmpOp, Revision),
    ModRevision(String, CmpOp, Revision),
    Value(String, CmpOp, Vec<u8>),
}

impl Compare {
    pub fn key(&self) -> &str {
        match self {
            Compare::Version(k, ..)
            | Compare::CreateRevision(k, ..)
            | Compare::ModRevision(k, ..)
            | Compare::Value(k, ..) => k,
        }
    }

    /// Evaluates the comparison against the key's current entry.
    pub fn holds(&self, kv: Option<&KeyValue>) -> bool {
        let (v, c, m) = kv.map_or((0, 0, 0), |kv| {
            (kv.version, kv.create_revision, kv.mod_revision)
        });
        match self {
            Compare::Version(_, op, x) => op.holds(&v, x),
            Compare::CreateRevision(_, op, x) => op.holds(&c, x),
            Compare::ModRevision(_, op, x) => op.holds(&m, x),
            Compare::Value(_, op, x) => {
                let empty = Vec::new();
                op.holds(kv.map_or(&empty, |kv| &kv.value), x)
            }
        }
    }
}

/// A key range: one key, or `[key, end)` (etcd's range_end).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub key: String,
    pub end: Option<String>,
}

impl Range {
    pub fn key(k: &str) -> Range {
        Range {
            key: k.to_string(),
            end: None,
        }
    }

    /// Every key starting with `p`.
    pub fn prefix(p: &str) -> Range {
        Range {
            key: p.to_string(),
            end: Some(prefix_end(p)),
        }
    }

    pub fn contains(&self, k: &str) -> bool {
        match &self.end {
            None => k == self.key,
            Some(e) => k >= self.key.as_str() && k < e.as_str(),
        }
    }
}

/// The first key after every key with prefix `p` (etcd's prefix range end).
pub fn prefix_end(p: &str) -> String {
    let mut b = p.as_bytes().to_vec();
    while let Some(last) = b.pop() {
        if last < 0x7f {
            b.push(last + 1);
            return String::from_utf8(b).expect("ascii increment");
        }
    }
    "\u{7f}".to_string()
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    Put {
        key: String,
        value: Vec<u8>,
        lease: LeaseId,
    },
    Delete(Range),
    Get(Range),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpResult {
    Put,
    /// Number of keys deleted.
    Delete(u64),
    Get(Vec<KeyValue>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResponse {
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: Revision,
    pub results: Vec<OpResult>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change; for a delete, `kv` is the deleted entry with `mod_revision`
/// set to the deleting revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("meta store: revision {asked} is compacted (oldest kept {oldest})")]
    Compacted { asked: Revision, oldest: Revision },
    #[error("meta store: lease {0} not found")]
    LeaseNotFound(LeaseId),
    /// A request the cluster map refuses; the text names the thing and
    /// the problem, for the user.
    #[error("{0}")]
    Invalid(String),
    #[error("meta store: watch ended: {0}")]
    WatchEnded(String),
    #[error("meta store is unreachable: {0}")]
    Unavailable(String),
    #[error("meta store storage: {0}")]
    Storage(String),
    /// A write fenced by a leader's election key, which it no longer holds.
    #[error("no longer the elected leader")]
    NotLeader,
}

pub type Result<T> = std::result::Result<T, MetaError>;

/// A stream of changes in revision order, from the watch's start revision.
pub struct Watch {
    pub(crate) rx: std::sync::mpsc::Receiver<Result<Vec<Event>>>,
    pub(crate) cancel: Option<Box<dyn FnOnce() + Send>>,
}

impl Watch {
    /// A watch whose batches arrive on `rx`; `cancel` runs when it is
    /// dropped (for backends outside this crate).
    pub fn new(
        rx: std::sync::mpsc::Receiver<Result<Vec<Event>>>,
        cancel: Option<Box<dyn FnOnce() + Send>>,
    ) -> Watch {
        Watch { rx, cancel }
    }

    /// The next batch of events (one revision's worth or more), waiting at
    /// most `timeout`; `Ok(None)` on timeout.
    pub fn next(&self, timeout: std::time::Duration) -> Result<Option<Vec<Event>>> {
        use std::sync::mpsc::RecvTimeoutError;
        match self.rx.recv_timeout(timeout) {
            Ok(r) => r.map(Some),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                Err(MetaError::WatchEnded("store closed".into()))
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(c) = self.cancel.take() {
            c()
        }
    }
}

/// The cluster-state store (etcd v3 in shape).
pub trait MetaStore: Send + Sync {
    fn range(&self, r: &Range) -> Result<(Vec<KeyValue>, Revision)>;
    fn txn(&self, t: Txn) -> Result<TxnResponse>;
    /// Changes to keys in `r` from `start` (0: from now on).
    fn watch(&self, r: &Range, start: Revision) -> Result<Watch>;
    fn lease_grant(&self, ttl_s: i64) -> Result<LeaseId>;
    /// Renews the lease; returns its TTL in seconds.
    fn lease_keepalive(&self, id: LeaseId) -> Result<i64>;
    /// Ends the lease and deletes its keys.
    fn lease_revoke(&self, id: LeaseId) -> Result<()>;
    /// Most operations one transaction may hold (etcd: 128).
    fn txn_ops_max(&self) -> usize {
        usize::MAX
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.range(&Range::key(key))?.0.into_iter().next())
    }

    fn put(&self, key: &str, value: Vec<u8>, lease: LeaseId) -> Result<Revision> {
        let t = Txn {
            success: vec![TxnOp::Put {
                key: key.to_string(),
                value,
                lease,
            }],
            ..Txn::default()
        };
        Ok(self.txn(t)?.revision)
    }

    fn delete(&self, r: &Range) -> Result<u64> {
        let t = Txn {
            success: vec![TxnOp::Delete(r.clone())],
            ..Txn::default()
        };
        match self.txn(t)?.results.first() {
            Some(OpResult::Delete(n)) => Ok(*n),
            other => Err(MetaError::Invalid(format!("delete answered {other:?}"))),
        }
    }
}
