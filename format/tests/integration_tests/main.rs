//! Integration tests of the `.lpt` format: round trips, damage, old traces.

mod corruption;
mod fixtures;
mod round_trip;
mod versions;
