//! The one integration-test crate (one binary builds faster than many).

mod layers;
mod streams;
mod support;
mod ui;
