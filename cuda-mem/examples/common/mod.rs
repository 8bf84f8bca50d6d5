//! What every example does first: find a CUDA device, or say clearly that there is none.
//!
//! Not an example itself: cargo builds only `examples/*.rs` and `examples/*/main.rs`.

use cuda_mem::Device;

/// The current device when one is present, after printing what it is.
///
/// Without a driver or a device, prints one line and returns `Ok(None)`, so that the example
/// exits 0 on machines without a GPU, unless `CUDA_MEM_REQUIRE_GPU=1`: then the missing device
/// is an error and the example exits non-zero. Any other failure is an error.
pub fn device_or_skip(example: &str) -> anyhow::Result<Option<Device>> {
    let why = match Device::count() {
        Ok(n) if n > 0 => {
            let dev = Device::current()?;
            let (free, total) = dev.mem_info()?;
            println!(
                "cuda-mem example {example}: device {} = {} (CUDA runtime {}, driver {}), \
                 {} of {} MiB free",
                dev.ordinal(),
                dev.name()?,
                cuda_mem::format_version(cuda_mem::runtime_version()?),
                cuda_mem::format_version(cuda_mem::driver_version()?),
                free >> 20,
                total >> 20,
            );
            return Ok(Some(dev));
        }
        Ok(_) => "cudaGetDeviceCount found 0 devices".to_string(),
        Err(e) if e.is_no_device() => match e.code() {
            Some(code) => code.to_string(),
            None => e.to_string(),
        },
        Err(e) => return Err(e.into()),
    };
    if std::env::var_os("CUDA_MEM_REQUIRE_GPU").is_some_and(|v| v == "1") {
        anyhow::bail!(
            "cuda-mem example {example}: no CUDA device ({why}) and CUDA_MEM_REQUIRE_GPU=1"
        );
    }
    println!("cuda-mem example {example}: no CUDA device ({why}); nothing to do");
    Ok(None)
}

/// The value `cuda_mem_probes::Probes::write` (`cm_write`) leaves in `u32` element `i`: it writes
/// 16-byte word `w` as `(w, w, w, w)`, so element `i` holds `i / 4`.
#[allow(dead_code)] // not every example launches a kernel
pub fn cm_write_value(i: usize) -> u32 {
    (i / 4) as u32
}

/// Checks `got` against [`cm_write_value`], naming the first wrong element.
#[allow(dead_code)] // not every example launches a kernel
pub fn check_cm_write(what: &str, got: &[u32]) -> anyhow::Result<()> {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != cm_write_value(i)) {
        anyhow::bail!(
            "{what}: element {i} is {:#x}, the kernel wrote {:#x}",
            got[i],
            cm_write_value(i)
        );
    }
    Ok(())
}
