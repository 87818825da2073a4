//! The generation parameters of a chat or completions request (`n`,
//! `temperature`, `top_p`, `top_k`, `seed`, `max_tokens` /
//! `max_completion_tokens` against the context left, `stop`, `logprobs`,
//! `top_logprobs`, `echo`, `stream`, `return_token_ids`, vLLM's
//! `prompt_logprobs`), checked: a bad one is a 400 as vLLM answers it.
//!
//! Completions differ: `logprobs` is the count of alternatives (0: the
//! token's own), `max_tokens` defaults to 16 and may be 0 with `echo` (the
//! prompt scored, nothing generated).

use super::{reject, Reject};
use crate::model::sample::Sampling;
use crate::model::Model;
use serde_json::{Map, Value};

/// Most `top_logprobs` served (OpenAI's limit).
const MAX_TOP_LOGPROBS: usize = 20;

/// Which API a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Api {
    Chat,
    Completions,
}

/// Completions' default `max_tokens` (OpenAI's and vLLM's).
const COMPLETIONS_MAX_TOKENS: usize = 16;

/// The generation parameters of a request, checked.
pub(super) struct Params {
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    pub(super) max_tokens: usize,
    pub(super) sampling: Sampling,
    pub(super) stop: Vec<String>,
    pub(super) logprobs: bool,
    pub(super) top_logprobs: usize,
    /// vLLM's `prompt_logprobs`: score the prompt, with this many
    /// alternatives per token.
    pub(super) prompt_logprobs: Option<usize>,
    /// Completions `echo`: the prompt comes first in the answer (with its
    /// logprobs when `logprobs` is asked).
    pub(super) echo: bool,
    pub(super) token_ids: bool,
}

impl Params {
    /// Alternatives to score every prompt token with, when the prompt is
    /// scored at all.
    pub(super) fn score(&self) -> Option<usize> {
        let echoed = (self.echo && self.logprobs).then_some(self.top_logprobs);
        self.prompt_logprobs.max(echoed)
    }
}

fn number(body: &Map<String, Value>, key: &str) -> Result<Option<f64>, Reject> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) => Ok(Some(x)),
            None => reject(400, format!("`{key}` must be a number")),
        },
    }
}

pub(super) fn params(
    model: &Model,
    api: Api,
    body: &Map<String, Value>,
    prompt_len: usize,
) -> Result<Params, Reject> {
    let completions = api == Api::Completions;
    let echo = completions && body.get("echo").and_then(Value::as_bool).unwrap_or(false);
    let flag = |k: &str| body.get(k).and_then(Value::as_bool).unwrap_or(false);
    if number(body, "n")?.is_some_and(|n| n != 1.0) {
        return reject(400, "the embedded model serves n = 1 only");
    }
    let temperature = number(body, "temperature")?.unwrap_or(model.options.default_temperature);
    let top_p = number(body, "top_p")?.unwrap_or(1.0);
    if !((0.0..=2.0).contains(&temperature) && top_p > 0.0 && top_p <= 1.0) {
        return reject(400, "`temperature` must be in [0, 2] and `top_p` in (0, 1]");
    }
    let top_k = number(body, "top_k")?.filter(|k| *k > 0.0).unwrap_or(0.0) as usize;
    let seed = number(body, "seed")?.map(|s| s as i64 as u64);
    let context = model.text().context;
    let room = context.saturating_sub(prompt_len);
    if room == 0 {
        return reject(
            400,
            format!(
                "This model's maximum context length is {} tokens. However, your request has {prompt_len} input tokens. Please reduce the length of the input messages.",
                context
            ),
        );
    }
    let asked = match api {
        Api::Chat => number(body, "max_completion_tokens")?.or(number(body, "max_tokens")?),
        Api::Completions => number(body, "max_tokens")?,
    };
    let max_tokens = match asked {
        Some(m) if m == 0.0 && echo => 0,
        Some(m) if m < 1.0 => {
            return reject(
                400,
                if completions {
                    "`max_tokens` must be at least 1 (0 with `echo`)"
                } else {
                    "`max_tokens` must be at least 1"
                },
            )
        }
        Some(m) if m as usize > room => {
            return reject(
                400,
                format!(
                    "This model's maximum context length is {} tokens. However, you requested {} tokens ({prompt_len} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                    context,
                    prompt_len + m as usize,
                    m as usize
                ),
            )
        }
        Some(m) => m as usize,
        None if completions => COMPLETIONS_MAX_TOKENS.min(room),
        None => model.options.default_max_tokens.min(room),
    };
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        Some(_) => return reject(400, "`stop` must be a string or a list of strings"),
    };
    // Completions `logprobs` is the count; chat's is a flag beside
    // `top_logprobs`.
    let (logprobs, top_logprobs) = match api {
        Api::Chat => (
            flag("logprobs"),
            number(body, "top_logprobs")?.unwrap_or(0.0) as usize,
        ),
        Api::Completions => match number(body, "logprobs") {
            Ok(None) => (false, 0),
            Ok(Some(n)) if n >= 0.0 => (true, n as usize),
            _ => return reject(400, "`logprobs` must be a non-negative integer"),
        },
    };
    if top_logprobs > MAX_TOP_LOGPROBS {
        return reject(
            400,
            format!(
                "`{}` must be at most {MAX_TOP_LOGPROBS}",
                if completions {
                    "logprobs"
                } else {
                    "top_logprobs"
                }
            ),
        );
    }
    // vLLM takes an integer (pydantic also reads `true` as 1).
    let prompt_logprobs = match body.get("prompt_logprobs") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(1),
        Some(v) => match v.as_u64() {
            Some(k) if k as usize <= MAX_TOP_LOGPROBS => Some(k as usize),
            Some(k) => {
                return reject(
                    400,
                    format!("Requested prompt logprobs of {k}, which is greater than max allowed: {MAX_TOP_LOGPROBS}"),
                )
            }
            None => return reject(400, "`prompt_logprobs` must be a non-negative integer"),
        },
    };
    if (prompt_logprobs.is_some() || (echo && logprobs)) && flag("stream") {
        return reject(
            400,
            if prompt_logprobs.is_some() {
                "`prompt_logprobs` are not available when `stream=True`."
            } else {
                "`echo` with `logprobs` is not available when `stream=True` on the embedded model."
            },
        );
    }
    Ok(Params {
        prompt_logprobs,
        stream: flag("stream"),
        include_usage: body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        max_tokens,
        sampling: Sampling {
            temperature,
            top_p,
            top_k,
            seed,
        },
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        logprobs,
        top_logprobs,
        echo,
        token_ids: flag("return_token_ids"),
    })
}
