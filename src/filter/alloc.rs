//! Bench instrument (cargo feature `alloccount`, off by default): a global
//! allocator that counts allocations (and reallocations that move to a new
//! block count as one), exported as `prefix_router_allocs()` for
//! `scripts/cost-adapter.sh --allocs`, which prints the allocations per
//! request by callback. The count is a plain `static` (a VM is
//! single-threaded); everything else is the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to `System` unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (and reallocations) so far in this VM.
#[no_mangle]
pub extern "C" fn prefix_router_allocs() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}
