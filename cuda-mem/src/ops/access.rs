//! Device pointers for kernels and for calls this crate does not wrap, handed out for one
//! stream: ordered after the buffer's conflicting pending work before the caller queues
//! anything, and recorded on the buffer when the guard drops, after the caller queued.
//!
//!
//! The aliasing rule for kernel launches is on [`DevicePtr`].

use std::marker::PhantomData;

use bytemuck::Pod;

use crate::contract::memory::sealed;
use crate::error::Result;
use crate::fence::{Access, Use};
use crate::handles::stream::Stream;

/// A device address to read, for work queued on one stream while this guard lives.
#[must_use = "the guard records the work queued while it lives: keep it until after the launch"]
pub struct DeviceRead<'a, T> {
    ptr: *const T,
    /// The same address as a `CUdeviceptr`, for launchers that take a reference to the
    /// argument's value (cudarc's builder, with the `cudarc` feature).
    addr: u64,
    len: usize,
    _use: Use<'a>,
    _borrow: PhantomData<&'a T>,
}

/// A device address to write (and read), for work queued on one stream while this guard
/// lives. Dereferences to a [`DeviceRead`] for the read-side accessors.
#[must_use = "the guard records the work queued while it lives: keep it until after the launch"]
pub struct DeviceWrite<'a, T> {
    read: DeviceRead<'a, T>,
    _borrow: PhantomData<&'a mut T>,
}

impl<T> DeviceRead<'_, T> {
    /// The device address of the first element.
    pub fn as_ptr(&self) -> *const T {
        self.ptr
    }

    /// The device address as an integer (a `CUdeviceptr`).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The address as a value that lives as long as the guard, for kernel argument lists that
    /// hold pointers to their arguments.
    #[cfg(feature = "cudarc-unpinned")]
    pub(crate) fn addr_ref(&self) -> &u64 {
        &self.addr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T> DeviceWrite<'_, T> {
    /// The device address of the first element, writable.
    pub fn as_mut_ptr(&self) -> *mut T {
        self.read.ptr.cast_mut()
    }
}

impl<'a, T> std::ops::Deref for DeviceWrite<'a, T> {
    type Target = DeviceRead<'a, T>;

    fn deref(&self) -> &DeviceRead<'a, T> {
        &self.read
    }
}

impl<T> std::fmt::Debug for DeviceRead<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceRead({:p}, {} elements)", self.ptr, self.len)
    }
}

impl<T> std::fmt::Debug for DeviceWrite<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceWrite({:p}, {} elements)",
            self.read.ptr, self.read.len
        )
    }
}

/// Memory whose device address work on a stream may read: every kind that asynchronous work
/// may use (see [`AsyncMemory`](crate::AsyncMemory)). Sealed; implemented for all of them.
///
/// # Aliasing rule for kernel launches
///
/// A kernel may read memory through a [`DeviceRead`] and write it through a [`DeviceWrite`],
/// on the guard's stream only, and the guard must live until the launch has been queued and
/// then drop normally (not be passed to `mem::forget`). Readers on different streams run
/// concurrently; a writer (which needs `&mut` to the buffer) is ordered after every pending
/// reader and writer of other streams, and every later reader or writer after it. Launching is
/// `unsafe`, and these rules are part of what its caller promises.
///
/// ```no_run
/// # fn launch(_: *const f32, _: *mut f32, _: &cuda_mem::Stream) {}
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, DevicePtr, DevicePtrMut, Stream};
/// let stream = Stream::new()?;
/// let x = DeviceBuffer::<f32>::zeroed(1024)?;
/// let mut y = DeviceBuffer::<f32>::zeroed(1024)?;
/// {
///     let xr = x.device_ptr(&stream)?;       // orders `stream` after writes to x
///     let yw = y.device_ptr_mut(&stream)?;   // ... and after any use of y
///     launch(xr.as_ptr(), yw.as_mut_ptr(), &stream); // your kernel, on `stream`
/// } // both guards record the launch: y.to_vec() and drops wait for it
/// # Ok(()) }
/// ```
///
/// A write guard needs `&mut` to the buffer, so it cannot coexist with a read guard (or host
/// access) to the same buffer:
///
/// ```compile_fail,E0502
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, DevicePtr, DevicePtrMut, Stream};
/// let s = Stream::new()?;
/// let mut buf = DeviceBuffer::<u32>::zeroed(16)?;
/// let r = buf.device_ptr(&s)?;
/// let w = buf.device_ptr_mut(&s)?; // error: `buf` is already borrowed as immutable
/// # drop((r, w)); Ok(()) }
/// ```
pub trait DevicePtr<T: Pod>: sealed::Async<T> {
    /// Orders `stream` after pending writes to the buffer from other streams, and hands out
    /// its device address for work queued on `stream` while the guard lives (see the aliasing
    /// rule above). Host writes and drop wait for that work.
    fn device_ptr(&self, stream: &Stream) -> Result<DeviceRead<'_, T>> {
        read_guard(self, stream, Access::Read, "device_ptr")
    }
}
impl<T: Pod, M: sealed::Async<T> + ?Sized> DevicePtr<T> for M {}

/// Memory whose device address work on a stream may write. Sealed; implemented for every
/// [`DevicePtr`] kind that is writable.
pub trait DevicePtrMut<T: Pod>: DevicePtr<T> + sealed::RawMut<T> {
    /// Orders `stream` after all pending work on the buffer from other streams, and hands out
    /// its device address for work queued on `stream` while the guard lives. Host access and
    /// drop wait for that work. Memory registered `READ_ONLY` is refused
    /// ([`Misuse::ReadOnlyDestination`](crate::Misuse::ReadOnlyDestination)).
    fn device_ptr_mut(&mut self, stream: &Stream) -> Result<DeviceWrite<'_, T>> {
        write_guard(self, stream, "device_ptr_mut")
    }
}
impl<T: Pod, M: sealed::Async<T> + sealed::RawMut<T> + ?Sized> DevicePtrMut<T> for M {}

/// The guard of `m`'s whole range for work on `stream` that accesses it as `access`: the
/// stream is checked against the memory's state (`op` names the caller in the error), then
/// ordered after conflicting pending work, and the work is marked.
fn read_guard<'a, T: Pod, M: sealed::Async<T> + ?Sized>(
    m: &'a M,
    stream: &Stream,
    access: Access,
    op: &'static str,
) -> Result<DeviceRead<'a, T>> {
    m.check_stream(stream, op)?;
    let ptr = m.device_addr()?;
    let len = m.raw_len();
    let base = m.fence_base();
    let bytes = len * std::mem::size_of::<T>();
    let u = m
        .async_fence()
        .begin(stream, (base, base + bytes), access)?;
    Ok(DeviceRead {
        ptr,
        addr: ptr as u64,
        len,
        _use: u,
        _borrow: PhantomData,
    })
}

/// The write guard of `m`'s whole range: [`read_guard`] for a write, after refusing memory the
/// device may not write.
pub(crate) fn write_guard<'a, T: Pod, M: sealed::Async<T> + sealed::RawMut<T> + ?Sized>(
    m: &'a mut M,
    stream: &Stream,
    op: &'static str,
) -> Result<DeviceWrite<'a, T>> {
    m.check_device_writable(op)?;
    Ok(DeviceWrite {
        read: read_guard(&*m, stream, Access::Write, op)?,
        _borrow: PhantomData,
    })
}
