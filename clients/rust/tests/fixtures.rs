//! The shared rules, tested with the repository's fixtures (the files the Python and Node suites read), each
//! through the crate's own exported function: bucket keys and identities (`fixtures/keys.json`), the failure
//! table (`fixtures/failures.json`), the errors that pick a backend (`fixtures/backends.json`), the header mapping (`fixtures/headers.json`) and what a limit accepts
//! (`fixtures/limits.json`), the deadline gate's probe delays and bound on calls in flight
//! (`fixtures/deadlines.json`).

use std::io;

use redis_tb_client::failure::{self, Action};
use redis_tb_client::headers::{self, Policy, Standard};
use redis_tb_client::keys::{self, Ipv6Subnet};
use redis_tb_client::{
    probe_delay, AcquiredEach, BucketResult, Client, Error, Limit, RateLimitLayer, MAX_IN_FLIGHT,
    STALL_FRACTION,
};
use serde_json::Value;
use tb_test_support::{fixture, fixture_number, LONE_SURROGATE};

fn cases<'a>(value: &'a Value, field: &str) -> &'a Vec<Value> {
    value[field].as_array().expect("an array of cases")
}

fn text(value: &Value) -> &str {
    value.as_str().expect("a string")
}

#[test]
fn bucket_keys_follow_the_shared_layout() {
    let fixture = fixture("keys.json");
    for case in cases(&fixture, "keys") {
        if case["identity"]
            .as_str()
            .is_some_and(|identity| identity.contains(LONE_SURROGATE))
        {
            continue;
        }
        let key = keys::bucket_key(
            text(&case["prefix"]),
            case["identity"].as_str(),
            text(&case["limit"]),
        );
        assert_eq!(key, text(&case["key"]), "{case}");
    }
}

#[test]
fn peer_addresses_become_the_shared_identities() {
    let fixture = fixture("keys.json");
    for case in cases(&fixture, "ip_identity") {
        let bits = case["ipv6_subnet"].as_u64().expect("a prefix length");
        let subnet = Ipv6Subnet::new(u8::try_from(bits).expect("a u8")).expect("a valid subnet");
        let identity = keys::ip_identity(case["address"].as_str(), subnet);
        assert_eq!(identity.as_deref(), case["identity"].as_str(), "{case}");
    }
}

#[test]
fn ipv6_subnets_outside_1_to_64_are_refused() {
    let fixture = fixture("keys.json");
    let mut checked = 0;
    for refused in cases(&fixture, "ipv6_subnet_refused") {
        // Non-integers, negatives and booleans cannot be written as the u8 the constructor takes.
        if let Some(bits) = refused.as_u64().and_then(|bits| u8::try_from(bits).ok()) {
            let err = Ipv6Subnet::new(bits).expect_err("refused");
            assert!(err.to_string().contains("ipv6_subnet"), "{err}");
            checked += 1;
        }
    }
    assert!(checked >= 3);
}

/// A server's error reply, as redis-rs hands it over.
fn reply_error(text: &str) -> Error {
    match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
        Ok(redis::Value::ServerError(err)) => Error::Redis(err.into()),
        other => panic!("{text}: {other:?}"),
    }
}

/// The error this crate meets for a client-side condition of the table.
fn condition_error(row: &str) -> Error {
    match row {
        "connection refused" => {
            Error::Redis(io::Error::from(io::ErrorKind::ConnectionRefused).into())
        }
        "connection reset" => Error::Redis(io::Error::from(io::ErrorKind::ConnectionReset).into()),
        "timeout" => Error::Timeout(std::time::Duration::from_millis(1000)),
        "any other error" => Error::Protocol("an unexpected error".to_owned()),
        "cluster unreachable" => Error::Redis(redis::RedisError::from((
            redis::ErrorKind::ClusterConnectionNotFound,
            "no node serves the slot",
        ))),
        other => panic!("no condition for row {other}"),
    }
}

#[test]
fn every_failure_lands_in_its_row_of_the_table() {
    let fixture = fixture("failures.json");
    for case in cases(&fixture, "cases") {
        let row = text(&case["row"]);
        let err = match case["reply"].as_str() {
            Some(reply) => {
                let err = reply_error(reply);
                assert_eq!(
                    err.server_text().as_deref(),
                    Some(reply),
                    "the wire text survives"
                );
                err
            }
            None => condition_error(row),
        };
        let found = err.failure();
        let action = match text(&case["action"]) {
            "fail-mode" => Action::FailMode,
            "error-fail-mode" => Action::ErrorFailMode,
            "reload-retry" => Action::ReloadRetry,
            "script-retry" => Action::ScriptRetry,
            other => panic!("unknown action {other}"),
        };
        assert_eq!(found.action, action, "{case}");
        assert_eq!(found.row, row, "{case}");
        assert_eq!(found.class, text(&case["class"]), "{case}");
    }
}

#[test]
fn timeouts_and_lost_connections_stop_the_calls_that_follow_and_error_replies_do_not() {
    for row in ["connection refused", "connection reset", "timeout"] {
        assert!(condition_error(row).stops_calls(), "{row}");
    }
    for reply in [
        "OOM command not allowed when used memory > 'maxmemory'.",
        "READONLY You can't write",
    ] {
        assert!(!reply_error(reply).stops_calls(), "{reply}");
    }
}

#[test]
fn backend_errors_are_read_as_the_other_packages_read_them() {
    let fixture = fixture("backends.json");
    for case in cases(&fixture, "cases") {
        let reply = text(&case["reply"]);
        let class = text(&case["class"]);
        let found = [
            ("unknown-command", failure::is_unknown_command(reply)),
            (
                "functions-unavailable",
                failure::is_functions_unavailable(reply),
            ),
            ("function-missing", failure::is_function_missing(reply)),
            ("library-loaded", failure::is_library_loaded(reply)),
            ("time-refused", failure::is_time_refused(reply)),
        ];
        for (name, yes) in found {
            // Every unknown-command case is also functions-unavailable.
            let expected =
                name == class || (name == "functions-unavailable" && class == "unknown-command");
            assert_eq!(yes, expected, "{name} for {case}");
        }
    }
}

fn bucket_result(value: &Value, fits: bool) -> BucketResult {
    BucketResult {
        fits,
        remaining: value["remaining"].as_i64().expect("remaining"),
        retry_after_ms: value["retry_after_ms"].as_i64().expect("retry_after_ms"),
        reset_after_ms: value["reset_after_ms"].as_i64().expect("reset_after_ms"),
    }
}

fn standard(name: &str) -> Standard {
    name.parse().expect("a standard")
}

/// The names fixtures/headers.json's `standards` accepts parse; the ones it refuses do not (the other packages
/// refuse them when their middleware is built).
#[test]
fn standards_parse_as_the_fixture_says() {
    let fixture = fixture("headers.json");
    let standards = &fixture["standards"];
    for name in cases(standards, "accepted") {
        assert!(text(name).parse::<Standard>().is_ok(), "{name}");
    }
    for name in cases(standards, "refused") {
        if let Some(name) = name.as_str() {
            let refused = name.parse::<Standard>().expect_err(name);
            assert_eq!(
                refused.to_string(),
                "standard must be one of both, draft, legacy, none"
            );
        }
    }
}

#[test]
fn every_decision_gets_the_shared_header_fields() {
    let fixture = fixture("headers.json");
    for case in cases(&fixture, "cases") {
        let buckets = cases(case, "buckets");
        let policies: Vec<Policy<'_>> = buckets
            .iter()
            .map(|bucket| Policy {
                name: text(&bucket["name"]),
                rate: fixture_number(&bucket["rate"]),
                burst: fixture_number(&bucket["burst"]),
            })
            .collect();
        let reply = AcquiredEach {
            allowed: case["allowed"].as_bool().expect("allowed"),
            limiting_index: case["limiting_index"].as_u64().expect("index") as usize,
            buckets: buckets
                .iter()
                .map(|bucket| {
                    // remaining may be 2^63-1, which serde_json keeps as an i64.
                    bucket_result(bucket, bucket["fits"].as_bool().expect("fits"))
                })
                .collect(),
        };
        let found =
            headers::rate_limit_headers(&policies, &reply, standard(text(&case["standard"])));
        let expected: Vec<(String, String)> = cases(case, "headers")
            .iter()
            .map(|pair| (text(&pair[0]).to_owned(), text(&pair[1]).to_owned()))
            .collect();
        let found: Vec<(String, String)> = found
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        assert_eq!(found, expected, "{}", case["about"]);
    }
}

#[test]
fn limit_names_the_header_cannot_hold_are_refused() {
    let fixture = fixture("headers.json");
    for name in cases(&fixture["names"], "accepted") {
        assert!(Limit::new(text(name), 1.0, 1.0).is_ok(), "{name}");
    }
    for name in cases(&fixture["names"], "refused") {
        if text(name).contains(LONE_SURROGATE) {
            continue;
        }
        let err = Limit::new(text(name), 1.0, 1.0).expect_err("refused");
        assert!(err.to_string().contains("name"), "{err}");
    }
}

/// A number of fixtures/limits.json: `Some` for a number or the strings standing for infinities and NaN; `None`
/// for what Rust's `f64` cannot be handed (text, a boolean, null).
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) if text == "Infinity" => Some(f64::INFINITY),
        Value::String(text) if text == "-Infinity" => Some(f64::NEG_INFINITY),
        Value::String(text) if text == "NaN" => Some(f64::NAN),
        _ => None,
    }
}

#[tokio::test]
async fn limits_are_accepted_and_refused_as_the_shared_cases_say() {
    let fixture = fixture("limits.json");
    let client = Client::new("redis://127.0.0.1:1/").expect("a client (never connected)");
    let mut checked = 0;
    'cases: for case in cases(&fixture, "cases") {
        let mut limits = Vec::new();
        let mut refused: Option<(usize, String)> = None;
        for (index, given) in cases(case, "limits").iter().enumerate() {
            let (Some(rate), Some(burst)) = (number(&given["rate"]), number(&given["burst"]))
            else {
                continue 'cases;
            };
            let cost = match given.get("cost") {
                None => 1.0,
                Some(cost) => match number(cost) {
                    Some(cost) => cost,
                    None => continue 'cases,
                },
            };
            match Limit::new(text(&given["name"]), rate, burst).and_then(|limit| limit.cost(cost)) {
                Ok(limit) => limits.push(limit),
                Err(err) => {
                    refused = Some((index, err.to_string()));
                    break;
                }
            }
        }
        if refused.is_none() {
            if let Err(err) = RateLimitLayer::builder(client.clone(), limits).build() {
                refused = Some((usize::MAX, err.to_string()));
            }
        }
        match (&case["refused"], refused) {
            (Value::Null, None) => {}
            (Value::Null, Some((_, err))) => panic!("{}: refused: {err}", case["about"]),
            (expected, None) => panic!("{}: accepted, expected {expected}", case["about"]),
            (expected, Some((index, err))) => {
                let field = text(&expected["field"]);
                assert!(
                    err.contains(field),
                    "{}: {err} names no {field}",
                    case["about"]
                );
                if let Some(wanted) = expected["index"].as_u64() {
                    // Duplicate names are found when the layer is built, from the list as a whole.
                    if index != usize::MAX {
                        assert_eq!(index as u64, wanted, "{}", case["about"]);
                    }
                }
            }
        }
        checked += 1;
    }
    assert!(checked >= 20, "{checked} cases checked");
}

#[test]
fn the_deadline_gate_follows_its_fixture() {
    let fixture = fixture("deadlines.json");
    assert_eq!(
        Some(MAX_IN_FLIGHT as u64),
        fixture["max_in_flight"].as_u64()
    );
    assert_eq!(Some(STALL_FRACTION), fixture["stall_fraction"].as_f64());
    let delays: Vec<u64> = fixture["probe_delays_ms"]
        .as_array()
        .expect("probe_delays_ms")
        .iter()
        .map(|delay| delay.as_u64().expect("a delay in ms"))
        .collect();
    let last = *delays.last().expect("a delay");
    for attempt in 0..delays.len() + 3 {
        let expected = delays.get(attempt).copied().unwrap_or(last);
        assert_eq!(
            probe_delay(attempt).as_millis(),
            u128::from(expected),
            "probe {attempt}"
        );
    }
}

/// An option's value of fixtures/options.json as `T`, or `None` where Rust's types cannot hold it (a string, a
/// boolean, null, a fraction for an integer): the type system refuses those before `build()` sees them.
fn option_value<T: TryFrom<u64>>(value: &Value) -> Option<T> {
    value.as_u64().and_then(|number| T::try_from(number).ok())
}

/// Every option of fixtures/options.json the layer (or, for the deadline, the client it is given) takes: accepted
/// and refused as the other packages do, the error naming the option with the shared message.
#[test]
fn the_options_are_accepted_and_refused_as_the_shared_cases_say() {
    let fixture = fixture("options.json");
    let client = || Client::new("redis://127.0.0.1:1/").expect("a client (never connected)");
    let layer =
        || RateLimitLayer::builder(client(), [Limit::new("api", 1.0, 1.0).expect("a limit")]);
    let mut checked = 0;
    for option in cases(&fixture, "options") {
        let name = text(&option["names"]["rust"]);
        let message = text(&option["message"]);
        // The result of building with `value`, or None where Rust's types cannot hold it.
        let build = |value: &Value| -> Option<Result<(), String>> {
            let result = match name {
                "local_capacity" => layer()
                    .local_capacity(option_value::<usize>(value)?)
                    .build()
                    .map(drop),
                "status_code" => layer()
                    .status_code(option_value::<u16>(value)?)
                    .build()
                    .map(drop),
                "prefix" => layer().prefix(value.as_str()?).build().map(drop),
                // A Duration holds no negative, infinite or NaN number: only what is left is the client's to check.
                "timeout" => {
                    let seconds = value.as_f64().filter(|s| s.is_finite() && *s >= 0.0)?;
                    Client::builder("redis://127.0.0.1:1/")
                        .timeout(std::time::Duration::from_secs_f64(seconds))
                        .build()
                        .map(drop)
                }
                // The layer's refusal is a response made by the on_refusal hook: no JSON body option to check.
                "body" => return None,
                other => panic!("an option the crate does not know: {other}"),
            };
            Some(result.map_err(|err| err.to_string()))
        };
        for value in cases(option, "accepted") {
            if let Some(result) = build(value) {
                assert_eq!(result, Ok(()), "{name} = {value}");
                checked += 1;
            }
        }
        for value in cases(option, "refused") {
            if let Some(result) = build(value) {
                let err = result.expect_err(&format!("{name} = {value} is refused"));
                assert!(
                    err.starts_with(&format!("{name} {message}")),
                    "{name} = {value}: {err}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 30, "{checked} values checked");
}
