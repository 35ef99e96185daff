//! OCI runtime spec generation: turns a [`ContainerConfig`](crate::types::ContainerConfig), its
//! image's config and a prepared root filesystem into the `config.json` that libcontainer (or
//! runc) runs.
//!
//! Start at [`build_spec`] with a [`SpecInputs`]; write the result with [`write_bundle_config`].
//!
//! # Contract
//!
//! The generated spec matches what containerd's CRI plugin generates for the same pod, so that
//! users comparing the two see the same process, capabilities, mounts, masked paths, seccomp
//! profile and device rules. Where ironlet deviates (rootless fallbacks, the NOFILE rlimit), the
//! module that does so says why.
//!
//! Everything that comes from the user (paths, user and group names, capability names, the
//! seccomp profile file) is validated; a rejected value is a [`SpecError`] naming the field and
//! the value. Nothing here panics on input.
//!
//! Files of the root filesystem (`/etc/passwd`, `/etc/group`) are read with symlinks resolved as
//! if the rootfs were `/`, so an image cannot make ironlet read a host file.
//!
//! ```text
//!  ContainerConfig ─┐
//!  ImageConfig ─────┼─► build_spec ─► process (args, env, cwd, user, caps, rlimits)
//!  rootfs, sandbox ─┘                 mounts + masked/readonly paths
//!                                      linux (namespaces, resources, devices, seccomp)
//!                                          │
//!                                          ▼
//!                              write_bundle_config ─► <bundle>/config.json (atomic)
//! ```

mod build;
mod bundle;
mod caps;
mod devices;
mod error;
mod host;
mod inputs;
mod mounts;
mod namespaces;
mod process;
mod resources;
mod rootfs_file;
mod seccomp;
pub mod subids;
mod user;

pub use build::build_spec;
pub use bundle::write_bundle_config;
pub use error::SpecError;
pub(crate) use host::HostFacts;
pub use inputs::{IdMapping, NamespaceMode, SandboxNamespaces, SpecInputs, UserNamespace};
