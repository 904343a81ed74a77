//! Actions and activation records, behind a trait; embedded by default (one redb file).
//!
//! The contract that keeps activations from being lost: `accept` writes a pending entry before
//! the activation is acknowledged, `finish` replaces it with the record, and at start-up
//! `recover_unfinished` turns whatever an earlier run left pending into whisk-error records.

// One module maps its journal segments (`segment.rs`); nothing else is unsafe.
#![deny(unsafe_code)]

pub mod action_cache;
mod contract;
pub mod journal;
mod large_records;
mod redb_store;
mod segment;

pub use contract::*;
pub use journal::{JournalOptions, JournaledStore, DEFAULT_ACTION_CACHE_BYTES, DEFAULT_END_RESERVE_BYTES};
pub use redb_store::RedbStore;
