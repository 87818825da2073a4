//! Redaction: the one function every text passes through before it reaches
//! a row's message columns or a log line.
//!
//! It masks, wherever they occur in a text:
//! - secrets registered at start (client keys, route API keys), exactly;
//! - URL userinfo (`https://user:pass@host` → `https://[REDACTED]@host`);
//! - values of secret-looking query parameters (`?api-key=…`, `&token=…`);
//! - credentials in header form (`Authorization: Bearer …`, `x-api-key: …`)
//!   and bare `Bearer …` tokens;
//! - strings shaped like provider keys (`sk-…`, `sk-ant-…`, `hf_…`, `ghp_…`).
//!
//! Request and response bodies are training data and are recorded as the
//! harness and the upstream sent them; what is redacted is what rollcall
//! itself writes about a call (failure messages, the user agent) and every
//! log line (the log writer calls [`redact`], see `cli`).

use regex::{Captures, Regex};
use std::borrow::Cow;
use std::sync::{OnceLock, RwLock};

/// What a secret is replaced with.
pub const MASK: &str = "[REDACTED]";

/// Secrets shorter than this are not registered: masking every occurrence
/// of a two-letter key would garble text without protecting anything.
const MIN_SECRET: usize = 6;

fn secrets() -> &'static RwLock<Vec<String>> {
    static S: OnceLock<RwLock<Vec<String>>> = OnceLock::new();
    S.get_or_init(RwLock::default)
}

/// Mask `secret` wherever it appears from now on (client keys, upstream keys).
pub fn register_secret(secret: &str) {
    let secret = secret.trim();
    if secret.len() < MIN_SECRET {
        return;
    }
    let mut s = secrets().write().unwrap_or_else(|p| p.into_inner());
    if !s.iter().any(|x| x == secret) {
        s.push(secret.to_owned());
        // Longest first, so that a key containing another is masked whole.
        s.sort_by_key(|x| std::cmp::Reverse(x.len()));
    }
}

struct Patterns {
    userinfo: Regex,
    query: Regex,
    header: Regex,
    bearer: Regex,
    keys: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let re = |s: &str| Regex::new(s).expect("redaction patterns are valid");
        Patterns {
            userinfo: re(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@?#]+@"),
            query: re(
                r"(?i)([?&;](?:[a-z0-9_\-]*(?:key|token|secret|password|passwd|auth|signature)[a-z0-9_\-]*|sig|code)=)[^&\s#]*",
            ),
            header: re(
                r#"(?i)\b((?:proxy-)?authorization|x-api-key|api-key|x-goog-api-key)(["']?\s*[:=]\s*["']?)(?:(?:bearer|basic|token)\s+)?[^\s"',;}&)#]+"#,
            ),
            bearer: re(r"(?i)\b(bearer|basic)\s+[a-z0-9._~+/=\-]{4,}"),
            keys: re(
                r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{8,}|hf_[A-Za-z0-9]{12,}|gh[pousr]_[A-Za-z0-9]{16,}|xox[abpr]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16})",
            ),
        }
    })
}

fn replace<'a>(text: Cow<'a, str>, re: &Regex, with: impl Fn(&Captures) -> String) -> Cow<'a, str> {
    if !re.is_match(&text) {
        return text;
    }
    Cow::Owned(re.replace_all(&text, |c: &Captures| with(c)).into_owned())
}

/// `text` with every secret in it masked. Borrows when nothing matched.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    {
        let s = secrets().read().unwrap_or_else(|p| p.into_inner());
        for secret in s.iter() {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), MASK));
            }
        }
    }
    let p = patterns();
    let g = |c: &Captures, i: usize| c.get(i).map_or("", |m| m.as_str()).to_owned();
    out = replace(out, &p.userinfo, |c| format!("{}{MASK}@", g(c, 1)));
    out = replace(out, &p.query, |c| format!("{}{MASK}", g(c, 1)));
    out = replace(out, &p.header, |c| format!("{}{}{MASK}", g(c, 1), g(c, 2)));
    out = replace(out, &p.bearer, |c| format!("{} {MASK}", g(c, 1)));
    out = replace(out, &p.keys, |_| MASK.to_owned());
    out
}

/// [`redact`] into an owned string.
pub fn redacted(text: &str) -> String {
    redact(text).into_owned()
}

/// Standard error through [`redact`]: the writer of every log line. The
/// log formatter writes each event whole, so each write is one line.
pub struct Stderr;

impl std::io::Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        match std::str::from_utf8(buf) {
            Ok(text) => err.write_all(redact(text).as_bytes())?,
            Err(_) => err.write_all(redact(&String::from_utf8_lossy(buf)).as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_lose_their_secret_values_only() {
        let t = "error sending request for url (http://127.0.0.1:1/v1/chat/completions?api-key=abc123&beta=true)";
        let r = redact(t);
        assert!(!r.contains("abc123"), "{r}");
        assert!(
            r.contains("beta=true") && r.contains("api-key=[REDACTED]"),
            "{r}"
        );
        for name in [
            "key",
            "api_key",
            "apiKey",
            "access_token",
            "token",
            "x-api-key",
            "sig",
            "client_secret",
            "password",
        ] {
            let t = format!("GET /v1/models?a=1&{name}=hunter2hunter2 failed");
            assert!(!redact(&t).contains("hunter2"), "{name}: {}", redact(&t));
        }
        assert_eq!(
            redact("/v1/models?model=gpt&stream=true"),
            "/v1/models?model=gpt&stream=true"
        );
    }

    #[test]
    fn url_userinfo_is_masked() {
        let r = redact("could not connect to https://bob:s3cretpw@models.internal:8443/v1");
        assert_eq!(
            r,
            "could not connect to https://[REDACTED]@models.internal:8443/v1"
        );
        assert_eq!(
            redact("see http://host/v1 and a@b.c"),
            "see http://host/v1 and a@b.c"
        );
    }

    #[test]
    fn headers_and_bearer_tokens_are_masked() {
        for t in [
            "authorization: Bearer abcdef123456",
            "Authorization=Basic dXNlcjpwYXNz",
            r#"{"x-api-key":"abcdef123456"}"#,
            "x-api-key: abcdef123456",
            "sent Bearer abcdef123456 upstream",
        ] {
            let r = redact(t);
            assert!(
                !r.contains("abcdef123456") && !r.contains("dXNlcjpwYXNz"),
                "{t} -> {r}"
            );
            assert!(r.contains(MASK), "{r}");
        }
    }

    #[test]
    fn provider_keys_and_registered_secrets_are_masked() {
        let r = redact(
            "Incorrect API key provided: sk-proj-AbCdEf0123456789xyz. And sk-ant-api03-zzzzzzzzzz",
        );
        assert!(!r.contains("AbCdEf") && !r.contains("zzzz"), "{r}");
        register_secret("my-client-key-42");
        register_secret("ab"); // too short to register
        let r = redact("unknown key my-client-key-42; ab stays");
        assert_eq!(r, "unknown key [REDACTED]; ab stays");
    }

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        let t = "the upstream answered 500 Internal Server Error: scripted internal error";
        assert!(matches!(redact(t), Cow::Borrowed(_)));
    }
}
