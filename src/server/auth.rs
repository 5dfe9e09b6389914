//! API keys: who may use the server and under which name. A server has no key (open, for one
//! user on this machine), one key (`--api-key`, named `default`), or a file of named keys
//! (`--api-key-file`), so that a team's server can tell its users apart (per-key request caps,
//! per-key prefix cache). Keys are compared in constant time, over the longer of the two lengths,
//! so neither the contents nor the length of a key leaks through response timing.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The name `--api-key` (and `RILL_API_KEY`) gets.
pub const DEFAULT_KEY_NAME: &str = "default";

struct ApiKey {
    name: Arc<str>,
    secret: Vec<u8>,
}

/// The configured keys; empty = no authentication.
#[derive(Default)]
pub struct ApiKeys {
    keys: Vec<ApiKey>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@'))
}

impl ApiKeys {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Add a key. `origin` names where it came from, for the error message.
    pub fn add(&mut self, name: &str, key: &str, origin: &str) -> Result<()> {
        if key.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{origin}: the API key is empty (an empty key would turn authentication off; \
                 leave the key out to run without one)"
            )));
        }
        if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::InvalidArgument(format!(
                "{origin}: the API key contains whitespace or control characters"
            )));
        }
        if !valid_name(name) {
            return Err(Error::InvalidArgument(format!(
                "{origin}: key name '{name}' must be 1 to 64 characters of A-Z a-z 0-9 _ - . @"
            )));
        }
        if self.keys.iter().any(|k| &*k.name == name) {
            return Err(Error::InvalidArgument(format!(
                "{origin}: key name '{name}' is used twice"
            )));
        }
        if self.keys.iter().any(|k| k.secret == key.as_bytes()) {
            return Err(Error::InvalidArgument(format!(
                "{origin}: key '{name}' is the same as another key (each user needs their own)"
            )));
        }
        self.keys.push(ApiKey {
            name: name.into(),
            secret: key.as_bytes().to_vec(),
        });
        Ok(())
    }

    /// Read a key file: one `NAME:KEY` per line; blank lines and lines starting with `#` are
    /// skipped.
    pub fn add_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let before = self.keys.len();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let origin = format!("{}, line {}", path.display(), i + 1);
            let Some((name, key)) = line.split_once(':') else {
                return Err(Error::InvalidArgument(format!("{origin}: expected NAME:KEY")));
            };
            self.add(name.trim(), key.trim(), &origin)?;
        }
        if self.keys.len() == before {
            return Err(Error::InvalidArgument(format!(
                "{}: no keys in the file",
                path.display()
            )));
        }
        Ok(())
    }

    /// The name of the key an `Authorization` header value carries, if it is one of ours.
    /// Every key is compared in full whatever matches, in time independent of the contents.
    pub fn check(&self, authorization: Option<&str>) -> Option<Arc<str>> {
        let token = authorization.and_then(bearer_token)?;
        let mut found = None;
        for k in &self.keys {
            if constant_time_eq(token.as_bytes(), &k.secret) {
                found = Some(Arc::clone(&k.name));
            }
        }
        found
    }
}

/// The credentials of a `Bearer` authorization (RFC 7235: the scheme is case-insensitive).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim_start())
}

/// Equality in time that depends only on the longer length: every byte position of the longer
/// input is visited, the shorter reading as zeros, and a length difference counts as a mismatch.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = a.len() ^ b.len();
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// Whether `host` is reachable from other machines (anything but a loopback address).
pub fn is_exposed(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if h.eq_ignore_ascii_case("localhost") {
        return false;
    }
    match h.parse::<std::net::IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> ApiKeys {
        let mut k = ApiKeys::default();
        k.add("alice", "sk-alice-1", "test").unwrap();
        k.add("bob", "sk-bob-22", "test").unwrap();
        k
    }

    #[test]
    fn scheme_is_case_insensitive_and_names_come_back() {
        let k = keys();
        for h in [
            "Bearer sk-alice-1",
            "bearer sk-alice-1",
            "BEARER  sk-alice-1",
            " Bearer sk-alice-1 ",
        ] {
            assert_eq!(k.check(Some(h)).as_deref(), Some("alice"), "{h}");
        }
        assert_eq!(k.check(Some("Bearer sk-bob-22")).as_deref(), Some("bob"));
        for h in [
            "Basic sk-alice-1",
            "Bearer",
            "Bearer ",
            "sk-alice-1",
            "Bearer sk-alice-",
            "Bearer sk-alice-11",
        ] {
            assert_eq!(k.check(Some(h)), None, "{h}");
        }
        assert_eq!(k.check(None), None);
    }

    #[test]
    fn compare_covers_the_longer_length() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"abc\0", b"abc"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn empty_and_duplicate_keys_are_refused() {
        let mut k = ApiKeys::default();
        assert!(k.add("a", "", "--api-key").is_err());
        assert!(k.add("", "x", "file").is_err());
        assert!(k.add("a b", "x", "file").is_err());
        k.add("a", "x", "file").unwrap();
        assert!(k.add("a", "y", "file").is_err());
        assert!(k.add("b", "x", "file").is_err());
    }

    #[test]
    fn exposed_hosts() {
        for h in ["0.0.0.0", "::", "[::]", "192.168.1.5", "example.com"] {
            assert!(is_exposed(h), "{h}");
        }
        for h in ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"] {
            assert!(!is_exposed(h), "{h}");
        }
    }
}
