//! Links the `shoal` binary as a fixed-address (non-PIE) executable.
//!
//! Every container has a `shoal shim` process (the same binary). As a position-independent
//! executable, each process applied ~1.6 MB of relocations to the binary's read-only-after-
//! relocation data (`.data.rel.ro`, vtables and static tables of every crate) at start, making
//! those pages private: 1.66 MB of each shim's 2.1 MB PSS (measured from
//! `/proc/<shim>/smaps`). Linked at a fixed address, the relocations are resolved by the linker,
//! the pages stay clean and are shared by every shim and the agent. The cost: the executable's
//! own code and data are not placed at a random address (its libraries, heap, stacks and mmaps
//! still are).
fn main() {
    println!("cargo:rustc-link-arg-bin=shoal=-no-pie");
}
