//! Tests of the whole-answer and failure reading in `dialect`.

use super::StreamFailureKind::{Error, Failed, Incomplete};
use super::*;

/// A whole Chat Completions body read by its parts reads as it does
/// through a tree of the whole body, and bodies the parts cannot stand
/// for (errors, token capture, odd shapes) go the tree's way.
#[test]
fn whole_chat_answers_read_the_same_by_parts_and_by_tree() {
    let bodies: &[&str] = &[
        r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"h\u00e9 \/ 1.0e0","zeta":1,"alpha":[1.50,2]},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"t","type":"function","function":{"name":"bash","arguments":"{}"}}]},"finish_reason":"tool_calls","token_ids":[1,2],"logprobs":{"content":[{"logprob":-0.5},{"logprob":"x"}]}},{"message":{"content":"second"}}],"usage":null}"#,
        r#"{"choices":[]}"#,
        r#"{"choices":[7]}"#,
        r#"{"choices":null}"#,
        r#"{"choices":{"0":{}}}"#,
        r#"{"choices":[{"message":{"content":"a"}}],"choices":[]}"#,
        r#"{"model":"m"}"#,
        r#"{"error":{"message":"boom"},"choices":[]}"#,
        r#"{"error":null,"choices":[{"message":{"content":"a"}}]}"#,
        r#"{"choices":[{"index":0,"message":{"content":"a"}}],"prompt_token_ids":[5,6],"prompt_logprobs":[null,{"6":{"logprob":-1.0}}]}"#,
        r#"{"choices":[{"index":0,"message":{"content":"a"}}],"sglext":{"input_ids":[1],"output_ids":[[2]]}}"#,
        r#"[1,2]"#,
        r#"{"choices":[{"message":{"content":"a"}}]} trailing"#,
        r#""#,
        // Read by parts: spacing, a null message, odd usage shapes.
        r#" { "choices" : [ { "message" : null , "finish_reason" : 7 } ] , "usage" : [ 1 ] } "#,
        r#"{"choices":[{"message":"text","finish_reason":"stop","logprobs":null,"token_ids":null}],"usage":{"prompt_tokens":2.5,"completion_tokens":"3","total_tokens":-4,"prompt_tokens_details":[1],"completion_tokens_details":{"reasoning_tokens":9}}}"#,
        r#"{"choices":[{"finish_reason":null}],"usage":{"prompt_tokens_details":null,"completion_tokens_details":"x"}}"#,
        r#"{"choices":[{"message":{"content":"a","content":"b"}}],"usage":{"total_tokens":{"n":1}}}"#,
        r#"{"choices":[],"usage":"x"}"#,
        r#"{"choices":[],"usage":true}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":1,"prompt_tokens_details":5,"completion_tokens_details":[{"reasoning_tokens":1}]}}"#,
        // Messages whose text already is the row's, kept as their bytes.
        r#"{"choices":[{"message":{"role":"assistant","content":"a\nb \"q\" \u0001 é","tool_calls":[{"id":"t","type":"function","function":{"name":"bash","arguments":"{\"c\":1}"}}]},"finish_reason":"tool_calls"}]}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":"a","tool_calls":null,"n":-3}}]}"#,
        // Left to the tree: duplicate keys the typed parts refuse.
        r#"{"choices":[{"message":{"content":"a"},"message":{"content":"b"}}]}"#,
        r#"{"choices":[{"message":{"content":"a"}}],"usage":{"total_tokens":1,"total_tokens":2}}"#,
        r#"{"choices":[{}],"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}"#,
    ];
    for body in bodies {
        reads_as_the_tree(body);
    }
    let by_parts = |b: &str| chat::assemble_whole(b.as_bytes()).is_some();
    assert!(by_parts(bodies[0]) && by_parts(bodies[1]) && by_parts(bodies[2]));
    assert!(!by_parts(bodies[4]) && !by_parts(bodies[6]) && !by_parts(bodies[8]));
    assert!(!by_parts(bodies[10]) && !by_parts(bodies[11]));
    assert!(bodies[15..24].iter().all(|b| by_parts(b)));
    assert!(!bodies[24..].iter().any(|b| by_parts(b)));
    let kept =
        |b: &str| chat::assemble_whole(b.as_bytes()).is_some_and(|a| a.message_text.is_some());
    assert!(kept(bodies[1]) && kept(bodies[22]) && kept(bodies[23]));
    assert!(!kept(bodies[0]) && !kept(bodies[16]) && !kept(bodies[18]));
}

/// `assemble` reads a whole Chat Completions `body` as the tree of the
/// whole body does, whichever way it goes; and where the one-pass reader
/// reads it, `serde`'s typed parts read it too, the same.
fn reads_as_the_tree(body: &str) {
    let bytes = body.as_bytes();
    same_reading(
        WireApi::ChatCompletions.assemble(bytes, false),
        WireApi::ChatCompletions.assemble_tree(bytes, false),
        body,
    );
    if let Some(one) = chat::assemble_compact(bytes) {
        let typed = chat::assemble_parts(bytes)
            .unwrap_or_else(|| panic!("read in one pass, refused by parts: {body}"));
        same_reading(one, typed, body);
    }
}

/// `a` and `b`, two readings of `body`, read the same.
fn same_reading(mut a: Assembled, mut b: Assembled, body: &str) {
    assert_eq!(a.has_message(), b.has_message(), "{body}");
    assert_eq!(a.take_message_json(), b.take_message_json(), "{body}");
    assert_eq!(a.take_tool_calls_json(), b.take_tool_calls_json(), "{body}");
    assert_eq!(a.finish_reason, b.finish_reason, "{body}");
    assert_eq!(a.usage, b.usage, "{body}");
    // Debug text: a logprob that is not a number reads as NaN.
    let tokens = |x: &Assembled| format!("{:?}", x.tokens);
    assert_eq!(tokens(&a), tokens(&b), "{body}");
    assert_eq!(a.failure, b.failure, "{body}");
    assert_eq!(a.error, b.error, "{body}");
    assert_eq!(a.answer, b.answer, "{body}");
}

#[test]
fn compact_whole_answers_are_read_in_one_pass() {
    let compact = |b: &str| chat::assemble_compact(b.as_bytes()).is_some();
    for body in [
        // The bench's scripted answer.
        r#"{"id":"chatcmpl-scripted-0","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Reply to: List the files in the repository."},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":10,"completion_tokens":43,"total_tokens":53,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"t","type":"function","function":{"name":"bash","arguments":"{\"c\":1}"}}]},"finish_reason":"tool_\nc"}],"usage":{"prompt_tokens":-1}}"#,
        r#"{"choices":[],"usage":[{"prompt_tokens":1}],"error":null}"#,
    ] {
        assert!(compact(body), "{body}");
        reads_as_the_tree(body);
    }
    for body in [
        r#"{"choices":[{"message":{"content":"a"}}],"created":1.5}"#,
        r#"{"choices":[{"message":null}]}"#,
        r#"{"choices":[{"message":{"content":"a"},"logprobs":{"content":[]}}]}"#,
        r#"{"choices":[{"message":{"content":"a"}}],"error":{"message":"x"}}"#,
        r#"{"choices":[{"message":{"content":"a"}}],"id":"a","id":"b"}"#,
        r#"{"usage":{}}"#,
        r#"{"choices":[{"message":{"content":"a"}}]} "#,
        r#"{"choices":[{"message":{"content":"\u00e9"}}]}"#,
    ] {
        assert!(!compact(body), "{body}");
        reads_as_the_tree(body);
    }
}

mod compact {
    use super::reads_as_the_tree;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn scalar() -> impl Strategy<Value = Value> + Clone {
        prop_oneof![
            3 => Just(Value::Null),
            1 => any::<bool>().prop_map(Value::from),
            2 => (-999_999_999_999i64..999_999_999_999).prop_map(Value::from),
            2 => r#"[a-c"\\\n\x01é ]{0,4}"#.prop_map(Value::from),
            1 => Just(json!([1, {"a": null}])),
            2 => Just(json!([7, 8])),
        ]
    }

    /// An object of some of `keys` (repeats are dropped), each with a value
    /// from `value`.
    fn object(
        keys: &'static [&'static str],
        value: impl Strategy<Value = Value> + Clone,
    ) -> impl Strategy<Value = Value> + Clone {
        prop::collection::vec((prop::sample::select(keys), value), 0..6)
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.into(), v)).collect()))
    }

    /// Mostly `null`, sometimes anything.
    fn mostly_null() -> impl Strategy<Value = Value> + Clone {
        prop_oneof![4 => Just(Value::Null), 1 => scalar()]
    }

    /// `(key, value)` when `Some`.
    fn field(
        key: &'static str,
        value: impl Strategy<Value = Value>,
    ) -> impl Strategy<Value = Option<(&'static str, Value)>> {
        prop::option::weighted(0.8, value.prop_map(move |v| (key, v)))
    }

    /// An object of `fields` that are there, then of `extra`'s keys not
    /// among them.
    fn join(fields: Vec<Option<(&'static str, Value)>>, extra: Value) -> Value {
        let mut m: serde_json::Map<String, Value> = fields
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.into(), v))
            .collect();
        if let Value::Object(e) = extra {
            for (k, v) in e {
                m.entry(k).or_insert(v);
            }
        }
        Value::Object(m)
    }

    fn answer() -> impl Strategy<Value = Value> {
        let detail = object(&["cached_tokens", "reasoning_tokens", "x"], scalar());
        let usage = object(
            &[
                "prompt_tokens",
                "completion_tokens",
                "total_tokens",
                "prompt_tokens_details",
                "completion_tokens_details",
            ],
            prop_oneof![scalar(), detail],
        );
        let message = prop_oneof![
            4 => object(&["role", "content", "tool_calls", "refusal"], scalar()),
            1 => scalar(),
        ];
        let finish = prop_oneof![
            2 => "[a-z_\\\n]{0,6}".prop_map(Value::from),
            1 => scalar(),
        ];
        let choice = (
            field("message", message),
            field("finish_reason", finish),
            object(
                &["index", "logprobs", "token_ids", "prompt_token_ids"],
                mostly_null(),
            ),
        )
            .prop_map(|(m, f, extra)| join(vec![m, f], extra));
        let choices = prop_oneof![
            6 => prop::collection::vec(prop_oneof![6 => choice, 1 => scalar()], 0..3)
                .prop_map(Value::Array),
            1 => scalar(),
        ];
        (
            field("choices", choices),
            field("usage", prop_oneof![3 => usage, 1 => scalar()]),
            object(
                &["id", "error", "prompt_token_ids", "sglext"],
                mostly_null(),
            ),
        )
            .prop_map(|(c, u, extra)| join(vec![c, u], extra))
    }

    proptest! {
        /// Answers as `serde_json` writes them (and pretty, which is not
        /// the form the one-pass reader reads) read the same every way.
        #[test]
        fn generated_answers_read_the_same(v in answer(), pretty in any::<bool>()) {
            let body = if pretty {
                serde_json::to_string_pretty(&v).unwrap()
            } else {
                serde_json::to_string(&v).unwrap()
            };
            reads_as_the_tree(&body);
        }

        /// The bench's answer with a few bytes changed: valid or not, it
        /// reads the same every way.
        #[test]
        fn mutated_answers_read_the_same(
            edits in prop::collection::vec((0usize..400, r#"["{}\\\[\],:0-9a-z.\-eE ]{0,2}"#, 0usize..3), 1..4)
        ) {
            let mut body = r#"{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":null},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":10,"completion_tokens":43,"total_tokens":53,"prompt_tokens_details":{"cached_tokens":0}}}"#.to_owned();
            for (at, insert, remove) in edits {
                let at = at % (body.len() + 1);
                let end = (at + remove).min(body.len());
                body.replace_range(at..end, &insert);
            }
            reads_as_the_tree(&body);
        }
    }
}

fn failure(api: WireApi, body: &str, stream: bool) -> Option<(StreamFailureKind, String)> {
    api.assemble(body.as_bytes(), stream)
        .failure
        .map(|f| (f.kind, f.message))
}

fn err(kind: StreamFailureKind, m: &str) -> Option<(StreamFailureKind, String)> {
    Some((kind, m.to_owned()))
}

#[test]
fn chat_and_completions_error_chunks_and_bodies() {
    let s = concat!(
        "data: {\"id\":\"c\",\"error\":null,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}\n\n",
    );
    for api in [WireApi::ChatCompletions, WireApi::Completions] {
        assert_eq!(failure(api, s, true), err(Error, "out of memory"));
        let a = api.assemble(s.as_bytes(), true);
        // The error text stays what it was; an `"error": null` chunk is
        // an ordinary chunk.
        assert_eq!(
            a.error.as_deref(),
            Some("{\"message\":\"out of memory\",\"type\":\"server_error\"}")
        );
        assert!(a.response.is_some());
        let body = "{\"error\":{\"message\":\"bad\",\"code\":500}}";
        assert_eq!(failure(api, body, false), err(Error, "bad"));
        assert_eq!(
            failure(api, "{\"error\":\"plain\"}", false),
            err(Error, "plain")
        );
        assert_eq!(
            failure(api, "{\"id\":\"c\",\"error\":null,\"choices\":[]}", false),
            None
        );
    }
    let ok =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n";
    assert_eq!(failure(WireApi::ChatCompletions, ok, true), None);
}

#[test]
fn responses_failed_incomplete_and_error_events() {
    let failed = concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
        "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"output\":[]}}\n\n",
    );
    assert_eq!(
        failure(WireApi::Responses, failed, true),
        err(Failed, "boom")
    );
    assert_eq!(
        WireApi::Responses
            .assemble(failed.as_bytes(), true)
            .finish_reason
            .as_deref(),
        Some("error")
    );
    let incomplete = "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"output\":[]}}\n\n";
    let a = WireApi::Responses.assemble(incomplete.as_bytes(), true);
    assert_eq!(a.finish_reason.as_deref(), Some("length"));
    assert_eq!(
        a.failure.map(|f| (f.kind, f.message)),
        err(Incomplete, "incomplete: max_output_tokens")
    );
    let no_object = "data: {\"type\":\"response.failed\",\"response\":null}\n\n";
    assert_eq!(
        failure(WireApi::Responses, no_object, true),
        err(Failed, "the upstream sent response.failed")
    );
    let error = "event: error\ndata: {\"type\":\"error\",\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\",\"param\":null}\n\n";
    assert_eq!(
        failure(WireApi::Responses, error, true),
        err(Error, "slow down")
    );
    assert!(WireApi::Responses
        .assemble(error.as_bytes(), true)
        .error
        .is_some());
    // A stream cut short is rebuilt as incomplete, but that is not the
    // upstream's report.
    let cut =
        "data: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"x\"}\n\n";
    assert_eq!(failure(WireApi::Responses, cut, true), None);
    // Whole bodies.
    let body = "{\"object\":\"response\",\"status\":\"failed\",\"error\":{\"message\":\"no\"},\"output\":[]}";
    assert_eq!(failure(WireApi::Responses, body, false), err(Failed, "no"));
    let body = "{\"object\":\"response\",\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"content_filter\"}}";
    assert_eq!(
        failure(WireApi::Responses, body, false),
        err(Incomplete, "incomplete: content_filter")
    );
    let ok = "{\"object\":\"response\",\"status\":\"completed\",\"error\":null,\"output\":[]}";
    assert_eq!(failure(WireApi::Responses, ok, false), None);
    let err_body = "{\"error\":{\"message\":\"bad key\",\"type\":\"invalid_request_error\"}}";
    assert_eq!(
        failure(WireApi::Responses, err_body, false),
        err(Error, "bad key")
    );
}

#[test]
fn messages_error_events_and_bodies() {
    let s = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{}}}\n\n",
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    );
    assert_eq!(
        failure(WireApi::Messages, s, true),
        err(Error, "Overloaded")
    );
    let a = WireApi::Messages.assemble(s.as_bytes(), true);
    assert_eq!(
        a.error.as_deref(),
        Some("{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}")
    );
    let body = "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal\"}}";
    assert_eq!(
        failure(WireApi::Messages, body, false),
        err(Error, "Internal")
    );
    let ok = "{\"type\":\"message\",\"content\":[],\"stop_reason\":\"end_turn\"}";
    assert_eq!(failure(WireApi::Messages, ok, false), None);
}
