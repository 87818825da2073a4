//! The training recipes that read rollcall's data and write back to it
//! (see `docs/recipes.md`): teacher scoring for on-policy distillation
//! (`score`, against a [`teacher::Teacher`]), and the reward modes of
//! Orchard-SWE's SWE reward (`reward`, from a trajectory's `steps`), applied
//! by `rescore` as new reward revisions (`revision`).
//!
//! Like the rollout engine, a recipe talks to model servers over HTTP only
//! (the embedded model is started as a server of its own), reads the shards
//! through `export::read`, and writes what it adds as new shard rows beside
//! the recorded ones, never over them.

pub mod client;
pub mod credit;
pub mod judge;
pub mod render;
pub mod rerank;
pub mod rescore;
pub mod revision;
pub mod reward;
pub mod rubric;
pub mod score;
pub mod steps;
pub mod teacher;

/// Why a recipe could not run.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// {0}
    #[error("{0}")]
    Shards(#[from] crate::export::ExportError),
    /// model server {url}: {message}
    #[error("model server {url}: {message}")]
    Server { url: String, message: String },
    /// teacher {teacher} has another vocabulary than the student's: ...
    #[error(
        "teacher {teacher} has another vocabulary than the student's: the student's prompt ids \
         of rollout {rollout_id} call {sequence} should read as text holding {expected:?}, but \
         the teacher reads them as {got:?}; score with a teacher that shares the student's \
         tokenizer"
    )]
    Vocabulary {
        teacher: String,
        rollout_id: String,
        sequence: i64,
        expected: String,
        got: String,
    },
    /// cannot check the vocabulary of teacher {0}: ...
    #[error(
        "cannot check the vocabulary of teacher {0}: no scorable call has a text message to \
         check it with; pass --skip-vocab-check to score anyway"
    )]
    VocabularyUnverified(String),
    /// cannot write {path}: {message}
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
    /// {0}
    #[error("{0}")]
    Io(String),
    /// bad {what}: {why}
    #[error("bad {what}: {why}")]
    Arg { what: String, why: String },
}
