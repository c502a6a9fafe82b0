//! The local fallback against `fixtures/local.json`, the file the Python and Node suites read: each step as the
//! layer runs a call, through this module's own functions.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use tb_test_support::fixture;

use super::tests::reply_error;
use super::{ChargeBack, ChargeOutcome, LocalBucket, LocalBuckets};
use crate::error::Error;
use crate::replies::BucketResult;

fn cases<'a>(value: &'a Value, field: &str) -> &'a Vec<Value> {
    value[field].as_array().expect("an array of cases")
}

fn text(value: &Value) -> &str {
    value.as_str().expect("a string")
}

fn bucket_result(value: &Value, fits: bool) -> BucketResult {
    BucketResult {
        fits,
        remaining: value["remaining"].as_i64().expect("remaining"),
        retry_after_ms: value["retry_after_ms"].as_i64().expect("retry_after_ms"),
        reset_after_ms: value["reset_after_ms"].as_i64().expect("reset_after_ms"),
    }
}

/// The buckets of a step's call, with their limits' parameters.
fn step_buckets<'a>(case: &'a Value, step: &'a Value) -> Vec<LocalBucket<'a>> {
    cases(step, "call")
        .iter()
        .map(|bucket| {
            let limit = text(&bucket["limit"]);
            let params = &case["limits"][limit];
            LocalBucket {
                key: text(&bucket["key"]),
                limit,
                rate: params["rate"].as_f64().expect("rate"),
                burst: params["burst"].as_f64().expect("burst"),
                cost: bucket["cost"].as_f64().expect("cost"),
            }
        })
        .collect()
}

/// The charge-backs the crate made are the step's `charge_back` (floors within 1e-9), when the step lists them.
fn check_charge_backs(step: &Value, made: &[ChargeBack], at: &str) {
    let Some(expected) = step.get("charge_back") else {
        return;
    };
    let expected: Vec<(String, f64, f64, f64)> = expected
        .as_array()
        .expect("a list of charge-backs")
        .iter()
        .map(|charge| {
            (
                text(&charge["key"]).to_owned(),
                charge["rate"].as_f64().expect("rate"),
                charge["burst"].as_f64().expect("burst"),
                charge["tokens"].as_f64().expect("tokens"),
            )
        })
        .collect();
    let found: Vec<(String, f64, f64, f64)> = made
        .iter()
        .map(|charge| (charge.key.clone(), charge.rate, charge.burst, charge.tokens))
        .collect();
    let same = found.len() == expected.len()
        && found.iter().zip(&expected).all(|(found, expected)| {
            found.0 == expected.0
                && found.1 == expected.1
                && found.2 == expected.2
                && (found.3 - expected.3).abs() <= 1e-9
        });
    assert!(same, "{at}: charge-backs {found:?}, expected {expected:?}");
}

/// How the step's charge-backs end: accepted, or as the crate classifies `charge_back_error`'s reply, or as
/// `charge_back_outcome` says (a concurrent call's end; `failed` is no reply at all).
fn charge_outcome(step: &Value) -> ChargeOutcome {
    if let Some(reply) = step["charge_back_error"].as_str() {
        return ChargeOutcome::of_error(&reply_error(reply));
    }
    match step["charge_back_outcome"].as_str() {
        None | Some("accepted") => ChargeOutcome::Accepted,
        Some("failed") => ChargeOutcome::of_error(&Error::Timeout(Duration::from_millis(1000))),
        Some(other) => panic!("charge_back_outcome {other}"),
    }
}

/// Redis's answer (`answers`: the call's reply goes to the buckets) or failure (`fails`: the buckets decide, as
/// `expect` says) for a call at `now_ms`.
fn finish_call(
    local: &mut LocalBuckets,
    buckets: &[LocalBucket<'_>],
    step: &Value,
    now_ms: f64,
    at: &str,
) {
    match text(&step["redis"]) {
        "answers" => {
            let reply = &step["reply"];
            let allowed = reply["allowed"].as_bool().expect("allowed");
            let results: Vec<BucketResult> = cases(reply, "buckets")
                .iter()
                .map(|bucket| bucket_result(bucket, allowed))
                .collect();
            local.answered(buckets, &results, now_ms);
        }
        "fails" => {
            let decision = local.acquire_each(buckets, now_ms);
            let expect = &step["expect"];
            assert_eq!(
                decision.allowed,
                expect["allowed"].as_bool().expect("allowed"),
                "{at}: {decision:?}"
            );
            let found: Vec<(i64, i64, i64)> = decision
                .buckets
                .iter()
                .map(|b| (b.remaining, b.retry_after_ms, b.reset_after_ms))
                .collect();
            let wanted: Vec<(i64, i64, i64)> = cases(expect, "buckets")
                .iter()
                .map(|b| {
                    let b = bucket_result(b, false);
                    (b.remaining, b.retry_after_ms, b.reset_after_ms)
                })
                .collect();
            assert_eq!(found, wanted, "{at}");
        }
        other => panic!("{at}: redis {other}"),
    }
}

/// Each step as the layer runs a call: the charge-backs the crate's buckets make (checked against the step's),
/// their outcome reported, then Redis's answer or the buckets' decision. A concurrent call's `begin` makes its
/// charge-backs; its `end` reports their outcome and finishes the call.
#[test]
fn the_local_fallback_follows_the_shared_call_sequences() {
    let fixture = fixture("local.json");
    let mut steps_run = 0;
    let mut concurrent_ends = 0;
    let mut charge_back_errors = 0;
    for case in cases(&fixture, "cases") {
        let name = text(&case["name"]);
        let capacity = case["capacity"].as_u64().map_or(10_000, |n| n as usize);
        let mut local = LocalBuckets::new(capacity);
        let mut begun: HashMap<String, (Vec<LocalBucket<'_>>, Vec<ChargeBack>)> = HashMap::new();
        for (index, step) in cases(case, "steps").iter().enumerate() {
            let at = format!("{name}, step {index}");
            let now_ms = step["at_ms"].as_f64().expect("at_ms");
            steps_run += 1;
            if let Some(id) = step["begin"].as_str() {
                let buckets = step_buckets(case, step);
                let charges = local.charge_backs(&buckets, now_ms);
                check_charge_backs(step, &charges, &at);
                assert!(
                    step.get("redis").is_none(),
                    "{at}: a begin is answered at its end"
                );
                begun.insert(id.to_owned(), (buckets, charges));
                continue;
            }
            if let Some(id) = step["end"].as_str() {
                let (buckets, charges) = begun.remove(id).expect("a begun call");
                let outcome = charge_outcome(step);
                for charge in &charges {
                    local.charge_ended(charge, outcome);
                }
                concurrent_ends += 1;
                finish_call(&mut local, &buckets, step, now_ms, &at);
                continue;
            }
            let buckets = step_buckets(case, step);
            let charges = local.charge_backs(&buckets, now_ms);
            check_charge_backs(step, &charges, &at);
            // A call that fails failed with its charge-backs (or they failed first): owed again.
            let outcome = match text(&step["redis"]) {
                "fails" if step.get("charge_back_error").is_none() => ChargeOutcome::Failed,
                _ => charge_outcome(step),
            };
            if step.get("charge_back_error").is_some() {
                charge_back_errors += 1;
                // The crate's decision on the error is the step's: a fault fails the call, any other error
                // lets Redis answer it.
                let fails = outcome == ChargeOutcome::Failed;
                assert_eq!(fails, text(&step["redis"]) == "fails", "{at}: {outcome:?}");
            }
            for charge in &charges {
                local.charge_ended(charge, outcome);
            }
            finish_call(&mut local, &buckets, step, now_ms, &at);
        }
        assert!(begun.is_empty(), "{name}: calls begun and never ended");
    }
    assert!(
        steps_run >= 80 && concurrent_ends >= 3 && charge_back_errors >= 4,
        "{steps_run} steps, {concurrent_ends} concurrent ends, {charge_back_errors} charge-back errors"
    );
}
