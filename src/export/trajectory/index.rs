//! The tip index: every open segment's last call indexed by a hash of what
//! a call must start with to extend it, so finding the segment a call
//! joins is linear in the rollout's data ([`Segmenter`]). See the module
//! docs of `trajectory`.

use super::compare::{content_text, extends, str_field, tool_calls};
use super::{mismatch_at, Mismatch, Segment, Turn};
use serde_json::Value;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hasher;

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
pub(super) struct Segmenter {
    pub(super) segs: Vec<Segment>,
    tips: Vec<TipKeys>,
    tokens: Index,
    msg_token_tips: Index,
    messages: Index,
    /// False when every call has token ids: then every match is on tokens.
    use_messages: bool,
}

impl Segmenter {
    pub(super) fn new(use_messages: bool) -> Segmenter {
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
    pub(super) fn push(
        &mut self,
        turns: &[Turn],
        k: usize,
        mismatches: &mut Vec<Mismatch>,
    ) -> Option<usize> {
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
