//! Reward revisions: a rollout re-scored gets a new finish row with the
//! next revision number and its provenance, never an overwrite. Readers
//! take the latest unless told otherwise (`export::read::Revision`,
//! `--reward-revision`).

use super::RecipeError;
use crate::config::ShardConfig;
use crate::export::read::RolloutInfo;
use crate::record::shard::write_now;
use crate::record::RolloutFinish;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// A new revision of `info` (the rollout's current finish row) with
/// `reward`. Its metadata is the current one with `revision` set to
/// `{number, of, previous_reward, at, …provenance}`: the revision it
/// replaces is kept in its own row, named by `of`.
pub fn revise(
    rollout_id: &str,
    info: &RolloutInfo,
    reward: f64,
    provenance: Value,
) -> RolloutFinish {
    let mut meta = match info
        .metadata
        .as_deref()
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
    {
        Some(Value::Object(m)) => m,
        Some(other) => Map::from_iter([("finish".to_owned(), other)]),
        None => Map::new(),
    };
    let now = crate::now_micros().max(info.finished_at + 1);
    let mut revision = json!({
        "number": info.revision + 1,
        "of": info.record_id,
        "previous_reward": info.reward,
        "at": now,
    });
    if let (Some(r), Value::Object(p)) = (revision.as_object_mut(), provenance) {
        r.extend(p);
    }
    meta.insert("revision".into(), revision);
    RolloutFinish {
        record_id: uuid::Uuid::now_v7().to_string(),
        rollout_id: rollout_id.to_owned(),
        status: info.status.clone(),
        reward: Some(reward),
        metadata: Some(Value::Object(meta).to_string()),
        finished_at: now,
        calls: info.calls,
    }
}

/// Publish revisions as one `rollouts/` shard.
pub fn write(shards: &Path, rows: Vec<RolloutFinish>) -> Result<Option<PathBuf>, RecipeError> {
    let cfg = ShardConfig {
        dir: shards.to_path_buf(),
        ..ShardConfig::default()
    };
    write_now(&cfg, rows).map_err(|e| RecipeError::Write {
        path: shards.join("rollouts").display().to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::read::{read_rollouts, read_rollouts_at, Revision};

    #[test]
    fn revisions_add_rows_and_readers_pick_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let finish = RolloutFinish {
            record_id: "orig".into(),
            rollout_id: "r1".into(),
            status: "completed".into(),
            reward: Some(1.0),
            metadata: Some(r#"{"task": "t1"}"#.into()),
            finished_at: 1_000,
            calls: 3,
        };
        write(dir.path(), vec![finish]).expect("write");
        let now = read_rollouts(dir.path()).expect("read")["r1"].clone();
        let one = revise(
            "r1",
            &now,
            3.5,
            json!({"source": "reward", "mode": "pass_rate"}),
        );
        write(dir.path(), vec![one]).expect("write");
        let now = read_rollouts(dir.path()).expect("read")["r1"].clone();
        assert_eq!((now.revision, now.reward, now.calls), (1, Some(3.5), 3));
        let meta: Value = serde_json::from_str(now.metadata.as_deref().unwrap()).unwrap();
        assert_eq!(meta["task"], "t1");
        assert_eq!(meta["revision"]["of"], "orig");
        assert_eq!(meta["revision"]["previous_reward"], 1.0);
        assert_eq!(meta["revision"]["mode"], "pass_rate");
        let two = revise("r1", &now, -1.0, json!({"source": "judge"}));
        write(dir.path(), vec![two]).expect("write");
        let pick = |r| read_rollouts_at(dir.path(), r).expect("read")["r1"].reward;
        assert_eq!(pick(Revision::Latest), Some(-1.0));
        assert_eq!(pick(Revision::AtMost(0)), Some(1.0));
        assert_eq!(pick(Revision::AtMost(1)), Some(3.5));
        assert_eq!(pick(Revision::AtMost(7)), Some(-1.0));
        assert_eq!(
            crate::export::read::shard_files(dir.path(), "rollouts")
                .unwrap()
                .len(),
            3
        );
        assert_eq!("original".parse::<Revision>(), Ok(Revision::AtMost(0)));
        assert!("-1".parse::<Revision>().is_err());
    }
}
