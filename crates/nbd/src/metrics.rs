//! The gateway's counters for `--metrics` endpoints: requests by command,
//! their errors, bytes and latencies, requests and connections open. The
//! serving thread adds to them; a scrape reads them from another thread.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use nacre_types::metrics::{Histogram, HistogramSnapshot};

use crate::proto::{CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES};

/// The commands counted apart; every other one counts as `other` (each is
/// refused with EINVAL).
pub const COMMANDS: [&str; 6] = ["read", "write", "flush", "trim", "write_zeroes", "other"];

fn slot(kind: u16) -> usize {
    match kind {
        CMD_READ => 0,
        CMD_WRITE => 1,
        CMD_FLUSH => 2,
        CMD_TRIM => 3,
        CMD_WRITE_ZEROES => 4,
        _ => 5,
    }
}

#[derive(Default)]
struct Command {
    count: AtomicU64,
    errors: AtomicU64,
    /// Data bytes: read back for a read, brought for a write.
    bytes: AtomicU64,
    latency: Histogram,
}

/// A request in flight ([`NbdMetrics::request_began`]).
pub struct InFlight(Arc<NbdMetrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

#[derive(Default)]
pub struct NbdMetrics {
    commands: [Command; COMMANDS.len()],
    in_flight: AtomicU64,
    connections: AtomicU64,
    connections_total: AtomicU64,
}

/// One command's counters, read at one moment.
#[derive(Clone, Debug, Default)]
pub struct CommandSnapshot {
    pub name: &'static str,
    pub count: u64,
    pub errors: u64,
    pub bytes: u64,
    pub latency: HistogramSnapshot,
}

/// [`NbdMetrics`] read at one moment.
#[derive(Clone, Debug, Default)]
pub struct NbdSnapshot {
    pub commands: Vec<CommandSnapshot>,
    /// Requests read and not yet answered.
    pub in_flight: u64,
    /// Connections open now, and accepted since the start.
    pub connections: u64,
    pub connections_total: u64,
}

impl NbdMetrics {
    /// A request of command `kind` was answered (`errno` 0: success)
    /// after `took`, moving `bytes` of data.
    pub fn answered(&self, kind: u16, errno: u32, bytes: u64, took: Duration) {
        let c = &self.commands[slot(kind)];
        c.count.fetch_add(1, Relaxed);
        if errno != 0 {
            c.errors.fetch_add(1, Relaxed);
        }
        c.bytes.fetch_add(bytes, Relaxed);
        c.latency.record(took.as_micros() as u64);
    }

    /// A request was read: counted in flight until the guard is dropped.
    pub fn request_began(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight(self.clone())
    }

    pub fn connection_opened(&self) {
        self.connections.fetch_add(1, Relaxed);
        self.connections_total.fetch_add(1, Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections.fetch_sub(1, Relaxed);
    }

    pub fn snapshot(&self) -> NbdSnapshot {
        NbdSnapshot {
            commands: (COMMANDS.iter().zip(&self.commands))
                .map(|(&name, c)| CommandSnapshot {
                    name,
                    count: c.count.load(Relaxed),
                    errors: c.errors.load(Relaxed),
                    bytes: c.bytes.load(Relaxed),
                    latency: c.latency.snapshot(),
                })
                .collect(),
            in_flight: self.in_flight.load(Relaxed),
            connections: self.connections.load(Relaxed),
            connections_total: self.connections_total.load(Relaxed),
        }
    }
}
