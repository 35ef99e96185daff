//! The image store: content-addressed blobs, layers unpacked once into snapshots, and
//! container root file systems as overlay mounts or copies.
//!
//! ```text
//!  import(path) ──► blobs/sha256/<hex> ──► snapshots/<chain-id>/fs ──► prepare_rootfs
//!  (OCI layout,     (verified digest      (safe unpack, whiteouts,    (overlay: fsopen +
//!   OCI archive,     and size)             done-marker)                lowerdir+; rootless:
//!                                                                      described, mounted in
//!                                                                      the container's userns;
//!                                                                      or copy)
//!   docker-archive)        │                      │                          │
//!                          └──── index.json ──────┴──── leases/ ─────────────┘
//!                                (refs → manifest)       (gc roots)
//! ```
//!
//! Start at [`ImageStore`] (sync, usable from the CLI) or [`LocalImageService`] (the async
//! [`ImageService`](crate::ImageService) the agent uses). Each file holds one concept and
//! states its guarantees: `reference` (Docker-compatible names); `blobs`, `index` and
//! `store` (the store on disk); `source` and `import` (the three import formats);
//! `unpack`, `beneath`, `lower` and `whiteout` (safe layer extraction); `snapshot`; `rootfs`,
//! `mount`, `userns_overlay` and `copy` (root file systems); `gc`; `service` (async); `sys` and `fsx`
//! (system-call and file helpers).

mod beneath;
mod blobs;
mod copy;
mod digest;
mod error;
mod fsx;
#[doc(hidden)]
pub mod fuzzing;
mod gc;
mod import;
mod index;
mod lower;
pub(crate) mod mount;
mod oci;
pub mod owners;
mod pipeline;
mod pull;
mod reference;
mod rootfs;
mod service;
mod snapshot;
mod source;
mod store;
mod sys;
mod unpack;
pub(crate) mod userns_overlay;
mod whiteout;

pub use error::{ImageError, UnsafeEntryReason};
pub use gc::GcReport;
pub use lower::LowerLayer;
pub use pull::{
    CredentialProviders, Credentials, Endpoint, Keyring, PlatformSpec, PodIdentity, PullConfig,
    PullProgress, PullReport, PullRequest, Puller, RegistriesConfig, ServiceAccountInfo,
    ServiceAccountTokens, TokenFor,
};
pub use reference::Reference;
pub use rootfs::{ImageSelector, PreparedRootfs, RootfsMode};
pub use service::LocalImageService;
pub use store::{ImageStore, ImageStoreConfig};
pub use unpack::{unpack_layer, unpack_layer_onto, UnpackLimits, UnpackOptions, UnpackReport};
pub use whiteout::{Changes, WhiteoutFormat};
