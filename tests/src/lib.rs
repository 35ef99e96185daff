//! ironlet-e2e
