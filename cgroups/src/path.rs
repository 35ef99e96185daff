//! [`CgroupPath`]: a cgroup's path relative to the root of a hierarchy, e.g.
//! `/kubepods/burstable/pod<uid>`.
//!
//! Guarantees: a `CgroupPath` always starts with `/`, has no empty, `.` or `..` components, no
//! NUL or newline bytes and no trailing `/` (except the root, `/`). Joining it under a mount point
//! therefore never escapes that mount point.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A validated cgroup path relative to a hierarchy root. See the module docs for the guarantees.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CgroupPath(String);

impl CgroupPath {
    /// The root of the hierarchy, `/`.
    #[must_use]
    pub fn root() -> Self {
        Self("/".to_owned())
    }

    /// Validates `path`, which must start with `/`.
    pub fn new(path: &str) -> Result<Self> {
        let invalid = |reason| Error::InvalidPath {
            path: path.to_owned(),
            reason,
        };
        let rest = path
            .strip_prefix('/')
            .ok_or_else(|| invalid("must start with '/'"))?;
        if rest.is_empty() {
            return Ok(Self::root());
        }
        for component in rest.split('/') {
            check_component(component).map_err(invalid)?;
        }
        Ok(Self(path.to_owned()))
    }

    /// The path of the child cgroup `name` (a single component).
    pub fn join(&self, name: &str) -> Result<Self> {
        check_component(name).map_err(|reason| Error::InvalidPath {
            path: name.to_owned(),
            reason,
        })?;
        if self.is_root() {
            Ok(Self(format!("/{name}")))
        } else {
            Ok(Self(format!("{}/{name}", self.0)))
        }
    }

    /// The path as a string, starting with `/`.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the hierarchy root.
    #[must_use]
    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// The components, outermost first (none for the root).
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    /// Whether `self` is `ancestor` or lies below it.
    #[must_use]
    pub fn starts_with(&self, ancestor: &CgroupPath) -> bool {
        ancestor.is_root()
            || self.0 == ancestor.0
            || self
                .0
                .strip_prefix(&ancestor.0)
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The directory of this cgroup under `mount` (the mount point of a hierarchy).
    #[must_use]
    pub fn under(&self, mount: &Path) -> PathBuf {
        let mut dir = mount.to_path_buf();
        dir.extend(self.components());
        dir
    }
}

impl fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn check_component(component: &str) -> Result<(), &'static str> {
    match component {
        "" => Err("empty path component"),
        "." | ".." => Err("'.' and '..' components are not allowed"),
        c if c.contains('/') => Err("a single component may not contain '/'"),
        c if c.contains(['\0', '\n']) => Err("NUL and newline are not allowed"),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_paths_round_trip_and_join() {
        let pod = CgroupPath::new("/kubepods/burstable/pod1234").unwrap();
        assert_eq!(pod.as_str(), "/kubepods/burstable/pod1234");
        assert_eq!(
            pod.join("abc").unwrap().as_str(),
            "/kubepods/burstable/pod1234/abc"
        );
        assert_eq!(
            CgroupPath::root().join("kubepods").unwrap().as_str(),
            "/kubepods"
        );
        assert_eq!(
            pod.components().collect::<Vec<_>>(),
            ["kubepods", "burstable", "pod1234"]
        );
    }

    #[test]
    fn traversal_empty_and_relative_components_are_rejected() {
        for bad in [
            "kubepods",
            "/kubepods/../etc",
            "/kubepods//x",
            "/kubepods/",
            "/./x",
            "/a\0b",
        ] {
            assert!(CgroupPath::new(bad).is_err(), "{bad:?} must be rejected");
        }
        let root = CgroupPath::root();
        for bad in ["..", "a/b", "", "."] {
            assert!(root.join(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn starts_with_respects_component_boundaries() {
        let root = CgroupPath::new("/kubepods").unwrap();
        assert!(CgroupPath::new("/kubepods/pod1")
            .unwrap()
            .starts_with(&root));
        assert!(root.starts_with(&root));
        assert!(!CgroupPath::new("/kubepods2/pod1")
            .unwrap()
            .starts_with(&root));
        assert!(root.starts_with(&CgroupPath::root()));
    }

    #[test]
    fn under_joins_below_the_mount_point() {
        let path = CgroupPath::new("/kubepods/pod1").unwrap();
        assert_eq!(
            path.under(Path::new("/sys/fs/cgroup/memory")),
            Path::new("/sys/fs/cgroup/memory/kubepods/pod1")
        );
        assert_eq!(
            CgroupPath::root().under(Path::new("/sys/fs/cgroup")),
            Path::new("/sys/fs/cgroup")
        );
    }
}
