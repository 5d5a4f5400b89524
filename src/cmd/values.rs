//! Parsers of the numeric flags, with messages in plain words: `expected a whole number from 1
//! to 1024, got "0"` where clap's own parsers say `0 is not in 1..=1024` or `invalid digit
//! found in string`. Flags that take them also set `allow_negative_numbers`, so that `-3`
//! reaches the parser and is refused by name instead of being read as an unknown flag.

/// `s` as a whole number in `lo..=hi` (hi = u64::MAX: no upper bound worth naming).
fn whole(s: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ if hi == u64::MAX => Err(format!("expected a whole number >= {lo}, got {s:?}")),
        _ => Err(format!(
            "expected a whole number from {lo} to {hi}, got {s:?}"
        )),
    }
}

/// A whole number in `lo..=hi` of type `T` (`hi` at most `T`'s largest value).
fn whole_as<T: TryFrom<u64>>(s: &str, lo: u64, hi: u64) -> Result<T, String> {
    let v = whole(s, lo, hi)?;
    T::try_from(v).map_err(|_| format!("{v} is too large here, got {s:?}"))
}

/// 0 or more (u32).
pub fn u32_any(s: &str) -> Result<u32, String> {
    whole_as(s, 0, u32::MAX.into())
}

/// 1 or more (u32).
pub fn u32_positive(s: &str) -> Result<u32, String> {
    whole_as(s, 1, u32::MAX.into())
}

/// 0 or more (usize).
pub fn usize_any(s: &str) -> Result<usize, String> {
    whole_as(s, 0, usize::MAX as u64)
}

/// 1 or more (usize).
pub fn usize_positive(s: &str) -> Result<usize, String> {
    whole_as(s, 1, usize::MAX as u64)
}

/// 0 or more (u64): seeds.
pub fn u64_any(s: &str) -> Result<u64, String> {
    whole(s, 0, u64::MAX)
}

/// 1 or more (u64): durations in seconds.
pub fn u64_positive(s: &str) -> Result<u64, String> {
    whole(s, 1, u64::MAX)
}

/// 1 to 1024: worker threads, parallel sequences.
pub fn one_to_1024(s: &str) -> Result<u32, String> {
    whole_as(s, 1, 1024)
}

/// 1 to 256: `bench --batch`.
pub fn one_to_256(s: &str) -> Result<u32, String> {
    whole_as(s, 1, 256)
}

/// 1 to 4096: `demo --tokens`.
pub fn one_to_4096(s: &str) -> Result<u16, String> {
    whole_as(s, 1, 4096)
}

/// A TCP port, 0 to 65535.
pub fn port(s: &str) -> Result<u16, String> {
    whole_as(s, 0, u16::MAX.into())
}

/// Any number that parses as f32 (range checks are the caller's).
pub fn number(s: &str) -> Result<f32, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("expected a number, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_in_plain_words() {
        assert_eq!(one_to_1024("8"), Ok(8));
        assert_eq!(
            one_to_1024("0"),
            Err(r#"expected a whole number from 1 to 1024, got "0""#.into())
        );
        assert_eq!(
            u32_positive("-3"),
            Err(r#"expected a whole number from 1 to 4294967295, got "-3""#.into())
        );
        assert_eq!(
            usize_any("abc"),
            Err(r#"expected a whole number >= 0, got "abc""#.into())
        );
        assert_eq!(
            port("65536").unwrap_err(),
            r#"expected a whole number from 0 to 65535, got "65536""#
        );
        assert_eq!(
            u64_positive("0").unwrap_err(),
            r#"expected a whole number >= 1, got "0""#
        );
        assert_eq!(number("1.5"), Ok(1.5));
        assert_eq!(number("x").unwrap_err(), r#"expected a number, got "x""#);
    }
}
