//! What one scheduler sent to one invoker, and what that changes of the room the invoker's
//! record shows. A record is the invoker's picture when it last published (every
//! `publish_interval`), read here a little later: a send made since may not be in it yet
//! (*unseen*: it comes off the room), and a send it showed running may have ended since
//! (*freed*: its container is idle now, and idle containers are room). Without the second, a
//! call waiting for room on a full invoker waited for the next publish after a call there
//! ended, up to half a second, while the scheduler had seen the end itself: `invoker replay`
//! found calls refused at `wait_for_room` that way, which the simulator (whose scheduler sees
//! room as it frees) never refused.
//!
//! Both corrections are by memory, against the room of the invoker's roomiest node: on an
//! invoker of several nodes a freed container may sit on another node. An estimate too high
//! costs a call a wait in that invoker's pool (or its refusal, and another invoker), never a
//! container past a node's memory: the invoker's own pool decides where a container goes.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// One hand-over: when it was sent, and a number to tell two sent at once apart.
pub type SendKey = (Instant, u64);

/// Sends that ended kept per invoker at most, until a record read after their end: a record
/// that never changes does not keep them without bound.
const ENDED_KEPT: usize = 4096;

/// One invoker's sends from this scheduler: those out, and those the record showed running
/// that ended since. Placement asks for the correction at every call, so it costs a range over
/// the sends out (a few) and a running sum, never a walk over every end since the record.
#[derive(Debug, Default)]
pub struct Sends {
    /// Each send out, by its key, with its memory.
    out: BTreeMap<SendKey, u64>,
    /// Each send the record showed that ended: when it ended, its memory (oldest end first).
    ended: VecDeque<(Instant, u64)>,
    /// Their memory.
    freed_mb: u64,
}

/// How a record's room is corrected by what this scheduler knows better.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoomCorrection {
    /// Sent, and perhaps not in the record yet.
    pub unseen_mb: u64,
    /// In the record as running, and ended since.
    pub freed_mb: u64,
}

impl RoomCorrection {
    /// `room_mb` as corrected.
    pub fn apply(self, room_mb: u64) -> u64 {
        room_mb.saturating_add(self.freed_mb).saturating_sub(self.unseen_mb)
    }

    /// A record's free memory (no idle container removed) as corrected: a send not in the
    /// record may take some of it; a call that ended since leaves its container idle, not free.
    pub fn apply_free(self, free_mb: u64) -> u64 {
        free_mb.saturating_sub(self.unseen_mb)
    }
}

impl Sends {
    pub fn send(&mut self, key: SendKey, memory_mb: u64) {
        self.out.insert(key, memory_mb);
    }

    /// The send ended at `at` (its answer, or its loss). `shown_before`: sends made before it
    /// are in the invoker's record as now read ([`Sends::correction`]'s rule; none when there
    /// is no record): only their ends free room the record does not show. A later record shows
    /// them too, so the rule holds until a record read after the end makes it moot.
    pub fn end(&mut self, key: SendKey, at: Instant, shown_before: Option<Instant>) {
        let Some(memory_mb) = self.out.remove(&key) else { return };
        if shown_before.is_none_or(|shown| key.0 >= shown) {
            return;
        }
        if self.ended.len() == ENDED_KEPT {
            if let Some((_, mb)) = self.ended.pop_front() {
                self.freed_mb -= mb;
            }
        }
        self.ended.push_back((at, memory_mb));
        self.freed_mb += memory_mb;
    }

    pub fn out(&self) -> usize {
        self.out.len()
    }

    /// Its invoker left the view: no record of it to correct.
    pub fn forget_ended(&mut self) {
        self.ended.clear();
        self.freed_mb = 0;
    }

    /// Nothing out and nothing ended to remember.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty() && self.ended.is_empty()
    }

    /// The correction to a record first read at `read_at`. A send made before `read_at` less
    /// `lag` (how late a record may be read after it was published) is taken as in the record
    /// ([`shown_before`]); one made since, as not. An end before `read_at` may be in it already
    /// and is forgotten: what is freed counts only ends after the record was read.
    pub fn correction(&mut self, read_at: Instant, lag: Duration) -> RoomCorrection {
        while let Some(&(_, mb)) = self.ended.front().filter(|(ended, _)| *ended <= read_at) {
            self.ended.pop_front();
            self.freed_mb -= mb;
        }
        let unseen_mb = self.out.range((shown_before(read_at, lag), 0)..).map(|(_, mb)| mb).sum();
        RoomCorrection { unseen_mb, freed_mb: self.freed_mb }
    }
}

/// Sends made before this are in a record first read at `read_at`, one read at most `lag`
/// after it was published.
pub fn shown_before(read_at: Instant, lag: Duration) -> Instant {
    read_at.checked_sub(lag).unwrap_or(read_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_send_the_record_showed_frees_its_room_when_it_ends_until_a_newer_record() {
        let t0 = Instant::now();
        let lag = ms(50);
        let mut s = Sends::default();
        s.send((t0, 1), 256);
        // Read at 300 ms: the send (at 0) is in it.
        let read = t0 + ms(300);
        assert_eq!(s.correction(read, lag), RoomCorrection::default());
        s.end((t0, 1), t0 + ms(400), Some(shown_before(read, lag)));
        let c = s.correction(read, lag);
        assert_eq!(c, RoomCorrection { unseen_mb: 0, freed_mb: 256 });
        assert_eq!(c.apply(100), 356);
        // Its container is idle now, not free: no free memory comes back.
        assert_eq!(c.apply_free(100), 100);
        // The next record, read after the end, shows it free itself.
        assert_eq!(s.correction(t0 + ms(800), lag), RoomCorrection::default());
        assert!(s.is_empty());
    }

    #[test]
    fn a_send_the_record_cannot_show_comes_off_the_room_and_frees_nothing_when_it_ends() {
        let t0 = Instant::now();
        let lag = ms(50);
        let mut s = Sends::default();
        let read = t0 + ms(300);
        s.send((t0 + ms(280), 1), 128);
        s.send((t0 + ms(400), 2), 128);
        let c = s.correction(read, lag);
        assert_eq!(c, RoomCorrection { unseen_mb: 256, freed_mb: 0 });
        assert_eq!(c.apply(200), 0, "never below none");
        assert_eq!(c.apply_free(300), 44, "a send not in the record may take free memory");
        s.end((t0 + ms(280), 1), t0 + ms(450), Some(shown_before(read, lag)));
        assert_eq!(s.correction(read, lag), RoomCorrection { unseen_mb: 128, freed_mb: 0 });
        assert_eq!(s.out(), 1);
    }

    #[test]
    fn ends_kept_are_bounded_when_no_newer_record_comes() {
        let t0 = Instant::now();
        let mut s = Sends::default();
        let shown = Some(t0 + ms(1));
        for i in 0..(ENDED_KEPT as u64 + 10) {
            s.send((t0, i), 1);
            s.end((t0, i), t0 + ms(1), shown);
        }
        assert_eq!(s.correction(t0 + ms(100), ms(0)).freed_mb, 0, "read after every end");
        for i in 0..(ENDED_KEPT as u64 + 10) {
            s.send((t0, i), 1);
            s.end((t0, i), t0 + ms(200), shown);
        }
        assert_eq!(s.correction(t0 + ms(100), ms(0)).freed_mb, ENDED_KEPT as u64);
        // With no record of the invoker, an end frees nothing.
        s.forget_ended();
        s.send((t0, 1), 64);
        s.end((t0, 1), t0 + ms(300), None);
        assert!(s.is_empty());
    }
}
