//! The cluster map, reloaded off the data path.
//!
//! An op that finds its map stale (`StaleEpoch`, `NotPrimary`, a primary
//! that is gone) asks for a newer one and goes on retrying with what it
//! has; a thread of its own loads the map from the meta store and leaves
//! it for the runtime to take at its next attempt. So no I/O waits on the
//! meta store: during an etcd election, or with a member that does not
//! answer, I/O whose map is right goes on, and I/O whose map is wrong
//! retries until a load gets through (DESIGN.md: the data path never
//! waits on the meta store).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use nacre_meta::map::{self, ClusterMap};
use nacre_meta::MetaStore;

/// How long the loader sleeps between failed loads while a reload is
/// still wanted.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

#[derive(Default)]
struct State {
    /// A reload was asked for and not yet done.
    wanted: bool,
    /// The newest map loaded and not yet taken, or the last load's error.
    loaded: Option<Result<ClusterMap, String>>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    asked: Condvar,
    /// Whether `loaded` holds something: lets the runtime look without
    /// the lock on every attempt.
    ready: AtomicBool,
}

/// The map loader of one [`Cluster`](crate::Cluster); its thread ends when
/// this is dropped.
pub(crate) struct MapFeed {
    shared: Arc<Shared>,
}

impl MapFeed {
    pub(crate) fn start(meta: Arc<dyn MetaStore>) -> std::io::Result<MapFeed> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            asked: Condvar::new(),
            ready: AtomicBool::new(false),
        });
        let sh = shared.clone();
        std::thread::Builder::new()
            .name("map-feed".into())
            .spawn(move || load_loop(&sh, &*meta))?;
        Ok(MapFeed { shared })
    }

    /// Asks for a reload; returns at once.
    pub(crate) fn ask(&self) {
        let mut st = self.shared.state.lock().expect("feed lock");
        if !st.wanted {
            st.wanted = true;
            self.shared.asked.notify_one();
        }
    }

    /// What the loader has got since the last call: a map, or why the
    /// last load failed; `None` if it has nothing new.
    pub(crate) fn take(&self) -> Option<Result<ClusterMap, String>> {
        if !self.shared.ready.load(Ordering::Acquire) {
            return None;
        }
        let mut st = self.shared.state.lock().expect("feed lock");
        self.shared.ready.store(false, Ordering::Release);
        st.loaded.take()
    }
}

impl Drop for MapFeed {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().expect("feed lock");
        st.stop = true;
        self.shared.asked.notify_one();
    }
}

fn load_loop(sh: &Shared, meta: &dyn MetaStore) {
    loop {
        {
            let mut st = sh.state.lock().expect("feed lock");
            while !st.wanted && !st.stop {
                st = sh.asked.wait(st).expect("feed lock");
            }
            if st.stop {
                return;
            }
            st.wanted = false;
        }
        let got = map::load(meta).map_err(|e| e.to_string());
        let failed = got.is_err();
        let mut st = sh.state.lock().expect("feed lock");
        // A map beats an error; a newer map beats an older one.
        let keep_old = match (&st.loaded, &got) {
            (Some(Ok(old)), Ok(new)) => old.revision > new.revision,
            (Some(Ok(_)), Err(_)) => true,
            _ => false,
        };
        if !keep_old {
            st.loaded = Some(got);
        }
        sh.ready.store(true, Ordering::Release);
        if failed {
            // Asked again by then if the map is still wanted.
            drop(st);
            std::thread::sleep(RETRY_PAUSE);
        }
    }
}
