//! [`FileObjectSource`]: ConfigMaps and Secrets from the static pod directory.
//!
//! Which files count is the file pod source's rule: every regular file directly in the
//! directory (symlinks followed), or the path itself when it is a file; names starting with
//! `.` are skipped. Each file may hold several YAML or JSON documents (and `List`s) of any
//! kind; only `kind: ConfigMap` and `kind: Secret` (apiVersion `v1`) are read here, the pod
//! source reads the pods and skips these.
//!
//! Guarantees:
//! * every lookup sees the directory as it is now: files are listed on each lookup and a file
//!   is parsed again when its identity or modification stamp (inode, size, mtime, ctime)
//!   changed since the last parse, otherwise its cached objects are used;
//! * a file that stops decoding keeps its last good objects (as the pod source keeps a
//!   broken file's last good pods) and is logged once per change; an object that does not
//!   deserialize is logged and skipped, the rest of its file is still used;
//! * an object without a namespace is in `default`, as a static pod without one is;
//! * when two files define the same object, the first in path order wins (logged).

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use serde_json::Value;

use super::{ObjectError, ObjectSource};
use crate::config::decode_documents;

/// The namespace of an object that names none.
const DEFAULT_NAMESPACE: &str = "default";

/// ConfigMaps and Secrets read from files in the static pod directory.
#[derive(Debug, Clone)]
pub struct FileObjectSource {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    cache: Mutex<BTreeMap<PathBuf, CachedFile>>,
}

/// What identifies one version of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            ino: metadata.ino(),
            len: metadata.len(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }
}

#[derive(Debug)]
struct CachedFile {
    stamp: Stamp,
    objects: Arc<FileObjects>,
}

/// The objects of one file (its last good parse).
#[derive(Debug, Default)]
struct FileObjects {
    config_maps: Vec<ConfigMap>,
    secrets: Vec<Secret>,
}

/// Which kind a lookup wants.
#[derive(Debug, Clone, Copy)]
enum Kind {
    ConfigMap,
    Secret,
}

impl FileObjectSource {
    /// Reads objects from `path`: the `--pod-manifest-path` directory (or single file).
    #[must_use]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Inner {
                path: path.into(),
                cache: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// The directory (or file) objects are read from.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs a lookup off the async runtime.
    async fn find<T, F>(
        &self,
        namespace: &str,
        name: &str,
        kind: Kind,
        pick: F,
    ) -> Result<Option<T>, ObjectError>
    where
        T: Send + 'static,
        F: Fn(&FileObjects, &str, &str) -> Option<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        tokio::task::spawn_blocking(move || {
            let files = inner.refresh()?;
            let mut found = files
                .iter()
                .filter_map(|(path, objects)| pick(objects, &namespace, &name).map(|o| (path, o)));
            let first = found.next();
            if let (Some((chosen, _)), Some((ignored, _))) = (&first, found.next()) {
                tracing::warn!(
                    ?kind,
                    namespace,
                    name,
                    chosen = %chosen.display(),
                    ignored = %ignored.display(),
                    "object defined in more than one file; using the first",
                );
            }
            Ok(first.map(|(_, object)| object))
        })
        .await
        .map_err(|err| ObjectError::Task {
            reason: err.to_string(),
        })?
    }
}

impl Inner {
    /// Lists the files, re-parses the changed ones, and returns every file's objects in path
    /// order.
    fn refresh(&self) -> Result<Vec<(PathBuf, Arc<FileObjects>)>, ObjectError> {
        let files = self.list()?;
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|path, _| files.iter().any(|(listed, _)| listed == path));
        let mut result = Vec::with_capacity(files.len());
        for (path, stamp) in files {
            let previous = cache.get(&path);
            let objects = match previous {
                Some(cached) if cached.stamp == stamp => Arc::clone(&cached.objects),
                _ => {
                    let last_good = previous.map(|c| Arc::clone(&c.objects));
                    let objects = match read_objects(&path) {
                        Ok(objects) => Arc::new(objects),
                        Err(reason) => {
                            tracing::warn!(
                                path = %path.display(),
                                reason,
                                kept_last_good = last_good.is_some(),
                                "cannot read ConfigMaps/Secrets from manifest file",
                            );
                            last_good.unwrap_or_default()
                        }
                    };
                    cache.insert(
                        path.clone(),
                        CachedFile {
                            stamp,
                            objects: Arc::clone(&objects),
                        },
                    );
                    objects
                }
            };
            result.push((path, objects));
        }
        Ok(result)
    }

    /// The candidate files and their stamps, in path order.
    fn list(&self) -> Result<Vec<(PathBuf, Stamp)>, ObjectError> {
        let list_error = |source: io::Error| ObjectError::ListDirectory {
            path: self.path.clone(),
            source: Arc::new(source),
        };
        let metadata = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(list_error(err)),
        };
        if !metadata.is_dir() {
            return Ok(vec![(self.path.clone(), Stamp::of(&metadata))]);
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.path).map_err(list_error)? {
            let entry = entry.map_err(list_error)?;
            if entry.file_name().as_encoded_bytes().first() == Some(&b'.') {
                continue;
            }
            let path = entry.path();
            // Entries that vanished, dangle or are not regular files hold no objects.
            if let Ok(m) = std::fs::metadata(&path) {
                if m.is_file() {
                    files.push((path, Stamp::of(&m)));
                }
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(files)
    }
}

/// Parses the ConfigMaps and Secrets of one file; `Err` when the file cannot be read or does
/// not decode at all.
fn read_objects(path: &Path) -> Result<FileObjects, String> {
    let bytes = std::fs::read(path).map_err(|err| err.to_string())?;
    let documents = decode_documents(&bytes).map_err(|err| err.to_string())?;
    let mut objects = FileObjects::default();
    for document in documents {
        match document.get("kind").and_then(Value::as_str) {
            Some("List" | "ConfigMapList" | "SecretList") => {
                if let Some(Value::Array(items)) = document.get("items") {
                    for item in items {
                        objects.add(path, item.clone());
                    }
                }
            }
            _ => objects.add(path, document),
        }
    }
    Ok(objects)
}

impl FileObjects {
    fn add(&mut self, path: &Path, value: Value) {
        let kind = value.get("kind").and_then(Value::as_str).map(str::to_owned);
        let result = match kind.as_deref() {
            Some("ConfigMap") => serde_json::from_value::<ConfigMap>(value).map(|mut cm| {
                default_namespace(&mut cm.metadata);
                self.config_maps.push(cm);
            }),
            Some("Secret") => serde_json::from_value::<Secret>(value).map(|mut secret| {
                default_namespace(&mut secret.metadata);
                merge_string_data(&mut secret);
                self.secrets.push(secret);
            }),
            _ => Ok(()),
        };
        if let Err(err) = result {
            tracing::warn!(
                path = %path.display(),
                kind = kind.as_deref().unwrap_or_default(),
                %err,
                "skipping object that does not decode",
            );
        }
    }
}

fn default_namespace(meta: &mut ObjectMeta) {
    if meta.namespace.as_deref().unwrap_or_default().is_empty() {
        meta.namespace = Some(DEFAULT_NAMESPACE.to_owned());
    }
}

/// The API server's write-time merge: every `stringData` entry replaces the `data` entry of
/// the same key.
fn merge_string_data(secret: &mut Secret) {
    if let Some(string_data) = secret.string_data.take() {
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        for (key, value) in string_data {
            data.insert(key, ByteString(value.into_bytes()));
        }
    }
}

fn matches(meta: &ObjectMeta, namespace: &str, name: &str) -> bool {
    meta.namespace.as_deref() == Some(namespace) && meta.name.as_deref() == Some(name)
}

#[async_trait]
impl ObjectSource for FileObjectSource {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, ObjectError> {
        self.find(namespace, name, Kind::ConfigMap, |objects, ns, name| {
            objects
                .config_maps
                .iter()
                .find(|cm| matches(&cm.metadata, ns, name))
                .cloned()
        })
        .await
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, ObjectError> {
        self.find(namespace, name, Kind::Secret, |objects, ns, name| {
            objects
                .secrets
                .iter()
                .find(|s| matches(&s.metadata, ns, name))
                .cloned()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: i}]}\n";

    fn data(cm: &ConfigMap) -> Vec<(&str, &str)> {
        cm.data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[tokio::test]
    async fn config_maps_and_secrets_are_found_beside_pods_in_a_multi_document_file() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "{POD}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg}}\ndata: {{a: one}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: s, namespace: kube-system}}\ndata: {{a: b25l, b: dHdv}}\nstringData: {{b: replaced, c: three}}\n"
        );
        std::fs::write(dir.path().join("pods.yaml"), text).unwrap();
        let source = FileObjectSource::new(dir.path());

        let cm = source.config_map("default", "cfg").await.unwrap().unwrap();
        assert_eq!(data(&cm), [("a", "one")]);
        assert!(source.config_map("other", "cfg").await.unwrap().is_none());

        let secret = source.secret("kube-system", "s").await.unwrap().unwrap();
        let values: Vec<(&str, &[u8])> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_slice()))
            .collect();
        assert_eq!(
            values,
            [("a", &b"one"[..]), ("b", b"replaced"), ("c", b"three")]
        );
        assert!(secret.string_data.is_none());
        assert!(source.secret("default", "s").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_changed_file_is_read_again_and_a_removed_one_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cfg.json");
        std::fs::write(
            &file,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cfg"},"data":{"k":"v1"}}"#,
        )
        .unwrap();
        let source = FileObjectSource::new(dir.path());
        let cm = source.config_map("default", "cfg").await.unwrap().unwrap();
        assert_eq!(data(&cm), [("k", "v1")]);

        std::fs::write(&file, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cfg"},"data":{"k":"v2 longer"}}"#).unwrap();
        let cm = source.config_map("default", "cfg").await.unwrap().unwrap();
        assert_eq!(data(&cm), [("k", "v2 longer")]);

        std::fs::remove_file(&file).unwrap();
        assert!(source.config_map("default", "cfg").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_file_that_stops_decoding_keeps_its_last_good_objects() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cfg.yaml");
        std::fs::write(
            &file,
            "kind: ConfigMap\nmetadata: {name: cfg}\ndata: {k: v}\n",
        )
        .unwrap();
        let source = FileObjectSource::new(dir.path());
        assert!(source.config_map("default", "cfg").await.unwrap().is_some());
        std::fs::write(&file, "kind: ConfigMap\nmetadata: [unclosed\n").unwrap();
        let cm = source.config_map("default", "cfg").await.unwrap().unwrap();
        assert_eq!(data(&cm), [("k", "v")]);
    }

    #[tokio::test]
    async fn hidden_files_and_undecodable_objects_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(".hidden.yaml"),
            "kind: ConfigMap\nmetadata: {name: hidden}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("mixed.yaml"),
            "kind: ConfigMap\nmetadata: {name: bad}\ndata: 3\n---\nkind: List\nitems:\n- kind: ConfigMap\n  metadata: {name: good}\n",
        )
        .unwrap();
        let source = FileObjectSource::new(dir.path());
        assert!(source
            .config_map("default", "hidden")
            .await
            .unwrap()
            .is_none());
        assert!(source.config_map("default", "bad").await.unwrap().is_none());
        assert!(source
            .config_map("default", "good")
            .await
            .unwrap()
            .is_some());
    }

    #[tokio::test]
    async fn a_missing_directory_holds_no_objects() {
        let source = FileObjectSource::new("/nonexistent/ironlet/manifests");
        assert!(source.secret("default", "s").await.unwrap().is_none());
    }
}
