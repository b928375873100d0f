//! The library's allocator (mimalloc, `src/lib.rs`) leaves transparent huge pages to the
//! system's policy: it asks for none of its memory (`MADV_HUGEPAGE`, the `hg` flag of a mapping
//! in /proc/self/smaps). With the request, each first touch of a fresh 2 MiB stretch of its arenas
//! zeroed all of it (30 ms of `clear_page` at a WRITE target's start) and doubled the programs'
//! resident memory.

// Linked, so that its global allocator is this binary's.
use softrdma_verbs_shim as _;

/// The mappings of this process that carry the huge-page advice, by their first line.
fn advised_mappings() -> Vec<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out = Vec::new();
    let mut head = String::new();
    for line in smaps.lines() {
        if line.split_whitespace().next().is_some_and(|w| w.contains('-') && !w.ends_with(':')) {
            head = line.to_string();
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            if flags.split_whitespace().any(|f| f == "hg") {
                out.push(head.clone());
            }
        }
    }
    out
}

#[test]
fn the_allocator_asks_for_no_huge_pages() {
    // Allocations of every size class and some large ones, through this binary's global
    // allocator (the library's), touched so that their memory is committed.
    let mut keep: Vec<Vec<u8>> = Vec::new();
    for shift in 3..24 {
        let mut v = vec![0u8; 1 << shift];
        v[0] = 1;
        keep.push(v);
    }
    let advised = advised_mappings();
    assert!(advised.is_empty(), "mappings with MADV_HUGEPAGE: {advised:?}");
    std::hint::black_box(&keep);
}
