//! The manifest-URL source end to end, against a tiny HTTP server on 127.0.0.1 that serves
//! whatever the test sets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironlet::config::{
    pod_uid, ConfigSource, FetchFailure, HttpSource, HttpSourceConfig, ManifestError, PodConfig,
    PodConfigOptions, PodOp, PodUpdate, SourcesReady,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

const NODE: &str = "node-1";
const WAIT: Duration = Duration::from_secs(10);
const PERIOD: Duration = Duration::from_millis(100);

/// What the server answers, and the requests it saw.
#[derive(Default)]
struct Served {
    status: u16,
    body: String,
    requests: Vec<String>,
}

type Shared = Arc<Mutex<Served>>;

fn set(served: &Shared, status: u16, body: &str) {
    let mut s = served.lock().unwrap();
    s.status = status;
    body.clone_into(&mut s.body);
}

/// Serves `served` on an ephemeral loopback port, one response per connection.
async fn serve(served: Shared) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let served = Arc::clone(&served);
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let (status, body) = {
                    let mut s = served.lock().unwrap();
                    s.requests
                        .push(String::from_utf8_lossy(&request).into_owned());
                    (s.status, s.body.clone())
                };
                let response = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/pods")
}

fn pod_list(image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PodList\nitems:\n- metadata: {{name: a}}\n  spec: {{containers: [{{name: c, image: '{image}'}}]}}\n- metadata: {{name: b}}\n  spec: {{containers: [{{name: c, image: '{image}'}}]}}\n"
    )
}

struct Harness {
    updates: mpsc::Receiver<PodUpdate>,
    problems: watch::Receiver<Vec<ManifestError>>,
    ready: SourcesReady,
    _config: PodConfig,
}

fn start(config: HttpSourceConfig) -> Harness {
    let (pod_config, updates) = PodConfig::new(&PodConfigOptions::default());
    let source = HttpSource::new(config.period(PERIOD).timeout(Duration::from_secs(2))).unwrap();
    let problems = source.problems();
    pod_config.spawn(source).unwrap();
    Harness {
        updates,
        problems,
        ready: pod_config.sources_ready(),
        _config: pod_config,
    }
}

impl Harness {
    async fn next(&mut self, expecting: &str) -> PodUpdate {
        tokio::time::timeout(WAIT, self.updates.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("no pod update within {WAIT:?} while expecting {expecting}: the HTTP source's poll loop or the test server probably hung")
            })
            .expect("update stream ended: the merger stopped")
    }

    async fn quiet(&mut self, why: &str) {
        if let Ok(update) = tokio::time::timeout(PERIOD * 5, self.updates.recv()).await {
            panic!("expected no update ({why}), got {update:?}");
        }
    }

    async fn problems_where(
        &mut self,
        what: &str,
        ok: impl FnMut(&Vec<ManifestError>) -> bool,
    ) -> Vec<ManifestError> {
        tokio::time::timeout(WAIT, self.problems.wait_for(ok))
            .await
            .unwrap_or_else(|_| panic!("problems never became: {what}"))
            .expect("problem channel closed")
            .clone()
    }
}

fn names(update: &PodUpdate) -> Vec<&str> {
    update
        .pods
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn polling_a_url_delivers_its_pods_and_makes_the_source_ready() {
    let served = Shared::default();
    set(&served, 200, &pod_list("i:1"));
    let url = serve(Arc::clone(&served)).await;
    let mut h = start(HttpSourceConfig::new(&url, NODE));

    let add = h.next("ADD of the served pods").await;
    assert_eq!((add.op, add.source), (PodOp::Add, ConfigSource::Http));
    assert_eq!(names(&add), ["a-node-1", "b-node-1"]);
    tokio::time::timeout(WAIT, h.ready.wait_all_ready())
        .await
        .expect("sources_ready never flipped after the first good fetch");
    h.quiet("an unchanged body sends nothing").await;
}

#[tokio::test]
async fn a_changed_body_replaces_the_pods() {
    let served = Shared::default();
    set(&served, 200, &pod_list("i:1"));
    let url = serve(Arc::clone(&served)).await;
    let mut h = start(HttpSourceConfig::new(&url, NODE));
    let first = h.next("ADD of the first version").await;
    let old: Vec<String> = first.pods.iter().map(|p| pod_uid(p).to_owned()).collect();

    set(&served, 200, &pod_list("i:2"));
    let remove = h.next("REMOVE of the first version").await;
    assert_eq!(remove.op, PodOp::Remove);
    let mut removed: Vec<String> = remove.pods.iter().map(|p| pod_uid(p).to_owned()).collect();
    removed.sort();
    let mut expected = old.clone();
    expected.sort();
    assert_eq!(removed, expected);
    let add = h.next("ADD of the second version").await;
    assert_eq!(
        (add.op, names(&add)),
        (PodOp::Add, vec!["a-node-1", "b-node-1"])
    );

    set(&served, 200, "");
    let remove = h.next("REMOVE of everything for an empty body").await;
    assert_eq!((remove.op, remove.pods.len()), (PodOp::Remove, 2));
}

#[tokio::test]
async fn a_failing_server_keeps_the_last_good_set_and_reports_why() {
    let served = Shared::default();
    set(&served, 200, &pod_list("i:1"));
    let url = serve(Arc::clone(&served)).await;
    let mut h = start(HttpSourceConfig::new(&url, NODE));
    h.next("ADD of the served pods").await;

    set(&served, 500, "boom");
    let problems = h.problems_where("a fetch error", |p| !p.is_empty()).await;
    assert!(
        matches!(&problems[0], ManifestError::Fetch { source: FetchFailure::Status(s), .. } if s.as_u16() == 500),
        "{problems:?}"
    );
    assert!(problems[0].to_string().contains(&url), "{}", problems[0]);
    h.quiet("a failed fetch removes nothing").await;

    set(&served, 200, "kind: Pod\nmetadata: [broken\n");
    h.problems_where("a decode error", |p| {
        matches!(p.first(), Some(ManifestError::Decode { .. }))
    })
    .await;
    h.quiet("an undecodable body removes nothing").await;

    set(&served, 200, &pod_list("i:1"));
    h.problems_where("no problems after recovery", Vec::is_empty)
        .await;
    h.quiet("the recovered body equals the last good one").await;
}

#[tokio::test]
async fn an_unreachable_url_is_reported_and_the_source_stays_unready() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut h = start(HttpSourceConfig::new(format!("http://{addr}/pods"), NODE));
    let problems = h
        .problems_where("a transport error", |p| !p.is_empty())
        .await;
    assert!(
        matches!(
            &problems[0],
            ManifestError::Fetch {
                source: FetchFailure::Transport(_),
                ..
            }
        ),
        "{problems:?}"
    );
    assert!(!h.ready.all_ready(), "no complete set was ever delivered");
    h.quiet("nothing to deliver").await;
}

#[tokio::test]
async fn configured_headers_are_sent_with_every_poll() {
    let served = Shared::default();
    set(&served, 200, "");
    let url = serve(Arc::clone(&served)).await;
    let mut h = start(HttpSourceConfig::new(&url, NODE).header("X-Node-Token", "s3cret"));
    let first = h.next("the empty readiness ADD").await;
    assert!(first.pods.is_empty());
    let requests = served.lock().unwrap().requests.clone();
    assert!(
        requests[0].starts_with("GET /pods HTTP/1.1\r\n"),
        "{}",
        requests[0]
    );
    assert!(
        requests[0]
            .to_ascii_lowercase()
            .contains("x-node-token: s3cret"),
        "{}",
        requests[0]
    );
}
