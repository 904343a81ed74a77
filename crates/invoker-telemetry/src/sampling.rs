//! Whether spans are exported, and which traces are kept: a leaf both the subscriber's set-up
//! and the activations' traces read.

use std::sync::OnceLock;

/// The target of every span this crate exports: only these reach the exporter.
pub const TARGET: &str = "invoker::trace";

/// The share of traces started here that are kept, as `u64::MAX` parts; set once at start,
/// when spans are exported. Decided before any span is made, so that a trace sampled out costs
/// a random draw, not a span built and dropped (the SDK's own sampler then keeps every span
/// it is given).
static KEEP_PARTS: OnceLock<u64> = OnceLock::new();

/// Spans are exported, a share `ratio` of the traces that start here kept: once, at start.
pub(super) fn keep(ratio: f64) {
    let _ = KEEP_PARTS.set(if ratio >= 1.0 { u64::MAX } else { (ratio * u64::MAX as f64) as u64 });
}

/// Whether spans are exported at all.
pub fn exporting() -> bool {
    KEEP_PARTS.get().is_some()
}

/// Whether a trace that starts here is kept (head sampling).
pub fn head_sampled() -> bool {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish() | 1
        });
    }
    let Some(&parts) = KEEP_PARTS.get() else { return false };
    // xorshift64*: sampling needs spread, not secrecy.
    let draw = STATE.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    });
    parts == u64::MAX || draw < parts
}
