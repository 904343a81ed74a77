//! Guesses made good. A scheduler writes a whisk-error record as a guess when it cannot see
//! how an activation ended: it restarted while the activation was out, or it lost the invoker
//! that held it. The invoker may have run it to the end all the same, and its record is then
//! the truth the user should read. Each guess is kept here for [`GUESS_WINDOW`]; the invokers
//! are asked for their records of the guessed activations (the one that held it, or, after a
//! restart, which one is not known, every invoker in the view), a round at a time, and a
//! record found replaces the guess in the scheduler's store. One found nowhere within the
//! window leaves the guess standing, and its text says what it is.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a guess waits for the truth.
pub const GUESS_WINDOW: Duration = Duration::from_secs(600);
/// Guesses kept at most (a scheduler's `max_in_flight` is far below): past it, the oldest
/// stands as written.
const MAX_GUESSES: usize = 100_000;
/// The first pause between two rounds of asking, doubled each quiet round up to the last.
pub const FIRST_ROUND: Duration = Duration::from_millis(500);
pub const LAST_ROUND: Duration = Duration::from_secs(15);

/// The guesses not yet replaced, by activation id.
#[derive(Default)]
pub struct Guesses {
    pending: Mutex<BTreeMap<String, Guess>>,
}

#[derive(Clone, Debug)]
struct Guess {
    /// The invoker that held it; `None`: not known (asked of every invoker).
    invoker: Option<String>,
    until: Instant,
}

/// Which invokers one round asks for which activations.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Asked of the named invoker only.
    pub of: BTreeMap<String, Vec<String>>,
    /// Asked of every invoker.
    pub of_all: Vec<String>,
}

impl Round {
    pub fn is_empty(&self) -> bool {
        self.of.is_empty() && self.of_all.is_empty()
    }
}

impl Guesses {
    pub fn add(&self, activation_id: &str, invoker: Option<&str>, now: Instant) {
        let mut pending = self.pending.lock();
        if pending.len() >= MAX_GUESSES {
            tracing::warn!(activation = %activation_id, "{MAX_GUESSES} guesses wait for their invokers' records already: this one stands as written");
            return;
        }
        let guess = Guess { invoker: invoker.map(str::to_string), until: now + GUESS_WINDOW };
        pending.insert(activation_id.to_string(), guess);
    }

    /// Forgets the guesses whose window passed, and says who to ask for the rest.
    pub fn round(&self, now: Instant) -> Round {
        let mut pending = self.pending.lock();
        pending.retain(|id, g| {
            let keep = g.until > now;
            if !keep {
                tracing::info!(activation = %id, "no invoker had a record of it within {GUESS_WINDOW:?}: its guess stands");
            }
            keep
        });
        let mut round = Round::default();
        for (id, guess) in pending.iter() {
            match &guess.invoker {
                Some(invoker) => round.of.entry(invoker.clone()).or_default().push(id.clone()),
                None => round.of_all.push(id.clone()),
            }
        }
        round
    }

    /// Takes `activation_id` off the list; whether it was on it (a record found for it is
    /// the truth to store).
    pub fn settle(&self, activation_id: &str) -> bool {
        self.pending.lock().remove(activation_id).is_some()
    }

    pub fn len(&self) -> usize {
        self.pending.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guess_is_asked_of_its_invoker_or_of_all_until_settled_or_its_window_passes() {
        let guesses = Guesses::default();
        let t0 = Instant::now();
        guesses.add("a", Some("i1"), t0);
        guesses.add("b", None, t0);
        guesses.add("c", Some("i1"), t0 + Duration::from_secs(60));
        let round = guesses.round(t0);
        assert_eq!(round.of.get("i1").unwrap(), &vec!["a".to_string(), "c".to_string()]);
        assert_eq!(round.of_all, vec!["b".to_string()]);
        assert!(guesses.settle("a") && !guesses.settle("a"), "settled once");
        let later = guesses.round(t0 + GUESS_WINDOW);
        assert_eq!(later.of.get("i1").unwrap(), &vec!["c".to_string()], "b's window passed");
        assert!(later.of_all.is_empty());
        assert!(guesses.round(t0 + GUESS_WINDOW * 2).is_empty() && guesses.is_empty());
    }
}
