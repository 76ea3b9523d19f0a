//! Who is calling the console.
//!
//! A caller proves it holds the cluster's admin token either per request (`Authorization:
//! Bearer <token>`, for scripts) or once, on the login form, which sets a session cookie
//! (`HttpOnly`, `SameSite=Strict`). The cookie holds an HMAC under a key drawn at start, never the
//! token, and is valid until the console restarts. Actions always need one of the two; views
//! need one only when the console is configured so (`views_need_token`).
//!
//! Cross-site request forgery: actions are POST only; a POST authenticated by the cookie must
//! come from a page of this console (`Origin`, or failing it `Referer`, names the same host as
//! `Host`). A bearer token is never sent by a browser on its own, so it needs no such check.

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN, REFERER};
use cairn_proto::auth::Secret;
use ring::hmac;

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "cairn_console_session";
const SESSION_MESSAGE: &[u8] = b"cairn-console-session-v1";

/// How a caller authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// `Authorization: Bearer` with the admin token.
    Bearer,
    /// The session cookie set by the login form.
    Session,
    /// Neither.
    Anonymous,
}

impl Caller {
    pub fn is_authenticated(self) -> bool {
        self != Self::Anonymous
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("wrong admin token")]
    WrongToken,
    #[error("malformed Authorization header: expected `Bearer <admin token>`")]
    MalformedHeader,
    #[error("this needs the cluster's admin token: log in, or send `Authorization: Bearer <token>`")]
    Missing,
    #[error("cross-site request refused: {0}")]
    CrossSite(String),
}

/// The console's authentication: the admin token and the session key.
pub struct Gate {
    token: Secret,
    session_key: hmac::Key,
    views_need_token: bool,
}

impl Gate {
    pub fn new(token: &str, views_need_token: bool) -> Result<Self, String> {
        let token = Secret::new("the admin token", token)?;
        let key: [u8; 32] = rand::random();
        Ok(Self { token, session_key: hmac::Key::new(hmac::HMAC_SHA256, &key), views_need_token })
    }

    pub fn views_need_token(&self) -> bool {
        self.views_need_token
    }

    /// Whether `presented` is the admin token (constant time).
    pub fn is_token(&self, presented: &str) -> bool {
        self.token.matches(presented.as_bytes())
    }

    /// The value of the session cookie this console issues.
    pub fn session_value(&self) -> String {
        hex(hmac::sign(&self.session_key, SESSION_MESSAGE).as_ref())
    }

    /// Who is calling. A bearer header that is present but wrong is an error, not anonymous.
    pub fn caller(&self, headers: &HeaderMap) -> Result<Caller, AuthError> {
        if let Some(value) = headers.get(AUTHORIZATION) {
            let value = value.to_str().map_err(|_| AuthError::MalformedHeader)?;
            let token = value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
                .ok_or(AuthError::MalformedHeader)?;
            return if self.is_token(token.trim()) { Ok(Caller::Bearer) } else { Err(AuthError::WrongToken) };
        }
        let valid_session = cookie(headers, SESSION_COOKIE)
            .and_then(unhex)
            .is_some_and(|tag| hmac::verify(&self.session_key, SESSION_MESSAGE, &tag).is_ok());
        Ok(if valid_session { Caller::Session } else { Caller::Anonymous })
    }

    /// The caller of a view: anyone, unless views need the token.
    pub fn view(&self, headers: &HeaderMap) -> Result<Caller, AuthError> {
        let caller = self.caller(headers)?;
        if self.views_need_token && !caller.is_authenticated() {
            return Err(AuthError::Missing);
        }
        Ok(caller)
    }

    /// The caller of an action: authenticated, and from this console's own pages when by cookie.
    pub fn action(&self, headers: &HeaderMap) -> Result<Caller, AuthError> {
        let caller = self.caller(headers)?;
        match caller {
            Caller::Anonymous => Err(AuthError::Missing),
            Caller::Bearer => Ok(caller),
            Caller::Session => {
                same_origin(headers, true)?;
                Ok(caller)
            }
        }
    }
}

/// Checks that a browser request comes from a page of this host. With `required`, a request
/// naming neither `Origin` nor `Referer` is refused; without, only a foreign one is.
pub fn same_origin(headers: &HeaderMap, required: bool) -> Result<(), AuthError> {
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .ok_or_else(|| AuthError::CrossSite("the request has no Host header".into()))?;
    let origin_host = |url: &str| -> Option<String> {
        let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"))?;
        Some(rest.split('/').next().unwrap_or_default().to_owned())
    };
    let named = match (headers.get(ORIGIN), headers.get(REFERER)) {
        (Some(o), _) => Some(o.to_str().ok().and_then(origin_host).unwrap_or_default()),
        (None, Some(r)) => Some(r.to_str().ok().and_then(origin_host).unwrap_or_default()),
        (None, None) => None,
    };
    match named {
        Some(h) if h.eq_ignore_ascii_case(host) => Ok(()),
        Some(h) => Err(AuthError::CrossSite(format!("the request comes from `{h}`, not from this console"))),
        None if required => {
            Err(AuthError::CrossSite("the request names no Origin; submit it from the console's page".into()))
        }
        None => Ok(()),
    }
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    const TOKEN: &str = "0123456789abcdef0123";

    fn headers(pairs: &[(axum::http::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("x")));
        }
        h
    }

    #[test]
    fn bearer_token_is_checked() -> Result<(), String> {
        let g = Gate::new(TOKEN, false)?;
        assert_eq!(g.caller(&headers(&[(AUTHORIZATION, &format!("Bearer {TOKEN}"))])), Ok(Caller::Bearer));
        assert_eq!(
            g.caller(&headers(&[(AUTHORIZATION, "Bearer nope-nope-nope-nope")])),
            Err(AuthError::WrongToken)
        );
        assert_eq!(g.caller(&headers(&[(AUTHORIZATION, TOKEN)])), Err(AuthError::MalformedHeader));
        assert_eq!(g.caller(&HeaderMap::new()), Ok(Caller::Anonymous));
        Ok(())
    }

    #[test]
    fn session_cookie_needs_this_consoles_key() -> Result<(), String> {
        let g = Gate::new(TOKEN, true)?;
        let other = Gate::new(TOKEN, true)?;
        let mine = format!("a=b; {SESSION_COOKIE}={}", g.session_value());
        assert_eq!(g.caller(&headers(&[(COOKIE, &mine)])), Ok(Caller::Session));
        let theirs = format!("{SESSION_COOKIE}={}", other.session_value());
        assert_eq!(g.caller(&headers(&[(COOKIE, &theirs)])), Ok(Caller::Anonymous));
        assert_eq!(g.caller(&headers(&[(COOKIE, &format!("{SESSION_COOKIE}=zz"))])), Ok(Caller::Anonymous));
        assert_eq!(g.view(&HeaderMap::new()), Err(AuthError::Missing));
        Ok(())
    }

    #[test]
    fn cookie_actions_need_the_same_origin() -> Result<(), String> {
        let g = Gate::new(TOKEN, false)?;
        let c = format!("{SESSION_COOKIE}={}", g.session_value());
        let ok = headers(&[(COOKIE, &c), (HOST, "127.0.0.1:8080"), (ORIGIN, "http://127.0.0.1:8080")]);
        assert_eq!(g.action(&ok), Ok(Caller::Session));
        let by_referer =
            headers(&[(COOKIE, &c), (HOST, "127.0.0.1:8080"), (REFERER, "http://127.0.0.1:8080/jobs/a")]);
        assert_eq!(g.action(&by_referer), Ok(Caller::Session));
        let foreign = headers(&[(COOKIE, &c), (HOST, "127.0.0.1:8080"), (ORIGIN, "http://evil.example")]);
        assert!(matches!(g.action(&foreign), Err(AuthError::CrossSite(_))));
        let silent = headers(&[(COOKIE, &c), (HOST, "127.0.0.1:8080")]);
        assert!(matches!(g.action(&silent), Err(AuthError::CrossSite(_))));
        assert_eq!(g.action(&headers(&[(HOST, "127.0.0.1:8080")])), Err(AuthError::Missing));
        Ok(())
    }
}
