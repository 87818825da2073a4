//! `POST /update_weights_from_disk`, in SGLang's shape, so that the proxy
//! (`POST /v1/admin/load`) and a trainer load new weights the same way
//! into the embedded model and into an SGLang server:
//!
//! ```text
//! {"model_path": PATH, "force"?: bool, "weight_version"?: STR, "load_format"?: "auto", "flush_cache"?: bool}
//! → 200 {"success": true, "message": "...", "num_paused_requests": 0, "load_ms": N, "swap_ms": N}
//! → 400 {"success": false, "message": "..."}
//! ```
//!
//! `force` is rollcall's: it accepts a tokenizer or chat template that
//! differs from the one in use. The KV caches are always emptied.

use super::Model;
use crate::http::{json_response, ProxyBody};
use http::Response;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::Arc;

const FIELDS: [&str; 5] = [
    "model_path",
    "force",
    "weight_version",
    "load_format",
    "flush_cache",
];

fn failed(message: String) -> Response<ProxyBody> {
    json_response(400, &json!({"success": false, "message": message}))
}

pub(super) async fn update_weights_from_disk(
    model: &Arc<Model>,
    body: &Map<String, Value>,
) -> Response<ProxyBody> {
    if let Some(k) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return failed(format!(
            "unknown field {k:?}; the fields are {}",
            FIELDS.join(", ")
        ));
    }
    let Some(path) = body
        .get("model_path")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
    else {
        return failed(
            "`model_path` must name a GGUF file or a Hugging Face checkpoint directory".into(),
        );
    };
    if let Some(f) = body
        .get("load_format")
        .filter(|f| !f.is_null() && f.as_str() != Some("auto"))
    {
        return failed(format!(
            "load_format {f}: the embedded model reads the format from the path (\"auto\")"
        ));
    }
    let force = match body.get("force") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return failed(format!("`force` must be true or false, not {other}")),
    };
    let path = PathBuf::from(path);
    let m = model.clone();
    let done = tokio::task::spawn_blocking(move || m.reload(&path, force)).await;
    match done {
        Ok(Ok(r)) => {
            tracing::info!(model = %model.name, source = %r.source.display(), load_ms = r.load_ms,
                swap_ms = r.swap_ms, changed = ?r.changed, "embedded model weights replaced");
            let mut message = format!(
                "Succeeded to update model weights from {}.",
                r.source.display()
            );
            if !r.changed.is_empty() {
                message.push_str(&format!(
                    " Forced through a change of: {}.",
                    r.changed.join(", ")
                ));
            }
            json_response(
                200,
                &json!({"success": true, "message": message, "num_paused_requests": 0,
                    "load_ms": r.load_ms, "swap_ms": r.swap_ms}),
            )
        }
        Ok(Err(e)) => failed(e.to_string()),
        Err(e) => failed(format!("the reload stopped: {e}")),
    }
}
