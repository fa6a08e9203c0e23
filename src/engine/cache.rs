//! The expert cache: which (layer, expert) sits in which slot of the GPU pool, and which slot to give up when
//! the router asks for an expert that is not there. CPU bookkeeping only; the pool holds the bytes.
//!
//! Two eviction policies (the reference design's): plain LRU, and "hot", a decaying access frequency per
//! expert (each use adds 1, every token multiplies all scores by `decay`), which keeps the experts MoE routing
//! keeps coming back to even when a burst of one-off experts passes through. Ties and empty slots: the least
//! recently used slot goes first. The slots holding the current layer's selection are never evicted while that
//! layer is being served.

use serde::Serialize;

pub const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Policy {
    Lru,
    /// Decaying frequency: scores are multiplied by `decay` (0 < decay ≤ 1) after every token.
    Hot { decay: f32 },
}

impl Policy {
    /// The default: chosen by `lingtab bench-stream` (hit rate on skewed routing, same pool, same tokens).
    pub const DEFAULT: Policy = Policy::Hot { decay: 0.97 };

    pub fn parse(s: &str) -> Result<Policy, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "hot" => Ok(Policy::DEFAULT),
            _ => match s.strip_prefix("hot:").map(str::parse::<f32>) {
                Some(Ok(d)) if d > 0.0 && d <= 1.0 => Ok(Policy::Hot { decay: d }),
                _ => Err(format!("unknown cache policy {s:?}: lru, hot or hot:DECAY (0 < DECAY ≤ 1)")),
            },
        }
    }
    pub fn name(&self) -> String {
        match self {
            Policy::Lru => "lru".into(),
            Policy::Hot { decay } => format!("hot:{decay}"),
        }
    }
}

/// What the router's selection means for the pool: the slot of every selected expert (in selection order)
/// and the misses to fill (expert, slot, the key it evicted if any).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub slots: Vec<u32>,
    pub fills: Vec<Fill>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fill {
    pub expert: u32,
    pub slot: u32,
    /// The (layer · n_expert + expert) key whose expert this slot held, now gone.
    pub evicted: Option<u32>,
}

pub struct ExpertCache {
    pub policy: Policy,
    n_expert: u32,
    /// slot of key `layer · n_expert + expert`, or NONE
    slot_of: Vec<u32>,
    /// key held by each slot, or NONE
    owner: Vec<u32>,
    /// last use of each slot (access counter)
    last_use: Vec<u64>,
    /// slot pinned by the layer being served (equal to `serving`)
    pinned: Vec<u64>,
    serving: u64,
    clock: u64,
    /// decaying frequency per key, in units of `increment` (grows instead of decaying every score)
    score: Vec<f64>,
    increment: f64,
}

impl ExpertCache {
    pub fn new(n_layer: usize, n_expert: u32, n_slots: u32, policy: Policy) -> ExpertCache {
        let keys = n_layer * n_expert as usize;
        ExpertCache {
            policy,
            n_expert,
            slot_of: vec![NONE; keys],
            owner: vec![NONE; n_slots as usize],
            last_use: vec![0; n_slots as usize],
            pinned: vec![0; n_slots as usize],
            serving: 0,
            clock: 0,
            score: vec![0.0; keys],
            increment: 1.0,
        }
    }

    pub fn n_slots(&self) -> u32 {
        self.owner.len() as u32
    }

    /// A token has passed: older uses count for less under the hot policy.
    pub fn end_token(&mut self) {
        if let Policy::Hot { decay } = self.policy {
            self.increment /= decay as f64;
            if self.increment > 1e200 {
                // renormalise before the scores overflow; the order is unchanged
                for s in &mut self.score {
                    *s /= self.increment;
                }
                self.increment = 1.0;
            }
        }
    }

    fn key(&self, layer: usize, expert: u32) -> u32 {
        layer as u32 * self.n_expert + expert
    }

    /// Maps `layer`'s selected experts to slots, choosing a victim for each miss.
    /// Panics if the pool has fewer slots than one selection (the engine refuses such a pool at load).
    pub fn plan(&mut self, layer: usize, experts: &[u32]) -> Plan {
        assert!(experts.len() <= self.owner.len(), "a pool of {} slots cannot hold {} experts", self.owner.len(), experts.len());
        self.serving += 1;
        let mut plan = Plan::default();
        // hits first, so a miss never evicts an expert this layer is about to use
        for &e in experts {
            let slot = self.slot_of[self.key(layer, e) as usize];
            if slot != NONE {
                self.pinned[slot as usize] = self.serving;
            }
        }
        for &e in experts {
            let key = self.key(layer, e);
            self.clock += 1;
            self.score[key as usize] += self.increment;
            let mut slot = self.slot_of[key as usize];
            if slot == NONE {
                slot = self.victim();
                let old = self.owner[slot as usize];
                if old != NONE {
                    self.slot_of[old as usize] = NONE;
                }
                self.owner[slot as usize] = key;
                self.slot_of[key as usize] = slot;
                plan.fills.push(Fill { expert: e, slot, evicted: (old != NONE).then_some(old) });
            }
            self.pinned[slot as usize] = self.serving;
            self.last_use[slot as usize] = self.clock;
            plan.slots.push(slot);
        }
        plan
    }

    /// Forgets a slot's contents (its fill failed: the bytes in it are not the expert's).
    pub fn forget(&mut self, slot: u32) {
        let key = self.owner[slot as usize];
        if key != NONE {
            self.slot_of[key as usize] = NONE;
            self.owner[slot as usize] = NONE;
            self.last_use[slot as usize] = 0;
        }
    }

    /// The slot to give up: an empty one, else the lowest-ranked unpinned one.
    fn victim(&self) -> u32 {
        let mut best = NONE;
        let mut best_rank = (f64::INFINITY, u64::MAX);
        for s in 0..self.owner.len() {
            if self.pinned[s] == self.serving {
                continue;
            }
            let key = self.owner[s];
            if key == NONE {
                return s as u32;
            }
            let frequency = match self.policy {
                Policy::Lru => 0.0,
                Policy::Hot { .. } => self.score[key as usize],
            };
            let rank = (frequency, self.last_use[s]);
            if rank < best_rank {
                best_rank = rank;
                best = s as u32;
            }
        }
        assert!(best != NONE, "every slot is pinned");
        best
    }

    /// Slot of (layer, expert), if resident.
    pub fn slot(&self, layer: usize, expert: u32) -> Option<u32> {
        let s = self.slot_of[self.key(layer, expert) as usize];
        (s != NONE).then_some(s)
    }
}

/// Counters of the expert cache, per MoE layer and overall.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheStats {
    pub policy: String,
    pub pool_slots: u32,
    pub slot_bytes: u64,
    /// Steps run (tokens).
    pub tokens: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Per trunk layer (dense layers stay at 0).
    pub layer_hits: Vec<u64>,
    pub layer_misses: Vec<u64>,
    /// Bytes of expert records read from the store or file.
    pub bytes_read: u64,
    /// Bytes written into the pool (records and slot-table entries).
    pub bytes_uploaded: u64,
    /// Seconds reading records, uploading them, and waiting for the GPU's routing.
    pub read_s: f64,
    pub upload_s: f64,
    pub wait_s: f64,
    /// GPU↔CPU round trips (routing readbacks) and command submissions.
    pub syncs: u64,
    pub submits: u64,
}

impl CacheStats {
    /// Zeroed counters for a pool of `pool_slots` slots of `slot_bytes` bytes, per-layer counters for `n_layer`.
    pub fn new(policy: &str, pool_slots: u32, slot_bytes: u64, n_layer: usize) -> CacheStats {
        CacheStats { policy: policy.into(), pool_slots, slot_bytes, layer_hits: vec![0; n_layer], layer_misses: vec![0; n_layer], ..Default::default() }
    }

    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_invariants(c: &ExpertCache) {
        for (s, &key) in c.owner.iter().enumerate() {
            if key != NONE {
                assert_eq!(c.slot_of[key as usize], s as u32);
            }
        }
        for (key, &s) in c.slot_of.iter().enumerate() {
            if s != NONE {
                assert_eq!(c.owner[s as usize], key as u32);
            }
        }
    }

    #[test]
    fn a_selection_is_always_served_from_distinct_slots_without_evicting_itself() {
        let mut rng = 12345u64;
        for policy in [Policy::Lru, Policy::Hot { decay: 0.8 }] {
            let mut c = ExpertCache::new(4, 32, 8, policy);
            for step in 0..2000 {
                let layer = step % 4;
                let mut ids = Vec::new();
                while ids.len() < 8 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let e = (rng % 32) as u32;
                    if !ids.contains(&e) {
                        ids.push(e);
                    }
                }
                let plan = c.plan(layer, &ids);
                let mut slots = plan.slots.clone();
                slots.sort();
                slots.dedup();
                assert_eq!(slots.len(), 8, "{policy:?}: slots {:?}", plan.slots);
                for (e, s) in ids.iter().zip(&plan.slots) {
                    assert_eq!(c.slot(layer, *e), Some(*s));
                }
                check_invariants(&c);
                if layer == 3 {
                    c.end_token();
                }
            }
        }
    }

    #[test]
    fn hits_need_no_fill_and_misses_fill_empty_slots_first() {
        let mut c = ExpertCache::new(1, 16, 4, Policy::Lru);
        let p = c.plan(0, &[1, 2]);
        assert_eq!(p.fills.len(), 2);
        assert!(p.fills.iter().all(|f| f.evicted.is_none()));
        let p = c.plan(0, &[2, 1]);
        assert!(p.fills.is_empty());
        let p = c.plan(0, &[3, 4]);
        assert!(p.fills.iter().all(|f| f.evicted.is_none()));
        // full: LRU evicts expert 1 then 2? 1 was used before 2 in the last plan touching them ([2, 1]): 2 goes
        let p = c.plan(0, &[5]);
        assert_eq!(p.fills[0].evicted, Some(2));
    }

    #[test]
    fn the_hot_policy_keeps_a_frequent_expert_that_lru_drops() {
        // expert 0 is used every other token; a stream of one-off experts passes through a 2-slot pool
        let run = |policy| {
            let mut c = ExpertCache::new(1, 1000, 2, policy);
            let mut hits = 0;
            for t in 0..200u32 {
                let ids = if t % 2 == 0 { vec![0] } else { vec![1 + t] };
                let plan = c.plan(0, &ids);
                hits += ids.len() - plan.fills.len();
                // two one-offs between uses of 0
                c.plan(0, &[500 + t]);
                c.end_token();
            }
            hits
        };
        let lru = run(Policy::Lru);
        let hot = run(Policy::Hot { decay: 0.9 });
        assert!(hot > lru + 50, "hot {hot} hits, lru {lru}");
    }

    #[test]
    fn policies_parse() {
        assert_eq!(Policy::parse("lru").unwrap(), Policy::Lru);
        assert_eq!(Policy::parse("hot:0.5").unwrap(), Policy::Hot { decay: 0.5 });
        assert!(Policy::parse("hot:0").is_err());
        assert!(Policy::parse("mru").is_err());
    }
}
