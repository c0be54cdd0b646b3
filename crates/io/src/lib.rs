//! Nacre's I/O layer: the runtime facade (`rt`), aligned buffers (`buf`),
//! and the [`BlockDev`] trait with its backends — io_uring and pread/pwrite
//! on files or raw devices (`file`), in memory (`mem`), and fault-injecting
//! (`fault`). The blockstore reaches disks only through this crate.

pub mod buf;
pub mod dev;
pub mod fault;
pub mod file;
pub mod mem;
pub mod net;
pub mod rt;
pub mod sync;

pub use buf::{AlignedBuf, SendBuf, SharedBuf};
pub use dev::BlockDev;
pub use fault::FaultDev;
pub use file::{FileDev, OpenFlags};
pub use mem::MemDev;
