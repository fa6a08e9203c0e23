//! lingtab: Ling 3.0 Flash (`bailingmoe3`) on WebGPU, with its routed experts streamed from disk.
//!
//! Data flows one way, one module per stage: bytes ([`source`], [`gguf`], [`quant`]) → what the model is
//! ([`model`]) → the GPU ([`gpu`]) → one forward step ([`engine`]) → text ([`generate`]) → JavaScript
//! ([`web`]). [`tiny`] makes small models of the same architecture for tests and the demo; [`cli`] is the
//! native command line.

pub mod clock;
#[cfg(feature = "runtime")]
pub mod engine;
#[cfg(feature = "runtime")]
pub mod generate;
pub mod gguf;
#[cfg(feature = "runtime")]
pub mod gpu;
pub mod ingest;
pub mod model;
pub mod quant;
pub mod source;
pub mod store;
pub mod tiny;

#[cfg(all(target_arch = "wasm32", feature = "runtime"))]
pub mod web;

/// Browser helpers shared by the wasm32 sources and store.
#[cfg(target_arch = "wasm32")]
pub(crate) mod js;

/// The native command-line tool's subcommands (the `lingtab` binary is a thin shell over these).
#[cfg(all(not(target_arch = "wasm32"), feature = "runtime"))]
pub mod cli;
