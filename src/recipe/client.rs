//! A model server the recipes ask (a teacher, a judge, a value model): an
//! OpenAI-compatible base URL, JSON posted with bounded waits and retries.

use super::RecipeError;
use serde_json::Value;
use std::time::Duration;

/// Retries of a request whose connection failed or that got a 5xx.
const RETRIES: usize = 2;

/// One model server.
#[derive(Clone)]
pub struct Server {
    client: reqwest::Client,
    /// `http://host:port/v1`, no trailing slash.
    base: String,
    /// How errors name it: the base URL without credentials, or what it is.
    pub label: String,
}

impl Server {
    /// `timeout` bounds each request, answer included.
    pub fn new(base: &str, label: String, timeout: Duration) -> Result<Server, RecipeError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| RecipeError::Server {
                url: label.clone(),
                message: e.to_string(),
            })?;
        Ok(Server {
            client,
            base: base.trim_end_matches('/').to_owned(),
            label,
        })
    }

    /// An error naming this server.
    pub fn error(&self, message: String) -> RecipeError {
        RecipeError::Server {
            url: self.label.clone(),
            message,
        }
    }

    /// POST JSON to `path` under the base URL (`/chat/completions`).
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, RecipeError> {
        self.post_url(&format!("{}{path}", self.base), body).await
    }

    /// POST JSON to `path` under the server's origin (vLLM's `/detokenize`
    /// lives beside `/v1`).
    pub async fn post_origin(&self, path: &str, body: &Value) -> Result<Value, RecipeError> {
        let origin = self.base.strip_suffix("/v1").unwrap_or(&self.base);
        self.post_url(&format!("{origin}{path}"), body).await
    }

    /// The answer's JSON, retried on connection errors and 5xx, a 4xx
    /// failing at once with the server's message.
    async fn post_url(&self, url: &str, body: &Value) -> Result<Value, RecipeError> {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        let mut last = String::new();
        for attempt in 0..=RETRIES {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
            let sent = self
                .client
                .post(url)
                .header("content-type", "application/json")
                .body(bytes.clone())
                .send()
                .await;
            let r = match sent {
                Ok(r) => r,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let status = r.status();
            let text = match r.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            if status.is_success() {
                return serde_json::from_slice(&text)
                    .map_err(|e| self.error(format!("the answer is not JSON: {e}")));
            }
            last = format!("HTTP {}: {}", status.as_u16(), error_message(&text));
            if status.is_client_error() {
                break;
            }
        }
        Err(self.error(crate::redact::redact(&last).into_owned()))
    }
}

/// An error body's message (OpenAI's `{"error": {"message"}}`, or the text).
fn error_message(body: &[u8]) -> String {
    let v: Option<Value> = serde_json::from_slice(body).ok();
    let msg = v.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    msg.unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(2000)]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_read_from_openai_bodies() {
        assert_eq!(
            error_message(br#"{"error": {"message": "token id 99999 is out of vocabulary"}}"#),
            "token id 99999 is out of vocabulary"
        );
        assert_eq!(error_message(b"plain"), "plain");
    }
}
