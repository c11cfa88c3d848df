//! The one integration-test crate (one binary builds faster than many).

mod conformance;
mod http_files;
mod layers;
mod streams;
mod support;
mod ui;
