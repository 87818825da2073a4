//! Rollout ids: what a rollout may be called, checked wherever one comes in
//! (a proxied call's path or header, a finish, `rollcall run`).

/// A rollout id that is not 1–200 characters of letters, digits and `._:-@+=_` (SWE-bench instance ids such as `astropy__astropy-12907` fit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rollout id {0:?}: use 1-200 characters of letters, digits and ._:-@+=_")]
pub struct InvalidRolloutId(pub String);

/// Check a rollout id: 1–200 characters of letters, digits and `._:-@+=_` (SWE-bench instance ids such as `astropy__astropy-12907` fit).
pub fn check_rollout_id(id: &str) -> Result<(), InvalidRolloutId> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-@+=_".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(InvalidRolloutId(id.to_owned()))
    }
}
