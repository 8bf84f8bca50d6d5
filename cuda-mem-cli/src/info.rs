//! `cuda-mem info`: versions, then every device with its memory capabilities.

use cuda_mem::{driver_version, format_version, runtime_version, Device, BUILT_CUDART_VERSION};

use crate::diagnose::require_device;
use crate::report::{self, json, table};
use crate::results::{DeviceInfo, InfoReport, Versions};

/// The CUDA versions, `unknown` where the runtime cannot say.
pub fn versions() -> Versions {
    let fmt = |v: cuda_mem::Result<i32>| v.map_or_else(|_| "unknown".into(), format_version);
    Versions {
        runtime: fmt(runtime_version()),
        driver: fmt(driver_version()),
        built_with: format_version(BUILT_CUDART_VERSION as i32),
    }
}

/// Everything `info` lists about `d`.
pub fn device_info(d: Device) -> cuda_mem::Result<DeviceInfo> {
    let (free, total) = d.mem_info()?;
    Ok(DeviceInfo {
        ordinal: d.ordinal(),
        name: d.name()?,
        compute_capability: d.compute_capability()?,
        pci_bus_id: d.pci_bus_id()?,
        free_bytes: free as u64,
        total_bytes: total as u64,
        caps: d.memory_capabilities()?,
    })
}

/// Collects the report (a [`crate::diagnose::NoDevice`] error without driver or device).
pub fn collect() -> anyhow::Result<InfoReport> {
    require_device()?;
    let devices = Device::all()?
        .into_iter()
        .map(device_info)
        .collect::<cuda_mem::Result<Vec<_>>>()?;
    Ok(InfoReport {
        versions: versions(),
        devices,
    })
}

/// Runs `info`, printing text or JSON to stdout.
pub fn run(as_json: bool) -> anyhow::Result<()> {
    let r = collect()?;
    let text = if as_json {
        json::info_json(&r).render()
    } else {
        table::info_text(&r)
    };
    report::to_stdout(&text)
}
