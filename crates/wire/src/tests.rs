use super::*;
use proptest::prelude::*;

fn write_req() -> (Header, Vec<u8>) {
    let data = vec![0xabu8; 4096];
    let mut h = Header::request(Op::Write, 42, ObjectId::new(7, 9)).with_payload(&data);
    h.offset = 8192;
    h.length = 4096;
    h.epoch = 3;
    h.client = 0x1122;
    h.pg = 5;
    h.pool = 2;
    (h, data)
}

#[test]
fn round_trip() {
    let (h, data) = write_req();
    let mut buf = [0u8; HEADER_BYTES];
    h.encode(&mut buf);
    let back = Header::decode(&buf).unwrap();
    assert_eq!(back, h);
    back.check_payload(&data).unwrap();
    let r = back.reply(Status::Ok);
    r.encode(&mut buf);
    assert_eq!(Header::decode(&buf).unwrap(), r);
}

/// The layout is part of the protocol: these bytes must never change
/// meaning within protocol version 7 (whose primaries skip demoted
/// members and whose heartbeats carry figures; version 6 served
/// erasure-coded pools; version 5 had the leader grant a read lease in the `length` of its
/// `Ping` and `Boot` answers; version 4 gave
/// client ops a conditional `obj_version` and added `List`; version 3 put the PG's pool and a
/// reserved word after the PG number; version 2 turned version 1's
/// reserved word into the sub-op sender).
#[test]
fn golden_vector() {
    let mut h = Header::request(Op::Read, 0x0102_0304_0506_0708, ObjectId::new(0x11, 0x22));
    h.offset = 512;
    h.length = 4096;
    h.epoch = 9;
    h.pg = 0x33;
    h.pool = 0x55;
    h.client = 0x44;
    let mut buf = [0u8; HEADER_BYTES];
    h.encode(&mut buf);
    assert_eq!(&buf[0..8], b"NACR\x07\x01\x00\x00");
    assert_eq!(&buf[12..16], &0x33u32.to_le_bytes());
    assert_eq!(&buf[16..20], &0x55u32.to_le_bytes());
    assert_eq!(&buf[20..24], &[0; 4]);
    assert_eq!(&buf[24..32], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&buf[32..40], &0x44u64.to_le_bytes());
    assert_eq!(&buf[40..48], &0x11u64.to_le_bytes());
    assert_eq!(&buf[48..56], &0x22u64.to_le_bytes());
    assert_eq!(&buf[56..60], &512u32.to_le_bytes());
    assert_eq!(&buf[60..64], &4096u32.to_le_bytes());
    assert_eq!(&buf[64..72], &9u64.to_le_bytes());
    assert_eq!(&buf[88..92], &u32::MAX.to_le_bytes());
    let crc = crc32c(&buf[..92]);
    assert_eq!(&buf[92..96], &crc.to_le_bytes());
    // A request's pool is its object's.
    let oid = ObjectId {
        volume: nacre_types::VolumeId::new(7, 1),
        block: 0,
    };
    assert_eq!(Header::request(Op::Read, 1, oid).pool, 7);
    let pg = PgId::new(3, 9);
    assert_eq!(Header::request(Op::PgQuery, 1, oid).with_pg(pg).pg_id(), pg);
}

#[test]
fn rejects_each_bad_field() {
    let (h, data) = write_req();
    let mut good = [0u8; HEADER_BYTES];
    h.encode(&mut good);
    let reseal = |b: &mut [u8; HEADER_BYTES]| {
        let c = crc32c(&b[..92]);
        b[92..96].copy_from_slice(&c.to_le_bytes());
    };
    let mut b = good;
    b[0] = b'X';
    assert!(matches!(Header::decode(&b), Err(WireError::Magic(_))));
    let mut b = good;
    b[4] = 1;
    assert_eq!(Header::decode(&b), Err(WireError::Version(1)));
    let mut b = good;
    b[30] ^= 1;
    assert_eq!(Header::decode(&b), Err(WireError::HeaderCrc));
    let mut b = good;
    b[21] = 1;
    reseal(&mut b);
    assert_eq!(Header::decode(&b), Err(WireError::Reserved(0x100)));
    // The pool survives the round trip.
    assert_eq!(Header::decode(&good).map(|h| h.pool), Ok(2));
    let mut b = good;
    b[5] = 99;
    reseal(&mut b);
    assert_eq!(Header::decode(&b), Err(WireError::Op(99)));
    let mut b = good;
    b[6] = 0x80;
    reseal(&mut b);
    assert_eq!(Header::decode(&b), Err(WireError::Flags(0x80)));
    let mut b = good;
    b[8] = 200;
    reseal(&mut b);
    assert_eq!(Header::decode(&b), Err(WireError::Status(200)));
    // The sender survives the round trip.
    let mut b = good;
    b[88..92].copy_from_slice(&7u32.to_le_bytes());
    reseal(&mut b);
    assert_eq!(Header::decode(&b).map(|h| h.sender), Ok(7));
    // payload longer than an object
    let mut b = good;
    b[80..84].copy_from_slice(&(PAYLOAD_MAX_BYTES + 1).to_le_bytes());
    reseal(&mut b);
    assert!(matches!(
        Header::decode(&b),
        Err(WireError::PayloadLen { .. })
    ));
    // unaligned range
    let mut b = good;
    b[56..60].copy_from_slice(&100u32.to_le_bytes());
    reseal(&mut b);
    assert!(matches!(Header::decode(&b), Err(WireError::Range { .. })));
    // range past the largest object
    let mut b = good;
    b[56..60].copy_from_slice(&BLOCK_BYTES_MAX.to_le_bytes());
    reseal(&mut b);
    assert!(matches!(Header::decode(&b), Err(WireError::Range { .. })));
    assert!(matches!(
        Header::decode(&good[..40]),
        Err(WireError::Short(40))
    ));
    // payload checks
    let back = Header::decode(&good).unwrap();
    assert!(back.check_payload(&data[..100]).is_err());
    let mut d = data.clone();
    d[7] ^= 1;
    assert_eq!(back.check_payload(&d), Err(WireError::PayloadCrc));
}

/// A header's bytes as a peer could send them (encode asserts a round
/// trip in debug builds, so they are built by hand).
fn raw_frame(op: Op, flags: u16, payload_len: u32) -> [u8; HEADER_BYTES] {
    let mut buf = [0u8; HEADER_BYTES];
    let raw = RawHeader {
        magic: MAGIC.into(),
        version: VERSION,
        op: op as u8,
        flags: flags.into(),
        payload_len: payload_len.into(),
        ..Default::default()
    };
    buf.copy_from_slice(raw.as_bytes());
    let c = crc32c(&buf[..92]);
    buf[92..96].copy_from_slice(&c.to_le_bytes());
    buf
}

#[test]
fn payload_must_match_op() {
    assert!(matches!(
        Header::decode(&raw_frame(Op::Delete, 0, 512)),
        Err(WireError::PayloadLen { .. })
    ));
    // A listing request carries nothing; its reply whole entries, at most
    // a page of them.
    assert!(Header::decode(&raw_frame(Op::List, 0, 16)).is_err());
    let page = LIST_PAGE_MAX * LIST_ENTRY_BYTES as u32;
    for op in [Op::List, Op::ShardList] {
        assert!(Header::decode(&raw_frame(op, 0, 16)).is_err());
        for (len, ok) in [
            (0, true),
            (16, true),
            (page, true),
            (24, false),
            (page + 16, false),
        ] {
            let r = Header::decode(&raw_frame(op, FLAG_REPLY, len));
            assert_eq!(r.is_ok(), ok, "a {op:?} reply of {len} bytes: {r:?}");
        }
    }
    // Shard ops: a write of no range is its log entry alone, with no
    // payload; a read names a range; a commit lists whole entries.
    assert!(
        Header::decode(&raw_frame(Op::ShardWrite, FLAG_XOR, 0))
            .unwrap()
            .xor
    );
    assert!(Header::decode(&raw_frame(Op::ShardWrite, 0, 512)).is_err());
    assert!(matches!(
        Header::decode(&raw_frame(Op::ShardRead, 0, 0)),
        Err(WireError::Range { .. })
    ));
    assert!(Header::decode(&raw_frame(Op::ShardSettle, 0, 0)).is_ok());
    // A client's direct read names a range and carries nothing; the
    // permission to answer them carries nothing either.
    assert!(matches!(
        Header::decode(&raw_frame(Op::DirectRead, 0, 0)),
        Err(WireError::Range { .. })
    ));
    assert!(Header::decode(&raw_frame(Op::ShardActive, 0, 0)).is_ok());
    assert!(Header::decode(&raw_frame(Op::ShardActive, 0, 512)).is_err());
    assert!(Header::decode(&raw_frame(Op::ShardVersion, 0, 0)).is_ok());
    assert!(Header::decode(&raw_frame(Op::ShardVersion, 0, 512)).is_err());
    assert!(Header::decode(&raw_frame(Op::ShardSettle, 0, 8)).is_err());
    for (len, ok) in [
        (0, false),
        (24, true),
        (48, true),
        (25, false),
        (1 << 20, false),
    ] {
        let r = Header::decode(&raw_frame(Op::ShardCommit, 0, len));
        assert_eq!(r.is_ok(), ok, "a commit of {len} bytes: {r:?}");
    }
    // A shard write's range carries exactly its payload, and its flags
    // survive a round trip.
    let mut h = Header::request(Op::ShardWrite, 9, ObjectId::new(1 << 32, 5).shard(2));
    (h.offset, h.length, h.xor) = (4096, 8192, true);
    let data = vec![3u8; 8192];
    let h = h.with_payload(&data);
    let mut buf = [0u8; HEADER_BYTES];
    h.encode(&mut buf);
    let back = Header::decode(&buf).unwrap();
    assert_eq!(back, h);
    assert_eq!(back.oid.shard_index(), Some(2));
    // A replacing write is a whole shard from offset 0, nothing else.
    let (mut r, whole) = (h, vec![5u8; 16384]);
    (r.offset, r.length, r.xor, r.replace) = (0, 16384, false, true);
    let r = r.with_payload(&whole);
    r.encode(&mut buf);
    assert_eq!(Header::decode(&buf).unwrap(), r);
    assert!(Header::decode(&buf).unwrap().reply(Status::Ok).replace);
    assert!(Header::decode(&raw_frame(Op::ShardWrite, FLAG_REPLACE, 0)).is_err());
    assert!(Header::decode(&raw_frame(Op::ShardWrite, FLAG_REPLACE | FLAG_XOR, 0)).is_err());
    assert!(Header::decode(&raw_frame(Op::Push, FLAG_REPLACE, 0)).is_err());
    // A heartbeat carries nothing or its figures; an echo's reply at most
    // 4 KiB (its request anything up to an object); a bench's, a net
    // bench's, a stat's and a metrics' reply a control payload, their
    // requests nothing.
    for (len, ok) in [
        (0, true),
        (PING_FIGURES_BYTES, true),
        (4, false),
        (24, false),
    ] {
        let r = Header::decode(&raw_frame(Op::Ping, 0, len));
        assert_eq!(r.is_ok(), ok, "a ping of {len} bytes: {r:?}");
    }
    for (len, ok) in [
        (0, true),
        (ECHO_REPLY_MAX, true),
        (ECHO_REPLY_MAX + 512, false),
    ] {
        let r = Header::decode(&raw_frame(Op::Echo, FLAG_REPLY, len));
        assert_eq!(r.is_ok(), ok, "an echo reply of {len} bytes: {r:?}");
    }
    assert!(Header::decode(&raw_frame(Op::Echo, 0, 1 << 20)).is_ok());
    for op in [Op::Stat, Op::Metrics, Op::Bench, Op::NetBench] {
        let max = CONTROL_PAYLOAD_MAX_BYTES;
        assert!(
            Header::decode(&raw_frame(op, FLAG_REPLY, max)).is_ok(),
            "{op:?}"
        );
        assert!(
            Header::decode(&raw_frame(op, FLAG_REPLY, max + 1)).is_err(),
            "{op:?}"
        );
        assert!(Header::decode(&raw_frame(op, 0, 512)).is_err(), "{op:?}");
    }
}

proptest! {
    /// Any bytes either decode to a header that re-encodes to the same
    /// bytes, or fail cleanly.
    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(h) = Header::decode(&bytes) {
            let mut out = [0u8; HEADER_BYTES];
            h.encode(&mut out);
            prop_assert_eq!(&out[..], &bytes[..HEADER_BYTES]);
        }
    }

    /// Mutations of a valid header (resealed, so the crc passes) are
    /// validated field by field.
    #[test]
    fn mutated_headers_are_validated(pos in 0usize..84, val in any::<u8>()) {
        let (h, _) = write_req();
        let mut b = [0u8; HEADER_BYTES];
        h.encode(&mut b);
        b[pos] = val;
        let c = crc32c(&b[..92]);
        b[92..96].copy_from_slice(&c.to_le_bytes());
        if let Ok(d) = Header::decode(&b) {
            prop_assert!(d.payload_len <= PAYLOAD_MAX_BYTES);
            if matches!(d.op, Op::Read | Op::Write | Op::RepWrite) {
                prop_assert!(u64::from(d.offset) + u64::from(d.length) <= u64::from(BLOCK_BYTES_MAX));
            }
        }
    }
}

/// A reply answers its request when it names the same op, object and
/// range; the status, payload and epoch may differ. Anything else — or a
/// request — does not.
#[test]
fn a_reply_answers_its_request_only() {
    let mut req = Header::request(Op::Read, 42, ObjectId::new(7, 9));
    (req.offset, req.length) = (8192, 4096);
    let data = vec![1u8; 4096];
    let mut ok = req.reply(Status::Ok).with_payload(&data);
    ok.epoch = 5;
    assert!(ok.answers(&req));
    assert!(req.reply(Status::NotFound).answers(&req));
    assert!(!req.answers(&req), "a request answers nothing");
    let changed: [fn(&mut Header); 5] = [
        |h| h.op = Op::ShardRead,
        |h| h.oid = ObjectId::new(7, 10),
        |h| h.oid = ObjectId::new(8, 9),
        |h| h.offset += 512,
        |h| h.length -= 512,
    ];
    for (i, change) in changed.iter().enumerate() {
        let mut r = ok;
        change(&mut r);
        assert!(!r.answers(&req), "change {i}");
    }
}
