//! Test images for the image-store tests, built in memory with the `tar` crate: layer tars
//! (including deliberately malicious ones, written with raw header bytes because the `tar`
//! builder refuses `..`), and the three on-disk forms of an image: OCI layout, OCI archive
//! and docker-archive, all sharing one config so that they have one image id.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn hex_of(digest: &str) -> &str {
    digest.trim_start_matches("sha256:")
}

/// Builds one layer tar.
pub struct LayerBuilder {
    builder: tar::Builder<Vec<u8>>,
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    pub fn new() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
        }
    }

    /// Appends an entry with raw name and link name bytes (nothing is validated).
    pub fn raw(
        mut self,
        name: &str,
        kind: tar::EntryType,
        link: Option<&str>,
        data: &[u8],
        mode: u32,
    ) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        {
            let old = h.as_old_mut();
            old.name = [0; 100];
            old.name[..name.len()].copy_from_slice(name.as_bytes());
            if let Some(l) = link {
                old.linkname = [0; 100];
                old.linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
        }
        h.set_cksum();
        self.builder
            .append(&h, data)
            .expect("append to in-memory tar");
        self
    }

    pub fn dir(self, name: &str, mode: u32) -> Self {
        self.raw(name, tar::EntryType::Directory, None, &[], mode)
    }

    pub fn file(self, name: &str, data: &[u8], mode: u32) -> Self {
        self.raw(name, tar::EntryType::Regular, None, data, mode)
    }

    /// A file owned by `uid:gid`.
    pub fn owned_file(mut self, name: &str, data: &[u8], uid: u64, gid: u64) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(data.len() as u64);
        h.set_mode(0o640);
        h.set_mtime(1_600_000_000);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_path(name).expect("valid test path");
        h.set_cksum();
        self.builder
            .append(&h, data)
            .expect("append to in-memory tar");
        self
    }

    /// An entry preceded by a PAX header carrying `SCHILY.xattr.<key>` records.
    pub fn with_xattrs(
        mut self,
        name: &str,
        kind: tar::EntryType,
        xattrs: &[(&str, &[u8])],
        data: &[u8],
        mode: u32,
    ) -> Self {
        let records: Vec<(String, &[u8])> = xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
            .collect();
        self.builder
            .append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), *v)))
            .expect("append pax records");
        let mut h = tar::Header::new_ustar();
        h.set_path(name).expect("valid test path");
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        self.builder
            .append(&h, data)
            .expect("append to in-memory tar");
        self
    }

    pub fn symlink(self, name: &str, target: &str) -> Self {
        self.raw(name, tar::EntryType::Symlink, Some(target), &[], 0o777)
    }

    pub fn hardlink(self, name: &str, target: &str) -> Self {
        self.raw(name, tar::EntryType::Link, Some(target), &[], 0o644)
    }

    pub fn char_device(mut self, name: &str, major: u32, minor: u32) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Char);
        h.set_size(0);
        h.set_mode(0o666);
        h.set_path(name).expect("valid test path");
        h.set_device_major(major).expect("gnu header");
        h.set_device_minor(minor).expect("gnu header");
        h.set_cksum();
        self.builder
            .append(&h, &[][..])
            .expect("append to in-memory tar");
        self
    }

    /// Appends already-encoded tar blocks (entries without the end-of-archive marker).
    pub fn splice(mut self, blocks: &[u8]) -> Self {
        self.builder.get_mut().extend_from_slice(blocks);
        self
    }

    pub fn build(self) -> Vec<u8> {
        self.builder.into_inner().expect("finish in-memory tar")
    }
}

/// An image made of layer tars (uncompressed) and a config.
#[derive(Clone)]
pub struct TestImage {
    pub layers: Vec<Vec<u8>>,
    pub config: Vec<u8>,
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip in memory");
    e.finish().expect("gzip in memory")
}

fn write_blob(dir: &Path, bytes: &[u8]) -> String {
    let d = sha256(bytes);
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("create blobs dir");
    std::fs::write(blobs.join(hex_of(&d)), bytes).expect("write blob");
    d
}

impl TestImage {
    pub fn new(layers: Vec<Vec<u8>>) -> Self {
        let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
        Self::with_diff_ids(layers, diff_ids)
    }

    /// An image whose config claims `diff_ids` (to test mismatches).
    pub fn with_diff_ids(layers: Vec<Vec<u8>>, diff_ids: Vec<String>) -> Self {
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": ["/bin/tool"],
                "Cmd": ["--help"],
                "Env": ["PATH=/bin"],
                "WorkingDir": "/work",
                "Labels": {"test": "yes"}
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids}
        });
        Self {
            layers,
            config: serde_json::to_vec(&config).expect("encode config"),
        }
    }

    /// The image id: `sha256:` of the config.
    pub fn id(&self) -> String {
        sha256(&self.config)
    }

    /// Writes an OCI layout with gzip layers; `ref_name` goes into the index annotation.
    pub fn write_layout(&self, dir: &Path, ref_name: Option<&str>) -> PathBuf {
        let gz: Vec<Vec<u8>> = self.layers.iter().map(|l| gzip(l)).collect();
        self.write_layout_gz(dir, ref_name, &gz)
    }

    /// [`Self::write_layout`] with the given gzip blobs as layers (e.g. with data appended).
    pub fn write_layout_gz(&self, dir: &Path, ref_name: Option<&str>, gz: &[Vec<u8>]) -> PathBuf {
        std::fs::create_dir_all(dir).expect("create layout dir");
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
            .expect("write oci-layout");
        let config = write_blob(dir, &self.config);
        let layers: Vec<serde_json::Value> = gz
            .iter()
            .map(|gz| {
                let d = write_blob(dir, gz);
                serde_json::json!({
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": d, "size": gz.len()
                })
            })
            .collect();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config, "size": self.config.len()},
            "layers": layers
        }))
        .expect("encode manifest");
        let m = write_blob(dir, &manifest);
        let mut desc = serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": m, "size": manifest.len()
        });
        if let Some(r) = ref_name {
            desc["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": r});
        }
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [desc]});
        std::fs::write(
            dir.join("index.json"),
            serde_json::to_vec(&index).expect("encode"),
        )
        .expect("write index.json");
        dir.to_path_buf()
    }

    /// Writes an OCI archive (a tar of the layout) at `path`.
    pub fn write_oci_archive(&self, path: &Path, ref_name: Option<&str>) -> PathBuf {
        let staging = path.with_extension("layout-staging");
        self.write_layout(&staging, ref_name);
        tar_dir(&staging, path);
        std::fs::remove_dir_all(&staging).expect("remove staging");
        path.to_path_buf()
    }

    /// Writes a docker-archive (`docker save` format, uncompressed layers) at `path`.
    pub fn write_docker_archive(&self, path: &Path, repo_tags: &[&str]) -> PathBuf {
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |name: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, name, data).expect("append");
        };
        let config_name = format!("{}.json", hex_of(&self.id()));
        add(&config_name, &self.config);
        let mut layer_names = Vec::new();
        for l in &self.layers {
            let name = format!("{}/layer.tar", hex_of(&sha256(l)));
            add(&name, l);
            layer_names.push(name);
        }
        let manifest = serde_json::json!([{
            "Config": config_name, "RepoTags": repo_tags, "Layers": layer_names
        }]);
        add(
            "manifest.json",
            &serde_json::to_vec(&manifest).expect("encode"),
        );
        std::fs::write(path, b.into_inner().expect("finish tar")).expect("write archive");
        path.to_path_buf()
    }
}

impl TestImage {
    /// Writes a docker-archive in directory form (an unpacked `docker save`) at `dir`.
    pub fn write_docker_dir(&self, dir: &Path, repo_tags: &[&str]) -> PathBuf {
        let archive = dir.with_extension("staging.tar");
        self.write_docker_archive(&archive, repo_tags);
        std::fs::create_dir_all(dir).expect("create docker dir");
        let bytes = std::fs::read(&archive).expect("read staging archive");
        tar::Archive::new(&bytes[..])
            .unpack(dir)
            .expect("unpack staging archive");
        std::fs::remove_file(&archive).expect("remove staging archive");
        dir.to_path_buf()
    }

    /// The docker-archive member name of layer `i` (`<diff_id hex>/layer.tar`).
    pub fn docker_layer_name(&self, i: usize) -> String {
        format!("{}/layer.tar", hex_of(&sha256(&self.layers[i])))
    }

    /// The docker-archive member name of the config (`<id hex>.json`).
    pub fn docker_config_name(&self) -> String {
        format!("{}.json", hex_of(&self.id()))
    }
}

/// Every blob file in a store: name and content.
pub fn blob_files(store: &ironlet_runtime::image::ImageStore) -> Vec<(String, Vec<u8>)> {
    let dir = store.root().join("blobs/sha256");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    (name, std::fs::read(e.path()).unwrap_or_default())
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Tars the content of `dir` (paths relative to it) into `out`.
pub fn tar_dir(dir: &Path, out: &Path) {
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", dir).expect("tar dir");
    std::fs::write(out, b.into_inner().expect("finish tar")).expect("write tar");
}

/// The layered test image:
///
/// ```text
///  layer 1: etc/keep, etc/gone, gone-dir/a, opaque/old1, opaque/old2, bin/tool (0755),
///           bin/su (04755)
///  layer 2: etc/.wh.gone, .wh.gone-dir, opaque/.wh..wh..opq, opaque/new,
///           etc/alias -> keep, lib/libx.so + hard link lib/libx.so.1, etc/keep = "keep v2"
///  layer 3: etc/layer3
/// ```
pub fn layered_image() -> TestImage {
    let l1 = LayerBuilder::new()
        .dir("etc/", 0o755)
        .file("etc/keep", b"keep v1\n", 0o644)
        .file("etc/gone", b"gone\n", 0o644)
        .dir("gone-dir/", 0o755)
        .file("gone-dir/a", b"a\n", 0o644)
        .dir("opaque/", 0o755)
        .file("opaque/old1", b"old1\n", 0o644)
        .file("opaque/old2", b"old2\n", 0o644)
        .dir("bin/", 0o755)
        .file("bin/tool", b"#!/bin/sh\necho tool\n", 0o755)
        .file("bin/su", b"su\n", 0o4755)
        .build();
    let l2 = LayerBuilder::new()
        .dir("etc/", 0o755)
        .file("etc/.wh.gone", b"", 0o644)
        .file(".wh.gone-dir", b"", 0o644)
        .dir("opaque/", 0o755)
        .file("opaque/.wh..wh..opq", b"", 0o644)
        .file("opaque/new", b"new\n", 0o644)
        .symlink("etc/alias", "keep")
        .dir("lib/", 0o755)
        .file("lib/libx.so", b"ELF\n", 0o755)
        .hardlink("lib/libx.so.1", "lib/libx.so")
        .file("etc/keep", b"keep v2\n", 0o644)
        .build();
    let l3 = LayerBuilder::new()
        .dir("etc/", 0o755)
        .file("etc/layer3", b"3\n", 0o600)
        .build();
    TestImage::new(vec![l1, l2, l3])
}

/// Names of all entries below `dir`, relative, sorted.
pub fn tree(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.insert(
                p.strip_prefix(dir)
                    .expect("below dir")
                    .to_string_lossy()
                    .into_owned(),
            );
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    out
}

/// A store in a fresh temp dir, with `configure` applied to the default config.
pub fn store_with(
    configure: impl FnOnce(&mut ironlet_runtime::image::ImageStoreConfig),
) -> (tempfile::TempDir, ironlet_runtime::image::ImageStore) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut config = ironlet_runtime::image::ImageStoreConfig {
        sync_snapshots: false,
        ..Default::default()
    };
    configure(&mut config);
    let store = ironlet_runtime::image::ImageStore::open_with(&tmp.path().join("images"), config)
        .expect("open store");
    (tmp, store)
}

pub fn store() -> (tempfile::TempDir, ironlet_runtime::image::ImageStore) {
    store_with(|_| {})
}

/// Number of files in `dir` (non-recursive); 0 if it does not exist.
pub fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|rd| rd.count()).unwrap_or(0)
}
