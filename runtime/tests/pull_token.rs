//! The Bearer token flow against a real registry: Debian's docker-registry (distribution
//! 2.8) with `auth: token`, and a small token issuer here (plain HTTP on loopback) that
//! signs ES256 JWTs with a key whose self-signed certificate is the registry's
//! `rootcertbundle` (the token carries it in `x5c`). The issuer grants `pull` on
//! `public/*` to anyone (anonymous tokens), `pull` everywhere to `puller`, and everything
//! to `pusher` (skopeo's push); it records each request.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use ironlet_runtime::image::{
    Credentials, ImageError, ImageStore, Keyring, LocalImageService, PullRequest,
};
use ironlet_runtime::testkit::registry::{RegistryOptions, TestRegistry, TokenAuth};
use ironlet_runtime::testkit::test_images;
use ironlet_runtime::ImageService;
use rcgen::SigningKey as _;

const SERVICE: &str = "ironlet-test-registry";
const ISSUER: &str = "ironlet-test-issuer";

/// One token request as the issuer saw it.
#[derive(Debug, Clone)]
struct Seen {
    account: Option<String>,
    scopes: Vec<String>,
    service: String,
    granted: Vec<String>,
}

/// The token issuer: an HTTP server on a thread, stopped on drop.
struct Issuer {
    port: u16,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Issuer {
    fn start(cert_file: &Path) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["token-issuer".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(cert_file, cert.pem()).unwrap();
        let x5c = base64::engine::general_purpose::STANDARD.encode(cert.der());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop2, seen2) = (Arc::clone(&stop), Arc::clone(&seen));
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                        serve(conn, &key, &x5c, &seen2);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            port,
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers one request (one per connection: `Connection: close`).
fn serve(conn: TcpStream, key: &rcgen::KeyPair, x5c: &str, seen: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("").to_owned();
    let mut authorization = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.eq_ignore_ascii_case("authorization") {
                authorization = Some(value.trim().to_owned());
            }
        }
    }
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
    let mut params: HashMap<String, Vec<String>> = HashMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        params.entry(k.to_owned()).or_default().push(url_decode(v));
    }
    let user = authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok());
    let account = match user.as_deref().and_then(|u| u.split_once(':')) {
        Some(("puller", "pull-pass")) => Some("puller"),
        Some(("pusher", "push-pass")) => Some("pusher"),
        Some(_) => {
            respond(
                &conn,
                "401 Unauthorized",
                r#"{"details":"wrong user or password"}"#,
            );
            return;
        }
        None => None,
    };
    // scope = repository:<name>:<actions>, possibly several (one parameter each).
    let scopes: Vec<String> = params.get("scope").cloned().unwrap_or_default();
    let mut access = Vec::new();
    let mut granted = Vec::new();
    for scope in &scopes {
        let mut parts = scope.splitn(3, ':');
        let (Some(ty), Some(name), Some(actions)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let allowed: Vec<&str> = actions
            .split(',')
            .filter(|a| match account {
                Some("pusher") => true,
                Some("puller") => *a == "pull",
                _ => *a == "pull" && name.starts_with("public/"),
            })
            .collect();
        if !allowed.is_empty() {
            granted.push(format!("{ty}:{name}:{}", allowed.join(",")));
            access.push(serde_json::json!({"type": ty, "name": name, "actions": allowed}));
        }
    }
    seen.lock().unwrap().push(Seen {
        account: account.map(str::to_owned),
        scopes,
        service: params
            .get("service")
            .and_then(|s| s.first().cloned())
            .unwrap_or_default(),
        granted,
    });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [x5c]});
    let claims = serde_json::json!({
        "iss": ISSUER, "sub": account.unwrap_or(""), "aud": SERVICE,
        "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{now}-{}", access.len()),
        "access": access,
    });
    let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    let signing_input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let der = key.sign(signing_input.as_bytes()).unwrap();
    let token = format!("{signing_input}.{}", b64(&der_to_fixed(&der)));
    let body = serde_json::json!({"token": token, "access_token": token, "expires_in": 300});
    respond(&conn, "200 OK", &body.to_string());
}

fn respond(mut conn: &TcpStream, status: &str, body: &str) {
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An ECDSA signature from ASN.1 (`SEQUENCE { r INTEGER, s INTEGER }`) to JWS's fixed
/// `r || s` (32 bytes each for P-256).
fn der_to_fixed(der: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    // SEQUENCE tag, length (short form for P-256), then two INTEGERs.
    let mut i = 2;
    for _ in 0..2 {
        assert_eq!(der[i], 0x02, "INTEGER expected");
        let len = der[i + 1] as usize;
        let mut v = &der[i + 2..i + 2 + len];
        while v.len() > 32 && v[0] == 0 {
            v = &v[1..];
        }
        out.extend(vec![0u8; 32 - v.len()]);
        out.extend_from_slice(v);
        i += 2 + len;
    }
    out
}

struct Setup {
    issuer: Issuer,
    reg: TestRegistry,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let dir = tempfile::Builder::new()
        .prefix("pull2-token-")
        .tempdir()
        .unwrap();
    let bundle = dir.path().join("issuer.pem");
    let issuer = Issuer::start(&bundle);
    let reg = TestRegistry::start(RegistryOptions {
        token_auth: Some(TokenAuth {
            realm: issuer.realm(),
            service: SERVICE.into(),
            issuer: ISSUER.into(),
            root_cert_bundle: bundle,
            push_creds: ("pusher".into(), "push-pass".into()),
        }),
        ..RegistryOptions::default()
    })
    .expect("start docker-registry with token auth");
    let busybox = test_images().unwrap().join("busybox");
    for repo in ["public/busybox:1", "private/busybox:1"] {
        reg.push(&busybox, repo, &[]).unwrap();
    }
    Setup {
        issuer,
        reg,
        _dir: dir,
    }
}

fn service(reg: &TestRegistry, root: &Path) -> LocalImageService {
    LocalImageService::with_pull_config(
        Arc::new(ImageStore::open(root).unwrap()),
        reg.pull_config(&reg.host()).unwrap(),
    )
}

fn with_creds(reg: &TestRegistry, user: &str, password: &str) -> PullRequest {
    let mut keyring = Keyring::default();
    keyring.add(
        &reg.host(),
        Credentials {
            username: user.into(),
            password: password.into(),
        },
    );
    PullRequest {
        keyring,
        ..PullRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_go_through_the_bearer_challenge_with_scoped_and_anonymous_tokens() {
    let Setup { issuer, reg, _dir } = setup();
    let host = reg.host();
    let tmp = tempfile::tempdir().unwrap();
    let svc = service(&reg, tmp.path());
    let pushes = issuer.seen().len();

    // Anonymous: a token without an account, scoped to the repository, pull only.
    let public = svc
        .pull_image(&format!("{host}/public/busybox:1"), PullRequest::default())
        .await
        .unwrap();
    let seen = issuer.seen();
    let anonymous: Vec<&Seen> = seen[pushes..].iter().collect();
    assert!(!anonymous.is_empty(), "no token was asked for");
    for s in &anonymous {
        assert_eq!(s.account, None, "{s:?}");
        assert_eq!(s.service, SERVICE);
        assert_eq!(s.scopes, ["repository:public/busybox:pull"], "{s:?}");
        assert_eq!(s.granted, ["repository:public/busybox:pull"], "{s:?}");
    }

    // The anonymous token grants nothing on private/*: the registry refuses.
    let err = svc
        .pull_image(&format!("{host}/private/busybox:1"), PullRequest::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized { .. }), "{err:?}");

    // A wrong password: the issuer refuses the token.
    let err = svc
        .pull_image(
            &format!("{host}/private/busybox:1"),
            with_creds(&reg, "puller", "wrong"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized { .. }), "{err:?}");
    assert!(svc
        .get_image(&format!("{host}/private/busybox:1"))
        .await
        .unwrap()
        .is_none());

    // The right one: a token for that account and that repository.
    let before = issuer.seen().len();
    let private = svc
        .pull_image(
            &format!("{host}/private/busybox:1"),
            with_creds(&reg, "puller", "pull-pass"),
        )
        .await
        .unwrap();
    assert_eq!(private.image.id, public.image.id);
    let seen = issuer.seen();
    let scoped: Vec<&Seen> = seen[before..].iter().collect();
    assert!(!scoped.is_empty());
    for s in scoped {
        assert_eq!(s.account.as_deref(), Some("puller"), "{s:?}");
        assert_eq!(s.scopes, ["repository:private/busybox:pull"], "{s:?}");
    }
}
