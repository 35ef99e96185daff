//! What the benchmark binaries share (`stats`); each binary's module docs say what it measures.

pub mod stats;
