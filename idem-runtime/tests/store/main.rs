//! The stores and the atomic claim, on real databases. Every test in `generic.rs` runs on
//! SQLite and on PostgreSQL; `sqlite.rs` and `postgres.rs` hold what only one backend has.

mod fixture;
mod generic;
mod postgres;
mod sqlite;
mod support;
