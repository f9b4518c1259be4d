//! Files that hold secrets (token files), read by the memory server and the TCP backend.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The text of a file that should be private; warns when other users may read it.
pub fn read(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading token file {}: {e}", path.display()))?;
    if let Ok(md) = std::fs::metadata(path) {
        if md.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                "token file {} is readable by other users; chmod 600 it",
                path.display()
            );
        }
    }
    Ok(text)
}
