//! The secrets clients authenticate with: a token file (`--token-file`), else the shared
//! secret in `FARMEM_TOKEN`.

use std::path::Path;

use farmem_proto::auth::Secret;
use farmem_proto::tokens::{TokenEntry, TokenFile};

use crate::error::ServerError;

/// The tokens, and a description of them for the start-up line.
pub(crate) fn load_tokens(token_file: Option<&Path>) -> Result<(TokenFile, String), ServerError> {
    if let Some(path) = token_file {
        let text = farmem_sys::secret_file::read(path).map_err(ServerError::TokenFile)?;
        let f = TokenFile::parse(&text).map_err(|cause| ServerError::TokenSyntax {
            path: path.to_path_buf(),
            cause,
        })?;
        let named = f.entries.iter().filter(|e| e.tenant.is_some()).count();
        let desc = match (named, f.shared().is_some()) {
            (0, _) => format!("one shared secret from {}", path.display()),
            (n, false) => format!("{n} tenant(s) from {}", path.display()),
            (n, true) => format!("{n} tenant(s) and a shared secret from {}", path.display()),
        };
        return Ok((f, desc));
    }
    match std::env::var("FARMEM_TOKEN")
        .ok()
        .and_then(|t| Secret::from_text(&t))
    {
        Some(secret) => Ok((
            TokenFile {
                entries: vec![TokenEntry {
                    tenant: None,
                    secret,
                    weight: None,
                    quota_bytes: None,
                }],
            },
            "one shared secret from FARMEM_TOKEN".into(),
        )),
        None => Err(ServerError::NoSecret),
    }
}
