//! `rollcall view` (issue 18, in progress): what the agents did, from the
//! shards. So far the rollouts list: its index ([`index`]: one summary per
//! rollout from the shards' small columns, filtered, sorted and paged on the
//! server) and its page ([`server`]). The rollout, token and group pages are
//! not built yet.

pub mod index;
pub mod server;
