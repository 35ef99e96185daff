//! `ironlet play`'s log stream: every container's log lines on stdout, prefixed
//! `pod/container | `, as the agent's log pump writes them.
//!
//! The source is the agent's pod log directory (kubelet's layout,
//! `<ns>_<pod>_<uid>/<container>/<restart>.log`, CRI records): what is printed is exactly
//! what `kubectl logs` would show, init containers and restarts included (each restart is a
//! new file, read from its start). Each poll lists the directory for new files and reads
//! every open file to its end; a partial record (`P`) is joined with the rest of its line.
//! A file renamed by rotation is read to its end before the new one is opened; a removed one
//! (the pod is gone) is read to its end and closed, as an open file outlives its name.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ironlet_runtime::local::logs::parse_record;

/// Follows the log files under one pod log directory.
pub struct Streamer {
    dir: PathBuf,
    /// `-<node>`, the suffix of static pod names, left out of prefixes.
    node_suffix: String,
    /// By (container directory, restart number): files print in restart order.
    tails: BTreeMap<(PathBuf, u32), Tail>,
}

struct Tail {
    path: PathBuf,
    file: File,
    ino: u64,
    prefix: String,
    /// Bytes after the last newline read.
    pending: Vec<u8>,
    /// Content of partial records waiting for the end of their line.
    partial: String,
}

impl Streamer {
    pub fn new(dir: PathBuf, node_name: &str) -> Self {
        Self {
            dir,
            node_suffix: format!("-{node_name}"),
            tails: BTreeMap::new(),
        }
    }

    /// Prints what was written since the last poll. A closed stdout is ignored: the pods
    /// keep running until they complete or a signal comes.
    pub fn poll(&mut self) {
        self.discover();
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        self.tails.retain(|_, tail| tail.read(&mut out));
        let _ = out.flush();
    }

    fn discover(&mut self) {
        for pod_dir in subdirs(&self.dir) {
            let Some(dir_name) = pod_dir.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            // <ns>_<pod>_<uid>: names and namespaces hold no '_'.
            let mut parts = dir_name.splitn(3, '_');
            let (Some(_), Some(pod), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let pod = pod
                .strip_suffix(&self.node_suffix)
                .unwrap_or(pod)
                .to_owned();
            for container_dir in subdirs(&pod_dir) {
                let Some(container) = container_dir.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                let prefix = format!("{pod}/{container}");
                for (restart, path) in restart_files(&container_dir) {
                    let key = (container_dir.clone(), restart);
                    if self.tails.contains_key(&key) {
                        continue;
                    }
                    if let Some(tail) = Tail::open(path, prefix.clone()) {
                        self.tails.insert(key, tail);
                    }
                }
            }
        }
    }
}

impl Tail {
    fn open(path: PathBuf, prefix: String) -> Option<Self> {
        let file = File::open(&path).ok()?;
        let ino = file.metadata().ok()?.ino();
        Some(Self {
            path,
            file,
            ino,
            prefix,
            pending: Vec::new(),
            partial: String::new(),
        })
    }

    /// Prints new lines; false once the file is gone (and read to its end).
    fn read(&mut self, out: &mut impl Write) -> bool {
        self.drain(out);
        match std::fs::metadata(&self.path) {
            Ok(meta) if meta.ino() == self.ino => true,
            Ok(_) => {
                // Rotated: what reached the old file before the rename, then the new file.
                self.drain(out);
                match File::open(&self.path).and_then(|f| f.metadata().map(|m| (f, m))) {
                    Ok((file, meta)) => {
                        self.file = file;
                        self.ino = meta.ino();
                        self.drain(out);
                        true
                    }
                    Err(_) => false,
                }
            }
            Err(_) => false,
        }
    }

    fn drain(&mut self, out: &mut impl Write) {
        let mut bytes = Vec::new();
        if self.file.read_to_end(&mut bytes).is_err() {
            return;
        }
        self.pending.extend_from_slice(&bytes);
        let mut start = 0;
        while let Some(end) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let line = String::from_utf8_lossy(&self.pending[start..start + end]).into_owned();
            start += end + 1;
            let Some((_stream, partial, content)) = parse_record(&line) else {
                continue;
            };
            self.partial.push_str(content);
            if !partial {
                let _ = writeln!(out, "{} | {}", self.prefix, self.partial);
                self.partial.clear();
            }
        }
        self.pending.drain(..start);
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

/// `<n>.log` files of a container directory with their restart number `n`.
fn restart_files(dir: &Path) -> Vec<(u32, PathBuf)> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let restart = name.to_str()?.strip_suffix(".log")?.parse().ok()?;
            Some((restart, e.path()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_stream_with_prefixes_partials_joined_and_restarts_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let container = dir.path().join("default_web-node1_uid1/app");
        std::fs::create_dir_all(&container).expect("mkdir");
        let first = container.join("0.log");
        std::fs::write(
            &first,
            "2024-01-01T00:00:00.000000000Z stdout F hello\n\
             2024-01-01T00:00:00.000000000Z stderr P par\n",
        )
        .expect("write");
        let mut streamer = Streamer::new(dir.path().to_owned(), "node1");
        let mut out = Vec::new();
        streamer.discover();
        streamer.tails.retain(|_, t| t.read(&mut out));
        assert_eq!(String::from_utf8_lossy(&out), "web/app | hello\n");
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(&first)
            .expect("open");
        log.write_all(b"2024-01-01T00:00:00.000000000Z stderr F tial\n2024-01-01T00:00:01")
            .expect("append");
        std::fs::write(
            container.join("1.log"),
            "2024-01-01T00:00:02.000000000Z stdout F again\n",
        )
        .expect("write");
        out.clear();
        streamer.discover();
        streamer.tails.retain(|_, t| t.read(&mut out));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "web/app | partial\nweb/app | again\n"
        );
        // The rest of a record written in two pieces; then the pod goes.
        log.write_all(b".000000000Z stdout F last\n")
            .expect("append");
        std::fs::remove_dir_all(dir.path().join("default_web-node1_uid1")).expect("rm");
        out.clear();
        streamer.discover();
        streamer.tails.retain(|_, t| t.read(&mut out));
        assert_eq!(String::from_utf8_lossy(&out), "web/app | last\n");
        assert!(streamer.tails.is_empty());
    }
}
