//! OpenAI Completions: `text_completion` objects and streams.

use crate::answer::Answer;
use serde_json::{json, Value};

impl Answer {
    /// A `text_completion` object.
    pub(crate) fn completion_whole(&self) -> Value {
        json!({"id": format!("cmpl-scripted-{}", self.n), "object": "text_completion", "created": 1_700_000_000, "model": self.model,
        "choices": [{"index": 0, "text": self.text, "finish_reason": "stop", "logprobs": null}], "usage": self.chat_usage()})
    }

    /// `text_completion` events: the text in deltas, then a last one with
    /// the finish reason and usage, then `[DONE]`.
    pub(crate) fn completion_events(&self, k: usize) -> Vec<String> {
        let id = format!("cmpl-scripted-{}", self.n);
        let mut out: Vec<String> = self
            .pieces(k)
            .into_iter()
            .map(|p| {
                let c = json!({"id": id, "object": "text_completion", "created": 1_700_000_000, "model": self.model,
                    "choices": [{"index": 0, "text": p, "finish_reason": null, "logprobs": null}]});
                format!("data: {c}\n\n")
            })
            .collect();
        let c = json!({"id": id, "object": "text_completion", "created": 1_700_000_000, "model": self.model,
            "choices": [{"index": 0, "text": "", "finish_reason": "stop", "logprobs": null}], "usage": self.chat_usage()});
        out.push(format!("data: {c}\n\ndata: [DONE]\n\n"));
        out
    }
}
