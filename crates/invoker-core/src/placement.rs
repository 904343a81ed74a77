//! Where a scheduler sends an activation: OpenWhisk's scheduler rules (seed 000: tags, the
//! managed/blackbox split, warm affinity, rescheduling), made memory-exact. Pure: the invokers
//! as registered, the action's needs and what was already tried go in, one invoker or the
//! reason there is none comes out.

use std::collections::BTreeSet;

/// One registered invoker, as placement sees it for one action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvokerView {
    pub id: String,
    pub tags: Vec<String>,
    pub healthy: bool,
    /// The largest container it could hold, its idle containers removed, as it last
    /// published (the registration's `room_mb`).
    pub launchable_mb: u64,
    /// The largest container it could start with no idle container removed (the
    /// registration's `launchable_mb`): a call that fits there costs no other action its
    /// next warm start.
    pub free_mb: u64,
    /// Its containers of this action revision (from their keys).
    pub warm: u32,
    /// Activations of this action revision this scheduler has in flight there.
    pub in_flight: u32,
}

/// What the action asks of an invoker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActionNeeds {
    pub memory_mb: u64,
    /// The `invoker-resources` annotation: every one of these tags.
    pub tags: Vec<String>,
    /// `invoker-resources-strict-policy` (true unless the annotation says false): no invoker
    /// with the tags means no placement, rather than any invoker.
    pub strict: bool,
    /// A Docker-image ("blackbox") action: it goes to the blackbox part of the invokers.
    pub blackbox: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlacementConfig {
    /// The untagged invokers, in a stable order: the first fraction takes managed actions...
    pub managed_fraction: f64,
    /// ...and the last fraction blackbox ones (OpenWhisk: 0.9 and 0.1; they may overlap).
    pub blackbox_fraction: f64,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig { managed_fraction: 0.9, blackbox_fraction: 0.1 }
    }
}

/// Which rule chose the invoker (for metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// It holds a container of the action revision that this scheduler is not keeping busy.
    Warm,
    /// The one with more room of two drawn at random among the candidates where the call
    /// fits without removing an idle container, or among all of them when none has that.
    Headroom,
    /// Among the invokers with the action's tags.
    Tag,
    /// The other part of the untagged invokers (blackbox for a managed action, or the other
    /// way round): its own part has no room.
    Spill,
    /// No invoker of the wanted kind fits: any tagged one (untagged actions, when no untagged
    /// invoker fits), or any one (tags with a non-strict policy).
    Fallback,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub invoker: String,
    pub rule: Rule,
}

/// Why no invoker takes the activation (the record's message; the caller answers 503).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoPlacement {
    #[error("no healthy invokers")]
    NoHealthy,
    #[error("no invoker fits {0} MB")]
    NoneFits(u64),
    #[error("no invoker has tags [{}]", .0.join(", "))]
    NoTags(Vec<String>),
}

/// Chooses an invoker among `invokers` for an action with `needs`, never one in `tried` (the
/// ones that refused it or could not be reached). `draw(n)` is a random index below `n`.
pub fn place(
    invokers: &[InvokerView],
    needs: &ActionNeeds,
    config: &PlacementConfig,
    tried: &BTreeSet<String>,
    draw: &mut impl FnMut(usize) -> usize,
) -> Result<Placement, NoPlacement> {
    let healthy: Vec<&InvokerView> = invokers.iter().filter(|i| i.healthy && !tried.contains(&i.id)).collect();
    if healthy.is_empty() {
        return Err(NoPlacement::NoHealthy);
    }
    let fitting: Vec<&InvokerView> = healthy.into_iter().filter(|i| i.launchable_mb >= needs.memory_mb).collect();
    if fitting.is_empty() {
        return Err(NoPlacement::NoneFits(needs.memory_mb));
    }
    let (candidates, rule) = if !needs.tags.is_empty() {
        let tagged: Vec<&InvokerView> =
            fitting.iter().copied().filter(|i| needs.tags.iter().all(|t| i.tags.contains(t))).collect();
        match (tagged.is_empty(), needs.strict) {
            (false, _) => (tagged, Rule::Tag),
            (true, true) => return Err(NoPlacement::NoTags(needs.tags.clone())),
            (true, false) => (fitting, Rule::Fallback),
        }
    } else {
        let part = split_part(invokers, needs.blackbox, config);
        let wanted: Vec<&InvokerView> = fitting.iter().copied().filter(|i| part.contains(&i.id.as_str())).collect();
        if !wanted.is_empty() {
            (wanted, Rule::Headroom)
        } else {
            // The split is OpenWhisk's, which sizes no fleet: under a capacity manager that
            // counts every invoker's memory, a part kept for the other kind would sit paid and
            // unused while calls wait for room (the fleet simulator's burst refused 5 % of its
            // calls with 10 % of its invokers idle). So it is a preference: the other untagged
            // part next (what fits, none of it in the wanted part), and tagged invokers (kept
            // for the actions that ask for their tags) last.
            let (untagged, tagged): (Vec<&InvokerView>, Vec<&InvokerView>) =
                fitting.into_iter().partition(|i| i.tags.is_empty());
            match (untagged.is_empty(), tagged.is_empty()) {
                (false, _) => (untagged, Rule::Spill),
                (true, false) => (tagged, Rule::Fallback),
                (true, true) => return Err(NoPlacement::NoneFits(needs.memory_mb)),
            }
        }
    };
    if let Some(warm) =
        candidates.iter().filter(|i| i.warm > i.in_flight).max_by_key(|i| (i.warm - i.in_flight, i.launchable_mb))
    {
        return Ok(Placement { invoker: warm.id.clone(), rule: Rule::Warm });
    }
    // Where the call fits in free memory it removes no other action's idle container, and so
    // costs that action no cold start: those invokers first, when any has that room. In the
    // fleet simulator this took 1 to 12 % off the cold starts of every managed fleet, with the
    // same delays and cost (`scenarios/fleet-*.toml`, BENCHMARKS.md).
    let free: Vec<&InvokerView> = candidates.iter().copied().filter(|i| i.free_mb >= needs.memory_mb).collect();
    let chosen = match free.is_empty() {
        false => roomier_of_two(&free, |i| i.free_mb, draw),
        true => roomier_of_two(&candidates, |i| i.launchable_mb, draw),
    };
    Ok(Placement { invoker: chosen.id.clone(), rule })
}

/// The one with more `room` of two drawn at random from `among` (not empty): load spreads, as
/// with OpenWhisk's, without the cost of looking at every invoker.
fn roomier_of_two<'a>(
    among: &[&'a InvokerView],
    room: impl Fn(&InvokerView) -> u64,
    draw: &mut impl FnMut(usize) -> usize,
) -> &'a InvokerView {
    let first = among[draw(among.len())];
    let second = among[draw(among.len())];
    if room(second) > room(first) {
        second
    } else {
        first
    }
}

/// The ids of the managed (or blackbox) part of the untagged invokers: all registered untagged
/// invokers in id order, so that the split does not move with their health.
fn split_part<'a>(invokers: &'a [InvokerView], blackbox: bool, config: &PlacementConfig) -> Vec<&'a str> {
    let mut untagged: Vec<&str> = invokers.iter().filter(|i| i.tags.is_empty()).map(|i| i.id.as_str()).collect();
    untagged.sort_unstable();
    let n = untagged.len();
    let count = |fraction: f64| ((n as f64 * fraction).ceil() as usize).clamp(1.min(n), n);
    if blackbox {
        untagged.split_off(n - count(config.blackbox_fraction))
    } else {
        untagged.truncate(count(config.managed_fraction));
        untagged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn invoker(id: &str, tags: &[&str], launchable_mb: u64) -> InvokerView {
        InvokerView {
            id: id.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            healthy: true,
            launchable_mb,
            free_mb: launchable_mb,
            warm: 0,
            in_flight: 0,
        }
    }

    fn needs(memory_mb: u64, tags: &[&str], strict: bool) -> ActionNeeds {
        ActionNeeds { memory_mb, tags: tags.iter().map(|t| t.to_string()).collect(), strict, blackbox: false }
    }

    fn first(_: usize) -> usize {
        0
    }

    fn place_once(invokers: &[InvokerView], needs: &ActionNeeds) -> Result<Placement, NoPlacement> {
        place(invokers, needs, &PlacementConfig::default(), &BTreeSet::new(), &mut first)
    }

    #[test]
    fn memory_exact_and_healthy_only() {
        let mut sick = invoker("a", &[], 4096);
        sick.healthy = false;
        let invokers = [sick, invoker("b", &[], 256), invoker("c", &[], 1024)];
        assert_eq!(place_once(&invokers, &needs(512, &[], true)).unwrap().invoker, "c");
        assert_eq!(place_once(&invokers, &needs(2048, &[], true)), Err(NoPlacement::NoneFits(2048)));
        assert_eq!(place_once(&invokers[..1], &needs(128, &[], true)), Err(NoPlacement::NoHealthy));
        assert_eq!(NoPlacement::NoneFits(512).to_string(), "no invoker fits 512 MB");
    }

    #[test]
    fn tags_strict_and_not() {
        let invokers = [invoker("a", &[], 2048), invoker("g", &["gpu"], 2048), invoker("gs", &["gpu", "ssd"], 2048)];
        let p = place_once(&invokers, &needs(256, &["gpu", "ssd"], true)).unwrap();
        assert_eq!((p.invoker.as_str(), p.rule), ("gs", Rule::Tag));
        let missing = needs(256, &["tpu"], true);
        assert_eq!(place_once(&invokers, &missing), Err(NoPlacement::NoTags(vec!["tpu".into()])));
        assert_eq!(NoPlacement::NoTags(vec!["gpu".into()]).to_string(), "no invoker has tags [gpu]");
        let p = place_once(&invokers, &needs(256, &["tpu"], false)).unwrap();
        assert_eq!(p.rule, Rule::Fallback);
    }

    #[test]
    fn untagged_actions_go_to_their_part_then_the_other_and_to_tagged_invokers_last() {
        let ids: Vec<String> = (0..10).map(|i| format!("inv{i}")).collect();
        let mut invokers: Vec<InvokerView> = ids.iter().map(|id| invoker(id, &[], 2048)).collect();
        invokers.push(invoker("tagged", &["gpu"], 4096));
        let config = PlacementConfig::default();
        let mut chosen = BTreeSet::new();
        let mut blackbox = BTreeSet::new();
        let mut n = 0;
        let mut draw = |len: usize| {
            n += 7;
            n % len
        };
        for _ in 0..200 {
            chosen.insert(
                place(&invokers, &needs(256, &[], true), &config, &BTreeSet::new(), &mut draw).unwrap().invoker,
            );
            let bb = ActionNeeds { blackbox: true, ..needs(256, &[], true) };
            blackbox.insert(place(&invokers, &bb, &config, &BTreeSet::new(), &mut draw).unwrap().invoker);
        }
        assert_eq!(blackbox, BTreeSet::from(["inv9".to_string()]), "the last tenth");
        assert!(!chosen.contains("inv9") && !chosen.contains("tagged") && chosen.len() > 3, "{chosen:?}");
        // The managed part full: the blackbox part takes it rather than nobody (before, the
        // call waited for room, or was refused, beside an idle invoker)...
        for i in &mut invokers[..9] {
            i.launchable_mb = 128;
        }
        let p = place(&invokers, &needs(256, &[], true), &config, &BTreeSet::new(), &mut draw).unwrap();
        assert_eq!((p.invoker.as_str(), p.rule), ("inv9", Rule::Spill));
        // ...and the other way round...
        invokers[0].launchable_mb = 2048;
        invokers[9].launchable_mb = 128;
        let bb = ActionNeeds { blackbox: true, ..needs(256, &[], true) };
        let p = place(&invokers, &bb, &config, &BTreeSet::new(), &mut draw).unwrap();
        assert_eq!((p.invoker.as_str(), p.rule), ("inv0", Rule::Spill));
        // ...and a tagged invoker only when no untagged one fits.
        invokers[0].launchable_mb = 128;
        let p = place(&invokers, &needs(256, &[], true), &config, &BTreeSet::new(), &mut draw).unwrap();
        assert_eq!((p.invoker.as_str(), p.rule), ("tagged", Rule::Fallback));
    }

    #[test]
    fn a_warm_invoker_is_preferred_until_this_scheduler_keeps_its_containers_busy() {
        let mut invokers = [invoker("a", &[], 4096), invoker("b", &[], 1024)];
        invokers[1].warm = 2;
        let p = place_once(&invokers, &needs(256, &[], true)).unwrap();
        assert_eq!((p.invoker.as_str(), p.rule), ("b", Rule::Warm));
        invokers[1].in_flight = 2;
        let p = place_once(&invokers, &needs(256, &[], true)).unwrap();
        assert_eq!(p.rule, Rule::Headroom, "its warm containers are all busy with our work");
    }

    #[test]
    fn a_call_goes_where_it_removes_no_idle_container_when_an_invoker_has_that_room() {
        // `a` has the most room, all of it idle containers; `b` less, free.
        let mut invokers = [invoker("a", &[], 4096), invoker("b", &[], 1024)];
        invokers[0].free_mb = 0;
        let place_drawing = |invokers: &[InvokerView], memory_mb: u64| {
            // Draws each invoker in turn: `a` then `b` when both are candidates.
            let mut turn = 0;
            let mut draw = |n: usize| {
                turn += 1;
                (turn - 1) % n
            };
            place(invokers, &needs(memory_mb, &[], true), &PlacementConfig::default(), &BTreeSet::new(), &mut draw)
                .unwrap()
        };
        let p = place_drawing(&invokers, 256);
        assert_eq!((p.invoker.as_str(), p.rule), ("b", Rule::Headroom));
        // No free room that large anywhere: the room idle containers leave counts, as before.
        assert_eq!(place_drawing(&invokers, 2048).invoker, "a");
        invokers[1].free_mb = 128;
        assert_eq!(place_drawing(&invokers, 256).invoker, "a", "the roomier of the two");
    }

    #[test]
    fn a_tried_invoker_is_skipped() {
        let invokers = [invoker("a", &[], 4096), invoker("b", &[], 1024)];
        let tried = BTreeSet::from(["a".to_string()]);
        let p = place(&invokers, &needs(256, &[], true), &PlacementConfig::default(), &tried, &mut first).unwrap();
        assert_eq!(p.invoker, "b");
        let all = BTreeSet::from(["a".to_string(), "b".to_string()]);
        let none = place(&invokers, &needs(256, &[], true), &PlacementConfig::default(), &all, &mut first);
        assert_eq!(none, Err(NoPlacement::NoHealthy));
    }

    fn arb_invoker() -> impl Strategy<Value = InvokerView> {
        (
            0u8..12,
            prop::collection::vec(prop::sample::select(vec!["gpu", "ssd"]), 0..2),
            any::<bool>(),
            0u64..4096,
            0u64..4096,
            0u32..3,
            0u32..3,
        )
            .prop_map(|(id, tags, healthy, launchable_mb, free_mb, warm, in_flight)| InvokerView {
                id: format!("i{id}"),
                tags: tags.into_iter().map(String::from).collect(),
                healthy,
                launchable_mb,
                free_mb: free_mb.min(launchable_mb),
                warm,
                in_flight,
            })
    }

    proptest! {
        #[test]
        fn never_an_invoker_that_does_not_fit_is_unhealthy_was_tried_or_lacks_strict_tags(
            invokers in prop::collection::vec(arb_invoker(), 0..12),
            memory_mb in 128u64..2048,
            tags in prop::collection::vec(prop::sample::select(vec!["gpu", "ssd"]), 0..2),
            strict in any::<bool>(),
            blackbox in any::<bool>(),
            tried in prop::collection::btree_set((0u8..12).prop_map(|i| format!("i{i}")), 0..4),
            seed in any::<u64>(),
        ) {
            let needs = ActionNeeds { memory_mb, tags: tags.iter().map(|t| t.to_string()).collect(), strict, blackbox };
            let mut state = seed;
            let mut draw = |n: usize| { state = state.wrapping_mul(6364136223846793005).wrapping_add(1); (state >> 33) as usize % n };
            let fits = |i: &InvokerView| i.healthy && !tried.contains(&i.id) && i.launchable_mb >= memory_mb;
            match place(&invokers, &needs, &PlacementConfig::default(), &tried, &mut draw) {
                Ok(p) => {
                    prop_assert!(!tried.contains(&p.invoker));
                    // Every invoker of that id qualifies (ids may repeat in generated lists).
                    let chosen: Vec<&InvokerView> = invokers.iter().filter(|i| i.id == p.invoker).collect();
                    prop_assert!(chosen.iter().any(|i| i.healthy && i.launchable_mb >= memory_mb
                        && (!strict || needs.tags.iter().all(|t| i.tags.contains(t)))));
                }
                Err(NoPlacement::NoTags(_)) => {
                    prop_assert!(strict && !needs.tags.is_empty());
                    let tagged_fit = invokers.iter().any(|i| fits(i) && needs.tags.iter().all(|t| i.tags.contains(t)));
                    prop_assert!(!tagged_fit, "an invoker with the tags fit");
                }
                Err(NoPlacement::NoneFits(_)) => {
                    // Whatever its part or tags: no invoker it may use had room.
                    prop_assert!(!invokers.iter().any(fits), "an invoker fit");
                }
                Err(NoPlacement::NoHealthy) => {
                    prop_assert!(!invokers.iter().any(|i| i.healthy && !tried.contains(&i.id)));
                }
            }
        }
    }
}
