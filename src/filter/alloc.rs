//! Bench instrument (cargo feature `alloccount`, off by default): the
//! counting allocator of [`crate::alloc_count`] installed in the filter, its
//! count exported as `prefix_router_allocs()` for `scripts/cost-adapter.sh`
//! (`COST_ADAPTER_ALLOCS=1`), which prints the allocations per request by
//! callback.

use crate::alloc_count::{allocations, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (and reallocations) so far in this VM.
#[no_mangle]
pub extern "C" fn prefix_router_allocs() -> u64 {
    allocations()
}
