//! A trajectory's steps, read back from its recorded calls: what the agent
//! thought, the command it ran, and what it saw, whatever harness it ran in.
//!
//! The history is the last call's `messages` plus its answer: harnesses
//! send the whole conversation each call. An assistant message gives a step
//! per tool call (the command is the arguments' `command`, `cmd`, `script`,
//! `code` or `input` string, else the arguments as they are), or, without
//! tool calls, a step for the first fenced code block of its text (the
//! text-based mini-swe-agent: ```` ```bash ````); its text, beyond the
//! block, is the step's reasoning. The tool results after it (by
//! `tool_call_id`, else in order), or the user message after it for a text
//! step, are the observations. A return code is read from the observation
//! where the harness writes one (`<returncode>N</returncode>`,
//! `"returncode": N`, `exit code: N`, `Exit code N`).

use crate::export::read::CallRec;
use serde_json::Value;
use std::sync::OnceLock;

/// One step of a trajectory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    /// The assistant message it came from: the how-manieth of the
    /// conversation's assistant messages (0 for the first).
    pub turn: usize,
    pub reasoning: String,
    pub command: String,
    pub observation: String,
    pub returncode: Option<i64>,
}

/// The conversation the trajectory ended with: the last call's messages and
/// its answer (of the calls in order, the one with the longest history).
pub fn history(calls: &[CallRec]) -> Vec<Value> {
    let last = calls
        .iter()
        .filter(|c| c.status == "ok" && !c.side_call)
        .filter_map(|c| {
            let m: Vec<Value> = serde_json::from_str(c.messages.as_deref()?).ok()?;
            Some((m, c))
        })
        .max_by_key(|(m, c)| (m.len(), c.sequence));
    let Some((mut messages, c)) = last else {
        return vec![];
    };
    if let Some(answer) = c
        .response_message
        .as_deref()
        .and_then(|r| serde_json::from_str::<Value>(r).ok())
    {
        messages.push(answer);
    }
    messages
}

/// The text of a message's content (a string, or its text parts joined).
pub fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or("")
}

/// The command of a tool call's arguments.
fn command_of(arguments: &str) -> String {
    if let Ok(Value::Object(a)) = serde_json::from_str::<Value>(arguments) {
        for key in ["command", "cmd", "script", "code", "input"] {
            match a.get(key) {
                Some(Value::String(s)) => return s.clone(),
                Some(Value::Array(parts)) => {
                    return parts
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" ")
                }
                _ => {}
            }
        }
    }
    arguments.to_owned()
}

/// The first fenced code block of a text, and the text around it.
fn fenced(text: &str) -> Option<(String, String)> {
    let start = text.find("```")?;
    let after = &text[start + 3..];
    let body_at = after.find('\n')? + 1;
    let body = &after[body_at..];
    let end = body.find("```")?;
    let rest = format!("{}{}", &text[..start], &body[end + 3..]);
    Some((body[..end].trim_end().to_owned(), rest.trim().to_owned()))
}

/// The return code an observation reports, when it reports one.
pub fn returncode(observation: &str) -> Option<i64> {
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(
            r#"(?i)<returncode>\s*(-?\d+)\s*</returncode>|"returncode"\s*:\s*(-?\d+)|exit[ _]code\s*[:=]?\s*(-?\d+)"#,
        )
        .expect("the return-code pattern compiles")
    });
    let c = re.captures(observation)?;
    (1..=3)
        .find_map(|i| c.get(i))
        .and_then(|m| m.as_str().parse().ok())
}

/// The steps of a conversation (see the module docs).
pub fn steps(messages: &[Value]) -> Vec<Step> {
    let mut out: Vec<Step> = vec![];
    let mut i = 0;
    let mut turn = 0;
    while i < messages.len() {
        let m = &messages[i];
        i += 1;
        if role(m) != "assistant" {
            continue;
        }
        turn += 1;
        let turn = turn - 1;
        let text = text_of(m.get("content"));
        let reasoning = m
            .get("reasoning_content")
            .or_else(|| m.get("reasoning"))
            .and_then(Value::as_str)
            .map_or(text.clone(), |r| format!("{r}\n{text}").trim().to_owned());
        let calls = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty());
        if let Some(calls) = calls {
            let first = out.len();
            for c in calls {
                let args = c
                    .pointer("/function/arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                out.push(Step {
                    reasoning: if out.len() == first {
                        reasoning.clone()
                    } else {
                        String::new()
                    },
                    command: command_of(args),
                    turn,
                    ..Step::default()
                });
            }
            let ids: Vec<Option<&str>> = calls
                .iter()
                .map(|c| c.get("id").and_then(Value::as_str))
                .collect();
            let mut next = 0;
            while i < messages.len() && role(&messages[i]) == "tool" {
                let t = &messages[i];
                let by_id = t
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .and_then(|id| ids.iter().position(|x| *x == Some(id)));
                let k = by_id.unwrap_or(next).min(calls.len() - 1);
                next = k + 1;
                let obs = text_of(t.get("content"));
                let step = &mut out[first + k];
                step.returncode = step.returncode.or_else(|| returncode(&obs));
                step.observation.push_str(&obs);
                i += 1;
            }
        } else if let Some((command, rest)) = fenced(&text) {
            let mut step = Step {
                reasoning: rest,
                command,
                turn,
                ..Step::default()
            };
            if let Some(next) = messages.get(i).filter(|n| role(n) == "user") {
                step.observation = text_of(next.get("content"));
                step.returncode = returncode(&step.observation);
                i += 1;
            }
            out.push(step);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_calls_and_their_results_are_steps() {
        let m = vec![
            json!({"role": "system", "content": "You are an agent."}),
            json!({"role": "user", "content": "Fix it."}),
            json!({"role": "assistant", "content": "Look first.", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}},
                {"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": [\"cat\", \"x.py\"]}"}}]}),
            json!({"role": "tool", "tool_call_id": "b", "content": "print(1)\nexit code: 0"}),
            json!({"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "x.py\n<returncode>2</returncode>"}]}),
            json!({"role": "assistant", "content": "Done."}),
        ];
        let s = steps(&m);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].command.as_str(), s[0].reasoning.as_str()),
            ("ls", "Look first.")
        );
        assert_eq!((s[0].returncode, s[1].returncode), (Some(2), Some(0)));
        assert_eq!(s[1].command, "cat x.py");
        assert_eq!((s[0].turn, s[1].turn), (0, 0));
        assert!(s[1].observation.starts_with("print(1)"));
    }

    #[test]
    fn a_fenced_block_in_text_is_a_step_with_the_next_user_message() {
        let m = vec![
            json!({"role": "assistant", "content": "THOUGHT: run the tests\n\n```bash\npytest -q\n```"}),
            json!({"role": "user", "content": "<returncode>1</returncode>\n<output>1 failed</output>"}),
            json!({"role": "assistant", "content": "no command here"}),
        ];
        let s = steps(&m);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].command, "pytest -q");
        assert_eq!(s[0].reasoning, "THOUGHT: run the tests");
        assert_eq!(s[0].returncode, Some(1));
    }

    #[test]
    fn return_codes_in_the_forms_harnesses_write() {
        assert_eq!(returncode("<returncode>0</returncode>"), Some(0));
        assert_eq!(returncode(r#"{"returncode": -9}"#), Some(-9));
        assert_eq!(returncode("Exit code 127"), Some(127));
        assert_eq!(returncode("nothing"), None);
    }
}
