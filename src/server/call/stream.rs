//! A streamed answer: forwarded chunk by chunk as it arrives (translated
//! and stripped of token-capture fields on the way when the call needs
//! it), a copy collected for the record. The chunk that completes the
//! terminal event is released only once the call's end is in the WAL. An
//! `abort` pause may cut it and continue it (`resume`); a `keep` pause
//! freezes it upstream, and the record says after how many completion
//! tokens the new version took over.

use super::error::StreamError;
use super::prepare::Strip;
use super::record::Call;
use super::resume::{self, Progress, Resume};
use crate::dialect::capture::{self, ChunkFate};
use crate::dialect::sse;
use crate::dialect::terminal::Detector;
use crate::dialect::translate::StreamTranslator;
use crate::dialect::WireApi;
use crate::http::{Abort, Chunk, ProxyBody};
use crate::record::CallStatus;
use crate::upstream::{error_chain, Route};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Chunks queued between the pump and the harness's connection.
const OUTLET_CHUNKS: usize = 64;

/// Start forwarding `resp` to the harness: the body to answer with, and the
/// pump that fills it (spawned on the server's task tracker, so that
/// shutdown waits for it).
pub fn start(
    call: Call,
    route: Arc<Route>,
    resp: crate::upstream::Response,
    translate: Option<WireApi>,
    strip: Option<Strip>,
    resume: Option<Resume>,
) -> ProxyBody {
    let (tx, rx) = mpsc::channel(OUTLET_CHUNKS);
    let abort = Abort::default();
    let idle = Duration::from_secs_f64(call.state.server.client_idle_timeout_secs);
    // A stream is continued only where it is already read event by event.
    let resume = resume.filter(|_| translate.is_some() || strip.is_some());
    let stage = (translate.is_some() || strip.is_some()).then(|| Stage {
        parser: sse::Parser::default(),
        translator: translate.map(StreamTranslator::new),
        strip,
        upstream: BytesMut::new(),
        flushed: false,
        progress: resume.as_ref().map(|_| Progress::default()),
        continued: None,
    });
    let source = Source {
        resp: Some(resp),
        stage,
    };
    let out = Outlet {
        tx,
        abort: abort.clone(),
        idle,
    };
    let tracker = call.state.tasks.clone();
    tracker.spawn(pump(call, route, source, out, resume));
    ProxyBody::Abortable(rx, abort, None)
}

/// How a stream that ran to its end is recorded: an error event inside it
/// makes it an upstream stream error; an end without a terminal event
/// (`[DONE]`, `response.completed`, …) means the upstream cut it short.
fn verdict(d: &Detector, terminal: bool) -> Option<StreamError> {
    if d.failed {
        Some(StreamError::Failed)
    } else if d.incomplete {
        Some(StreamError::Incomplete)
    } else if d.saw_error {
        Some(StreamError::ErrorEvent)
    } else if !terminal {
        Some(StreamError::NoTerminal)
    } else {
        None
    }
}

/// A stream the proxy changes on its way: token-capture fields taken out,
/// and/or Chat Completions chunks translated into the harness's API.
struct Stage {
    parser: sse::Parser,
    translator: Option<StreamTranslator>,
    strip: Option<Strip>,
    /// The upstream's bytes, for the record.
    upstream: BytesMut,
    flushed: bool,
    /// What has been streamed, when the stream may be continued.
    progress: Option<Progress>,
    /// After a continuation: the first answer's id, and its completion
    /// tokens before the cut.
    continued: Option<(String, u64)>,
}

impl Stage {
    /// Keep a (rewritten) event of a continuation for the record.
    fn record(&mut self, ev: &sse::Event) {
        let mut b = Vec::new();
        sse::write_event(ev, &mut b);
        self.upstream.extend_from_slice(&b);
    }

    /// The bytes one upstream event becomes for the harness.
    fn event(&mut self, mut ev: sse::Event, out: &mut Vec<u8>) {
        let parse = self.strip.is_some() || self.progress.is_some() || self.continued.is_some();
        if parse && ev.data != "[DONE]" {
            if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&ev.data) {
                if let Some((id, tokens)) = &self.continued {
                    resume::rewrite(&mut v, id, *tokens);
                    ev.data = v.to_string();
                    self.record(&ev);
                }
                if let Some(p) = &mut self.progress {
                    p.observe(&v);
                }
                if let Some(s) = &self.strip {
                    if capture::strip_chunk(s.kind, s.api, &s.asked, &mut v) == ChunkFate::Drop {
                        return;
                    }
                }
                ev.data = v.to_string();
            }
        } else if self.continued.is_some() {
            self.record(&ev);
        }
        match &mut self.translator {
            Some(t) => out.extend(t.feed(&ev)),
            None => sse::write_event(&ev, out),
        }
    }
}

/// Where a stream's chunks come from: the upstream's body, through a
/// [`Stage`] when the call needs one.
struct Source {
    /// `None` between a cut and its continuation.
    resp: Option<crate::upstream::Response>,
    stage: Option<Stage>,
}

impl Source {
    async fn chunk(&mut self) -> Result<Option<Bytes>, crate::upstream::ReadError> {
        let Some(resp) = &mut self.resp else {
            return Ok(None);
        };
        let Some(t) = &mut self.stage else {
            return resp.body_mut().chunk().await;
        };
        let mut events = Vec::new();
        loop {
            match resp.body_mut().chunk().await? {
                Some(c) => {
                    // A continuation's events are recorded as rewritten.
                    if t.continued.is_none() {
                        t.upstream.extend_from_slice(&c);
                    }
                    t.parser.feed(&c, &mut events);
                }
                None if t.flushed => return Ok(None),
                None => {
                    t.flushed = true;
                    t.parser.finish(&mut events);
                }
            }
            let mut out = Vec::new();
            for e in events.drain(..) {
                t.event(e, &mut out);
            }
            if !out.is_empty() {
                return Ok(Some(Bytes::from(out)));
            }
            if t.flushed {
                return Ok(None);
            }
        }
    }

    /// The upstream's bytes so far, when they differ from what the harness got.
    fn upstream(&mut self) -> Option<Bytes> {
        self.stage.as_mut().map(|t| t.upstream.split().freeze())
    }

    /// How many of the upstream's bytes are held for the record.
    fn upstream_len(&self) -> usize {
        self.stage.as_ref().map_or(0, |t| t.upstream.len())
    }
}

/// Where a stream's chunks go: the harness's body, which the pump can cut
/// off, and how long the harness may take to accept the next chunk.
struct Outlet {
    tx: mpsc::Sender<Chunk>,
    abort: Abort,
    idle: Duration,
}

/// What sending a chunk to the harness came to.
enum Sent {
    Ok,
    /// The harness went away.
    Gone,
    /// The harness stopped reading for longer than the idle timeout.
    Stalled,
}

impl Outlet {
    async fn send(&self, chunk: Bytes) -> Sent {
        match crate::http::within(self.idle, self.tx.send(Ok(chunk))).await {
            Ok(Ok(())) => Sent::Ok,
            Ok(Err(_)) => Sent::Gone,
            Err(_) => Sent::Stalled,
        }
    }

    /// Send `event` (an error in the harness's stream format) if the harness
    /// takes it in time, then cut the stream off, so that it cannot be
    /// mistaken for a complete one.
    async fn cut(self, event: Option<Bytes>) {
        self.abort.set();
        if let Some(e) = event {
            let _ = self.send(e).await;
        }
    }
}

/// What came next from the upstream.
enum Next {
    Chunk(Bytes),
    End,
    Broken(StreamError),
    /// An `abort` pause began.
    Abort,
}

type Armed = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A future that resolves when an `abort` pause begins on `r`'s route.
fn arm(r: &Resume) -> Armed {
    let gate = r.gate.clone();
    Box::pin(async move { gate.aborted().await })
}

type Kept = std::pin::Pin<Box<dyn std::future::Future<Output = (u64, i64)> + Send>>;

/// A future that resolves when a `keep` pause of `gate`'s route ends after
/// the `seen`th: the count of ended pauses, and the version it resumed with.
fn arm_keep(gate: &Arc<crate::server::pause::Gate>, seen: u64) -> Kept {
    let gate = gate.clone();
    Box::pin(async move { gate.kept(seen).await })
}

async fn kept(k: &mut Option<Kept>) -> (u64, i64) {
    match k {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// The stream is frozen upstream by a `keep` pause of its route.
fn frozen(call: &Call) -> bool {
    call.gate()
        .is_some_and(|(g, _)| g.paused() == Some(crate::server::pause::Mode::Keep))
}

async fn armed(a: &mut Option<Armed>) {
    match a {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Cut the upstream's stream, wait for the route to resume, and continue
/// the answer from where it was under the new weights.
async fn continue_stream(
    call: &mut Call,
    r: &Resume,
    route: &Route,
    src: &mut Source,
    out: &Outlet,
) -> Result<(), StreamError> {
    let Some(t) = src.stage.as_mut() else {
        return Ok(());
    };
    let Some(p) = &t.progress else {
        return Ok(());
    };
    let (id, text, tokens) = match &t.continued {
        // Cut again: the first answer's id, and all its text and tokens.
        Some((id, _)) => (id.clone(), p.text.clone(), p.tokens),
        None => (p.id.clone().unwrap_or_default(), p.text.clone(), p.tokens),
    };
    // Dropping the response closes its connection: vLLM and SGLang abort
    // the request.
    src.resp = None;
    call.cut();
    let version = tokio::select! {
        v = r.gate.open(r.max_wait) => v.map_err(|h| StreamError::HeldTooLong(h.0))?,
        () = out.tx.closed() => return Err(StreamError::ClientGone),
    };
    let body = resume::continuation_body(&r.body, &text)
        .ok_or_else(|| StreamError::UpstreamClosed("the request could not be continued".into()))?;
    let sent = route
        .send(
            http::Method::POST,
            &r.endpoint,
            &r.headers,
            body,
            r.translated,
            Some(&r.rollout),
        )
        .await
        .map_err(|e| StreamError::UpstreamClosed(format!("continuing after the update: {e}")))?;
    let status = sent.resp.status();
    if !status.is_success() {
        return Err(StreamError::UpstreamClosed(format!(
            "continuing after the update: the upstream answered {status}"
        )));
    }
    tracing::info!(route = %route.name, tokens, policy_version = version, "stream cut by an abort pause continued");
    call.set_lease(sent.lease);
    call.continued(tokens, version);
    t.parser = sse::Parser::default();
    t.flushed = false;
    t.continued = Some((id, tokens));
    src.resp = Some(sent.resp);
    Ok(())
}

/// Forward a stream chunk by chunk, collecting a copy for the record.
async fn pump(
    mut call: Call,
    route: Arc<Route>,
    mut src: Source,
    out: Outlet,
    resume: Option<Resume>,
) {
    let server = &call.state.server;
    let max_stream = Duration::from_secs(server.max_stream_secs);
    let max_bytes = server.max_response_bytes;
    let deadline = tokio::time::Instant::from_std(call.started) + max_stream;
    let mut detector = Detector::default();
    let mut collected = BytesMut::new();
    // The terminal event has been seen and the call's end recorded.
    let mut recorded = false;
    let api = call.api;
    let mut abort = resume.as_ref().map(arm);
    // Where a `keep` pause ends, the tokens so far are the old version's
    // (the servers generated nothing while frozen, and resume only once
    // the gate is open): counted where every chunk carried its ids.
    let mut keep = resume
        .as_ref()
        .and(call.gate())
        .map(|(g, seen)| arm_keep(g, seen));
    loop {
        let next = tokio::select! {
            biased;
            (seen, version) = kept(&mut keep) => {
                let tokens = src.stage.as_ref().and_then(|t| t.progress.as_ref()).and_then(Progress::counted);
                match tokens {
                    Some(n) if call.latest_version() != Some(version) && !recorded => call.continued(n, version),
                    None => tracing::warn!(route = %route.name, "a stream spanned a keep pause without token ids: where the new version took over is not recorded"),
                    _ => {}
                }
                keep = call.gate().map(|(g, _)| arm_keep(g, seen));
                continue;
            }
            r = tokio::time::timeout(route.idle_timeout, src.chunk()) => match r {
                Ok(Ok(Some(c))) if collected.len() + c.len() > max_bytes || src.upstream_len() > max_bytes => {
                    Next::Broken(StreamError::TooLarge(max_bytes))
                }
                Ok(Ok(Some(c))) => Next::Chunk(c),
                Ok(Ok(None)) => Next::End,
                Ok(Err(e)) => Next::Broken(StreamError::UpstreamClosed(error_chain(&*e))),
                // Frozen by a `keep` pause: quiet is expected (the stream's
                // length limit still applies).
                Err(_) if frozen(&call) => continue,
                Err(_) => Next::Broken(StreamError::UpstreamStalled(route.idle_timeout)),
            },
            _ = tokio::time::sleep_until(deadline) => Next::Broken(StreamError::TooLong(max_stream)),
            _ = out.tx.closed() => Next::Broken(StreamError::ClientGone),
            () = armed(&mut abort) => Next::Abort,
        };
        let next = match (next, &resume) {
            (Next::Abort, Some(r)) => {
                let can = !recorded
                    && src
                        .stage
                        .as_ref()
                        .and_then(|t| t.progress.as_ref())
                        .is_some_and(Progress::resumable);
                if !can {
                    // It finishes as it is, under the old weights.
                    abort = None;
                    continue;
                }
                match continue_stream(&mut call, r, &route, &mut src, &out).await {
                    Ok(()) => {
                        abort = Some(arm(r));
                        continue;
                    }
                    Err(e) => Next::Broken(e),
                }
            }
            (Next::Abort, None) => {
                abort = None;
                continue;
            }
            (n, _) => n,
        };
        let chunk = match next {
            Next::Chunk(c) => c,
            Next::Abort => continue,
            Next::End => {
                if !recorded {
                    call.upstream_response = src.upstream();
                    let response = collected.freeze();
                    let _ = match verdict(&detector, false) {
                        Some(e) => call.end_stream(&e, response).await,
                        None => call.end(CallStatus::Ok, 200, None, response).await,
                    };
                }
                return;
            }
            Next::Broken(e) if recorded => {
                // After the terminal event the call is on disk: just stop.
                if !matches!(e, StreamError::ClientGone) {
                    out.cut(None).await;
                }
                return;
            }
            Next::Broken(StreamError::ClientGone) => {
                call.upstream_response = src.upstream();
                let _ = call
                    .end_stream(&StreamError::ClientGone, collected.freeze())
                    .await;
                return;
            }
            Next::Broken(e) => {
                let event = Bytes::from(api.error_event(&e.event()));
                collected.extend_from_slice(&event);
                call.upstream_response = src.upstream();
                let _ = call.end_stream(&e, collected.freeze()).await;
                // Tell the harness in its own format, then cut the body off.
                return out.cut(Some(event)).await;
            }
        };
        if !recorded {
            collected.extend_from_slice(&chunk);
            if detector.feed(&chunk) {
                recorded = true;
                call.upstream_response = src.upstream();
                let response = collected.split().freeze();
                if out.tx.is_closed() {
                    let _ = call.end_stream(&StreamError::ClientGone, response).await;
                    return;
                }
                let ended = match verdict(&detector, true) {
                    Some(e) => call.end_stream(&e, response).await,
                    None => call.end(CallStatus::Ok, 200, None, response).await,
                };
                if let Err(err) = ended {
                    // Not on disk: the terminal chunk is withheld.
                    return out.cut(Some(Bytes::from(api.error_event(&err)))).await;
                }
            }
        }
        match out.send(chunk).await {
            Sent::Ok => {}
            Sent::Gone => {
                if !recorded {
                    call.upstream_response = src.upstream();
                    let _ = call
                        .end_stream(&StreamError::ClientGone, collected.freeze())
                        .await;
                }
                return;
            }
            Sent::Stalled => {
                if !recorded {
                    call.upstream_response = src.upstream();
                    let e = StreamError::ClientStalled(out.idle);
                    let _ = call.end_stream(&e, collected.freeze()).await;
                }
                return out.cut(None).await;
            }
        }
    }
}
