//! The README's usage section is `examples/minimal.rs`, which `cargo test` builds: the code a
//! reader copies is code that compiles.

#[test]
fn the_readme_shows_examples_minimal_verbatim() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let minimal = std::fs::read_to_string(format!("{root}/examples/minimal.rs")).unwrap();
    assert!(
        readme.contains(&format!("```rust\n{minimal}```\n")),
        "README.md's usage block differs from examples/minimal.rs: copy the file into it"
    );
}
