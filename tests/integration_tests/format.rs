//! End-to-end tests: format.
