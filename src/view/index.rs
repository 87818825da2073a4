//! The rollouts list behind `rollcall view`: one summary per rollout, built
//! in one pass over the shards' small columns (the calls' bodies and token
//! ids are never read), and queried on the server, a page at a time, with a
//! filter and a sort on any column. The one filter that reads the calls'
//! messages is the full-text search ([`super::search`]), cached per index.

use crate::export::read::{for_each_call_brief, read_rollouts, shard_files, RolloutInfo};
use crate::export::{group_of, ExportError};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One rollout, as the list shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub rollout_id: String,
    /// Finish metadata `harness`, else the first call's user agent.
    pub harness: Option<String>,
    /// The last call's model and route.
    pub model: Option<String>,
    pub route: Option<String>,
    /// The finish status; `None` while the rollout has not finished.
    pub status: Option<String>,
    pub reward: Option<f64>,
    /// The latest reward revision (0: as finished).
    pub revision: i64,
    pub calls: usize,
    pub failed_calls: usize,
    /// Prompt + completion tokens, as the calls' usage gives them.
    pub tokens: i64,
    /// The first call received, and the last call done (µs).
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub group: String,
    /// The oldest and newest policy version its calls ran under.
    pub policy_versions: Option<(i64, i64)>,
    /// The `calls/` files that hold its calls (indexes into
    /// [`Index::files`]): all a rollout's page reads.
    pub files: Vec<usize>,
}

impl Summary {
    /// Duration in seconds, first call to last answer.
    pub fn seconds(&self) -> Option<f64> {
        Some((self.ended_at? - self.started_at?) as f64 / 1e6)
    }
}

/// A column to sort by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Column {
    #[default]
    RolloutId,
    Harness,
    Model,
    Route,
    Status,
    Reward,
    Calls,
    Tokens,
    Duration,
    Group,
    PolicyVersion,
}

impl std::str::FromStr for Column {
    type Err = String;
    fn from_str(s: &str) -> Result<Column, String> {
        Ok(match s {
            "rollout_id" | "id" => Column::RolloutId,
            "harness" => Column::Harness,
            "model" => Column::Model,
            "route" => Column::Route,
            "status" => Column::Status,
            "reward" => Column::Reward,
            "calls" => Column::Calls,
            "tokens" => Column::Tokens,
            "duration" => Column::Duration,
            "group" => Column::Group,
            "policy_version" => Column::PolicyVersion,
            other => return Err(format!("no column {other:?} to sort by")),
        })
    }
}

/// What a page of the list asks for.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// The finish status (`unfinished` for none).
    pub status: Option<String>,
    pub min_reward: Option<f64>,
    pub max_reward: Option<f64>,
    /// Text that the rollout id, harness, model, route or group contains.
    pub text: Option<String>,
    /// Text that one of its calls' messages or answer contains, ignoring
    /// case (a full-text search: [`super::search`]).
    pub messages: Option<String>,
    /// One filter per column (`f.<column>` in the list's query).
    pub columns: Vec<(Column, ColumnFilter)>,
    pub sort: Column,
    pub descending: bool,
    pub offset: usize,
    pub limit: usize,
}

/// A filter on one column: text it contains (ignoring case), or a range of
/// numbers.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnFilter {
    Contains(String),
    /// Inclusive bounds; either may be open.
    Range(Option<f64>, Option<f64>),
}

impl ColumnFilter {
    /// Parse a filter for `column`: text for a text column; for a number
    /// column `N` (exactly), `LO..HI`, `LO..` or `..HI`.
    pub fn parse(column: Column, s: &str) -> Result<ColumnFilter, String> {
        let s = s.trim();
        if !column.is_numeric() {
            return Ok(ColumnFilter::Contains(s.to_lowercase()));
        }
        let num = |x: &str| -> Result<Option<f64>, String> {
            let x = x.trim();
            if x.is_empty() {
                return Ok(None);
            }
            x.parse::<f64>()
                .ok()
                .filter(|v| !v.is_nan())
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "{x:?} is not a number (a filter on {column:?} is N, LO..HI, LO.. or ..HI)"
                    )
                })
        };
        match s.split_once("..") {
            Some((lo, hi)) => Ok(ColumnFilter::Range(num(lo)?, num(hi)?)),
            None => {
                let v = num(s)?;
                Ok(ColumnFilter::Range(v, v))
            }
        }
    }

    /// Does rollout `s` pass it on `column`?
    pub fn keeps(&self, column: Column, s: &Summary) -> bool {
        match self {
            ColumnFilter::Contains(t) => column
                .text(s)
                .is_some_and(|v| v.to_lowercase().contains(t.as_str())),
            ColumnFilter::Range(lo, hi) => column
                .number(s)
                .is_some_and(|v| lo.is_none_or(|lo| v >= lo) && hi.is_none_or(|hi| v <= hi)),
        }
    }
}

impl Column {
    /// Whether the column holds numbers (filtered by a range).
    pub fn is_numeric(self) -> bool {
        matches!(
            self,
            Column::Reward
                | Column::Calls
                | Column::Tokens
                | Column::Duration
                | Column::PolicyVersion
        )
    }

    /// A text column's value.
    pub fn text(self, s: &Summary) -> Option<&str> {
        match self {
            Column::RolloutId => Some(&s.rollout_id),
            Column::Harness => s.harness.as_deref(),
            Column::Model => s.model.as_deref(),
            Column::Route => s.route.as_deref(),
            Column::Status => Some(s.status.as_deref().unwrap_or("unfinished")),
            Column::Group => Some(&s.group),
            _ => None,
        }
    }

    /// A number column's value (a policy range by its newest version).
    pub fn number(self, s: &Summary) -> Option<f64> {
        match self {
            Column::Reward => s.reward,
            Column::Calls => Some(s.calls as f64),
            Column::Tokens => Some(s.tokens as f64),
            Column::Duration => s.seconds(),
            Column::PolicyVersion => s.policy_versions.map(|(_, hi)| hi as f64),
            _ => None,
        }
    }
}

/// One page of the list, and how many rollouts passed the filter.
#[derive(Debug)]
pub struct Page<'a> {
    pub total: usize,
    pub rows: Vec<&'a Summary>,
    /// Every rollout that passed the filter, sorted: what the plots draw.
    pub matched: Vec<&'a Summary>,
}

/// A search's answer: for each rollout of the index, in its order, whether
/// it matched.
pub type Hits = Arc<Vec<bool>>;

/// Every rollout of a shards directory.
#[derive(Debug, Default)]
pub struct Index {
    /// Sorted by rollout id.
    pub rollouts: Vec<Summary>,
    /// The `calls/` files, as they were listed when the index was built.
    pub files: Vec<PathBuf>,
    /// The `calls/` and `rollouts/` files listed before the index read
    /// them ([`sources`]): when the directory lists others, the index is
    /// out of date.
    pub sources: Vec<PathBuf>,
    /// The last few full-text searches: lowercased text and answer, the
    /// most recently used last ([`super::search::matching`]).
    pub(super) searches: Mutex<VecDeque<(String, Hits)>>,
}

/// The shard files an index reads: `calls/` then `rollouts/`, each sorted.
/// Published shards are only ever added, so another listing means new rows.
pub fn sources(shards: &Path) -> Result<Vec<PathBuf>, ExportError> {
    with_rollouts(shard_files(shards, "calls")?, shards)
}

/// `calls` (the `calls/` files), then the `rollouts/` files.
fn with_rollouts(mut calls: Vec<PathBuf>, shards: &Path) -> Result<Vec<PathBuf>, ExportError> {
    calls.extend(shard_files(shards, "rollouts")?);
    Ok(calls)
}

fn harness_of(info: Option<&RolloutInfo>) -> Option<String> {
    info.and_then(|i| i.meta_str("harness"))
}

impl Index {
    /// Read the shards: the finish rows, then the calls' small columns.
    pub fn build(shards: &Path) -> Result<Index, ExportError> {
        // The `calls/` files are listed once: a rollout's `files` index
        // this list, and the live check compares the next listing with it.
        let files = shard_files(shards, "calls")?;
        let sources = with_rollouts(files.clone(), shards)?;
        let finishes = read_rollouts(shards)?;
        let mut by_id: HashMap<String, Summary> = HashMap::new();
        for_each_call_brief(&files, |c| {
            let s = by_id
                .entry(c.rollout_id.clone())
                .or_insert_with(|| Summary {
                    rollout_id: c.rollout_id.clone(),
                    ..Summary::default()
                });
            s.calls += 1;
            if s.files.last() != Some(&c.file) && !s.files.contains(&c.file) {
                s.files.push(c.file);
            }
            if c.status != "ok" {
                s.failed_calls += 1;
            }
            s.tokens += c.prompt_tokens.unwrap_or(0) + c.completion_tokens.unwrap_or(0);
            if s.started_at.is_none_or(|t| c.received_at < t) {
                s.started_at = Some(c.received_at);
                if s.harness.is_none() {
                    s.harness.clone_from(&c.user_agent);
                }
            }
            let end = c.done_at.unwrap_or(c.received_at);
            if s.ended_at.is_none_or(|t| end >= t) {
                s.ended_at = Some(end);
                if !c.side_call {
                    (s.model, s.route) = (c.model.clone(), c.route.clone());
                }
            }
            if let Some(v) = c.policy_version {
                s.policy_versions = Some(
                    s.policy_versions
                        .map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))),
                );
            }
            Ok(())
        })?;
        for id in finishes.keys() {
            by_id.entry(id.clone()).or_insert_with(|| Summary {
                rollout_id: id.clone(),
                ..Summary::default()
            });
        }
        let mut rollouts: Vec<Summary> = by_id
            .into_values()
            .map(|mut s| {
                let info = finishes.get(&s.rollout_id);
                if let Some(h) = harness_of(info) {
                    s.harness = Some(h);
                }
                s.status = info.map(|i| i.status.clone());
                s.reward = info.and_then(|i| i.reward);
                s.revision = info.map_or(0, |i| i.revision);
                s.group = group_of(&s.rollout_id, info, None);
                s
            })
            .collect();
        rollouts.sort_by(|a, b| a.rollout_id.cmp(&b.rollout_id));
        Ok(Index {
            rollouts,
            files,
            sources,
            searches: Mutex::default(),
        })
    }

    /// Where the rollout with this id is in [`Index::rollouts`].
    pub fn position(&self, rollout_id: &str) -> Option<usize> {
        self.rollouts
            .binary_search_by(|s| s.rollout_id.as_str().cmp(rollout_id))
            .ok()
    }

    /// The `calls/` files that hold a rollout's calls.
    pub fn files_of(&self, s: &Summary) -> Vec<&std::path::PathBuf> {
        s.files.iter().filter_map(|&i| self.files.get(i)).collect()
    }

    /// The rollout with this id.
    pub fn get(&self, rollout_id: &str) -> Option<&Summary> {
        self.position(rollout_id).and_then(|i| self.rollouts.get(i))
    }

    /// The page `q` asks for. Errors only when a full-text search could not
    /// read the shards.
    pub fn query(&self, q: &Query) -> Result<Page<'_>, ExportError> {
        let hits = match q.messages.as_deref() {
            Some(t) if !t.is_empty() => Some(super::search::matching(self, t)?),
            _ => None,
        };
        let text = q.text.as_deref().map(str::to_lowercase);
        let has = |v: &Option<String>, t: &str| {
            v.as_deref().is_some_and(|v| v.to_lowercase().contains(t))
        };
        let mut rows: Vec<&Summary> = self
            .rollouts
            .iter()
            .enumerate()
            .filter(|(i, _)| hits.as_ref().is_none_or(|h| h.get(*i) == Some(&true)))
            .map(|(_, s)| s)
            .filter(|s| match q.status.as_deref() {
                None | Some("") => true,
                Some("unfinished") => s.status.is_none(),
                Some(st) => s.status.as_deref() == Some(st),
            })
            .filter(|s| {
                q.min_reward
                    .is_none_or(|m| s.reward.is_some_and(|r| r >= m))
            })
            .filter(|s| {
                q.max_reward
                    .is_none_or(|m| s.reward.is_some_and(|r| r <= m))
            })
            .filter(|s| q.columns.iter().all(|(c, f)| f.keeps(*c, s)))
            .filter(|s| match &text {
                None => true,
                Some(t) => {
                    s.rollout_id.to_lowercase().contains(t.as_str())
                        || s.group.to_lowercase().contains(t.as_str())
                        || has(&s.harness, t)
                        || has(&s.model, t)
                        || has(&s.route, t)
                }
            })
            .collect();
        let f = |x: Option<f64>| x.unwrap_or(f64::NEG_INFINITY);
        rows.sort_by(|a, b| {
            let o = match q.sort {
                Column::RolloutId => std::cmp::Ordering::Equal,
                Column::Harness => a.harness.cmp(&b.harness),
                Column::Model => a.model.cmp(&b.model),
                Column::Route => a.route.cmp(&b.route),
                Column::Status => a.status.cmp(&b.status),
                Column::Reward => f(a.reward).total_cmp(&f(b.reward)),
                Column::Calls => a.calls.cmp(&b.calls),
                Column::Tokens => a.tokens.cmp(&b.tokens),
                Column::Duration => f(a.seconds()).total_cmp(&f(b.seconds())),
                Column::Group => a.group.cmp(&b.group),
                Column::PolicyVersion => a.policy_versions.cmp(&b.policy_versions),
            };
            let o = o.then_with(|| a.rollout_id.cmp(&b.rollout_id));
            if q.descending {
                o.reverse()
            } else {
                o
            }
        });
        let total = rows.len();
        let page = rows
            .iter()
            .skip(q.offset)
            .take(q.limit.max(1))
            .copied()
            .collect();
        Ok(Page {
            total,
            rows: page,
            matched: rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ShardConfig;
    use crate::export::read::partition_tests::call_row;
    use crate::record::shard::write_now;
    use crate::record::RolloutFinish;

    #[test]
    fn every_column_filters_by_text_or_by_a_range() {
        let s = |id: &str, harness: &str, calls: usize, reward: Option<f64>| Summary {
            rollout_id: id.into(),
            harness: Some(harness.into()),
            calls,
            reward,
            tokens: calls as i64 * 100,
            policy_versions: Some((0, calls as i64)),
            group: format!("g-{}", calls % 2),
            ..Summary::default()
        };
        let ix = Index {
            rollouts: vec![
                s("a", "codex", 1, Some(1.0)),
                s("b", "Codex", 4, None),
                s("c", "mini-swe-agent", 7, Some(0.0)),
            ],
            ..Index::default()
        };
        let ids = |columns: Vec<(Column, &str)>| -> Vec<String> {
            let q = Query {
                columns: columns
                    .into_iter()
                    .map(|(c, v)| (c, ColumnFilter::parse(c, v).expect("filter")))
                    .collect(),
                limit: 10,
                ..Query::default()
            };
            let page = ix.query(&q).expect("query");
            page.rows.iter().map(|r| r.rollout_id.clone()).collect()
        };
        assert_eq!(ids(vec![(Column::Harness, "CODEX")]), ["a", "b"]);
        assert_eq!(ids(vec![(Column::Calls, "2..")]), ["b", "c"]);
        assert_eq!(
            ids(vec![(Column::Calls, "..4"), (Column::Harness, "co")]),
            ["a", "b"]
        );
        assert_eq!(ids(vec![(Column::Calls, "4")]), ["b"]);
        assert_eq!(ids(vec![(Column::Tokens, "150..750")]), ["b", "c"]);
        assert_eq!(ids(vec![(Column::PolicyVersion, "5..")]), ["c"]);
        // No reward: outside every reward range.
        assert_eq!(ids(vec![(Column::Reward, "..2")]), ["a", "c"]);
        assert_eq!(ids(vec![(Column::Group, "g-1")]), ["a", "c"]);
        assert_eq!(ids(vec![(Column::Status, "unfinished")]), ["a", "b", "c"]);
        let bad = ColumnFilter::parse(Column::Calls, "lots").unwrap_err();
        assert!(bad.contains("is not a number"), "{bad}");
        assert!(ColumnFilter::parse(Column::Reward, "NaN..").is_err());
    }

    #[test]
    fn the_list_is_built_from_small_columns_and_paged_on_the_server() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = ShardConfig {
            dir: dir.path().to_path_buf(),
            ..ShardConfig::default()
        };
        let mut calls = vec![];
        for r in 0..30 {
            for s in 0..(r % 3 + 1) {
                let mut c = call_row(&format!("r{r:02}"), s);
                c.prompt_tokens = Some(10);
                c.completion_tokens = Some(5);
                c.user_agent = Some("codex_exec/0.1".into());
                if r == 4 && s == 1 {
                    c.status = "failed".into();
                }
                if (r == 4 || r == 5) && s == 0 {
                    c.response_message = Some(r#"{"content": "found the Needle"}"#.into());
                }
                calls.push(c);
            }
        }
        write_now(&cfg, calls).expect("calls");
        let fin = |r: usize| RolloutFinish {
            record_id: format!("f{r}"),
            rollout_id: format!("r{r:02}"),
            status: if r.is_multiple_of(2) {
                "completed"
            } else {
                "timeout"
            }
            .into(),
            reward: Some(r as f64 / 10.0),
            metadata: Some(format!(
                r#"{{"group": "g{}", "harness": "mini-swe-agent"}}"#,
                r % 5
            )),
            finished_at: 1_000 + r as i64,
            calls: 1,
        };
        let mut fins: Vec<RolloutFinish> = (0..20).map(fin).collect();
        // Finished without a call.
        fins.push(RolloutFinish {
            rollout_id: "lonely".into(),
            ..fin(99)
        });
        write_now(&cfg, fins).expect("rollouts");
        let ix = Index::build(dir.path()).expect("index");
        let q = |x: &Query| ix.query(x).expect("query");
        assert_eq!(ix.rollouts.len(), 31);
        let r4 = ix.rollouts.iter().find(|s| s.rollout_id == "r04").unwrap();
        assert_eq!((r4.calls, r4.failed_calls, r4.tokens), (2, 1, 30));
        assert_eq!(r4.harness.as_deref(), Some("mini-swe-agent"));
        assert_eq!(
            (r4.group.as_str(), r4.status.as_deref()),
            ("g4", Some("completed"))
        );
        let r25 = ix.rollouts.iter().find(|s| s.rollout_id == "r25").unwrap();
        assert_eq!(r25.status, None);
        assert_eq!(r25.harness.as_deref(), Some("codex_exec/0.1"));

        let page = q(&Query {
            status: Some("completed".into()),
            min_reward: Some(0.5),
            sort: Column::Reward,
            descending: true,
            limit: 3,
            ..Query::default()
        });
        assert_eq!(page.total, 7); // r06 … r18 ("lonely", 9.9, timed out)
        let ids: Vec<&str> = page.rows.iter().map(|s| s.rollout_id.as_str()).collect();
        assert_eq!(ids, ["r18", "r16", "r14"]);
        let next = q(&Query {
            status: Some("completed".into()),
            min_reward: Some(0.5),
            sort: Column::Reward,
            descending: true,
            offset: 3,
            limit: 3,
            ..Query::default()
        });
        let ids: Vec<&str> = next.rows.iter().map(|s| s.rollout_id.as_str()).collect();
        assert_eq!(ids, ["r12", "r10", "r08"]);
        let unfinished = q(&Query {
            status: Some("unfinished".into()),
            limit: 100,
            ..Query::default()
        });
        assert_eq!(unfinished.total, 10);
        let text = q(&Query {
            text: Some("G3".into()),
            limit: 100,
            ..Query::default()
        });
        assert_eq!(text.total, 4); // r03, r08, r13, r18
        let searched = q(&Query {
            messages: Some("needle".into()),
            status: Some("completed".into()),
            limit: 100,
            ..Query::default()
        });
        let ids: Vec<&str> = searched
            .rows
            .iter()
            .map(|s| s.rollout_id.as_str())
            .collect();
        assert_eq!(ids, ["r04"]); // r05 timed out
        assert_eq!(searched.matched.len(), 1);
        let all = q(&Query {
            limit: 10,
            ..Query::default()
        });
        assert_eq!((all.rows.len(), all.matched.len()), (10, 31));
        assert!("nope".parse::<Column>().is_err());
    }
}
