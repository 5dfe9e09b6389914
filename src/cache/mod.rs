//! Reusing computed state across requests: the prefix cache of device snapshots, the generation
//! engine that resumes from it (shared by `rill chat` and `rill serve`), and session state files.

mod engine;
mod prefix;
mod state_file;

pub use engine::{Engine, EngineStats, Finish, Flow, Outcome, PromptStart};
pub use prefix::{CacheStats, Hit, PrefixCache};
pub use state_file::{model_fingerprint, read_state, write_state, SavedState};
