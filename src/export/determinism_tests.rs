//! The same shards export (SFT and RL) to byte-identical files.

use super::*;
use crate::config::ShardConfig;
use crate::record::shard::write_now;
use crate::record::RolloutRow;
use serde_json::json;

#[test]
fn the_same_shards_export_to_identical_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ShardConfig {
        dir: dir.path().join("shards"),
        ..ShardConfig::default()
    };
    let mut rows = vec![];
    let mut fins = vec![];
    for r in 0..12 {
        let rid = format!("r{r}");
        let mut msgs = vec![json!({"role": "user", "content": format!("task {r}")})];
        let mut prompt = vec![1, r];
        for s in 0..3 {
            let ans = json!({"role": "assistant", "content": format!("step {s}")});
            let mut c = read::partition_tests::call_row(&rid, s);
            c.messages = Some(serde_json::Value::Array(msgs.clone()).to_string());
            c.response_message = Some(ans.to_string());
            c.prompt_token_ids = Some(prompt.clone());
            c.completion_token_ids = Some(vec![100 + s as i32]);
            prompt.extend([100 + s as i32, 7]);
            msgs.push(ans);
            msgs.push(json!({"role": "user", "content": "go on"}));
            rows.push(c);
        }
        fins.push(RolloutRow {
            record_id: format!("f{r}"),
            rollout_id: rid,
            status: "success".into(),
            reward: Some(f64::from(r % 2)),
            metadata: Some(json!({"group": format!("g{}", r % 3)}).to_string()),
            finished_at: 1,
            calls: 3,
        });
    }
    rows.reverse();
    write_now(&cfg, rows).expect("calls");
    write_now(&cfg, fins).expect("rollouts");
    let run = |name: &str| {
        let out = dir.path().join(name);
        let s = sft::export(&cfg.dir, &out, &sft::SftOptions::default()).expect("sft");
        assert_eq!((s.samples, s.mismatches), (12, 0));
        let r = rl::export(&cfg.dir, &out, &rl::RlOptions::default()).expect("rl");
        assert_eq!((r.samples, r.mismatches), (12, 0));
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&out)
            .expect("out")
            .map(|e| {
                let p = e.expect("entry").path();
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                (name.unwrap_or_default(), std::fs::read(&p).expect("read"))
            })
            .collect();
        files.sort();
        files
    };
    let (a, b) = (run("a"), run("b"));
    assert_eq!(a.len(), 6);
    for ((na, ba), (nb, bb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert!(ba == bb, "{na} differs between two exports");
    }
}
