//! RFC 3339 timestamps (`metadata.creationTimestamp`), read and written without a date
//! library: Kubernetes writes `2024-05-01T12:00:00Z`; offsets and fractions are
//! accepted too.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parses an RFC 3339 timestamp (`YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, `T` or `t`
/// or a space between date and time).
pub fn parse_rfc3339(s: &str) -> Result<SystemTime, String> {
    let bad =
        || format!("{s:?} is not an RFC 3339 timestamp (expected e.g. \"2024-05-01T12:00:00Z\")");
    let b = s.as_bytes();
    if b.len() < 20 {
        return Err(bad());
    }
    let num = |range: std::ops::Range<usize>| -> Result<i64, String> {
        let part = s.get(range).ok_or_else(bad)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse::<i64>().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    let mut rest = &s[19..];
    let mut nanos: u32 = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        for (i, c) in frac[..digits].bytes().enumerate().take(9) {
            nanos += u32::from(c - b'0') * 10u32.pow(8 - i as u32);
        }
        rest = &frac[digits..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return Err(bad()),
            };
            let rb = rest.as_bytes();
            if rest.len() != 6 || rb[3] != b':' {
                return Err(bad());
            }
            let h: i64 = rest[1..3].parse().map_err(|_| bad())?;
            let m: i64 = rest[4..6].parse().map_err(|_| bad())?;
            if h > 23 || m > 59 {
                return Err(bad());
            }
            sign * (h * 3600 + m * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_secs;
    let time = if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nanos.into())
    };
    Ok(time)
}

/// Formats a time as RFC 3339 in UTC, with a fraction only when there is one.
pub fn format_rfc3339(t: SystemTime) -> String {
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let mut secs = -(d.as_secs() as i64);
            let mut nanos = d.subsec_nanos();
            if nanos > 0 {
                secs -= 1;
                nanos = 1_000_000_000 - nanos;
            }
            (secs, nanos)
        }
    };
    let days = secs.div_euclid(86_400);
    let day_secs = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (day_secs / 3600, day_secs / 60 % 60, day_secs % 60);
    if nanos == 0 {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
    } else {
        let frac = format!("{nanos:09}");
        format!(
            "{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{}Z",
            frac.trim_end_matches('0')
        )
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_kubernetes_timestamps() {
        let t = parse_rfc3339("2024-05-01T12:30:45Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_714_566_645
        );
        assert_eq!(format_rfc3339(t), "2024-05-01T12:30:45Z");
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");

        let offset = parse_rfc3339("2024-05-01T14:30:45.25+02:00").unwrap();
        assert_eq!(format_rfc3339(offset), "2024-05-01T12:30:45.25Z");
        let leap = parse_rfc3339("2000-02-29t00:00:00z").unwrap();
        assert_eq!(format_rfc3339(leap), "2000-02-29T00:00:00Z");
        let before = parse_rfc3339("1969-12-31T23:59:59.5Z").unwrap();
        assert_eq!(format_rfc3339(before), "1969-12-31T23:59:59.5Z");
    }

    #[test]
    fn rejects_what_is_not_rfc3339() {
        for bad in [
            "",
            "2024-05-01",
            "2024-05-01T12:30:45",
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-05-01T24:00:00Z",
            "2024-05-01T12:30:45.Z",
            "2024-05-01T12:30:45+0200",
            "yesterday at noon, roughly",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
