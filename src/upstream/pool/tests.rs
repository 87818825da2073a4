use super::*;

fn url(i: usize) -> String {
    format!("http://10.0.0.{i}:8000/v1")
}

fn urls(ids: impl IntoIterator<Item = usize>) -> Vec<String> {
    ids.into_iter().map(url).collect()
}

fn pool(n: usize, policy: Policy) -> Pool {
    Pool::new(&urls(0..n), policy, 2, Duration::from_secs(60)).unwrap()
}

fn nth(p: &Pool, i: usize) -> Arc<Replica> {
    p.snapshot().replicas()[i].clone()
}

/// The URL of `rollout`'s first replica on a set's ring.
fn ring_home(set: &ReplicaSet, rollout: &str) -> String {
    set.replicas[set.ring_order(rollout)[0]].url.clone()
}

/// Where `rollout`'s next call goes, and whether it moved.
fn goes(p: &Pool, rollout: &str) -> (String, bool) {
    let l = p.pick(Some(rollout), &[]).unwrap();
    (l.replica.url.clone(), l.repinned)
}

#[test]
fn affinity_sticks_and_spreads() {
    let p = pool(4, Policy::Affinity);
    let mut counts: HashMap<String, usize> = HashMap::new();
    for r in 0..400 {
        let id = format!("rollout-{r}");
        let (first, _) = goes(&p, &id);
        for _ in 0..5 {
            assert_eq!(goes(&p, &id), (first.clone(), false));
        }
        *counts.entry(first).or_default() += 1;
    }
    assert!(
        counts.len() == 4 && counts.values().all(|&c| c > 50),
        "{counts:?}"
    );
}

#[test]
fn removing_a_replica_moves_only_its_rollouts() {
    let four = pool(4, Policy::Affinity).snapshot();
    let three = pool(3, Policy::Affinity).snapshot();
    let mut moved = 0;
    for r in 0..1000 {
        let id = format!("r{r}");
        let a = ring_home(&four, &id);
        if a != url(3) {
            assert_eq!(
                a,
                ring_home(&three, &id),
                "a rollout of a staying replica moved"
            );
        } else {
            moved += 1;
        }
    }
    assert!(moved > 150 && moved < 350, "{moved}");
}

#[test]
fn a_down_or_overloaded_replica_is_left_and_the_move_recorded() {
    let p = pool(3, Policy::Affinity);
    let first = p.pick(Some("r"), &[]).unwrap();
    let home = first.replica.clone();
    drop(first);
    p.mark_down(&home);
    let moved = p.pick(Some("r"), &[]).unwrap();
    assert!(moved.repinned && moved.replica.url != home.url);
    let new_home = moved.replica.clone();
    drop(moved);
    // It stays on its new replica after the old one recovers.
    p.mark_up(&home);
    assert_eq!(goes(&p, "r"), (new_home.url.clone(), false));
    // Overload: three more calls in flight than the least-loaded.
    let held: Vec<Lease> = (0..3).map(|_| Lease::new(&new_home, false)).collect();
    let off = p.pick(Some("r"), &[]).unwrap();
    assert!(off.repinned && off.replica.url != new_home.url);
    drop(held);
    // A failed attempt is excluded.
    let other = p
        .pick(Some("r"), std::slice::from_ref(&off.replica))
        .unwrap();
    assert_ne!(other.replica.url, off.replica.url);
}

#[test]
fn least_loaded_and_round_robin_skip_down_replicas() {
    let p = pool(3, Policy::LeastLoaded);
    let a = p.pick(None, &[]).unwrap();
    let b = p.pick(None, &[]).unwrap();
    assert_ne!(a.replica.url, b.replica.url);
    p.mark_down(&nth(&p, 2));
    let c = p.pick(None, &[]).unwrap();
    assert_ne!(c.replica.url, url(2));
    let rr = pool(3, Policy::RoundRobin);
    rr.mark_down(&nth(&rr, 1));
    let got: Vec<String> = (0..4).map(|_| goes(&rr, "x").0).collect();
    assert_eq!(got, [url(0), url(2), url(0), url(2)]);
    // Everything down: still an answer.
    rr.mark_down(&nth(&rr, 0));
    rr.mark_down(&nth(&rr, 2));
    assert!(rr.pick(None, &[]).is_some());
    let all: Vec<Arc<Replica>> = rr.snapshot().replicas().to_vec();
    assert!(rr.pick(None, &all).is_none());
}

#[test]
fn a_join_takes_about_one_in_n_plus_one_and_pinned_rollouts_stay() {
    let p = pool(4, Policy::Affinity);
    let ids: Vec<String> = (0..2000).map(|r| format!("r{r}")).collect();
    let home: Vec<String> = ids.iter().map(|id| goes(&p, id).0).collect();
    let before = p.snapshot();
    let change = p.replace(&urls(0..5)).unwrap();
    assert_eq!(
        change,
        Change {
            joined: vec![url(4)],
            left: vec![]
        }
    );
    let after = p.snapshot();
    // The kept replicas are the same ones, state and all.
    for i in 0..4 {
        assert!(Arc::ptr_eq(&before.replicas()[i], &after.replicas()[i]));
    }
    // On the ring, the newcomer takes about a fifth, and only from the
    // others' shares: no rollout moves between two old replicas.
    let mut to_new = 0;
    for id in &ids {
        let (a, b) = (ring_home(&before, id), ring_home(&after, id));
        if a != b {
            assert_eq!(b, url(4), "{id} moved between two old replicas");
            to_new += 1;
        }
    }
    assert!(to_new > 280 && to_new < 520, "{to_new} of 2000 moved");
    // Pinned rollouts stay where they are; new ones follow the new ring.
    for (id, h) in ids.iter().zip(&home) {
        assert_eq!(goes(&p, id), (h.clone(), false));
    }
    let fresh = (0..2000)
        .filter(|r| goes(&p, &format!("new-{r}")).0 == url(4))
        .count();
    assert!(fresh > 280 && fresh < 520, "{fresh} of 2000 new rollouts");
}

#[test]
fn a_leave_moves_only_the_leavers_rollouts_and_records_it() {
    let p = pool(4, Policy::Affinity);
    let ids: Vec<String> = (0..1000).map(|r| format!("r{r}")).collect();
    let home: Vec<String> = ids.iter().map(|id| goes(&p, id).0).collect();
    let kept = nth(&p, 0);
    p.mark_down(&kept);
    let change = p.replace(&urls([0, 1, 3])).unwrap();
    assert_eq!(
        change,
        Change {
            joined: vec![],
            left: vec![url(2)]
        }
    );
    // A kept replica keeps its health.
    assert!(Arc::ptr_eq(&kept, &nth(&p, 0)) && !p.is_up(&nth(&p, 0)));
    p.mark_up(&kept);
    let mut moved = 0;
    for (id, h) in ids.iter().zip(&home) {
        let (now, repinned) = goes(&p, id);
        if *h == url(2) {
            assert!(repinned && now != url(2), "{id}");
            moved += 1;
            // Re-pinned once: it stays on its new replica.
            assert_eq!(goes(&p, id), (now, false));
        } else {
            assert_eq!((&now, repinned), (h, false), "{id}");
        }
    }
    assert!(moved > 150 && moved < 350, "{moved}");
}

#[test]
fn a_lease_on_a_replica_that_left_drops_cleanly() {
    let p = pool(3, Policy::Affinity);
    let lease = p.pick(Some("r"), &[]).unwrap();
    let gone = lease.replica.clone();
    let rest: Vec<String> = urls(0..3).into_iter().filter(|u| *u != gone.url).collect();
    p.replace(&rest).unwrap();
    assert_eq!(gone.in_flight(), 1);
    // No new call goes to it, the lease's rollout included.
    assert!(goes(&p, "r").1);
    for r in 0..200 {
        assert_ne!(goes(&p, &format!("x{r}")).0, gone.url);
    }
    assert!(p.pick(None, &[]).is_some_and(|l| l.replica.url != gone.url));
    // A late mark (the call failed after all) is harmless.
    p.mark_down(&lease.replica);
    drop(lease);
    assert_eq!(gone.in_flight(), 0);
    // Back under the same URL: a fresh replica.
    p.replace(&urls(0..3)).unwrap();
    let back = p
        .snapshot()
        .replicas()
        .iter()
        .find(|r| r.url == gone.url)
        .cloned()
        .unwrap();
    assert!(!Arc::ptr_eq(&back, &gone) && p.is_up(&back) && back.in_flight() == 0);
}

#[test]
fn a_bad_replacement_changes_nothing() {
    let p = pool(3, Policy::Affinity);
    let before = p.snapshot();
    for bad in [
        vec![],
        vec![url(0), format!("{}/", url(0))],
        vec!["ftp://10.0.0.9/v1".to_owned()],
        vec!["http://[::1/v1".to_owned()],
    ] {
        assert!(p.replace(&bad).is_err(), "{bad:?}");
    }
    assert!(Arc::ptr_eq(&before, &p.snapshot()));
}

#[test]
fn plain_http_replicas_take_hyper_others_reqwest() {
    let plain = Replica::new("http://10.0.0.1:8000/v1/").unwrap();
    assert!(plain.is_plain());
    assert_eq!(
        plain
            .plain_endpoint("/chat/completions")
            .map(|u| u.to_string()),
        Some("/v1/chat/completions".to_owned())
    );
    assert_eq!(
        plain.host.as_ref().map(|h| h.to_str().unwrap()),
        Some("10.0.0.1:8000")
    );
    assert!(plain.origin.is_some());
    assert!(plain.plain_endpoint("/nope").is_none());
    // TLS, and credentials in the URL (reqwest sends them as Basic auth),
    // go through reqwest.
    for url in [
        "https://api.example.com/v1",
        "http://u:secret-pass@10.0.0.1:8000/v1",
    ] {
        let r = Replica::new(url).unwrap();
        assert!(!r.is_plain() && r.plain_endpoint("/chat/completions").is_none());
        assert!(r.endpoint("/chat/completions").is_some());
    }
    let with_pass = Replica::new("http://u:secret-pass@10.0.0.1:8000/v1").unwrap();
    assert!(!with_pass.redacted.contains("secret-pass"));
}

#[test]
fn a_plain_replica_knows_its_host_header_a_tls_one_has_none() {
    let host = |u: &str| {
        Replica::new(u)
            .unwrap()
            .host
            .map(|h: http::HeaderValue| h.to_str().unwrap().to_owned())
    };
    assert_eq!(
        host("http://10.0.0.1:8000/v1").as_deref(),
        Some("10.0.0.1:8000")
    );
    assert_eq!(
        host("http://model.internal/v1/").as_deref(),
        Some("model.internal")
    );
    assert_eq!(
        host("http://model.internal:80/v1").as_deref(),
        Some("model.internal")
    );
    assert_eq!(host("http://[::1]:9000/v1").as_deref(), Some("[::1]:9000"));
    assert_eq!(
        host("http://Model.Internal:8080").as_deref(),
        Some("model.internal:8080")
    );
    assert_eq!(host("https://api.example.com/v1"), None);
    assert_eq!(host("http://user:pw@model.internal/v1"), None);
}
