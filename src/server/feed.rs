//! `GET /v1/rollouts/feed?after=CURSOR`: finished rollouts as they finish,
//! from the recorder's live feed (`shards.feed = true`; [`crate::record::feed`]).
//!
//! | parameter | default | |
//! |---|---|---|
//! | `after` | 0 | the cursor of the last entry the consumer has; entries after it come |
//! | `format` | `ndjson` | `ndjson` (one entry a line) or `arrow` (an Arrow IPC stream: one record batch per group of entries) |
//! | `follow` | `true` | keep the response open and send entries as rollouts finish; `false` ends it after the entries there are |
//! | `limit` | none | end the response after this many entries |
//!
//! An entry is `{"cursor", "rollout_id", "record_id", "status", "reward",
//! "group", "metadata", "finished_at", "policy_versions", "calls": [...]}`.
//! The Arrow stream has the columns `cursor`, `rollout_id`, `status`,
//! `reward`, `group`, `finished_at`, `policy_versions` and `entry` (the
//! whole entry as JSON text). A consumer that restarts asks again with the
//! cursor of the last entry it processed.

use super::State;
use crate::dialect::{ApiError, WireApi};
use crate::http::{Chunk, ProxyBody};
use crate::record::feed::Feed;
use arrow::array::{ArrayRef, Float64Array, Int64Builder, ListBuilder, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use http::{header, HeaderValue, Response};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Entries read from disk at a time.
const BATCH: usize = 64;

/// Chunks queued for a slow consumer before the reader waits.
const QUEUE: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Ndjson,
    Arrow,
}

#[derive(Debug)]
struct Query {
    after: u64,
    format: Format,
    follow: bool,
    limit: Option<u64>,
}

fn parse(query: Option<&str>) -> Result<Query, String> {
    let mut q = Query {
        after: 0,
        format: Format::Ndjson,
        follow: true,
        limit: None,
    };
    for kv in query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{k} must be a whole number, got {v:?}"))
        };
        match k {
            "after" => q.after = num(v)?,
            "limit" => q.limit = Some(num(v)?),
            "follow" => {
                q.follow = match v {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    _ => return Err(format!("follow must be true or false, got {v:?}")),
                }
            }
            "format" => {
                q.format = match v {
                    "ndjson" | "jsonl" => Format::Ndjson,
                    "arrow" => Format::Arrow,
                    _ => return Err(format!("format must be ndjson or arrow, got {v:?}")),
                }
            }
            _ => {
                return Err(format!(
                    "unknown parameter {k:?} (after, format, follow, limit)"
                ))
            }
        }
    }
    Ok(q)
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("cursor", DataType::UInt64, false),
        Field::new("rollout_id", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("reward", DataType::Float64, true),
        Field::new("group", DataType::Utf8, true),
        Field::new("finished_at", DataType::Int64, false),
        Field::new(
            "policy_versions",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            false,
        ),
        Field::new("entry", DataType::Utf8, false),
    ]))
}

/// One record batch of entries.
fn batch(entries: &[(u64, Bytes)]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let parsed: Vec<serde_json::Value> = entries
        .iter()
        .map(|(_, b)| serde_json::from_slice(b).unwrap_or_default())
        .collect();
    let text = |k: &str| -> Vec<Option<String>> {
        parsed
            .iter()
            .map(|v| v.get(k).and_then(|x| x.as_str()).map(str::to_owned))
            .collect()
    };
    let mut versions = ListBuilder::new(Int64Builder::new());
    for v in &parsed {
        for p in v
            .get("policy_versions")
            .and_then(|p| p.as_array())
            .into_iter()
            .flatten()
        {
            versions.values().append_option(p.as_i64());
        }
        versions.append(true);
    }
    let entry: Vec<String> = entries
        .iter()
        .map(|(_, b)| String::from_utf8_lossy(b).trim_end().to_owned())
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(entries.iter().map(|e| e.0))),
        Arc::new(StringArray::from(text("rollout_id"))),
        Arc::new(StringArray::from(text("status"))),
        Arc::new(Float64Array::from_iter(
            parsed
                .iter()
                .map(|v| v.get("reward").and_then(|r| r.as_f64())),
        )),
        Arc::new(StringArray::from(text("group"))),
        Arc::new(arrow::array::Int64Array::from_iter_values(
            parsed
                .iter()
                .map(|v| v.get("finished_at").and_then(|t| t.as_i64()).unwrap_or(0)),
        )),
        Arc::new(versions.finish()),
        Arc::new(StringArray::from(entry)),
    ];
    RecordBatch::try_new(schema(), columns)
}

/// Writes an Arrow IPC stream one batch at a time, handing out the bytes.
struct ArrowOut {
    writer: StreamWriter<Vec<u8>>,
}

impl ArrowOut {
    fn new() -> Result<ArrowOut, arrow::error::ArrowError> {
        Ok(ArrowOut {
            writer: StreamWriter::try_new(Vec::new(), &schema())?,
        })
    }

    /// What has been written so far, taken out.
    fn take(&mut self) -> Bytes {
        Bytes::from(std::mem::take(self.writer.get_mut()))
    }

    fn write(&mut self, entries: &[(u64, Bytes)]) -> Result<Bytes, arrow::error::ArrowError> {
        self.writer.write(&batch(entries)?)?;
        Ok(self.take())
    }

    fn finish(mut self) -> Bytes {
        let _ = self.writer.finish();
        self.take()
    }
}

/// Send entries after the cursor, then (following) each new one, until the
/// consumer goes, the limit is reached or the server stops.
async fn pump(state: Arc<State>, feed: Feed, q: Query, tx: mpsc::Sender<Chunk>) {
    let mut after = q.after;
    let mut sent = 0u64;
    let mut newest = feed.subscribe();
    let mut arrow = match q.format {
        Format::Arrow => match ArrowOut::new() {
            Ok(mut a) => {
                if tx.send(Ok(a.take())).await.is_err() {
                    return;
                }
                Some(a)
            }
            Err(e) => {
                let _ = tx.send(Err(std::io::Error::other(e))).await;
                return;
            }
        },
        Format::Ndjson => None,
    };
    loop {
        let room = q
            .limit
            .map_or(BATCH, |l| (l - sent).min(BATCH as u64) as usize);
        // File reads, off the runtime's threads.
        let reader = feed.clone();
        let read = tokio::task::spawn_blocking(move || reader.read(after, room)).await;
        let entries = match read.unwrap_or_else(|e| Err(std::io::Error::other(e))) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "could not read the feed");
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        if let Some(&(last, _)) = entries.last() {
            after = last;
            sent += entries.len() as u64;
            let chunk = match &mut arrow {
                Some(a) => a.write(&entries).map_err(std::io::Error::other),
                None => Ok(Bytes::from(
                    entries
                        .iter()
                        .flat_map(|(_, b)| b.iter().copied())
                        .collect::<Vec<u8>>(),
                )),
            };
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                return;
            }
            if q.limit.is_some_and(|l| sent >= l) {
                break;
            }
            continue;
        }
        if !q.follow {
            break;
        }
        tokio::select! {
            changed = newest.changed() => if changed.is_err() { break },
            () = tx.closed() => return,
            () = state.stopping.cancelled() => break,
        }
    }
    if let Some(a) = arrow {
        let _ = tx.send(Ok(a.finish())).await;
    }
}

/// `GET /v1/rollouts/feed`.
pub fn serve(state: &Arc<State>, query: Option<&str>) -> Response<ProxyBody> {
    let chat = WireApi::ChatCompletions;
    let Some(feed) = state.recorder.feed.clone() else {
        let err = ApiError::new(
            404,
            "invalid_request_error",
            "feed_disabled",
            "the live feed is off: set shards.feed = true in the config",
        );
        return super::call::error_response(chat, &err);
    };
    let q = match parse(query) {
        Ok(q) => q,
        Err(msg) => {
            let err = ApiError::new(400, "invalid_request_error", "invalid_feed_query", msg);
            return super::call::error_response(chat, &err);
        }
    };
    let content_type = match q.format {
        Format::Ndjson => "application/x-ndjson",
        Format::Arrow => "application/vnd.apache.arrow.stream",
    };
    let newest = feed.newest();
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(pump(state.clone(), feed, q, tx));
    let mut resp = Response::new(ProxyBody::Stream(rx));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(&newest.to_string()) {
        h.insert("x-rollcall-feed-newest", v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_or_say_why_not() {
        let q = parse(Some("after=12&format=arrow&follow=false&limit=3")).unwrap();
        assert_eq!((q.after, q.follow, q.limit), (12, false, Some(3)));
        assert!(q.format == Format::Arrow);
        assert!(parse(Some("after=-1"))
            .unwrap_err()
            .contains("whole number"));
        assert!(parse(Some("format=csv"))
            .unwrap_err()
            .contains("ndjson or arrow"));
        assert!(parse(Some("cursor=1"))
            .unwrap_err()
            .contains("unknown parameter"));
        let q = parse(None).unwrap();
        assert_eq!((q.after, q.follow, q.limit), (0, true, None));
    }

    #[test]
    fn entries_become_one_arrow_batch() {
        let e = |c: u64, j: &str| (c, Bytes::from(format!("{j}\n")));
        let entries = [
            e(
                1,
                r#"{"cursor":1,"rollout_id":"a","status":"completed","reward":1.0,"group":"g","finished_at":5,"policy_versions":[0,1],"calls":[]}"#,
            ),
            e(
                2,
                r#"{"cursor":2,"rollout_id":"b","status":"failed","reward":null,"group":null,"finished_at":6,"policy_versions":[null],"calls":[]}"#,
            ),
        ];
        let mut out = ArrowOut::new().unwrap();
        let mut bytes = out.take().to_vec();
        bytes.extend_from_slice(&out.write(&entries).unwrap());
        bytes.extend_from_slice(&out.finish());
        let reader =
            arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        assert_eq!(batches.len(), 1);
        let b = &batches[0];
        assert_eq!(b.num_rows(), 2);
        let ids = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((ids.value(0), ids.value(1)), ("a", "b"));
        let reward = b.column(3).as_any().downcast_ref::<Float64Array>().unwrap();
        assert!(arrow::array::Array::is_null(reward, 1) && reward.value(0) == 1.0);
    }
}
