//! A hand-driven upstream for tests that need to see exactly what the proxy
//! sends, or to control when each piece of a response goes out. It is a real
//! hyper server on loopback standing in for a model server.
#![allow(dead_code)]

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What the upstream received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

pub type Reply = (
    u16,
    Vec<(&'static str, String)>,
    mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>,
);
type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

pub struct Upstream {
    pub url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

/// A reply with a whole body.
pub fn whole(status: u16, ct: &str, body: impl Into<Bytes>) -> Reply {
    let (tx, rx) = mpsc::channel(1);
    tx.try_send(Ok(Frame::data(body.into()))).unwrap();
    (status, vec![("content-type", ct.to_owned())], rx)
}

pub async fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let handler: Handler = Arc::new(handler);
    let s2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (seen, handler) = (s2.clone(), handler.clone());
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (seen, handler) = (seen.clone(), handler.clone());
                async move {
                    let path = req.uri().to_string();
                    let headers = req.headers().clone();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let s = Seen {
                        path,
                        headers,
                        body,
                    };
                    seen.lock().unwrap().push(s.clone());
                    let (status, hdrs, rx) = handler(&s);
                    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                        rx.recv().await.map(|x| (x, rx))
                    });
                    let mut resp = Response::new(StreamBody::new(stream));
                    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                    for (k, v) in hdrs {
                        resp.headers_mut().insert(k, v.parse().unwrap());
                    }
                    Ok::<_, Infallible>(resp)
                }
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Upstream {
        url: format!("http://{addr}/v1"),
        seen,
    }
}
