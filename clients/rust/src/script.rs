//! The Lua fallback, embedded at build time: `lua/tb.lua` (a symbolic link to the repository's one file, stored
//! as a file in the published crate) in its two forms, generated as the script's header says and as the Python
//! and Node packages generate them: the `EVAL` form is the file as it is; the Functions library is the file
//! behind two lines that name it after the package version (`tb_0_5_0`), so two versions share a server.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

/// The script (`EVAL`/`EVALSHA` form), byte for byte the repository's `lua/tb.lua`.
pub const SCRIPT: &str = include_str!("../lua/tb.lua");

/// The library's name: `tb_` and the package version with every character but letters and digits as `_`.
pub fn library_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let version: String = env!("CARGO_PKG_VERSION")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!("tb_{version}")
    })
}

/// The Redis Functions library built from the same script, for `FUNCTION LOAD`. An administrator can load it for
/// an application user without the `FUNCTION` permission.
pub fn library() -> &'static str {
    static LIBRARY: OnceLock<String> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let name = library_name();
        format!("#!lua name={name}\nlocal TB_LIBRARY = '{name}'\n{SCRIPT}")
    })
}

/// The script's SHA-1, for `EVALSHA`.
pub fn script_sha() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(SCRIPT).get_hash().to_owned())
}

/// The library function that runs `command` (`TB.ACQUIREALL` -> `tb_0_5_0_acquireall`).
pub fn function_name(command: &str) -> String {
    let short = command.strip_prefix("TB.").unwrap_or(command);
    format!("{}_{}", library_name(), short.to_ascii_lowercase())
}
