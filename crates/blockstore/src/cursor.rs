//! The journal's positions, and what is known durable, in one owner.
//!
//! Positions are logical (they only grow; the ring position is the
//! logical one modulo the journal's size). Relations, asserted under
//! `strict` whenever a position moves live (replay builds the cursor from
//! what it finds, and may set `head` back to a torn batch, before any of
//! this holds):
//!
//! - `tail ≤ completed ≤ head`: the committed checkpoint replays from at
//!   or before the last batch applied, which was written;
//! - `head − tail ≤ ring`: the journal never holds more than its size;
//! - `recorded_synced ≤ synced_upto ≤ head`: a header records only what
//!   was durable when it was written, and only written bytes are durable;
//! - `head`, `tail`, `completed` and `synced_upto` never go back.

pub(crate) struct Cursor {
    /// The journal ring's size in bytes.
    pub ring: u64,
    /// Next logical journal position to write.
    pub head: u64,
    /// End of the last batch applied to the index.
    pub completed: u64,
    /// Replay start of the committed checkpoint.
    pub tail: u64,
    /// The journal's generation: batches of an older one are stale.
    pub gen: u64,
    /// Everything written before this position is durable.
    pub synced_upto: u64,
    /// Batches were completed without an fsync since the last one.
    pub unsynced: bool,
    /// The `synced_upto` carried by the newest batch header on disk: what
    /// replay will know is durable.
    pub recorded_synced: u64,
}

impl Cursor {
    /// Bytes of the ring in use, from the tail to the head.
    pub fn used(&self) -> u64 {
        self.head - self.tail
    }

    /// Claims the journal up to `to` (a batch's end, or past a lap's end).
    pub fn advance_head(&mut self, to: u64) {
        strict_assert!(
            to >= self.head,
            "journal head back from {} to {to}",
            self.head
        );
        self.head = to;
        self.check();
    }

    /// A batch ending at `end` is applied to the index.
    pub fn complete(&mut self, end: u64) {
        self.completed = self.completed.max(end);
        self.check();
    }

    /// Everything before `upto` is durable (an fsync covered it, or the
    /// device commits at once).
    pub fn synced(&mut self, upto: u64) {
        self.synced_upto = self.synced_upto.max(upto);
        self.unsynced = false;
        self.check();
    }

    /// A batch header recording `synced` as durable is on disk.
    pub fn recorded(&mut self, synced: u64) {
        self.recorded_synced = self.recorded_synced.max(synced);
        self.check();
    }

    /// A checkpoint committed: replay starts at `to` from now on.
    pub fn raise_tail(&mut self, to: u64) {
        strict_assert!(
            to >= self.tail,
            "journal tail back from {} to {to}",
            self.tail
        );
        self.tail = to;
        self.check();
    }

    /// Asserts the relations of the module's header (under `strict`).
    pub fn check(&self) {
        let Cursor {
            ring,
            head,
            completed,
            tail,
            synced_upto,
            recorded_synced,
            ..
        } = *self;
        strict_assert!(
            tail <= completed && completed <= head,
            "journal positions out of order: tail {tail}, completed {completed}, head {head}"
        );
        strict_assert!(
            head - tail <= ring,
            "journal holds {} bytes of a {ring}-byte ring",
            head - tail
        );
        strict_assert!(
            recorded_synced <= synced_upto && synced_upto <= head,
            "journal durability out of order: recorded {recorded_synced}, synced {synced_upto}, head {head}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor() -> Cursor {
        Cursor {
            ring: 1 << 20,
            head: 8192,
            completed: 8192,
            tail: 4096,
            gen: 1,
            synced_upto: 8192,
            unsynced: false,
            recorded_synced: 4096,
        }
    }

    #[test]
    fn positions_move_forward_together() {
        let mut c = cursor();
        c.advance_head(12288);
        c.recorded(8192);
        c.complete(12288);
        c.synced(12288);
        c.raise_tail(12288);
        assert_eq!((c.used(), c.completed, c.synced_upto), (0, 12288, 12288));
    }

    #[test]
    #[should_panic(expected = "journal tail back")]
    fn the_tail_never_goes_back() {
        let mut c = cursor();
        c.raise_tail(0);
    }

    #[test]
    #[should_panic(expected = "journal positions out of order")]
    fn the_tail_never_passes_what_was_applied() {
        let mut c = cursor();
        c.advance_head(16384);
        c.raise_tail(12288);
    }

    #[test]
    #[should_panic(expected = "journal holds")]
    fn the_journal_never_holds_more_than_its_ring() {
        let mut c = cursor();
        c.advance_head(4096 + (1 << 20) + 4096);
    }

    #[test]
    #[should_panic(expected = "journal durability out of order")]
    fn nothing_unwritten_is_durable() {
        let mut c = cursor();
        c.synced(16384);
    }
}
