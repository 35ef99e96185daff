//! Durable exit records: `<dir>/<container id>.json`, written by the zygote when it reaps a
//! container init, read by the runtime when it (re)builds container state.

use std::path::Path;

use super::protocol::Event;

/// Writes `event` for container `id` with write-temp, fsync, rename.
pub(crate) fn write(dir: &Path, id: &str, event: &Event) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(event).map_err(std::io::Error::other)?;
    crate::fsutil::write_state(&dir.join(format!("{id}.json")), &bytes)
}

/// Reads the recorded exit of container `id`, if any.
pub fn read(dir: &Path, id: &str) -> Option<Event> {
    let bytes = std::fs::read(dir.join(format!("{id}.json"))).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Forgets the exit of a removed container.
pub fn remove(dir: &Path, id: &str) {
    let _ = std::fs::remove_file(dir.join(format!("{id}.json")));
}
