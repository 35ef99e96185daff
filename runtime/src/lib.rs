//! ironlet's container runtime: the [`Runtime`] and [`ImageService`] traits the agent
//! programs against, and their in-process implementation on youki's `libcontainer`.
//!
//! Start at [`traits`] for the contract and [`types`] for the data crossing it.

pub mod duration;
pub mod error;
pub mod image;
pub mod local;
pub mod network;
pub mod spec;
pub mod supervisor;
#[doc(hidden)]
pub mod testkit;
pub mod traits;
pub mod types;
pub mod zygote;

pub use error::{ImageError, RuntimeError, SpecError};
pub use traits::{ImageService, Runtime, RuntimeEvent, RuntimeVersion};
pub mod fsutil;
pub use local::{LocalRuntime, LocalRuntimeConfig};
