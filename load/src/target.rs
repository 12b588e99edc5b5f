//! The server under load. Only this machine's loopback addresses are accepted: a
//! load generator pointed at someone else's server is a denial-of-service tool, and
//! every benchmark of this project runs client and server on one machine.

use std::net::IpAddr;

use reqwest::Url;

/// A checked base URL (`http://127.0.0.1:8000`), without a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    base: Url,
}

impl Target {
    /// Accepts `http://HOST[:PORT]` with an optional trailing `/v1` (what OpenAI
    /// clients call the base URL), where HOST is 127.0.0.1 (or any 127/8 address),
    /// ::1 or localhost.
    pub fn parse(url: &str) -> anyhow::Result<Target> {
        let base = Url::parse(url).map_err(|e| anyhow::anyhow!("`{url}` is not a URL: {e}"))?;
        if base.scheme() != "http" {
            anyhow::bail!("`{url}`: only http:// is supported (the target is a local server)");
        }
        if !is_loopback(&base) {
            anyhow::bail!(
                "refusing target `{url}`: tokenrouter-load only sends load to this machine \
                 (127.0.0.1, ::1 or localhost)"
            );
        }
        let path = base.path().trim_end_matches('/');
        if !(path.is_empty() || path == "/v1") {
            anyhow::bail!("`{url}`: give the server's base URL (http://127.0.0.1:8000), not an endpoint path");
        }
        let mut base = base;
        base.set_path("");
        base.set_query(None);
        base.set_fragment(None);
        Ok(Target { base })
    }

    /// The URL of an API path such as `/v1/completions`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base.as_str().trim_end_matches('/'), path)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.base.as_str().trim_end_matches('/'))
    }
}

fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else { return false };
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    // IPv6 hosts come bracketed (`[::1]`).
    match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(IpAddr::V6(ip)) => ip.is_loopback(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_targets_are_accepted_and_normalized() {
        for (url, base) in [
            ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
            ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
            ("http://localhost:9", "http://localhost:9"),
            ("http://[::1]:8000/", "http://[::1]:8000"),
            ("http://127.1.2.3", "http://127.1.2.3"),
        ] {
            let t = Target::parse(url).unwrap();
            assert_eq!(t.to_string(), base);
            assert_eq!(t.url("/v1/models"), format!("{base}/v1/models"));
        }
    }

    #[test]
    fn other_hosts_schemes_and_paths_are_refused() {
        for url in ["http://10.0.0.1:8000", "http://example.com", "http://[2001:db8::1]:80", "http://0.0.0.0:8000"] {
            let e = Target::parse(url).unwrap_err().to_string();
            assert!(e.contains("refusing target") && e.contains("127.0.0.1, ::1 or localhost"), "{e}");
        }
        assert!(Target::parse("https://127.0.0.1").unwrap_err().to_string().contains("only http://"));
        assert!(Target::parse("http://127.0.0.1/v1/completions").unwrap_err().to_string().contains("base URL"));
        assert!(Target::parse("127.0.0.1:8000").is_err());
    }
}
