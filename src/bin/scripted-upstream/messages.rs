//! Anthropic Messages: `message` objects and their named events.

use crate::answer::Answer;
use serde_json::{json, Value};

impl Answer {
    /// A `message` object with its one content block, complete.
    pub(crate) fn message_whole(&self) -> Value {
        let mut m = self.message_object();
        m["content"] = json!([self.message_block()]);
        m["stop_reason"] = json!(self.stop_reason());
        m["usage"]["output_tokens"] = json!(self.completion_tokens());
        m
    }

    /// An Anthropic message with no content yet, as in `message_start`.
    fn message_object(&self) -> Value {
        json!({"id": format!("msg_scripted_{}", self.n), "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_words, "output_tokens": 0,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
    }

    /// The one content block of an Anthropic answer, complete.
    fn message_block(&self) -> Value {
        match &self.tool {
            Some((name, args)) => {
                json!({"type": "tool_use", "id": format!("toolu_scripted_{}", self.n), "name": name,
                    "input": serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({}))})
            }
            None => json!({"type": "text", "text": self.text}),
        }
    }

    /// Why the answer stopped: `tool_use` or `end_turn`.
    fn stop_reason(&self) -> &'static str {
        if self.tool.is_some() {
            "tool_use"
        } else {
            "end_turn"
        }
    }

    /// Messages events: `message_start`, the one content block (start,
    /// text or `input_json_delta` deltas, stop), `message_delta` with the
    /// stop reason and usage, `message_stop`; each data line names its type.
    pub(crate) fn messages_events(&self, k: usize) -> Vec<String> {
        let ev = |kind: &str, mut data: Value| {
            data["type"] = json!(kind);
            format!("event: {kind}\ndata: {data}\n\n")
        };
        let mut out = vec![ev(
            "message_start",
            json!({"message": self.message_object()}),
        )];
        let mut start = self.message_block();
        let pieces = match &self.tool {
            Some((_, args)) => {
                start["input"] = json!({});
                Self::argument_pieces(args, k)
                    .into_iter()
                    .map(|s| json!({"type": "input_json_delta", "partial_json": s}))
                    .collect::<Vec<_>>()
            }
            None => {
                start["text"] = json!("");
                self.pieces(k)
                    .into_iter()
                    .map(|p| json!({"type": "text_delta", "text": p}))
                    .collect()
            }
        };
        out.push(ev(
            "content_block_start",
            json!({"index": 0, "content_block": start}),
        ));
        for delta in pieces {
            out.push(ev(
                "content_block_delta",
                json!({"index": 0, "delta": delta}),
            ));
        }
        out.push(ev("content_block_stop", json!({"index": 0})));
        out.push(ev(
            "message_delta",
            json!({"delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                "usage": {"output_tokens": self.completion_tokens()}}),
        ));
        out.push(ev("message_stop", json!({})));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::tests::bash_tools;
    use crate::options::{opts, Kind};

    /// (event name, data) of each SSE event.
    fn parse_events(events: &[String]) -> Vec<(String, Value)> {
        events
            .iter()
            .map(|e| {
                let mut lines = e.lines();
                let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
                let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
                (name.to_owned(), serde_json::from_str(data).unwrap())
            })
            .collect()
    }

    #[test]
    fn messages_tool_use_streams_in_order() {
        let body = json!({
            "model": "claude-x@events=3",
            "system": [{"type": "text", "text": "You are Claude Code."}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "<system-reminder>\nbe nice\n</system-reminder>"},
                    {"type": "text", "text": "Run [[run: echo rollcall-$((6*7))]] please"}]},
                {"role": "system", "content": "# Environment"}
            ],
            "tools": bash_tools(),
            "stream": true,
        });
        let (_, o) = opts("claude-x@events=3");
        let a = Answer::decide(Kind::Messages, &body, "claude-x@events=3", 7);
        let (name, args) = a.tool.clone().expect("a tool call");
        assert_eq!(name, "Bash");
        let args: Value = serde_json::from_str(&args).unwrap();
        assert_eq!(args, json!({"command": "echo rollcall-$((6*7))"}));

        let events = parse_events(&a.events(o.events));
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (n, d) in &events {
            assert_eq!(d["type"], json!(n), "every data line names its type");
        }
        let start = &events[0].1["message"];
        assert_eq!(start["content"], json!([]));
        assert_eq!(start["role"], "assistant");
        assert!(start["id"].as_str().unwrap().starts_with("msg_"));
        assert!(start["usage"]["input_tokens"].as_i64().unwrap() > 0);
        let block = &events[1].1["content_block"];
        assert_eq!(block["type"], "tool_use");
        assert_eq!(block["name"], "Bash");
        assert_eq!(block["input"], json!({}));
        assert!(block["id"].as_str().unwrap().starts_with("toolu_"));
        let json_text: String = events[2..5]
            .iter()
            .map(|(_, d)| {
                assert_eq!(d["delta"]["type"], "input_json_delta");
                d["delta"]["partial_json"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(serde_json::from_str::<Value>(&json_text).unwrap(), args);
        let delta = &events[6].1;
        assert_eq!(
            delta["delta"],
            json!({"stop_reason": "tool_use", "stop_sequence": null})
        );
        assert!(delta["usage"]["output_tokens"].as_i64().unwrap() > 0);

        // The same answer, not streamed.
        let whole = a.whole();
        assert_eq!(whole["type"], "message");
        assert_eq!(whole["stop_reason"], "tool_use");
        assert_eq!(whole["stop_sequence"], Value::Null);
        assert_eq!(whole["content"][0]["type"], "tool_use");
        assert_eq!(whole["content"][0]["input"], args);
        assert_eq!(whole["usage"]["cache_read_input_tokens"], 0);
        assert_eq!(whole["usage"]["cache_creation_input_tokens"], 0);
    }

    #[test]
    fn messages_tool_result_gets_the_final_text() {
        let body = json!({
            "model": "m",
            "system": "sys",
            "messages": [
                {"role": "user", "content": "Run [[run: echo rollcall-$((6*7))]]"},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                    "input": {"command": "echo rollcall-$((6*7))"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false,
                        "content": [{"type": "text", "text": "rollcall-42\n"}], "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "<system-reminder>x</system-reminder>"}]}
            ],
            "tools": bash_tools(),
        });
        let a = Answer::decide(Kind::Messages, &body, "m", 1);
        assert!(a.tool.is_none());
        let whole = a.whole();
        assert_eq!(whole["stop_reason"], "end_turn");
        assert_eq!(
            whole["content"],
            json!([{"type": "text", "text": "Done. The command printed: rollcall-42"}])
        );
        let events = parse_events(&a.events(2));
        assert_eq!(
            events[1].1["content_block"],
            json!({"type": "text", "text": ""})
        );
        let text: String = events
            .iter()
            .filter(|(n, _)| n == "content_block_delta")
            .map(|(_, d)| {
                assert_eq!(d["delta"]["type"], "text_delta");
                d["delta"]["text"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(text, "Done. The command printed: rollcall-42");
        assert_eq!(events.last().unwrap().0, "message_stop");
    }

    #[test]
    fn messages_default_answer_reads_the_user_text() {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"},
                {"type": "text", "text": "hi there"}]},
            {"role": "system", "content": "env"}]});
        let a = Answer::decide(Kind::Messages, &body, "m", 0);
        assert_eq!(a.text, "Reply to: hi there");
        // With tools, the default is one shell call, then a text answer.
        let mut body = body;
        body["tools"] = bash_tools();
        let a = Answer::decide(Kind::Messages, &body, "m", 0);
        assert_eq!(a.tool.unwrap().0, "Bash");
        body["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "scripted", "is_error": true}]}));
        let a = Answer::decide(Kind::Messages, &body, "m", 0);
        assert!(a.tool.is_none());
        assert_eq!(a.text, "Done. Reply to: hi there");
    }
}
