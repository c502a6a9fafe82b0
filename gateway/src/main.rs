//! The `tb-rls` binary: parses the flags, sets up logging and runs the service (see `lib.rs`).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let settings = tb_rls::settings::Settings::parse();
    tb_rls::init_logging(&settings);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(error = %err, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(tb_rls::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            tracing::error!("{why}");
            ExitCode::from(2)
        }
    }
}
