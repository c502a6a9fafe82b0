//! fixtures/leases.json through `Lease`: each case's steps at their instants, each decision as the fixture says.
//! The Python and npm packages replay the same file through their own ports of the rule.

use redis_tb_core::{Admit, Lease, Params};
use serde_json::Value;
use tb_test_support::{fixture, fixture_number};

/// The decision a step expects: `"spent"`, `"wait"`, `"direct"`, `{"call": max}`, `{"refused": retry_after_ms}`,
/// or `null`.
fn expected(value: &Value) -> Option<Admit> {
    match value {
        Value::Null => None,
        Value::String(text) if text == "spent" => Some(Admit::Spent),
        Value::String(text) if text == "wait" => Some(Admit::Wait),
        Value::String(text) if text == "direct" => Some(Admit::Direct),
        Value::Object(fields) => {
            if let Some(max) = fields.get("call") {
                Some(Admit::Call {
                    max: max.as_i64().expect("call: an integer"),
                })
            } else if let Some(retry) = fields.get("refused") {
                Some(Admit::Refused {
                    retry_after_ms: retry.as_i64().expect("refused: an integer"),
                })
            } else {
                panic!("an expected decision: {value}")
            }
        }
        other => panic!("an expected decision: {other}"),
    }
}

/// A reply of four integer fields, as the fixture writes `TB.ACQUIREATMOST`'s and `TB.ACQUIRE`'s.
fn four(reply: &Value, at: &str) -> [i64; 4] {
    let fields: Vec<i64> = reply
        .as_array()
        .unwrap_or_else(|| panic!("{at}: a reply"))
        .iter()
        .map(|field| field.as_i64().expect("an integer field"))
        .collect();
    fields
        .try_into()
        .unwrap_or_else(|_| panic!("{at}: a reply of four fields"))
}

/// A fixture's milliseconds as the core's microseconds.
fn micros(value: &Value) -> i64 {
    (fixture_number(value) * 1_000.0).round() as i64
}

#[test]
fn leases_follow_the_shared_fixture() {
    let fixture = fixture("leases.json");
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let about = case["about"].as_str().expect("about");
        let params = Params::new(
            fixture_number(&case["rate"]),
            fixture_number(&case["burst"]),
        )
        .expect("valid parameters");
        let mut lease = Lease::new(params, 0);
        let steps = case["steps"].as_array().expect("steps");
        for (index, step) in steps.iter().enumerate() {
            let now = micros(&step["at_ms"]);
            let at = format!("{about}: step {index}");
            if let Some(cost) = step.get("admit") {
                let decision = lease.admit(now, fixture_number(cost));
                assert_eq!(Some(decision), expected(&step["expect"]), "{at}");
            } else if let Some(cost) = step.get("admit_again") {
                let decision = lease.admit_again(now, fixture_number(cost));
                assert_eq!(Some(decision), expected(&step["expect"]), "{at}");
            } else if let Some(reply) = step.get("answered") {
                let [granted, _remaining, retry_after_ms, reset_after_ms] = four(reply, &at);
                let sent = micros(&step["sent_ms"]);
                let decision = lease.answered(sent, now, granted, retry_after_ms, reset_after_ms);
                assert_eq!(decision, expected(&step["expect"]), "{at}");
            } else if let Some(reply) = step.get("observed") {
                let [allowed, _remaining, retry_after_ms, reset_after_ms] = four(reply, &at);
                let sent = micros(&step["sent_ms"]);
                lease.observed(sent, now, allowed == 1, retry_after_ms, reset_after_ms);
            } else if step.get("failed").is_some() {
                lease.failed();
            } else if step.get("dropped").is_some() {
                lease.dropped();
            } else if let Some(tokens) = step.get("spendable") {
                let spendable = lease.spendable(now);
                assert!(
                    (spendable - fixture_number(tokens)).abs() < 1e-9,
                    "{at}: {spendable}"
                );
            } else if let Some(due) = step.get("refund_due") {
                assert_eq!(Some(lease.refund_due(now)), due.as_bool(), "{at}");
            } else if let Some(unchanged) = step.get("give_back") {
                let unchanged = unchanged.as_bool().expect("give_back: a boolean");
                let amount = lease.give_back(now, unchanged);
                let expected = fixture_number(&step["expect"]);
                assert!((amount - expected).abs() < 1e-9, "{at}: {amount}");
            } else {
                panic!("{at}: an unknown step {step}");
            }
        }
    }
}
