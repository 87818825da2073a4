//! `rollcall-bridge LISTEN SOCKET`: inside a rollout's container, which has
//! no network but loopback, accept TCP connections on `LISTEN` (a loopback
//! address such as `127.0.0.1:8700`) and carry each one, byte for byte, to
//! the Unix socket `SOCKET` that `rollcall batch` mounted into the
//! container, behind which the proxy listens. A harness inside the
//! container so reaches rollcall at `http://127.0.0.1:8700` and nothing else.
//!
//! It uses the standard library only (a thread pair per connection), so
//! that it builds as a static binary that runs in any image: task images
//! may carry an older C library than the host.

use std::io::{self, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::thread;

/// Copy one direction until its end, then close the other side's writing half.
fn pump(mut from: impl io::Read, mut to: impl Write, done: impl FnOnce()) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.flush();
    done();
}

fn serve(tcp: TcpStream, socket: &str) -> io::Result<()> {
    let unix = UnixStream::connect(socket)?;
    tcp.set_nodelay(true)?;
    let (tcp_r, unix_w) = (tcp.try_clone()?, unix.try_clone()?);
    let (tcp_w, unix_r) = (tcp, unix);
    let closer = unix_w.try_clone()?;
    let up = thread::spawn(move || {
        pump(tcp_r, unix_w, move || {
            let _ = closer.shutdown(Shutdown::Write);
        })
    });
    let closer = tcp_w.try_clone()?;
    pump(unix_r, tcp_w, move || {
        let _ = closer.shutdown(Shutdown::Write);
    });
    let _ = up.join();
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(socket)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: rollcall-bridge LISTEN_ADDR UNIX_SOCKET");
        std::process::exit(2);
    };
    let listener = match TcpListener::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rollcall-bridge: cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let socket = socket.clone();
        thread::spawn(move || {
            if let Err(e) = serve(conn, &socket) {
                eprintln!("rollcall-bridge: {socket}: {e}");
            }
        });
    }
}
