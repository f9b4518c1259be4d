//! Token files: the shared secrets of far-memory tenants, read by `farmem server` and by the
//! TCP backend.
//!
//! One entry per line. A line whose first character other than blanks is `#` is a comment;
//! a `#` anywhere else is part of the line (secrets may contain it), so there are no
//! comments at the end of a line:
//!
//! ```text
//! # a bare secret: any tenant that knows it may connect (one shared secret)
//! 9f2c1e0a7b...
//! # or per tenant: name, secret, and optionally its fair-share weight and quota
//! alice  3d7e...  weight=2 quota=8G
//! bob    a41b#9...
//! ```
//!
//! The server accepts a tenant that has its own line with that line's secret, and any other
//! tenant with the bare secret if there is one. A client uses its tenant's line if there is
//! one, else the bare secret, so one file can serve both sides on a test machine. With a bare
//! secret, a tenant is only a name: whoever knows that secret may use any tenant name that
//! has no line of its own, so those tenants are not isolated from each other.

use crate::auth::Secret;
use crate::layout::valid_tenant;
use crate::size::parse_size;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenEntry {
    /// `None` for a bare (shared) secret.
    pub tenant: Option<String>,
    pub secret: Secret,
    pub weight: Option<u32>,
    pub quota_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenFile {
    pub entries: Vec<TokenEntry>,
}

impl TokenFile {
    pub fn parse(text: &str) -> Result<TokenFile, String> {
        let mut entries: Vec<TokenEntry> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |msg: String| format!("line {}: {msg}", n + 1);
            let fields: Vec<&str> = line.split_whitespace().collect();
            let entry = if fields.len() == 1 {
                TokenEntry {
                    tenant: None,
                    secret: Secret::from_text(fields[0]).expect("non-empty field"),
                    weight: None,
                    quota_bytes: None,
                }
            } else {
                let tenant = fields[0];
                if !valid_tenant(tenant) {
                    return Err(at(format!(
                        "tenant name '{tenant}' must be 1-64 characters of A-Z a-z 0-9 . _ -"
                    )));
                }
                let mut e = TokenEntry {
                    tenant: Some(tenant.to_string()),
                    secret: Secret::from_text(fields[1]).expect("non-empty field"),
                    weight: None,
                    quota_bytes: None,
                };
                for opt in &fields[2..] {
                    match opt.split_once('=') {
                        Some(("weight", v)) => {
                            let w: u32 = v
                                .parse()
                                .ok()
                                .filter(|w| (1..=1000).contains(w))
                                .ok_or_else(|| {
                                    at(format!("weight '{v}' must be an integer in 1..=1000"))
                                })?;
                            e.weight = Some(w);
                        }
                        Some(("quota", v)) => {
                            e.quota_bytes =
                                Some(parse_size(v).map_err(|err| at(format!("quota: {err}")))?);
                        }
                        _ => {
                            return Err(at(format!(
                                "unknown option '{opt}': expected weight=N or quota=SIZE"
                            )))
                        }
                    }
                }
                e
            };
            if entries.iter().any(|x| x.tenant == entry.tenant) {
                return Err(at(match &entry.tenant {
                    Some(t) => format!("tenant '{t}' is listed twice"),
                    None => "more than one bare secret".to_string(),
                }));
            }
            entries.push(entry);
        }
        if entries.is_empty() {
            return Err("no secret in the file".into());
        }
        Ok(TokenFile { entries })
    }

    /// The bare secret, if any.
    pub fn shared(&self) -> Option<&Secret> {
        self.entries
            .iter()
            .find(|e| e.tenant.is_none())
            .map(|e| &e.secret)
    }

    /// The entry of a named tenant.
    pub fn tenant(&self, name: &str) -> Option<&TokenEntry> {
        self.entries
            .iter()
            .find(|e| e.tenant.as_deref() == Some(name))
    }

    /// The secret `tenant` authenticates with: its own, else the bare one.
    pub fn secret_for(&self, tenant: &str) -> Option<&Secret> {
        self.tenant(tenant).map(|e| &e.secret).or(self.shared())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bare_and_per_tenant_entries() {
        let f = TokenFile::parse(
            "# comment\n  shared-secret \nalice s1 weight=2 quota=1G\n\t # indented\nbob s2\n",
        )
        .unwrap();
        assert_eq!(f.entries.len(), 3);
        let a = f.tenant("alice").unwrap();
        assert_eq!((a.weight, a.quota_bytes), (Some(2), Some(1 << 30)));
        assert_eq!(f.secret_for("bob"), Secret::from_text("s2").as_ref());
        assert_eq!(
            f.secret_for("carol"),
            Secret::from_text("shared-secret").as_ref()
        );
        let only_tenants = TokenFile::parse("alice s1\n").unwrap();
        assert!(only_tenants.secret_for("carol").is_none());
    }

    #[test]
    fn a_hash_inside_a_secret_is_part_of_it() {
        let f = TokenFile::parse("pa#ssword#1\nalice #s#2 quota=1M\n  #bob s3\n").unwrap();
        assert_eq!(f.shared(), Secret::from_text("pa#ssword#1").as_ref());
        assert_eq!(
            f.secret_for("alice"),
            Secret::from_text("#s#2").as_ref(),
            "a secret may even start with #"
        );
        assert!(
            f.tenant("bob").is_none(),
            "a line starting with # is a comment"
        );
        // What used to be a trailing comment is now an option, and refused as one.
        let e = TokenFile::parse("alice s1 # note").unwrap_err();
        assert!(e.contains("unknown option '#'"), "{e}");
    }

    #[test]
    fn rejects_bad_files_with_the_line() {
        for (text, want) in [
            ("", "no secret"),
            ("alice s1 weight=0", "line 1: weight"),
            ("a s\nalice s1 colour=red", "line 2: unknown option"),
            ("bad/name s1", "tenant name"),
            ("x\ny", "more than one bare secret"),
            ("alice a\nalice b", "listed twice"),
            ("alice s quota=lots", "quota"),
        ] {
            let e = TokenFile::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
