//! The accept loop for the model servers beside the proxy: the embedded
//! model and the scripted upstream (the proxy's own loop, with its limits
//! and graceful shutdown, is `server::Server::run`).

use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// Serve `handler` on `addr` (HTTP/1 and HTTP/2) until the process ends,
/// for the model servers that run beside the proxy: the scripted upstream
/// and the embedded model. Returns the bound address and the accept loop.
pub async fn serve_plain<F, Fut>(
    addr: SocketAddr,
    handler: F,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)>
where
    F: Fn(::http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ::http::Response<super::body::ProxyBody>> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let fut = async move {
        let builder =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of file descriptors, say: wait instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            };
            let _ = stream.set_nodelay(true);
            let handler = handler.clone();
            let svc = hyper::service::service_fn(move |req| {
                let fut = handler(req);
                async move { Ok::<_, std::convert::Infallible>(fut.await) }
            });
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    };
    Ok((local, fut))
}
