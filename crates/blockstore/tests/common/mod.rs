//! Helpers shared by the store's integration tests.

use nacre_blockstore::{OpenReport, Store, StoreOptions};
use nacre_io::BlockDev;

/// Drops `s` (after a checkpoint if `checkpoint`: what it changed is then
/// read from the tables, else replayed from the journal) and opens the
/// store on `dev` again.
pub async fn reopen<D: BlockDev + Clone + 'static>(
    s: Store<D>,
    dev: &D,
    checkpoint: bool,
) -> (Store<D>, OpenReport) {
    if checkpoint {
        s.checkpoint().await.unwrap();
    }
    drop(s);
    Store::open(dev.clone(), StoreOptions::default())
        .await
        .unwrap()
}
