//! The agent's link to the API server (issue 4): the pod watch feeding the pod config
//! merger, the status manager (statuses, mirror pods, deletion finalization), pod events,
//! ConfigMaps/Secrets for API pods and the Service cache behind service link variables.
//!
//! ```text
//!  watch pods spec.nodeName=<node> ──► PodConfig (ConfigSource::Api) ──► sync loop
//!  StatusStore ──subscribe──► StatusManager ──► PATCH pods/<p>/status (mirror pod for static)
//!  housekeeping ──ApiCommand──► StatusManager ──► create/delete mirror pods, final DELETE
//!  EventRecorder ──► ApiRecorder ──► POST events (rate-limited)
//!  pod added/removed ──► ObjectWatches (watch per ConfigMap/Secret) ──changed──► resync pods
//! ```
//!
//! Where to start: [`Kubelet::start_with_api`](crate::kubelet::Kubelet::start_with_api), which
//! wires these together from one node client; [`StatusManager`] for what is written back.

pub mod client;
mod events;
mod object_watch;
mod objects;
mod pod_source;
mod services;
mod status_manager;

pub use events::{pod_event, ApiRecorder};
pub use object_watch::{referenced_objects, ObjectKind, ObjectWatches, Watched};
pub use objects::{ApiObjectSource, LayeredObjects, CACHE_TTL};
pub use pod_source::run_pod_source;
pub use services::ApiServices;
pub use status_manager::{mirror_pod, ApiCommand, StatusManager, MIRROR_DEBOUNCE, RETRY_PERIOD};
