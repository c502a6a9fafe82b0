//! The guide shows the examples as they are: the block after each of docs/rust.md's `tested:` markers is the part
//! of `examples/<name>.rs` between its snippet markers (the examples compile with the crate's tests).

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
fn the_guide_shows_the_examples_as_they_are() {
    let guide = read("../../docs/rust.md");
    for name in ["axum", "cluster"] {
        let example = snippet(&read(&format!("examples/{name}.rs")));
        let marker = format!("<!-- tested: clients/rust/examples/{name}.rs -->");
        assert_eq!(block_after(&guide, &marker), example, "{name}");
    }
}
