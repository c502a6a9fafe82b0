//! The header mapping against fixtures/headers.json, and the sf-string rule.
use super::*;

/// `json` with each `\uD800`-`\uDFFF` escape that is not half of a pair replaced by `\uFFFD`: JSON text may hold a
/// lone surrogate (fixtures/headers.json's refused names do), a Rust string may not.
fn without_lone_surrogates(json: &str) -> String {
    let surrogate = |at: usize| {
        json.get(at..at + 6)
            .and_then(|escape| escape.strip_prefix("\\u"))
            .and_then(|hex| u16::from_str_radix(hex, 16).ok())
            .filter(|code| (0xD800..=0xDFFF).contains(code))
    };
    let mut out = String::with_capacity(json.len());
    let mut at = 0;
    while let Some(c) = json.get(at..).and_then(|rest| rest.chars().next()) {
        if let Some(code) = surrogate(at) {
            let low = surrogate(at + 6).filter(|low| *low >= 0xDC00);
            if code < 0xDC00 && low.is_some() {
                out.push_str(&json[at..at + 12]);
                at += 12;
            } else {
                out.push_str("\\uFFFD");
                at += 6;
            }
        } else if c == '\\' {
            // Any other escape is copied whole, so its second character starts nothing.
            let escape: String = json[at..].chars().take(2).collect();
            out.push_str(&escape);
            at += escape.len();
        } else {
            out.push(c);
            at += c.len_utf8();
        }
    }
    out
}

fn headers_fixture() -> serde_json::Value {
    let text = include_str!("../../../fixtures/headers.json");
    serde_json::from_str(&without_lone_surrogates(text)).expect("fixtures/headers.json parses")
}

#[test]
fn headers_follow_the_shared_fixture() {
    let fixture = headers_fixture();
    assert_eq!(fixture["max_integer"].as_i64(), Some(MAX_SF_INTEGER));
    let cases = fixture["cases"].as_array().expect("cases");
    for case in cases {
        let about = case["about"].as_str().expect("about");
        let format = match case["standard"].as_str().expect("a standard") {
            "both" => HeaderFormat::Both,
            "draft" => HeaderFormat::Draft,
            "legacy" => HeaderFormat::Legacy,
            "none" => HeaderFormat::None,
            other => panic!("{about}: standard {other}"),
        };
        let number = |value: &serde_json::Value| value.as_f64().expect("a number");
        let int = |value: &serde_json::Value| value.as_i64().expect("an integer");
        let buckets = case["buckets"].as_array().expect("buckets");
        let rows: Vec<HeaderRow> = buckets
            .iter()
            .map(|bucket| HeaderRow {
                name: bucket["name"].as_str().expect("a name"),
                rate_per_sec: number(&bucket["rate"]),
                burst: number(&bucket["burst"]),
                reply: BucketReply {
                    fits: bucket["fits"].as_bool().expect("fits"),
                    remaining: int(&bucket["remaining"]),
                    retry_after_ms: int(&bucket["retry_after_ms"]),
                    reset_after_ms: int(&bucket["reset_after_ms"]),
                },
            })
            .collect();
        let limiting_index = usize::try_from(int(&case["limiting_index"])).expect("an index");
        let refused = !case["allowed"].as_bool().expect("allowed");
        let got: Vec<(String, String)> = rate_limit_headers(
            format,
            &HeaderNames::default(),
            &rows,
            limiting_index,
            refused,
        )
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
fn a_name_outside_printable_ascii_never_reaches_a_header() {
    // fixtures/headers.json's names: the accepted ones go out as they are (quote and backslash escaped); the
    // packages refuse the others when a limit is built, and tb-rls, whose override names hold a request's keys,
    // writes their other bytes as %XX: nothing outside 0x20-0x7E passes, and no name ends its string early.
    let fixture = headers_fixture();
    let names = &fixture["names"];
    let field = |name: &str| {
        let row = HeaderRow {
            name,
            rate_per_sec: 1.0,
            burst: 1.0,
            reply: BucketReply {
                fits: true,
                remaining: 1,
                retry_after_ms: 0,
                reset_after_ms: 0,
            },
        };
        rate_limit_headers(
            HeaderFormat::Draft,
            &HeaderNames::default(),
            &[row],
            0,
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
        .filter(|name| !name.is_empty())
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

#[test]
fn sf_strings_escape_quotes_and_backslashes_and_percent_encode_the_rest() {
    assert_eq!(sf_string("a \"b\" \\c"), "\"a \\\"b\\\" \\\\c\"");
    assert_eq!(sf_string("café\ttab"), "\"caf%C3%A9%09tab\"");
    assert_eq!(sf_string("\u{7f}\u{0}\r\n"), "\"%7F%00%0D%0A\"");
    assert_eq!(sf_string("\u{a0}"), "\"%C2%A0\"");
}
