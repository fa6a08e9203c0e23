//! What the model is: its config, which tensor plays which role, the tokenizer and the chat template.

pub mod config;
pub mod layout;
pub mod summary;

pub use config::{Attention, Config, ConfigError};
