//! One OSD's on-disk engine. See docs/internals/blockstore.md for the
//! format and the crash argument; each module opens with its own part.
//!
//! ```text
//! store       public API, shared state, write admission
//! writer      journal writer: group commit, applying records
//! read        read path and checksum verification
//! checkpoint  folding overlays, shadow-paged table writes, journal trim
//! replay      format, open, journal replay
//! journal     batch encoding and checks
//! pglog       per-PG logs: in memory, in records, in log slots
//! undo        undoable writes: what a write replaced, kept until released
//! format      on-disk structures and layout
//! index       object → block map and overlays
//! csum        checksum-table page cache
//! alloc       block allocator
//! ```

/// A check on a hot path: `assert!` with the `strict` feature (on in CI
/// and tests), `debug_assert!` otherwise.
macro_rules! strict_assert {
    ($($t:tt)*) => {
        if cfg!(feature = "strict") {
            assert!($($t)*)
        } else {
            debug_assert!($($t)*)
        }
    };
}
pub(crate) use strict_assert;

/// Whether this build checks invariants with panics (`strict`, on in CI
/// and tests): for crates above the store that assert their own.
pub const fn strict() -> bool {
    cfg!(feature = "strict")
}

mod alloc;
mod checkpoint;
mod csum;
mod cursor;
mod error;
pub mod format;
mod index;
pub mod journal;
mod oidtable;
pub mod pglog;
mod read;
mod replay;
mod store;
mod undo;
mod writer;

pub use error::{Error, Result};
pub use format::{Geometry, LogRegion};
pub use pglog::{LogEntry, LogOp, PgLog};
pub use replay::{random_uuid, read_label, uuid_string};
pub use store::{FormatOptions, Memory, OpenReport, Space, Stats, Store, StoreOptions};
pub use undo::Undo;
