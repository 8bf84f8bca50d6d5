//! The one paragraph printed when CUDA finds no usable driver or device.

use std::fmt;

use cuda_mem::{format_version, Device, BUILT_CUDART_VERSION};

/// No usable driver or device; `Display` is the whole paragraph for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoDevice(pub String);

impl fmt::Display for NoDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoDevice {}

/// What went wrong, as far as the runtime can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The failed call and the runtime's error, e.g. `cudaGetDeviceCount failed:
    /// cudaErrorInsufficientDriver: ...`; or why no device counts.
    pub cause: String,
    /// A driver is loaded, but there is no device (`cudaErrorNoDevice`, or a count of 0).
    pub driver_loaded: bool,
    /// The CUDA version the driver supports (`cudaDriverGetVersion`), 0 when there is none.
    pub driver_version: i32,
    /// The CUDA runtime version this program uses.
    pub runtime_version: i32,
    /// `CUDA_VISIBLE_DEVICES`, if set.
    pub visible_devices: Option<String>,
}

/// The paragraph for `m`.
pub fn paragraph(m: &Missing) -> String {
    let rt = format_version(m.runtime_version);
    let what = if m.driver_loaded {
        format!(
            "A CUDA driver is loaded (it supports CUDA {}), but no CUDA device is visible to \
             this process{}. Check with `nvidia-smi` that it lists a GPU; if it does, check \
             that CUDA_VISIBLE_DEVICES does not hide it and that this process may open \
             /dev/nvidia*.",
            format_version(m.driver_version),
            match &m.visible_devices {
                Some(v) => format!(" (CUDA_VISIBLE_DEVICES={v:?})"),
                None => String::new(),
            }
        )
    } else if m.driver_version > 0 {
        format!(
            "The NVIDIA driver supports CUDA up to {}, older than the CUDA {rt} runtime this \
             program uses. Check with `nvidia-smi` (its 'CUDA Version' must be at least {rt}) \
             and update the NVIDIA driver.",
            format_version(m.driver_version)
        )
    } else {
        format!(
            "The NVIDIA driver is not installed or not loaded, so no GPU can be used: this \
             program needs a driver that supports CUDA {rt} or newer. Check with `nvidia-smi`: \
             it should list the GPU and a 'CUDA Version' of at least {rt}; if it fails, install \
             or load the NVIDIA driver (in a container, pass the GPUs through, e.g. \
             `docker run --gpus all`)."
        )
    };
    format!(
        "cuda-mem: no usable CUDA driver or GPU ({}). {what}",
        m.cause
    )
}

/// Counts the devices; no driver or no device gives a [`NoDevice`] error with the paragraph,
/// any other failure the runtime's error.
pub fn require_device() -> anyhow::Result<i32> {
    let (cause, driver_loaded) = match Device::count() {
        Ok(n) if n > 0 => return Ok(n),
        Ok(_) => ("cudaGetDeviceCount returned 0 devices".to_string(), true),
        Err(e) if e.is_no_device() => {
            let no_device = e.code() == Some(cuda_mem::ErrorCode::NO_DEVICE);
            (e.to_string(), no_device)
        }
        Err(e) => return Err(e.into()),
    };
    let m = Missing {
        cause,
        driver_loaded,
        driver_version: cuda_mem::driver_version().unwrap_or(0),
        runtime_version: cuda_mem::runtime_version().unwrap_or(BUILT_CUDART_VERSION as i32),
        visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
    };
    Err(NoDevice(paragraph(&m)).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing(driver_loaded: bool, driver_version: i32) -> Missing {
        Missing {
            cause: "cudaGetDeviceCount failed: cudaErrorInsufficientDriver: CUDA driver version \
                    is insufficient for CUDA runtime version"
                .into(),
            driver_loaded,
            driver_version,
            runtime_version: 13000,
            visible_devices: None,
        }
    }

    #[test]
    fn no_driver() {
        let p = paragraph(&missing(false, 0));
        assert!(p.starts_with(
            "cuda-mem: no usable CUDA driver or GPU (cudaGetDeviceCount failed: \
             cudaErrorInsufficientDriver"
        ));
        assert!(p.contains("not installed or not loaded"));
        assert!(p.contains("`nvidia-smi`"));
        assert!(p.contains("at least 13.0"));
        assert!(!p.contains('\n'), "one paragraph: {p}");
    }

    #[test]
    fn old_driver_and_no_device() {
        let p = paragraph(&missing(false, 12040));
        assert!(p.contains("supports CUDA up to 12.4, older than the CUDA 13.0 runtime"));
        let mut m = missing(true, 13000);
        m.visible_devices = Some("".into());
        let p = paragraph(&m);
        assert!(p.contains("no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES=\"\")"));
    }

    #[test]
    fn this_machine_gives_a_paragraph_or_a_count() {
        // Without a driver (CPU CI) this is the paragraph; with a GPU, a count.
        match require_device() {
            Ok(n) => assert!(n > 0),
            Err(e) => {
                let nd = e.downcast_ref::<NoDevice>().expect("a NoDevice error");
                assert!(nd.0.contains("nvidia-smi"));
            }
        }
    }
}
