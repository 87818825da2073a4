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
//! being exactly what [`same_message`] compares. A new call hashes its own
//! prompt ids and messages prefix by prefix, looks each prefix up, and
//! every candidate is verified with [`extends`], so a hash collision can
//! never merge two segments. A rollout of 1,000,000 independent one-call
//! conversations segments in one pass.

use super::read::CallRec;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hasher;

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

// ------------------------------------------------------------ tip index

/// (length, hash): a prefix of token ids or of normalized messages.
type Key = (usize, u64);

const HASH_START: u64 = 0xcbf2_9ce4_8422_2325;

/// One step of the order-sensitive prefix hash.
fn mix(h: u64, x: u64) -> u64 {
    (h.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95)
}

fn sip() -> std::collections::hash_map::DefaultHasher {
    // Fixed keys: the same input hashes the same in every run.
    std::collections::hash_map::DefaultHasher::new()
}

/// Hash a JSON value consistently with `Value`'s equality: object keys in
/// any order, numbers by kind (as `serde_json` compares them), -0.0 as 0.0.
fn hash_value(v: &Value, h: &mut impl Hasher) {
    match v {
        Value::Null => h.write_u8(0),
        Value::Bool(b) => {
            h.write_u8(1);
            h.write_u8(u8::from(*b));
        }
        Value::Number(n) => {
            h.write_u8(2);
            if let Some(u) = n.as_u64() {
                h.write_u8(0);
                h.write_u64(u);
            } else if let Some(i) = n.as_i64() {
                h.write_u8(1);
                h.write_i64(i);
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                h.write_u8(2);
                h.write_u64(if f == 0.0 { 0 } else { f.to_bits() });
            }
        }
        Value::String(s) => {
            h.write_u8(3);
            h.write(s.as_bytes());
            h.write_u8(0xff);
        }
        Value::Array(a) => {
            h.write_u8(4);
            h.write_usize(a.len());
            for x in a {
                hash_value(x, h);
            }
        }
        Value::Object(m) => {
            h.write_u8(5);
            h.write_usize(m.len());
            let mut sum = 0u64;
            for (k, x) in m {
                let mut e = sip();
                e.write(k.as_bytes());
                e.write_u8(0xff);
                hash_value(x, &mut e);
                sum = sum.wrapping_add(e.finish());
            }
            h.write_u64(sum);
        }
    }
}

/// A hash of exactly what [`same_message`] compares: messages it calls the
/// same hash the same.
fn message_hash(m: &Value) -> u64 {
    let mut h = sip();
    let mut text = |s: &str| {
        h.write(s.as_bytes());
        h.write_u8(0xff);
    };
    text(str_field(m, "role"));
    text(&content_text(m.get("content")));
    text(str_field(m, "tool_call_id"));
    let calls = tool_calls(m);
    h.write_usize(calls.len());
    for (id, name, args) in &calls {
        h.write(id.as_bytes());
        h.write_u8(0xff);
        h.write(name.as_bytes());
        h.write_u8(0xff);
        hash_value(args, &mut h);
    }
    h.finish()
}

/// Segments by the key of their tip, each list in tip order (a new tip is
/// always the latest turn, so pushing keeps it sorted).
#[derive(Default)]
struct Index {
    map: HashMap<Key, Vec<usize>>,
    /// How many keys there are of each length (to skip lengths with none).
    lens: Vec<u32>,
}

impl Index {
    fn has_len(&self, n: usize) -> bool {
        self.lens.get(n).is_some_and(|&c| c > 0)
    }

    fn insert(&mut self, key: Key, seg: usize) {
        if self.lens.len() <= key.0 {
            self.lens.resize(key.0 + 1, 0);
        }
        self.lens[key.0] += 1;
        self.map.entry(key).or_default().push(seg);
    }

    fn remove(&mut self, key: Key, seg: usize) {
        if let Some(v) = self.map.get_mut(&key) {
            if let Some(i) = v.iter().rposition(|&s| s == seg) {
                v.remove(i);
                if let Some(c) = self.lens.get_mut(key.0) {
                    *c = c.saturating_sub(1);
                }
            }
            if v.is_empty() {
                self.map.remove(&key);
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Tokens,
    /// Tips with token ids, matched on messages by calls without prompt ids.
    MessagesOfTokenTips,
    /// Tips without token ids.
    Messages,
}

/// The keys a segment's tip is indexed under.
#[derive(Clone, Copy, Default)]
struct TipKeys {
    tokens: Option<Key>,
    messages: Option<(Which, Key)>,
}

/// The segmentation state of one rollout, fed one turn at a time.
struct Segmenter {
    segs: Vec<Segment>,
    tips: Vec<TipKeys>,
    tokens: Index,
    msg_token_tips: Index,
    messages: Index,
    /// False when every call has token ids: then every match is on tokens.
    use_messages: bool,
}

impl Segmenter {
    fn new(use_messages: bool) -> Segmenter {
        Segmenter {
            segs: vec![],
            tips: vec![],
            tokens: Index::default(),
            msg_token_tips: Index::default(),
            messages: Index::default(),
            use_messages,
        }
    }

    fn index(&self, w: Which) -> &Index {
        match w {
            Which::Tokens => &self.tokens,
            Which::MessagesOfTokenTips => &self.msg_token_tips,
            Which::Messages => &self.messages,
        }
    }

    fn index_mut(&mut self, w: Which) -> &mut Index {
        match w {
            Which::Tokens => &mut self.tokens,
            Which::MessagesOfTokenTips => &mut self.msg_token_tips,
            Which::Messages => &mut self.messages,
        }
    }

    fn tip(&self, seg: usize) -> usize {
        self.segs
            .get(seg)
            .and_then(|s| s.turns.last().copied())
            .unwrap_or(0)
    }

    /// Add turn `k` (the latest of `turns`); returns the previous tip of
    /// the segment it joined, if it joined one.
    fn push(&mut self, turns: &[Turn], k: usize, mismatches: &mut Vec<Mismatch>) -> Option<usize> {
        let t = turns.get(k)?;
        // Candidates: (tip turn, index, key, position in the key's list).
        let mut heap: BinaryHeap<(usize, u8, Key, usize)> = BinaryHeap::new();
        let mut offer = |this: &Segmenter, w: Which, key: Key| {
            if let Some(v) = this.index(w).map.get(&key) {
                if let Some(&seg) = v.last() {
                    heap.push((this.tip(seg), w as u8, key, v.len() - 1));
                }
            }
        };
        let mut keys = TipKeys::default();
        if let Some(cp) = &t.call.prompt_ids {
            let mut h = HASH_START;
            for (i, &x) in cp.iter().enumerate() {
                if self.tokens.has_len(i) {
                    offer(self, Which::Tokens, (i, h));
                }
                h = mix(h, u64::from(x as u32));
            }
            if self.tokens.has_len(cp.len()) {
                offer(self, Which::Tokens, (cp.len(), h));
            }
            if let Some(cc) = &t.call.completion_ids {
                for &x in cc {
                    h = mix(h, u64::from(x as u32));
                }
                keys.tokens = Some((cp.len() + cc.len(), h));
            }
        }
        if self.use_messages {
            let by_messages = if t.call.prompt_ids.is_some() {
                None
            } else {
                Some(Which::MessagesOfTokenTips)
            };
            let mut h = HASH_START;
            for (i, m) in t.messages.iter().enumerate() {
                h = mix(h, message_hash(m));
                for w in [Some(Which::Messages), by_messages].into_iter().flatten() {
                    if self.index(w).has_len(i + 1) {
                        offer(self, w, (i + 1, h));
                    }
                }
            }
            if let Some(r) = &t.response {
                let w = if t.has_ids() {
                    Which::MessagesOfTokenTips
                } else {
                    Which::Messages
                };
                keys.messages = Some((w, (t.messages.len() + 1, mix(h, message_hash(r)))));
            }
        }
        // Verify in tip order, latest first: the first that extends wins.
        let which = |n: u8| match n {
            0 => Which::Tokens,
            1 => Which::MessagesOfTokenTips,
            _ => Which::Messages,
        };
        let mut joined = None;
        while let Some((tip, w, key, pos)) = heap.pop() {
            let list = self.index(which(w)).map.get(&key);
            let Some(&seg) = list.and_then(|v| v.get(pos)) else {
                continue;
            };
            if turns.get(tip).is_some_and(|p| extends(p, t).is_ok()) {
                joined = Some(seg);
                break;
            }
            if let Some(&earlier) = pos.checked_sub(1).and_then(|p| list.and_then(|v| v.get(p))) {
                heap.push((self.tip(earlier), w, key, pos - 1));
            }
        }
        let (seg, old_tip) = match joined {
            Some(seg) => {
                let old = self.tip(seg);
                let TipKeys { tokens, messages } = self.tips.get(seg).copied().unwrap_or_default();
                if let Some(key) = tokens {
                    self.tokens.remove(key, seg);
                }
                if let Some((w, key)) = messages {
                    self.index_mut(w).remove(key, seg);
                }
                if let Some(s) = self.segs.get_mut(seg) {
                    s.turns.push(k);
                }
                (seg, Some(old))
            }
            None => {
                mismatches.extend(mismatch_at(turns, k));
                let seg = self.segs.len();
                self.segs.push(Segment {
                    index: seg,
                    turns: vec![k],
                });
                self.tips.push(TipKeys::default());
                (seg, None)
            }
        };
        if let Some(key) = keys.tokens {
            self.tokens.insert(key, seg);
        }
        if let Some((w, key)) = keys.messages {
            self.index_mut(w).insert(key, seg);
        }
        if let Some(slot) = self.tips.get_mut(seg) {
            *slot = keys;
        }
        old_tip
    }
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

/// The quadratic reference: compare each call with every open segment.
#[cfg(test)]
pub(crate) fn segment_quadratic(turns: &[Turn], mismatches: &mut Vec<Mismatch>) -> Vec<Segment> {
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
                mismatches.extend(mismatch_at(turns, k));
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

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    /// The same message written differently (what `same_message` ignores).
    fn restyle(m: &Value, rng: &mut Rng) -> Value {
        let mut m = m.clone();
        if let Some(o) = m.as_object_mut() {
            match rng.below(4) {
                0 => {
                    if let Some(Value::String(text)) = o.get("content").cloned() {
                        o.insert("content".into(), json!([{"type": "text", "text": text}]));
                    }
                }
                1 => {
                    if o.get("content").is_some_and(|c| c.as_str() == Some("")) {
                        o.insert("content".into(), Value::Null);
                    }
                    o.insert("reasoning_content".into(), json!("hm"));
                }
                2 => {
                    // Keys in another order, arguments re-serialized.
                    let mut e: Vec<(String, Value)> =
                        o.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    e.reverse();
                    o.clear();
                    for (k, mut v) in e {
                        if k == "tool_calls" {
                            for c in v.as_array_mut().into_iter().flatten() {
                                let args = c["function"]["arguments"].as_str().unwrap_or("{}");
                                let parsed: Value = serde_json::from_str(args).unwrap_or_default();
                                c["function"]["arguments"] = json!(format!("{parsed:#}"));
                            }
                        }
                        o.insert(k, v);
                    }
                }
                _ => {}
            }
        }
        m
    }

    /// A random rollout: fresh conversations from a tiny alphabet (so
    /// equal prefixes are common), calls extending a random earlier call
    /// (a tip or not: forks, retries), edited histories, calls with and
    /// without token ids, without an answer.
    fn random_calls(rng: &mut Rng, n: usize) -> Vec<CallRec> {
        let mut calls: Vec<CallRec> = vec![];
        for k in 0..n {
            let tokens = |rng: &mut Rng, len: u64| -> Vec<i32> {
                (0..1 + rng.below(len))
                    .map(|_| rng.below(3) as i32)
                    .collect()
            };
            let (mut msgs, mut prompt): (Vec<Value>, Vec<i32>) =
                if calls.is_empty() || rng.chance(25) {
                    (
                        vec![json!({"role": "user", "content": format!("t{}", rng.below(3))})],
                        tokens(rng, 2),
                    )
                } else {
                    let span = if rng.chance(70) { 3 } else { k as u64 };
                    let back = 1 + rng.below(span);
                    let j = &calls[k.saturating_sub(back as usize)];
                    let mut msgs: Vec<Value> = j
                        .messages
                        .as_deref()
                        .and_then(|m| serde_json::from_str::<Vec<Value>>(m).ok())
                        .unwrap_or_default();
                    msgs = msgs.iter().map(|m| restyle(m, rng)).collect();
                    if let Some(r) = j.response_message.as_deref() {
                        let r: Value = serde_json::from_str(r).unwrap_or_default();
                        msgs.push(restyle(&r, rng));
                    }
                    let mut prompt = j.prompt_ids.clone().unwrap_or_default();
                    prompt.extend(j.completion_ids.clone().unwrap_or_default());
                    if rng.chance(10) && !msgs.is_empty() {
                        let i = rng.below(msgs.len() as u64) as usize;
                        msgs[i] = json!({"role": "user", "content": "edited"});
                    }
                    if rng.chance(10) && !prompt.is_empty() {
                        let i = rng.below(prompt.len() as u64) as usize;
                        prompt[i] = 9;
                    }
                    (msgs, prompt)
                };
            msgs.push(match rng.below(3) {
                0 => json!({"role": "tool", "tool_call_id": format!("c{}", rng.below(2)), "content": "ok"}),
                _ => json!({"role": "user", "content": format!("u{}", rng.below(2))}),
            });
            prompt.extend(tokens(rng, 2));
            let answer = if rng.chance(40) {
                json!({"role": "assistant", "content": "",
                    "tool_calls": [tc(&format!("c{}", rng.below(2)), &format!("{{\"n\": {}}}", rng.below(2)))]})
            } else {
                json!({"role": "assistant", "content": format!("a{}", rng.below(3))})
            };
            let mut c = call(k as i64, Value::Array(msgs), answer);
            if rng.chance(5) {
                c.response_message = None;
            }
            if !rng.chance(20) {
                c.prompt_ids = Some(prompt);
            }
            if !rng.chance(15) {
                c.completion_ids = Some(tokens(rng, 2));
            }
            calls.push(c);
        }
        calls
    }

    #[test]
    fn the_indexed_segmentation_equals_the_quadratic_one() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut merged, mut split) = (0, 0);
        for round in 0..60 {
            let mut calls = random_calls(&mut rng, 150);
            if round % 3 == 0 {
                // All with token ids: the token-only path.
                for c in &mut calls {
                    c.prompt_ids.get_or_insert_with(Vec::new);
                    c.completion_ids.get_or_insert_with(|| vec![1]);
                }
            }
            let turns: Vec<Turn> = calls.iter().map(Turn::parse).collect();
            let (mut want_mm, mut got_mm, mut rebuilt_mm) = (vec![], vec![], vec![]);
            let want = segment_quadratic(&turns, &mut want_mm);
            let got = segment(&turns, &mut got_mm);
            assert_eq!(got, want, "round {round}");
            assert_eq!(got_mm, want_mm, "round {round}");
            let refs: Vec<&CallRec> = calls.iter().collect();
            for keep in [true, false] {
                rebuilt_mm.clear();
                let (rt, segs) = rebuild(&refs, keep, &mut rebuilt_mm);
                assert_eq!(segs, want, "round {round}, rebuild");
                assert_eq!(rebuilt_mm, want_mm, "round {round}, rebuild");
                if keep {
                    for seg in &segs {
                        assert_eq!(conversation(&rt, seg), conversation(&turns, seg));
                    }
                }
            }
            merged += calls.len() - want.len();
            split += want.len();
        }
        // The mix exercises both joining and splitting.
        assert!(
            merged > 1_000 && split > 1_000,
            "{merged} joined, {split} split"
        );
    }

    #[test]
    fn twenty_thousand_independent_conversations_in_one_rollout() {
        let n = 20_000;
        for with_ids in [true, false] {
            let calls: Vec<CallRec> = (0..n)
                .map(|i| {
                    let mut c = call(
                        i,
                        json!([{"role": "system", "content": "s"}, {"role": "user", "content": format!("task {i}")}]),
                        json!({"role": "assistant", "content": "done"}),
                    );
                    if with_ids {
                        c.prompt_ids = Some(vec![1, i as i32]);
                        c.completion_ids = Some(vec![2]);
                    }
                    c
                })
                .collect();
            let refs: Vec<&CallRec> = calls.iter().collect();
            let mut mm = vec![];
            let (turns, segs) = rebuild(&refs, true, &mut mm);
            assert_eq!(segs.len(), n as usize);
            assert_eq!(mm.len(), n as usize - 1);
            assert!(segs.iter().all(|s| s.turns.len() == 1));
            // Every segment is its own tip: all keep their messages.
            assert!(turns.iter().all(|t| t.messages.len() == 2));
        }
    }

    #[test]
    fn a_long_conversation_keeps_only_its_tip_parsed() {
        let mut calls = vec![];
        let mut msgs = vec![json!({"role": "user", "content": "go"})];
        for i in 0..200 {
            let ans = json!({"role": "assistant", "content": format!("step {i}")});
            calls.push(call(i, Value::Array(msgs.clone()), ans.clone()));
            msgs.push(ans);
            msgs.push(json!({"role": "user", "content": "more"}));
        }
        let refs: Vec<&CallRec> = calls.iter().collect();
        let mut mm = vec![];
        let (turns, segs) = rebuild(&refs, true, &mut mm);
        assert_eq!(segs.len(), 1, "{mm:?}");
        assert!(turns[..199].iter().all(|t| t.messages.is_empty()));
        let (conv, origin) = conversation(&turns, &segs[0]);
        assert_eq!(conv.len(), 400);
        assert_eq!(origin.iter().flatten().count(), 200);
    }
}
