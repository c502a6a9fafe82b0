//! The guide shows the example as it is: the block after docs/rust.md's `tested:` marker is the part of
//! `examples/axum.rs` between its snippet markers (the example compiles with the crate's tests).

use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn snippet(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines
        .iter()
        .position(|line| *line == "// snippet: start")
        .expect("a start marker");
    let end = lines
        .iter()
        .position(|line| *line == "// snippet: end")
        .expect("an end marker");
    let mut text = lines[start + 1..end].join("\n");
    text.push('\n');
    text
}

/// The body of the fenced block right after `marker` in `document`.
fn block_after(document: &str, marker: &str) -> String {
    let after = document.split_once(marker).expect("the marker").1;
    let body = after
        .split_once("```rust\n")
        .expect("a rust block after the marker")
        .1;
    body.split_once("```\n")
        .expect("the block's end")
        .0
        .to_owned()
}

#[test]
fn the_guide_shows_the_example_as_it_is() {
    let example = snippet(&read("examples/axum.rs"));
    let guide = read("../../docs/rust.md");
    assert_eq!(
        block_after(&guide, "<!-- tested: clients/rust/examples/axum.rs -->"),
        example
    );
}
