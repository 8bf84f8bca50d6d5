//! `cuda-mem info`: versions, then every device with its memory capabilities.

use cuda_mem::sys::cudaDeviceAttr as A;
use cuda_mem::{driver_version, format_version, runtime_version, Device, BUILT_CUDART_VERSION};

use crate::diagnose::require_device;
use crate::report::{self, json, table};
use crate::results::{DeviceExtra, DeviceInfo, InfoReport, PcieLink, Versions};

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
    let name = d.name()?;
    let compute_capability = d.compute_capability()?;
    let pci_bus_id = d.pci_bus_id()?;
    Ok(DeviceInfo {
        ordinal: d.ordinal(),
        name,
        compute_capability,
        free_bytes: free as u64,
        total_bytes: total as u64,
        caps: d.memory_capabilities()?,
        extra: extra(d, &pci_bus_id),
        pci_bus_id,
    })
}

/// `cudaDevAttrHostMemoryPoolsSupported`, by number: headers before CUDA 12.6 lack the name.
const HOST_MEMORY_POOLS_SUPPORTED: A = A(144);

/// Pools, copy engines and the PCIe link of `d`; what the runtime or sysfs cannot say is
/// `None` (an old runtime rejects attribute 144 as invalid).
pub fn extra(d: Device, bus_id: &str) -> DeviceExtra {
    let attr = |a: A| d.attribute(a).ok();
    DeviceExtra {
        memory_pools: attr(A::cudaDevAttrMemoryPoolsSupported).map(|v| v != 0),
        host_memory_pools: attr(HOST_MEMORY_POOLS_SUPPORTED).map(|v| v != 0),
        copy_engines: attr(A::cudaDevAttrAsyncEngineCount),
        pcie_link: pcie_link(std::path::Path::new("/sys/bus/pci/devices"), bus_id),
    }
}

/// The link of PCI device `bus_id` (as the runtime writes it, e.g. `00000000:18:00.0` or
/// `0000:18:00.0`) from sysfs under `root`; `None` when there is no such entry (not Linux,
/// a container without /sys, a virtual function).
pub fn pcie_link(root: &std::path::Path, bus_id: &str) -> Option<PcieLink> {
    // sysfs names the device `dddd:bb:dd.f`, lowercase, with a four-digit domain.
    let id = bus_id.trim().to_ascii_lowercase();
    let (domain, rest) = id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let dir = root.join(format!("{domain:04x}:{rest}"));
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && !s.starts_with("Unknown"))
    };
    let num = |f: &str| read(f).and_then(|s| s.parse::<u32>().ok());
    Some(PcieLink {
        speed: read("current_link_speed")?,
        width: num("current_link_width"),
        max_speed: read("max_link_speed"),
        max_width: num("max_link_width"),
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
        // The staged-copy configuration the process-wide stager measures on this machine
        // (starting it: some tens of milliseconds).
        let staged = match cuda_mem::staged_config() {
            Ok(s) => format!("{s}"),
            Err(e) => format!("unavailable: {e}"),
        };
        format!(
            "{}\nStaged pageable copies (measured now): {staged}\n",
            table::info_text(&r)
        )
    };
    report::to_stdout(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_link_from_sysfs() {
        let root = std::env::temp_dir().join(format!("cuda-mem-sysfs-{}", std::process::id()));
        let dev = root.join("0000:18:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        for (f, v) in [
            ("current_link_speed", "16.0 GT/s PCIe\n"),
            ("current_link_width", "16\n"),
            ("max_link_speed", "32.0 GT/s PCIe\n"),
            ("max_link_width", "16\n"),
        ] {
            std::fs::write(dev.join(f), v).unwrap();
        }
        let want = Some(PcieLink {
            speed: "16.0 GT/s PCIe".into(),
            width: Some(16),
            max_speed: Some("32.0 GT/s PCIe".into()),
            max_width: Some(16),
        });
        // The runtime's eight-digit domain and uppercase hex find the same entry.
        assert_eq!(pcie_link(&root, "00000000:18:00.0"), want);
        assert_eq!(pcie_link(&root, "0000:18:00.0"), want);
        assert_eq!(pcie_link(&root, "0000:19:00.0"), None);
        assert_eq!(pcie_link(&root, "garbage"), None);
        std::fs::write(dev.join("current_link_speed"), "Unknown\n").unwrap();
        assert_eq!(pcie_link(&root, "0000:18:00.0"), None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
