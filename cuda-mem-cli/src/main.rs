//! `cuda-mem`: what each kind of CUDA memory costs on this machine.
//!
//! `cuda-mem info` lists the devices and their memory capabilities; `cuda-mem bench` measures
//! copy and kernel bandwidth and allocation latency of every kind of memory through the safe
//! `cuda-mem` API and through raw `cuda-mem-sys` calls. Run `cuda-mem --help` for the options.
//!
//! Exit status: 0 success, 1 failure (no driver or device, a CUDA error, data that did not
//! verify), 2 bad command line. Errors are one message on stderr, never a panic.

mod args;
mod bench;
mod diagnose;
mod info;
mod report;
mod results;
mod units;

use std::process::ExitCode;

use args::Command;

fn main() -> ExitCode {
    let mut argv = Vec::new();
    for a in std::env::args_os().skip(1) {
        match a.into_string() {
            Ok(s) => argv.push(s),
            Err(bad) => return usage_error(&format!("argument {bad:?} is not valid UTF-8")),
        }
    }
    let cmd = match args::parse(argv) {
        Ok(c) => c,
        Err(e) => return usage_error(&e.0),
    };
    let result = match cmd {
        Command::Help => report::to_stdout(args::USAGE),
        Command::Version => report::to_stdout(&format!(
            "cuda-mem {} (built with CUDA {} headers)\n",
            env!("CARGO_PKG_VERSION"),
            cuda_mem::format_version(cuda_mem::BUILT_CUDART_VERSION as i32)
        )),
        Command::Info { json } => info::run(json),
        Command::Bench(a) => bench::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<diagnose::NoDevice>() {
                Some(nd) => report::to_stderr(&format!("{nd}\n")),
                None => report::to_stderr(&format!("cuda-mem: error: {e:#}\n")),
            }
            ExitCode::FAILURE
        }
    }
}

fn usage_error(msg: &str) -> ExitCode {
    report::to_stderr(&format!(
        "cuda-mem: {msg}\nRun 'cuda-mem --help' for usage.\n"
    ));
    ExitCode::from(2)
}
