//! `strftime_now(format)` for chat templates (Llama-3.x writes "Today Date: 26 Jul 2024" with it).
//! transformers calls Python's `datetime.now().strftime`; this is the C-locale subset templates use,
//! in UTC, without pulling a date crate in for one line of a prompt.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Seconds since the Unix epoch now (0 if the clock is before 1970).
pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Formats `unix_seconds` (UTC) with `%Y %y %m %d %e %j %B %b %h %A %a %H %I %M %S %p %F %D %T %%`.
pub fn strftime(format: &str, unix_seconds: i64) -> Result<String, String> {
    let days = unix_seconds.div_euclid(86_400);
    let seconds_of_day = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (seconds_of_day / 3600, seconds_of_day / 60 % 60, seconds_of_day % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3 from Monday)
    let month_name = MONTHS[month as usize - 1];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let directive = chars.next().ok_or("format ends with a lone %")?;
        let piece = match directive {
            'Y' => year.to_string(),
            'y' => format!("{:02}", year.rem_euclid(100)),
            'm' => format!("{month:02}"),
            'd' => format!("{day:02}"),
            'e' => format!("{day:>2}"),
            'j' => format!("{:03}", days - days_from_civil(year, 1, 1) + 1),
            'B' => month_name.to_owned(),
            'b' | 'h' => month_name[..3].to_owned(),
            'A' => WEEKDAYS[weekday].to_owned(),
            'a' => WEEKDAYS[weekday][..3].to_owned(),
            'H' => format!("{hour:02}"),
            'I' => format!("{hour12:02}"),
            'M' => format!("{minute:02}"),
            'S' => format!("{second:02}"),
            'p' => (if hour < 12 { "AM" } else { "PM" }).to_owned(),
            'F' => format!("{year}-{month:02}-{day:02}"),
            'D' => format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            'T' => format!("{hour:02}:{minute:02}:{second:02}"),
            '%' => "%".to_owned(),
            other => return Err(format!("strftime directive %{other} is not supported")),
        };
        out.push_str(&piece);
    }
    Ok(out)
}

/// Proleptic Gregorian (year, month, day) of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153; // March = 0
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let shifted_month = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates_format_like_python() {
        // 2024-07-26 14:05:09 UTC, a Friday.
        let t = days_from_civil(2024, 7, 26) * 86_400 + 14 * 3600 + 5 * 60 + 9;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(strftime("%A %d %B %y, %I:%M:%S %p (%j) %%", t).unwrap(), "Friday 26 July 24, 02:05:09 PM (208) %");
        assert_eq!(strftime("%F %T", 0).unwrap(), "1970-01-01 00:00:00");
        assert_eq!(strftime("%a %e %b", days_from_civil(2000, 2, 29) * 86_400).unwrap(), "Tue 29 Feb");
    }

    #[test]
    fn days_round_trip_across_centuries() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn unsupported_directives_are_errors() {
        assert!(strftime("%Q", 0).unwrap_err().contains("%Q"));
        assert!(strftime("50%", 0).is_err());
    }
}
