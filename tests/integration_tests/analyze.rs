//! End-to-end tests: analyze.
