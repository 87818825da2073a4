//! A rollout's token view: each segment's tokens as the RL export lays them
//! out (`export::rl::interleave`: the first prompt, then completions and the
//! observations between them), completion tokens shaded by their logprob
//! (and by the teacher's, where `rollcall score` scored them), the loss
//! mask shown. Token text comes from the upstream's own logprobs entries
//! when it sent them (exact, never re-tokenized); otherwise the ids are
//! shown.

use super::calls::{self, ViewCall};
use super::server::Viewer;
use crate::dialect::WireApi;
use crate::export::read::CallRec;
use crate::export::rl::interleave;
use crate::export::trajectory;
use crate::http::ProxyBody;
use http::Response;
use minijinja::context;
use serde_json::{json, Value};
use std::collections::HashMap;

/// Tokens shown per segment before the rest is cut (a page stays usable).
const MAX_TOKENS: usize = 20_000;

/// The token strings of an answer's sampled tokens, from its logprobs
/// entries: Chat Completions' `logprobs.content[].token`, Completions'
/// `logprobs.tokens`.
pub fn token_strings(response: &Value) -> Option<Vec<String>> {
    let lp = response.get("choices")?.get(0)?.get("logprobs")?;
    if let Some(content) = lp.get("content").and_then(Value::as_array) {
        return content
            .iter()
            .map(|e| e.get("token").and_then(Value::as_str).map(str::to_owned))
            .collect();
    }
    lp.get("tokens")?
        .as_array()?
        .iter()
        .map(|t| t.as_str().map(str::to_owned))
        .collect()
}

/// One call's sampled tokens as text, when its recorded upstream answer
/// carries them and they match its ids one for one.
fn call_strings(c: &ViewCall, raw: Option<calls::RawCall>) -> Option<Vec<String>> {
    let raw = raw?;
    let n = c.rec.completion_ids.as_ref()?.len();
    let (body, api) = match raw.upstream_response_raw {
        Some(b) => (
            b,
            c.upstream_api
                .as_deref()
                .unwrap_or(&c.rec.wire_api)
                .to_owned(),
        ),
        None => (raw.response_raw?, c.rec.wire_api.clone()),
    };
    let api = WireApi::parse(&api)?;
    let assembled = api.assemble(body.as_bytes(), c.stream);
    let strings = token_strings(assembled.response.as_ref()?)?;
    (strings.len() == n).then_some(strings)
}

/// A token as the page shows it.
fn tok(id: i32, text: Option<&str>, masked: bool, lp: Option<f32>, teacher: Option<f32>) -> Value {
    let finite = |x: Option<f32>| x.filter(|v| v.is_finite());
    let (lp, teacher) = (finite(lp), finite(teacher));
    // Shade: the lower the probability, the stronger the colour.
    let alpha = |x: Option<f32>| x.map(|l| (1.0 - l.exp()).clamp(0.0, 1.0));
    json!({"id": id, "text": text, "masked": masked, "logprob": lp, "teacher": teacher,
        "shade": alpha(lp).map(|a| format!("{:.2}", a * 0.75)),
        "teacher_shade": alpha(teacher).map(|a| format!("{:.2}", a * 0.75))})
}

/// `GET /rollouts/<id>/tokens`.
pub fn page(v: &Viewer, id: &str, _query: Option<&str>) -> Response<ProxyBody> {
    let index = v.index();
    let Some(summary) = index.get(id) else {
        return v.error_page(404, &format!("no rollout {id:?} in these shards"));
    };
    let files = index.files_of(summary);
    let loaded = calls::load(&files, id).and_then(|c| Ok((c, calls::scores(&v.shards, id)?)));
    let (all, scores) = match loaded {
        Ok(x) => x,
        Err(e) => return v.error_page(500, &format!("the shards could not be read: {e}")),
    };
    let by_seq: HashMap<i64, &ViewCall> = all.iter().map(|c| (c.rec.sequence, c)).collect();
    let mut recs = calls::trajectory(&all);
    for r in &mut recs {
        r.teacher_logprobs = scores.get(&r.sequence).cloned();
    }
    let refs: Vec<&CallRec> = recs.iter().collect();
    let mut mismatches = vec![];
    let (turns, segs) = trajectory::rebuild(&refs, false, &mut mismatches);
    // The answers' bytes, for the token text: one read of the rollout's rows.
    let mut raws = match calls::raws(&files, id, None) {
        Ok(r) => r,
        Err(e) => return v.error_page(500, &format!("the shards could not be read: {e}")),
    };
    let mut out = vec![];
    for seg in &segs {
        let seg_calls: Vec<&CallRec> = seg
            .turns
            .iter()
            .filter_map(|&k| turns.get(k))
            .map(|t| t.call)
            .collect();
        let il = interleave(&seg_calls);
        if il.completions.iter().all(|r| r.is_empty()) {
            continue;
        }
        // Each call's token text, by position in `response_ids`.
        let mut text: HashMap<usize, String> = HashMap::new();
        for (c, range) in seg_calls.iter().zip(&il.completions) {
            let Some(vc) = by_seq.get(&c.sequence) else {
                continue;
            };
            if let Some(strings) = call_strings(vc, raws.remove(&c.sequence)) {
                for (j, s) in range.clone().zip(strings) {
                    text.insert(j, s);
                }
            }
        }
        let mut spans: Vec<Value> = vec![];
        // The first prompt, folded: the loss mask is 0 on it too.
        let mut masked_run: Vec<i32> = il.prompt_ids.iter().take(MAX_TOKENS).copied().collect();
        let flush = |run: &mut Vec<i32>, spans: &mut Vec<Value>| {
            if !run.is_empty() {
                spans.push(
                    json!({"observation": true, "prompt": spans.is_empty(), "count": run.len(),
                    "ids": run.iter().map(i32::to_string).collect::<Vec<_>>().join(" ")}),
                );
                run.clear();
            }
        };
        let shown = il.response_ids.len().min(MAX_TOKENS);
        for j in 0..shown {
            let (Some(&id), Some(&mask)) = (il.response_ids.get(j), il.loss_mask.get(j)) else {
                break;
            };
            if mask == 0 {
                masked_run.push(id);
                continue;
            }
            flush(&mut masked_run, &mut spans);
            let teacher = il.teacher_logprobs.as_ref().and_then(|t| t.get(j).copied());
            spans.push(tok(
                id,
                text.get(&j).map(String::as_str),
                false,
                il.logprobs.get(j).copied(),
                teacher,
            ));
        }
        flush(&mut masked_run, &mut spans);
        out.push(json!({
            "index": seg.index,
            "calls": seg_calls.iter().map(|c| c.sequence).collect::<Vec<_>>(),
            "prompt_tokens": il.prompt_ids.len(),
            "sampled": il.loss_mask.iter().filter(|&&m| m == 1).count(),
            "observed": il.loss_mask.iter().filter(|&&m| m == 0).count(),
            "missing_logprobs": il.missing_logprobs,
            "scored": il.teacher_logprobs.is_some(),
            "cut": il.response_ids.len().saturating_sub(shown),
            "spans": spans,
        }));
    }
    v.render(
        "tokens.html",
        context! {
            shards => v.shards.display().to_string(), id => id,
            segments => minijinja::value::Serde(&out),
            teacher => out.iter().any(|s| s.get("scored").and_then(Value::as_bool) == Some(true)),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_text_comes_from_either_apis_logprobs() {
        let chat = json!({"choices": [{"logprobs": {"content": [{"token": "He", "logprob": -0.1}, {"token": "llo", "logprob": -2.0}]}}]});
        assert_eq!(token_strings(&chat), Some(vec!["He".into(), "llo".into()]));
        let legacy = json!({"choices": [{"logprobs": {"tokens": ["a", "b"]}}]});
        assert_eq!(token_strings(&legacy), Some(vec!["a".into(), "b".into()]));
        assert_eq!(token_strings(&json!({"choices": []})), None);
        assert_eq!(
            token_strings(&json!({"choices": [{"logprobs": {"content": [{"nope": 1}]}}]})),
            None
        );
    }

    #[test]
    fn a_token_is_shaded_by_how_unlikely_it_was() {
        let sure = tok(1, Some("a"), false, Some(0.0), None);
        let unsure = tok(2, None, false, Some(-3.0), Some(f32::NAN));
        assert_eq!(sure["shade"], "0.00");
        assert!(unsure["shade"].as_str().unwrap() > "0.50");
        assert!(unsure["teacher"].is_null());
    }
}
