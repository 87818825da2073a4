//! The row model: one `CallRow` per call, one `RolloutRow` per finished
//! rollout. `docs/shards.md` documents every column.

use super::{CallStatus, CompletedCall, FailureClass, RequestSpans, RolloutFinish};
use crate::dialect::{json_text, Assembled, StreamFailureKind, WireApi};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// One call, as stored in `calls/*.parquet`.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRow {
    /// The pool replica that served the call (its base URL, redacted).
    pub replica: Option<String>,
    /// The rollout was moved to `replica` from its pinned one.
    pub repinned: bool,
    /// The policy version the call was sent under, and the one when it ended.
    pub policy_version: Option<i64>,
    pub policy_version_end: Option<i64>,
    /// Times an `abort` pause cut the call and it was sent again.
    pub resent: i32,
    /// Where an `abort` pause cut its stream and it was continued.
    pub continued: Vec<super::Continued>,
    /// A retry: attempt 1, 2, … of the call numbered `attempt_of`.
    pub attempt: i32,
    pub attempt_of: Option<i64>,
    /// Outside the agent's trajectory (a side-call rule matched).
    pub side_call: bool,
    pub call_id: String,
    pub rollout_id: String,
    pub sequence: i64,
    pub wire_api: String,
    pub route: Option<String>,
    pub model: Option<String>,
    pub upstream_model: Option<String>,
    pub stream: bool,
    pub status: String,
    pub http_status: Option<i32>,
    pub failure_class: Option<String>,
    pub failure_message: Option<String>,
    pub request: String,
    pub upstream_request: Option<String>,
    pub response: Option<String>,
    pub response_raw: Option<Vec<u8>>,
    pub messages: Option<String>,
    pub tools: Option<String>,
    pub response_message: Option<String>,
    pub tool_calls: Option<String>,
    pub finish_reason: Option<String>,
    pub received_at: i64,
    pub first_byte_at: Option<i64>,
    pub done_at: Option<i64>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub total_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub reasoning_tokens: Option<i64>,
    pub token_capture: String,
    pub prompt_token_ids: Option<Vec<i32>>,
    pub completion_token_ids: Option<Vec<i32>>,
    pub prompt_logprobs: Option<Vec<f64>>,
    pub completion_logprobs: Option<Vec<f64>>,
    pub user_agent: Option<String>,
    /// The API spoken to the upstream when rollcall translated the call.
    pub upstream_api: Option<String>,
    /// The upstream's response bytes when they differ from `response_raw`.
    pub upstream_response_raw: Option<Vec<u8>>,
}

/// A body as text, invalid UTF-8 replaced. `from_utf8` first: its check
/// reads a word at a time, where `from_utf8_lossy`'s reads a byte at a time
/// (about 4 % of the shard thread).
fn text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(b).into_owned(),
    }
}

/// `v` as compact JSON, the text `Value`'s `Display` gives, written into a
/// byte buffer instead of through the formatter, which grew a `String` from
/// empty a piece at a time (about 3k instructions per row under callgrind).
fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A Chat Completions request's messages and tools, left as the harness's
/// own bytes: they already are the normalized form, and an agent's history
/// is the largest part of its request, so it is neither parsed into a tree
/// nor written out again.
#[derive(Deserialize)]
struct ChatParts<'a> {
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
}

/// The `messages` and `tools` columns, from the spans the proxy found
/// when it has them.
fn normalized_columns(
    api: Option<WireApi>,
    request: &[u8],
    spans: Option<&RequestSpans>,
) -> (Option<String>, Option<String>) {
    let raw = |v: Option<&RawValue>| v.map(RawValue::get).map(str::to_owned);
    if api == Some(WireApi::ChatCompletions) {
        if let Some((m, t)) = spans.and_then(|s| s.texts(request)) {
            return (Some(m), t);
        }
        return match serde_json::from_slice::<ChatParts>(request) {
            Ok(p) => (
                Some(raw(p.messages).unwrap_or_else(|| "[]".into())),
                raw(p.tools),
            ),
            Err(_) => (None, None),
        };
    }
    let request: Option<Value> = serde_json::from_slice(request).ok();
    match (api, request) {
        (Some(api), Some(req)) => {
            let n = api.normalize_request(req);
            (json_text(&n.messages), n.tools.as_ref().and_then(json_text))
        }
        _ => (None, None),
    }
}

/// A call the proxy passed as `ok` whose answer says otherwise: the class
/// and message it is recorded with instead. Decided here, where the whole
/// answer is parsed, so that the verdict holds whatever the upstream sent.
fn upstream_verdict(c: &CompletedCall, a: &Assembled) -> Option<(FailureClass, String)> {
    let o = &c.outcome;
    if o.status != CallStatus::Ok || c.response.is_empty() {
        return None;
    }
    if let Some(f) = &a.failure {
        let (class, what) = match f.kind {
            StreamFailureKind::Failed => (
                FailureClass::UpstreamFailed,
                "the upstream reported the response failed",
            ),
            StreamFailureKind::Incomplete => (
                FailureClass::UpstreamIncomplete,
                "the upstream reported the response incomplete",
            ),
            StreamFailureKind::Error => (
                FailureClass::UpstreamStreamError,
                "the upstream's answer carried an error",
            ),
        };
        return Some((class, format!("{what}: {}", f.message)));
    }
    if !a.answer || !a.has_message() {
        return Some((
            FailureClass::UpstreamInvalid,
            "the upstream's answer could not be read as its API's response; its bytes are kept in response_raw".into(),
        ));
    }
    None
}

impl CallRow {
    /// [`CallRow::build`], made safe to run on anything: if assembling the
    /// row panics (a bug, since no parser may panic on input), the call is
    /// still recorded, with its raw bytes and failure class `internal`.
    /// Returns the row and whether it had to be salvaged.
    pub fn build_guarded(c: &CompletedCall) -> (CallRow, bool) {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| CallRow::build(c))) {
            Ok(row) => (row, false),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(call_id = %c.begin.meta.call_id, panic = %crate::redact::redact(&what), "row assembly panicked; the call is kept with its raw bytes");
                let why = format!(
                    "rollcall could not assemble this call's row ({what}); its bytes are kept raw"
                );
                let row = CallRow {
                    status: CallStatus::Failed.as_str().into(),
                    failure_class: Some(FailureClass::Internal.as_str().into()),
                    failure_message: Some(crate::redact::redacted(&why)),
                    ..CallRow::raw(c)
                };
                (row, true)
            }
        }
    }

    /// A row of what the call's frames hold, nothing parsed: the metadata,
    /// the outcome as the proxy saw it, and the raw bytes.
    fn raw(c: &CompletedCall) -> CallRow {
        let m = &c.begin.meta;
        let o = &c.outcome;
        CallRow {
            replica: o.replica.clone(),
            repinned: o.repinned,
            policy_version: o.policy_version,
            policy_version_end: o.policy_version_end,
            resent: i32::try_from(o.resent).unwrap_or(i32::MAX),
            continued: o.continued.clone(),
            attempt: i32::try_from(m.attempt).unwrap_or(i32::MAX),
            attempt_of: m.attempt_of,
            side_call: m.side_call,
            call_id: m.call_id.clone(),
            rollout_id: m.rollout_id.clone(),
            sequence: m.sequence,
            wire_api: m.wire_api.as_str().to_owned(),
            route: m.route.clone(),
            model: m.model.clone(),
            upstream_model: m.upstream_model.clone(),
            stream: m.stream,
            status: o.status.as_str().into(),
            http_status: o.http_status.map(i32::from),
            failure_class: o.failure_class.map(|f| f.as_str().to_owned()),
            failure_message: o.failure_message.as_deref().map(crate::redact::redacted),
            request: text(&c.begin.request),
            upstream_request: c.begin.upstream_request.as_ref().map(|b| text(b)),
            response: None,
            response_raw: (!c.response.is_empty()).then(|| c.response.to_vec()),
            messages: None,
            tools: None,
            response_message: None,
            tool_calls: None,
            finish_reason: None,
            received_at: m.received_at,
            first_byte_at: o.first_byte_at,
            done_at: Some(o.done_at),
            prompt_tokens: None,
            completion_tokens: None,
            total_tokens: None,
            cached_tokens: None,
            reasoning_tokens: None,
            token_capture: "none".into(),
            prompt_token_ids: None,
            completion_token_ids: None,
            prompt_logprobs: None,
            completion_logprobs: None,
            user_agent: m.user_agent.as_deref().map(crate::redact::redacted),
            upstream_api: m.upstream_api.map(|a| a.as_str().to_owned()),
            upstream_response_raw: c.upstream_response.as_ref().map(|b| b.to_vec()),
        }
    }

    /// Assemble a finished call into its row: parse the request, join the
    /// stream, normalize messages. Runs on the shard thread, off the
    /// response path, and again identically on WAL replay.
    pub fn build(c: &CompletedCall) -> CallRow {
        let m = &c.begin.meta;
        let o = &c.outcome;
        let api = Some(m.wire_api);
        let (messages, tools) = normalized_columns(api, &c.begin.request, c.begin.spans.as_ref());
        let mut assembled = match api {
            Some(api) if !c.response.is_empty() && o.http_status.is_some_and(|s| s < 400) => {
                api.assemble(&c.response, m.stream)
            }
            _ => Assembled::default(),
        };
        // Token ids and logprobs come from the upstream's own answer: a
        // translated or stripped response no longer carries them.
        let upstream_api = m.upstream_api.or(api);
        let tokens = match (&c.upstream_response, upstream_api) {
            (Some(up), Some(uapi)) if o.http_status.is_some_and(|s| s < 400) => {
                uapi.assemble(up, m.stream).tokens
            }
            _ => assembled.tokens.clone(),
        };
        let verdict = upstream_verdict(c, &assembled);
        let (status, failure_class) = match &verdict {
            Some((class, _)) => (CallStatus::Failed, Some(*class)),
            None => (o.status, o.failure_class),
        };
        // The upstream's own words about an error event inside a stream.
        let own = o
            .failure_message
            .clone()
            .or_else(|| verdict.map(|(_, m)| m));
        let failure_message = match (own, &assembled.error) {
            (Some(m), Some(e)) => Some(format!("{m}: {e}")),
            (m, e) => m.or_else(|| e.clone()),
        }
        .map(|m| crate::redact::redacted(&m));
        CallRow {
            status: status.as_str().into(),
            failure_class: failure_class.map(|f| f.as_str().to_owned()),
            failure_message,
            // A whole body already is the response (or the error the harness
            // saw); a stream is stored joined back into one object.
            response: if m.stream {
                assembled.response.as_ref().map(compact)
            } else {
                (!c.response.is_empty()).then(|| text(&c.response))
            },
            messages,
            tools,
            response_message: assembled.take_message_json(),
            tool_calls: assembled.take_tool_calls_json(),
            finish_reason: assembled.finish_reason.clone(),
            prompt_tokens: assembled.usage.prompt,
            completion_tokens: assembled.usage.completion,
            total_tokens: assembled.usage.total,
            cached_tokens: assembled.usage.cached,
            reasoning_tokens: assembled.usage.reasoning,
            token_capture: tokens.capture().into(),
            prompt_token_ids: tokens.prompt_ids,
            completion_token_ids: tokens.completion_ids,
            prompt_logprobs: tokens.prompt_logprobs,
            completion_logprobs: tokens.completion_logprobs,
            ..CallRow::raw(c)
        }
    }
}

/// One finished rollout, as stored in `rollouts/*.parquet`.
pub type RolloutRow = RolloutFinish;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_messages_and_tools_keep_the_harness_bytes() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"h\u00e9","n":1.0e0}],"tools":[{"type":"function"}]}"#;
        let (m, t) = normalized_columns(Some(WireApi::ChatCompletions), body, None);
        assert_eq!(
            m.as_deref(),
            Some(r#"[{"role":"user","content":"h\u00e9","n":1.0e0}]"#)
        );
        assert_eq!(t.as_deref(), Some(r#"[{"type":"function"}]"#));
        let (m, t) = normalized_columns(Some(WireApi::ChatCompletions), br#"{"tools":null}"#, None);
        assert_eq!((m.as_deref(), t), (Some("[]"), None));
        assert_eq!(
            normalized_columns(Some(WireApi::ChatCompletions), b"{not json", None),
            (None, None)
        );
    }

    #[test]
    fn other_apis_are_normalized_to_chat_messages() {
        let (m, t) = normalized_columns(Some(WireApi::Completions), br#"{"prompt":"hi"}"#, None);
        assert_eq!(m.as_deref(), Some(r#"[{"role":"user","content":"hi"}]"#));
        assert_eq!(t, None);
        let (m, _) = normalized_columns(
            Some(WireApi::Responses),
            br#"{"instructions":"be brief","input":"hi"}"#,
            None,
        );
        let v: Value = serde_json::from_str(&m.unwrap()).unwrap();
        assert_eq!(v[0]["role"], "system");
        assert_eq!(v[1]["content"], "hi");
        assert_eq!(
            normalized_columns(None, br#"{"prompt":"x"}"#, None),
            (None, None)
        );
    }

    fn completed(api: &str, stream: bool, response: &str) -> CompletedCall {
        use crate::record::{CallBegin, CallMeta, CallOutcome};
        CompletedCall {
            begin: std::sync::Arc::new(CallBegin {
                meta: CallMeta {
                    call_id: "c".into(),
                    rollout_id: "r".into(),
                    sequence: 0,
                    wire_api: crate::dialect::WireApi::parse(api).expect("a wire API name"),
                    route: None,
                    model: None,
                    upstream_model: None,
                    stream,
                    received_at: 1,
                    user_agent: Some("curl/8 authorization: Bearer sk-abcdefgh12345678".into()),
                    upstream_api: None,
                    attempt: 0,
                    attempt_of: None,
                    side_call: false,
                },
                request: bytes::Bytes::from_static(b"{}"),
                upstream_request: None,
                spans: None,
            }),
            outcome: CallOutcome {
                call_id: "c".into(),
                status: CallStatus::Ok,
                http_status: Some(200),
                failure_class: None,
                failure_message: None,
                first_byte_at: None,
                done_at: 2,
                replica: None,
                repinned: false,
                policy_version: None,
                policy_version_end: None,
                resent: 0,
                continued: Vec::new(),
            },
            response: bytes::Bytes::from(response.to_owned()),
            upstream_response: None,
        }
    }

    #[test]
    fn answers_that_are_not_their_apis_shape_or_report_failure_are_failed() {
        let cases = [
            (
                "responses",
                false,
                r#"{"output":"none","status":"completed"}"#,
                Some("upstream_invalid"),
            ),
            (
                "messages",
                false,
                r#"{"content":{"x":null}}"#,
                Some("upstream_invalid"),
            ),
            (
                "chat_completions",
                false,
                r#"{"choices":7}"#,
                Some("upstream_invalid"),
            ),
            ("completions", false, "<html>", Some("upstream_invalid")),
            (
                "chat_completions",
                true,
                "data: {not json\n\n",
                Some("upstream_invalid"),
            ),
            (
                "responses",
                false,
                r#"{"output":[],"status":"failed","error":{"message":"boom"}}"#,
                Some("upstream_failed"),
            ),
            (
                "responses",
                false,
                r#"{"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}],"status":"completed"}"#,
                None,
            ),
            (
                "chat_completions",
                false,
                r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}"#,
                None,
            ),
        ];
        for (api, stream, body, want) in cases {
            let row = CallRow::build(&completed(api, stream, body));
            assert_eq!(row.failure_class.as_deref(), want, "{api} {body}");
            assert_eq!(
                row.status,
                if want.is_some() { "failed" } else { "ok" },
                "{api} {body}"
            );
            assert_eq!(
                row.response_raw.as_deref(),
                Some(body.as_bytes()),
                "raw bytes kept"
            );
            let ua = row.user_agent.unwrap();
            assert!(!ua.contains("sk-abcdefgh12345678"), "{ua}");
        }
    }
}
