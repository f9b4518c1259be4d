//! A `farmem server` started for a benchmark: a separate process (as in production) on an
//! ephemeral loopback port, with a fresh random secret, stopped when dropped.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use farmem_proto::auth::Secret;
use farmem_runtime::TcpSpec;
use farmem_sys::random::random_bytes;

pub struct LocalServer {
    child: Child,
    pub addr: String,
    secret: String,
}

impl LocalServer {
    /// Start a server. `tenants` lists `(name, weight)`; all share the one secret.
    pub fn start(tenants: &[(&str, u32)], extra: &[&str]) -> Result<LocalServer> {
        let secret: String = random_bytes::<16>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut tokens = format!("{secret}\n");
        for (t, w) in tenants {
            tokens.push_str(&format!("{t} {secret} weight={w}\n"));
        }
        let token_file = std::env::temp_dir().join(format!(
            "farmem-bench-tokens-{}-{:x}",
            std::process::id(),
            u32::from_le_bytes(random_bytes())
        ));
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&token_file)
                .and_then(|mut f| f.write_all(tokens.as_bytes()))
                .with_context(|| format!("writing {}", token_file.display()))?;
        }
        let exe = std::env::current_exe().context("locating the farmem binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(["server", "--listen", "127.0.0.1:0", "--token-file"])
            .arg(&token_file)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent. The server
        // must not outlive a benchmark that exits without dropping it (SIGTERM handlers
        // call exit): it dies with the thread that started it.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let spawned = cmd.spawn().context("starting farmem server");
        let mut line = String::new();
        let read = spawned.and_then(|mut child| {
            BufReader::new(child.stdout.take().expect("piped"))
                .read_line(&mut line)
                .context("reading the server's address")?;
            Ok(child)
        });
        // The server has read its tokens once it prints its address (or it never will): the
        // file goes now, so that no secret is left behind by a benchmark that is killed.
        let _ = std::fs::remove_file(&token_file);
        let mut child = read?;
        let Some(addr) = line.split_whitespace().nth(4) else {
            let _ = child.kill();
            bail!("farmem server did not start: {line:?}");
        };
        Ok(LocalServer {
            addr: addr.to_string(),
            child,
            secret,
        })
    }

    /// The backend spec of a client of this server.
    pub fn spec(&self, tenant: &str) -> TcpSpec {
        TcpSpec {
            addr: self.addr.clone(),
            tenant: tenant.to_string(),
            token: Secret::from_text(&self.secret),
            reconnect_window: Duration::from_secs(10),
        }
    }

    /// The secret, for child processes (`FARMEM_TOKEN`).
    pub fn secret(&self) -> &str {
        &self.secret
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
