//! Backs long-lived, streamed buffers (weights) with 2 MiB pages where the kernel allows.
//!
//! A decode step reads every weight once, hundreds of megabytes in 4 KiB pages: each
//! page is a TLB miss and a page walk in the middle of the stream. With transparent huge
//! pages in `madvise` mode (the common default) nothing is huge unless asked for.
//! Measured on the 2-core AMD machine: a medium f32 decode step at one row ~4-5% faster
//! (`examples/decode_bench`, the model loaded twice and stepped alternately, both orders).

/// `TOKENROUTER_HUGE_PAGES=off` leaves every buffer on the kernel's default pages.
pub fn enabled() -> bool {
    std::env::var("TOKENROUTER_HUGE_PAGES").map_or(true, |v| v != "off" && v != "0")
}

/// Asks the kernel to move the 2 MiB-aligned interior of `data` onto huge pages now
/// (`MADV_COLLAPSE`, Linux 6.1+), and to keep it there (`MADV_HUGEPAGE`). Best effort:
/// returns how many bytes the kernel accepted; 0 where it declines or the OS has no
/// such thing. The contents are unchanged either way.
pub fn prefer_huge_pages<T>(data: &[T]) -> usize {
    match huge_interior(data.as_ptr() as usize, std::mem::size_of_val(data)) {
        Some((first, len)) if enabled() && advise(first, len) => len,
        _ => 0,
    }
}

/// The whole huge pages inside `[start, start + len)`: their first address and length.
fn huge_interior(start: usize, len: usize) -> Option<(usize, usize)> {
    let first = start.next_multiple_of(HUGE_PAGE);
    let last = (start + len) / HUGE_PAGE * HUGE_PAGE;
    (last > first).then(|| (first, last - first))
}

const HUGE_PAGE: usize = 2 << 20;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn advise(start: usize, len: usize) -> bool {
    // SAFETY: the range lies inside a live allocation we hold a reference to; both
    // advices change only how its pages are backed, never what they contain.
    unsafe {
        let addr = start as *mut libc::c_void;
        let kept = libc::madvise(addr, len, libc::MADV_HUGEPAGE) == 0;
        let collapsed = libc::madvise(addr, len, libc::MADV_COLLAPSE) == 0;
        kept && collapsed
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn advise(_start: usize, _len: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_aligned_huge_pages_inside_the_buffer_are_advised() {
        let mib = 1 << 20;
        assert_eq!(huge_interior(0, 4 * mib), Some((0, 4 * mib)));
        assert_eq!(huge_interior(1, 4 * mib), Some((2 * mib, 2 * mib)));
        assert_eq!(huge_interior(mib, 4 * mib), Some((2 * mib, 2 * mib)));
        assert_eq!(huge_interior(mib, 3 * mib - 1), None);
        assert_eq!(huge_interior(2 * mib, 2 * mib - 1), None);
        assert_eq!(huge_interior(3 * mib, 0), None);
    }

    #[test]
    fn advising_keeps_the_contents_and_reports_whole_huge_pages() {
        let data: Vec<u32> = (0..(6 << 20) / 4).map(|i: u32| i.wrapping_mul(2_654_435_761)).collect();
        let moved = prefer_huge_pages(&data);
        assert!(moved == 0 || (moved.is_multiple_of(HUGE_PAGE) && moved >= 2 * HUGE_PAGE), "{moved} bytes");
        assert!(data.iter().enumerate().all(|(i, &v)| v == (i as u32).wrapping_mul(2_654_435_761)));
        assert_eq!(prefer_huge_pages(&data[..1000]), 0);
    }
}
