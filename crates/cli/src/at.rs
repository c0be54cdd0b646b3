//! Where a command finds its cluster: `--dir DIR` for one running on this
//! machine (`nacre up`), `--etcd URLS [--prefix P]` for one on many hosts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use nacre_io::net::Addr;
use nacre_io::{rt, AlignedBuf};
use nacre_meta::remote::Remote;
use nacre_meta::{map, MetaStore};

use crate::cluster;

/// The prefix of a cluster's keys in etcd when `--prefix` is not given.
pub const PREFIX_DEFAULT: &str = "/nacre/";

/// A cluster on many hosts: its etcd and its keys' prefix there.
#[derive(Args, Clone, Debug)]
pub struct EtcdArgs {
    /// The cluster's etcd: its client URLs, comma-separated, e.g.
    /// http://10.0.0.1:2379,http://10.0.0.2:2379.
    #[arg(long)]
    pub etcd: String,
    /// Where the cluster's keys live in etcd: one path component between
    /// slashes, so that two clusters can share one etcd.
    #[arg(long, default_value = PREFIX_DEFAULT)]
    pub prefix: String,
}

impl EtcdArgs {
    pub fn meta(&self) -> anyhow::Result<Arc<dyn MetaStore>> {
        self.meta_with(Duration::from_millis(nacre_etcd::ETCD_CALL_TIMEOUT_MS))
    }

    /// [`EtcdArgs::meta`] with another deadline per call.
    pub fn meta_with(&self, timeout: Duration) -> anyhow::Result<Arc<dyn MetaStore>> {
        let e = nacre_etcd::Etcd::connect_with(&self.etcd, &self.prefix, timeout)
            .with_context(|| format!("etcd at {}", self.etcd))?;
        Ok(e)
    }

    /// [`EtcdArgs::meta`] for a daemon: while no member answers (etcd
    /// starting, restarting, cut off), it waits instead of exiting.
    pub fn meta_waiting(&self) -> anyhow::Result<Arc<dyn MetaStore>> {
        crate::daemons::wait_for("etcd", || self.meta().map(Some))
    }
}

/// Either cluster.
#[derive(Args, Clone, Debug)]
pub struct At {
    /// The directory of a cluster running on this machine (`nacre up
    /// --dir`).
    #[arg(long, required_unless_present = "etcd", conflicts_with = "etcd")]
    pub dir: Option<PathBuf>,
    /// The etcd of a cluster on many hosts: its client URLs,
    /// comma-separated, e.g. http://10.0.0.1:2379,http://10.0.0.2:2379.
    #[arg(long)]
    pub etcd: Option<String>,
    /// With --etcd: where the cluster's keys live in etcd.
    #[arg(long, default_value = PREFIX_DEFAULT)]
    pub prefix: String,
}

impl At {
    pub fn of_dir(dir: &std::path::Path) -> At {
        At {
            dir: Some(dir.to_path_buf()),
            etcd: None,
            prefix: PREFIX_DEFAULT.into(),
        }
    }

    /// The cluster's meta store.
    pub fn meta(&self) -> anyhow::Result<Arc<dyn MetaStore>> {
        match (&self.dir, &self.etcd) {
            (Some(dir), _) => {
                let r = Remote::connect(&cluster::meta_socket(dir)).map_err(|e| {
                    anyhow::anyhow!(
                        "no cluster running in {} ({e}); start one with: nacre up --dir {}",
                        dir.display(),
                        dir.display()
                    )
                })?;
                Ok(Arc::new(r))
            }
            (None, Some(urls)) => EtcdArgs {
                etcd: urls.clone(),
                prefix: self.prefix.clone(),
            }
            .meta(),
            (None, None) => bail!("give --dir DIR or --etcd URLS"),
        }
    }

    /// The cluster, as error messages name it.
    pub fn name(&self) -> String {
        match (&self.dir, &self.etcd) {
            (Some(d), _) => format!("the cluster in {}", d.display()),
            (None, Some(u)) => format!("the cluster at {u} (prefix {})", self.prefix),
            _ => "the cluster".into(),
        }
    }

    /// Where the cluster map's leader listens.
    pub fn leader(&self, meta: &dyn MetaStore) -> anyhow::Result<Addr> {
        match &self.dir {
            Some(d) => Ok(cluster::leader_addr(&std::path::absolute(d)?)),
            None => elected_leader(meta)?
                .with_context(|| format!("no monitor leads {}: start nacre mon", self.name())),
        }
    }
}

/// The elected monitor's address, if one leads.
pub fn elected_leader(meta: &dyn MetaStore) -> anyhow::Result<Option<Addr>> {
    let Some(kv) = meta.get(map::MON_LEADER_KEY)? else {
        return Ok(None);
    };
    let a = map::leader_addr_of(&kv.value).context("the leader key holds no address")?;
    Ok(Some(a.parse().map_err(anyhow::Error::msg)?))
}

/// A request about one OSD to the cluster map's leader: `op` about OSD
/// `id`, with `arg` (the header's version field) and `body`.
pub struct Ask<'a> {
    pub op: nacre_wire::Op,
    pub id: u32,
    pub arg: u64,
    pub body: Option<&'a [u8]>,
}

/// Sends `q` to the leader at `addr`; its refusal's reason ([`Refused`]),
/// if it refuses.
pub async fn ask_leader(addr: &Addr, q: &Ask<'_>) -> anyhow::Result<()> {
    let c = nacre_net::Conn::connect_with_timeout(addr, Duration::from_secs(10))?;
    let mut h = nacre_wire::Header::request(q.op, 0, nacre_types::ObjectId::default());
    h.sender = q.id;
    h.obj_version = q.arg;
    let payload = q.body.map(AlignedBuf::from_slice);
    if let Some(b) = q.body {
        h = h.with_payload(b);
    }
    let r = c.call(h, payload).await?;
    if r.h.status == nacre_wire::Status::Unavailable {
        // A leader stepping down, or not yet serving: not a refusal.
        bail!("the leader at {addr} does not serve (Unavailable)");
    }
    if r.h.status != nacre_wire::Status::Ok {
        let why = r.payload.as_deref().map(String::from_utf8_lossy);
        let why = (why.as_deref().map(str::to_string))
            .unwrap_or_else(|| format!("refused by the leader: {:?}", r.h.status));
        return Err(Refused(why).into());
    }
    Ok(())
}

/// The leader answered, and said no.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// [`ask_leader`] of the leader `leader` names, again while no leader
/// answers (one elected is starting, or another is taking over), for up to
/// `LEADER_WAIT`; a refusal is final.
pub async fn ask_leader_retrying(
    leader: &nacre_osd::LeaderAddr,
    q: &Ask<'_>,
) -> anyhow::Result<()> {
    let t0 = rt::monotonic();
    loop {
        match ask_leader(&leader.get(), q).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is::<Refused>() || rt::monotonic() - t0 > LEADER_WAIT => return Err(e),
            Err(e) => tracing::debug!("the leader: {e:#}; trying again"),
        }
        rt::sleep(Duration::from_millis(200)).await;
    }
}

/// How long a daemon tries to reach a leader that does not answer.
const LEADER_WAIT: Duration = Duration::from_secs(60);

/// [`ask_leader`] from outside a runtime.
pub fn ask_leader_now(addr: &Addr, q: &Ask<'_>) -> anyhow::Result<()> {
    rt::block_on(ask_leader(addr, q)).with_context(|| format!("the cluster leader at {addr}"))
}
