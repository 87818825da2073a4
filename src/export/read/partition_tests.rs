//! Tests of the partitions, and `call_row`: a call row for tests that
//! write shards.

use super::partition::{by_rollout, Groups, Partitions};
use super::*;
use crate::config::ShardConfig;
use crate::export::progress::Progress;
use crate::record::shard::write_now;
use crate::record::CallRow;

pub(crate) fn call_row(rollout: &str, seq: i64) -> CallRow {
    CallRow {
        replica: None,
        policy_version: None,
        policy_version_end: None,
        resent: 0,
        continued: Vec::new(),
        attempt: 0,
        attempt_of: None,
        side_call: false,
        repinned: false,
        call_id: format!("{rollout}-{seq}"),
        rollout_id: rollout.into(),
        sequence: seq,
        wire_api: "chat_completions".into(),
        route: None,
        model: Some("m".into()),
        upstream_model: None,
        stream: false,
        status: "ok".into(),
        http_status: Some(200),
        failure_class: None,
        failure_message: None,
        request: "{}".into(),
        upstream_request: None,
        response: None,
        response_raw: None,
        messages: Some("[]".into()),
        tools: None,
        response_message: None,
        tool_calls: None,
        finish_reason: None,
        received_at: seq,
        first_byte_at: None,
        done_at: None,
        prompt_tokens: None,
        completion_tokens: None,
        total_tokens: None,
        cached_tokens: None,
        reasoning_tokens: None,
        token_capture: "ids".into(),
        prompt_token_ids: Some(vec![1, 2, seq as i32]),
        completion_token_ids: Some(vec![3]),
        prompt_logprobs: None,
        completion_logprobs: Some(vec![-0.5]),
        user_agent: None,
        upstream_api: None,
        upstream_response_raw: None,
    }
}

#[test]
fn spilled_partitions_hold_the_same_rollouts_as_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ShardConfig {
        dir: dir.path().join("shards"),
        ..ShardConfig::default()
    };
    let mut rows = vec![];
    for r in 0..30 {
        for s in (0..4).rev() {
            rows.push(call_row(&format!("r{r:02}"), s));
        }
    }
    rows.push(call_row("r00", 0)); // a duplicate row
    write_now(&cfg, rows).expect("write");
    let collect = |per: usize| {
        let mut p = Partitions::load(
            &cfg.dir,
            &dir.path().join("spill"),
            per,
            |_| true,
            &Groups::default(),
            &Progress::hidden(),
        )
        .expect("load");
        let mut out = vec![];
        for i in 0..p.len() {
            for r in by_rollout(p.take(i).expect("take")) {
                out.push((
                    r[0].rollout_id.clone(),
                    r.iter().map(|c| c.sequence).collect::<Vec<_>>(),
                ));
            }
        }
        (p.len(), out)
    };
    let (n1, mut one) = collect(1_000);
    let (n8, many) = collect(16);
    assert_eq!((n1, n8), (1, 8));
    assert!(!dir.path().join("spill").join("part-0000.bin").exists());
    let mut sorted = many.clone();
    sorted.sort();
    one.sort();
    assert_eq!(sorted, one);
    assert_eq!(one.len(), 30);
    assert!(one.iter().all(|(_, s)| s == &vec![0, 1, 2, 3]));
    // The same input gives the same order every time.
    assert_eq!(collect(16).1, many);
    assert!(matches!(
        Partitions::load(
            &dir.path().join("nope"),
            dir.path(),
            1,
            |_| true,
            &Groups::default(),
            &Progress::hidden()
        ),
        Err(ExportError::NoDir(_))
    ));
}

#[test]
fn teacher_scores_join_their_calls_in_memory_and_spilled() {
    use crate::record::ScoreRow;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ShardConfig {
        dir: dir.path().join("shards"),
        ..ShardConfig::default()
    };
    let mut rows = vec![];
    for r in 0..20 {
        for s in 0..3 {
            rows.push(call_row(&format!("r{r:02}"), s));
        }
    }
    write_now(&cfg, rows).expect("calls");
    let score = |r: usize, s: i64, lp: f64, at: i64| ScoreRow {
        record_id: format!("{r}-{s}-{at}"),
        rollout_id: format!("r{r:02}"),
        sequence: s,
        teacher: "t".into(),
        teacher_model: None,
        teacher_logprobs: vec![lp],
        prompt_tokens: 3,
        scored_at: at,
    };
    let mut scores: Vec<ScoreRow> = (0..20).map(|r| score(r, 1, -1.0, 10)).collect();
    // Scored again later: the later score is the one read.
    scores.push(score(7, 1, -2.0, 20));
    // A score of a call that is not there is ignored.
    scores.push(score(99, 0, -3.0, 10));
    write_now(&cfg, scores).expect("scores");
    for per in [1_000, 8] {
        let mut p = Partitions::load(
            &cfg.dir,
            &dir.path().join("spill"),
            per,
            |_| true,
            &Groups::default(),
            &Progress::hidden(),
        )
        .expect("load");
        let mut seen = 0;
        for i in 0..p.len() {
            for c in p.take(i).expect("take") {
                let want = match (c.rollout_id.as_str(), c.sequence) {
                    ("r07", 1) => Some(vec![-2.0]),
                    (_, 1) => Some(vec![-1.0]),
                    _ => None,
                };
                assert_eq!(c.teacher_logprobs, want, "{} {}", c.rollout_id, c.sequence);
                seen += 1;
            }
        }
        assert_eq!(seen, 60);
    }
}
