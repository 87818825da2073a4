//! OpenAI Chat Completions: assemble a chunk stream into one
//! `chat.completion`, and read the fields a trainer needs from it.

use super::canonical::Scan;
use super::{
    int_at, push_name, push_str, sse::Event, tokens, Assembled, StreamOutcome, Usage, WireApi,
};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// What a row reads of a whole `chat.completion`, the rest (ids, model,
/// timestamps, further choices) skipped rather than built into a tree:
/// parsing every answer into a `Value` was a quarter of the shard thread.
#[derive(Deserialize)]
struct WholeParts<'a> {
    #[serde(borrow)]
    choices: Option<Vec<&'a RawValue>>,
    usage: Option<ObjectOr<UsageParts>>,
    // Read by the general path (an error, token capture); a body with any
    // of them goes there.
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_token_ids: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_logprobs: Option<&'a RawValue>,
    #[serde(borrow)]
    sglext: Option<&'a RawValue>,
}

/// The first choice's parts. The message becomes a tree only when its text
/// is not already the row's (`canonical`); a choice with token capture
/// fields is read whole, as the tree path reads it.
#[derive(Deserialize)]
struct ChoiceParts<'a> {
    /// `Some("null")` for `"message": null`, which the tree path keeps too.
    #[serde(borrow, default, deserialize_with = "present")]
    message: Option<&'a RawValue>,
    finish_reason: Option<Value>,
    #[serde(borrow)]
    logprobs: Option<&'a RawValue>,
    #[serde(borrow)]
    token_ids: Option<&'a RawValue>,
    /// SGLang's name for `token_ids` on a whole chat answer.
    #[serde(borrow)]
    response_token_ids: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_token_ids: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_logprobs: Option<&'a RawValue>,
}

/// A field that is there, even as `null`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// `usage` and its details as [`usage`] reads them, typed and in the same
/// pass as the rest of the answer: three nested maps built as trees cost
/// more than the rest of the answer, and reading each of them again from
/// its raw text scanned the usage three times.
#[derive(Deserialize, Default)]
struct UsageParts {
    prompt_tokens: Option<Value>,
    completion_tokens: Option<Value>,
    total_tokens: Option<Value>,
    prompt_tokens_details: Option<ObjectOr<CachedParts>>,
    completion_tokens_details: Option<ObjectOr<ReasoningParts>>,
}

#[derive(Deserialize, Default)]
struct CachedParts {
    cached_tokens: Option<Value>,
}

#[derive(Deserialize, Default)]
struct ReasoningParts {
    reasoning_tokens: Option<Value>,
}

/// `T` read from an object, and `T::default()` for any other value: a path
/// step into anything but an object finds nothing, where serde would also
/// read `T` from an array. An object `T` cannot stand for (a duplicate key,
/// a field of another type) fails the whole read, and the general path
/// reads the body.
struct ObjectOr<T>(T);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for ObjectOr<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjectOrVisitor(std::marker::PhantomData))
    }
}

struct ObjectOrVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de> + Default> serde::de::Visitor<'de> for ObjectOrVisitor<T> {
    type Value = ObjectOr<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(ObjectOr)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(ObjectOr(T::default()))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(ObjectOr(T::default()))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(ObjectOr(T::default()))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(ObjectOr(T::default()))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(ObjectOr(T::default()))
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(ObjectOr(T::default()))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(ObjectOr(T::default()))
    }
}

/// What an optional [`ObjectOr`] holds, or the default when it is absent
/// or `null`.
fn or_default<T: Default>(v: Option<ObjectOr<T>>) -> T {
    v.map(|o| o.0).unwrap_or_default()
}

fn int(v: Option<Value>) -> Option<i64> {
    v.as_ref().and_then(Value::as_i64)
}

/// Read a whole (not streamed) answer as [`WireApi::assemble`] does, from
/// its first choice and usage only. `None` when the general path must read
/// it: not an object of that shape, no `choices` array, a duplicate key,
/// an error, or top-level token capture fields.
pub fn assemble_whole(body: &[u8]) -> Option<Assembled> {
    assemble_compact(body).or_else(|| assemble_parts(body))
}

/// [`assemble_parts`]'s reading of a body already in the form `serde_json`
/// writes (`canonical`), in one pass and with no tree. `None` for any body
/// it does not read the same way, down to the byte: any other form, a
/// `null` or absent `choices` or message, an error or token capture field;
/// those go `serde`'s way.
pub(super) fn assemble_compact(body: &[u8]) -> Option<Assembled> {
    let mut s = Scan::new(std::str::from_utf8(body).ok()?)?;
    let mut out = Assembled {
        answer: true,
        ..Assembled::default()
    };
    let (mut choices, mut message, mut tool_calls) = (false, None, None);
    s.object(|s, key| match key {
        b"choices" if s.peek() == Some(b'[') => {
            choices = true;
            s.array(|s, n| match n {
                0 => s.object(|s, key| match key {
                    b"message" if s.peek() == Some(b'{') => {
                        let start = s.at();
                        tool_calls = s.object_field(b"tool_calls")?;
                        message = Some(start..s.at());
                        Some(())
                    }
                    b"message" => None,
                    b"finish_reason" => {
                        out.finish_reason = s.string()?;
                        Some(())
                    }
                    b"logprobs"
                    | b"token_ids"
                    | b"response_token_ids"
                    | b"prompt_token_ids"
                    | b"prompt_logprobs" => null(s),
                    _ => s.value().map(drop),
                }),
                _ => s.value().map(drop),
            })
        }
        b"choices" => None,
        b"usage" => scan_usage(s, &mut out.usage),
        b"error" | b"prompt_token_ids" | b"prompt_logprobs" | b"sglext" => null(s),
        _ => s.value().map(drop),
    })?;
    if !s.done() || !choices {
        return None;
    }
    out.message_text = message.map(|m| s.text(m).to_owned());
    out.tool_calls_text = tool_calls.map(|t| s.text(t).to_owned());
    Some(out)
}

/// Read a `null`; any other value stops [`assemble_compact`].
fn null(s: &mut Scan) -> Option<()> {
    let v = s.value()?;
    (s.text(v) == "null").then_some(())
}

/// Read `usage` into `u` as [`UsageParts`] in an [`ObjectOr`] reads it.
fn scan_usage(s: &mut Scan, u: &mut Usage) -> Option<()> {
    if s.peek() != Some(b'{') {
        return s.value().map(drop);
    }
    s.object(|s, key| {
        match key {
            b"prompt_tokens" => u.prompt = s.int()?,
            b"completion_tokens" => u.completion = s.int()?,
            b"total_tokens" => u.total = s.int()?,
            b"prompt_tokens_details" => u.cached = detail(s, b"cached_tokens")?,
            b"completion_tokens_details" => u.reasoning = detail(s, b"reasoning_tokens")?,
            _ => {
                s.value()?;
            }
        }
        Some(())
    })
}

/// A usage detail's integer at `key`, when the detail is an object.
fn detail(s: &mut Scan, key: &[u8]) -> Option<Option<i64>> {
    if s.peek() != Some(b'{') {
        return s.value().map(|_| None);
    }
    let mut found = None;
    s.object(|s, k| {
        let n = s.int()?;
        if k == key {
            found = n;
        }
        Some(())
    })?;
    Some(found)
}

/// [`assemble_whole`] by way of `serde`: the parts a row reads, typed.
pub(super) fn assemble_parts(body: &[u8]) -> Option<Assembled> {
    let parts: WholeParts = serde_json::from_slice(body).ok()?;
    if parts.error.is_some()
        || parts.prompt_token_ids.is_some()
        || parts.prompt_logprobs.is_some()
        || parts.sglext.is_some()
    {
        return None;
    }
    let choices = parts.choices?;
    let u = or_default(parts.usage);
    let cached = or_default(u.prompt_tokens_details);
    let reasoning = or_default(u.completion_tokens_details);
    let mut out = Assembled {
        answer: true,
        usage: Usage {
            prompt: int(u.prompt_tokens),
            completion: int(u.completion_tokens),
            total: int(u.total_tokens),
            cached: int(cached.cached_tokens),
            reasoning: int(reasoning.reasoning_tokens),
        },
        ..Assembled::default()
    };
    let Some(first) = choices.first().map(|c| c.get()) else {
        return Some(out);
    };
    if !first.starts_with('{') {
        return None;
    }
    let choice: ChoiceParts = serde_json::from_str(first).ok()?;
    if choice.logprobs.is_some()
        || choice.token_ids.is_some()
        || choice.response_token_ids.is_some()
        || choice.prompt_token_ids.is_some()
        || choice.prompt_logprobs.is_some()
    {
        let resp = json!({ "choices": [serde_json::from_str::<Value>(first).ok()?] });
        out.tokens = tokens::read(WireApi::ChatCompletions, &resp);
    }
    out.finish_reason = choice
        .finish_reason
        .as_ref()
        .and_then(Value::as_str)
        .map(str::to_owned);
    let Some(raw) = choice.message.map(RawValue::get) else {
        return Some(out);
    };
    if let Some(c) = super::canonical::canonical(raw) {
        out.tool_calls_text = c.tool_calls.and_then(|s| raw.get(s)).map(str::to_owned);
        out.message_text = Some(raw.to_owned());
        return Some(out);
    }
    let msg: Value = serde_json::from_str(raw).ok()?;
    out.tool_calls = msg.get("tool_calls").filter(|t| !t.is_null()).cloned();
    out.message = Some(msg);
    Some(out)
}

#[derive(Default)]
struct ChoiceAcc {
    role: Option<String>,
    content: Option<String>,
    reasoning: Option<String>,
    refusal: Option<String>,
    tool_calls: BTreeMap<u64, ToolCallAcc>,
    finish_reason: Option<Value>,
    logprobs: Vec<Value>,
    token_ids: Option<Vec<Value>>,
    prompt_token_ids: Option<Value>,
}

impl ChoiceAcc {
    /// The completion's ids, unless they are fewer or more than the tokens
    /// the stream says it sampled (its logprobs, one per token, or the
    /// usage's `completion_tokens` when `usage` is this choice's alone):
    /// then none, rather than ids with a hole in them (which would be taken
    /// for the answer's tokens). A server may put several tokens' ids on
    /// one chunk and none on the next, so chunks are not counted.
    fn complete_ids(&mut self, index: u64, usage: Option<u64>) -> Option<Vec<Value>> {
        let ids = self.token_ids.take()?;
        let n = ids.len();
        let logprobs = (!self.logprobs.is_empty()).then_some(self.logprobs.len());
        let sampled = logprobs.or(usage.and_then(|u| usize::try_from(u).ok()));
        match sampled {
            Some(k) if k != n => {
                tracing::warn!(
                    choice = index,
                    ids = n,
                    tokens = k,
                    "a stream's token ids do not cover its tokens (some chunks came without theirs): its completion ids are not recorded"
                );
                None
            }
            _ => Some(ids),
        }
    }
}

#[derive(Default)]
struct ToolCallAcc {
    id: Option<String>,
    kind: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// Join `chat.completion.chunk` events into one `chat.completion`.
pub fn assemble_stream(events: &[Event]) -> StreamOutcome {
    let mut head = Map::new();
    let mut choices: BTreeMap<u64, ChoiceAcc> = BTreeMap::new();
    let mut usage = None;
    let mut outcome = StreamOutcome::default();
    let mut extra = Map::new();
    let mut seen = false;
    for ev in events {
        if ev.data == "[DONE]" {
            continue;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&ev.data) else {
            continue;
        };
        if let Some(e) = chunk.get("error").filter(|e| !e.is_null()) {
            outcome.note_error(e);
            continue;
        }
        seen = true;
        for key in [
            "id",
            "created",
            "model",
            "system_fingerprint",
            "service_tier",
        ] {
            if let Some(v) = chunk.get(key) {
                if !v.is_null() {
                    head.insert(key.into(), v.clone());
                }
            }
        }
        // vLLM puts prompt token ids on the first chunk.
        for key in ["prompt_token_ids", "prompt_logprobs"] {
            if let Some(v) = chunk.get(key).filter(|v| !v.is_null()) {
                extra.insert(key.into(), v.clone());
            }
        }
        // SGLang's response-level extension (token ids arrive in a final
        // `choices: []` chunk): fields from every chunk, merged.
        if let Some(ext) = chunk.get("sglext").and_then(Value::as_object) {
            let merged = extra
                .entry("sglext")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(m) = merged.as_object_mut() {
                m.extend(ext.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        for c in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            let acc = choices.entry(idx).or_default();
            if let Some(d) = c.get("delta") {
                if let Some(r) = d.get("role").and_then(Value::as_str) {
                    acc.role = Some(r.into());
                }
                push_str(&mut acc.content, d.get("content"));
                push_str(&mut acc.reasoning, d.get("reasoning_content"));
                push_str(&mut acc.reasoning, d.get("reasoning"));
                push_str(&mut acc.refusal, d.get("refusal"));
                for tc in d
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let ti = tc.get("index").and_then(Value::as_u64).unwrap_or(0);
                    let t = acc.tool_calls.entry(ti).or_default();
                    if let Some(id) = tc.get("id").and_then(Value::as_str) {
                        t.id = Some(id.into());
                    }
                    if let Some(k) = tc.get("type").and_then(Value::as_str) {
                        t.kind = Some(k.into());
                    }
                    if let Some(f) = tc.get("function") {
                        if let Some(n) = f.get("name").and_then(Value::as_str) {
                            push_name(&mut t.name, n);
                        }
                        if let Some(a) = f.get("arguments").and_then(Value::as_str) {
                            t.arguments.push_str(a);
                        }
                    }
                }
            }
            if let Some(f) = c.get("finish_reason").filter(|f| !f.is_null()) {
                acc.finish_reason = Some(f.clone());
            }
            if let Some(lp) = super::at(c, &["logprobs", "content"]).and_then(Value::as_array) {
                acc.logprobs.extend(lp.iter().cloned());
            }
            if let Some(t) = c.get("token_ids").and_then(Value::as_array) {
                acc.token_ids
                    .get_or_insert_with(Vec::new)
                    .extend(t.iter().cloned());
            }
            if let Some(p) = c.get("prompt_token_ids").filter(|p| !p.is_null()) {
                acc.prompt_token_ids.get_or_insert_with(|| p.clone());
            }
        }
    }
    if !seen {
        return outcome;
    }
    let mut obj = head;
    obj.insert("object".into(), json!("chat.completion"));
    // The usage counts every choice's tokens: one choice's check only.
    let usage_completion = (choices.len() == 1)
        .then(|| {
            usage
                .as_ref()
                .and_then(|u| u.get("completion_tokens"))
                .and_then(Value::as_u64)
        })
        .flatten();
    let choices: Vec<Value> = choices
        .into_iter()
        .map(|(index, mut a)| {
            let ids = a.complete_ids(index, usage_completion);
            let mut msg = Map::new();
            msg.insert("role".into(), json!(a.role.unwrap_or_else(|| "assistant".into())));
            msg.insert("content".into(), a.content.map_or(Value::Null, Value::String));
            if let Some(r) = a.reasoning {
                msg.insert("reasoning_content".into(), json!(r));
            }
            if let Some(r) = a.refusal {
                msg.insert("refusal".into(), json!(r));
            }
            if !a.tool_calls.is_empty() {
                let calls: Vec<Value> = a
                    .tool_calls
                    .into_values()
                    .map(|t| {
                        json!({
                            "id": t.id,
                            "type": t.kind.unwrap_or_else(|| "function".into()),
                            "function": {"name": t.name, "arguments": t.arguments},
                        })
                    })
                    .collect();
                msg.insert("tool_calls".into(), Value::Array(calls));
            }
            let mut choice = json!({
                "index": index,
                "message": msg,
                "finish_reason": a.finish_reason,
                "logprobs": if a.logprobs.is_empty() { Value::Null } else { json!({"content": a.logprobs}) },
            });
            if let Some(t) = ids {
                choice["token_ids"] = Value::Array(t);
            }
            if let Some(p) = a.prompt_token_ids {
                choice["prompt_token_ids"] = p;
            }
            choice
        })
        .collect();
    obj.insert("choices".into(), Value::Array(choices));
    obj.insert("usage".into(), usage.unwrap_or(Value::Null));
    obj.extend(extra);
    outcome.response = Some(Value::Object(obj));
    outcome
}

/// Read message, tool calls, usage and tokens from a `chat.completion`.
pub fn extract(resp: &Value, out: &mut Assembled) {
    let choice = super::at(resp, &["choices", "0"]);
    if let Some(msg) = choice.and_then(|c| c.get("message")) {
        out.message = Some(msg.clone());
        out.tool_calls = msg.get("tool_calls").filter(|t| !t.is_null()).cloned();
    }
    out.finish_reason = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    out.usage = usage(resp.get("usage").unwrap_or(&Value::Null));
    out.tokens = tokens::read(WireApi::ChatCompletions, resp);
}

pub(crate) fn usage(u: &Value) -> Usage {
    Usage {
        prompt: int_at(u, &["prompt_tokens"]),
        completion: int_at(u, &["completion_tokens"]),
        total: int_at(u, &["total_tokens"]),
        cached: int_at(u, &["prompt_tokens_details", "cached_tokens"]),
        reasoning: int_at(u, &["completion_tokens_details", "reasoning_tokens"]),
    }
}

#[cfg(test)]
mod tests {
    use super::super::sse::parse_all;

    #[test]
    fn assembles_content_and_tool_call_deltas() {
        let stream = concat!(
            "data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
            "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
            "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"bash\",\"arguments\":\"{\\\"cmd\\\":\"}}]}}]}\n\n",
            "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"ls\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n",
            "data: [DONE]\n\n"
        );
        let a = crate::dialect::WireApi::ChatCompletions.assemble(stream.as_bytes(), true);
        let msg = a.message.unwrap();
        assert_eq!(msg["content"], "Hello");
        assert_eq!(
            msg["tool_calls"][0]["function"]["arguments"],
            "{\"cmd\":\"ls\"}"
        );
        assert_eq!(a.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(a.usage.total, Some(8));
        assert_eq!(parse_all(stream.as_bytes()).len(), 6);
    }

    #[test]
    fn a_stream_with_ids_on_some_chunks_only_records_no_completion_ids() {
        // vLLM's shape: each chunk its token's logprob and id.
        let chunk = |content: &str, ids: Option<&str>| {
            let ids = ids.map_or(String::new(), |i| format!(",\"token_ids\":[{i}]"));
            format!("data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"logprobs\":{{\"content\":[{{\"token\":\"{content}\",\"logprob\":-0.5}}]}}{ids}}}]}}\n\n")
        };
        let whole = [
            "data: {\"id\":\"c1\",\"prompt_token_ids\":[7,8],\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n".to_owned(),
            chunk("Hel", Some("1")),
            chunk("lo", Some("2")),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let a = crate::dialect::WireApi::ChatCompletions.assemble(whole.as_bytes(), true);
        assert_eq!(a.tokens.completion_ids, Some(vec![1, 2]));
        // The role chunk has no output, so no ids are owed for it; a text
        // chunk without ids leaves a token without one.
        let gap = [
            chunk("Hel", Some("1")),
            chunk("lo", None),
            chunk("!", Some("3")),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let a = crate::dialect::WireApi::ChatCompletions.assemble(gap.as_bytes(), true);
        assert_eq!(a.message.unwrap()["content"], "Hello!");
        assert_eq!(
            a.tokens.completion_ids, None,
            "never ids with a hole in them"
        );
    }
}
