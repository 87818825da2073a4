use super::*;
use crate::record::test_call;

fn row(rollout: &str, id: &str, seq: i64) -> CallRow {
    CallRow::build_guarded(&test_call(rollout, id, seq)).0
}

fn fin(rollout: &str, record: &str) -> RolloutFinish {
    RolloutFinish {
        record_id: record.into(),
        rollout_id: rollout.into(),
        status: "completed".into(),
        reward: Some(1.0),
        metadata: Some(r#"{"group":"g"}"#.into()),
        finished_at: 3,
        calls: 2,
    }
}

fn entries(feed: &Feed) -> Vec<serde_json::Value> {
    feed.read(0, 1000)
        .unwrap()
        .into_iter()
        .map(|(c, b)| {
            let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
            assert_eq!(v["cursor"], c);
            v
        })
        .collect()
}

fn ids(feed: &Feed) -> Vec<String> {
    entries(feed)
        .iter()
        .map(|e| e["rollout_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_finish_delivers_its_rollouts_calls_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, feed) = FeedWriter::open(dir.path(), false).unwrap();
    w.call(&row("a", "a1", 1)).unwrap();
    w.call(&row("b", "b0", 0)).unwrap();
    w.call(&row("a", "a0", 0)).unwrap();
    assert_eq!(feed.newest(), 0);
    w.finish(&fin("a", "fa")).unwrap();
    assert_eq!(feed.newest(), 1);
    let e = &entries(&feed)[0];
    assert_eq!(e["rollout_id"], "a");
    assert_eq!(e["group"], "g");
    assert_eq!(e["reward"], 1.0);
    assert_eq!(e["policy_versions"], serde_json::json!([0, 1]));
    let seqs: Vec<i64> = e["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [0, 1]);
    assert_eq!(e["calls"][0]["messages"][0]["content"], "turn 0");
    assert_eq!(e["calls"][0]["response_message"]["content"], "ok");
    assert!(feed.read(1, 10).unwrap().is_empty());
}

#[test]
fn replayed_rows_are_kept_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, feed) = FeedWriter::open(dir.path(), false).unwrap();
    w.call(&row("a", "a0", 0)).unwrap();
    w.call(&row("a", "a0", 0)).unwrap();
    w.finish(&fin("a", "fa")).unwrap();
    w.call(&row("b", "b0", 0)).unwrap();
    drop(w);
    // A crash before the shards were published: replay feeds it all again.
    let (mut w, feed2) = FeedWriter::open(dir.path(), false).unwrap();
    assert_eq!(feed2.newest(), 1);
    w.replaying(true);
    w.call(&row("a", "a0", 0)).unwrap();
    w.call(&row("b", "b0", 0)).unwrap();
    w.finish(&fin("a", "fa")).unwrap();
    w.replaying(false);
    w.call(&row("b", "b1", 1)).unwrap();
    w.finish(&fin("b", "fb")).unwrap();
    assert_eq!(ids(&feed2), ["a", "b"]);
    let e = &entries(&feed2);
    assert_eq!(e[0]["calls"].as_array().unwrap().len(), 1);
    assert_eq!(e[1]["calls"].as_array().unwrap().len(), 2);
    assert_eq!(feed.newest(), 1, "an old reader is of the old writer");
}

#[test]
fn torn_writes_are_cut_and_unindexed_entries_indexed_again() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, _) = FeedWriter::open(dir.path(), false).unwrap();
    for r in ["a", "b"] {
        w.call(&row(r, &format!("{r}0"), 0)).unwrap();
        w.finish(&fin(r, &format!("f{r}"))).unwrap();
    }
    w.call(&row("c", "c0", 0)).unwrap();
    drop(w);
    // The last index record was lost, and a torn entry and journal line follow.
    let idx = dir.path().join("entries.idx");
    let len = std::fs::metadata(&idx).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&idx)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let mut e = OpenOptions::new()
        .append(true)
        .open(dir.path().join("entries.jsonl"))
        .unwrap();
    e.write_all(br#"{"cursor":3,"rollout_id":"#).unwrap();
    let seg = journal::segment_path(&dir.path().join("journal"), 1);
    let mut j = OpenOptions::new().append(true).open(&seg).unwrap();
    j.write_all(br#"{"r":"c","c":"c1","s":1}	{"call_id"#)
        .unwrap();
    let (mut w, feed) = FeedWriter::open(dir.path(), false).unwrap();
    assert_eq!(ids(&feed), ["a", "b"]);
    w.finish(&fin("c", "fc")).unwrap();
    assert_eq!(ids(&feed), ["a", "b", "c"]);
    assert_eq!(entries(&feed)[2]["calls"].as_array().unwrap().len(), 1);
}

#[test]
fn the_journal_rotates_copies_live_lines_forward_and_collects() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, feed) = FeedWriter::open(dir.path(), false).unwrap();
    w.segment_bytes = 1500;
    // "long" stays open throughout; short rollouts come and go.
    w.call(&row("long", "l0", 0)).unwrap();
    for i in 0..40 {
        let r = format!("s{i}");
        w.call(&row(&r, &format!("{r}.0"), 0)).unwrap();
        w.call(&row(&r, &format!("{r}.1"), 1)).unwrap();
        w.finish(&fin(&r, &format!("f{r}"))).unwrap();
    }
    let segments = || {
        std::fs::read_dir(dir.path().join("journal"))
            .unwrap()
            .count()
    };
    assert!(segments() <= 3, "{} journal segments", segments());
    drop(w);
    let (mut w, feed2) = FeedWriter::open(dir.path(), false).unwrap();
    w.call(&row("long", "l1", 1)).unwrap();
    w.finish(&fin("long", "flong")).unwrap();
    let e = entries(&feed2);
    assert_eq!(e.len(), 41);
    assert_eq!(e[40]["rollout_id"], "long");
    assert_eq!(
        e[40]["calls"].as_array().unwrap().len(),
        2,
        "its first call survived the rotations"
    );
    assert_eq!(feed.newest(), 40);
}
