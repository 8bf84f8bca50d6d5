//! `cuda-mem`: what each kind of CUDA memory costs on this machine.
//!
//! `cuda-mem info` lists the devices and their memory capabilities; `cuda-mem bench` measures
//! copy and kernel bandwidth and allocation latency of every kind of memory through the safe
//! `cuda-mem` API and through raw `cuda-mem-sys` calls; `cuda-mem compare` and
//! `bench --baseline` compare runs; `cuda-mem plot` redraws the plot of a saved run;
//! `cuda-mem completions SHELL` prints a completion script. Run `cuda-mem --help`.
//!
//! Exit status: 0 success, 1 failure (no driver or device, a CUDA error, data that did not
//! verify, a regression with `--fail-on-regression`), 2 bad command line. Errors are one
//! message on stderr, never a panic.

mod args;
mod bench;
mod diagnose;
mod info;
mod report;
mod results;
mod units;

use std::process::ExitCode;

use args::{Command, CompareArgs};

fn main() -> ExitCode {
    let cmd = match args::parse(std::env::args_os()) {
        Ok(c) => c,
        // Help and version print to stdout and exit 0; usage errors print to stderr (with
        // the usage line and a pointer to --help) and exit 2.
        Err(e) => e.exit(),
    };
    let result = match cmd {
        Command::Info { json } => info::run(json),
        Command::Bench(a) => bench::run(&a),
        Command::Compare(a) => compare(&a),
        Command::Plot { input, output } => {
            bench::load(&input).and_then(|doc| report::emit(&output, &report::svg::copy_plot(&doc)))
        }
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut args::command(), "cuda-mem", &mut out);
            report::to_stdout(&String::from_utf8_lossy(&out))
        }
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

/// `cuda-mem compare NEW BASELINE`.
fn compare(a: &CompareArgs) -> anyhow::Result<()> {
    let (new, old) = (bench::load(&a.new)?, bench::load(&a.baseline)?);
    let name = a.baseline.display().to_string();
    let (text, regressed) = report::compare::against(&new, &old, &name, &a.thresholds);
    report::to_stdout(text.trim_start())?;
    report::compare::check_regressions(&a.thresholds, regressed)
}
