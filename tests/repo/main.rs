//! The repository's own consistency checks: every relative link in the docs resolves and the tree
//! carries no development diary (`repo_docs`), the module layering of src/lib.rs holds
//! (`layering`), and the kernels' compiled metadata matches their sources (`kernel_metadata`).
//!
//! One test binary of modules, so the crate is linked once for all of them (tests/README.md).

#[path = "../support/mod.rs"]
mod support;

mod kernel_metadata;
mod layering;
mod repo_docs;
