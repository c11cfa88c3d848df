//! The stores and the atomic claim, on real databases. Every test in `generic.rs` runs on
//! SQLite and on PostgreSQL; `sqlite.rs` and `postgres.rs` hold what only one backend has.
//! Inside the crate: they drive the stores through the claim, which is the runtime's own.

mod fixture;
mod generic;
mod pausing;
#[cfg(feature = "postgres")]
mod pooled_sessions;
#[cfg(feature = "postgres")]
mod postgres;
mod sqlite;
#[cfg(feature = "postgres")]
mod stalling_proxy;
mod support;
