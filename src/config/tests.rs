use super::*;

#[test]
fn upstream_flag_creates_or_replaces_default_route() {
    let mut c = Config::default();
    c.set_upstream("http://127.0.0.1:9/v1");
    assert_eq!(c.routes.len(), 1);
    assert_eq!(c.default_route_name(), Some("default"));
    c.set_upstream("http://127.0.0.1:10/v1");
    assert_eq!(c.routes.len(), 1);
    assert_eq!(c.routes[0].url, "http://127.0.0.1:10/v1");
    c.validate().unwrap();
}

#[test]
fn rejects_unknown_fields_and_bad_urls() {
    assert!(Config::parse("[server]\nlisten_on = 1\n").is_err());
    let c = Config::parse("[[routes]]\nname = \"a\"\nurl = \"ftp://x\"\n").unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("must start with http"), "{err}");
    let c = Config::parse(
        "[[routes]]\nname = \"a\"\nurl = \"http://x/v1\"\nurls = [\"http://x/v1/\"]\n",
    )
    .unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("given twice"), "{err}");
    let mut c = Config::default();
    c.set_upstream("http://127.0.0.1:9/v1");
    c.server.max_response_bytes = 5 << 30;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("max_response_bytes"), "{err}");
    let c = Config::parse("[shards]\non_wal_error = \"serve\"\n").unwrap();
    assert_eq!(c.shards.on_wal_error, OnWalError::Serve);
    assert!(Config::parse("[shards]\non_wal_error = \"ignore\"\n").is_err());
    // Typed at the seam: an unknown API or compression fails the parse.
    let err = Config::parse("[[routes]]\nname = \"a\"\nurl = \"http://x\"\napis = [\"chats\"]\n")
        .unwrap_err();
    assert!(err.to_string().contains("chat_completions"), "{err}");
    let c = Config::parse(
        "[[routes]]\nname = \"a\"\nurl = \"http://x\"\napis = [\"chat\", \"messages\"]\n",
    )
    .unwrap();
    use crate::dialect::WireApi;
    assert_eq!(
        c.routes[0].apis,
        Some(vec![WireApi::ChatCompletions, WireApi::Messages])
    );
    assert!(Config::parse("[shards]\ncompression = \"lz4\"\n").is_err());
    let c = Config::parse("[shards]\ncompression = \"snappy\"\n").unwrap();
    assert_eq!(c.shards.compression, Compression::Snappy);
}

#[test]
fn embedded_routes_take_a_model_not_a_url() {
    let c = Config::parse(
        "[[routes]]\nname = \"m\"\nkind = \"embedded\"\n[routes.embedded]\nmodel_file = \"x.gguf\"\ndefault_max_tokens = 64\n",
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.routes[0].embedded.default_max_tokens, 64);
    assert!(
        !c.routes[0].embedded.dequantize,
        "quantized blocks by default"
    );
    assert_eq!(
        c.routes[0].embedded.threads, 0,
        "one thread per core by default"
    );
    for (key, bad) in [("threads", "1025"), ("kv_slots", "0"), ("kv_slots", "257")] {
        let e = Config::parse(&format!(
            "[[routes]]\nname = \"m\"\nkind = \"embedded\"\n[routes.embedded]\n{key} = {bad}\n"
        ))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains(&format!("embedded.{key}")), "{e}");
    }
    let mut c = c;
    c.set_upstream("http://127.0.0.1:9/v1");
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("takes no url"), "{err}");
    assert!(Config::parse(
        "[[routes]]\nname = \"m\"\nkind = \"embedded\"\n[routes.embedded]\nmodel = 1\n"
    )
    .is_err());
}

#[test]
fn example_configs_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("proxy-config");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let mut c = Config::load(&p).unwrap_or_else(|e| panic!("{e}"));
            if c.routes.is_empty() {
                c.set_upstream("http://127.0.0.1:8000/v1");
            }
            c.validate()
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            n += 1;
        }
    }
    assert!(n >= 3);
}

#[test]
fn parses_full_example() {
    let c = Config::parse(
        r#"
default_route = "local"
[server]
listen = "0.0.0.0:9000"
[rollouts]
untagged = "reject"
[shards]
dir = "/tmp/x"
max_age_secs = 5
[[routes]]
name = "local"
url = "http://127.0.0.1:8000/v1"
models = ["qwen*"]
model_map = { "gpt-4o" = "qwen" }
"#,
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.rollouts.untagged, Untagged::Reject);
    assert_eq!(c.routes[0].model_map["gpt-4o"], "qwen");
}

#[test]
fn server_threads_are_bounded() {
    let mut c = Config::default();
    c.set_upstream("http://127.0.0.1:9/v1");
    c.server.threads = MAX_SERVER_THREADS + 1;
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("server.threads"), "{e}");
    c.server.threads = 2;
    assert!(c.validate().is_ok());
    assert_eq!(c.server.threads(), 2);
}
