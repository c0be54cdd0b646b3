//! The store's error type: operational failures are values, with enough
//! context to act on.

use nacre_types::ObjectId;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("object {object}: version {given} is older than the stored {current}")]
    StaleVersion {
        object: ObjectId,
        given: u64,
        current: u64,
    },
    #[error("object {0} not found")]
    NotFound(ObjectId),
    #[error("no space left in the store")]
    NoSpace,
    #[error("checksum mismatch: {0}")]
    Corrupt(String),
    /// A read whose data maintenance kept moving while it ran, every time
    /// it was tried: nothing says the data is damaged; try again.
    #[error("busy: {0}")]
    Busy(String),
    #[error("not a Nacre store: {0}")]
    NotAStore(String),
    #[error("store format version {found} is not supported (this build reads {supported})")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("wrong store: expected {expected}, found {found}")]
    WrongStore { expected: String, found: String },
    #[error("device too small: {have} bytes, need at least {need}")]
    DeviceTooSmall { have: u64, need: u64 },
    #[error("every one of the store's {slots} PG log slots is taken (format the store with more)")]
    PgLogsFull { slots: u32 },
    #[error("store stopped after an I/O error and accepts no more writes: {0}")]
    Failed(String),
    /// Internal: the journal has no room for a batch until a checkpoint.
    #[error("journal full")]
    JournalFull,
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
