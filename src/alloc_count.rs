//! A global allocator that counts allocations (a reallocation counts as
//! one; everything is forwarded to the system allocator unchanged). Not
//! installed by the library: `examples/cost_probe.rs` installs it natively
//! (allocations per routing, `scripts/cost.sh`), and the filter installs
//! it with the cargo feature `alloccount` (`scripts/cost-adapter.sh`,
//! `COST_ADAPTER_ALLOCS=1`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// The counting allocator (install with `#[global_allocator]`).
pub struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

/// Allocations (and reallocations) so far in this process or VM.
pub fn allocations() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}
