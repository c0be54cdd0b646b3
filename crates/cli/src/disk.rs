//! `nacre disk check`: the disk tests before a device is trusted with an
//! OSD (`nacre_bench::disk_check` runs them).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use nacre_bench::disk_check::{self, DiskCheckOpts};

use crate::{args, Format};

#[derive(clap::Subcommand)]
pub enum DiskCmd {
    /// Test a disk: 4 MiB linear write and read, 4 KiB random reads and
    /// writes at QD128 and QD1, durable 4 KiB writes at QD1 (fsync and
    /// O_DSYNC, the worse counts); says whether it behaves as if it has
    /// power-loss protection and recommends the store's immediate_commit.
    /// PATH is a block device, or a directory or file whose file system is
    /// tested on a scratch file (removed after). A device holding a file
    /// system, a partition table, a store or any data is refused unless
    /// --destructive; its first MiB is never tested.
    Check {
        /// A block device, or a directory or file whose file system is
        /// tested (on a scratch file created there).
        path: PathBuf,
        /// Bytes to test over (a scratch file's size; on a device, at most
        /// the device past its first MiB).
        #[arg(long, value_parser = args::parse_size, default_value = "1G")]
        size: u64,
        /// How long each of the eight tests runs.
        #[arg(long, value_parser = args::parse_duration, default_value = "5s")]
        runtime: Duration,
        /// Write to a block device that holds something (named before it is
        /// destroyed; its first MiB zeroed after).
        #[arg(long)]
        destructive: bool,
        /// Output: a table for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

pub fn run(cmd: DiskCmd) -> anyhow::Result<()> {
    match cmd {
        DiskCmd::Check {
            path,
            size,
            runtime,
            destructive,
            format,
        } => {
            let report = disk_check::run(&DiskCheckOpts {
                path,
                size_bytes: size,
                runtime,
                destructive,
                progress: format == Format::Table && std::io::stderr().is_terminal(),
            })?;
            match format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                Format::Table => print!("{}", disk_check::table(&report)),
            }
            Ok(())
        }
    }
}
