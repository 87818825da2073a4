//! When a call extends another: on token ids when both have them, else on
//! messages compared leniently ([`same_message`], which reads content as
//! text with [`content_text`]). See the module docs of `trajectory`.

use super::Turn;
use serde_json::Value;

/// Where a difference is and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    pub message_index: Option<usize>,
    pub token_index: Option<usize>,
    pub reason: String,
}

/// The text of a content value: a string, or the text parts of a list.
pub fn content_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p {
                Value::String(s) => s.as_str(),
                p => p
                    .get("text")
                    .or_else(|| p.get("content"))
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            })
            .collect(),
        Some(v) => v.to_string(),
    }
}

/// Tool calls as (id, name, parsed arguments).
pub(crate) fn tool_calls(m: &Value) -> Vec<(String, String, Value)> {
    let Some(calls) = m.get("tool_calls").and_then(Value::as_array) else {
        return vec![];
    };
    calls
        .iter()
        .map(|c| {
            let f = c.get("function").unwrap_or(c);
            let args = match f.get("arguments") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                }
                Some(v) => v.clone(),
                None => Value::Null,
            };
            (
                c.get("id").and_then(Value::as_str).unwrap_or("").to_owned(),
                f.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                args,
            )
        })
        .collect()
}

pub(super) fn str_field<'v>(m: &'v Value, k: &str) -> &'v str {
    m.get(k).and_then(Value::as_str).unwrap_or("")
}

/// Compare two messages leniently; `Err` says what differs.
pub fn same_message(a: &Value, b: &Value) -> Result<(), String> {
    let (ra, rb) = (str_field(a, "role"), str_field(b, "role"));
    if ra != rb {
        return Err(format!("role differs: {ra:?} before, {rb:?} now"));
    }
    let (ca, cb) = (
        content_text(a.get("content")),
        content_text(b.get("content")),
    );
    if ca != cb {
        let at = ca
            .chars()
            .zip(cb.chars())
            .take_while(|(x, y)| x == y)
            .count();
        return Err(format!(
            "{ra} content differs at character {at} ({} chars before, {} now)",
            ca.chars().count(),
            cb.chars().count()
        ));
    }
    let (ta, tb) = (tool_calls(a), tool_calls(b));
    if ta != tb {
        return Err(format!(
            "tool calls differ ({} before, {} now)",
            ta.len(),
            tb.len()
        ));
    }
    let (ia, ib) = (str_field(a, "tool_call_id"), str_field(b, "tool_call_id"));
    if ia != ib {
        return Err(format!("tool_call_id differs: {ia:?} before, {ib:?} now"));
    }
    Ok(())
}

/// Does `cur` extend `prev`? On token ids when both have them, else on messages.
pub fn extends(prev: &Turn, cur: &Turn) -> Result<(), Diff> {
    if let (Some(pp), Some(pc), Some(cp)) = (
        &prev.call.prompt_ids,
        &prev.call.completion_ids,
        &cur.call.prompt_ids,
    ) {
        let want = pp.len() + pc.len();
        let first_diff = pp
            .iter()
            .chain(pc.iter())
            .zip(cp.iter())
            .position(|(a, b)| a != b);
        return match first_diff {
            Some(i) => Err(Diff {
                message_index: None,
                token_index: Some(i),
                reason: format!("prompt token {i} differs from the previous prompt + completion"),
            }),
            None if cp.len() < want => Err(Diff {
                message_index: None,
                token_index: Some(cp.len()),
                reason: format!(
                    "prompt has {} tokens, fewer than the previous prompt + completion ({want})",
                    cp.len()
                ),
            }),
            None => Ok(()),
        };
    }
    let Some(resp) = &prev.response else {
        return Err(Diff {
            message_index: None,
            token_index: None,
            reason: "the previous call has no response message".into(),
        });
    };
    let want = prev.messages.len() + 1;
    for (i, a) in prev
        .messages
        .iter()
        .chain(std::iter::once(resp))
        .enumerate()
    {
        let Some(b) = cur.messages.get(i) else {
            return Err(Diff {
                message_index: Some(i),
                token_index: None,
                reason: format!(
                    "history has {} messages, fewer than the previous call's {} plus its answer",
                    cur.messages.len(),
                    want - 1
                ),
            });
        };
        if let Err(why) = same_message(a, b) {
            return Err(Diff {
                message_index: Some(i),
                token_index: None,
                reason: if i + 1 == want {
                    format!("the previous answer is not in the history: {why}")
                } else {
                    why
                },
            });
        }
    }
    Ok(())
}
