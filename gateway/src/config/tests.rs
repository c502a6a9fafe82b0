//! Parsing and matching, case by case: envoyproxy/ratelimit's rules (exact value, wildcard, key only, nesting,
//! depth must match, most specific wins) and the refusals it makes, with the line where we can name it.
use super::tree::wildcard_match;
use super::*;

const SHOP: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 10, burst: 20 }
  - key: user
    value: bob
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: user
    value: vip
  - key: path
    value: /api/*
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: path
    value: /api/*/export
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: tenant
    value: acme
    descriptors:
      - key: method
        rate_limit: { unit: second, requests_per_unit: 3 }
      - key: method
        value: POST
        rate_limit: { unit: second, requests_per_unit: 1, burst: 2 }
        descriptors:
          - key: path
            rate_limit: { unit: day, requests_per_unit: 7 }
  - key: generic_key
    value: global
    rate_limit: { unit: second, requests_per_unit: 50, name: global }
  - key: internal
    rate_limit: { unlimited: true }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: canary
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
";

fn shop() -> Config {
    Config::from_yaml("shop.yaml", SHOP).expect("the example parses")
}

/// The matched limit's path in the file, or "none".
fn path(config: &Config, entries: &[(&str, &str)]) -> String {
    config
        .find("shop", entries)
        .map_or_else(|| "none".to_owned(), |found| found.limit.path.clone())
}

#[test]
fn key_only_matches_any_value_and_names_a_bucket_per_value() {
    let config = shop();
    let found = config
        .find("shop", &[("user", "alice")])
        .expect("user matches");
    assert_eq!(found.limit.path, "shop.user");
    assert_eq!(
        found.limit.policy,
        Policy::Bucket {
            requests_per_unit: 10,
            unit: Unit::Second,
            burst: 20
        }
    );
    assert_eq!(
        found.bucket_entries,
        vec![("user".to_owned(), "alice".to_owned())]
    );
}

#[test]
fn exact_value_beats_key_only() {
    assert_eq!(path(&shop(), &[("user", "bob")]), "shop.user_bob");
}

#[test]
fn exact_value_without_a_limit_lets_it_through() {
    // envoyproxy/ratelimit's "whitelist": the value matches a node that has no limit.
    assert_eq!(path(&shop(), &[("user", "vip")]), "none");
}

#[test]
fn wildcards_match_in_file_order_before_key_only() {
    let config = shop();
    assert_eq!(
        path(&config, &[("path", "/api/orders")]),
        "shop.path_/api/*"
    );
    // The first wildcard in file order wins, even when a later one is more specific.
    assert_eq!(
        path(&config, &[("path", "/api/users/export")]),
        "shop.path_/api/*"
    );
    assert_eq!(path(&config, &[("path", "/web")]), "none");
}

#[test]
fn middle_wildcards_match_any_run_of_characters() {
    let parts = |pattern: &str| -> Vec<String> { pattern.split('*').map(str::to_owned).collect() };
    assert!(wildcard_match(&parts("a*b*c"), "abc"));
    assert!(wildcard_match(&parts("a*b*c"), "a-b-c"));
    assert!(!wildcard_match(&parts("a*b*c"), "a-c"));
    assert!(!wildcard_match(&parts("ab*ba"), "aba"));
    assert!(wildcard_match(&parts("foo*"), "foo"));
    assert!(wildcard_match(&parts("*"), "anything"));
    assert!(!wildcard_match(&parts("foo"), "food"));
}

#[test]
fn nesting_walks_one_level_per_entry() {
    let config = shop();
    assert_eq!(
        path(&config, &[("tenant", "acme"), ("method", "GET")]),
        "shop.tenant_acme.method"
    );
    assert_eq!(
        path(&config, &[("tenant", "acme"), ("method", "POST")]),
        "shop.tenant_acme.method_POST"
    );
    assert_eq!(
        path(
            &config,
            &[("tenant", "acme"), ("method", "POST"), ("path", "/x")]
        ),
        "shop.tenant_acme.method_POST.path"
    );
}

#[test]
fn depth_must_match_the_configured_path() {
    let config = shop();
    // Shorter: the first level has no limit of its own.
    assert_eq!(path(&config, &[("tenant", "acme")]), "none");
    // Longer: `user` has no children, so a second entry finds nothing.
    assert_eq!(
        path(&config, &[("user", "alice"), ("method", "GET")]),
        "none"
    );
    // Longer than a node with children but no deeper match.
    assert_eq!(
        path(
            &config,
            &[("tenant", "acme"), ("method", "GET"), ("path", "/x")]
        ),
        "none"
    );
    // An unknown tenant value: no key-only `tenant` exists.
    assert_eq!(
        path(&config, &[("tenant", "other"), ("method", "GET")]),
        "none"
    );
}

#[test]
fn unknown_domain_and_unknown_key_match_nothing() {
    let config = shop();
    assert!(config.find("other", &[("user", "alice")]).is_none());
    assert_eq!(path(&config, &[("color", "red")]), "none");
    assert!(config.has_domain("shop"));
    assert!(!config.has_domain("other"));
}

#[test]
fn unlimited_zero_shadow_and_names_are_carried() {
    let config = shop();
    let internal = config.find("shop", &[("internal", "x")]).expect("matches");
    assert_eq!(internal.limit.policy, Policy::Unlimited);
    let blocked = config.find("shop", &[("blocked", "x")]).expect("matches");
    assert!(matches!(
        blocked.limit.policy,
        Policy::Bucket {
            requests_per_unit: 0,
            ..
        }
    ));
    assert!(
        config
            .find("shop", &[("canary", "x")])
            .expect("matches")
            .limit
            .shadow_mode
    );
    assert_eq!(
        config
            .find("shop", &[("generic_key", "global")])
            .expect("matches")
            .limit
            .name,
        "global"
    );
}

#[test]
fn burst_defaults_to_requests_per_unit() {
    let found = shop().find("shop", &[("user", "bob")]).expect("matches");
    assert_eq!(
        found.limit.policy,
        Policy::Bucket {
            requests_per_unit: 5,
            unit: Unit::Minute,
            burst: 5
        }
    );
    assert_eq!(found.limit.rate_per_sec(), Some(5.0 / 60.0));
}

#[test]
fn units_are_case_insensitive_and_map_to_proto_values() {
    let config = Config::from_yaml(
        "u.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: WEEK, requests_per_unit: 7 }\n",
    )
    .expect("parses");
    let found = config.find("d", &[("a", "1")]).expect("matches");
    assert_eq!(found.limit.rate_per_sec(), Some(7.0 / 604_800.0));
    for unit in [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ] {
        assert_eq!(Unit::from_proto(unit.proto_value()), Some(unit));
    }
    assert_eq!(Unit::from_proto(0), None);
}

#[test]
fn share_threshold_names_one_bucket_for_every_matching_value() {
    let config = Config::from_yaml(
        "s.yaml",
        "domain: d\ndescriptors:\n  - key: path\n    value: /files/*\n    share_threshold: true\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
    )
    .expect("parses");
    let found = config
        .find("d", &[("path", "/files/a.txt")])
        .expect("matches");
    assert_eq!(
        found.bucket_entries,
        vec![("path".to_owned(), "/files/*".to_owned())]
    );
}

#[test]
fn accepts_every_key_envoyproxy_ratelimit_accepts() {
    let text = "\
domain: d
descriptors:
  - key: a
    value: 42
    quota_mode: false
    detailed_metric: true
    value_to_metric: true
    metadata: { team: x, tags: [1, 2] }
    rate_limit:
      name: first
      unit: second
      requests_per_unit: 1
      replaces: [{ name: other }]
";
    let config = Config::from_yaml("all.yaml", text).expect("parses");
    let found = config
        .find("d", &[("a", "42")])
        .expect("a numeric value is its text");
    assert_eq!(found.limit.replaces, vec!["other".to_owned()]);
}

#[test]
fn several_files_are_several_domains() {
    let config = Config::from_files([
        ("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n"),
        ("b.yaml", "domain: b\n"),
    ])
    .expect("parses");
    assert_eq!(config.domains(), vec!["a", "b"]);
}

/// The refusal message for `text`, which must be refused.
fn refusal(text: &str) -> String {
    Config::from_yaml("bad.yaml", text)
        .expect_err("must be refused")
        .to_string()
}

#[test]
fn unknown_unit_is_refused_with_its_line() {
    let message = refusal("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n");
    assert!(message.starts_with("bad.yaml: "), "{message}");
    assert!(
        message.contains("invalid rate limit unit 'fortnight'"),
        "{message}"
    );
    assert!(message.contains("line 5"), "{message}");
}

#[test]
fn yaml_that_does_not_parse_is_refused_with_its_line() {
    let message = refusal("domain: d\ndescriptors:\n  - key: a\n   bad indent: [\n");
    assert!(message.contains("error loading config file"), "{message}");
    assert!(message.contains("line "), "{message}");
}

#[test]
fn unknown_keys_are_refused_with_their_line() {
    let message = refusal("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      request_per_unit: 1\n");
    assert!(
        message.contains("config error, unknown key 'request_per_unit' at line 6"),
        "{message}"
    );
}

#[test]
fn a_known_key_in_the_wrong_place_is_ignored_as_upstream_does() {
    // `unit` at the top, `domain` in a descriptor, `shadow_mode` in a rate limit: known keys, so accepted and unread.
    let text = "\
domain: d
unit: second
descriptors:
  - key: a
    domain: elsewhere
    rate_limit: { unit: second, requests_per_unit: 2, shadow_mode: true }
";
    let config = Config::from_yaml("misplaced.yaml", text).expect("parses");
    let found = config.find("d", &[("a", "x")]).expect("matches");
    assert!(
        !found.limit.shadow_mode,
        "shadow_mode inside rate_limit means nothing"
    );
}

#[test]
fn scalars_are_strings_integers_booleans_or_null_as_upstream_checks() {
    for (text, expected) in [
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: 1.5\n",
            "error checking config: 'value: 1.5' is not a string, an integer or a boolean at line 4",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1.5 }\n",
            "'requests_per_unit: 1.5' is not a string",
        ),
        ("domain: d\n1: x\n", "config error, key is not of type string: 1"),
        ("domain: d\ndescriptors: [a]\n", "list of type other than map: a"),
    ] {
        let message = refusal(text);
        assert!(message.contains(expected), "{text:?}: {message}");
    }
    // A number or a boolean where a string is expected is its text, as upstream's YAML decoder reads it.
    let config = Config::from_yaml(
        "n.yaml",
        "domain: 7\ndescriptors:\n  - key: 1\n    value: true\n    rate_limit: { unit: second, requests_per_unit: 1, name: 2 }\n",
    )
    .expect("parses");
    let found = config.find("7", &[("1", "true")]).expect("matches");
    assert_eq!(found.limit.name, "2");
    // metadata is free-form.
    Config::from_yaml(
        "m.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    metadata: { ratio: 0.5, anything: [1, x] }\n",
    )
    .expect("metadata is not checked");
}

#[test]
fn quota_mode_is_carried() {
    let config = Config::from_yaml("q.yaml", "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: { unit: second, requests_per_unit: 1 }\n").expect("parses");
    assert!(
        config
            .find("d", &[("a", "x")])
            .expect("matches")
            .limit
            .quota_mode
    );
}

#[test]
fn merging_domains_adds_descriptors_and_refuses_a_path_defined_twice() {
    let one = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
    let two = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";
    let merged =
        Config::from_files_merging([("1.yaml", one), ("2.yaml", two)], true).expect("merges");
    assert_eq!(merged.domains(), vec!["d"]);
    assert_eq!(path_in(&merged, "d", &[("a", "x")]), "d.a");
    assert_eq!(path_in(&merged, "d", &[("b", "x")]), "d.b");
    let twice = Config::from_files_merging([("1.yaml", one), ("3.yaml", one)], true)
        .expect_err("a path in two files");
    assert_eq!(
        twice.to_string(),
        "3.yaml: duplicate descriptor composite key 'd.a'"
    );
    let unmerged = Config::from_files([("1.yaml", one), ("2.yaml", two)]).expect_err("no merging");
    assert_eq!(
        unmerged.to_string(),
        "2.yaml: duplicate domain 'd' in config file"
    );
}

fn path_in(config: &Config, domain: &str, entries: &[(&str, &str)]) -> String {
    config
        .find(domain, entries)
        .map_or_else(|| "none".to_owned(), |found| found.limit.path.clone())
}

#[test]
fn semantic_refusals_match_envoyproxy_ratelimit() {
    let cases = [
        ("descriptors: []\n", "config file cannot have empty domain"),
        ("domain: d\ndescriptors:\n  - value: x\n", "descriptor has empty key"),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
            "duplicate descriptor composite key 'd.a'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unlimited: true, unit: second }\n",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { requests_per_unit: 1 }\n",
            "invalid rate limit unit ''",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, burst: 0 }\n",
            "burst must be at least 1",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, name: n, replaces: [{ name: n }] }\n",
            "replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n",
            "share_threshold can only be used with wildcard values",
        ),
        ("domain: d\ndescriptors: [1, 2]\n", "list of type other than map: 1"),
        ("domain: d\ndescriptors: x\n", "error loading config file"),
    ];
    for (text, expected) in cases {
        let message = refusal(text);
        assert!(message.contains(expected), "{text:?}: {message}");
    }
    let duplicate = Config::from_files([("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")])
        .expect_err("a domain in two files");
    assert_eq!(
        duplicate.to_string(),
        "b.yaml: duplicate domain 'd' in config file"
    );
}
