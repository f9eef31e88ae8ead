//! The permit path does not allocate: counted by a global allocator that
//! tallies the allocations of the calling thread only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|n| n.get())
}

#[test]
fn permit_and_drop_do_not_allocate() {
    let client = dlock::Client::new(
        dlock::MemoryService::new().link(),
        dlock::Options::default(),
    )
    .unwrap();
    let lock = client.lock("no-alloc").unwrap();
    lock.acquire(Duration::from_secs(5)).unwrap();
    let before = allocations();
    for _ in 0..10_000 {
        let p = lock.permit().unwrap();
        assert!(p.valid());
        drop(p);
        let p = lock.permit_owned().unwrap();
        drop(p);
    }
    assert_eq!(allocations() - before, 0);
    // The counter does count: a refused permit path allocates nothing
    // either, but this Vec does.
    let v = vec![1u8; 16];
    assert_eq!(allocations() - before, 1);
    drop(v);
}
