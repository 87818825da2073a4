//! `rollcall view`: what the agents did, from the shards, as local web
//! pages. The rollouts list's index ([`index`]: one summary per rollout from
//! the shards' small columns) and the list page ([`list`]); one rollout's
//! calls read from the files that hold them ([`calls`]) and its page
//! ([`rollout`]: timeline, conversation, segments, patch and grade, raw
//! JSON), its token view ([`tokens`]), and a task's samples side by side
//! ([`group`]); the server that routes to them ([`server`]).

pub mod calls;
pub mod group;
pub mod index;
pub mod list;
pub mod live;
pub mod plots;
pub mod rollout;
pub mod search;
pub mod server;
pub mod tokens;
