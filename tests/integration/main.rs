//! The one integration-test crate (one binary builds faster than many).

mod a2a_sdk;
mod callers;
mod conformance;
mod counted;
mod crash;
mod delegation;
mod example_relay;
mod example_server;
mod faults;
mod harness_mutants;
mod harness_responses;
mod http_files;
mod layers;
mod misuse;
mod mutant;
mod operations;
mod push;
mod readme;
mod replicas;
mod streams;
mod support;
mod ui;
mod unit_of_work;
