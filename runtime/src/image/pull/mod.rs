//! Pulling images from registries into the store.
//!
//! Start at [`Puller`] (what [`LocalImageService`](super::LocalImageService) runs for
//! `ImageService::pull_image`). Files: `puller` (one pull end to end, sharing of concurrent
//! pulls), `remote` (oci-client: auth, manifests, blob streams), `layer` (a layer streamed
//! into its snapshot in one pass), `platform` (index selection), `credentials` (docker
//! config files and pull secrets), `provider` (kubelet's credential provider plugins),
//! `registries` (`registries.yaml`: mirrors, TLS, auth), `hosts_dir` (containerd's
//! `certs.d/<host>/hosts.toml`, the same settings).

mod credentials;
mod hosts_dir;
mod layer;
mod platform;
mod provider;
mod puller;
mod registries;
mod remote;

pub use credentials::{Credentials, Keyring};
pub use platform::PlatformSpec;
pub use provider::{
    CredentialProviders, PodIdentity, ServiceAccountInfo, ServiceAccountTokens, TokenFor,
};
pub use puller::{PullConfig, PullProgress, PullReport, PullRequest, Puller};
pub use registries::{Endpoint, RegistriesConfig};
