//! Replica addresses as users write them: `host:port`, optionally with an `http://` or
//! `https://` scheme and a trailing slash. Every client and the configuration checks use these,
//! so an address is accepted and compared the same way everywhere.

/// `host:port` of an endpoint given with or without a scheme (`http://`, `https://`) and
/// trailing slash.
pub fn strip_scheme(endpoint: &str) -> &str {
    let e = endpoint.trim();
    let e = e.strip_prefix("https://").or_else(|| e.strip_prefix("http://")).unwrap_or(e);
    e.trim_end_matches('/')
}

/// The form endpoints are compared in: no scheme, no trailing slash, no spaces.
pub fn normalize(endpoint: &str) -> String {
    strip_scheme(endpoint).to_owned()
}

/// Whether `addr` is `host:port` with a non-empty host and a port in 1..=65535.
pub fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_compared_without_scheme_and_checked_for_a_port() {
        assert_eq!(normalize(" http://a:1/ "), "a:1");
        assert_eq!(strip_scheme("https://b:2"), "b:2");
        assert!(is_host_port("10.0.0.1:7400"));
        assert!(is_host_port("[::1]:7400"));
        assert!(!is_host_port("a:0"));
        assert!(!is_host_port(":7400"));
        assert!(!is_host_port("a"));
        assert!(!is_host_port("a:99999"));
    }
}
