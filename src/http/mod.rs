//! The HTTP plumbing shared by every server in the binary (the proxy, the
//! embedded model's server) and by the `scripted-upstream` binary: the
//! response body type, plain responses, the accept loop, shutdown
//! signals, futures boxed where they are built, and a timeout that reads
//! the clock only when it has to wait.
//!
//! It knows no wire API and imports nothing else of the crate, which is what
//! lets `scripted-upstream` use it and stay independent of `dialect`.

pub mod body;
pub mod mount;
pub mod pinned;
pub mod respond;
pub mod serve;
pub mod signal;
pub mod within;

pub use body::{Abort, Chunk, Held, ProxyBody};
pub use mount::Handler;
pub use pinned::pinned;
pub use respond::{bytes_response, json_response};
pub use serve::serve_plain;
pub use signal::shutdown_signal;
pub use within::within;
