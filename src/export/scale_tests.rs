//! RL exports end to end: `--missing-reward`, and 100,000 calls in whole
//! contiguous groups of the size `--group-size` asks.

use super::*;
use crate::config::ShardConfig;
use crate::record::shard::write_now;
use crate::record::RolloutRow;
use arrow::array::{Array, AsArray};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::json;
use std::collections::BTreeSet;

/// (group, rollout_id) of every row of `rl.parquet`, in file order.
fn rows_of(path: &Path) -> Vec<(String, String)> {
    let f = std::fs::File::open(path).expect("rl.parquet");
    let r = ParquetRecordBatchReaderBuilder::try_new(f)
        .expect("reader")
        .build()
        .expect("build");
    let mut out = vec![];
    for b in r {
        let b = b.expect("batch");
        let col = |n: &str| b.column_by_name(n).expect(n).as_string::<i32>().clone();
        let (g, rid) = (col("group"), col("rollout_id"));
        for i in 0..b.num_rows() {
            assert!(!g.is_null(i) && !rid.is_null(i));
            out.push((g.value(i).to_owned(), rid.value(i).to_owned()));
        }
    }
    out
}

#[test]
fn missing_rewards_are_dropped_zeroed_or_stop_the_export() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ShardConfig {
        dir: dir.path().join("shards"),
        ..ShardConfig::default()
    };
    // r0 finished with a reward, r1 finished without one, r2 never.
    let calls: Vec<_> = (0..3)
        .map(|r| read::partition_tests::call_row(&format!("r{r}"), 0))
        .collect();
    write_now(&cfg, calls).expect("calls");
    let fin = |rid: &str, reward| RolloutRow {
        record_id: format!("f-{rid}"),
        rollout_id: rid.into(),
        status: "success".into(),
        reward,
        metadata: None,
        finished_at: 1,
        calls: 1,
    };
    write_now(&cfg, vec![fin("r0", Some(1.0)), fin("r1", None)]).expect("rollouts");
    let export = |m: rl::MissingReward| {
        let opts = rl::RlOptions {
            missing_reward: m,
            ..Default::default()
        };
        rl::export(&cfg.dir, &dir.path().join("out"), &opts)
    };
    let r = export(rl::MissingReward::Drop).expect("drop");
    assert_eq!((r.samples, r.missing_reward), (1, 2));
    let rows = rows_of(&dir.path().join("out").join("rl.parquet"));
    assert_eq!(rows, vec![("r0".to_owned(), "r0".to_owned())]);
    let r = export(rl::MissingReward::Zero).expect("zero");
    assert_eq!((r.samples, r.missing_reward), (3, 2));
    match export(rl::MissingReward::Error) {
        Err(e @ ExportError::MissingReward { .. }) => {
            assert!(e.to_string().contains("\"r1\" has no reward"), "{e}");
        }
        other => panic!("expected a missing reward error, got {other:?}"),
    }
}

#[test]
fn a_100k_call_export_has_whole_contiguous_groups_of_the_size_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ShardConfig {
        dir: dir.path().join("shards"),
        ..ShardConfig::default()
    };
    let n = 4; // --group-size
    let sizes = [2usize, 3, 4, 5, 6, 9];
    let mut rows = Vec::with_capacity(100_000);
    let mut fins = vec![];
    // Per group, its finished rollouts (sorted: ids increase).
    let mut finished: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let (mut r, mut g, mut unfinished) = (0usize, 0usize, 0usize);
    while rows.len() < 100_000 {
        let group = format!("g{:05}", (g * 7919) % 100_000);
        for _ in 0..sizes[g % sizes.len()] {
            // Ids not in group order: groups interleave by id.
            let rid = format!("r{:06}", (r * 104_729) % 1_000_000);
            let mut prompt = vec![1, r as i32];
            for s in 0..4 {
                let mut c = read::partition_tests::call_row(&rid, s);
                c.messages = None;
                c.prompt_token_ids = Some(prompt.clone());
                c.completion_token_ids = Some(vec![100 + s as i32]);
                prompt.extend([100 + s as i32, 7]);
                rows.push(c);
            }
            if r % 23 == 22 {
                unfinished += 1; // no finish row: no reward, dropped
            } else {
                fins.push(RolloutRow {
                    record_id: format!("f{r}"),
                    rollout_id: rid.clone(),
                    status: "success".into(),
                    reward: Some(f64::from(r as u32 % 2)),
                    metadata: Some(json!({"group": group}).to_string()),
                    finished_at: 1,
                    calls: 4,
                });
                finished.entry(group.clone()).or_default().push(rid);
            }
            r += 1;
        }
        g += 1;
    }
    for v in finished.values_mut() {
        v.sort();
    }
    rows.reverse();
    let half = rows.split_off(rows.len() / 2);
    write_now(&cfg, rows).expect("calls");
    write_now(&cfg, half).expect("calls");
    write_now(&cfg, fins).expect("rollouts");
    let opts = rl::RlOptions {
        group_size: Some(n),
        ..Default::default()
    };
    let want_complete = finished.values().filter(|v| v.len() >= n).count();
    let want_incomplete = finished.len() - want_complete;
    let want_dropped: usize = finished
        .values()
        .map(|v| if v.len() >= n { v.len() - n } else { v.len() })
        .sum();
    let mut outputs = vec![];
    for run in ["a", "b"] {
        let out = dir.path().join(run);
        let rep = rl::export(&cfg.dir, &out, &opts).expect("rl");
        assert_eq!(rep.calls, 100_000);
        assert_eq!(rep.missing_reward, unfinished);
        assert_eq!(rep.incomplete_groups, want_incomplete);
        assert_eq!(rep.dropped_by_group_size, want_dropped);
        assert_eq!(rep.samples, want_complete * n);
        assert!(want_incomplete > 0 && want_dropped > want_incomplete);
        let got = rows_of(&out.join("rl.parquet"));
        assert_eq!(got.len(), rep.samples);
        // Every group's rows are contiguous, exactly n of them: the
        // first n of its rollouts in id order.
        let mut seen = BTreeSet::new();
        for chunk in got.chunks(n) {
            let g = &chunk[0].0;
            assert!(chunk.iter().all(|(x, _)| x == g), "group {g} is split");
            assert!(seen.insert(g.clone()), "group {g} appears twice");
            let ids: Vec<&String> = chunk.iter().map(|(_, id)| id).collect();
            let want: Vec<&String> = finished[g].iter().take(n).collect();
            assert_eq!(ids, want, "group {g}");
        }
        assert_eq!(seen.len(), want_complete);
        let mut files = vec![];
        for name in ["rl.parquet", "rl_mismatches.jsonl"] {
            files.push(std::fs::read(out.join(name)).expect("read"));
        }
        outputs.push(files);
    }
    assert!(outputs[0] == outputs[1], "two exports differ");
}
