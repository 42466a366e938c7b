//! LoRA adapter slots: which adapters are resident, with LRU replacement and a load cost.
//!
//! `--lora-adapters a,b,c` names the adapters the replica can serve; a request whose `model` is
//! one of them uses that adapter. With `--max-loras 0` (default) every listed adapter is
//! resident from the start and never costs a load (the emulator's behaviour before slots
//! existed). With `--max-loras N > 0` the replica starts with no adapter resident and holds at
//! most N: a request whose adapter is not resident loads it at admission, evicting the least
//! recently used one, and pays `--lora-load-ms` on its TTFT (added to its prefill timer).
//! Simplification: an adapter used by a running request may be evicted (vLLM would keep it and
//! delay the newcomer); the evicted adapter's running requests are not slowed down.
//!
//! Cost: O(N) per admission (N ≤ a few dozen).

/// Resident adapters in LRU order (least recently used first).
#[derive(Debug, Clone)]
pub struct LoraSlots {
    max: usize,
    resident: Vec<String>,
    loads: u64,
}

impl LoraSlots {
    /// `max == 0`: every adapter of `all` resident, unlimited.
    pub fn new(max: usize, all: &[String]) -> LoraSlots {
        LoraSlots {
            max,
            resident: if max == 0 { all.to_vec() } else { Vec::new() },
            loads: 0,
        }
    }

    /// Marks `name` used now; returns true when it had to be loaded (not resident before).
    pub fn touch(&mut self, name: &str) -> bool {
        if let Some(i) = self.resident.iter().position(|r| r == name) {
            let r = self.resident.remove(i);
            self.resident.push(r);
            return false;
        }
        if self.max == 0 {
            // Unlimited mode only knows the listed adapters; an unknown one is resident at once.
            self.resident.push(name.to_string());
            return false;
        }
        if self.resident.len() >= self.max {
            self.resident.remove(0);
        }
        self.resident.push(name.to_string());
        self.loads += 1;
        true
    }

    /// Resident adapters, least recently used first.
    pub fn resident(&self) -> &[String] {
        &self.resident
    }

    /// Slots reported as `max_lora`: `--max-loras`, or the number of adapters when unlimited.
    pub fn max_lora(&self) -> usize {
        if self.max == 0 {
            self.resident.len()
        } else {
            self.max
        }
    }

    /// Adapter loads so far.
    pub fn loads(&self) -> u64 {
        self.loads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_replacement_counts_loads() {
        let mut s = LoraSlots::new(2, &["a".into(), "b".into(), "c".into()]);
        assert!(s.resident().is_empty());
        assert!(s.touch("a"));
        assert!(s.touch("b"));
        assert!(!s.touch("a")); // a is now most recent
        assert!(s.touch("c")); // evicts b
        assert_eq!(s.resident(), ["a", "c"]);
        assert!(s.touch("b")); // evicts a
        assert_eq!(s.resident(), ["c", "b"]);
        assert_eq!((s.loads(), s.max_lora()), (4, 2));
    }

    #[test]
    fn unlimited_mode_preloads_everything_for_free() {
        let mut s = LoraSlots::new(0, &["a".into(), "b".into()]);
        assert_eq!(s.resident(), ["a", "b"]);
        assert!(!s.touch("a"));
        assert_eq!(s.resident(), ["b", "a"]);
        assert_eq!((s.loads(), s.max_lora()), (0, 2));
    }
}
