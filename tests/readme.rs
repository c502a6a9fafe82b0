//! The README's client code is the code that runs: its Python and Node snippets are the marked parts of
//! `examples/ratelimit.py` and `examples/ratelimit.js` (which other tests run against a spawned server), and its Go
//! program is `examples/go/main.go` in full. Checks text only; needs no server.

use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The lines strictly between the `snippet: start` and `snippet: end` marker lines.
fn snippet(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines
        .iter()
        .position(|line| line.contains("snippet: start"))
        .expect("a `snippet: start` line");
    let end = lines
        .iter()
        .position(|line| line.contains("snippet: end"))
        .expect("a `snippet: end` line");
    let mut text = lines[start + 1..end].join("\n");
    text.push('\n');
    text
}

/// The bodies of the README's fenced blocks in `language`.
fn fenced_blocks(readme: &str, language: &str) -> Vec<String> {
    let opening = format!("```{language}");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match current.as_mut() {
            None if line == opening => current = Some(String::new()),
            None => {}
            Some(_) if line == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

fn assert_shown(language: &str, expected: &str, source: &str) {
    let readme = read("README.md");
    assert!(
        fenced_blocks(&readme, language)
            .iter()
            .any(|block| block == expected),
        "README.md has no ```{language} block equal to {source}:\n{expected}"
    );
}

#[test]
fn readme_python_snippet_is_the_tested_example() {
    let source = "examples/ratelimit.py";
    assert_shown("python", &snippet(&read(source)), source);
}

#[test]
fn readme_node_snippet_is_the_tested_example() {
    let source = "examples/ratelimit.js";
    assert_shown("js", &snippet(&read(source)), source);
}

#[test]
fn readme_go_program_is_the_example_file() {
    let source = "examples/go/main.go";
    assert_shown("go", &read(source), source);
}

#[test]
fn readme_pacing_snippet_is_the_tested_example() {
    let source = "examples/pacing.py";
    assert_shown("python", &snippet(&read(source)), source);
}
