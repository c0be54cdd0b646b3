//! A listener's connection caps: one address cannot take every slot, and
//! connections that never finish their handshake make room for new ones
//! instead of keeping them out.

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use nacre_io::net::{Addr, Listener};
use nacre_io::{rt, AlignedBuf};
use nacre_net::{accept_capped, PEER_CONNECTIONS_MAX};

/// Whether the server closed `s` (reads end) within a second.
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut b = [0u8; 8];
    matches!(s.read(&mut b), Ok(0) | Err(_)) && {
        // A timeout is not a close.
        s.set_nonblocking(true).unwrap();
        !matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

/// Runs `accept_capped` over TCP on its own thread, serving each
/// connection until it closes; connections attach (finish a handshake)
/// when the client sends a byte. Returns the address.
fn server(max: usize) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        rt::block_on(async move {
            let l = Listener::bind(&Addr::Tcp("127.0.0.1:0".into())).unwrap();
            tx.send(l.local_addr().to_string()).unwrap();
            accept_capped(&l, max, |s, admitted| async move {
                let mut b = AlignedBuf::new(1);
                loop {
                    let (r, back) = s.recv(b, 0).await;
                    b = back;
                    if !matches!(r, Ok(n) if n > 0) {
                        break;
                    }
                    admitted.attach();
                }
            })
            .await;
        })
    });
    rx.recv().unwrap().trim_start_matches("tcp:").to_string()
}

#[test]
fn one_address_cannot_take_every_slot() {
    let addr = server(4 * PEER_CONNECTIONS_MAX);
    let mut held: Vec<TcpStream> = (0..PEER_CONNECTIONS_MAX)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let mut over = TcpStream::connect(&addr).unwrap();
    assert!(
        closed(&mut over),
        "a connection past the per-address cap was served"
    );
    assert!(!closed(&mut held[0]));
    // One gone, one more is served.
    drop(held.pop());
    std::thread::sleep(Duration::from_millis(200));
    let mut again = TcpStream::connect(&addr).unwrap();
    assert!(!closed(&mut again));
}

#[test]
fn connections_that_never_finish_a_handshake_make_room() {
    use std::io::Write;
    let addr = server(8);
    // Four attached, four in their handshakes.
    let mut attached: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(b"x").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    // A ninth takes the place of the oldest in its handshake.
    let mut new = TcpStream::connect(&addr).unwrap();
    assert!(!closed(&mut new));
    assert!(closed(&mut idle[0]), "the oldest handshake was kept");
    assert!(idle[1..].iter_mut().all(|s| !closed(s)));
    assert!(
        attached.iter_mut().all(|s| !closed(s)),
        "an attached one was closed"
    );
    // With every slot attached, a new one is closed.
    new.write_all(b"x").unwrap();
    for s in &mut idle[1..] {
        s.write_all(b"x").unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut late = TcpStream::connect(&addr).unwrap();
    assert!(
        closed(&mut late),
        "a connection past a cap of attached ones was served"
    );
}
