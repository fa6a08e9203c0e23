//! What the model is: its config, which tensor plays which role, the tokenizer and its pre-tokenizer.

pub mod chat;
pub mod config;
pub mod layout;
pub mod pretokenize;
pub mod summary;
pub mod tokenizer;
pub mod unicode;

pub use config::{Attention, Config, ConfigError};
pub use tokenizer::{SpecialIds, TokenType, Tokenizer, TokenizerError};
