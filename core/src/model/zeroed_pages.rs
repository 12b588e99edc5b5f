//! Zero-filled memory straight from the kernel, for the K/V arena.
//!
//! The arena is page-aligned, and the allocator serves an aligned zeroed allocation as
//! an aligned `malloc` followed by a `memset`: every page of the KV budget became
//! resident at start (all of it in RSS from the first second, and seconds spent zeroing
//! a large budget). An anonymous private mapping reads as zeros without being touched:
//! the kernel gives a physical page only where one is first written (or where the
//! warm-up commits them all on purpose), and `munmap` returns it all at once.

use std::ptr::NonNull;

/// An owned, page-aligned run of zeroed bytes; unmapped when dropped.
pub(crate) struct ZeroedPages {
    ptr: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the pages are plain memory owned by this value alone (no other handle to the
// mapping exists), so moving it to another thread moves sole ownership, and sharing it
// shares only a raw pointer: whoever reads or writes through that pointer answers for
// it (the K/V arena's page discipline, see `KvArena`).
unsafe impl Send for ZeroedPages {}
unsafe impl Sync for ZeroedPages {}

impl ZeroedPages {
    /// `bytes` zeroed bytes (none mapped for 0). Running out of address space ends the
    /// process, as a failed allocation does.
    pub(crate) fn new(bytes: usize) -> Self {
        if bytes == 0 {
            return ZeroedPages { ptr: NonNull::dangling(), bytes };
        }
        match map_zeroed(bytes) {
            Some(ptr) => ZeroedPages { ptr, bytes },
            None => std::alloc::handle_alloc_error(layout(bytes)),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for ZeroedPages {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // SAFETY: mapped (or allocated) in `new` with this length, and not yet released.
            unsafe { unmap(self.ptr, self.bytes) };
        }
    }
}

impl std::fmt::Debug for ZeroedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroedPages").field("bytes", &self.bytes).finish()
    }
}

/// What the fallback allocates, and what a failure reports.
fn layout(bytes: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(bytes, 4096).expect("zeroed pages layout")
}

#[cfg(unix)]
fn map_zeroed(bytes: usize) -> Option<NonNull<u8>> {
    // SAFETY: a new private anonymous mapping; it aliases nothing.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(ptr as *mut u8)
}

/// # Safety
/// `ptr` and `bytes` are those of a live mapping from [`map_zeroed`].
#[cfg(unix)]
unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
    libc::munmap(ptr.as_ptr() as *mut libc::c_void, bytes);
}

/// Elsewhere, the allocator's zeroed memory (committed up front where it zeroes by hand).
#[cfg(not(unix))]
fn map_zeroed(bytes: usize) -> Option<NonNull<u8>> {
    // SAFETY: the layout has a non-zero size (`new` maps nothing for 0).
    NonNull::new(unsafe { std::alloc::alloc_zeroed(layout(bytes)) })
}

/// # Safety
/// `ptr` and `bytes` are those of a live allocation from [`map_zeroed`].
#[cfg(not(unix))]
unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
    std::alloc::dealloc(ptr.as_ptr(), layout(bytes));
}
