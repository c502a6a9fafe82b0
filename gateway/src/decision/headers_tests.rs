//! The headers tb-rls sends against fixtures/headers.json.
use super::*;

use redis_tb_client::BucketResult;
use tb_test_support::{fixture, fixture_number as number, LONE_SURROGATE};

#[test]
fn headers_follow_the_shared_fixture() {
    let fixture = fixture("headers.json");
    assert_eq!(fixture["max_integer"].as_i64(), Some(headers::MAX_INTEGER));
    let cases = fixture["cases"].as_array().expect("cases");
    for case in cases {
        let about = case["about"].as_str().expect("about");
        let format: Standard = case["standard"]
            .as_str()
            .and_then(|name| name.parse().ok())
            .unwrap_or_else(|| panic!("{about}: a standard"));
        let int = |value: &serde_json::Value| value.as_i64().expect("an integer");
        let buckets = case["buckets"].as_array().expect("buckets");
        let policies: Vec<Policy<'_>> = buckets
            .iter()
            .map(|bucket| Policy {
                name: bucket["name"].as_str().expect("a name"),
                rate: number(&bucket["rate"]),
                burst: number(&bucket["burst"]),
            })
            .collect();
        let allowed = case["allowed"].as_bool().expect("allowed");
        let reply = AcquiredEach {
            allowed,
            limiting_index: usize::try_from(int(&case["limiting_index"])).expect("an index"),
            buckets: buckets
                .iter()
                .map(|bucket| BucketResult {
                    fits: bucket["fits"].as_bool().expect("fits"),
                    remaining: int(&bucket["remaining"]),
                    retry_after_ms: int(&bucket["retry_after_ms"]),
                    reset_after_ms: int(&bucket["reset_after_ms"]),
                })
                .collect(),
        };
        let got: Vec<(String, String)> =
            response_headers(format, &HeaderNames::default(), &policies, &reply, !allowed)
                .into_iter()
                .map(|header| (header.key, header.value))
                .collect();
        let expected: Vec<(String, String)> = case["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .map(|pair| {
                let part = |index: usize| pair[index].as_str().expect("a string").to_owned();
                (part(0), part(1))
            })
            .collect();
        assert_eq!(got, expected, "{about}");
    }
}

#[test]
fn a_refusal_let_through_has_no_retry_after_and_legacy_names_are_the_chosen_ones() {
    let policies = [Policy {
        name: "per-user",
        rate: 10.0,
        burst: 20.0,
    }];
    let reply = AcquiredEach {
        allowed: false,
        limiting_index: 0,
        buckets: vec![BucketResult {
            fits: false,
            remaining: 0,
            retry_after_ms: 1500,
            reset_after_ms: 2000,
        }],
    };
    let names = HeaderNames {
        limit: "X-RateLimit-Limit".to_owned(),
        remaining: "X-RateLimit-Remaining".to_owned(),
        reset: "X-RateLimit-Reset".to_owned(),
    };
    let keys = |refused: bool| -> Vec<String> {
        response_headers(Standard::Legacy, &names, &policies, &reply, refused)
            .into_iter()
            .map(|header| format!("{}: {}", header.key, header.value))
            .collect()
    };
    assert_eq!(
        keys(true),
        [
            "X-RateLimit-Limit: 20",
            "X-RateLimit-Remaining: 0",
            "X-RateLimit-Reset: 2",
            "Retry-After: 2"
        ]
    );
    assert_eq!(keys(false).len(), 3);
}

#[test]
fn a_name_outside_printable_ascii_never_reaches_a_header() {
    // fixtures/headers.json's names: the accepted ones go out as they are (quote and backslash escaped); the
    // packages refuse the others when a limit is built, and tb-rls, whose override names hold a request's keys,
    // sends their other bytes as %XX: nothing outside 0x20-0x7E passes, and no name ends its string early.
    let fixture = fixture("headers.json");
    let names = &fixture["names"];
    let field = |name: &str| {
        let policy = Policy {
            name,
            rate: 1.0,
            burst: 1.0,
        };
        let reply = AcquiredEach {
            allowed: true,
            limiting_index: 0,
            buckets: vec![BucketResult {
                fits: true,
                remaining: 1,
                retry_after_ms: 0,
                reset_after_ms: 0,
            }],
        };
        response_headers(
            Standard::Draft,
            &HeaderNames::default(),
            &[policy],
            &reply,
            false,
        )
        .into_iter()
        .next()
        .expect("a RateLimit-Policy field")
        .value
    };
    for name in names["accepted"].as_array().expect("accepted") {
        let name = name.as_str().expect("a string");
        let quoted = name.replace('\\', "\\\\").replace('"', "\\\"");
        assert_eq!(field(name), format!("\"{quoted}\";q=1;w=1"), "{name:?}");
    }
    let refused = names["refused"].as_array().expect("refused");
    let mut checked = 0;
    for name in refused
        .iter()
        .filter_map(|name| name.as_str())
        .filter(|name| !name.is_empty() && !name.contains(LONE_SURROGATE))
    {
        let value = field(name);
        assert!(
            value.bytes().all(|byte| (0x20..=0x7E).contains(&byte)),
            "{name:?}: {value:?}"
        );
        let inner = value
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix("\";q=1;w=1"))
            .expect("one sf-string");
        assert!(
            !inner.replace("\\\\", "").replace("\\\"", "").contains('"'),
            "{value}"
        );
        assert!(inner.contains('%'), "{name:?} went out as {value:?}");
        checked += 1;
    }
    assert!(checked >= 10, "{checked} names");
}
