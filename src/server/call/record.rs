//! A call's record: its begin, its end and its failure, and the metrics
//! counted with them. A call dropped before its end (the harness went away,
//! or the proxy failed) is recorded as such by `Drop`.

use super::error::{ProxyError, StreamError};
use super::State;
use crate::config::OnWalError;
use crate::dialect::{ApiError, WireApi};
use crate::http::{bytes_response, ProxyBody};
use crate::record::{CallBegin, CallOutcome, CallStatus, FailureClass, RecordError};
use crate::redact::redacted;
use crate::server::metrics::ClassLabel;
use bytes::Bytes;
use http::Response;
use std::sync::Arc;
use std::time::Instant;

type BeginWritten =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), RecordError>> + Send>>;

/// One call on its way: what is known of it, and how far its record got.
pub struct Call {
    pub state: Arc<State>,
    pub api: WireApi,
    begin: Arc<CallBegin>,
    pub started: Instant,
    first_byte_at: Option<i64>,
    began: bool,
    /// Resolves once its start is in the WAL (taken by `start_written`).
    begin_written: Option<BeginWritten>,
    /// Its start is known to be in the WAL.
    begin_on_disk: bool,
    /// Its end is queued for the WAL.
    ended: bool,
    /// The upstream's body, recorded beside the harness's when they differ.
    pub upstream_response: Option<Bytes>,
    /// The replica serving the call, counted in flight until the call is
    /// dropped.
    lease: Option<crate::upstream::Lease>,
    /// The route's weight-sync gate, and the policy version the call was
    /// sent under.
    gate: Option<Arc<crate::server::pause::Gate>>,
    policy_version: Option<i64>,
    /// The gate's count of ended `keep` pauses when the call was sent.
    kept_seen: u64,
    resent: u32,
    /// Where an `abort` pause cut the stream and it was continued.
    continued: Vec<crate::record::Continued>,
    /// Charge the answer's usage to the rollout's budget.
    charge: bool,
}

impl Call {
    pub fn new(state: &Arc<State>, api: WireApi, begin: CallBegin, started: Instant) -> Self {
        Self {
            state: state.clone(),
            api,
            begin: Arc::new(begin),
            started,
            first_byte_at: None,
            began: false,
            begin_written: None,
            begin_on_disk: false,
            ended: false,
            lease: None,
            gate: None,
            policy_version: None,
            kept_seen: 0,
            resent: 0,
            continued: Vec::new(),
            charge: false,
            upstream_response: None,
        }
    }

    /// Queue the call's start for the WAL (once).
    pub async fn log_begin(&mut self) {
        if !self.began {
            match self.state.recorder.begin(self.begin.clone()).await {
                Ok(written) => self.begin_written = Some(Box::pin(written)),
                Err(e) => tracing::error!(error = %e, "could not log call start"),
            }
            self.began = true;
        }
    }

    /// Wait until the call's start is in the WAL, so that a stream's head
    /// is never seen by a client for a call that has no record (a SIGKILL
    /// then leaves an `incomplete` row). Usually already done: the start
    /// was queued before the upstream was asked. Under
    /// `on_wal_error = "fail"`, a start the WAL could not take is the
    /// harness's 503 instead of the head.
    pub async fn start_written(&mut self) -> Result<(), ProxyError> {
        self.log_begin().await;
        let Some(written) = self.begin_written.take() else {
            return Ok(());
        };
        let Err(e) = written.await else {
            self.begin_on_disk = true;
            return Ok(());
        };
        tracing::error!(error = %e, call_id = %self.begin.meta.call_id, "could not record the call's start");
        match self.state.on_wal_error {
            OnWalError::Serve => Ok(()),
            OnWalError::Fail => Err(ProxyError::Unrecorded(e)),
        }
    }

    fn count(&self, status: CallStatus, class: Option<FailureClass>) {
        let m = &self.state.metrics;
        m.count_call(self.api, status);
        m.observe_duration(self.api, self.started.elapsed().as_secs_f64());
        if let Some(class) = class {
            m.errors
                .get_or_create(&ClassLabel {
                    class: class.as_str(),
                })
                .inc();
        }
    }

    fn outcome(
        &self,
        status: CallStatus,
        http_status: Option<u16>,
        failure: Option<(FailureClass, String)>,
    ) -> CallOutcome {
        let (failure_class, failure_message) =
            failure.map_or((None, None), |(c, m)| (Some(c), Some(redacted(&m))));
        CallOutcome {
            call_id: self.begin.meta.call_id.clone(),
            status,
            http_status,
            failure_class,
            failure_message,
            first_byte_at: self.first_byte_at,
            done_at: crate::now_micros(),
            replica: self.lease.as_ref().map(|l| l.replica.redacted.clone()),
            repinned: self.lease.as_ref().is_some_and(|l| l.repinned),
            policy_version: self.policy_version,
            policy_version_end: self
                .policy_version
                .and(self.gate.as_ref())
                .map(|g| g.version()),
            resent: self.resent,
            continued: self.continued.clone(),
        }
    }

    /// The call is (about to be) sent under `version` of `gate`'s route.
    pub fn sent_under(&mut self, gate: &Arc<crate::server::pause::Gate>, version: i64) {
        self.kept_seen = gate.kept_count();
        self.gate = Some(gate.clone());
        self.policy_version = Some(version);
    }

    /// An `abort` pause cut the call; it goes again after the resume.
    pub fn cut(&mut self) {
        self.resent += 1;
    }

    /// The route's gate, and its count of ended `keep` pauses when the
    /// call was sent.
    pub fn gate(&self) -> Option<(&Arc<crate::server::pause::Gate>, u64)> {
        self.gate.as_ref().map(|g| (g, self.kept_seen))
    }

    /// The policy version the call's latest tokens were sampled under, as
    /// far as the call knows.
    pub fn latest_version(&self) -> Option<i64> {
        self.continued
            .last()
            .map(|c| c.policy_version)
            .or(self.policy_version)
    }

    /// Its stream, cut after `completion_tokens`, goes on under `version`.
    pub fn continued(&mut self, completion_tokens: u64, version: i64) {
        self.continued.push(crate::record::Continued {
            completion_tokens,
            policy_version: version,
        });
    }

    /// Charge the answer's token usage to the rollout's budget when it ends.
    pub fn charge_usage(&mut self, charge: bool) {
        self.charge = charge;
    }

    /// The replica that answered: recorded, and held in flight until the
    /// call is done.
    pub fn set_lease(&mut self, lease: crate::upstream::Lease) {
        self.lease = Some(lease);
    }

    /// Record the call's end; returns once it is in the WAL. When the WAL
    /// cannot take it and `shards.on_wal_error = "fail"`, returns the error
    /// the harness gets instead of its answer; the call is then recorded as
    /// that failure once the WAL takes writes again.
    pub async fn end(
        &mut self,
        status: CallStatus,
        http_status: u16,
        failure: Option<(FailureClass, String)>,
        response: Bytes,
    ) -> Result<(), ApiError> {
        self.log_begin().await;
        self.count(status, failure.as_ref().map(|f| f.0));
        if let Some((class, msg)) = &failure {
            tracing::info!(
                call_id = %self.begin.meta.call_id,
                rollout = %self.begin.meta.rollout_id,
                class = class.as_str(),
                "call failed: {msg}"
            );
        }
        if std::mem::take(&mut self.charge) {
            // Before the answer's last bytes, so that the rollout's next
            // call sees this one's tokens (only rollouts with a budget pay).
            let usage = self.api.assemble(&response, self.begin.meta.stream).usage;
            let (b, m) = (&self.begin, &self.begin.meta);
            self.state
                .budgets
                .charge(&m.rollout_id, b.request.len(), &usage);
        }
        let outcome = self.outcome(status, Some(http_status), failure);
        let upstream = self.upstream_response.take();
        let recorder = &self.state.recorder;
        // Written here when the start is on disk (it usually is by now):
        // no round trip to the writer's thread on the answer's path.
        if let Some(written) = self.begin_written.take() {
            self.begin_on_disk = written.await.is_ok();
        }
        let (outcome, response, upstream) = if self.begin_on_disk {
            match recorder.end_inline(outcome, response, upstream) {
                Ok(wait) => {
                    // In the WAL now: ended, even if the wait for room in
                    // the shard queue is cut short.
                    self.ended = true;
                    if let Some(wait) = wait {
                        wait.await;
                    }
                    return Ok(());
                }
                Err(end) => *end,
            }
        } else {
            (outcome, response, upstream)
        };
        // Boxed: the path taken rarely (the end sent to the writer's
        // thread), so that this future stays small: it is copied whole into
        // each one that awaits it, up to the call's.
        let ended = &mut self.ended;
        let result = Box::pin(async move {
            match recorder.submit_end(outcome, response, upstream).await {
                Ok(ack) => {
                    *ended = true;
                    ack.await
                }
                Err(e) => {
                    *ended = true;
                    Err(e)
                }
            }
        })
        .await;
        let Err(e) = result else {
            return Ok(());
        };
        self.state.metrics.unrecorded.inc();
        tracing::error!(error = %e, call_id = %self.begin.meta.call_id, "could not record the call's end");
        // The WAL writes the end again once the disk takes writes, as what
        // the harness got: the answer, or under "fail" this 503.
        match self.state.on_wal_error {
            OnWalError::Serve => Ok(()),
            OnWalError::Fail => Err(crate::record::unrecorded_error(&e)),
        }
    }

    /// Record a stream that ended in `e` at HTTP status 200 (its head had
    /// gone out), with what the harness got of it.
    pub async fn end_stream(&mut self, e: &StreamError, response: Bytes) -> Result<(), ApiError> {
        let failure = Some((e.class(), e.to_string()));
        self.end(CallStatus::Failed, 200, failure, response).await
    }

    /// Answer with an error in the harness's API format, and record it.
    pub async fn fail(mut self, e: ProxyError) -> Response<ProxyBody> {
        let (class, mut err) = e.classify();
        err.message = redacted(&err.message);
        let body = Bytes::from(self.api.error_body(&err));
        let msg = err.message.clone();
        if let Err(e) = self
            .end(
                CallStatus::Failed,
                err.status,
                Some((class, msg)),
                body.clone(),
            )
            .await
        {
            return error_response(self.api, &e);
        }
        bytes_response(err.status, "application/json", body)
    }

    pub fn mark_first_byte(&mut self) {
        if self.first_byte_at.is_none() {
            self.first_byte_at = Some(crate::now_micros());
            self.state
                .metrics
                .observe_ttfb(self.api, self.started.elapsed().as_secs_f64());
        }
    }
}

/// An error in the given API's format.
pub fn error_response(api: WireApi, err: &ApiError) -> Response<ProxyBody> {
    bytes_response(err.status, "application/json", api.error_body(err))
}

impl Drop for Call {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (class, msg) = if std::thread::panicking() {
            (
                FailureClass::Internal,
                "the proxy failed while handling this call",
            )
        } else {
            (
                FailureClass::ClientDisconnected,
                "the client disconnected before the answer was ready",
            )
        };
        self.count(CallStatus::Failed, Some(class));
        let outcome = self.outcome(CallStatus::Failed, None, Some((class, msg.into())));
        let recorder = self.state.recorder.clone();
        let begin = (!self.began).then(|| self.begin.clone());
        let upstream = self.upstream_response.take();
        self.state.tasks.spawn_on(
            async move {
                if let Some(b) = begin {
                    // Queued ahead of the end; no need to wait for it.
                    let _ = recorder.begin(b).await;
                }
                let _ = recorder.end(outcome, Bytes::new(), upstream).await;
            },
            &rt,
        );
    }
}
