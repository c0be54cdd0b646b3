//! NBD protocol constants and the parsers of what a peer sends.
//!
//! Everything is big-endian on the wire. Parsers take byte slices and
//! return typed values or a [`ProtoError`]; they never allocate from a
//! length the peer chose without checking it against a limit first.

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 2;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TFLAG_HAS_FLAGS: u16 = 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;

pub const CMD_FLAG_FUA: u16 = 1;
pub const CMD_FLAG_NO_HOLE: u16 = 2;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;

/// Largest option payload accepted in the handshake.
pub const OPTION_MAX_BYTES: u32 = 4096;
/// Largest read or write request (the protocol's customary 32 MiB).
pub const REQUEST_MAX_BYTES: u32 = 32 << 20;
/// A write larger than the limit but at most this is read and dropped
/// (answered EOVERFLOW); anything larger ends the connection.
pub const DISCARD_MAX_BYTES: u32 = 64 << 20;
pub const REQUEST_HEADER_BYTES: usize = 28;
pub const EXPORT_NAME_MAX_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("bad magic {0:#x}")]
    Magic(u64),
    #[error("option of {0} bytes exceeds {OPTION_MAX_BYTES}")]
    OptionTooBig(u32),
    #[error("malformed option: {0}")]
    Option(&'static str),
    #[error("client flags {0:#x} lack FIXED_NEWSTYLE")]
    ClientFlags(u32),
}

/// An option header (after the client's IHAVEOPT).
#[derive(Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

pub fn parse_option_header(b: &[u8; 16]) -> Result<OptionHeader, ProtoError> {
    let magic = u64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
    if magic != IHAVEOPT {
        return Err(ProtoError::Magic(magic));
    }
    let option = u32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
    let len = u32::from_be_bytes(b[12..16].try_into().expect("4 bytes"));
    if len > OPTION_MAX_BYTES {
        return Err(ProtoError::OptionTooBig(len));
    }
    Ok(OptionHeader { option, len })
}

pub fn parse_client_flags(b: [u8; 4]) -> Result<u32, ProtoError> {
    let f = u32::from_be_bytes(b);
    if f & CLIENT_FLAG_FIXED_NEWSTYLE == 0
        || f & !(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES) != 0
    {
        return Err(ProtoError::ClientFlags(f));
    }
    Ok(f)
}

/// The body of OPT_INFO / OPT_GO: export name and the info types asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct GoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

pub fn parse_go(data: &[u8]) -> Result<GoRequest, ProtoError> {
    let bad = ProtoError::Option;
    let nlen = u32::from_be_bytes(
        data.get(0..4)
            .ok_or(bad("short"))?
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    let name = data.get(4..4 + nlen).ok_or(bad("name past the end"))?;
    let rest = &data[4 + nlen..];
    let n = u16::from_be_bytes(
        rest.get(0..2)
            .ok_or(bad("no info count"))?
            .try_into()
            .expect("2 bytes"),
    ) as usize;
    let infos = rest
        .get(2..)
        .filter(|r| r.len() == 2 * n)
        .ok_or(bad("info count disagrees with length"))?;
    Ok(GoRequest {
        name: String::from_utf8(name.to_vec()).map_err(|_| bad("name is not UTF-8"))?,
        infos: infos
            .chunks(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
    })
}

/// A transmission-phase request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

pub fn parse_request(b: &[u8]) -> Result<Request, ProtoError> {
    assert_eq!(b.len(), REQUEST_HEADER_BYTES);
    let magic = u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"));
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::Magic(u64::from(magic)));
    }
    Ok(Request {
        flags: u16::from_be_bytes(b[4..6].try_into().expect("2 bytes")),
        kind: u16::from_be_bytes(b[6..8].try_into().expect("2 bytes")),
        cookie: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
        offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
        len: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
    })
}

pub fn encode_request(r: &Request) -> [u8; REQUEST_HEADER_BYTES] {
    let mut b = [0u8; REQUEST_HEADER_BYTES];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.len.to_be_bytes());
    b
}

pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// An option reply (server → client in the handshake).
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// Where an NBD URI points: `nbd+unix:///NAME?socket=PATH` or
/// `nbd://HOST[:PORT]/NAME`.
#[derive(Debug, PartialEq, Eq)]
pub struct Uri {
    pub addr: nacre_io::net::Addr,
    pub export: String,
}

pub fn parse_uri(s: &str) -> Result<Uri, String> {
    use nacre_io::net::Addr;
    if let Some(rest) = s.strip_prefix("nbd+unix://") {
        let rest = rest
            .strip_prefix('/')
            .ok_or("nbd+unix URI needs an empty host: nbd+unix:///NAME?socket=PATH")?;
        let (name, q) = rest
            .split_once('?')
            .ok_or("nbd+unix URI needs ?socket=PATH")?;
        let path = q
            .split('&')
            .find_map(|kv| kv.strip_prefix("socket="))
            .filter(|p| !p.is_empty())
            .ok_or("nbd+unix URI needs ?socket=PATH")?;
        return Ok(Uri {
            addr: Addr::Unix(path.into()),
            export: name.to_string(),
        });
    }
    if let Some(rest) = s.strip_prefix("nbd://") {
        let (hp, name) = rest.split_once('/').unwrap_or((rest, ""));
        if hp.is_empty() {
            return Err("nbd URI needs a host".into());
        }
        let hp = if hp
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hp.to_string()
        } else {
            format!("{hp}:10809")
        };
        return Ok(Uri {
            addr: Addr::Tcp(hp),
            export: name.to_string(),
        });
    }
    Err(format!(
        "{s:?} is not an NBD URI (nbd://HOST[:PORT]/NAME or nbd+unix:///NAME?socket=PATH)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_go_and_requests() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"vol");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        assert_eq!(
            parse_go(&d).unwrap(),
            GoRequest {
                name: "vol".into(),
                infos: vec![INFO_BLOCK_SIZE, INFO_NAME]
            }
        );
        assert!(parse_go(&d[..d.len() - 1]).is_err());
        assert!(parse_go(&[0, 0, 1, 0]).is_err());
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            cookie: 77,
            offset: 4096,
            len: 512,
        };
        assert_eq!(parse_request(&encode_request(&r)).unwrap(), r);
        let mut bad = encode_request(&r);
        bad[0] = 0;
        assert!(parse_request(&bad).is_err());
        let mut oh = [0u8; 16];
        oh[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        oh[12..16].copy_from_slice(&(OPTION_MAX_BYTES + 1).to_be_bytes());
        assert_eq!(
            parse_option_header(&oh),
            Err(ProtoError::OptionTooBig(OPTION_MAX_BYTES + 1))
        );
        assert!(parse_client_flags([0, 0, 0, 0]).is_err());
        assert!(parse_client_flags([0, 0, 0, 3]).is_ok());
        assert!(parse_client_flags([0, 0, 1, 1]).is_err());
    }

    #[test]
    fn parses_uris() {
        let u = parse_uri("nbd+unix:///disk?socket=/tmp/n.sock").unwrap();
        assert_eq!(u.export, "disk");
        assert_eq!(u.addr, nacre_io::net::Addr::Unix("/tmp/n.sock".into()));
        let u = parse_uri("nbd://127.0.0.1/disk").unwrap();
        assert_eq!(u.addr, nacre_io::net::Addr::Tcp("127.0.0.1:10809".into()));
        let u = parse_uri("nbd://localhost:1234/d").unwrap();
        assert_eq!(u.addr, nacre_io::net::Addr::Tcp("localhost:1234".into()));
        assert!(parse_uri("nbd+unix:///disk").is_err());
        assert!(parse_uri("http://x").is_err());
        assert!(parse_uri("nbd:///x").is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse_go(&b);
            if b.len() >= 16 {
                let _ = parse_option_header(b[..16].try_into().unwrap());
            }
            if b.len() >= REQUEST_HEADER_BYTES {
                let _ = parse_request(&b[..REQUEST_HEADER_BYTES]);
            }
            let _ = parse_uri(&String::from_utf8_lossy(&b));
        }
    }
}
