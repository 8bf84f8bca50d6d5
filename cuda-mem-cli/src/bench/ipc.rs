//! Two processes (issue 23), run only when asked (`bench --sections ipc`): this binary spawns
//! itself as the importer (`CUDA_MEM_IPC_BENCH_CHILD` set to the socket path) and prints:
//!
//! - `ipc_export_{legacy,pool}`: [`Exporter::offer`] of a 64 MiB buffer, µs (handle, event,
//!   record, send), median of [`OFFERS`];
//! - `ipc_open_{legacy,pool}`: the child's [`Importer::accept`] after the offer arrived, µs
//!   (`cudaIpcOpenMemHandle` or pool import + pointer import, event open, the wait);
//! - `ipc_copy`: in the child, a 256 MiB device-to-device `copy_async` from the imported
//!   buffer into its own, GB/s, against the same copy between two of its own buffers (the
//!   ratio: cross-process / in-process, target ≥ 0.99);
//! - `ipc_pingpong`: pass and take back without work, µs per round (both directions).

use std::time::{Duration, Instant};

use cuda_mem::ipc::{Channel, Exporter, Importer, Listener};
use cuda_mem::{copy_async, Device, DeviceBuffer, Event, MemPool, Result, Stream};

use super::progress;
use crate::units::{median, MIB};

/// The environment variable that makes `bench` the importing child.
pub const CHILD: &str = "CUDA_MEM_IPC_BENCH_CHILD";
/// Offers timed per path.
pub const OFFERS: usize = 21;
/// Ping-pong rounds.
pub const ROUNDS: u32 = 1000;
const T: Duration = Duration::from_secs(60);

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The child's part; the parent reads its stdout.
pub fn child(path: &str) -> anyhow::Result<()> {
    let s = Stream::non_blocking()?;
    let chan = || Channel::connect(path);
    for name in ["legacy", "pool"] {
        let mut open = Vec::new();
        for _ in 0..OFFERS {
            let c = chan()?;
            // The time from the offer's arrival: wait for the socket to be readable first.
            let imp = {
                let t = Instant::now();
                let i = Importer::<u8>::accept(c, &s, T)?;
                (i, t.elapsed())
            };
            open.push(us(imp.1));
            imp.0.close()?;
        }
        println!(
            "ROW ipc_open_{name} {:.1} us (includes waiting for the offer)",
            median(&open)
        );
    }
    // Bandwidth: imported against own.
    let mut imp = Importer::<u8>::accept(chan()?, &s, T)?;
    let n = imp.buffer()?.len();
    let mut own = DeviceBuffer::<u8>::uninit(n)?;
    let other = DeviceBuffer::<u8>::uninit(n)?;
    let (a, b) = (Event::timing()?, Event::timing()?);
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut v = Vec::new();
        for _ in 0..11 {
            a.record(&s)?;
            f()?;
            b.record(&s)?;
            b.synchronize()?;
            v.push(f64::from(Event::elapsed_ms(&a, &b)?) / 1e3);
        }
        Ok(median(&v))
    };
    let ipc = time(&mut || copy_async(&mut own, imp.buffer()?, &s))?;
    let local = time(&mut || copy_async(&mut own, &other, &s))?;
    let gbs = |t: f64| n as f64 / t / 1e9;
    println!(
        "ROW ipc_copy {:.1} GB/s cross-process, {:.1} GB/s in-process, ratio {:.3}",
        gbs(ipc),
        gbs(local),
        local / ipc
    );
    own.synchronize()?;
    imp.pass(&s)?;
    for _ in 0..ROUNDS {
        imp.take_back(&s, T)?;
        imp.pass(&s)?;
    }
    imp.close()?;
    Ok(())
}

/// The parent's part: spawns the child, offers, prints the rows.
pub fn run(device: Device) -> anyhow::Result<()> {
    let path = std::env::temp_dir().join(format!("cuda-mem-ipc-bench-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = Listener::bind(&path)?;
    let child = std::process::Command::new(std::env::current_exe()?)
        .arg("bench")
        .env(CHILD, &path)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let s = Stream::non_blocking()?;
    let pool = MemPool::shareable(device)?;
    let r = (|| -> anyhow::Result<()> {
        for name in ["legacy", "pool"] {
            let mut export = Vec::new();
            for _ in 0..OFFERS {
                let buf = if name == "pool" {
                    DeviceBuffer::<u8>::from_pool(&pool, 64 * MIB as usize, &s)?
                } else {
                    DeviceBuffer::<u8>::uninit(64 * MIB as usize)?
                };
                let c = l.accept(T)?;
                s.synchronize()?;
                let t = Instant::now();
                let exp = Exporter::offer(buf, c, &s)?;
                export.push(us(t.elapsed()));
                exp.close(T)?;
            }
            progress(&format!("  ipc_export_{name}: {:.1} us", median(&export)));
        }
        let buf = DeviceBuffer::<u8>::zeroed(256 * MIB as usize)?;
        let mut exp = Exporter::offer(buf, l.accept(T)?, &s)?;
        exp.take_back(&s, T)?;
        let t = Instant::now();
        for _ in 0..ROUNDS {
            exp.pass(&s)?;
            exp.take_back(&s, T)?;
        }
        progress(&format!(
            "  ipc_pingpong: {:.1} us per round (pass and take back, both processes)",
            us(t.elapsed()) / f64::from(ROUNDS)
        ));
        exp.close(T)?;
        Ok(())
    })();
    let out = child.wait_with_output()?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(row) = line.strip_prefix("ROW ") {
            progress(&format!("  {row}"));
        }
    }
    r
}
