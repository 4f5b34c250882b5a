//! The caching allocator's bookkeeping, apart from the driver: freed
//! device blocks go to free lists by rounded size and serve later requests
//! of the same size class, so the tensors a training step makes and drops
//! do not go through `cuMemAlloc`/`cuMemFree` every step.
//!
//! The allocator is generic over [`RawAlloc`] so that its bookkeeping is
//! tested on the CPU with a fake (`tests` below); the device session
//! plugs in the driver's allocation functions.

use std::collections::BTreeMap;

/// Allocations below this size are rounded up to a multiple of
/// [`SMALL_ROUND`] bytes, larger ones to a multiple of [`LARGE_ROUND`].
pub const SMALL_LIMIT: usize = 1 << 20;
/// The granularity of small blocks.
pub const SMALL_ROUND: usize = 512;
/// The granularity of large blocks.
pub const LARGE_ROUND: usize = 2 << 20;

/// The size class a request of `bytes` is served from (at least one
/// granule, so that empty tensors still get a distinct address).
pub fn round_size(bytes: usize) -> usize {
    let g = if bytes < SMALL_LIMIT {
        SMALL_ROUND
    } else {
        LARGE_ROUND
    };
    bytes.max(1).div_ceil(g) * g
}

/// Where blocks come from: the driver, or a fake in tests.
pub trait RawAlloc {
    /// The error of a failed allocation.
    type Error;
    /// Allocates `bytes` bytes, returning the block's address.
    fn alloc(&mut self, bytes: usize) -> Result<u64, Self::Error>;
    /// Frees a block that [`RawAlloc::alloc`] returned.
    fn free(&mut self, ptr: u64, bytes: usize);
}

/// Counters of a [`CachingAllocator`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes in blocks handed out and not yet returned.
    pub in_use: usize,
    /// Bytes in freed blocks kept for reuse.
    pub cached: usize,
    /// The most `in_use + cached` ever held from the raw allocator.
    pub peak_reserved: usize,
    /// Requests served from the cache.
    pub hits: usize,
    /// Requests that went to the raw allocator.
    pub misses: usize,
}

/// A block handed out: its address and the size class it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// The device address.
    pub ptr: u64,
    /// The rounded size (what the block really holds).
    pub size: usize,
}

/// Free lists by size class over a [`RawAlloc`].
///
/// A request takes a cached block of its own size class if there is one;
/// otherwise the smallest cached block of at most twice its size (so a
/// large block is not wasted on a small tensor); otherwise a new block.
/// When the raw allocator fails, every cached block is released and the
/// request tried once more.
pub struct CachingAllocator<R: RawAlloc> {
    raw: R,
    free: BTreeMap<usize, Vec<u64>>,
    stats: AllocStats,
}

impl<R: RawAlloc> CachingAllocator<R> {
    /// An empty cache over `raw`.
    pub fn new(raw: R) -> Self {
        CachingAllocator {
            raw,
            free: BTreeMap::new(),
            stats: AllocStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> AllocStats {
        self.stats
    }

    /// A block of at least `bytes` bytes.
    pub fn alloc(&mut self, bytes: usize) -> Result<Block, R::Error> {
        let size = round_size(bytes);
        let found = self
            .free
            .range(size..=size.saturating_mul(2))
            .find(|(_, v)| !v.is_empty())
            .map(|(&s, _)| s);
        if let Some(s) = found {
            let list = self.free.get_mut(&s).expect("listed size");
            let ptr = list.pop().expect("a free block");
            if list.is_empty() {
                self.free.remove(&s);
            }
            self.stats.cached -= s;
            self.stats.in_use += s;
            self.stats.hits += 1;
            return Ok(Block { ptr, size: s });
        }
        let ptr = match self.raw.alloc(size) {
            Ok(p) => p,
            Err(_) => {
                self.release_cached();
                self.raw.alloc(size)?
            }
        };
        self.stats.in_use += size;
        self.stats.misses += 1;
        self.stats.peak_reserved = self
            .stats
            .peak_reserved
            .max(self.stats.in_use + self.stats.cached);
        Ok(Block { ptr, size })
    }

    /// Returns a block to the cache.
    pub fn free(&mut self, block: Block) {
        self.stats.in_use -= block.size;
        self.stats.cached += block.size;
        self.free.entry(block.size).or_default().push(block.ptr);
    }

    /// Gives every cached block back to the raw allocator.
    pub fn release_cached(&mut self) {
        for (size, ptrs) in std::mem::take(&mut self.free) {
            for p in ptrs {
                self.raw.free(p, size);
            }
        }
        self.stats.cached = 0;
    }

    /// The raw allocator (for tests and teardown).
    pub fn raw(&self) -> &R {
        &self.raw
    }
}

impl<R: RawAlloc> Drop for CachingAllocator<R> {
    fn drop(&mut self) {
        self.release_cached();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A fake device: addresses from a counter, a capacity, and a record of
    /// live blocks so double frees and leaks show.
    #[derive(Default)]
    struct Fake {
        next: u64,
        capacity: usize,
        live: HashMap<u64, usize>,
        allocs: usize,
    }

    impl RawAlloc for Fake {
        type Error = ();
        fn alloc(&mut self, bytes: usize) -> Result<u64, ()> {
            let used: usize = self.live.values().sum();
            if used + bytes > self.capacity {
                return Err(());
            }
            self.next += 1 << 32;
            self.live.insert(self.next, bytes);
            self.allocs += 1;
            Ok(self.next)
        }
        fn free(&mut self, ptr: u64, bytes: usize) {
            assert_eq!(self.live.remove(&ptr), Some(bytes), "bad free");
        }
    }

    fn fake(capacity: usize) -> CachingAllocator<Fake> {
        CachingAllocator::new(Fake {
            capacity,
            ..Fake::default()
        })
    }

    #[test]
    fn sizes_round_to_granules() {
        assert_eq!(round_size(0), 512);
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(SMALL_LIMIT - 1), SMALL_LIMIT);
        assert_eq!(round_size(SMALL_LIMIT), 2 << 20);
        assert_eq!(round_size((2 << 20) + 1), 4 << 20);
    }

    #[test]
    fn freed_blocks_are_reused() {
        let mut a = fake(1 << 30);
        let b1 = a.alloc(4000).unwrap();
        let b2 = a.alloc(4000).unwrap();
        assert_ne!(b1.ptr, b2.ptr);
        a.free(b1);
        let b3 = a.alloc(3900).unwrap();
        assert_eq!(b3, b1);
        let s = a.stats();
        assert_eq!((s.hits, s.misses), (1, 2));
        assert_eq!(s.in_use, 2 * 4096);
        assert_eq!(s.cached, 0);
        assert_eq!(a.raw().allocs, 2);
    }

    #[test]
    fn best_fit_within_twice_the_size() {
        let mut a = fake(1 << 30);
        let big = a.alloc(8 << 20).unwrap();
        let mid = a.alloc(3 << 20).unwrap();
        a.free(big);
        a.free(mid);
        // 3 MiB rounds to 4 MiB: served by the 4 MiB block, not the 8.
        assert_eq!(a.alloc(3 << 20).unwrap(), mid);
        // 2 MiB: the 8 MiB block is more than twice as large.
        let fresh = a.alloc(2 << 20).unwrap();
        assert_ne!(fresh, big);
        // 5 MiB rounds to 6 MiB; 8 MiB is within twice that.
        assert_eq!(a.alloc(5 << 20).unwrap(), big);
        assert_eq!(a.stats().cached, 0);
    }

    #[test]
    fn out_of_memory_releases_the_cache_and_retries() {
        let mut a = fake(7 << 20);
        let x = a.alloc(6 << 20).unwrap();
        a.free(x);
        assert_eq!(a.stats().cached, 6 << 20);
        // 4 MiB: the cached 6 MiB block is within twice that, so reused.
        let y = a.alloc(4 << 20).unwrap();
        assert_eq!(y.ptr, x.ptr);
        a.free(y);
        // 2 MiB: the 6 MiB block is too big to reuse and the device is
        // full; the cache is released and the request succeeds.
        let z = a.alloc(2 << 20).unwrap();
        assert_eq!(a.stats().cached, 0);
        assert_eq!(a.raw().live.len(), 1);
        a.free(z);
        // Too large even for an empty device.
        assert!(a.alloc(16 << 20).is_err());
    }

    #[test]
    fn drop_returns_everything() {
        let mut a = fake(1 << 30);
        let blocks: Vec<Block> = (0..10).map(|i| a.alloc(1000 * (i + 1)).unwrap()).collect();
        for b in blocks {
            a.free(b);
        }
        assert_eq!(a.stats().in_use, 0);
        a.release_cached();
        assert!(a.raw().live.is_empty());
    }
}
