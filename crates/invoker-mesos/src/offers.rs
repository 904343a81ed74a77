//! The offers the framework holds, per agent: the Mesos factory's node stats, and what a task
//! may be launched with. Nothing is ever taken beyond what the offers of one agent hold.

use super::proto::v1::{value, Offer, Resource};
use invoker_ids::Time;
use std::collections::BTreeMap;

/// One offer as held: its id and the scalar and port resources it carries.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldOffer {
    pub id: String,
    pub cpus: f64,
    pub mem_mb: f64,
    /// Port ranges, inclusive.
    pub ports: Vec<(u64, u64)>,
    pub received_at: Time,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentOffers {
    pub hostname: String,
    pub offers: Vec<HeldOffer>,
}

impl AgentOffers {
    pub fn cpus(&self) -> f64 {
        self.offers.iter().map(|o| o.cpus).sum()
    }

    pub fn mem_mb(&self) -> f64 {
        self.offers.iter().map(|o| o.mem_mb).sum()
    }
}

/// What one task takes out of an agent's offers.
#[derive(Clone, Debug, PartialEq)]
pub struct Need {
    pub cpus: f64,
    pub mem_mb: f64,
}

/// Resources left in an agent's offers while tasks are packed into them.
#[derive(Debug)]
pub struct Remaining {
    cpus: f64,
    mem_mb: f64,
    ports: Vec<(u64, u64)>,
}

impl Remaining {
    pub fn of(agent: &AgentOffers) -> Self {
        let mut ports: Vec<(u64, u64)> = agent.offers.iter().flat_map(|o| o.ports.iter().copied()).collect();
        ports.sort_unstable();
        Remaining { cpus: agent.cpus(), mem_mb: agent.mem_mb(), ports }
    }

    /// Takes `need` and one port, if all of it is left; otherwise takes nothing.
    pub fn take(&mut self, need: &Need) -> Option<u64> {
        // Offers carry floating-point scalars; a tolerance keeps 0.1 + 0.2 from refusing 0.3.
        const EPSILON: f64 = 1e-9;
        if need.cpus > self.cpus + EPSILON || need.mem_mb > self.mem_mb + EPSILON {
            return None;
        }
        let range = self.ports.iter_mut().find(|(begin, end)| begin <= end)?;
        let port = range.0;
        range.0 += 1;
        self.cpus -= need.cpus;
        self.mem_mb -= need.mem_mb;
        Some(port)
    }
}

#[derive(Debug, Default)]
pub struct OfferBook {
    agents: BTreeMap<String, AgentOffers>,
}

impl OfferBook {
    pub fn add(&mut self, offer: &Offer, now: Time) {
        let mut held =
            HeldOffer { id: offer.id.value.clone(), cpus: 0.0, mem_mb: 0.0, ports: Vec::new(), received_at: now };
        for r in &offer.resources {
            match (r.name.as_str(), r.r#type) {
                ("cpus", t) if t == value::Type::Scalar as i32 => held.cpus += scalar(r),
                ("mem", t) if t == value::Type::Scalar as i32 => held.mem_mb += scalar(r),
                ("ports", t) if t == value::Type::Ranges as i32 => {
                    let ranges = r.ranges.iter().flat_map(|rs| rs.range.iter());
                    held.ports.extend(ranges.filter(|r| r.begin <= r.end).map(|r| (r.begin, r.end)));
                }
                _ => {}
            }
        }
        let agent = self.agents.entry(offer.agent_id.value.clone()).or_default();
        agent.hostname = offer.hostname.clone();
        agent.offers.retain(|o| o.id != held.id);
        agent.offers.push(held);
    }

    /// Forgets a rescinded offer; true if it was held.
    pub fn rescind(&mut self, offer_id: &str) -> bool {
        let mut found = false;
        for agent in self.agents.values_mut() {
            let before = agent.offers.len();
            agent.offers.retain(|o| o.id != offer_id);
            found |= agent.offers.len() != before;
        }
        self.agents.retain(|_, a| !a.offers.is_empty());
        found
    }

    /// Takes every offer of an agent out of the book (an ACCEPT uses them all: what the
    /// launched tasks do not take goes back to the master).
    pub fn take_agent(&mut self, agent: &str) -> Option<AgentOffers> {
        self.agents.remove(agent)
    }

    pub fn agent(&self, agent: &str) -> Option<&AgentOffers> {
        self.agents.get(agent)
    }

    pub fn agents(&self) -> impl Iterator<Item = (&String, &AgentOffers)> {
        self.agents.iter()
    }

    /// Takes out the offers received at or before `before` (to decline them).
    pub fn take_older_than(&mut self, before: Time) -> Vec<String> {
        let mut ids = Vec::new();
        for agent in self.agents.values_mut() {
            agent.offers.retain(|o| {
                let old = o.received_at <= before;
                if old {
                    ids.push(o.id.clone());
                }
                !old
            });
        }
        self.agents.retain(|_, a| !a.offers.is_empty());
        ids
    }

    pub fn take_all(&mut self) -> Vec<String> {
        std::mem::take(&mut self.agents).into_values().flat_map(|a| a.offers.into_iter().map(|o| o.id)).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}

fn scalar(r: &Resource) -> f64 {
    r.scalar.as_ref().map_or(0.0, |s| s.value).max(0.0)
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::proto::v1::*;
    use std::time::Duration;

    pub fn offer(id: &str, agent: &str, cpus: f64, mem: f64, ports: (u64, u64)) -> Offer {
        let scalar = |name: &str, v: f64| Resource {
            name: name.into(),
            r#type: value::Type::Scalar as i32,
            scalar: Some(value::Scalar { value: v }),
            ..Default::default()
        };
        let ports = Resource {
            name: "ports".into(),
            r#type: value::Type::Ranges as i32,
            ranges: Some(value::Ranges { range: vec![value::Range { begin: ports.0, end: ports.1 }] }),
            ..Default::default()
        };
        Offer {
            id: OfferId { value: id.into() },
            framework_id: FrameworkId { value: "f".into() },
            agent_id: AgentId { value: agent.into() },
            hostname: format!("{agent}.host"),
            resources: vec![scalar("cpus", cpus), scalar("mem", mem), ports],
        }
    }

    #[test]
    fn an_agents_offers_add_up_and_tasks_never_take_more_than_they_hold() {
        let mut book = OfferBook::default();
        book.add(&offer("o1", "a", 1.0, 256.0, (31000, 31000)), Duration::ZERO);
        book.add(&offer("o2", "a", 0.5, 256.0, (31005, 31006)), Duration::ZERO);
        let agent = book.agent("a").unwrap();
        assert_eq!((agent.cpus(), agent.mem_mb()), (1.5, 512.0));
        let mut left = Remaining::of(agent);
        let need = Need { cpus: 0.5, mem_mb: 200.0 };
        assert_eq!(left.take(&need), Some(31000));
        assert_eq!(left.take(&need), Some(31005));
        assert_eq!(left.take(&need), None, "112 MB left");
        assert_eq!(left.take(&Need { cpus: 0.5, mem_mb: 100.0 }), Some(31006));
        assert_eq!(left.take(&Need { cpus: 0.0, mem_mb: 1.0 }), None, "no port left");
    }

    #[test]
    fn rescinded_and_old_offers_leave_the_book() {
        let mut book = OfferBook::default();
        book.add(&offer("o1", "a", 1.0, 256.0, (1, 2)), Duration::from_secs(1));
        book.add(&offer("o2", "b", 1.0, 256.0, (1, 2)), Duration::from_secs(5));
        assert!(book.rescind("o1"));
        assert!(!book.rescind("o1"));
        assert!(book.agent("a").is_none());
        assert_eq!(book.take_older_than(Duration::from_secs(4)), Vec::<String>::new());
        assert_eq!(book.take_older_than(Duration::from_secs(5)), vec!["o2".to_string()]);
        assert!(book.is_empty());
    }
}
