//! The one integration-test crate (one binary builds faster than many).

mod layers;
mod support;
mod ui;
