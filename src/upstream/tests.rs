use super::*;
use crate::config::Config;

#[test]
fn selects_by_model_then_default() {
    let cfg = Config::parse(
        r#"
default_route = "b"
[[routes]]
name = "a"
url = "http://127.0.0.1:1/v1"
models = ["qwen*", "exact"]
model_map = { "gpt-4o" = "qwen-7b" }
[[routes]]
name = "b"
url = "http://127.0.0.1:2/v1"
"#,
    )
    .unwrap();
    let t = RouteTable::new(&cfg.routes, cfg.default_route_name()).unwrap();
    assert_eq!(t.select(Some("qwen-3")).unwrap().name, "a");
    assert_eq!(t.select(Some("exact")).unwrap().name, "a");
    assert_eq!(t.select(Some("gpt-4o")).unwrap().name, "a");
    assert_eq!(
        t.select(Some("gpt-4o")).unwrap().upstream_model("gpt-4o"),
        "qwen-7b"
    );
    assert_eq!(t.select(Some("other")).unwrap().name, "b");
    assert_eq!(t.select(None).unwrap().name, "b");
}

fn route(kind: &str) -> Route {
    let cfg = Config::parse(&format!(
        "[[routes]]\nname = \"r\"\nurl = \"http://127.0.0.1:1/v1\"\nkind = \"{kind}\"\n"
    ))
    .unwrap();
    Route::new(&cfg.routes[0]).unwrap()
}

#[test]
fn headers_are_copied_only_where_the_route_changes_them() {
    let mut harness = HeaderMap::new();
    harness.insert("x-api-key", HeaderValue::from_static("harness"));
    let get = |h: &HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap().to_owned());

    let mut openai = route("openai");
    assert!(matches!(openai.placed(&harness, false), Cow::Borrowed(_)));
    // A translated Messages call: the harness's key becomes a Bearer token.
    let moved = openai.placed(&harness, true);
    assert_eq!(
        get(&moved, "authorization").as_deref(),
        Some("Bearer harness")
    );
    assert_eq!(get(&moved, "x-api-key"), None);
    // The route's own key replaces the harness's.
    openai.api_key = Some("route".into());
    let own = openai.placed(&harness, false);
    assert_eq!(get(&own, "authorization").as_deref(), Some("Bearer route"));
    assert_eq!(get(&own, "x-api-key"), None);

    let mut anthropic = route("anthropic");
    let versioned = anthropic.placed(&harness, false);
    assert_eq!(
        get(&versioned, "anthropic-version").as_deref(),
        Some("2023-06-01")
    );
    assert_eq!(get(&versioned, "x-api-key").as_deref(), Some("harness"));
    harness.insert("anthropic-version", HeaderValue::from_static("2024-01-01"));
    assert!(matches!(
        anthropic.placed(&harness, false),
        Cow::Borrowed(_)
    ));
    anthropic.api_key = Some("route".into());
    let own = anthropic.placed(&harness, false);
    assert_eq!(get(&own, "x-api-key").as_deref(), Some("route"));
    assert_eq!(
        get(&own, "anthropic-version").as_deref(),
        Some("2024-01-01")
    );
}
