//! Tests of the RL export: token-level samples and the trainer shapes.

use super::columns::slime_status;
use super::*;
use serde_json::json;

fn tok_call(seq: i64, prompt: Vec<i32>, completion: Vec<i32>) -> CallRec {
    CallRec {
        rollout_id: "r1".into(),
        sequence: seq,
        wire_api: "chat_completions".into(),
        status: "ok".into(),
        messages: Some(json!([{"role": "user", "content": "x"}]).to_string()),
        response_message: Some(json!({"role": "assistant", "content": "y"}).to_string()),
        completion_logprobs: Some(completion.iter().map(|&t| -(t as f64) / 10.0).collect()),
        prompt_ids: Some(prompt),
        completion_ids: Some(completion),
        ..Default::default()
    }
}

#[test]
fn loss_mask_and_logprobs_at_the_token_level() {
    let calls = vec![
        tok_call(0, vec![1, 2], vec![3, 4]),
        // observation 5, 6
        tok_call(1, vec![1, 2, 3, 4, 5, 6], vec![7]),
        // a call that failed: skipped, counted
        CallRec {
            status: "failed".into(),
            sequence: 2,
            ..tok_call(2, vec![], vec![])
        },
        // observation 8
        tok_call(3, vec![1, 2, 3, 4, 5, 6, 7, 8], vec![9, 10]),
        // no token ids: excluded
        CallRec {
            prompt_ids: None,
            completion_ids: None,
            ..tok_call(4, vec![], vec![])
        },
    ];
    let info = RolloutInfo {
        status: "success".into(),
        reward: Some(1.0),
        metadata: Some(r#"{"group": "task-a"}"#.into()),
        finished_at: 1,
        ..RolloutInfo::default()
    };
    let mut report = Report::default();
    let mut mm = vec![];
    let s = rollout_samples(
        &calls,
        Some(&info),
        &RlOptions::default(),
        &mut report,
        &mut mm,
    );
    assert_eq!(s.len(), 1, "{mm:?}");
    let s = &s[0];
    assert_eq!(s.prompt_ids, vec![1, 2]);
    assert_eq!(s.response_ids, vec![3, 4, 5, 6, 7, 8, 9, 10]);
    assert_eq!(s.loss_mask, vec![1, 1, 0, 0, 1, 0, 1, 1]);
    assert_eq!(
        s.logprobs,
        vec![-0.3, -0.4, 0.0, 0.0, -0.7, 0.0, -0.9, -1.0]
    );
    assert_eq!(s.reward, Some(1.0));
    assert_eq!(s.group, "task-a");
    assert_eq!(s.sequences, vec![0, 1, 3]);
    assert_eq!(report.skipped_not_ok, 1);
    assert_eq!(report.skipped_no_token_ids, 1);
    assert_eq!(report.missing_logprobs, 0);
}

#[test]
fn a_token_mismatch_splits_rl_samples_sharing_the_reward() {
    let calls = vec![
        tok_call(0, vec![1, 2], vec![3]),
        tok_call(1, vec![1, 9, 9], vec![4]),
    ];
    let info = RolloutInfo {
        status: "failure".into(),
        reward: Some(0.0),
        ..Default::default()
    };
    let mut report = Report::default();
    let mut mm = vec![];
    let s = rollout_samples(
        &calls,
        Some(&info),
        &RlOptions::default(),
        &mut report,
        &mut mm,
    );
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].segment, s[1].segment), (0, 1));
    assert_eq!(s[1].prompt_ids, vec![1, 9, 9]);
    assert!(s.iter().all(|x| x.reward == Some(0.0) && x.group == "r1"));
    assert_eq!(mm.len(), 1);
    assert_eq!(mm[0].token_index, Some(1));
}

#[test]
fn trainer_shapes_have_their_names() {
    let names = |t| {
        schema(t)
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>()
    };
    // Exactly the trainers' own field names (verl's AgentLoopOutput,
    // slime's Sample): anything else is dropped or rejected there.
    assert_eq!(
        names(Trainer::Verl),
        [
            "prompt_ids",
            "response_ids",
            "response_mask",
            "response_logprobs",
            "reward_score",
            "num_turns",
            "metrics",
            "extra_fields"
        ]
    );
    assert_eq!(
        names(Trainer::Slime),
        [
            "group_index",
            "index",
            "rollout_id",
            "tokens",
            "response_length",
            "loss_mask",
            "rollout_log_probs",
            "teacher_log_probs",
            "reward",
            "status",
            "metadata"
        ]
    );
    for n in [
        "prompt_ids",
        "completion_ids",
        "env_mask",
        "logprobs",
        "reward",
    ] {
        assert!(names(Trainer::Trl).contains(&n.to_owned()), "trl {n}");
    }
    assert_eq!(slime_status(Some("success")), "completed");
    assert_eq!(slime_status(Some("failure")), "completed");
    assert_eq!(slime_status(Some("timeout")), "truncated");
    assert_eq!(slime_status(Some("cancelled")), "aborted");
    assert_eq!(slime_status(None), "aborted");
    assert_eq!(slime_status(Some("failed")), "failed");
    let s = RlSample {
        sample_id: "r:0".into(),
        rollout_id: "r".into(),
        segment: 0,
        group: "g".into(),
        group_index: 0,
        index: 0,
        rollout_index: 0,
        num_turns: 2,
        prompt_ids: vec![1, 2],
        response_ids: vec![3],
        loss_mask: vec![1],
        logprobs: vec![-0.5],
        reward: None,
        status: None,
        model: None,
        sequences: vec![0],
        policy_versions: vec![Some(3)],
        token_policy_versions: vec![Some(3)],
        teacher_logprobs: None,
    };
    for t in [
        Trainer::Generic,
        Trainer::Verl,
        Trainer::Slime,
        Trainer::Trl,
    ] {
        let b = batch(t, std::slice::from_ref(&s)).expect("batch");
        assert_eq!(b.num_rows(), 1);
    }
    let b = batch(Trainer::Slime, &[s]).expect("batch");
    let tokens = b.column_by_name("tokens").expect("tokens");
    use arrow::array::AsArray;
    let t = tokens.as_list::<i32>().value(0);
    assert_eq!(
        t.as_primitive::<arrow::datatypes::Int32Type>()
            .values()
            .to_vec(),
        vec![1, 2, 3]
    );
}

#[test]
fn teacher_logprobs_follow_the_loss_mask() {
    let mut first = tok_call(0, vec![1, 2], vec![3, 4]);
    first.teacher_logprobs = Some(vec![-0.25, -0.5]);
    // observation 5; this call was not scored
    let second = tok_call(1, vec![1, 2, 3, 4, 5], vec![6]);
    let t = interleave(&[&first, &second]);
    assert_eq!(t.loss_mask, vec![1, 1, 0, 1]);
    let teacher = t.teacher_logprobs.expect("scored");
    assert_eq!(&teacher[..3], &[-0.25, -0.5, 0.0]);
    assert!(teacher[3].is_nan());
    assert_eq!(t.missing_teacher_logprobs, 1);
    // No call scored: no column value at all.
    let plain = tok_call(0, vec![1], vec![2]);
    let t = interleave(&[&plain]);
    assert_eq!(t.teacher_logprobs, None);
    assert_eq!(t.missing_teacher_logprobs, 0);
}
