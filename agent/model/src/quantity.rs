//! Kubernetes resource quantities (`500m`, `2`, `128Mi`, `1G`, `1.5Gi`, `1e3`, `9E`), parsed
//! exactly (no floating point) and bounded: a quantity whose value in the unit asked for
//! (millicores, bytes) does not fit an `i64` is an error, as it cannot be a cgroup setting
//! or a sum the scheduler can make. Values are rounded up, like the apiserver's
//! `MilliValue()`/`Value()`.

/// The largest value any parsed quantity may have in its unit (cgroups and Kubernetes use
/// signed 64-bit integers).
pub const MAX: u64 = i64::MAX as u64;

/// Why a quantity was refused; `what` names it as the message shows it (`quantity`,
/// `cpu quantity`, `memory quantity`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("invalid {what} {quantity:?}")]
    Invalid {
        what: &'static str,
        quantity: String,
    },
    #[error("{what} {quantity:?} must not be negative")]
    Negative {
        what: &'static str,
        quantity: String,
    },
    #[error("{what} {quantity:?} has too many digits")]
    TooManyDigits {
        what: &'static str,
        quantity: String,
    },
    #[error("{what} {quantity:?} is too large (at most {MAX} in its unit)")]
    TooLarge {
        what: &'static str,
        quantity: String,
    },
}

/// `value = digits × 10^exp10 × 2^exp2`, exact.
struct Parsed {
    digits: u128,
    exp10: i32,
    exp2: u32,
}

fn parse(q: &str, what: &'static str) -> Result<Parsed, QuantityError> {
    let q = q.trim();
    let bad = || QuantityError::Invalid {
        what,
        quantity: q.to_owned(),
    };
    // The suffix: binary (Ki…Ei), decimal SI (n u m k M G T P E) or an exponent (e3, E-2).
    const BINARY: &[(&str, u32)] = &[
        ("Ki", 10),
        ("Mi", 20),
        ("Gi", 30),
        ("Ti", 40),
        ("Pi", 50),
        ("Ei", 60),
    ];
    const DECIMAL: &[(&str, i32)] = &[
        ("n", -9),
        ("u", -6),
        ("m", -3),
        ("k", 3),
        ("M", 6),
        ("G", 9),
        ("T", 12),
        ("P", 15),
        ("E", 18),
    ];
    let number_end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(number_end);
    let (mut exp10, mut exp2) = (0i32, 0u32);
    if suffix.is_empty() {
    } else if let Some((_, e)) = BINARY.iter().find(|(s, _)| *s == suffix) {
        exp2 = *e;
    } else if let Some((_, e)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        exp10 = *e;
    } else if let Some(exp) = suffix.strip_prefix(['e', 'E']) {
        exp10 = exp
            .parse::<i32>()
            .ok()
            .filter(|e| e.abs() <= 40)
            .ok_or_else(bad)?;
    } else {
        return Err(bad());
    }
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.starts_with('-') {
        return Err(QuantityError::Negative {
            what,
            quantity: q.to_owned(),
        });
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let all = format!("{whole}{fraction}");
    let all = all.trim_start_matches('0');
    // 38 significant digits fit a u128; Kubernetes' own limit is far below that.
    if all.len() > 38 {
        return Err(QuantityError::TooManyDigits {
            what,
            quantity: q.to_owned(),
        });
    }
    let digits = if all.is_empty() {
        0
    } else {
        all.parse::<u128>().map_err(|_| bad())?
    };
    exp10 -= i32::try_from(fraction.len()).map_err(|_| bad())?;
    Ok(Parsed {
        digits,
        exp10,
        exp2,
    })
}

/// The quantity's value × 10^`scale`, rounded up, if it fits [`MAX`].
fn scaled(q: &str, scale: i32, what: &'static str) -> Result<u64, QuantityError> {
    let p = parse(q, what)?;
    let too_large = || QuantityError::TooLarge {
        what,
        quantity: q.trim().to_owned(),
    };
    if p.digits == 0 {
        return Ok(0);
    }
    let exp10 = p.exp10 + scale;
    let mut numerator = p.digits;
    let mut denominator: u128 = 1;
    if exp10 >= 0 {
        for _ in 0..exp10 {
            numerator = numerator.checked_mul(10).ok_or_else(too_large)?;
        }
    } else {
        for _ in 0..-exp10 {
            // Past 10^38 the value rounds up to 1 whatever the digits: stop early.
            match denominator.checked_mul(10) {
                Some(d) => denominator = d,
                None => return Ok(1),
            }
        }
    }
    numerator = numerator
        .checked_mul(1u128 << p.exp2)
        .ok_or_else(too_large)?;
    let value = numerator.div_ceil(denominator);
    u64::try_from(value)
        .ok()
        .filter(|v| *v <= MAX)
        .ok_or_else(too_large)
}

/// Parses a CPU quantity into millicores.
pub fn cpu_millis(q: &str) -> Result<u64, QuantityError> {
    scaled(q, 3, "cpu quantity")
}

/// Parses a memory quantity into bytes.
pub fn bytes(q: &str) -> Result<u64, QuantityError> {
    scaled(q, 0, "memory quantity")
}

/// Bytes as the canonical quantity Kubernetes prints: the largest binary suffix that divides
/// them exactly (`16Mi`, `1536Mi`, `1000`).
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if value == 0 || !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    format!("{value}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_as_kubernetes_prints_them() {
        for (b, text) in [
            (0, "0"),
            (1000, "1000"),
            (16 << 20, "16Mi"),
            (1536 << 20, "1536Mi"),
            (1 << 50, "1Pi"),
            (u64::MAX, "18446744073709551615"),
        ] {
            assert_eq!(format_bytes(b), text);
        }
        assert_eq!(bytes(&format_bytes(1536 << 20)), Ok(1536 << 20));
    }

    #[test]
    fn quantities() {
        assert_eq!(cpu_millis("500m"), Ok(500));
        assert_eq!(cpu_millis("2"), Ok(2000));
        assert_eq!(cpu_millis("0.25"), Ok(250));
        assert_eq!(cpu_millis("1e3"), Ok(1_000_000));
        assert_eq!(cpu_millis("100u"), Ok(1), "rounded up like MilliValue");
        assert!(cpu_millis("lots").is_err());
        assert_eq!(bytes("128Mi"), Ok(128 << 20));
        assert_eq!(bytes("1G"), Ok(1_000_000_000));
        assert_eq!(bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(bytes("1024"), Ok(1024));
        assert_eq!(bytes("9E"), Ok(9_000_000_000_000_000_000));
        assert_eq!(bytes("7Ei"), Ok(7 << 60));
        assert_eq!(bytes("0.5"), Ok(1));
        assert_eq!(bytes("1E-40"), Ok(1));
        assert_eq!(bytes("0"), Ok(0));
        assert!(bytes("-1Mi").unwrap_err().to_string().contains("negative"));
        assert!(bytes("1.2.3").is_err());
        assert!(bytes("Mi").is_err());
        assert!(bytes("1Xi").is_err());
    }

    #[test]
    fn values_beyond_an_i64_are_errors_not_wraps() {
        // Issue #13, hole 3: `cpu: 1e16` is 1e19 millicores; `memory: 8Ei` is 2^63 bytes.
        assert!(
            cpu_millis("1e16")
                .unwrap_err()
                .to_string()
                .contains("too large")
        );
        assert!(bytes("8Ei").unwrap_err().to_string().contains("too large"));
        assert!(bytes("99999999999999999999999999999999999999999").is_err());
        assert!(bytes("1e40").unwrap_err().to_string().contains("too large"));
        assert_eq!(bytes("9223372036854775807"), Ok(MAX));
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics(q in "[-+0-9.eEkKMGTPimnu]{0,24}") {
            let _ = cpu_millis(&q);
            let _ = bytes(&q);
        }
    }
}
