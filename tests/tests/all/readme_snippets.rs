//! The code of the porting guide's tables (`docs/porting.md`), compiled: each cell's code
//! appears here, in a function whose parameters are the names the guide assumes (`h`, `n`,
//! `stream`, `d`, ...). Never run (the functions are not called); `readme::` checks that every
//! cell of the guide is here. Edit both together.
#![allow(dead_code, unused_variables, unused_mut, unused_assignments)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cuda_mem::interop;
use cuda_mem::interop::cudarc::{
    CudarcPtr as _, CudarcPtrMut as _, CudarcView, CudarcViewMut, Launch,
};
use cuda_mem::{
    alloc_mapped, alloc_mapped_uva, copy, copy_async, copy_range, copy_range_async, memset_async,
    pointer_info, sys, Advice, Attach, Device, DeviceBuffer, DeviceFlags, DevicePtr as _,
    DevicePtrMut as _, Event, EventFlags, HostAllocFlags, HostRegisterFlags, Location,
    ManagedBuffer, MappedBuffer, MemPool, PinnedBuffer, PointerKind, PoolAccess, RegisteredSlice,
    RegisteredVec, Result, Stream,
};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

type Ctx = (usize, Vec<f32>, Stream, Device, u8);

fn device_memory((n, mut h, stream, dev, value): Ctx) -> Result<()> {
    let mut d = DeviceBuffer::<f32>::uninit(n)?;
    let _ = DeviceBuffer::<f32>::uninit_on(Device::get(1)?, n)?;
    let _ = DeviceBuffer::<f32>::zeroed(n)?;
    let _ = DeviceBuffer::from_slice(&h)?;
    d.memset(value)?;
    d.memset_async(value, &stream)?;
    copy(&mut d, &h)?;
    d.copy_from(&h)?;
    copy(&mut h, &d)?;
    d.copy_to(&mut h)?;
    {
        let h = d.to_vec()?;
    }
    let mut d2 = DeviceBuffer::<f32>::uninit(n)?;
    copy(&mut d2, &d)?;
    let mut h2 = vec![0f32; n];
    copy(&mut h2, &h)?;
    let (i, j, k) = (0, 0, n);
    {
        let (mut dst, src) = (
            DeviceBuffer::<f32>::uninit(n)?,
            DeviceBuffer::<f32>::uninit(n)?,
        );
        copy_range(&mut dst, i, &src, j, k)?;
        copy_async(&mut dst, &src, &stream)?;
        copy_range_async(&mut dst, i, &src, j, k, &stream)?;
    }
    copy(&mut h2[i..i + k], &h[j..j + k])?;
    drop(d);
    let d = DeviceBuffer::<f32>::uninit(n)?;
    d.free()?;
    {
        let d = DeviceBuffer::<f32>::from_pool(&MemPool::default_for(dev)?, n, &stream)?;
        let pool = MemPool::new(dev)?;
        let d = DeviceBuffer::<f32>::from_pool(&pool, n, &stream)?;
        let _ = DeviceBuffer::<f32>::zeroed_from_pool(&pool, n, &stream)?;
        drop(d);
    }
    let pool = MemPool::new(dev)?;
    let host_pool = MemPool::host(dev)?;
    let _ = MemPool::with_max_size(dev, 1 << 30)?;
    let _ = MemPool::default_for(dev)?;
    let v = u64::MAX;
    pool.set_release_threshold(v)?;
    let _ = (pool.used()?, pool.reserved()?, pool.stats()?);
    pool.reset_high_water()?;
    let keep = 0;
    pool.trim(keep)?;
    pool.set_access(dev, PoolAccess::READ_WRITE)?;
    let _ = pool.access(dev)?;
    let _ = PinnedBuffer::<f32>::from_pool(&host_pool, n, &stream)?;
    // SAFETY: never run (this function only proves that the guide's code compiles).
    let _ = unsafe { PinnedBuffer::<f32>::uninit_from_pool(&host_pool, n, &stream)? };
    let mut d = DeviceBuffer::<f32>::uninit(n)?;
    let w = d.device_ptr_mut(&stream)?;
    let _ = w.as_mut_ptr();
    Ok(())
}

fn pinned_memory((n, h, stream, _dev, _value): Ctx, raw: u32, i: usize, x: f32) -> Result<()> {
    let mut p = PinnedBuffer::<f32>::zeroed(n, HostAllocFlags::DEFAULT)?;
    let _ = PinnedBuffer::<f32>::zeroed(n, HostAllocFlags::PORTABLE)?;
    let _ = PinnedBuffer::<f32>::zeroed(n, HostAllocFlags::WRITE_COMBINED)?;
    let _ = PinnedBuffer::<f32>::zeroed(n, HostAllocFlags::MAPPED)?;
    {
        let _g = p.device_ptr(&stream)?;
    }
    let flags = HostAllocFlags::PORTABLE | HostAllocFlags::MAPPED;
    let _ = PinnedBuffer::from_slice(&h, flags)?;
    // SAFETY: never run.
    let _ = unsafe { PinnedBuffer::<f32>::uninit(n, flags)? };
    let _ = PinnedBuffer::<f32>::malloc_host(n)?;
    let _ = HostAllocFlags::from_bits(raw);
    let _ = flags.bits();
    let _ = p.runtime_flags()?;
    let _ = p.flags();
    p.as_mut_slice()?[i] = x;
    let x = p.as_slice()?[i];
    drop(p);
    let p = PinnedBuffer::<f32>::malloc_host(n)?;
    p.free()?;
    Ok(())
}

fn mapped_memory((n, _h, stream, _dev, _value): Ctx, mut rv: RegisteredVec<f32>) -> Result<()> {
    let m = MappedBuffer::<f32>::zeroed(n, HostAllocFlags::DEFAULT)?;
    let _ = (m.as_ptr(), m.device_address());
    {
        let _g = m.device_ptr(&stream)?;
    }
    let _ = MappedBuffer::<f32>::zeroed(n, HostAllocFlags::WRITE_COMBINED)?;
    {
        let _g = rv.device_ptr(&stream)?;
    }
    let p = PinnedBuffer::<f32>::zeroed(n, HostAllocFlags::DEFAULT)?;
    {
        let _g = p.device_ptr(&stream)?;
    }
    let _ = pointer_info(p.as_ptr())?.device_ptr;
    {
        let m = alloc_mapped::<f32>(n)?;
        let (cpu, gpu) = (m.as_ptr(), m.device_address());
    }
    {
        let m = alloc_mapped_uva::<f32>(n)?;
        let ptr = m.device_address();
        let _ = m.as_ptr();
    }
    let mut m = alloc_mapped::<f32>(n)?;
    {
        let _g = m.device_ptr_mut(&stream)?;
    }
    let _ = m.as_slice()?;
    Ok(())
}

fn managed_memory((n, _h, stream, dev, _value): Ctx, v: u8, i: usize) -> Result<()> {
    let mut m = ManagedBuffer::<f32>::zeroed(n, Attach::Global)?;
    let _ = ManagedBuffer::<f32>::zeroed(n, Attach::Host)?;
    m.prefetch(Location::Device(dev), &stream)?;
    m.prefetch(Location::Host, &stream)?;
    m.advise(Advice::SetReadMostly)?;
    m.advise(Advice::UnsetReadMostly)?;
    m.advise(Advice::SetPreferredLocation(Location::Device(dev)))?;
    m.advise(Advice::UnsetPreferredLocation)?;
    m.advise(Advice::SetAccessedBy(Location::Host))?;
    let loc = Location::Host;
    m.advise(Advice::UnsetAccessedBy(loc))?;
    m.attach(&stream, Attach::Single)?;
    let _ = (Attach::Global, Attach::Host);
    let _ = m.last_prefetch_location()?;
    let _ = (m.preferred_location()?, m.is_read_mostly()?);
    m.memset_async(v, &stream)?;
    let x = m.as_slice()?[i];
    drop(m);
    let m = ManagedBuffer::<f32>::zeroed(n, Attach::Global)?;
    m.free()?;
    Ok(())
}

fn registered_memory((n, mut h, stream, _dev, _value): Ctx) -> Result<()> {
    let mut d = DeviceBuffer::<f32>::uninit(n)?;
    RegisteredSlice::register(&mut h, HostRegisterFlags::DEFAULT, |reg| {
        copy_async(&mut d, reg, &stream)
    })?;
    RegisteredSlice::register(&mut h, HostRegisterFlags::MAPPED, |reg| {
        let _g = reg.device_ptr(&stream)?;
        Ok(())
    })?;
    let _ = HostRegisterFlags::PORTABLE | HostRegisterFlags::MAPPED | HostRegisterFlags::READ_ONLY;
    let mut rv = RegisteredVec::register(h, HostRegisterFlags::DEFAULT)?;
    {
        let _g = rv.device_ptr(&stream)?;
    }
    let h = rv.into_vec()?;
    let rv = RegisteredVec::register(h, HostRegisterFlags::DEFAULT)?;
    drop(rv);
    Ok(())
}

fn queries(
    (_n, _h, stream, dev, _value): Ctx,
    p: *const f32,
    i: i32,
    attr: sys::cudaDeviceAttr,
    raw: sys::cudaStream_t,
    raw_event: sys::cudaEvent_t,
    buf: DeviceBuffer<f32>,
) -> Result<()> {
    let info = pointer_info(p)?;
    let _ = (info.kind, info.device, info.host_ptr, info.device_ptr);
    match info.kind {
        PointerKind::UnregisteredHost
        | PointerKind::PinnedHost
        | PointerKind::Device
        | PointerKind::Managed => {}
        PointerKind::Other(raw) => {}
    }
    let (free, total) = Device::current()?.mem_info()?;
    let _ = Device::count()?;
    Device::get(i)?.set_current()?;
    {
        let _g = Device::get(i)?.guard()?;
    }
    let _ = Device::get(i)?.attribute(attr)?;
    let _ = Device::get(i)?.memory_capabilities()?;
    Device::current()?.synchronize()?;
    {
        let stream = Stream::new()?;
        let _ = Stream::non_blocking()?;
        stream.synchronize()?;
        buf.synchronize()?;
    }
    let (start, end) = (Event::timing()?, Event::timing()?);
    let ev = &start;
    ev.record(&stream)?;
    let _ = Event::elapsed_ms(&start, &end)?;
    let _ = Event::with_flags(EventFlags::BLOCKING_SYNC | EventFlags::DISABLE_TIMING)?;
    dev.set_flags(DeviceFlags::SCHEDULE_BLOCKING_SYNC)?;
    let _ = dev.flags()?;
    {
        // SAFETY: never run.
        let s = unsafe { Stream::from_raw(raw, Device::get(0)?) };
        s.synchronize()?;
    }
    {
        // SAFETY: never run.
        let ev = unsafe { Event::from_raw(raw_event, dev) };
        ev.wait_on(&stream)?;
        ev.synchronize()?;
        let _ = ev.is_complete()?;
    }
    cuda_mem::profiler::start()?;
    cuda_mem::profiler::stop()?;
    {
        let _capture = cuda_mem::profiler::capture()?;
    }
    Ok(())
}

fn parts_of_buffers(
    (n, _h, stream, _dev, v): Ctx,
    mut d: DeviceBuffer<f32>,
    p: PinnedBuffer<f32>,
    mut vec: Vec<f32>,
    (i, k): (usize, usize),
) -> Result<()> {
    use cuda_mem::Slice;
    copy_async(&mut d.slice_mut(i..i + k)?, &p.slice(i..i + k)?, &stream)?;
    {
        let (mut lo, mut hi) = d.split_at_mut(n / 2)?;
        copy_async(&mut lo, &p.slice(..n / 2)?, &stream)?;
    }
    memset_async(&mut d.slice_mut(i..i + k)?, v, &stream)?;
    {
        let mut w = d.slice_mut(i..i + k)?;
        let p = w.device_ptr_mut(&stream)?;
        let _ = p.as_mut_ptr();
    }
    {
        let r = d.slice(i..i + k)?;
        let p = r.device_ptr(&stream)?;
        let _ = p.as_ptr();
    }
    cuda_mem::scope(|s| {
        let h = s.borrow(&vec);
        copy_async(&mut d, &h, &stream)
    })?;
    let mut flag = alloc_mapped::<u32>(1)?;
    {
        let _g = flag.device_ptr(&stream)?;
    }
    flag.atomic(0)?.store(1, Ordering::Release);
    Ok(())
}

fn ownership(
    buf: DeviceBuffer<f32>,
    flags: HostAllocFlags,
    attach: Attach,
    rv: RegisteredVec<f32>,
    reg_flags: HostRegisterFlags,
) -> Result<()> {
    let (p, n) = buf.into_raw()?;
    // SAFETY: never run (this function only proves that the guide's code compiles).
    let d = unsafe { DeviceBuffer::from_raw(p, n) }?;
    // SAFETY: never run.
    unsafe {
        let _ = PinnedBuffer::from_raw(p, n, flags);
        let _ = ManagedBuffer::from_raw(p, n, attach);
        let _ = MappedBuffer::from_raw(p, n, HostAllocFlags::MAPPED);
    }
    let flags = reg_flags;
    let (p, len, cap) = rv.into_raw()?;
    // SAFETY: never run.
    let rv = unsafe { RegisteredVec::from_raw(p, len, cap, flags) }?;
    Ok(())
}

fn cudarc_interop(
    cs: Arc<CudaStream>,
    f: CudaFunction,
    buf: DeviceBuffer<f32>,
    mut target: DeviceBuffer<f32>,
    mut slice: CudaSlice<f32>,
    mut host: PinnedBuffer<f32>,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    use cuda_mem::Slice as _;
    let ctx = interop::cudarc::context(Device::get(0)?)?;
    let s = interop::cudarc::stream(&cs)?;
    {
        let x = buf.cudarc_ptr(&cs)?;
        let mut view = target.slice_mut(..)?;
        let mut y = view.cudarc_ptr_mut(&cs)?;
        let mut builder = cs.launch_builder(&f);
        builder.arg(&x);
        builder.arg(&mut y);
    }
    cs.memcpy_dtod(&buf.cudarc_ptr(&cs)?, &mut slice)?;
    CudarcView::with(&slice, &cs, |v| copy_async(&mut host, v, v.stream()))?;
    CudarcViewMut::with(&mut slice, &cs, |v| copy_async(v, &host, &s))?;
    let (x, mut y, n) = (buf, target, 3u32);
    let cfg = LaunchConfig::for_num_elems(3);
    // SAFETY: never run.
    unsafe {
        Launch::on(&s, &f, cfg)?
            .arg_in(&x)
            .arg_out(&mut y)
            .arg(&n)
            .launch()?
    }
    let cs = interop::cudarc::cudarc_stream(&Stream::new()?)?;
    Ok(())
}

fn errors(e: cuda_mem::Error) {
    let _ = (e.is_out_of_memory(), e.is_no_device(), e.is_sticky());
    if let Some(code) = e.code() {
        let _ = (code.0, code.name(), code.description());
    }
}
