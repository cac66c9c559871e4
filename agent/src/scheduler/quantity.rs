//! Kubernetes resource quantities (`500m`, `2`, `128Mi`, `1G`, `1.5Gi`).

/// Parses a CPU quantity into millicores.
pub fn cpu_millis(q: &str) -> Result<u64, String> {
    let q = q.trim();
    if let Some(m) = q.strip_suffix('m') {
        return m
            .parse::<u64>()
            .map_err(|_| format!("invalid cpu quantity {q:?}"));
    }
    let cores: f64 = q
        .parse()
        .map_err(|_| format!("invalid cpu quantity {q:?}"))?;
    if !(cores.is_finite() && cores >= 0.0) {
        return Err(format!("invalid cpu quantity {q:?}"));
    }
    Ok((cores * 1000.0).round() as u64)
}

/// Parses a memory quantity into bytes.
pub fn bytes(q: &str) -> Result<u64, String> {
    let q = q.trim();
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("k", 1e3),
        ("K", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("m", 1e-3),
    ];
    let (number, factor) = SUFFIXES
        .iter()
        .find_map(|(s, f)| q.strip_suffix(s).map(|n| (n, *f)))
        .unwrap_or((q, 1.0));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid memory quantity {q:?}"))?;
    if !(value.is_finite() && value >= 0.0) {
        return Err(format!("invalid memory quantity {q:?}"));
    }
    Ok((value * factor).ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(cpu_millis("500m"), Ok(500));
        assert_eq!(cpu_millis("2"), Ok(2000));
        assert_eq!(cpu_millis("0.25"), Ok(250));
        assert!(cpu_millis("lots").is_err());
        assert_eq!(bytes("128Mi"), Ok(128 << 20));
        assert_eq!(bytes("1G"), Ok(1_000_000_000));
        assert_eq!(bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(bytes("1024"), Ok(1024));
        assert!(bytes("-1Mi").is_err());
    }
}
