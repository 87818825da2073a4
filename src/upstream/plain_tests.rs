use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How the test server ends a connection after an answer.
#[derive(Clone, Copy)]
enum After {
    /// It keeps it open.
    Keep,
    /// It says `connection: close`, and closes it.
    SayClose,
    /// It says nothing, and closes it: the client finds out later.
    Vanish,
}

/// The origin of a replica at `addr`, as a route's URL gives it.
fn origin_at(addr: std::net::SocketAddr) -> Arc<Origin> {
    let uri: http::Uri = format!("http://{addr}/v1").parse().unwrap();
    Arc::new(Origin::of(&uri).unwrap())
}

/// A loopback HTTP/1.1 server written against the bytes, not with hyper:
/// it answers each request head with `200` and `ok`, and counts the
/// connections it accepted.
async fn server(after: After) -> (Arc<Origin>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = origin_at(listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    head.clear();
                    let close = match after {
                        After::SayClose => "connection: close\r\n",
                        _ => "",
                    };
                    let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n{close}\r\nok");
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    if !matches!(after, After::Keep) {
                        return;
                    }
                }
            });
        }
    });
    (origin, accepted)
}

fn request() -> http::Request<Full<Bytes>> {
    http::Request::builder()
        .uri("/v1/models")
        .header(http::header::HOST, "test")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// One call; its body is read to the end when `whole`, else dropped.
async fn call(conns: &Conns, origin: &Arc<Origin>, whole: bool) -> Result<(), SendError> {
    let (resp, held) = conns.send(origin, request()).await?;
    assert_eq!(resp.status(), 200);
    let mut body = super::super::Body::Plain(resp.into_body(), Some(held));
    if whole {
        let mut got = Vec::new();
        while let Some(b) = body.chunk().await.unwrap() {
            got.extend_from_slice(&b);
        }
        assert_eq!(got, b"ok");
    }
    Ok(())
}

fn idle_count(conns: &Conns, origin: &Arc<Origin>) -> usize {
    let mut idle = conns.idle.lock().unwrap();
    idle.list(origin).map_or(0, |l| l.len())
}

fn conns(max_idle: usize) -> Conns {
    Conns::new(Duration::from_secs(5), max_idle)
}

#[tokio::test]
async fn a_connection_is_reused_once_its_answer_is_read() {
    let (origin, accepted) = server(After::Keep).await;
    let conns = conns(8);
    for _ in 0..3 {
        call(&conns, &origin, true).await.unwrap();
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(idle_count(&conns, &origin), 1);
}

#[tokio::test]
async fn an_answer_dropped_before_its_end_takes_its_connection_along() {
    let (origin, accepted) = server(After::Keep).await;
    let conns = conns(8);
    call(&conns, &origin, false).await.unwrap();
    assert_eq!(idle_count(&conns, &origin), 0);
    call(&conns, &origin, true).await.unwrap();
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_connection_the_server_closes_is_not_kept() {
    let (origin, accepted) = server(After::SayClose).await;
    let conns = conns(8);
    call(&conns, &origin, true).await.unwrap();
    assert_eq!(idle_count(&conns, &origin), 0);
    call(&conns, &origin, true).await.unwrap();
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// A loopback HTTP/1.1 server on a thread of its own, with blocking
/// sockets (so that it acts while the test's runtime does not run): on
/// its first connection it answers one request, then does what `first`
/// says; every later connection it answers and keeps. Its count of
/// accepted connections comes with it.
fn thread_server(
    first: impl FnOnce(&mut std::net::TcpStream) + Send + 'static,
) -> (Arc<Origin>, Arc<AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = origin_at(listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let read_head = |s: &mut std::net::TcpStream| {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    std::thread::spawn(move || {
        let mut first = Some(first);
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            count.fetch_add(1, Ordering::SeqCst);
            if !read_head(&mut s) || s.write_all(ANSWER).is_err() {
                continue;
            }
            match first.take() {
                Some(f) => f(&mut s),
                None => while read_head(&mut s) && s.write_all(ANSWER).is_ok() {},
            }
        }
    });
    (origin, accepted)
}

#[tokio::test]
async fn a_request_the_server_may_have_seen_is_not_sent_again() {
    use std::io::Read;
    let (origin, accepted) = thread_server(|s| {
        // Read the second request whole, then close without an answer.
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
    });
    let conns = conns(8);
    call(&conns, &origin, true).await.unwrap();
    let e = call(&conns, &origin, true).await.unwrap_err();
    assert!(!e.is_connect(), "{e:?}");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_closed_while_idle_is_replaced() {
    let (origin, accepted) = server(After::Vanish).await;
    let conns = conns(8);
    for _ in 0..3 {
        call(&conns, &origin, true).await.unwrap();
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_pool_keeps_at_most_max_idle_per_origin() {
    let (origin, accepted) = server(After::Keep).await;
    let conns = conns(1);
    let (a, held_a) = conns.send(&origin, request()).await.unwrap();
    let (b, held_b) = conns.send(&origin, request()).await.unwrap();
    for (resp, held) in [(a, held_a), (b, held_b)] {
        let mut body = super::super::Body::Plain(resp.into_body(), Some(held));
        while body.chunk().await.unwrap().is_some() {}
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert_eq!(idle_count(&conns, &origin), 1);
}

#[tokio::test]
async fn the_sweep_closes_connections_idle_too_long() {
    let (origin, _) = server(After::Keep).await;
    let conns = conns(8);
    call(&conns, &origin, true).await.unwrap();
    let mut idle = conns.idle.lock().unwrap();
    idle.sweep(Instant::now());
    assert_eq!(idle.list(&origin).map(|l| l.len()), Some(1));
    idle.sweep(Instant::now() + POOL_IDLE);
    assert!(idle.by_origin.is_empty());
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = origin_at(listener.local_addr().unwrap());
    drop(listener);
    let e = call(&conns(8), &origin, true).await.unwrap_err();
    assert!(e.is_connect(), "{e:?}");
    assert!(
        super::super::error_chain(&e).starts_with("tcp connect error: "),
        "{}",
        super::super::error_chain(&e)
    );
}

#[test]
fn an_origin_is_the_host_and_port_connected_to() {
    let of = |u: &str| Origin::of(&u.parse().unwrap()).unwrap();
    assert_eq!(
        (
            &*of("http://[::1]:8000/v1").host,
            of("http://[::1]:8000/v1").port
        ),
        ("::1", 8000)
    );
    assert_eq!(of("http://models.internal/v1").port, 80);
    assert_eq!(&*of("http://10.0.0.7:9/v1").host, "10.0.0.7");
}
