//! Parsing the arguments every command shares: `rate` and `burst` (with a one-entry cache), `cost`, and the
//! decimal ones only some take (`TB.LOWER`'s `tokens`).
#![forbid(unsafe_code)]

use crate::bucket::{Cost, Floor, ParamError, Params};
use crate::number;
use crate::server::Call;

use super::TbError;

/// Parses `rate` at `rate_index` and `burst` right after it. A caller sends the same two texts on every call to a
/// bucket, so the last pair parsed is remembered with its `Params`: the same bytes give the same result.
pub(super) fn parse_params(call: &Call<'_>, rate_index: usize) -> Result<Params, TbError> {
    let (rate_text, burst_text) = (call.arg(rate_index), call.arg(rate_index + 1));
    if let (Some(rate_text), Some(burst_text)) = (rate_text, burst_text) {
        if let Some(params) = LAST_PARAMS.with(|last| last.get().lookup(rate_text, burst_text)) {
            return Ok(params);
        }
    }
    let rate = parse_number(rate_text).ok_or(ParamError::Rate)?;
    let Some(burst) = parse_number(burst_text) else {
        // The error names the first bad argument in order: a rate that `Params::new` refuses (`0`) comes before an
        // unparsable burst (`inf`). Checked against a valid burst so that the rule stays in `Params::new` alone.
        return Err(Params::new(rate, 1.0)
            .err()
            .unwrap_or(ParamError::Burst)
            .into());
    };
    let params = Params::new(rate, burst)?;
    if let (Some(rate_text), Some(burst_text)) = (rate_text, burst_text) {
        LAST_PARAMS.with(|last| last.set(ParamsCache::new(rate_text, burst_text, params)));
    }
    Ok(params)
}

/// Longest `rate` or `burst` text the cache holds; longer ones are parsed every time.
const CACHED_TEXT_LEN: usize = 24;

/// The last valid `rate`/`burst` texts parsed, with their `Params`. Only valid pairs are kept, so a hit never
/// skips a check.
#[derive(Clone, Copy)]
struct ParamsCache {
    rate: [u8; CACHED_TEXT_LEN],
    rate_len: usize,
    burst: [u8; CACHED_TEXT_LEN],
    burst_len: usize,
    params: Option<Params>,
}

impl ParamsCache {
    const EMPTY: ParamsCache = ParamsCache {
        rate: [0; CACHED_TEXT_LEN],
        rate_len: 0,
        burst: [0; CACHED_TEXT_LEN],
        burst_len: 0,
        params: None,
    };

    fn new(rate_text: &[u8], burst_text: &[u8], params: Params) -> ParamsCache {
        let mut cache = ParamsCache::EMPTY;
        let (Some(rate), Some(burst)) = (
            cache.rate.get_mut(..rate_text.len()),
            cache.burst.get_mut(..burst_text.len()),
        ) else {
            return ParamsCache::EMPTY;
        };
        rate.copy_from_slice(rate_text);
        burst.copy_from_slice(burst_text);
        cache.rate_len = rate_text.len();
        cache.burst_len = burst_text.len();
        cache.params = Some(params);
        cache
    }

    fn lookup(&self, rate_text: &[u8], burst_text: &[u8]) -> Option<Params> {
        let same = self.rate.get(..self.rate_len) == Some(rate_text)
            && self.burst.get(..self.burst_len) == Some(burst_text);
        self.params.filter(|_| same)
    }
}

thread_local! {
    /// Commands run on the server's main thread only; a thread-local needs no lock and no `unsafe`.
    static LAST_PARAMS: std::cell::Cell<ParamsCache> = const { std::cell::Cell::new(ParamsCache::EMPTY) };
}

pub(super) fn parse_cost(bytes: &[u8]) -> Result<Cost, TbError> {
    Ok(Cost::new(
        parse_number(Some(bytes)).ok_or(ParamError::Cost)?,
    )?)
}

/// Parses `TB.LOWER`'s `tokens`, whose lower bound depends on the bucket's `params`.
pub(super) fn parse_floor(bytes: &[u8], params: &Params) -> Result<Floor, TbError> {
    Ok(Floor::new(
        parse_number(Some(bytes)).ok_or(ParamError::Floor)?,
        params,
    )?)
}

/// Parses a decimal argument: what Rust's `f64` grammar accepts (`1`, `0.5`, `2.5e-3`), finite only (see
/// [`number::parse_f64`]).
fn parse_number(bytes: Option<&[u8]>) -> Option<f64> {
    number::parse_f64(bytes?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_cache_hits_only_the_same_texts() {
        let params = Params::new(10.0, 20.0).expect("valid");
        let cache = ParamsCache::new(b"10", b"20", params);
        assert_eq!(cache.lookup(b"10", b"20"), Some(params));
        assert_eq!(cache.lookup(b"10", b"2"), None);
        assert_eq!(cache.lookup(b"1", b"20"), None);
        assert_eq!(cache.lookup(b"10", b"200"), None);
        assert_eq!(ParamsCache::EMPTY.lookup(b"", b""), None);
        let long = [b'1'; CACHED_TEXT_LEN + 1];
        assert_eq!(
            ParamsCache::new(&long, b"20", params).lookup(&long, b"20"),
            None
        );
    }

    #[test]
    fn parse_number_refuses_a_missing_argument() {
        assert_eq!(parse_number(Some(b"2.5")), Some(2.5));
        assert_eq!(parse_number(None), None);
    }
}
