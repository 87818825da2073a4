//! A generation as it is taken in, step by step: the token ids, their
//! logprobs, the decoded text (cut at a stop string), and why it ended. Both
//! the whole and the streamed chat answer are built from it.

use super::params::Params;
use crate::model::tokenizer::Vocab;
use crate::model::{Finish, PromptLogprob, Step};
use serde_json::{json, Value};

/// A generation in progress: the tokens so far, their text, and why it
/// ended.
pub(super) struct Answer {
    pub(super) ids: Vec<u32>,
    pub(super) logprobs: Vec<Value>,
    pub(super) text: String,
    /// vLLM's `prompt_logprobs`: `null` for the first token, then per
    /// token `{id: {logprob, rank, decoded_token}}`, the token itself and
    /// the most likely ones.
    pub(super) prompt_logprobs: Option<Vec<Value>>,
    /// The same, as the model scored it.
    pub(super) scored: Vec<PromptLogprob>,
    /// Each token's logprob and the most likely tokens there.
    pub(super) sampled: Vec<(f32, Vec<(u32, f32)>)>,
    cached: usize,
    pub(super) finish: Option<&'static str>,
    /// The stop string that ended it.
    pub(super) stop_reason: Option<String>,
}

impl Answer {
    pub(super) fn new() -> Self {
        Self {
            ids: Vec::new(),
            logprobs: Vec::new(),
            text: String::new(),
            prompt_logprobs: None,
            scored: Vec::new(),
            sampled: Vec::new(),
            cached: 0,
            finish: None,
            stop_reason: None,
        }
    }

    /// Take in one step; returns `Err` when the model failed.
    pub(super) fn step(&mut self, vocab: &Vocab, p: &Params, step: Step) -> Result<(), String> {
        match step {
            Step::Started { cached } => self.cached = cached,
            Step::Prompt(scored) => {
                let piece = |id: u32| vocab.decode(&[id], false).unwrap_or_default();
                let mut out = vec![Value::Null];
                for s in &scored {
                    let mut e = serde_json::Map::new();
                    for (rank, &(id, lp)) in s
                        .top
                        .iter()
                        .take(p.prompt_logprobs.unwrap_or(0))
                        .enumerate()
                    {
                        e.insert(
                            id.to_string(),
                            json!({"logprob": lp, "rank": rank + 1, "decoded_token": piece(id)}),
                        );
                    }
                    e.insert(s.token.to_string(), json!({"logprob": s.logprob, "rank": s.rank, "decoded_token": piece(s.token)}));
                    out.push(Value::Object(e));
                }
                if p.prompt_logprobs.is_some() {
                    self.prompt_logprobs = Some(out);
                }
                self.scored = scored;
            }
            Step::Token { id, logprob, top } => {
                self.ids.push(id);
                self.sampled.push((logprob, top.clone()));
                if p.logprobs {
                    let entry = |id: u32, lp: f32| {
                        let bytes = vocab.bytes.get(id as usize).cloned().unwrap_or_default();
                        json!({"token": String::from_utf8_lossy(&bytes), "logprob": lp, "bytes": bytes})
                    };
                    let mut e = entry(id, logprob);
                    e["top_logprobs"] = top.iter().map(|&(i, lp)| entry(i, lp)).collect();
                    self.logprobs.push(e);
                }
                // Decode the whole answer again: a token may complete a
                // character an earlier one began. Wait while it is partial.
                let text = vocab.decode(&self.ids, true).map_err(|e| e.to_string())?;
                if !text.ends_with('\u{FFFD}') {
                    self.text = text;
                }
                if let Some((at, s)) = p
                    .stop
                    .iter()
                    .filter_map(|s| self.text.find(s.as_str()).map(|at| (at, s)))
                    .min()
                {
                    self.text.truncate(at);
                    self.finish = Some("stop");
                    self.stop_reason = Some(s.clone());
                }
            }
            Step::Done(f) => {
                self.text = vocab.decode(&self.ids, true).map_err(|e| e.to_string())?;
                self.finish = Some(match f {
                    Finish::Stop => "stop",
                    Finish::Length => "length",
                });
            }
            Step::Failed(e) => return Err(e),
        }
        Ok(())
    }

    /// Take in a whole generation; the receiver is dropped at its end,
    /// which ends a generation cut by a stop string.
    pub(super) async fn whole(
        vocab: &Vocab,
        p: &Params,
        mut steps: tokio::sync::mpsc::UnboundedReceiver<Step>,
    ) -> Result<Answer, super::Reject> {
        let mut a = Answer::new();
        while a.finish.is_none() {
            let Some(step) = steps.recv().await else {
                return super::reject(500, "the model thread stopped");
            };
            a.step(vocab, p, step).map_err(|e| super::Reject(500, e))?;
        }
        Ok(a)
    }

    pub(super) fn usage(&self, prompt: &[u32]) -> Value {
        json!({
            "prompt_tokens": prompt.len(),
            "total_tokens": prompt.len() + self.ids.len(),
            "completion_tokens": self.ids.len(),
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}
