//! Full-text search over the calls' messages for the rollouts list: the
//! rollouts any of whose calls' `messages` (the history sent) or
//! `response_message` (the answer) contain a text, case-insensitively.
//!
//! A search reads only those two columns and `rollout_id`, file by file and
//! a batch of rows at a time (the exports' projected reader), so its memory
//! is one batch and a flag per rollout, whatever the shards hold. The columns hold JSON, so the text
//! is matched against it as stored: a quote or a line break in a message is
//! escaped there (`\"`, `\n`). The last few searches' answers are kept in
//! the [`Index`] they ran on, so paging through one does not read the
//! shards again; a new index (new shards) starts with none.

use super::index::Index;
use crate::export::read::{col, open_projected, shard_err, str_ref};
use crate::export::ExportError;
use std::path::PathBuf;
use std::sync::Arc;

/// Searches whose answers an index keeps.
pub const CACHED: usize = 8;

/// The columns a search reads.
const COLUMNS: &[&str] = &["rollout_id", "messages", "response_message"];

/// A text to find, ignoring case.
#[derive(Debug, Clone)]
pub struct Needle {
    lower: String,
}

impl Needle {
    pub fn new(text: &str) -> Needle {
        Needle {
            lower: text.to_lowercase(),
        }
    }

    /// The text, lowercased: the key a search is cached under.
    pub fn key(&self) -> &str {
        &self.lower
    }

    /// Does `hay` contain the text, ignoring case? ASCII text is matched
    /// byte by byte (no copy of `hay`); other text against `hay` lowercased.
    pub fn found_in(&self, hay: &str) -> bool {
        let n = self.lower.as_bytes();
        if n.is_empty() {
            return true;
        }
        if !self.lower.is_ascii() {
            return hay.to_lowercase().contains(&self.lower);
        }
        let h = hay.as_bytes();
        let (lo, up) = (n[0], n[0].to_ascii_uppercase());
        let mut from = 0;
        while let Some(at) = memchr::memchr2(lo, up, &h[from..]) {
            let i = from + at;
            match h.get(i..i + n.len()) {
                Some(w) if w.eq_ignore_ascii_case(n) => return true,
                Some(_) => from = i + 1,
                None => return false,
            }
        }
        false
    }
}

/// Read `files` and mark, for each of `index`'s rollouts (in its order),
/// whether one of its calls contains `needle`.
fn scan(index: &Index, files: &[PathBuf], needle: &Needle) -> Result<Vec<bool>, ExportError> {
    let mut hit = vec![false; index.rollouts.len()];
    for path in files {
        for batch in open_projected(path, COLUMNS)? {
            let b = batch.map_err(|e| shard_err(path, e))?;
            let (ids, msgs, resp) = (
                col(&b, "rollout_id"),
                col(&b, "messages"),
                col(&b, "response_message"),
            );
            for i in 0..b.num_rows() {
                let Some(pos) = str_ref(ids, i).and_then(|id| index.position(id)) else {
                    continue;
                };
                if hit[pos] {
                    continue;
                }
                hit[pos] = [msgs, resp]
                    .into_iter()
                    .any(|c| str_ref(c, i).is_some_and(|t| needle.found_in(t)));
            }
        }
    }
    Ok(hit)
}

/// Which of `index`'s rollouts (by position) have a call whose messages or
/// response contain `text`: from the index's cache, else by reading its
/// `calls/` files.
pub fn matching(index: &Index, text: &str) -> Result<Arc<Vec<bool>>, ExportError> {
    let needle = Needle::new(text);
    let mut cache = index.searches.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(at) = cache.iter().position(|(k, _)| k == needle.key()) {
        // Most recently used last.
        if let Some(entry) = cache.remove(at) {
            let hit = entry.1.clone();
            cache.push_back(entry);
            return Ok(hit);
        }
    }
    drop(cache);
    let hit = Arc::new(scan(index, &index.files, &needle)?);
    let mut cache = index.searches.lock().unwrap_or_else(|p| p.into_inner());
    if !cache.iter().any(|(k, _)| k == needle.key()) {
        if cache.len() >= CACHED {
            cache.pop_front();
        }
        cache.push_back((needle.key().to_owned(), hit.clone()));
    }
    Ok(hit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ShardConfig;
    use crate::export::read::partition_tests::call_row;
    use crate::record::shard::write_now;

    #[test]
    fn a_needle_ignores_case_ascii_or_not() {
        let n = Needle::new("TypeError");
        assert!(n.found_in(r#"[{"role":"tool","content":"raised typeerror: x"}]"#));
        assert!(n.found_in("TYPEERROR"));
        assert!(!n.found_in("TypeErro"));
        assert!(!n.found_in("type error"));
        assert!(Needle::new("tt").found_in("aTtt"));
        let u = Needle::new("ÉCOLE");
        assert!(u.found_in("à l'école"));
        assert!(!u.found_in("ecole"));
        assert!(Needle::new("").found_in(""));
    }

    #[test]
    fn a_search_reads_messages_and_answers_and_is_cached_per_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = ShardConfig {
            dir: dir.path().to_path_buf(),
            ..ShardConfig::default()
        };
        let mut calls = vec![];
        for r in 0..6 {
            for s in 0..2 {
                let mut c = call_row(&format!("r{r}"), s);
                c.messages = Some(format!(
                    r#"[{{"role":"user","content":"fix bug {r} in Parser.py"}}]"#
                ));
                c.response_message = Some(match (r, s) {
                    (2, 1) => r#"{"role":"assistant","content":"Ran pytest: 3 PASSED"}"#.into(),
                    _ => r#"{"role":"assistant","content":"looking"}"#.into(),
                });
                calls.push(c);
            }
        }
        // A second file: the search reads every one.
        let mut late = call_row("r5", 2);
        late.response_message = Some(r#"{"content":"Zebra stripes"}"#.into());
        write_now(&cfg, calls).expect("calls");
        write_now(&cfg, vec![late]).expect("calls");
        let ix = Index::build(dir.path()).expect("index");
        assert_eq!(ix.files.len(), 2);
        let ids = |hit: &[bool]| -> Vec<String> {
            ix.rollouts
                .iter()
                .zip(hit)
                .filter(|(_, &h)| h)
                .map(|(s, _)| s.rollout_id.clone())
                .collect()
        };
        assert_eq!(ids(&matching(&ix, "pytest: 3 passed").unwrap()), ["r2"]);
        assert_eq!(ids(&matching(&ix, "zebra").unwrap()), ["r5"]);
        assert_eq!(ids(&matching(&ix, "bug 3 in parser").unwrap()), ["r3"]);
        assert_eq!(
            matching(&ix, "parser.py")
                .unwrap()
                .iter()
                .filter(|h| **h)
                .count(),
            6
        );
        assert!(ids(&matching(&ix, "nowhere").unwrap()).is_empty());
        // Cached, under the text lowercased: the same answer, not a rescan.
        let a = matching(&ix, "ZEBRA").unwrap();
        let b = matching(&ix, "zebra").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(ix.searches.lock().unwrap().len(), 5);
        for i in 0..CACHED + 3 {
            matching(&ix, &format!("text {i}")).unwrap();
        }
        assert_eq!(ix.searches.lock().unwrap().len(), CACHED);
    }
}
