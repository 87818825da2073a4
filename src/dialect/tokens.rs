//! Token ids and logprobs read from a response (whole, or a stream already
//! assembled into one object), in every shape the supported servers use.
//! Nothing here tokenizes: what the server did not return stays `None`.
//!
//! Shapes read (choice 0 only, as the rest of the row):
//! - prompt ids: top-level `prompt_token_ids` (vLLM chat), per-choice
//!   `prompt_token_ids` (vLLM completions, SGLang `return_token_ids` /
//!   `return_prompt_token_ids`), `sglext.input_ids` (SGLang
//!   `return_input_ids_in_sglext`);
//! - completion ids: per-choice `token_ids` (vLLM, SGLang `return_token_ids`
//!   on Completions), `response_token_ids` (SGLang `return_token_ids` on a
//!   whole chat answer: 0.5.23's `ChatCompletionResponseChoice`),
//!   `sglext.output_ids[i]` (SGLang `return_output_ids_in_sglext`);
//! - completion logprobs: `logprobs.content[].logprob` (chat),
//!   `logprobs.token_logprobs[]` (completions);
//! - prompt logprobs: vLLM `prompt_logprobs` (top level for chat, per choice
//!   for completions): one `{token_id: {logprob, …}}` map per prompt position,
//!   the first `null`. The prompt token's own entry is picked by its id, so
//!   prompt ids are needed to read them.

use super::{ids, Tokens, WireApi};
use serde_json::Value;

/// Read token ids and logprobs for choice 0 of `resp`.
pub fn read(api: WireApi, resp: &Value) -> Tokens {
    let choice = super::at(resp, &["choices", "0"]);
    let index = choice
        .and_then(|c| c.get("index"))
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    let prompt_ids = ids(resp.get("prompt_token_ids"))
        .or_else(|| ids(choice.and_then(|c| c.get("prompt_token_ids"))))
        .or_else(|| ids(super::at(resp, &["sglext", "input_ids"])));
    let completion_ids = ids(choice.and_then(|c| c.get("token_ids")))
        .or_else(|| ids(choice.and_then(|c| c.get("response_token_ids"))))
        .or_else(|| ids(super::at(resp, &["sglext", "output_ids"]).and_then(|o| o.get(index))));
    let completion_logprobs = match api {
        WireApi::Completions => choice
            .and_then(|c| super::at(c, &["logprobs", "token_logprobs"]))
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_f64().unwrap_or(f64::NAN)).collect()),
        _ => choice
            .and_then(|c| super::at(c, &["logprobs", "content"]))
            .and_then(Value::as_array)
            .map(|lp| {
                lp.iter()
                    .map(|t| t.get("logprob").and_then(Value::as_f64).unwrap_or(f64::NAN))
                    .collect()
            }),
    };
    let prompt_logprobs = resp
        .get("prompt_logprobs")
        .filter(|v| !v.is_null())
        .or_else(|| choice.and_then(|c| c.get("prompt_logprobs")))
        .and_then(|p| prompt_logprobs(p, prompt_ids.as_deref()));
    Tokens {
        prompt_ids,
        completion_ids,
        prompt_logprobs,
        completion_logprobs,
    }
}

/// vLLM `prompt_logprobs`: `[null, {"<id>": {"logprob": f, …}, …}, …]`, one
/// entry per prompt token. Each position's value is the logprob of the token
/// actually in the prompt; `NaN` where the server gives none (position 0).
fn prompt_logprobs(v: &Value, prompt_ids: Option<&[i32]>) -> Option<Vec<f64>> {
    let arr = v.as_array()?;
    let prompt_ids = prompt_ids?;
    if arr.len() != prompt_ids.len() {
        return None;
    }
    Some(
        arr.iter()
            .zip(prompt_ids)
            .map(|(pos, id)| {
                pos.get(id.to_string())
                    .and_then(|e| e.get("logprob"))
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglangs_whole_chat_answer_names_its_ids_response_token_ids() {
        // SGLang 0.5.23, `return_token_ids: true`, measured on the CPU.
        let r = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "I'm"},
                       "logprobs": {"content": [{"token": "I", "logprob": -2.38}, {"token": "'m", "logprob": -0.18}]},
                       "prompt_token_ids": [1, 9690], "response_token_ids": [57, 5248]}]});
        let t = read(WireApi::ChatCompletions, &r);
        assert_eq!(t.prompt_ids, Some(vec![1, 9690]));
        assert_eq!(t.completion_ids, Some(vec![57, 5248]));
        assert_eq!(t.completion_logprobs, Some(vec![-2.38, -0.18]));
        let whole = serde_json::to_vec(&r).unwrap();
        let a = WireApi::ChatCompletions.assemble(&whole, false);
        assert_eq!(
            a.tokens.completion_ids,
            Some(vec![57, 5248]),
            "the fast path reads it too"
        );
    }

    #[test]
    fn ids_out_of_i32_range_are_not_read() {
        let r = json!({"choices": [{"index": 0, "token_ids": [1, 4294967297i64]}],
                       "prompt_token_ids": [1, 2]});
        let t = read(WireApi::ChatCompletions, &r);
        assert_eq!(t.completion_ids, None);
        assert_eq!(t.prompt_ids, Some(vec![1, 2]));
    }
}
