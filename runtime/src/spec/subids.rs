//! The rootless user namespace: the invoking user's subordinate id ranges (`/etc/subuid`,
//! `/etc/subgid`), mapped with the setuid helpers `newuidmap`/`newgidmap` (Debian's `uidmap`),
//! as podman and rootless containerd do.
//!
//! Container id 0 is the user's own id and ids 1..=N the subordinate ranges, in file order:
//!
//! ```text
//!  /etc/subuid  tester:100000:65536      uid_map  0      1001  1
//!                                                  1    100000  65536
//! ```
//!
//! Who creates the namespace: `newuidmap` must be run, from outside the namespace, by a process
//! of the same user, and a setuid helper started from inside a user namespace loses its
//! privilege. So the zygote's worker creates the namespace around libcontainer (a helper it
//! forked beforehand runs `newuidmap <worker>` / `newgidmap <worker>`), becomes its root and
//! runs libcontainer there, as podman runs its OCI runtime inside `podman unshare`'s namespace.
//! The spec then lists no user namespace (libcontainer is already in it) and no
//! `uidMappings`/`gidMappings` (libcontainer refuses mappings without a namespace): the
//! annotations [`UID_MAP_ANNOTATION`] and [`GID_MAP_ANNOTATION`] tell the worker what to map. `setgroups` stays allowed (the map was written by a
//! privileged helper), so supplementary groups (`fsGroup`, `supplementalGroups`) work.
//!
//! Without a range for the user the namespace maps the user's own id only, and one warning
//! says so; every id but 0 is then refused at spec time. The worker still makes it through
//! the helpers (which map the caller's own ids without a range), so a rootless pod gets its
//! network as with a range; without the helpers libcontainer creates it, and pods get a
//! loopback-only network.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::inputs::{IdMapping, UserNamespace};

/// The files and helpers this module reads; fields so a test can point them elsewhere.
#[derive(Debug, Clone)]
pub struct SubidSources {
    pub subuid: PathBuf,
    pub subgid: PathBuf,
    pub newuidmap: PathBuf,
    pub newgidmap: PathBuf,
}

impl Default for SubidSources {
    fn default() -> Self {
        Self {
            subuid: "/etc/subuid".into(),
            subgid: "/etc/subgid".into(),
            newuidmap: helper("newuidmap"),
            newgidmap: helper("newgidmap"),
        }
    }
}

/// `name` from `$PATH`, else `/usr/bin/name` (where Debian's `uidmap` puts it).
fn helper(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| Path::new("/usr/bin").join(name))
}

/// Why the full mapping is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRange {
    #[error("{file} has no range for user {user}")]
    NoEntry { file: PathBuf, user: String },
    #[error("cannot read {file}: {reason}")]
    Unreadable { file: PathBuf, reason: String },
    #[error("{helper} is missing (install Debian's uidmap package)")]
    NoHelper { helper: PathBuf },
}

/// A subordinate range of one file: `start` and `count` host ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubordinateRange {
    pub start: u32,
    pub count: u32,
}

/// The ranges `/etc/subuid`-format `content` gives the user `name` (or its numeric `id`, which
/// shadow's tools accept too), in file order. Malformed lines are skipped, as `newuidmap` does.
pub fn parse_ranges(content: &str, name: &str, id: u32) -> Vec<SubordinateRange> {
    let id = id.to_string();
    content
        .lines()
        .filter_map(|line| {
            let mut fields = line.trim().split(':');
            let (owner, start, count) = (fields.next()?, fields.next()?, fields.next()?);
            if fields.next().is_some() || (owner != name && owner != id) {
                return None;
            }
            let range = SubordinateRange {
                start: start.parse().ok()?,
                count: count.parse().ok()?,
            };
            let fits = u64::from(range.start) + u64::from(range.count) <= u64::from(u32::MAX);
            (range.count > 0 && fits).then_some(range)
        })
        .collect()
}

/// Container 0 → `own`, then the ranges one after the other from container id 1.
pub fn mappings(own: u32, ranges: &[SubordinateRange]) -> Vec<IdMapping> {
    let mut out = vec![IdMapping {
        container_id: 0,
        host_id: own,
        size: 1,
    }];
    let mut next: u64 = 1;
    for r in ranges {
        let Ok(container_id) = u32::try_from(next) else {
            break;
        };
        // The last container id is u32::MAX - 1 (u32::MAX is "no id").
        let room = u64::from(u32::MAX) - next;
        let Ok(size) = u32::try_from(u64::from(r.count).min(room)) else {
            break;
        };
        if size == 0 {
            break;
        }
        out.push(IdMapping {
            container_id,
            host_id: r.start,
            size,
        });
        next += u64::from(size);
    }
    out
}

fn ranges_of(file: &Path, name: &str, id: u32) -> Result<Vec<SubordinateRange>, NoRange> {
    let content = match std::fs::read_to_string(file) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(NoRange::Unreadable {
                file: file.to_owned(),
                reason: e.to_string(),
            })
        }
    };
    let ranges = parse_ranges(&content, name, id);
    if ranges.is_empty() {
        return Err(NoRange::NoEntry {
            file: file.to_owned(),
            user: name.to_owned(),
        });
    }
    Ok(ranges)
}

/// The full user namespace of user `uid`/`gid` (named `name`), or why there is none.
pub fn full_user_namespace(
    sources: &SubidSources,
    name: &str,
    uid: u32,
    gid: u32,
) -> Result<UserNamespace, NoRange> {
    let uids = ranges_of(&sources.subuid, name, uid)?;
    let gids = ranges_of(&sources.subgid, name, uid)?;
    for helper in [&sources.newuidmap, &sources.newgidmap] {
        if !helper.is_file() {
            return Err(NoRange::NoHelper {
                helper: helper.clone(),
            });
        }
    }
    Ok(UserNamespace {
        uid_mappings: mappings(uid, &uids),
        gid_mappings: mappings(gid, &gids),
        path: None,
        unprivileged: true,
        made_by_worker: true,
    })
}

/// The user namespace of this process's rootless containers: the full mapping of its user's
/// ranges, or its own id only (with one warning, on the first call). Resolved once per
/// process; a change to `/etc/subuid` takes effect on restart.
pub fn rootless_user_namespace() -> UserNamespace {
    static RESOLVED: OnceLock<UserNamespace> = OnceLock::new();
    RESOLVED
        .get_or_init(|| {
            let uid = nix::unistd::geteuid();
            let name = nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| uid.to_string());
            let gid = nix::unistd::getegid().as_raw();
            match full_user_namespace(&SubidSources::default(), &name, uid.as_raw(), gid) {
                Ok(userns) => {
                    tracing::info!(
                        uids = %describe(&userns.uid_mappings),
                        gids = %describe(&userns.gid_mappings),
                        "rootless: user namespace maps the subordinate id ranges"
                    );
                    userns
                }
                Err(why) => {
                    tracing::warn!(
                        reason = %why,
                        "rootless: only uid {uid} is mapped (as container root): images and \
                         pods that run as another user fail; add a range for {name} to \
                         /etc/subuid and /etc/subgid (usermod --add-subuids/--add-subgids)"
                    );
                    own_ids_only(&SubidSources::default())
                }
            }
        })
        .clone()
}

/// The user namespace without a range: the user's own ids only. Made by the worker through
/// the helpers when they are installed (they map the caller's own uid and gid without a
/// range), so that the containers of a pod can join the namespace that holds its network
/// (pasta works in it, see `network/rootless.rs`); else by libcontainer, as before.
fn own_ids_only(sources: &SubidSources) -> UserNamespace {
    let own = UserNamespace::current_user();
    let helpers = sources.newuidmap.is_file() && sources.newgidmap.is_file();
    UserNamespace {
        made_by_worker: helpers && own.unprivileged,
        ..own
    }
}

/// The worker's uid mappings, `container:host:size,…`.
pub const UID_MAP_ANNOTATION: &str = "io.ironlet.userns.uid-map";
/// The worker's gid mappings, `container:host:size,…`.
pub const GID_MAP_ANNOTATION: &str = "io.ironlet.userns.gid-map";

/// The user namespace the worker joins instead of making one (a rootless pod's, held by
/// `zygote/holder.rs` with the same mappings): a `/proc/<pid>/ns/user` path.
pub const JOIN_ANNOTATION: &str = "io.ironlet.userns.join";

/// Whether `key` is one of the mapping annotations (which a container's own annotations may
/// not set).
pub fn is_map_annotation(key: &str) -> bool {
    key == UID_MAP_ANNOTATION || key == GID_MAP_ANNOTATION || key == JOIN_ANNOTATION
}

/// The mapping annotations of `userns`, and the namespace to join if it has a path.
pub fn map_annotations(userns: &UserNamespace) -> Vec<(String, String)> {
    let encode = |mappings: &[IdMapping]| {
        mappings
            .iter()
            .map(|m| format!("{}:{}:{}", m.container_id, m.host_id, m.size))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut out = vec![
        (UID_MAP_ANNOTATION.to_owned(), encode(&userns.uid_mappings)),
        (GID_MAP_ANNOTATION.to_owned(), encode(&userns.gid_mappings)),
    ];
    if let Some(path) = &userns.path {
        out.push((
            JOIN_ANNOTATION.to_owned(),
            path.to_string_lossy().into_owned(),
        ));
    }
    out
}

/// The mappings of one annotation value; `None` if any part is malformed or empty.
pub fn parse_map_annotation(value: &str) -> Option<Vec<IdMapping>> {
    let mappings = value
        .split(',')
        .map(|part| {
            let mut n = part.split(':').map(|f| f.trim().parse::<u32>());
            let m = IdMapping {
                container_id: n.next()?.ok()?,
                host_id: n.next()?.ok()?,
                size: n.next()?.ok()?,
            };
            (n.next().is_none() && m.size > 0).then_some(m)
        })
        .collect::<Option<Vec<_>>>()?;
    (!mappings.is_empty()).then_some(mappings)
}

/// `0-65536` style list of the container ids `mappings` cover.
pub fn describe(mappings: &[IdMapping]) -> String {
    mappings
        .iter()
        .map(|m| {
            let last = u64::from(m.container_id) + u64::from(m.size) - 1;
            if m.size == 1 {
                m.container_id.to_string()
            } else {
                format!("{}-{last}", m.container_id)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_by_name_or_id_in_file_order_skipping_bad_lines() {
        let file = "other:1:2\ntester:100000:65536\nbad\n1001:300000:10\ntester:x:1\ntester:5:0\n";
        assert_eq!(
            parse_ranges(file, "tester", 1001),
            vec![
                SubordinateRange {
                    start: 100000,
                    count: 65536
                },
                SubordinateRange {
                    start: 300000,
                    count: 10
                }
            ]
        );
        assert!(parse_ranges(file, "nobody", 7).is_empty());
    }

    #[test]
    fn container_root_is_the_user_and_ranges_follow_from_one() {
        let ranges = [
            SubordinateRange {
                start: 100000,
                count: 65536,
            },
            SubordinateRange {
                start: 300000,
                count: 10,
            },
        ];
        let m = mappings(1001, &ranges);
        assert_eq!(
            m,
            vec![
                IdMapping {
                    container_id: 0,
                    host_id: 1001,
                    size: 1
                },
                IdMapping {
                    container_id: 1,
                    host_id: 100000,
                    size: 65536
                },
                IdMapping {
                    container_id: 65537,
                    host_id: 300000,
                    size: 10
                },
            ]
        );
        assert_eq!(describe(&m), "0,1-65536,65537-65546");
    }

    #[test]
    fn map_annotations_round_trip_and_refuse_garbage() {
        let userns = UserNamespace {
            uid_mappings: mappings(
                1001,
                &[SubordinateRange {
                    start: 100000,
                    count: 65536,
                }],
            ),
            gid_mappings: mappings(7, &[]),
            path: None,
            unprivileged: true,
            made_by_worker: true,
        };
        let [(uk, uv), (gk, gv)] = <[_; 2]>::try_from(map_annotations(&userns)).unwrap();
        assert!(is_map_annotation(&uk) && is_map_annotation(&gk));
        assert_eq!(uv, "0:1001:1,1:100000:65536");
        assert_eq!(parse_map_annotation(&uv), Some(userns.uid_mappings.clone()));
        assert_eq!(parse_map_annotation(&gv), Some(userns.gid_mappings));
        for bad in ["", "0:1", "0:1:0", "a:b:c", "0:1:1:1", "0:1:1,"] {
            assert_eq!(parse_map_annotation(bad), None, "{bad}");
        }
    }

    #[test]
    fn missing_entry_or_helper_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let subuid = dir.path().join("subuid");
        std::fs::write(&subuid, "tester:100000:65536\n").unwrap();
        let mut sources = SubidSources {
            subuid: subuid.clone(),
            subgid: subuid.clone(),
            newuidmap: dir.path().join("newuidmap"),
            newgidmap: dir.path().join("newgidmap"),
        };
        assert!(matches!(
            full_user_namespace(&sources, "other", 5, 5),
            Err(NoRange::NoEntry { .. })
        ));
        assert!(matches!(
            full_user_namespace(&sources, "tester", 5, 5),
            Err(NoRange::NoHelper { .. })
        ));
        sources.newuidmap = subuid.clone();
        sources.newgidmap = subuid;
        let userns = full_user_namespace(&sources, "tester", 5, 6).unwrap();
        assert!(userns.maps_uid(65536) && !userns.maps_uid(65537));
        assert_eq!(userns.gid_mappings[0].host_id, 6);
        assert!(userns.made_by_worker);
    }
}
