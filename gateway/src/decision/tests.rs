//! Planning and answering, with hand-written module replies: costs, bucket keys, statuses, shadow mode and
//! headers.
use super::*;

use redis_tb_client::{AcquiredEach, BucketResult};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::{Duration, UInt64Value};

const CONFIG: &str = "\
domain: web
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 10, burst: 20 }
  - key: generic_key
    value: global
    rate_limit: { unit: minute, requests_per_unit: 600, name: global }
  - key: internal
    rate_limit: { unlimited: true }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: canary
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: old
    rate_limit: { unit: second, requests_per_unit: 1, name: old }
  - key: new
    rate_limit: { unit: second, requests_per_unit: 5, name: new, replaces: [{ name: old }] }
";

fn config() -> Config {
    Config::from_yaml("web.yaml", CONFIG).expect("parses")
}

fn descriptor(entries: &[(&str, &str)], hits_addend: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|&(key, value)| Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            })
            .collect(),
        hits_addend: hits_addend.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "web".to_owned(),
        descriptors,
        hits_addend,
    }
}

fn row(fits: bool, remaining: i64, retry_after_ms: i64, reset_after_ms: i64) -> BucketResult {
    BucketResult {
        fits,
        remaining,
        retry_after_ms,
        reset_after_ms,
    }
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|header| header.key == name)
        .map(|header| header.value.as_str())
}

/// Plans `user=a` and `generic_key=global` (two buckets, no addend) and answers them with one call's `rows`.
fn respond_two(options: &Options, allowed: bool, rows: Vec<BucketResult>) -> Verdict {
    let plan = plan(
        &config(),
        options,
        &request(
            vec![
                descriptor(&[("user", "a")], None),
                descriptor(&[("generic_key", "global")], None),
            ],
            0,
        ),
    )
    .expect("plans");
    plan.respond(
        options,
        Some(&AcquiredEach {
            allowed,
            limiting_index: 0,
            buckets: rows,
        }),
    )
}

#[test]
fn cost_is_the_descriptors_addend_else_the_requests_else_one() {
    let options = Options::default();
    let plan = plan(
        &config(),
        &options,
        &request(
            vec![
                descriptor(&[("user", "a")], Some(5)),
                descriptor(&[("user", "b")], None),
                descriptor(&[("user", "c")], Some(0)),
            ],
            3,
        ),
    )
    .expect("plans");
    let costs: Vec<u64> = plan.buckets.iter().map(|bucket| bucket.cost).collect();
    assert_eq!(costs, vec![5, 3, 0]);
    let default = super::plan(
        &config(),
        &options,
        &request(vec![descriptor(&[("user", "a")], None)], 0),
    )
    .expect("plans");
    assert_eq!(default.buckets.first().map(|bucket| bucket.cost), Some(1));
}

#[test]
fn command_buckets_are_key_rate_burst_cost_per_bucket() {
    let plan = plan(
        &config(),
        &Options::default(),
        &request(
            vec![
                descriptor(&[("user", "alice")], None),
                descriptor(&[("generic_key", "global")], Some(2)),
            ],
            0,
        ),
    )
    .expect("plans");
    assert_eq!(
        plan.command_buckets(),
        vec![
            BucketWithCost {
                key: "tb-rls:{web}:user=alice",
                rate: 10.0,
                burst: 20.0,
                cost: 1.0,
            },
            BucketWithCost {
                key: "tb-rls:{web}:generic_key=global",
                rate: 10.0,
                burst: 600.0,
                cost: 2.0,
            },
        ]
    );
}

#[test]
fn a_cost_above_every_burst_goes_out_exact() {
    assert_eq!(cost_tokens(7), 7.0);
    assert_eq!(cost_tokens(u64::from(u32::MAX)), 4_294_967_295.0);
    assert_eq!(cost_tokens(u64::MAX), 4_294_967_296.0);
}

#[test]
fn keys_escape_separators_so_entries_never_collide() {
    let one = descriptor_key("p:", "d", &[("a".to_owned(), "b:c=d".to_owned())]);
    let two = descriptor_key(
        "p:",
        "d",
        &[
            ("a".to_owned(), "b".to_owned()),
            ("c".to_owned(), "d".to_owned()),
        ],
    );
    assert_eq!(one, "p:{d}:a=b%3Ac%3Dd");
    assert_eq!(two, "p:{d}:a=b:c=d");
    assert_eq!(descriptor_key("", "x}y", &[]), "{x%7Dy}");
}

#[test]
fn unmatched_unlimited_and_replaced_limits_send_no_bucket() {
    let plan = plan(
        &config(),
        &Options::default(),
        &request(
            vec![
                descriptor(&[("nothing", "x")], None),
                descriptor(&[("internal", "x")], None),
                descriptor(&[("old", "x")], None),
                descriptor(&[("new", "x")], None),
            ],
            0,
        ),
    )
    .expect("plans");
    assert_eq!(
        plan.slots,
        vec![
            Slot::NoLimit,
            Slot::Unlimited,
            Slot::NoLimit,
            Slot::Bucket(0)
        ]
    );
    assert_eq!(plan.buckets.len(), 1);
    let verdict = plan.respond(
        &Options::default(),
        Some(&AcquiredEach {
            allowed: true,
            limiting_index: 0,
            buckets: vec![row(true, 4, 0, 200)],
        }),
    );
    let statuses = &verdict.response.statuses;
    assert_eq!(statuses.len(), 4);
    assert_eq!(
        statuses.get(1).map(|status| status.limit_remaining),
        Some(u32::MAX)
    );
    assert!(statuses
        .first()
        .is_some_and(|status| status.current_limit.is_none()));
}

#[test]
fn one_bucket_named_twice_is_sent_once_with_the_costs_added() {
    let plan = plan(
        &config(),
        &Options::default(),
        &request(
            vec![
                descriptor(&[("user", "a")], Some(2)),
                descriptor(&[("user", "a")], Some(3)),
            ],
            0,
        ),
    )
    .expect("plans");
    assert_eq!(plan.buckets.len(), 1);
    assert_eq!(plan.buckets.first().map(|bucket| bucket.cost), Some(5));
    assert_eq!(plan.slots, vec![Slot::Bucket(0), Slot::Bucket(0)]);
}

#[test]
fn zero_requests_per_unit_refuses_without_redis() {
    let plan = plan(
        &config(),
        &Options::default(),
        &request(vec![descriptor(&[("blocked", "x")], None)], 0),
    )
    .expect("plans");
    assert!(plan.buckets.is_empty());
    let verdict = plan.respond(&Options::default(), None);
    assert!(verdict.over_limit);
    assert_eq!(verdict.response.overall_code, i32::from(Code::OverLimit));
}

#[test]
fn a_route_override_sets_the_rate() {
    let mut overridden = descriptor(&[("anything", "x")], None);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 42,
        unit: Unit::Hour.proto_value(),
    });
    let plan = plan(
        &config(),
        &Options::default(),
        &request(vec![overridden], 0),
    )
    .expect("plans");
    let bucket = plan.buckets.first().expect("one bucket");
    assert_eq!((bucket.burst, bucket.rate_per_sec), (42, 42.0 / 3600.0));
    // Its name in headers carries the keys, never the request's values.
    assert_eq!(bucket.limit.path, "web.anything");
    let options = Options {
        headers: Standard::Draft,
        ..Options::default()
    };
    let verdict = plan.respond(
        &options,
        Some(&AcquiredEach {
            allowed: true,
            limiting_index: 0,
            buckets: vec![row(true, 41, 0, 85_715)],
        }),
    );
    let policy = header(&verdict.response, "RateLimit-Policy").expect("a policy");
    assert_eq!(policy, "\"web.anything\";q=42;w=3600");
}

#[test]
fn a_route_override_in_an_unconfigured_domain_is_no_limit() {
    // envoyproxy/ratelimit's TestConfigLimitOverride: a domain without configuration has no limits, override or not.
    let mut overridden = descriptor(&[("anything", "x")], None);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 42,
        unit: Unit::Hour.proto_value(),
    });
    let mut elsewhere = request(vec![overridden], 0);
    elsewhere.domain = "unknown".to_owned();
    let plan = plan(&config(), &Options::default(), &elsewhere).expect("plans");
    assert!(plan.buckets.is_empty());
    assert_eq!(plan.slots, vec![Slot::NoLimit]);
}

#[test]
fn bad_requests_are_refused() {
    let options = Options::default();
    let mut empty_domain = request(vec![descriptor(&[("user", "a")], None)], 0);
    empty_domain.domain.clear();
    assert_eq!(
        plan(&config(), &options, &empty_domain),
        Err(PlanError::EmptyDomain)
    );
    assert_eq!(
        plan(&config(), &options, &request(vec![], 0)),
        Err(PlanError::NoDescriptors)
    );
    let many: Vec<RateLimitDescriptor> = (0..=MAX_BUCKETS)
        .map(|index| descriptor(&[("user", &index.to_string())], None))
        .collect();
    assert!(matches!(
        plan(&config(), &options, &request(many, 0)),
        Err(PlanError::TooManyBuckets(_))
    ));
}

#[test]
fn statuses_carry_code_limit_remaining_and_reset() {
    let plan = plan(
        &config(),
        &Options::default(),
        &request(
            vec![
                descriptor(&[("user", "a")], None),
                descriptor(&[("generic_key", "global")], None),
            ],
            0,
        ),
    )
    .expect("plans");
    let verdict = plan.respond(
        &Options::default(),
        Some(&AcquiredEach {
            allowed: false,
            limiting_index: 0,
            buckets: vec![row(false, 0, 100, 2_000), row(true, 599, 0, 1_500)],
        }),
    );
    let response = &verdict.response;
    assert_eq!(response.overall_code, i32::from(Code::OverLimit));
    let user = response.statuses.first().expect("user status");
    assert_eq!(user.code, i32::from(Code::OverLimit));
    assert_eq!(
        user.current_limit,
        Some(RateLimit {
            name: String::new(),
            requests_per_unit: 10,
            unit: Unit::Second.proto_value()
        })
    );
    assert_eq!(user.limit_remaining, 0);
    assert_eq!(
        user.duration_until_reset,
        Some(Duration {
            seconds: 2,
            nanos: 0
        })
    );
    let global = response.statuses.get(1).expect("global status");
    assert_eq!(global.code, i32::from(Code::Ok));
    assert_eq!(global.limit_remaining, 599);
    assert_eq!(
        global.duration_until_reset,
        Some(Duration {
            seconds: 1,
            nanos: 500_000_000
        })
    );
    // No rate-limit fields unless asked; a refusal that waiting cures still says when (docs/headers.md).
    let fields: Vec<(&str, &str)> = response
        .response_headers_to_add
        .iter()
        .map(|header| (header.key.as_str(), header.value.as_str()))
        .collect();
    assert_eq!(fields, vec![("Retry-After", "1")]);
}

#[test]
fn a_shadow_misfit_is_taken_out_of_the_charge_and_answered_ok() {
    let mut plan = plan(
        &config(),
        &Options::default(),
        &request(
            vec![
                descriptor(&[("user", "a")], None),
                descriptor(&[("canary", "x")], None),
            ],
            0,
        ),
    )
    .expect("plans");
    let refused = AcquiredEach {
        allowed: false,
        limiting_index: 1,
        buckets: vec![row(true, 19, 0, 0), row(false, 0, 900, 900)],
    };
    assert!(
        plan.unshadow(&refused),
        "only a shadow bucket refused: call again"
    );
    assert_eq!(
        plan.command_buckets().get(1).map(|bucket| bucket.cost),
        Some(0.0)
    );
    let allowed = AcquiredEach {
        allowed: true,
        limiting_index: 1,
        buckets: vec![row(true, 19, 0, 100), row(true, 0, 0, 900)],
    };
    assert!(!plan.unshadow(&allowed));
    let verdict = plan.respond(&Options::default(), Some(&allowed));
    assert!(!verdict.over_limit);
    assert_eq!(verdict.shadow_hits, 1);
    assert!(verdict
        .response
        .statuses
        .iter()
        .all(|status| status.code == i32::from(Code::Ok)));
}

#[test]
fn a_real_misfit_beside_a_shadow_one_refuses() {
    let mut plan = plan(
        &config(),
        &Options::default(),
        &request(
            vec![
                descriptor(&[("user", "a")], None),
                descriptor(&[("canary", "x")], None),
            ],
            0,
        ),
    )
    .expect("plans");
    let refused = AcquiredEach {
        allowed: false,
        limiting_index: 0,
        buckets: vec![row(false, 0, 50, 2_000), row(false, 0, 900, 900)],
    };
    assert!(!plan.unshadow(&refused));
    assert!(plan.respond(&Options::default(), Some(&refused)).over_limit);
}

#[test]
fn global_shadow_mode_never_refuses() {
    let options = Options {
        global_shadow: true,
        ..Options::default()
    };
    let plan = plan(
        &config(),
        &options,
        &request(vec![descriptor(&[("user", "a")], None)], 0),
    )
    .expect("plans");
    let verdict = plan.respond(
        &options,
        Some(&AcquiredEach {
            allowed: false,
            limiting_index: 0,
            buckets: vec![row(false, 0, 50, 2_000)],
        }),
    );
    assert!(!verdict.over_limit);
    assert_eq!(verdict.response.overall_code, i32::from(Code::Ok));
    // As envoyproxy/ratelimit's SHADOW_MODE: the descriptor keeps OVER_LIMIT, only the overall code is OK.
    let codes: Vec<i32> = verdict
        .response
        .statuses
        .iter()
        .map(|status| status.code)
        .collect();
    assert_eq!(codes, vec![i32::from(Code::OverLimit)]);
    assert_eq!(verdict.shadow_hits, 1);
}

#[test]
fn draft_headers_have_one_item_per_bucket_and_retry_after() {
    let options = Options {
        headers: Standard::Both,
        ..Options::default()
    };
    let verdict = respond_two(
        &options,
        false,
        vec![row(false, 0, 1_100, 2_000), row(true, 599, 0, 1_500)],
    );
    let response = &verdict.response;
    assert_eq!(
        header(response, "RateLimit-Policy"),
        Some("\"web.user\";q=20;w=2, \"global\";q=600;w=60")
    );
    assert_eq!(
        header(response, "RateLimit"),
        Some("\"web.user\";r=0;t=2, \"global\";r=599;t=2")
    );
    assert_eq!(header(response, "RateLimit-Limit"), Some("20"));
    assert_eq!(header(response, "RateLimit-Remaining"), Some("0"));
    assert_eq!(header(response, "RateLimit-Reset"), Some("2"));
    assert_eq!(header(response, "Retry-After"), Some("2"));
}

#[test]
fn legacy_headers_follow_the_fewest_tokens_and_their_configured_names() {
    let options = Options {
        headers: Standard::Legacy,
        header_names: HeaderNames {
            limit: "X-RateLimit-Limit".to_owned(),
            remaining: "X-RateLimit-Remaining".to_owned(),
            reset: "X-RateLimit-Reset".to_owned(),
        },
        ..Options::default()
    };
    let verdict = respond_two(
        &options,
        true,
        vec![row(true, 3, 0, 1_700), row(true, 599, 0, 100)],
    );
    let response = &verdict.response;
    assert_eq!(header(response, "X-RateLimit-Limit"), Some("20"));
    assert_eq!(header(response, "X-RateLimit-Remaining"), Some("3"));
    assert_eq!(header(response, "X-RateLimit-Reset"), Some("2"));
    assert_eq!(header(response, "RateLimit-Policy"), None);
    assert_eq!(header(response, "Retry-After"), None);
}

#[test]
fn a_cost_above_burst_gets_no_retry_after() {
    let options = Options {
        headers: Standard::Draft,
        ..Options::default()
    };
    let plan = plan(
        &config(),
        &options,
        &request(vec![descriptor(&[("user", "a")], Some(50))], 0),
    )
    .expect("plans");
    let verdict = plan.respond(
        &options,
        Some(&AcquiredEach {
            allowed: false,
            limiting_index: 0,
            buckets: vec![row(false, 20, -1, 0)],
        }),
    );
    assert!(verdict.over_limit);
    assert_eq!(header(&verdict.response, "Retry-After"), None);
}

#[test]
fn bucket_keys_match_the_shared_fixture() {
    // fixtures/keys.json's "gateway" section: awkward values, domains and prefixes, and their keys.
    let fixture = tb_test_support::fixture("keys.json");
    let rows = fixture["gateway"]["keys"]
        .as_array()
        .expect("a gateway section");
    assert!(rows.len() >= 10);
    let mut seen = std::collections::HashSet::new();
    for row in rows {
        let text = |field: &str| row[field].as_str().expect("a string").to_owned();
        let entries: Vec<(String, String)> = row["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|pair| {
                let part = |index: usize| pair[index].as_str().expect("a string").to_owned();
                (part(0), part(1))
            })
            .collect();
        let key = descriptor_key(&text("prefix"), &text("domain"), &entries);
        assert_eq!(key, text("key"), "{entries:?}");
        // One `{` and one `}` after the prefix: the hash tag is exactly the escaped domain.
        let tagged = key
            .strip_prefix(text("prefix").as_str())
            .expect("the prefix");
        assert_eq!(tagged.matches('{').count(), 1, "{key}");
        assert_eq!(tagged.matches('}').count(), 1, "{key}");
        assert!(seen.insert(key), "two rows share a key");
    }
}

#[test]
fn a_domain_is_escaped_as_the_packages_escape_an_identity() {
    // fixtures/keys.json's "keys" section: the packages' identity rule, `<prefix>{<tag>}:<limit>`. A domain
    // without `:` or `=` (which tb-rls escapes besides, as its entry separators) gets the identity's tag. The rows
    // holding a lone surrogate (JSON text may, a Rust string may not), no identity and the empty one are left out:
    // tb-rls refuses an empty domain.
    let fixture = tb_test_support::fixture("keys.json");
    let mut checked = 0;
    for row in fixture["keys"].as_array().expect("a keys section") {
        let Some(identity) = row["identity"].as_str().filter(|identity| {
            !identity.is_empty() && !identity.contains(tb_test_support::LONE_SURROGATE)
        }) else {
            continue;
        };
        if identity.contains([':', '=']) {
            continue;
        }
        let prefix = row["prefix"].as_str().expect("a prefix");
        let limit = row["limit"].as_str().expect("a limit");
        let expected = row["key"].as_str().expect("a key");
        let tagged = descriptor_key(prefix, identity, &[]) + ":" + limit;
        assert_eq!(tagged, expected, "{identity:?}");
        checked += 1;
    }
    assert!(checked >= 20, "{checked} identities");
}

#[test]
fn quota_descriptors_refuse_only_when_every_one_is_over() {
    // envoyproxy/ratelimit's quota tests (test/service/ratelimit_test.go), as token buckets: `n` an ordinary
    // limit, `q1` and `q2` in quota mode; which buckets fit the first call; then the codes and the overall code.
    let config = Config::from_yaml(
        "q.yaml",
        "domain: web\ndescriptors:\n  - key: n\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n  - key: q1\n    quota_mode: true\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: q2\n    quota_mode: true\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: g\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .expect("parses");
    let (ok, over) = (i32::from(Code::Ok), i32::from(Code::OverLimit));
    // (name, keys, global shadow, global quota, fits on the first call, expected codes, expected overall)
    type Case = (
        &'static str,
        [&'static str; 2],
        bool,
        bool,
        [bool; 2],
        [i32; 2],
        i32,
    );
    let cases: [Case; 8] = [
        (
            "PerDescriptorQuotaMode",
            ["n", "q1"],
            false,
            false,
            [false, true],
            [over, ok],
            over,
        ),
        (
            "MixedPerDescriptorModes",
            ["n", "q1"],
            false,
            false,
            [true, false],
            [ok, over],
            over,
        ),
        (
            "MixedPerDescriptorModesUnderLimit",
            ["n", "q1"],
            false,
            false,
            [true, true],
            [ok, ok],
            ok,
        ),
        (
            "QuotaModeOnlyAllOverTheLimit",
            ["q1", "q2"],
            false,
            false,
            [false, false],
            [over, over],
            over,
        ),
        (
            "QuotaModeOnlySomeOverTheLimit",
            ["q1", "q2"],
            false,
            false,
            [false, true],
            [over, ok],
            ok,
        ),
        (
            "QuotaModeWithShadowMode",
            ["q1", "q2"],
            true,
            false,
            [false, false],
            [over, over],
            ok,
        ),
        (
            "MixedModeWithShadowMode",
            ["n", "q1"],
            true,
            false,
            [false, false],
            [over, over],
            ok,
        ),
        (
            "GlobalQuotaMode",
            ["n", "g"],
            false,
            true,
            [false, false],
            [over, over],
            over,
        ),
    ];
    for (name, keys, global_shadow, global_quota, fits, codes, overall) in cases {
        let options = Options {
            global_shadow,
            global_quota,
            ..Options::default()
        };
        let mut planned = plan(
            &config,
            &options,
            &request(
                keys.iter()
                    .map(|&key| descriptor(&[(key, "x")], None))
                    .collect(),
                0,
            ),
        )
        .expect("plans");
        let first = AcquiredEach {
            allowed: fits.iter().all(|&fit| fit),
            limiting_index: 0,
            buckets: fits
                .iter()
                .map(|&fit| row(fit, i64::from(fit), if fit { 0 } else { 1_000 }, 6_000))
                .collect(),
        };
        // When the misfits may be let through, they are charged 0 and the call is made again: it fits.
        let reply = if planned.unshadow(&first) {
            AcquiredEach {
                allowed: true,
                limiting_index: 0,
                buckets: fits.iter().map(|_| row(true, 1, 0, 6_000)).collect(),
            }
        } else {
            first
        };
        let verdict = planned.respond(&options, Some(&reply));
        let got: Vec<i32> = verdict
            .response
            .statuses
            .iter()
            .map(|status| status.code)
            .collect();
        assert_eq!(got, codes.to_vec(), "{name}");
        assert_eq!(verdict.response.overall_code, overall, "{name}");
    }
}
