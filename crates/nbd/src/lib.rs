//! NBD: the block frontend. [`proto`] holds the protocol's constants and
//! parsers (pure, fuzzed), [`server`] the gateway that serves volumes,
//! [`sessions`] its open connections as the cluster sees them (for `volume
//! rm` and shrinks of volumes in use), [`client`] a small client for
//! `nacre bench --nbd` and tests, [`metrics`] its counters.
//!
//! Protocol reference: the NBD project's `doc/proto.md` (newstyle fixed
//! handshake, simple replies). Written here; no code taken from others.

pub mod client;
pub mod metrics;
pub mod proto;
pub mod server;
pub mod sessions;
