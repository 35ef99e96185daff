//! [`NodeCgroups`]: the node's pod cgroup tree in kubelet's cgroupfs-driver layout.
//!
//! ```text
//! /<root>                      (default "kubepods")    node allocatable
//! ├── pod<uid>/<container>     Guaranteed pods
//! ├── burstable/pod<uid>/…     Burstable pods
//! └── besteffort/pod<uid>/…    BestEffort pods (QoS cgroup: cpu.shares 2)
//! ```
//!
//! Guarantees: [`NodeCgroups::ensure`] leaves the root and both QoS cgroups existing in every
//! controller (see `create.rs`); pod and container paths are validated [`CgroupPath`]s; verbs
//! refuse paths outside the tree ([`Error::OutsideNodeTree`]), so a bad UID can never make the
//! agent kill or delete someone else's cgroup.

use crate::create::CgroupKind;
use crate::error::{Error, Result};
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;
use crate::qos::QosClass;
use crate::resources::{CgroupSettings, MIN_SHARES};

/// The node's pod cgroup tree. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCgroups {
    hierarchy: Hierarchy,
    root: CgroupPath,
}

impl NodeCgroups {
    /// Creates (or adopts) the tree under `root_name` — `"kubepods"`, or a nested path such as
    /// `"/user.slice/ironlet/kubepods"` for a delegated subtree. Idempotent.
    pub fn ensure(hierarchy: Hierarchy, root_name: &str) -> Result<Self> {
        let root = if root_name.starts_with('/') {
            CgroupPath::new(root_name)?
        } else {
            CgroupPath::new(&format!("/{root_name}"))?
        };
        if root.is_root() {
            return Err(Error::InvalidPath {
                path: root_name.to_owned(),
                reason: "the node tree needs its own cgroup, not the hierarchy root",
            });
        }
        let node = Self { hierarchy, root };
        node.hierarchy.create(&node.root, CgroupKind::Interior)?;
        for qos in [QosClass::Burstable, QosClass::BestEffort] {
            node.hierarchy
                .create(&node.qos_path(qos), CgroupKind::Interior)?;
        }
        // kubelet's QoS manager pins BestEffort to the minimum weight. Without a cpu controller
        // (some delegated v2 subtrees) there is no weight to pin.
        let besteffort = CgroupSettings {
            cpu_shares: Some(MIN_SHARES),
            ..CgroupSettings::default()
        };
        let besteffort_path = node.qos_path(QosClass::BestEffort);
        match node.hierarchy.apply(&besteffort_path, &besteffort) {
            Err(Error::ControllerMissing { controller, path }) => {
                tracing::warn!(controller, cgroup = %path, "no cpu controller; BestEffort weight not pinned");
            }
            other => other?,
        }
        tracing::info!(root = %node.root, v2 = node.hierarchy.is_v2(), "node cgroup tree ready");
        Ok(node)
    }

    /// The hierarchy the tree lives in (for usage, events and raw access).
    #[must_use]
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// The tree's root, e.g. `/kubepods`.
    #[must_use]
    pub fn root(&self) -> &CgroupPath {
        &self.root
    }

    /// The QoS cgroup pods of class `qos` live in (the root for Guaranteed).
    #[must_use]
    pub fn qos_path(&self, qos: QosClass) -> CgroupPath {
        match qos.cgroup_dir() {
            // Infallible: the QoS directory names are valid components.
            Some(dir) => self.root.join(dir).unwrap_or_else(|_| self.root.clone()),
            None => self.root.clone(),
        }
    }

    /// `…/pod<uid>` for a pod of class `qos`. Fails if the UID is not a valid path component.
    pub fn pod_path(&self, qos: QosClass, pod_uid: &str) -> Result<CgroupPath> {
        if pod_uid.is_empty() {
            return Err(Error::InvalidPath {
                path: pod_uid.to_owned(),
                reason: "empty pod UID",
            });
        }
        self.qos_path(qos).join(&format!("pod{pod_uid}"))
    }

    /// `<pod_path>/<container_id>`. Fails if `pod_path` is outside the tree or the id is not a
    /// valid path component.
    pub fn container_path(&self, pod_path: &CgroupPath, container_id: &str) -> Result<CgroupPath> {
        self.check_inside(pod_path)?;
        pod_path.join(container_id)
    }

    /// Creates the pod cgroup `path` (delegating controllers to its container cgroups on v2) and
    /// applies `settings`, typically [`crate::PodResources::cgroup_settings`]. Idempotent.
    pub fn create_pod(&self, path: &CgroupPath, settings: &CgroupSettings) -> Result<()> {
        self.check_inside(path)?;
        self.hierarchy.create(path, CgroupKind::Interior)?;
        self.hierarchy.apply(path, settings)
    }

    /// Creates a container cgroup `path` (a leaf, holding processes) and applies `settings`.
    /// libcontainer also creates it from `linux.cgroupsPath`; this is for callers that place
    /// processes themselves.
    pub fn create_container(&self, path: &CgroupPath, settings: &CgroupSettings) -> Result<()> {
        self.check_inside(path)?;
        self.hierarchy.create(path, CgroupKind::Leaf)?;
        self.hierarchy.apply(path, settings)
    }

    /// Re-applies `settings` to an existing cgroup of the tree (resize, QoS updates).
    pub fn update(&self, path: &CgroupPath, settings: &CgroupSettings) -> Result<()> {
        self.check_inside(path)?;
        self.hierarchy.apply(path, settings)
    }

    /// Kills every process left in `path` and removes it with its descendants in every
    /// controller. Removing a missing cgroup is `Ok`. Blocks up to a few seconds.
    pub fn remove(&self, path: &CgroupPath) -> Result<()> {
        self.check_inside(path)?;
        self.hierarchy.remove(path)?;
        tracing::info!(cgroup = %path, "cgroup removed");
        Ok(())
    }

    fn check_inside(&self, path: &CgroupPath) -> Result<()> {
        if path.starts_with(&self.root) {
            Ok(())
        } else {
            Err(Error::OutsideNodeTree {
                path: path.clone(),
                root: self.root.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A tree value without touching the file system (`ensure` is covered by the integration
    /// tests, which need root).
    fn node() -> NodeCgroups {
        NodeCgroups {
            hierarchy: Hierarchy::V2 {
                root: PathBuf::from("/nonexistent"),
            },
            root: CgroupPath::new("/kubepods").unwrap(),
        }
    }

    #[test]
    fn pod_paths_follow_kubelet_cgroupfs_layout() {
        let node = node();
        let uid = "550e8400-e29b-41d4-a716-446655440000";
        assert_eq!(
            node.pod_path(QosClass::Guaranteed, uid).unwrap().as_str(),
            "/kubepods/pod550e8400-e29b-41d4-a716-446655440000"
        );
        assert_eq!(
            node.pod_path(QosClass::Burstable, uid).unwrap().as_str(),
            "/kubepods/burstable/pod550e8400-e29b-41d4-a716-446655440000"
        );
        assert_eq!(
            node.pod_path(QosClass::BestEffort, "x").unwrap().as_str(),
            "/kubepods/besteffort/podx"
        );
    }

    #[test]
    fn container_paths_nest_under_their_pod() {
        let node = node();
        let pod = node.pod_path(QosClass::Burstable, "u1").unwrap();
        assert_eq!(
            node.container_path(&pod, "abc123").unwrap().as_str(),
            "/kubepods/burstable/podu1/abc123"
        );
    }

    #[test]
    fn hostile_uids_and_container_ids_are_rejected() {
        let node = node();
        assert!(node.pod_path(QosClass::Burstable, "../../etc").is_err());
        assert!(node.pod_path(QosClass::Burstable, "").is_err());
        let pod = node.pod_path(QosClass::Burstable, "u1").unwrap();
        assert!(node.container_path(&pod, "..").is_err());
        assert!(node.container_path(&pod, "a/b").is_err());
    }

    #[test]
    fn verbs_refuse_paths_outside_the_node_tree() {
        let node = node();
        let outside = CgroupPath::new("/system.slice/sshd.service").unwrap();
        assert!(matches!(
            node.remove(&outside),
            Err(Error::OutsideNodeTree { .. })
        ));
        assert!(matches!(
            node.container_path(&outside, "c"),
            Err(Error::OutsideNodeTree { .. })
        ));
        let lookalike = CgroupPath::new("/kubepods-other/pod1").unwrap();
        assert!(node.update(&lookalike, &CgroupSettings::default()).is_err());
    }
}
