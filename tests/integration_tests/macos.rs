//! End-to-end tests: macos.
