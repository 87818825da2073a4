//! Token capture for routes served by vLLM or SGLang: ask the server for the
//! prompt token ids, the sampled token ids and per-token logprobs of a Chat
//! Completions or legacy Completions call, then take back out of the response
//! what the harness did not ask for, so it sees what it would have seen
//! without the proxy. The recorded row keeps the ids and logprobs. Nothing
//! is ever re-tokenized: what a server does not return stays absent, and the
//! row's `token_capture` column says what it holds. See `docs/tokens.md`.
//!
//! Use, per call:
//! 1. `prepare` on the request body going upstream; keep the [`Asked`].
//! 2. Read the tokens from the upstream's own response, before stripping:
//!    [`extract`] on the whole response, or on a stream assembled with
//!    [`WireApi::assemble`].
//! 3. Pass the harness [`strip`]ped responses, or each parsed stream chunk
//!    through [`strip_chunk`] (dropping the chunks it says to drop).
//!
//! Only Chat Completions and Completions apply; a route translates Responses
//! and Messages calls to Chat Completions before they reach these functions.

use super::{tokens, Tokens, WireApi};
use serde_json::{Map, Value};

/// The server software behind a route, which decides the request fields and
/// response shapes used for token capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureKind {
    Vllm,
    Sglang,
}

impl CaptureKind {
    /// The route kind as written in configuration: `vllm` or `sglang`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "vllm" => Some(Self::Vllm),
            "sglang" => Some(Self::Sglang),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        }
    }
}

/// Why a request cannot be prepared for token capture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    /// token capture applies to chat completions and completions, not {0}
    #[error("token capture applies to chat completions and completions, not {0}")]
    UnsupportedApi(&'static str),
}

/// What the harness itself asked for, read before `prepare` changed the
/// request, and what `prepare` changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asked {
    pub stream: bool,
    /// Completions `echo`: the prompt is prepended to the text (and, with
    /// logprobs, its positions to the logprobs).
    pub echo: bool,
    /// The harness asked for logprobs (chat `logprobs: true`; completions
    /// `logprobs: <int>`).
    pub logprobs: bool,
    /// `return_token_ids` (vLLM; SGLang).
    pub token_ids: bool,
    /// SGLang `return_prompt_token_ids`.
    pub prompt_token_ids: bool,
    /// SGLang `return_input_ids_in_sglext`.
    pub sglext_input_ids: bool,
    /// SGLang `return_output_ids_in_sglext`.
    pub sglext_output_ids: bool,
    /// Request fields `prepare` set, each with the harness's own value
    /// (`None` when the harness did not send the field).
    pub added: Vec<(&'static str, Option<Value>)>,
}

/// What to do with one stream chunk after [`strip_chunk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkFate {
    /// Pass the (possibly changed) chunk on.
    Keep,
    /// The chunk existed only to carry data the harness did not ask for
    /// (SGLang's final `sglext` ids chunk): do not pass it on.
    Drop,
}

/// Whether token capture applies to calls of this API.
pub fn applies(api: WireApi) -> bool {
    matches!(api, WireApi::ChatCompletions | WireApi::Completions)
}

/// A request flag as the servers' pydantic models would read it.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => matches!(s.to_ascii_lowercase().as_str(), "true" | "1"),
        _ => false,
    }
}

/// Add to `request` the fields that make `kind` return token ids and
/// logprobs for `api`, and return what the harness had asked for itself.
/// Fields the harness set are never lowered or replaced (`logprobs: true,
/// top_logprobs: 5` stays exactly that).
pub fn prepare(
    kind: CaptureKind,
    api: WireApi,
    request: &mut Map<String, Value>,
) -> Result<Asked, CaptureError> {
    if !applies(api) {
        return Err(CaptureError::UnsupportedApi(api.as_str()));
    }
    let chat = api == WireApi::ChatCompletions;
    let lp = request.get("logprobs");
    let mut asked = Asked {
        stream: truthy(request.get("stream")),
        echo: !chat && truthy(request.get("echo")),
        // Completions `logprobs` is a count: 0 asks for the sampled token's.
        logprobs: if chat {
            truthy(lp)
        } else {
            !matches!(lp, None | Some(Value::Null) | Some(Value::Bool(false)))
        },
        token_ids: truthy(request.get("return_token_ids")),
        prompt_token_ids: truthy(request.get("return_prompt_token_ids")),
        sglext_input_ids: truthy(request.get("return_input_ids_in_sglext")),
        sglext_output_ids: truthy(request.get("return_output_ids_in_sglext")),
        added: Vec::new(),
    };
    // `top_logprobs` without `logprobs: true` is an error on both servers;
    // such a request is left as the harness wrote it.
    let top_alone = request
        .get("top_logprobs")
        .and_then(Value::as_f64)
        .is_some_and(|n| n > 0.0);
    let mut added = Vec::new();
    let mut set = |key: &'static str, value: Value, added: &mut Vec<_>| {
        let old = request.insert(key.into(), value);
        added.push((key, old));
    };
    if !asked.logprobs {
        if !chat {
            set("logprobs", Value::from(0), &mut added);
        } else if !top_alone {
            set("logprobs", Value::Bool(true), &mut added);
        }
    }
    let on = || Value::Bool(true);
    match (kind, api, asked.stream) {
        (CaptureKind::Vllm, _, _) | (CaptureKind::Sglang, WireApi::Completions, _) => {
            if !asked.token_ids {
                set("return_token_ids", on(), &mut added);
            }
        }
        // SGLang refuses `return_token_ids` / `return_prompt_token_ids` on
        // a streamed chat call (400); its `sglext` flags work on both.
        (CaptureKind::Sglang, _, true) => {
            if !asked.sglext_input_ids {
                set("return_input_ids_in_sglext", on(), &mut added);
            }
            if !asked.sglext_output_ids {
                set("return_output_ids_in_sglext", on(), &mut added);
            }
        }
        (CaptureKind::Sglang, _, false) => {
            if !asked.token_ids {
                set("return_token_ids", on(), &mut added);
            }
            if !asked.prompt_token_ids {
                set("return_prompt_token_ids", on(), &mut added);
            }
        }
    }
    asked.added = added;
    Ok(asked)
}

/// Take out of a whole response what `prepare` caused and the harness did
/// not ask for. Odd input (not an object, no choices) is left as it is.
pub fn strip(kind: CaptureKind, api: WireApi, asked: &Asked, response: &mut Value) {
    let _ = strip_value(kind, api, asked, response);
}

/// [`strip`] for one parsed stream chunk.
pub fn strip_chunk(kind: CaptureKind, api: WireApi, asked: &Asked, chunk: &mut Value) -> ChunkFate {
    if !strip_value(kind, api, asked, chunk) {
        return ChunkFate::Keep;
    }
    // The chunk lost its whole `sglext`: drop it if nothing else is left.
    let no_choices = chunk
        .get("choices")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    let no_usage = chunk.get("usage").is_none_or(Value::is_null);
    if no_choices && no_usage {
        ChunkFate::Drop
    } else {
        ChunkFate::Keep
    }
}

/// Remove one field the way `kind` writes an absent value: vLLM serializes
/// every field of its response models (`null` when unset); SGLang's models
/// drop `token_ids` / `prompt_token_ids` when unset.
fn unset(kind: CaptureKind, obj: &mut Map<String, Value>, key: &str) {
    match kind {
        CaptureKind::Vllm => {
            if let Some(v) = obj.get_mut(key) {
                *v = Value::Null;
            }
        }
        CaptureKind::Sglang => {
            obj.remove(key);
        }
    }
}

/// Strip in place; true when a whole `sglext` object was removed.
fn strip_value(kind: CaptureKind, api: WireApi, asked: &Asked, v: &mut Value) -> bool {
    let Some(obj) = v.as_object_mut() else {
        return false;
    };
    if !applies(api) {
        return false;
    }
    let prompt_asked = asked.token_ids || (kind == CaptureKind::Sglang && asked.prompt_token_ids);
    if !asked.token_ids {
        // vLLM chat: top level.
        unset(kind, obj, "prompt_token_ids");
    }
    if let Some(choices) = obj.get_mut("choices").and_then(Value::as_array_mut) {
        for c in choices.iter_mut().filter_map(Value::as_object_mut) {
            if !asked.logprobs {
                // Both servers always write `logprobs`, `null` when not asked.
                if let Some(lp) = c.get_mut("logprobs") {
                    *lp = Value::Null;
                }
            }
            if !asked.token_ids {
                unset(kind, c, "token_ids");
                // SGLang's whole chat answer (0.5.23).
                unset(kind, c, "response_token_ids");
            }
            if !prompt_asked {
                unset(kind, c, "prompt_token_ids");
            }
        }
    }
    if kind != CaptureKind::Sglang {
        return false;
    }
    let Some(ext) = obj.get_mut("sglext").and_then(Value::as_object_mut) else {
        return false;
    };
    let before = ext.len();
    if !asked.sglext_input_ids {
        ext.remove("input_ids");
    }
    if !asked.sglext_output_ids {
        ext.remove("output_ids");
    }
    // SGLang omits `sglext` when none of its fields is set.
    if before > 0 && ext.is_empty() {
        obj.remove("sglext");
        return true;
    }
    false
}

/// Token ids and logprobs from the upstream's response (whole, or a stream
/// assembled into one object), before [`strip`]. The shapes of both servers
/// are read by [`tokens::read`]; this adds what depends on
/// the request: with Completions `echo`, the logprobs of the echoed prompt
/// positions are cut off (and dropped when the split is unknowable).
pub fn extract(api: WireApi, asked: &Asked, response: &Value) -> Tokens {
    let mut t = tokens::read(api, response);
    if api == WireApi::Completions && asked.echo {
        t.completion_logprobs = t.completion_logprobs.take().and_then(|lp| {
            let skip = match (&t.completion_ids, &t.prompt_ids) {
                (Some(c), _) => lp.len().checked_sub(c.len())?,
                (None, Some(p)) if lp.len() >= p.len() => p.len(),
                _ => return None,
            };
            Some(lp[skip..].to_vec())
        });
    }
    t
}

#[cfg(test)]
mod tests;
