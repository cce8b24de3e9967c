//! `google.protobuf.Duration` with the text form Istio accepts.
//!
//! Istio decodes its config with Go's protobuf JSON decoder, which parses
//! durations with Go's `time.ParseDuration`: `"30ms"`, `"5m"`, `"1h30m"`,
//! `"0.5s"`, `"-1.5h"`, `"0"`. Strict proto3 JSON only allows `"<seconds>s"`,
//! so the generated types use this [`Duration`] instead of
//! `pbjson_types::Duration`: the same message on the wire (fields 1 and 2),
//! but its serde form accepts everything Istio accepts and writes the
//! canonical proto3 form (`"5s"`, `"0.500s"`), which both sides read.

use std::fmt;
use std::str::FromStr;

const NANOS_PER_SECOND: i128 = 1_000_000_000;

/// A signed span of time: `seconds` plus `nanos`, where both have the same
/// sign and `|nanos| < 1_000_000_000` (the `google.protobuf.Duration`
/// message).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Message)]
pub struct Duration {
    /// Whole seconds.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Fraction of a second in nanoseconds, same sign as `seconds`.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl Duration {
    /// A duration of `seconds` plus `nanos` (taken as given).
    #[must_use]
    pub const fn new(seconds: i64, nanos: i32) -> Self {
        Self { seconds, nanos }
    }

    /// A duration of whole seconds.
    #[must_use]
    pub const fn from_secs(seconds: i64) -> Self {
        Self { seconds, nanos: 0 }
    }

    /// A duration of milliseconds.
    #[must_use]
    pub const fn from_millis(millis: i64) -> Self {
        Self::from_nanos(millis as i128 * 1_000_000)
    }

    /// The normalized duration of `nanos` nanoseconds. Values beyond the
    /// `i64` range of seconds saturate.
    #[must_use]
    pub const fn from_nanos(nanos: i128) -> Self {
        let seconds = nanos / NANOS_PER_SECOND;
        let rest = nanos % NANOS_PER_SECOND;
        if seconds > i64::MAX as i128 {
            Self::new(i64::MAX, 999_999_999)
        } else if seconds < i64::MIN as i128 {
            Self::new(i64::MIN, -999_999_999)
        } else {
            // Both parts carry the sign of `nanos`, as the message requires.
            Self::new(seconds as i64, rest as i32)
        }
    }

    /// The total length in nanoseconds.
    #[must_use]
    pub const fn as_nanos(&self) -> i128 {
        self.seconds as i128 * NANOS_PER_SECOND + self.nanos as i128
    }

    /// Whether the duration is below zero.
    #[must_use]
    pub const fn is_negative(&self) -> bool {
        self.as_nanos() < 0
    }
}

/// The error for a duration that cannot be represented by the target type
/// (a negative duration as `std::time::Duration`, or a `std` duration too
/// long for `i64` seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationRangeError;

impl fmt::Display for DurationRangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("duration out of range for the target type")
    }
}

impl std::error::Error for DurationRangeError {}

impl TryFrom<Duration> for std::time::Duration {
    type Error = DurationRangeError;

    fn try_from(d: Duration) -> Result<Self, Self::Error> {
        let nanos = u128::try_from(d.as_nanos()).map_err(|_| DurationRangeError)?;
        let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| DurationRangeError)?;
        // The remainder is below 1e9, so it fits in u32.
        let sub = u32::try_from(nanos % 1_000_000_000).map_err(|_| DurationRangeError)?;
        Ok(Self::new(secs, sub))
    }
}

impl TryFrom<std::time::Duration> for Duration {
    type Error = DurationRangeError;

    fn try_from(d: std::time::Duration) -> Result<Self, Self::Error> {
        let seconds = i64::try_from(d.as_secs()).map_err(|_| DurationRangeError)?;
        let nanos = i32::try_from(d.subsec_nanos()).map_err(|_| DurationRangeError)?;
        Ok(Self::new(seconds, nanos))
    }
}

impl From<Duration> for pbjson_types::Duration {
    fn from(d: Duration) -> Self {
        Self {
            seconds: d.seconds,
            nanos: d.nanos,
        }
    }
}

impl From<pbjson_types::Duration> for Duration {
    fn from(d: pbjson_types::Duration) -> Self {
        Self::new(d.seconds, d.nanos)
    }
}

/// The error for text that is not a valid duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationParseError {
    input: String,
    reason: &'static str,
}

impl DurationParseError {
    fn new(input: &str, reason: &'static str) -> Self {
        Self {
            input: input.to_owned(),
            reason,
        }
    }
}

impl fmt::Display for DurationParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid duration {:?}: {} (expected e.g. \"5s\", \"0.5s\", \"100ms\", \"1m30s\"; units ns, us, ms, s, m, h)",
            self.input, self.reason
        )
    }
}

impl std::error::Error for DurationParseError {}

/// Nanoseconds per unit, for the units Go's `time.ParseDuration` knows.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        // Go accepts both the micro sign (U+00B5) and Greek mu (U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Splits off the leading ASCII digits of `s`.
fn split_digits(s: &str) -> (&str, &str) {
    let end = s.bytes().take_while(u8::is_ascii_digit).count();
    s.split_at(end)
}

impl FromStr for Duration {
    type Err = DurationParseError;

    /// Parses Go's duration syntax: an optional sign, then one or more
    /// `<number><unit>` parts (`1h30m`, `1.5s`, `.5ms`), or a bare `0`.
    /// The canonical proto3 form (`"1.500s"`) is a special case of it. The
    /// total must fit in `i64` nanoseconds, as in Go. Fractions are
    /// truncated to whole nanoseconds.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| DurationParseError::new(input, reason);
        let (negative, mut rest) = match input.as_bytes().first() {
            Some(b'-') => (true, &input[1..]),
            Some(b'+') => (false, &input[1..]),
            _ => (false, input),
        };
        if rest == "0" {
            return Ok(Self::default());
        }
        if rest.is_empty() {
            return Err(err("empty"));
        }
        let limit: u128 = if negative { 1 << 63 } else { (1 << 63) - 1 };
        let mut total: u128 = 0;
        while !rest.is_empty() {
            let (int_part, after_int) = split_digits(rest);
            let (frac_part, after_number) = match after_int.strip_prefix('.') {
                Some(after_dot) => split_digits(after_dot),
                None => ("", after_int),
            };
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(err("expected a number"));
            }
            let unit_len = after_number
                .find(|c: char| c == '.' || c.is_ascii_digit())
                .unwrap_or(after_number.len());
            if unit_len == 0 {
                return Err(err("missing unit"));
            }
            let (unit, after_unit) = after_number.split_at(unit_len);
            let unit = unit_nanos(unit).ok_or_else(|| err("unknown unit"))?;
            rest = after_unit;

            // Anything longer than 20 integer digits overflows anyway.
            if int_part.len() > 20 {
                return Err(err("out of range"));
            }
            let whole: u128 = if int_part.is_empty() {
                0
            } else {
                int_part.parse().map_err(|_| err("out of range"))?
            };
            let mut part = whole.checked_mul(unit).ok_or_else(|| err("out of range"))?;
            if !frac_part.is_empty() {
                // Digits past the 20th cannot add a whole nanosecond.
                let digits = &frac_part[..frac_part.len().min(20)];
                let frac: u128 = digits.parse().map_err(|_| err("out of range"))?;
                let scale = 10u128.pow(u32::try_from(digits.len()).unwrap_or(20));
                part += frac * unit / scale;
            }
            total = total.checked_add(part).ok_or_else(|| err("out of range"))?;
            if total > limit {
                return Err(err("out of range"));
            }
        }
        // `total <= 2^63`, so it fits in i128 without loss.
        let nanos = total as i128;
        Ok(Self::from_nanos(if negative { -nanos } else { nanos }))
    }
}

impl fmt::Display for Duration {
    /// The canonical proto3 JSON form: seconds with 0, 3, 6 or 9 fraction
    /// digits and an `s` suffix (`"5s"`, `"0.500s"`, `"-1.000000001s"`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.as_nanos();
        let sign = if total < 0 { "-" } else { "" };
        let abs = total.unsigned_abs();
        let secs = abs / 1_000_000_000;
        let nanos = abs % 1_000_000_000;
        if nanos == 0 {
            write!(f, "{sign}{secs}s")
        } else if nanos.is_multiple_of(1_000_000) {
            write!(f, "{sign}{secs}.{:03}s", nanos / 1_000_000)
        } else if nanos.is_multiple_of(1_000) {
            write!(f, "{sign}{secs}.{:06}s", nanos / 1_000)
        } else {
            write!(f, "{sign}{secs}.{nanos:09}s")
        }
    }
}

impl serde::Serialize for Duration {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Duration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl serde::de::Visitor<'_> for Visitor {
            type Value = Duration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"5s\" or \"100ms\"")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
                v.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::Duration;

    fn parse(s: &str) -> Duration {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    #[test]
    fn parses_go_duration_syntax() {
        assert_eq!(parse("5s"), Duration::new(5, 0));
        assert_eq!(parse("0.5s"), Duration::new(0, 500_000_000));
        assert_eq!(parse(".5s"), Duration::new(0, 500_000_000));
        assert_eq!(parse("5.s"), Duration::new(5, 0));
        assert_eq!(parse("1.500s"), Duration::new(1, 500_000_000));
        assert_eq!(parse("30ms"), Duration::new(0, 30_000_000));
        assert_eq!(parse("100us"), Duration::new(0, 100_000));
        assert_eq!(parse("100\u{b5}s"), Duration::new(0, 100_000));
        assert_eq!(parse("100\u{3bc}s"), Duration::new(0, 100_000));
        assert_eq!(parse("7ns"), Duration::new(0, 7));
        assert_eq!(parse("5m"), Duration::new(300, 0));
        assert_eq!(parse("24h"), Duration::new(86_400, 0));
        assert_eq!(parse("1h30m15.25s"), Duration::new(5_415, 250_000_000));
        assert_eq!(parse("1.5h"), Duration::new(5_400, 0));
        assert_eq!(parse("0"), Duration::default());
        assert_eq!(parse("-0"), Duration::default());
        assert_eq!(parse("+2s"), Duration::new(2, 0));
        assert_eq!(parse("-1.5s"), Duration::new(-1, -500_000_000));
        assert_eq!(parse("-0.5s"), Duration::new(0, -500_000_000));
        assert_eq!(parse("1.000000001s"), Duration::new(1, 1));
        // Sub-nanosecond fractions are truncated.
        assert_eq!(parse("1.0000000019s"), Duration::new(1, 1));
        // Go's limits: i64 nanoseconds.
        assert_eq!(
            parse("2562047h47m16.854775807s").as_nanos(),
            i128::from(i64::MAX)
        );
        assert_eq!(
            parse("-2562047h47m16.854775808s").as_nanos(),
            i128::from(i64::MIN)
        );
    }

    #[test]
    fn rejects_malformed_durations() {
        for bad in [
            "",
            "-",
            "5",
            "s",
            ".s",
            "5x",
            "5 s",
            "5S",
            "1h-5m",
            "abc",
            "1e3s",
            "2562047h47m16.854775808s",
            "99999999999999999999999h",
        ] {
            let err = bad.parse::<Duration>().expect_err(bad);
            assert!(err.to_string().contains("invalid duration"), "{err}");
        }
    }

    #[test]
    fn displays_canonical_proto3_json() {
        assert_eq!(Duration::new(5, 0).to_string(), "5s");
        assert_eq!(Duration::new(0, 500_000_000).to_string(), "0.500s");
        assert_eq!(Duration::new(1, 250_000).to_string(), "1.000250s");
        assert_eq!(Duration::new(1, 1).to_string(), "1.000000001s");
        assert_eq!(Duration::new(-1, -500_000_000).to_string(), "-1.500s");
        assert_eq!(Duration::new(0, -500_000_000).to_string(), "-0.500s");
        assert_eq!(Duration::default().to_string(), "0s");
        // The canonical form parses back to the same value.
        for d in [
            Duration::new(5, 0),
            Duration::new(0, 500_000_000),
            Duration::new(-3, -7),
        ] {
            assert_eq!(parse(&d.to_string()), d);
        }
    }

    #[test]
    fn converts_to_and_from_std() {
        let std_d = std::time::Duration::try_from(Duration::new(1, 5)).expect("positive");
        assert_eq!(std_d, std::time::Duration::new(1, 5));
        assert!(std::time::Duration::try_from(Duration::new(-1, 0)).is_err());
        assert_eq!(
            Duration::try_from(std::time::Duration::from_millis(1500)),
            Ok(Duration::new(1, 500_000_000))
        );
        assert_eq!(
            Duration::from_millis(-1500),
            Duration::new(-1, -500_000_000)
        );
    }

    #[test]
    fn serde_uses_strings() {
        let d: Duration = serde_json::from_str("\"100ms\"").expect("parses");
        assert_eq!(d, Duration::new(0, 100_000_000));
        assert_eq!(serde_json::to_string(&d).expect("serializes"), "\"0.100s\"");
        assert!(serde_json::from_str::<Duration>("5").is_err());
        assert!(serde_json::from_str::<Duration>("\"5\"").is_err());
    }
}
