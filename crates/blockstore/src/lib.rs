//! One OSD's on-disk engine. See docs/internals/blockstore.md for the
//! format and the crash argument; each module opens with its own part.
//!
//! ```text
//! undoable    undoable writes' API, over the write path
//! store       public API, write admission
//! replay      format, open, journal replay
//! checkpoint  folding overlays, shadow-paged table writes, journal trim
//! writer      journal writer: group commit, applying records
//! read        read path and checksum verification
//! state       the shared state, its parts, and what every task uses
//! undo        what undoable writes replaced, kept until released
//! journal     batch encoding and checks
//! pglog       per-PG logs: in memory, in records, in log slots
//! index       object → block map and overlays
//! csum        checksum-table page cache
//! oidtable    object id → block, open addressing
//! cursor      the journal's positions
//! alloc       block allocator
//! format      on-disk structures and layout
//! error       the store's errors
//! ```
//!
//! Each module names only modules below it in this list
//! (`tests/layers.rs`).

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
mod state;
mod store;
mod undo;
mod undoable;
mod writer;

pub use error::{Error, Result};
pub use format::{Geometry, LogRegion};
pub use pglog::{LogEntry, LogOp, PgLog};
pub use replay::{random_uuid, read_label, uuid_string, FormatOptions, OpenReport};
pub use state::{Stats, Store, StoreOptions};
pub use store::{Memory, Space};
pub use undo::Undo;
