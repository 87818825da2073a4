//! Rebuilding trajectories from a rollout's calls.
//!
//! Calls are taken in `sequence` order. A call *extends* an earlier call when
//! its prompt is that call's prompt plus its completion plus whatever came
//! back (tool results, user turns):
//!
//! - on token ids, when both calls have them: `prompt_ids(k)` starts with
//!   `prompt_ids(j) ++ completion_ids(j)`;
//! - otherwise on normalized messages: `messages(k)` starts with
//!   `messages(j) ++ [response_message(j)]`, comparing role, content text,
//!   tool calls (id, name, arguments as parsed JSON) and `tool_call_id`, and
//!   ignoring representation details (null vs `""` content, a string vs a
//!   list of text parts, `reasoning_content`, extra keys).
//!
//! A call joins the most recent open segment whose last call it extends
//! (so a sub-agent's calls interleaved with the main agent's form their own
//! segment, and the main agent's continue theirs); a call that extends none
//! starts a new segment, and a [`Mismatch`] says where and why it differs
//! from the call just before it.

use super::read::CallRec;
use serde::Serialize;
use serde_json::Value;

/// A call whose history does not extend the call before it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mismatch {
    pub rollout_id: String,
    pub sequence: i64,
    /// The previous call it was compared with.
    pub previous_sequence: i64,
    /// First message of the new history that differs, when matched on messages.
    pub message_index: Option<usize>,
    /// First token that differs, when matched on token ids.
    pub token_index: Option<usize>,
    pub reason: String,
}

/// A call with its JSON columns parsed.
#[derive(Debug, Clone)]
pub struct Turn<'a> {
    pub call: &'a CallRec,
    pub messages: Vec<Value>,
    pub response: Option<Value>,
}

impl<'a> Turn<'a> {
    pub fn parse(call: &'a CallRec) -> Turn<'a> {
        let messages = call
            .messages
            .as_deref()
            .and_then(|m| serde_json::from_str::<Value>(m).ok())
            .and_then(|v| match v {
                Value::Array(a) => Some(a),
                _ => None,
            })
            .unwrap_or_default();
        let response = call
            .response_message
            .as_deref()
            .and_then(|m| serde_json::from_str::<Value>(m).ok())
            .filter(Value::is_object);
        Turn {
            call,
            messages,
            response,
        }
    }
}

/// One segment: indexes of its turns, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub index: usize,
    pub turns: Vec<usize>,
}

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
fn tool_calls(m: &Value) -> Vec<(String, String, Value)> {
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

fn str_field<'v>(m: &'v Value, k: &str) -> &'v str {
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

/// Split a rollout's turns (ordered by sequence) into segments, appending a
/// mismatch for each turn that starts a segment after the first.
pub fn segment(turns: &[Turn], mismatches: &mut Vec<Mismatch>) -> Vec<Segment> {
    let mut segs: Vec<Segment> = Vec::new();
    for (k, t) in turns.iter().enumerate() {
        // The most recently extended segment first.
        let mut order: Vec<usize> = (0..segs.len()).collect();
        order.sort_by_key(|&s| std::cmp::Reverse(segs[s].turns.last().copied().unwrap_or(0)));
        let joined = order.into_iter().find(|&s| {
            let last = segs[s].turns.last().copied().unwrap_or(0);
            extends(&turns[last], t).is_ok()
        });
        match joined {
            Some(s) => segs[s].turns.push(k),
            None => {
                if k > 0 {
                    let prev = &turns[k - 1];
                    let d = extends(prev, t).err().unwrap_or(Diff {
                        message_index: None,
                        token_index: None,
                        reason: "does not extend any open segment".into(),
                    });
                    mismatches.push(Mismatch {
                        rollout_id: t.call.rollout_id.clone(),
                        sequence: t.call.sequence,
                        previous_sequence: prev.call.sequence,
                        message_index: d.message_index,
                        token_index: d.token_index,
                        reason: d.reason,
                    });
                }
                segs.push(Segment {
                    index: segs.len(),
                    turns: vec![k],
                });
            }
        }
    }
    segs
}

/// The conversation of a segment: the last call's messages plus its answer,
/// and for each message the sequence of the call whose answer it is.
pub fn conversation(turns: &[Turn], seg: &Segment) -> (Vec<Value>, Vec<Option<i64>>) {
    let Some(&last) = seg.turns.last() else {
        return (vec![], vec![]);
    };
    let t = &turns[last];
    let mut msgs = t.messages.clone();
    if let Some(r) = &t.response {
        let mut r = r.clone();
        if r.get("role").is_none() {
            r["role"] = Value::from("assistant");
        }
        msgs.push(r);
    }
    let mut origin = vec![None; msgs.len()];
    for &k in &seg.turns {
        let i = turns[k].messages.len();
        if turns[k].response.is_some()
            && i < msgs.len()
            && str_field(&msgs[i], "role") == "assistant"
        {
            origin[i] = Some(turns[k].call.sequence);
        }
    }
    (msgs, origin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn call(seq: i64, msgs: Value, resp: Value) -> CallRec {
        CallRec {
            rollout_id: "r1".into(),
            sequence: seq,
            wire_api: "chat_completions".into(),
            status: "ok".into(),
            messages: Some(msgs.to_string()),
            response_message: Some(resp.to_string()),
            ..Default::default()
        }
    }

    fn tc(id: &str, args: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "bash", "arguments": args}})
    }

    #[test]
    fn prefix_merging_on_messages_is_lenient_on_representation() {
        let sys = json!({"role": "system", "content": "be brief"});
        let user = json!({"role": "user", "content": "list files"});
        let a1 = json!({"role": "assistant", "content": null, "tool_calls": [tc("c1", "{\"command\": \"ls\"}")]});
        // The harness sends the answer back with "" content, arguments
        // re-serialized without spaces, content as a list of parts.
        let a1_echo = json!({"role": "assistant", "content": "", "reasoning_content": "hmm",
            "tool_calls": [tc("c1", "{\"command\":\"ls\"}")]});
        let user_parts =
            json!({"role": "user", "content": [{"type": "text", "text": "list files"}]});
        let tool = json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"});
        let a2 = json!({"role": "assistant", "content": "a.txt is there"});
        let calls = [
            call(0, json!([sys, user]), a1.clone()),
            call(1, json!([sys, user_parts, a1_echo, tool]), a2),
        ];
        let turns: Vec<Turn> = calls.iter().map(Turn::parse).collect();
        let mut mm = vec![];
        let segs = segment(&turns, &mut mm);
        assert_eq!(segs.len(), 1, "{mm:?}");
        assert!(mm.is_empty());
        let (msgs, origin) = conversation(&turns, &segs[0]);
        assert_eq!(msgs.len(), 5);
        assert_eq!(origin, vec![None, None, Some(0), None, Some(1)]);
    }

    #[test]
    fn compaction_starts_a_new_segment_with_a_reason() {
        let user = json!({"role": "user", "content": "fix the bug"});
        let a1 = json!({"role": "assistant", "content": "looking"});
        let u2 = json!({"role": "user", "content": "go on"});
        let a2 = json!({"role": "assistant", "content": "done step 2"});
        let summary =
            json!({"role": "user", "content": "Summary of the work so far: looked, did step 2"});
        let a3 = json!({"role": "assistant", "content": "continuing"});
        let calls = [
            call(0, json!([user]), a1.clone()),
            call(1, json!([user, a1, u2]), a2),
            call(2, json!([summary]), a3.clone()),
            call(
                3,
                json!([summary, a3, {"role": "user", "content": "more"}]),
                json!({"role": "assistant", "content": "ok"}),
            ),
        ];
        let turns: Vec<Turn> = calls.iter().map(Turn::parse).collect();
        let mut mm = vec![];
        let segs = segment(&turns, &mut mm);
        assert_eq!(
            segs.iter().map(|s| s.turns.clone()).collect::<Vec<_>>(),
            vec![vec![0, 1], vec![2, 3]]
        );
        assert_eq!(mm.len(), 1);
        assert_eq!(mm[0].sequence, 2);
        assert_eq!(mm[0].previous_sequence, 1);
        assert_eq!(mm[0].message_index, Some(0));
        assert!(
            mm[0].reason.contains("user content differs"),
            "{}",
            mm[0].reason
        );
    }

    #[test]
    fn a_dropped_answer_is_a_mismatch_at_its_index() {
        let user = json!({"role": "user", "content": "q"});
        let calls = [
            call(
                0,
                json!([user]),
                json!({"role": "assistant", "content": "first"}),
            ),
            call(
                1,
                json!([user, {"role": "assistant", "content": "edited"}]),
                json!({"role": "assistant", "content": "x"}),
            ),
        ];
        let turns: Vec<Turn> = calls.iter().map(Turn::parse).collect();
        let mut mm = vec![];
        assert_eq!(segment(&turns, &mut mm).len(), 2);
        assert_eq!(mm[0].message_index, Some(1));
        assert!(mm[0].reason.contains("previous answer"), "{}", mm[0].reason);
    }

    #[test]
    fn interleaved_sub_agent_gets_its_own_segment() {
        let u = json!({"role": "user", "content": "main task"});
        let a1 = json!({"role": "assistant", "content": "delegating"});
        let su = json!({"role": "user", "content": "sub task"});
        let sa = json!({"role": "assistant", "content": "sub answer"});
        let calls = [
            call(0, json!([u]), a1.clone()),
            call(1, json!([su]), sa),
            call(
                2,
                json!([u, a1, {"role": "user", "content": "result"}]),
                json!({"role": "assistant", "content": "end"}),
            ),
        ];
        let turns: Vec<Turn> = calls.iter().map(Turn::parse).collect();
        let mut mm = vec![];
        let segs = segment(&turns, &mut mm);
        assert_eq!(
            segs.iter().map(|s| s.turns.clone()).collect::<Vec<_>>(),
            vec![vec![0, 2], vec![1]]
        );
        assert_eq!(mm.len(), 1);
    }

    #[test]
    fn token_ids_decide_when_captured() {
        let mut c0 = call(
            0,
            json!([{"role": "user", "content": "a"}]),
            json!({"role": "assistant", "content": "b"}),
        );
        c0.prompt_ids = Some(vec![1, 2]);
        c0.completion_ids = Some(vec![3]);
        // Messages differ (a harness rewrote text) but tokens extend.
        let mut c1 = call(
            1,
            json!([{"role": "user", "content": "zzz"}]),
            json!({"role": "assistant", "content": "d"}),
        );
        c1.prompt_ids = Some(vec![1, 2, 3, 9]);
        c1.completion_ids = Some(vec![4]);
        let mut c2 = c1.clone();
        c2.sequence = 2;
        c2.prompt_ids = Some(vec![1, 2, 3, 8, 4]);
        let calls = [c0, c1, c2];
        let turns: Vec<Turn> = calls.iter().map(Turn::parse).collect();
        let mut mm = vec![];
        let segs = segment(&turns, &mut mm);
        assert_eq!(segs.len(), 2);
        assert_eq!(mm[0].token_index, Some(3));
    }
}
