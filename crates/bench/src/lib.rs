//! Nacre's benchmarks: closed-loop load generation (`load`), latency
//! histograms and CPU accounting (`stats`), and the store-versus-raw-disk
//! suite behind `nacre store bench` (`store_bench`), and the disk tests
//! behind `nacre disk check` (`disk_check`), and pictures of runs
//! (`plot`). Benchmarks print tables; tests never assert on their numbers.

pub mod disk_check;
pub mod load;
pub mod plot;
pub mod stats;
pub mod store_bench;
pub mod suite;
