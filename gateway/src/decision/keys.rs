//! The Redis key of a bucket. Pure.
#![forbid(unsafe_code)]

/// The Redis key of a bucket: `<prefix>{<domain>}:<key>=<value>...`, escaped so distinct entries never collide
/// and the hash tag is always exactly the domain.
///
/// Each part (domain, key, value) is escaped by the packages' identity rule (docs/clients.md, "Identity and
/// keys": of its UTF-8 bytes, `!` to `~` stay except `%`, `{` and `}`; every other byte becomes `%XX`), and `:`
/// and `=` too, since here they separate the entries of one key: the packages' tags never hold several parts.
pub fn bucket_key(prefix: &str, domain: &str, entries: &[(String, String)]) -> String {
    let mut key = String::with_capacity(prefix.len() + domain.len() + 16 * entries.len());
    key.push_str(prefix);
    key.push('{');
    escape_into(&mut key, domain);
    key.push('}');
    for (name, value) in entries {
        key.push(':');
        escape_into(&mut key, name);
        key.push('=');
        escape_into(&mut key, value);
    }
    key
}

fn escape_into(out: &mut String, text: &str) {
    // A nibble is below 16, so `from_digit` always has a digit for it.
    let hex = |nibble: u8| {
        char::from_digit(u32::from(nibble), 16).map_or('0', |digit| digit.to_ascii_uppercase())
    };
    for &byte in text.as_bytes() {
        let kept =
            (b'!'..=b'~').contains(&byte) && !matches!(byte, b'%' | b'{' | b'}' | b':' | b'=');
        if kept {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(hex(byte >> 4));
            out.push(hex(byte & 0x0F));
        }
    }
}
