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
//!
//! Finding that segment is linear in the rollout's data, not quadratic in
//! its calls: every segment's last call (its *tip*) is indexed by a hash of
//! what a call must start with to extend it: (length, hash of `prompt_ids ++
//! completion_ids`) for token matching, and (message count, hash of the
//! normalized messages ++ answer) for message matching, the normalized form
//! being exactly what [`compare::same_message`] compares. A new call hashes its own
//! prompt ids and messages prefix by prefix, looks each prefix up, and
//! every candidate is verified with [`extends`], so a hash collision can
//! never merge two segments. A rollout of 1,000,000 independent one-call
//! conversations segments in one pass.
//!
//! This file holds the turns, segments and mismatches and the passes over
//! a rollout; [`compare`] says when one call extends another, and `index`
//! holds the tip index that finds the segment a call joins.

pub mod compare;
mod index;
#[cfg(test)]
mod tests;

use super::read::CallRec;
use compare::{extends, str_field, Diff};
use index::Segmenter;
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
///
/// [`rebuild`] keeps `messages` and `response` only for the last turn of
/// each segment (what [`conversation`] reads); `history_len` and
/// `answered` stay for every turn.
#[derive(Debug, Clone)]
pub struct Turn<'a> {
    pub call: &'a CallRec,
    pub messages: Vec<Value>,
    pub response: Option<Value>,
    /// Number of messages in the call's history.
    pub history_len: usize,
    /// Whether the call has a response message (an object).
    pub answered: bool,
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
            history_len: messages.len(),
            answered: response.is_some(),
            call,
            messages,
            response,
        }
    }

    /// A turn whose JSON columns are not parsed (for matching on token ids).
    pub fn unparsed(call: &'a CallRec) -> Turn<'a> {
        Turn {
            call,
            messages: vec![],
            response: None,
            history_len: 0,
            answered: false,
        }
    }

    /// Whether `extends(self, next)` matches on token ids when `next` has
    /// prompt ids.
    fn has_ids(&self) -> bool {
        self.call.has_token_ids()
    }

    /// Drop the parsed JSON (the turn is no longer a segment's tip).
    fn forget(&mut self) {
        self.messages = Vec::new();
        self.response = None;
    }
}

/// One segment: indexes of its turns, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub index: usize,
    pub turns: Vec<usize>,
}

/// The mismatch for turn `k` that starts a new segment: where it differs
/// from the call just before it.
fn mismatch_at(turns: &[Turn], k: usize) -> Option<Mismatch> {
    let (prev, t) = (turns.get(k.checked_sub(1)?)?, turns.get(k)?);
    let d = extends(prev, t).err().unwrap_or(Diff {
        message_index: None,
        token_index: None,
        reason: "does not extend any open segment".into(),
    });
    Some(Mismatch {
        rollout_id: t.call.rollout_id.clone(),
        sequence: t.call.sequence,
        previous_sequence: prev.call.sequence,
        message_index: d.message_index,
        token_index: d.token_index,
        reason: d.reason,
    })
}

/// Split a rollout's turns (ordered by sequence) into segments, appending a
/// mismatch for each turn that starts a segment after the first.
pub fn segment(turns: &[Turn], mismatches: &mut Vec<Mismatch>) -> Vec<Segment> {
    let mut s = Segmenter::new(!turns.iter().all(Turn::has_ids));
    for k in 0..turns.len() {
        s.push(turns, k, mismatches);
    }
    s.segs
}

/// Rebuild a rollout's calls (ordered by sequence) into turns and segments,
/// appending a mismatch for each call that starts a segment after the first.
///
/// Each call's JSON is parsed once, and only when needed: not at all when
/// every call has token ids and `keep_messages` is false. Only the last turn
/// of each segment keeps its parsed messages (none when `keep_messages` is
/// false), which is all [`conversation`] reads.
pub fn rebuild<'a>(
    calls: &[&'a CallRec],
    keep_messages: bool,
    mismatches: &mut Vec<Mismatch>,
) -> (Vec<Turn<'a>>, Vec<Segment>) {
    let use_messages = !calls.iter().all(|c| c.has_token_ids());
    let parse = use_messages || keep_messages;
    let mut s = Segmenter::new(use_messages);
    let mut turns: Vec<Turn<'a>> = Vec::with_capacity(calls.len());
    for (k, c) in calls.iter().enumerate() {
        turns.push(if parse {
            Turn::parse(c)
        } else {
            Turn::unparsed(c)
        });
        if let Some(old) = s.push(&turns, k, mismatches) {
            if let Some(t) = turns.get_mut(old) {
                t.forget();
            }
        }
    }
    if !keep_messages {
        turns.iter_mut().for_each(Turn::forget);
    }
    (turns, s.segs)
}

/// The conversation of a segment: the last call's messages plus its answer,
/// and for each message the sequence of the call whose answer it is.
pub fn conversation(turns: &[Turn], seg: &Segment) -> (Vec<Value>, Vec<Option<i64>>) {
    let Some(t) = seg.turns.last().and_then(|&k| turns.get(k)) else {
        return (vec![], vec![]);
    };
    let mut msgs = t.messages.clone();
    if let Some(r) = &t.response {
        let mut r = r.clone();
        if r.get("role").is_none() {
            r["role"] = Value::from("assistant");
        }
        msgs.push(r);
    }
    let mut origin = vec![None; msgs.len()];
    for t in seg.turns.iter().filter_map(|&k| turns.get(k)) {
        let i = t.history_len;
        if t.answered && i < msgs.len() && str_field(&msgs[i], "role") == "assistant" {
            origin[i] = Some(t.call.sequence);
        }
    }
    (msgs, origin)
}
