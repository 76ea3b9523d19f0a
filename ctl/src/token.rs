//! Where the admin token comes from.
//!
//! Precedence, first found wins: `--token`, `--token-file`, `CAIRN_ADMIN_TOKEN`,
//! `CAIRN_ADMIN_TOKEN_FILE`. The two flags exclude each other (clap refuses both); an environment
//! variable set to the empty string counts as unset. A token file's trailing newline (and any
//! trailing whitespace) is trimmed, so `echo secret > file` works.

use std::path::{Path, PathBuf};

pub const ENV_TOKEN: &str = "CAIRN_ADMIN_TOKEN";
pub const ENV_TOKEN_FILE: &str = "CAIRN_ADMIN_TOKEN_FILE";

/// Why no usable token was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error(
        "no admin token: pass --token, --token-file or set CAIRN_ADMIN_TOKEN; a single-node cluster \
         writes one to <data_dir>/admin-token"
    )]
    Missing,
    #[error("cannot read the admin token file {path:?} (from {from}): {reason}; check the path")]
    Unreadable { path: PathBuf, from: &'static str, reason: String },
    #[error("the admin token from {from} is empty; {hint}")]
    Empty { from: &'static str, hint: &'static str },
    #[error("invalid admin token: {reason}")]
    Invalid { reason: String },
}

/// The places a token may come from, as given.
#[derive(Debug, Clone, Default)]
pub struct TokenSources {
    pub flag: Option<String>,
    pub flag_file: Option<PathBuf>,
    pub env: Option<String>,
    pub env_file: Option<PathBuf>,
}

impl TokenSources {
    /// The flags, plus the two environment variables of this process.
    pub fn from_flags_and_env(flag: Option<String>, flag_file: Option<PathBuf>) -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        Self {
            flag,
            flag_file,
            env: var(ENV_TOKEN).map(|v| v.to_string_lossy().into_owned()),
            env_file: var(ENV_TOKEN_FILE).map(PathBuf::from),
        }
    }

    /// Picks the token by precedence; `read` reads a token file.
    pub fn resolve(&self, read: impl Fn(&Path) -> std::io::Result<String>) -> Result<String, TokenError> {
        let from_file = |path: &PathBuf, from: &'static str| {
            let text = read(path).map_err(|e| TokenError::Unreadable {
                path: path.clone(),
                from,
                reason: e.to_string(),
            })?;
            check(text.trim_end(), from, "write the token into the file")
        };
        if let Some(t) = &self.flag {
            return check(t, "--token", "pass the token itself");
        }
        if let Some(p) = &self.flag_file {
            return from_file(p, "--token-file");
        }
        if let Some(t) = &self.env {
            return check(t, ENV_TOKEN, "set it to the token");
        }
        if let Some(p) = &self.env_file {
            return from_file(p, ENV_TOKEN_FILE);
        }
        Err(TokenError::Missing)
    }
}

/// A token goes into an HTTP header: printable ASCII, no spaces.
fn check(token: &str, from: &'static str, hint: &'static str) -> Result<String, TokenError> {
    if token.is_empty() {
        return Err(TokenError::Empty { from, hint });
    }
    if let Some(c) = token.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(TokenError::Invalid {
            reason: format!(
                "the token from {from} contains {c:?}; only printable ASCII without spaces is allowed"
            ),
        });
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_ok(p: &Path) -> std::io::Result<String> {
        Ok(format!("from-{}\n", p.display()))
    }

    fn all() -> TokenSources {
        TokenSources {
            flag: Some("flag".into()),
            flag_file: Some("ff".into()),
            env: Some("env".into()),
            env_file: Some("ef".into()),
        }
    }

    #[test]
    fn flags_beat_files_beat_environment() {
        let mut s = all();
        assert_eq!(s.resolve(read_ok).unwrap(), "flag");
        s.flag = None;
        assert_eq!(s.resolve(read_ok).unwrap(), "from-ff");
        s.flag_file = None;
        assert_eq!(s.resolve(read_ok).unwrap(), "env");
        s.env = None;
        assert_eq!(s.resolve(read_ok).unwrap(), "from-ef");
        s.env_file = None;
        assert_eq!(s.resolve(read_ok).unwrap_err(), TokenError::Missing);
        assert!(TokenError::Missing.to_string().contains("<data_dir>/admin-token"));
    }

    #[test]
    fn token_file_trailing_newline_is_trimmed() {
        let s = TokenSources { flag_file: Some("x".into()), ..Default::default() };
        assert_eq!(s.resolve(|_| Ok("s3cret\r\n".into())).unwrap(), "s3cret");
    }

    #[test]
    fn unreadable_empty_and_invalid_tokens_are_explained() {
        let s = TokenSources { flag_file: Some("/no/such".into()), ..Default::default() };
        let err = s.resolve(|_| Err(std::io::Error::from(std::io::ErrorKind::NotFound))).unwrap_err();
        assert!(matches!(err, TokenError::Unreadable { from: "--token-file", .. }), "{err}");
        assert!(err.to_string().contains("/no/such"), "{err}");
        let err = s.resolve(|_| Ok("\n".into())).unwrap_err();
        assert!(matches!(err, TokenError::Empty { from: "--token-file", .. }), "{err}");
        let s = TokenSources { flag: Some("a b".into()), ..Default::default() };
        assert!(matches!(s.resolve(read_ok).unwrap_err(), TokenError::Invalid { .. }));
    }
}
