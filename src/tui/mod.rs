//! The terminal UI. Filled in by the TUI work.
