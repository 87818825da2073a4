//! A teacher: an OpenAI-compatible server in vLLM's shape (vLLM, rollcall's
//! embedded model server), asked for the logprob of every token of an
//! exact id sequence.
//!
//! One request per call: `POST {base}/completions` with the prompt ids and
//! the completion ids as one token-id prompt, `prompt_logprobs: 0` (the
//! logprob of each prompt token itself, under `choices[0].prompt_logprobs`,
//! `null` first, then `{"<id>": {"logprob": …}}` per position) and
//! `max_tokens: 1`, since vLLM scores a prompt only on the way to
//! generating. The completion's positions are then read off; the one token
//! generated is ignored. `POST {origin}/detokenize` checks the teacher's
//! vocabulary (see [`super::score`]).

use super::client::Server;
use super::RecipeError;
use serde_json::{json, Value};
use std::time::Duration;

/// A teacher server.
#[derive(Clone)]
pub struct Teacher {
    server: Server,
    /// The model name sent, when one was given.
    model: Option<String>,
    /// What the score rows name as the teacher: the base URL without
    /// credentials, or `embedded:<file>`.
    pub label: String,
}

impl Teacher {
    pub fn new(
        base: &str,
        model: Option<String>,
        label: String,
        timeout: Duration,
    ) -> Result<Teacher, RecipeError> {
        Ok(Teacher {
            server: Server::new(base, label.clone(), timeout)?,
            model,
            label,
        })
    }

    /// The teacher's logprob of each of `completion` given `prompt` and the
    /// completion tokens before it; also the model name it answered with.
    pub async fn score(
        &self,
        prompt: &[i32],
        completion: &[i32],
    ) -> Result<(Vec<f64>, Option<String>), RecipeError> {
        let ids: Vec<i32> = prompt.iter().chain(completion).copied().collect();
        let mut body = json!({"prompt": ids, "max_tokens": 1, "temperature": 1.0,
            "prompt_logprobs": 0});
        if let Some(m) = &self.model {
            body["model"] = json!(m);
        }
        let v = self.server.post("/completions", &body).await?;
        let lps = completion_logprobs(&v, prompt.len(), completion)
            .map_err(|why| self.server.error(why))?;
        Ok((
            lps,
            v.get("model").and_then(Value::as_str).map(str::to_owned),
        ))
    }

    /// The teacher's text for `ids`.
    pub async fn detokenize(&self, ids: &[i32]) -> Result<String, RecipeError> {
        let mut body = json!({"tokens": ids});
        if let Some(m) = &self.model {
            body["model"] = json!(m);
        }
        let v = self.server.post_origin("/detokenize", &body).await?;
        v.get("prompt")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                self.server
                    .error("`/detokenize` answered without a `prompt` string".into())
            })
    }
}

/// The logprobs of `completion`'s tokens, at positions `start..` of a
/// Completions answer's `choices[0].prompt_logprobs`.
pub fn completion_logprobs(
    answer: &Value,
    start: usize,
    completion: &[i32],
) -> Result<Vec<f64>, String> {
    let Some(list) = answer
        .pointer("/choices/0/prompt_logprobs")
        .and_then(Value::as_array)
    else {
        return Err(
            "the answer has no `choices[0].prompt_logprobs` list: the server \
                    does not score prompts (vLLM's `prompt_logprobs`)"
                .into(),
        );
    };
    if list.len() != start + completion.len() {
        return Err(format!(
            "`prompt_logprobs` has {} positions for a prompt of {} tokens: the server \
             did not take the token ids as they are",
            list.len(),
            start + completion.len()
        ));
    }
    completion
        .iter()
        .enumerate()
        .map(|(j, id)| {
            let at = start + j;
            let entry = list.get(at).and_then(|e| e.get(id.to_string()));
            entry
                .and_then(|e| e.get("logprob"))
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("`prompt_logprobs[{at}]` has no logprob for token {id}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(n: usize) -> Value {
        let mut list = vec![Value::Null];
        for i in 1..n {
            list.push(
                json!({ (i as i32 * 10).to_string(): {"logprob": -(i as f64), "rank": 1},
                "999": {"logprob": -0.01, "rank": 1}}),
            );
        }
        json!({"choices": [{"prompt_logprobs": list}]})
    }

    #[test]
    fn the_completion_positions_are_read_by_token_id() {
        // Prompt ids 0, 10, 20; completion 30, 40.
        let lps = completion_logprobs(&answer(5), 3, &[30, 40]).unwrap();
        assert_eq!(lps, vec![-3.0, -4.0]);
    }

    #[test]
    fn a_misaligned_or_missing_answer_is_an_error() {
        assert!(completion_logprobs(&answer(6), 3, &[30, 40])
            .unwrap_err()
            .contains("6 positions"));
        assert!(completion_logprobs(&answer(5), 3, &[30, 41])
            .unwrap_err()
            .contains("no logprob for token 41"));
        assert!(completion_logprobs(&json!({"choices": [{}]}), 0, &[1])
            .unwrap_err()
            .contains("does not score prompts"));
    }
}
