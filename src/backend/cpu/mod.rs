//! CPU reference backend (spec §2, §3). Filled in by the CPU engine work.
