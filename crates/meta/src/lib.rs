//! The cluster-state store and the cluster map kept in it.
//!
//! [`MetaStore`] has the shape of etcd's v3 API — revisioned keys, ranges,
//! compare-and-swap transactions, watches from a revision, leases — so the
//! etcd backend (a later issue) is a thin translation. Two backends here:
//! - [`embedded::Embedded`]: in-process, persisted to a log under the
//!   cluster's data dir (the one-machine default);
//! - [`remote::Remote`]: the same API over a unix socket served by the
//!   process that owns the embedded store, so CLI commands reach a running
//!   `nacre up`.
//!
//! The calls block: the meta store is the control plane, never on the data
//! path. Data-plane threads read the map once and on change.

pub mod embedded;
pub mod map;
pub mod remote;
mod types;

pub use types::*;
