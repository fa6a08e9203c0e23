//! Token sampling on the CPU, in llama.cpp's common order: penalties (repetition, presence), then greedy when
//! the temperature is 0, else top-k → top-p → min-p → temperature softmax → a draw from a seeded generator.
//! top-p and min-p see temperature-1 probabilities, as in llama.cpp. The generator is xoshiro256** seeded by
//! SplitMix64: integer arithmetic only, so a seed gives the same draws natively and in wasm.

use std::cmp::Ordering;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingOptions {
    /// 0 ⇒ greedy (argmax, lowest id on ties).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 ⇒ off.
    pub top_k: usize,
    /// Keep the smallest most-likely set whose probability reaches p; 1 ⇒ off. In (0, 1].
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one's probability; 0 ⇒ off. In [0, 1].
    pub min_p: f32,
    /// Logits of tokens seen in the last `penalty_last_n`: positive ones divided, negative ones multiplied;
    /// 1 ⇒ off. Positive.
    pub repetition_penalty: f32,
    /// Subtracted from the logits of tokens seen in the last `penalty_last_n`; 0 ⇒ off (negative favours them).
    pub presence_penalty: f32,
    /// How many of the latest context tokens the penalties look at; 0 ⇒ penalties off.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingOptions {
    /// llama.cpp's defaults, with a fixed seed.
    fn default() -> SamplingOptions {
        SamplingOptions {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingOptions {
    /// Argmax, no penalties.
    pub fn greedy() -> SamplingOptions {
        SamplingOptions { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingOptions::default() }
    }

    pub fn validate(&self) -> Result<(), String> {
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(format!("temperature must be a finite number ≥ 0 (0 = greedy), not {t}"));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(format!("top_p must be in (0, 1] (1 = off), not {p}"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(format!("min_p must be in [0, 1] (0 = off), not {m}"));
        }
        let r = self.repetition_penalty;
        if !r.is_finite() || r <= 0.0 {
            return Err(format!("repetition_penalty must be a finite number > 0 (1 = off), not {r}"));
        }
        if !self.presence_penalty.is_finite() {
            return Err(format!("presence_penalty must be a finite number (0 = off), not {}", self.presence_penalty));
        }
        Ok(())
    }

    /// Whether the penalties change any logit.
    pub fn penalties_active(&self) -> bool {
        self.penalty_last_n > 0 && (self.repetition_penalty != 1.0 || self.presence_penalty != 0.0)
    }

    /// Greedy with no penalties: the engine's GPU argmax gives the same token.
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature == 0.0 && !self.penalties_active()
    }
}

/// xoshiro256** seeded through SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The first index of the largest logit (NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    let mut found = false;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_value || (!found && !v.is_nan()) {
            best = i;
            best_value = v;
            found = true;
        }
    }
    best as u32
}

/// Most likely first; ties by lowest id.
fn by_likelihood(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

pub struct Sampler {
    options: SamplingOptions,
    rng: Rng,
    candidates: Vec<(u32, f32)>,
    seen: Vec<u32>,
}

impl Sampler {
    pub fn new(options: SamplingOptions) -> Result<Sampler, String> {
        options.validate()?;
        Ok(Sampler { rng: Rng::new(options.seed), options, candidates: Vec::new(), seen: Vec::new() })
    }

    pub fn options(&self) -> &SamplingOptions {
        &self.options
    }

    /// Picks the next token from `logits` (changed in place by the penalties); `history` is the context so
    /// far, whose last `penalty_last_n` tokens the penalties look at.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "no logits to sample from");
        if self.options.temperature == 0.0 {
            self.apply_penalties(logits, history);
            return argmax(logits);
        }
        self.filter(logits, history);
        let max = self.candidates.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
        if self.candidates.len() == 1 || max == f32::NEG_INFINITY {
            return self.candidates[0].0;
        }
        let inv_t = 1.0 / self.options.temperature as f64;
        let total: f64 = self.candidates.iter().map(|c| ((c.1 - max) as f64 * inv_t).exp()).sum();
        let mut target = self.rng.next_f64() * total;
        for c in &self.candidates {
            let w = ((c.1 - max) as f64 * inv_t).exp();
            if target < w {
                return c.0;
            }
            target -= w;
        }
        // rounding: the last candidate with any weight
        self.candidates.iter().rev().find(|c| c.1 > f32::NEG_INFINITY).unwrap_or(&self.candidates[0]).0
    }

    /// The penalties, then top-k, top-p and min-p: the candidates a draw chooses from, as (id, logit). Sorted
    /// most likely first whenever top-k or top-p is on; in id order otherwise.
    pub fn filter(&mut self, logits: &mut [f32], history: &[u32]) -> &[(u32, f32)] {
        for l in logits.iter_mut() {
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
        self.apply_penalties(logits, history);
        let o = &self.options;
        let n = logits.len();
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        let cands = &mut self.candidates;
        cands.clear();
        if max == f32::NEG_INFINITY {
            cands.push((0, f32::NEG_INFINITY));
            return cands;
        }
        let min_logit = if o.min_p > 0.0 { max + o.min_p.ln() } else { f32::NEG_INFINITY };
        let top_p = o.top_p < 1.0;

        if o.top_k > 0 && o.top_k < n {
            cands.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
            cands.select_nth_unstable_by(o.top_k - 1, by_likelihood);
            cands.truncate(o.top_k);
            cands.sort_unstable_by(by_likelihood);
            if top_p {
                let z: f64 = cands.iter().map(|c| ((c.1 - max) as f64).exp()).sum();
                let keep = top_p_len(cands, max, z, o.top_p as f64).unwrap_or(cands.len());
                cands.truncate(keep);
            }
            let keep = cands.iter().take_while(|c| c.1 >= min_logit).count().max(1);
            cands.truncate(keep);
        } else if top_p {
            // top-p normalises over every token; min-p (a prefix of the same order) may drop some first
            let z: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
            cands.extend(logits.iter().enumerate().filter(|c| *c.1 >= min_logit).map(|(i, &l)| (i as u32, l)));
            // sort only as many of the most likely as top-p needs
            let mut k = 64usize;
            loop {
                if k >= cands.len() {
                    cands.sort_unstable_by(by_likelihood);
                    let keep = top_p_len(cands, max, z, o.top_p as f64).unwrap_or(cands.len());
                    cands.truncate(keep);
                    break;
                }
                cands.select_nth_unstable_by(k - 1, by_likelihood);
                cands[..k].sort_unstable_by(by_likelihood);
                if let Some(keep) = top_p_len(&cands[..k], max, z, o.top_p as f64) {
                    cands.truncate(keep);
                    break;
                }
                k = k.saturating_mul(8);
            }
        } else {
            cands.extend(logits.iter().enumerate().filter(|c| *c.1 >= min_logit).map(|(i, &l)| (i as u32, l)));
        }
        cands
    }

    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        let o = &self.options;
        if !o.penalties_active() {
            return;
        }
        let window = &history[history.len().saturating_sub(o.penalty_last_n)..];
        self.seen.clear();
        self.seen.extend_from_slice(window);
        self.seen.sort_unstable();
        self.seen.dedup();
        for &t in &self.seen {
            if let Some(l) = logits.get_mut(t as usize) {
                if o.repetition_penalty != 1.0 {
                    *l = if *l > 0.0 { *l / o.repetition_penalty } else { *l * o.repetition_penalty };
                }
                *l -= o.presence_penalty;
            }
        }
    }
}

/// How many of `sorted` (most likely first) top-p keeps: the shortest prefix whose probability (normaliser
/// `z`, temperature 1) reaches `p`; None when this prefix does not reach it.
fn top_p_len(sorted: &[(u32, f32)], max: f32, z: f64, p: f64) -> Option<usize> {
    let mut cum = 0.0;
    for (i, c) in sorted.iter().enumerate() {
        cum += ((c.1 - max) as f64).exp() / z;
        if cum >= p {
            return Some(i + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(temperature: f32) -> SamplingOptions {
        SamplingOptions { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingOptions::default() }
    }

    fn logits(seed: u64, n: usize) -> Vec<f32> {
        let mut r = Rng::new(seed);
        (0..n).map(|_| (r.next_f64() * 20.0 - 10.0) as f32).collect()
    }

    #[test]
    fn greedy_picks_argmax_with_lowest_id_on_ties() {
        let mut s = Sampler::new(opts(0.0)).unwrap();
        assert_eq!(s.sample(&mut [0.0, 3.0, 1.0, 3.0, -1.0], &[]), 1);
        assert_eq!(s.sample(&mut [f32::NAN, 2.0, 2.0], &[]), 1);
        assert_eq!(s.sample(&mut [f32::NEG_INFINITY; 4], &[]), 0);
        let l = logits(7, 157184);
        let best = l.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0))).unwrap().0 as u32;
        assert_eq!(s.sample(&mut l.clone(), &[]), best);
    }

    #[test]
    fn top_k_1_equals_greedy_at_any_temperature() {
        for (seed, t) in [(1u64, 0.1f32), (2, 1.0), (3, 5.0), (4, 100.0)] {
            let l = logits(seed, 5000);
            let mut s = Sampler::new(SamplingOptions { top_k: 1, temperature: t, seed, ..opts(t) }).unwrap();
            for _ in 0..5 {
                assert_eq!(s.sample(&mut l.clone(), &[]), argmax(&l));
            }
        }
        let mut s = Sampler::new(SamplingOptions { top_k: 1, ..opts(2.0) }).unwrap();
        assert_eq!(s.sample(&mut [1.0, 5.0, 5.0, 0.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_sequence_other_seed_other_sequence() {
        let l = logits(11, 157184);
        let run = |seed| {
            let mut s = Sampler::new(SamplingOptions { seed, temperature: 1.5, ..SamplingOptions::default() }).unwrap();
            (0..40).map(|_| s.sample(&mut l.clone(), &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
        // the generator itself is fixed: pinned values guard against accidental changes
        let mut r = Rng::new(0);
        let first = r.next_u64();
        assert_eq!(first, Rng::new(0).next_u64());
        assert_ne!(first, Rng::new(1).next_u64());
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        // probabilities 0.5, 0.25, 0.125, 0.125 (logits = ln p)
        let base: Vec<f32> = [0.5f32, 0.25, 0.125, 0.125].iter().map(|p| p.ln()).collect();
        let ids = |top_p: f32| {
            let mut s = Sampler::new(SamplingOptions { top_p, ..opts(1.0) }).unwrap();
            let mut v: Vec<u32> = s.filter(&mut base.clone(), &[]).iter().map(|c| c.0).collect();
            v.sort();
            v
        };
        assert_eq!(ids(0.4), vec![0]);
        assert_eq!(ids(0.5), vec![0]);
        assert_eq!(ids(0.6), vec![0, 1]);
        assert_eq!(ids(0.8), vec![0, 1, 2]);
        assert_eq!(ids(1.0), vec![0, 1, 2, 3]);
        // draws never leave the set, over a large vocabulary (the incremental partial sort)
        let mut l = vec![-30.0f32; 157184];
        l[100_000] = 5.0;
        l[3] = 5.0;
        l[77] = 4.0;
        let mut s = Sampler::new(SamplingOptions { top_p: 0.7, seed: 9, ..opts(1.0) }).unwrap();
        let kept: Vec<u32> = s.filter(&mut l.clone(), &[]).iter().map(|c| c.0).collect();
        assert_eq!(kept, vec![3, 100_000]);
        for _ in 0..200 {
            let t = s.sample(&mut l.clone(), &[]);
            assert!(t == 3 || t == 100_000, "{t}");
        }
        // a flat distribution needs many candidates: the loop widens past its first guesses
        let mut s = Sampler::new(SamplingOptions { top_p: 0.5, ..opts(1.0) }).unwrap();
        // (2^13 equal tokens: each probability and every partial sum is exact)
        assert_eq!(s.filter(&mut vec![1.0; 8192], &[]).len(), 4096);
    }

    #[test]
    fn min_p_drops_tokens_below_the_fraction_of_the_best() {
        let base: Vec<f32> = [0.5f32, 0.3, 0.1, 0.06, 0.04].iter().map(|p| p.ln()).collect();
        for top_k in [0, 4] {
            let mut s = Sampler::new(SamplingOptions { min_p: 0.15, top_k, seed: 5, ..opts(1.0) }).unwrap();
            let mut kept: Vec<u32> = s.filter(&mut base.clone(), &[]).iter().map(|c| c.0).collect();
            kept.sort();
            assert_eq!(kept, vec![0, 1, 2], "top_k {top_k}");
            for _ in 0..300 {
                assert!(s.sample(&mut base.clone(), &[]) <= 2);
            }
        }
        // top-p then min-p: the shorter prefix wins
        let mut s = Sampler::new(SamplingOptions { min_p: 0.15, top_p: 0.7, ..opts(1.0) }).unwrap();
        assert_eq!(s.filter(&mut base.clone(), &[]).len(), 2);
    }

    #[test]
    fn penalties_change_the_logits_of_recent_tokens_only() {
        let mut s = Sampler::new(SamplingOptions { repetition_penalty: 2.0, penalty_last_n: 3, ..opts(0.0) }).unwrap();
        let mut l = vec![4.0, -4.0, 4.0, 4.0, 1.0];
        // token 0 is outside the window of 3; 1 (negative) and 3 (positive, seen twice) are inside
        s.sample(&mut l, &[0, 3, 1, 3]);
        assert_eq!(l, vec![4.0, -8.0, 4.0, 2.0, 1.0]);
        let mut s = Sampler::new(SamplingOptions { presence_penalty: 1.5, penalty_last_n: 64, ..opts(0.0) }).unwrap();
        let mut l = vec![4.0, -4.0, 4.0];
        assert_eq!(s.sample(&mut l, &[0, 0, 1]), 2);
        assert_eq!(l, vec![2.5, -5.5, 4.0]);
        // penalty_last_n 0 turns them off
        let mut s = Sampler::new(SamplingOptions { presence_penalty: 1.5, penalty_last_n: 0, ..opts(0.0) }).unwrap();
        let mut l = vec![4.0, 3.0];
        assert_eq!(s.sample(&mut l, &[0]), 0);
        assert_eq!(l, vec![4.0, 3.0]);
    }

    #[test]
    fn validate_rejects_bad_values() {
        let bad = [
            SamplingOptions { temperature: f32::NAN, ..Default::default() },
            SamplingOptions { temperature: -0.1, ..Default::default() },
            SamplingOptions { temperature: f32::INFINITY, ..Default::default() },
            SamplingOptions { top_p: 0.0, ..Default::default() },
            SamplingOptions { top_p: 1.5, ..Default::default() },
            SamplingOptions { top_p: f32::NAN, ..Default::default() },
            SamplingOptions { min_p: -0.1, ..Default::default() },
            SamplingOptions { min_p: 2.0, ..Default::default() },
            SamplingOptions { repetition_penalty: 0.0, ..Default::default() },
            SamplingOptions { repetition_penalty: f32::NAN, ..Default::default() },
            SamplingOptions { presence_penalty: f32::NAN, ..Default::default() },
        ];
        for o in bad {
            let e = o.validate().unwrap_err();
            assert!(e.contains("must be"), "{e}");
            assert!(Sampler::new(o).is_err());
        }
        assert!(SamplingOptions::default().validate().is_ok());
        assert!(SamplingOptions::greedy().validate().is_ok());
        assert!(SamplingOptions::greedy().is_plain_greedy());
        assert!(SamplingOptions { presence_penalty: -1.0, ..Default::default() }.validate().is_ok());
    }
}
