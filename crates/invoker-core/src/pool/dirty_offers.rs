//! The keys whose offer ([`PoolCore::offer`](super::PoolCore::offer)) may have changed: the
//! core's note between an event and the caller's next question (`offers.rs`).

use super::types::KeyId;
use smallvec::SmallVec;

/// Keys whose offer may have changed since the caller last asked.
#[derive(Debug, Default)]
pub(super) struct Dirty {
    pub(super) keys: SmallVec<[KeyId; 2]>,
    /// Every key's (the pool drains; the largest node changed, which decides what never fits).
    pub(super) all: bool,
}

impl Dirty {
    pub(super) fn mark(&mut self, key: KeyId) {
        if !self.keys.contains(&key) {
            self.keys.push(key);
        }
    }
}
