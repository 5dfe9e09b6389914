//! Prefix cache: token sequences mapped to device snapshots of the state after them.
//!
//! A hybrid model's recurrent state cannot be cut back to an earlier position the way a KV cache
//! can, so reuse works at snapshot boundaries only: a request resumes from the longest cached
//! sequence that is a prefix of its tokens and prefills just the rest. Entries are evicted least
//! recently used once their bytes exceed the budget.
//!
//! Entries belong to a tenant (`set_tenant`): a lookup sees only the current tenant's entries.
//! A server shared by several users sets one per API key (and per `cache_salt`), since whether a
//! prompt hits the cache (and how fast it runs) tells whether someone else sent the same prefix.

use crate::exec::Snapshot;

struct Entry {
    tenant: String,
    tokens: Vec<u32>,
    snap: Snapshot,
    last_used: u64,
}

/// Counters for `/health`, `/stats` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found a cached prefix.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Prompt tokens skipped thanks to hits, summed.
    pub tokens_reused: u64,
    /// Snapshots stored, summed (including ones evicted since).
    pub inserted: u64,
    pub evicted: u64,
    /// Snapshots held now and their device bytes.
    pub entries: usize,
    pub bytes: u64,
    pub budget: u64,
}

pub struct PrefixCache {
    entries: Vec<Entry>,
    /// Whose entries lookups, `contains` and inserts see (`""` unless set).
    tenant: String,
    budget: u64,
    bytes: u64,
    clock: u64,
    stats: CacheStats,
}

/// A cache hit: the snapshot to restore and how many leading tokens it covers.
pub struct Hit<'a> {
    pub snap: &'a Snapshot,
    pub len: usize,
}

impl PrefixCache {
    /// An empty cache holding at most `budget` bytes of snapshots (0 disables it).
    pub fn new(budget: u64) -> PrefixCache {
        PrefixCache {
            entries: Vec::new(),
            tenant: String::new(),
            budget,
            bytes: 0,
            clock: 0,
            stats: CacheStats {
                budget,
                ..CacheStats::default()
            },
        }
    }

    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Scope the following lookups, `contains` and inserts to `tenant`'s entries. The byte budget
    /// and eviction stay shared.
    pub fn set_tenant(&mut self, tenant: &str) {
        if self.tenant != tenant {
            self.tenant = tenant.to_string();
        }
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The longest cached sequence that is a proper prefix of `tokens` (at least one token of
    /// `tokens` is left to run, since the caller needs the logits of the last one) and longer than
    /// `live`, the prefix the caller can already continue from without a restore. Marks the
    /// entry as used; the caller reports the outcome with `record`.
    pub fn lookup(&mut self, tokens: &[u32], live: usize) -> Option<Hit<'_>> {
        let i = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.tenant == self.tenant
                    && e.tokens.len() > live
                    && e.tokens.len() < tokens.len()
                    && tokens.starts_with(&e.tokens)
            })
            .max_by_key(|(_, e)| e.tokens.len())
            .map(|(i, _)| i)?;
        self.clock += 1;
        let e = &mut self.entries[i];
        e.last_used = self.clock;
        Some(Hit {
            snap: &e.snap,
            len: e.tokens.len(),
        })
    }

    /// Count a request that reused `reused` prompt tokens (a hit) or none (a miss).
    pub fn record(&mut self, reused: usize) {
        if reused > 0 {
            self.stats.hits += 1;
            self.stats.tokens_reused += reused as u64;
        } else {
            self.stats.misses += 1;
        }
    }

    /// Whether `tokens` exactly is cached (no counters change).
    pub fn contains(&self, tokens: &[u32]) -> bool {
        self.entries
            .iter()
            .any(|e| e.tenant == self.tenant && e.tokens == tokens)
    }

    /// Store `snap` as the state after `tokens`, evicting least recently used entries to stay
    /// within the budget. A snapshot larger than the whole budget is dropped. Returns whether it
    /// was stored.
    pub fn insert(&mut self, tokens: Vec<u32>, snap: Snapshot) -> bool {
        let size = snap.bytes();
        if size > self.budget || tokens.is_empty() {
            return false;
        }
        self.clock += 1;
        let tenant = &self.tenant;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| &e.tenant == tenant && e.tokens == tokens)
        {
            // Same sequence, same state: keep the old copy, just refresh it.
            e.last_used = self.clock;
            return false;
        }
        while self.bytes + size > self.budget {
            let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used) else {
                break;
            };
            let old = self.entries.swap_remove(i);
            self.bytes -= old.snap.bytes();
            self.stats.evicted += 1;
        }
        self.bytes += size;
        self.stats.inserted += 1;
        self.entries.push(Entry {
            tenant: self.tenant.clone(),
            tokens,
            snap,
            last_used: self.clock,
        });
        true
    }

    /// Drop every entry (the counters stay).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.entries.len(),
            bytes: self.bytes,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(pos: usize) -> Snapshot {
        Snapshot::from_parts(Vec::new(), pos)
    }

    #[test]
    fn tenants_see_only_their_own_entries() {
        let mut c = PrefixCache::new(1 << 20);
        c.set_tenant("alice");
        assert!(c.insert(vec![1, 2, 3], snap(3)));
        assert_eq!(c.lookup(&[1, 2, 3, 4], 0).map(|h| h.len), Some(3));
        c.set_tenant("bob");
        assert!(c.lookup(&[1, 2, 3, 4], 0).is_none());
        assert!(!c.contains(&[1, 2, 3]));
        // Bob's copy of the same sequence is his own entry.
        assert!(c.insert(vec![1, 2, 3], snap(3)));
        assert_eq!(c.stats().entries, 2);
        c.set_tenant("");
        assert!(c.lookup(&[1, 2, 3, 4], 0).is_none());
        c.set_tenant("alice");
        assert!(c.contains(&[1, 2, 3]));
    }
}
