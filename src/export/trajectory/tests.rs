//! Tests of trajectory rebuilding: lenient message matching, mismatches,
//! sub-agents, token ids, and the indexed segmentation against the
//! quadratic reference.

use super::*;
use serde_json::json;

/// The quadratic reference: compare each call with every open segment.
fn segment_quadratic(turns: &[Turn], mismatches: &mut Vec<Mismatch>) -> Vec<Segment> {
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
    let user_parts = json!({"role": "user", "content": [{"type": "text", "text": "list files"}]});
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
        let (mut msgs, mut prompt): (Vec<Value>, Vec<i32>) = if calls.is_empty() || rng.chance(25) {
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
