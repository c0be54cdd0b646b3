//! The request tasks of a server connection (`Inflight`): cancelled, they
//! stop at their next await, free their slots, and none starts after.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use nacre_io::rt;
use nacre_net::Inflight;

/// Counts its drops.
struct Dropped(Rc<Cell<u32>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.set(self.0.get() + 1);
    }
}

#[test]
fn cancelled_tasks_stop_at_their_next_await() {
    rt::block_on_virtual(async {
        let inflight = Inflight::new(3);
        let (dropped, finished) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
        for k in 0..3u64 {
            let (d, f) = (dropped.clone(), finished.clone());
            inflight.spawn(async move {
                let _held = Dropped(d);
                rt::sleep(Duration::from_secs(60 * (k + 1))).await;
                f.set(f.get() + 1);
            });
        }
        let slot = Duration::from_secs(1);
        assert!(
            rt::timeout(slot, inflight.slot()).await.is_none(),
            "three tasks of three: no slot"
        );
        assert_eq!((finished.get(), dropped.get()), (0, 0));
        inflight.cancel();
        assert!(
            rt::timeout(slot, inflight.slot()).await.is_some(),
            "cancelled tasks keep their slots"
        );
        assert_eq!(
            (finished.get(), dropped.get()),
            (0, 3),
            "every waiting task dropped, none finished"
        );
        let f = finished.clone();
        inflight.spawn(async move { f.set(f.get() + 1) });
        rt::sleep(Duration::from_secs(1)).await;
        assert_eq!(finished.get(), 0, "a task spawned after the cancel ran");
    });
}

/// Without a cancel, tasks run to their end.
#[test]
fn uncancelled_tasks_run_to_their_end() {
    rt::block_on_virtual(async {
        let inflight = Inflight::new(3);
        let finished = Rc::new(Cell::new(0));
        for k in 0..3u64 {
            let f = finished.clone();
            inflight.spawn(async move {
                rt::sleep(Duration::from_secs(k + 1)).await;
                f.set(f.get() + 1);
            });
        }
        rt::sleep(Duration::from_secs(5)).await;
        assert_eq!(finished.get(), 3);
    });
}
