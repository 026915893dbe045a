//! Certificates for a `redis-server` with a TLS port.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::{free_port, redis_available};

/// Certificates for a TLS test, made with the `openssl` command-line tool in
/// a temporary folder (removed on drop): a CA, a server certificate for
/// 127.0.0.1 and a client certificate, all signed by the CA (P-256 keys).
#[derive(Debug)]
pub struct TlsFiles {
    dir: PathBuf,
}

impl TlsFiles {
    /// Makes the files, or gives `None` (after a loud message; a panic in
    /// CI) when `openssl` is missing or `redis-server` was built without
    /// TLS.
    pub fn make() -> Option<TlsFiles> {
        if !redis_available() {
            return None;
        }
        // A build with TLS knows `tls-port` (and then finds nowhere to
        // listen); one without calls it a bad directive.
        let probe = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", "0"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let tls = probe.contains("not listen anywhere");
        let openssl = Command::new("openssl")
            .arg("version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !tls || !openssl {
            let missing = if tls { "openssl" } else { "redis-server with TLS" };
            if std::env::var_os("CI").is_some() {
                panic!("{missing} not found, and CI is set: the Redis TLS test must run in CI");
            }
            let _ = writeln!(
                std::io::stderr(),
                "\n!! SKIPPED: {missing} not found: the Redis TLS test did NOT run.\n"
            );
            return None;
        }
        let dir = std::env::temp_dir().join(format!("trt-tls-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let files = TlsFiles { dir };
        std::fs::write(
            files.path("server.ext"),
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write server.ext");
        std::fs::write(files.path("client.ext"), "extendedKeyUsage=clientAuth\n").expect("write client.ext");
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        files.openssl(
            &["req", "-x509"],
            &key,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=trt test CA",
            ],
        );
        for (name, cn) in [("server", "/CN=127.0.0.1"), ("client", "/CN=trt test client")] {
            let (k, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            files.openssl(&["req"], &key, &["-keyout", &k, "-out", &csr, "-subj", cn]);
            files.openssl(
                &["x509", "-req", "-in", &csr],
                &["-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"],
                &["-out", &crt, "-days", "2", "-extfile", &ext],
            );
        }
        Some(files)
    }

    fn openssl(&self, a: &[&str], b: &[&str], c: &[&str]) {
        let out = Command::new("openssl")
            .args(a)
            .args(b)
            .args(c)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {a:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The path of `name` (`ca.crt`, `server.crt`, `server.key`,
    /// `client.crt`, `client.key`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The contents of `name`.
    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).expect("read a TLS file")
    }

    /// `redis-server` arguments for a TLS port that requires client
    /// certificates (next to the plain port the harness uses).
    pub fn server_args(&self, tls_port: u16) -> Vec<String> {
        let path = |name: &str| self.path(name).display().to_string();
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            path("server.crt"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.crt"),
            "--tls-auth-clients".into(),
            "yes".into(),
        ]
    }
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
