//! End-to-end tests: record.
