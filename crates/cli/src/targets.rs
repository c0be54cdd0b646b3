//! The block targets `nacre bench` and `nacre demo` measure: a volume
//! through the client library, an NBD export (a local file's is
//! `nacre_bench::suite::FileTarget`).

use std::rc::Rc;

use nacre_bench::suite::{BlockTarget, BoxFut};
use nacre_client::Volume;
use nacre_io::AlignedBuf;
use nacre_nbd::client::NbdClient;

pub struct VolumeTarget(pub Rc<Volume>);

impl BlockTarget for VolumeTarget {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read(&self, offset: u64, len: u32) -> BoxFut<()> {
        let v = self.0.clone();
        Box::pin(async move { Ok(v.read(offset, u64::from(len)).await.map(drop)?) })
    }
    /// Every acknowledged volume write is durable on all replicas.
    fn write(&self, offset: u64, data: AlignedBuf, _durable: bool) -> BoxFut<()> {
        let v = self.0.clone();
        Box::pin(async move { Ok(v.write(offset, data).await?) })
    }
}

pub struct NbdTarget(pub Rc<NbdClient>);

impl BlockTarget for NbdTarget {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes
    }
    fn read(&self, offset: u64, len: u32) -> BoxFut<()> {
        let c = self.0.clone();
        Box::pin(async move { Ok(c.read(offset, len).await.map(drop)?) })
    }
    /// Durable writes carry FUA.
    fn write(&self, offset: u64, data: AlignedBuf, durable: bool) -> BoxFut<()> {
        let c = self.0.clone();
        Box::pin(async move { Ok(c.write(offset, data, durable).await?) })
    }
}
